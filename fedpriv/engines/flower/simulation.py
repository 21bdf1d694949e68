"""``fedpriv train federated --engine flower``: the Flower apps in a local simulation.

Runs :func:`flwr.simulation.run_simulation` with ``federated.flower.num_supernodes`` virtual
SuperNodes and Ray actors of ``client_num_cpus`` / ``client_num_gpus`` each. The ServerApp is
bound to the prepared experiment (it runs in this process), the ClientApps to its config (each
actor prepares the data once); no run config is needed. Runtime dependency installation is switched off
(``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``): the apps run from this environment, and an
offline machine could not install anything anyway.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable

from fedpriv.engines.flower.apps import PrepareFn, make_client_app, make_server_app
from fedpriv.errors import FedprivError
from fedpriv.training.loop import LoopResult
from fedpriv.training.prepared import Prepared


@contextlib.contextmanager
def single_threaded_scipy_blas():
    """Run a Flower simulation with scipy's OpenBLAS (jaxlib's LAPACK on CPU: the QR of the LSTM's
    orthogonal initializer) on one thread in this process.

    Why: a Flower simulation starts Ray (which forks subprocesses) while its ServerApp thread runs.
    OpenBLAS' fork handler stops its worker threads; a multi-threaded OpenBLAS call started by
    another thread around that moment waits for them forever (seen here: the ServerApp thread
    spinning in ``exec_blas_async_wait`` inside the orthogonal init's QR, no OpenBLAS worker thread
    left in the process, the ClientApp actors idle; seen again in the second simulation of one
    benchmark process). Only initialization uses LAPACK; no timed work does.
    """
    import ctypes
    import glob

    import scipy

    libs = glob.glob(os.path.join(os.path.dirname(scipy.__file__), "..", "scipy.libs", "libscipy_openblas*.so"))
    lib = ctypes.CDLL(libs[0]) if libs else None
    before = lib.scipy_openblas_get_num_threads() if lib else None
    if lib:
        lib.scipy_openblas_set_num_threads(1)
    try:
        yield
    finally:
        if lib:
            lib.scipy_openblas_set_num_threads(before)


def run_flower_simulation(
    prepared: Prepared,
    prepare: PrepareFn,
    run_dir: str | os.PathLike[str],
    stop_after: int | None = None,
    log: Callable[[str], None] | None = None,
    verbose: bool = False,
) -> LoopResult:
    """The prepared experiment's rounds on Flower (see the module docstring); ``prepare`` is how
    each ClientApp actor prepares the same experiment from its config."""
    from flwr.simulation import run_simulation

    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    cfg = prepared.config
    if cfg.federated is None:
        raise FedprivError(f"experiment {cfg.name!r}: no [federated] section")
    f = cfg.federated.flower
    box: list = []
    server = make_server_app(prepare, prepared, str(run_dir), stop_after, box, log)
    client = make_client_app(prepare, cfg)
    backend = {"client_resources": {"num_cpus": f.client_num_cpus, "num_gpus": f.client_num_gpus}}
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        with single_threaded_scipy_blas():
            run_simulation(server_app=server, client_app=client, num_supernodes=f.num_supernodes, backend_config=backend, verbose_logging=verbose)
    finally:  # ray.init installs its own SIGTERM handler (sys.exit(15)) and leaves it: the command's is restored
        if sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
    if not box:
        raise FedprivError("the Flower simulation ended without a result (see the log above for the ServerApp's error)")
    if isinstance(box[0], FedprivError):
        raise box[0]
    return box[0]
