"""The apps ``flwr run .`` loads (pyproject's ``[tool.flwr.app.components]``): the Flower engine's
ServerApp and ClientApp, reading the experiment from the run config and preparing it with
:func:`fedpriv.runner.prepare.prepare` (see :mod:`fedpriv.engines.flower.apps`)."""

from __future__ import annotations

from collections.abc import Callable

from fedpriv.config import ExperimentConfig
from fedpriv.engines.flower.apps import make_client_app, make_server_app
from fedpriv.runner.checks import check_prepared
from fedpriv.runner.prepare import prepare
from fedpriv.training.prepared import Prepared


def prepare_checked(cfg: ExperimentConfig, log: Callable[[str], None] | None = None) -> Prepared:
    """The ServerApp's preparation: :func:`prepare`, then the data checks training makes
    (:func:`fedpriv.runner.checks.check_prepared`: cohort sizes, delta against 1/N)."""
    prepared = prepare(cfg, log)
    for w in check_prepared(prepared, "federated"):
        (log or print)(f"fedpriv: warning: {w}")
    return prepared


server_app = make_server_app(prepare_checked)
client_app = make_client_app(prepare)
