"""``fedpriv train federated --engine flower``: the Flower apps in a local simulation.

Runs :func:`flwr.simulation.run_simulation` with ``federated.num_supernodes`` virtual SuperNodes
and Ray actors of ``client_num_cpus`` / ``client_num_gpus`` each. The apps are bound to the
config and run directory (no run config needed). Runtime dependency installation is switched off
(``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``): the apps run from this environment, and an
offline machine could not install anything anyway.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from fedpriv.config import load_config
from fedpriv.engines.flower_apps import make_client_app, make_server_app
from fedpriv.engines.rounds import FederatedResult
from fedpriv.errors import FedprivError


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
    run_simulation(server_app=server, client_app=client, num_supernodes=f.num_supernodes, backend_config=backend, verbose_logging=verbose)
    if not box:
        raise FedprivError("the Flower simulation ended without a result (see the log above for the ServerApp's error)")
    return box[0]
