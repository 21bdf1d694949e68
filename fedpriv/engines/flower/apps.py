"""The Flower engine's real ServerApp and ClientApp.

* ``flwr run .`` uses the module-level apps of :mod:`fedpriv.runner.flower_app` (named in
  pyproject's ``[tool.flwr.app.components]``), made here with the experiment and run directory
  read from the run config (``config``, ``run-dir``; override with ``flwr run . --run-config
  "config='experiments/x.toml'"``).
* ``fedpriv train federated CONFIG --engine flower`` and ``fedpriv run`` build apps bound to the
  experiment: the ServerApp to the prepared experiment itself (it runs in this process), the
  ClientApp to its validated config (sent to the simulation's actors), and run them with
  ``flwr.simulation.run_simulation`` (:mod:`fedpriv.engines.flower.simulation`).

How an experiment is prepared (loaded, filtered, canaries planted, encoded) is given to the app
factories as ``prepare(config, log) -> Prepared`` (:func:`fedpriv.runner.prepare.prepare`), so
the engines do not depend on the runner above them. A ClientApp process (a Ray actor in
simulation, a SuperNode's app process in deployment) prepares the experiment and compiles the
client update once, then reuses them for every message (cached by the config). The server samples users; each message names
``federated.users_per_message`` of them (1 by default), which the ClientApp trains one after
another in one jitted call, :class:`fedpriv.engines.cohort.CohortUpdate`, the vectorized engine's
call for a chunk. With ``federated.sum_on_client`` it replies with their clipped (or weighted)
sum instead of each delta. The client update is :mod:`fedpriv.clients.update`, the aggregation
:mod:`fedpriv.strategies.core`: the same code as the vectorized engine.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedpriv.config import ExperimentConfig, load_config
from fedpriv.engines.cohort import CohortUpdate
from fedpriv.engines.flower.strategy import ARRAYS, CONFIG, METRICS, FedprivStrategy, FlowerEngine, params_to_record, record_to_params
from fedpriv.engines.setup import FederatedSetup, train_federated
from fedpriv.errors import ConfigError, FedprivError
from fedpriv.logs import setup as setup_logs
from fedpriv.rundir import hold
from fedpriv.training.loop import LoopResult
from fedpriv.training.prepared import Prepared

PrepareFn = Callable[[ExperimentConfig, Callable[[str], None] | None], Prepared]
"""(experiment config, log) -> the prepared experiment."""


def _echo(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _one_line(message: str) -> str:
    """``message`` with its line breaks escaped (a path or a key may hold one)."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def _run_config_value(context: Context, key: str, bound: str | None) -> str | None:
    if bound is not None:
        return bound
    value = context.run_config.get(key)
    return None if value in (None, "") else str(value)


def _config_search_dirs() -> list[Path]:
    """Where a relative experiment path is looked up, in order: ``$FEDPRIV_APP_DIR``, the
    installed FAB's directory (``flwr run``: the app processes run wherever the SuperLink or
    SuperNode was started, and Flower puts the FAB's directory on ``sys.path`` when it loads the
    app), the working directory, and the checkout this package was installed from (editable)."""
    from flwr.supercore.utils import get_flwr_home

    dirs: list[Path] = []
    if os.environ.get("FEDPRIV_APP_DIR"):
        dirs.append(Path(os.environ["FEDPRIV_APP_DIR"]))
    apps = (get_flwr_home() / "apps").resolve()
    dirs += [Path(p) for p in sys.path if p and Path(p).resolve().is_relative_to(apps)]
    dirs.append(Path.cwd())
    dirs.append(Path(__file__).resolve().parents[3])
    return list(dict.fromkeys(d.resolve() for d in dirs))


def resolve_config_path(path: str) -> str:
    """An experiment path from the run config as an absolute path (see :func:`_config_search_dirs`)."""
    if os.path.isabs(path):
        if not os.path.isfile(path):
            raise ConfigError(f"experiment config {path} (run config key 'config') does not exist")
        return path
    tried = [d / path for d in _config_search_dirs()]
    for candidate in tried:
        if candidate.is_file():
            return str(candidate)
    raise ConfigError(f"experiment config {path!r} (run config key 'config') not found; tried " + ", ".join(str(t) for t in tried))


def experiment_path(context: Context, bound: str | None, app: str) -> str:
    """The experiment TOML an app runs: ``bound``, else the run config's ``config``, resolved."""
    path = _run_config_value(context, "config", bound)
    if path is None:
        raise ConfigError(f"the {app} needs the run config key 'config' (an experiment TOML)")
    return resolve_config_path(path)


# ---- client ------------------------------------------------------------------------------------
class ClientRuntime:
    """Everything a ClientApp process needs, built once per process and experiment."""

    def __init__(self, config: ExperimentConfig, prepare: PrepareFn):
        setup_logs()  # this process's third-party messages, quiet unless FEDPRIV_VERBOSE=1
        prepared = prepare(config, None)
        self.setup = FederatedSetup(prepared, client=True)  # clients add no noise: no strategy, calibration or budget here
        # Shapes and dtypes only (what decoding a record and the accumulator read): the model's
        # initialization is traced, not run, so this process compiles none of its eager ops.
        self.template = jax.eval_shape(self.setup.initial_params)
        self.cohort = CohortUpdate(self.setup)

    def train(self, msg: Message) -> Message:
        """The deltas of the message's users (``config["users"]``), stacked in that order, with
        their aggregation weights (metric ``weights``: example counts, or 1 each in a DP run, which
        sends no example count and, unless ``training.log_private_stats``, no loss or step count);
        or, when the server asks for a sum (``config["sum"]``), their sum accumulated as the server
        would (clipped to ``config["clip"]``, or weighted for fedavg) and each user's unclipped
        delta norm (metric ``delta-norms``)."""
        s = self.setup
        cfg = msg.content[CONFIG]
        users, round_ = np.asarray(cfg["users"], np.int64), int(cfg["round"])
        params = record_to_params(msg.content[ARRAYS], self.template)
        # Width fixed by the config (the last group of a round is padded), so one program serves all.
        width = max(s.fcfg.flower.users_per_message, len(users))
        deltas, mask, loss_sum, steps = self.cohort.deltas(params, users, round_, width)
        weights = [int(w) for w in s.weights(users)]  # example counts; 1 each in a DP run (the server must not learn n_u)
        metrics = {"users": users.tolist(), "weights": weights}
        if not s.private or s.config.training.log_private_stats:
            metrics.update({"loss-sum": loss_sum, "local-steps": steps})
        if bool(cfg.get("sum", False)):
            acc = s.core.make_accumulator(self.template, float(cfg["clip"]))
            acc.add(deltas, np.pad(np.asarray(weights, np.float32), (0, width - len(users))), mask)
            arrays, metrics["delta-norms"] = acc.total, acc.all_norms.tolist()
        else:
            arrays = jax.tree_util.tree_map(lambda d: d[: len(users)], deltas)
        return Message(RecordDict({ARRAYS: params_to_record(arrays), METRICS: MetricRecord(metrics)}), reply_to=msg)


_RUNTIMES: dict[str, ClientRuntime] = {}


def _runtime(config: ExperimentConfig, prepare: PrepareFn) -> ClientRuntime:
    key = config.model_dump_json()
    if key not in _RUNTIMES:
        _RUNTIMES[key] = ClientRuntime(config, prepare)
    return _RUNTIMES[key]


def make_client_app(prepare: PrepareFn, config: ExperimentConfig | None = None) -> ClientApp:
    """A ClientApp that runs the client update; bound to ``config`` or reading the experiment
    path ``config`` from the run config (``flwr run``)."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        cfg = config if config is not None else load_config(experiment_path(context, None, "ClientApp"))
        return _runtime(cfg, prepare).train(msg)

    return app


# ---- server ------------------------------------------------------------------------------------
#: Seconds :func:`wait_for_nodes` waits before it says what it is waiting for.
NODE_WAIT_NOTE_S = 3.0


def wait_for_nodes(grid: Grid, wanted: int, timeout_s: float, log: Callable[[str], None]) -> int:
    """Wait until ``wanted`` SuperNodes are connected (or ``timeout_s`` passes with at least one).
    Says once, after :data:`NODE_WAIT_NOTE_S`, what it waits for: under ``flwr run`` the federation
    sets how many SuperNodes there are, and a smaller one than ``wanted`` costs ``timeout_s`` each run."""
    t0 = time.monotonic()
    said = False
    while True:
        n = len(list(grid.get_node_ids()))
        if n >= wanted or (n >= 1 and time.monotonic() - t0 > timeout_s):
            return n
        if time.monotonic() - t0 > (limit := max(timeout_s, 1.0) * 4):
            raise ConfigError(f"no SuperNode connected within {limit:.0f} s")
        if not said and time.monotonic() - t0 > NODE_WAIT_NOTE_S:
            log(f"waiting up to {timeout_s:.0f} s for {wanted} SuperNodes (federated.flower.num_supernodes), {n} connected so far; "
                "a federation with fewer nodes runs with those it has once the wait ends (set num_supernodes to its size to skip the wait)")
            said = True
        time.sleep(0.2)


def serve(grid: Grid, prepared: Prepared, run_dir: str, stop_after: int | None = None, log: Callable[[str], None] = _echo, node_wait_s: float = 30.0) -> LoopResult:
    """The ServerApp's body: run the prepared experiment's rounds through ``grid``."""
    with hold(run_dir, "run"):  # `flwr run`: the ServerApp's process owns the run directory (in a simulation, this process already does),
        setup = FederatedSetup(prepared, log, run_dir)  # (claimed first: the setup may store an optimized strategy there)
        strategy = FedprivStrategy(setup, log)
        strategy.summary()
        n = wait_for_nodes(grid, setup.fcfg.flower.num_supernodes, node_wait_s, log)
        log(f"{n} SuperNode(s) connected")
        engine = FlowerEngine(strategy, grid, setup.fcfg.flower.round_timeout_s)
        return train_federated(setup, engine, run_dir, stop_after, log)


def make_server_app(
    prepare: PrepareFn,
    prepared: Prepared | None = None,
    run_dir: str | None = None,
    stop_after: int | None = None,
    result_box: list | None = None,
    log: Callable[[str], None] | None = None,
) -> ServerApp:
    """A ServerApp running an experiment: ``prepared`` (in this process), or the experiment path
    ``config`` of the run config prepared with ``prepare`` (``flwr run``; ``run-dir`` and
    ``stop-after`` from the run config too). ``result_box`` receives the loop's result."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        setup_logs()
        try:
            result = _serve_run(grid, context)
        except FedprivError as e:  # Flower logs it and goes on: the box carries it to the caller
            if result_box is not None:
                result_box.append(e)
            else:  # `flwr run`: nobody above prints it; one line in the run's log before Flower's traceback
                _echo(f"fedpriv: error: {_one_line(str(e))}")
            raise  # the run ends finished:failed, with the message in its status details
        if result_box is not None:
            result_box.append(result)

    def _serve_run(grid: Grid, context: Context) -> LoopResult:
        say = log or _echo
        if prepared is not None:
            exp, out = prepared, os.path.abspath(run_dir or os.path.join("runs", f"{prepared.config.name}-flower"))
        else:
            path = experiment_path(context, None, "ServerApp")
            cfg = load_config(path)
            out = os.path.abspath(_run_config_value(context, "run-dir", run_dir) or os.path.join("runs", f"{cfg.name}-flower"))
            _echo(f"experiment {path}, run directory {out}")
            exp = prepare(cfg, say)
        stop = stop_after if stop_after is not None else (int(context.run_config["stop-after"]) if int(context.run_config.get("stop-after", 0) or 0) > 0 else None)
        return serve(grid, exp, out, stop, say)

    return app
