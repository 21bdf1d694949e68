"""``fedpriv train federated --engine flower``: the Flower apps in a local simulation.

Runs :func:`flwr.simulation.run_simulation` with ``federated.num_supernodes`` virtual SuperNodes
and Ray actors of ``client_num_cpus`` / ``client_num_gpus`` each. The apps are bound to the
config and run directory (no run config needed). Runtime dependency installation is switched off
(``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``): the apps run from this environment, and an
offline machine could not install anything anyway.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

from fedpriv.config import load_config
from fedpriv.engines.flower_apps import make_client_app, make_server_app
from fedpriv.engines.rounds import FederatedResult
from fedpriv.errors import FedprivError


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
    config_path: str | os.PathLike[str],
    run_dir: str | os.PathLike[str],
    stop_after: int | None = None,
    log: Callable[[str], None] | None = None,
    verbose: bool = False,
) -> FederatedResult:
    from flwr.simulation import run_simulation

    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    cfg = load_config(config_path)
    if cfg.federated is None:
        raise FedprivError(f"{config_path}: no [federated] section")
    f = cfg.federated
    box: list = []
    server = make_server_app(str(config_path), str(run_dir), stop_after, box)
    client = make_client_app(str(config_path))
    backend = {"client_resources": {"num_cpus": f.client_num_cpus, "num_gpus": f.client_num_gpus}}
    with single_threaded_scipy_blas():
        run_simulation(server_app=server, client_app=client, num_supernodes=f.num_supernodes, backend_config=backend, verbose_logging=verbose)
    if not box:
        raise FedprivError("the Flower simulation ended without a result (see the log above for the ServerApp's error)")
    return box[0]
