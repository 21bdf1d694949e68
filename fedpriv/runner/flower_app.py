"""The apps ``flwr run .`` loads (pyproject's ``[tool.flwr.app.components]``): the Flower engine's
ServerApp and ClientApp, reading the experiment from the run config and preparing it with
:func:`fedpriv.runner.prepare.prepare` (see :mod:`fedpriv.engines.flower.apps`)."""

from __future__ import annotations

from fedpriv.engines.flower.apps import make_client_app, make_server_app
from fedpriv.runner.prepare import prepare

server_app = make_server_app(prepare)
client_app = make_client_app(prepare)
