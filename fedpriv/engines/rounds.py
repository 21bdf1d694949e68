"""The federated round loop every engine shares: resume, rounds, evaluation, metrics, checkpoints.

An engine supplies ``round_fn(round, state) -> (state, info)``: it runs the cohort's client
updates (in-process, or through Flower) and the strategy's aggregation. Everything else lives
here, so the engines cannot drift apart:

* the global model starts from ``task.init_params`` with the same key as central training;
* every ``checkpoint_every`` rounds (and at the end, and on a stop) the state (global model,
  server optimizer, clip state) is checkpointed with the privacy ledger; the sampler needs no
  state (round r's cohort is a function of (seed, r)). A resumed run ends with exactly the result
  of an uninterrupted one;
* ``metrics.jsonl`` gets a train row per round (mean local loss, clients, clip statistics,
  wall seconds, epsilon with its guarantee) and an evaluation row every ``eval_every`` rounds and at the end.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import serialization

from fedpriv.central.checkpoint import load_checkpoint, save_checkpoint
from fedpriv.central.trainer import METRICS_FILE, Progress, _append, _truncate_metrics, evaluate, init_key
from fedpriv.clients.data import ClientData
from fedpriv.clients.privacy import Participation, check_client_dp, record_level_report
from fedpriv.clients.update import ClientDP
from fedpriv.errors import ConfigError, FedprivError
from fedpriv.pipeline import Prepared
from fedpriv.privacy.ledger import LEDGER_FILE, PrivacyLedger
from fedpriv.strategies.core import ServerCore
from fedpriv.tasks.base import Params

RoundFn = Callable[[int, dict], tuple[dict, dict[str, Any]]]


class FederatedSetup:
    """What every engine needs, built once from a prepared experiment with a ``[federated]`` section."""

    def __init__(self, prepared: Prepared, log: Callable[[str], None] | None = None):
        cfg = prepared.config
        if cfg.federated is None:
            raise ConfigError(f"experiment {cfg.name!r} has no [federated] section")
        if cfg.privacy is not None:
            raise ConfigError("[privacy] (record-level DP-SGD) is for central training; federated runs take their privacy keys in [federated] (strategy = 'dp-fedavg')")
        self.prepared = prepared
        self.config = cfg
        self.fcfg = cfg.federated
        self.seed = cfg.seed
        self.task = prepared.task
        self.data = ClientData(prepared.train_arrays, prepared.train.counts())
        self.core = ServerCore(self.fcfg, self.data.num_users, cfg.seed, log)
        self.client_dp: ClientDP | None = None
        self.participation: Participation | None = None
        if check_client_dp(self.fcfg):
            self.client_dp = ClientDP(self.fcfg.client_clip_norm, self.fcfg.client_noise_multiplier, self.fcfg.local_batch_size)
            self.participation = Participation(self.core.sampler)

    def privacy_report(self, rounds: int) -> dict[str, Any]:
        """User-level epsilon of the strategy, and record-level epsilon of client-side DP-SGD if on."""
        out = self.core.privacy_report()
        if self.participation is not None:
            out.update(record_level_report(self.fcfg, self.participation, rounds))
        return out

    def plan(self, user: int, round_: int) -> np.ndarray:
        f = self.fcfg
        return self.data.plan(user, round_, self.seed, f.local_epochs, f.local_batch_size, f.max_local_steps)

    def initial_params(self) -> Params:
        return self.task.init_params(init_key(self.seed))


@dataclass
class FederatedResult:
    params: Params
    rounds: int
    final_eval: dict[str, float]
    history: list[dict] = field(default_factory=list)
    stopped: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)


def run_rounds(
    setup: FederatedSetup,
    run_dir: str | os.PathLike[str],
    round_fn: RoundFn,
    engine: str,
    stop_after: int | None = None,
    log: Callable[[str], None] | None = None,
) -> FederatedResult:
    """Run (or resume) the experiment's rounds with ``round_fn``; see the module docstring.
    ``stop_after``: stop with a checkpoint once this many rounds are done (a kill, for tests)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    core, fcfg, task = setup.core, setup.fcfg, setup.task
    state = core.init_state(setup.initial_params())
    metrics_path = run_dir / METRICS_FILE
    start = 0
    resumed = load_checkpoint(run_dir, state)
    if resumed is not None:
        state, meta = resumed
        start = int(meta["step"])
        if meta.get("kind") != "federated":
            raise FedprivError(f"{run_dir} holds a checkpoint of another kind of run; use a new run directory")
        if core.event is not None:
            ledger = PrivacyLedger.load(run_dir)
            if ledger.steps != start or (ledger.entries and not ledger.entries[-1].same_mechanism(core.event)):
                raise FedprivError(f"{run_dir}: the privacy ledger ({ledger.steps} rounds) does not match the checkpoint at round {start} with these DP parameters; use a new run directory")
            core.ledger = ledger
        _truncate_metrics(metrics_path, start)
    elif metrics_path.exists():
        metrics_path.unlink()
    (run_dir / "config.json").write_text(json.dumps({"kind": "federated", "engine": engine, "experiment": setup.config.model_dump()}, indent=1))
    setup.prepared.save_assets(run_dir)

    eval_sets = setup.prepared.eval_arrays
    sums_fn = jax.jit(task.metric_sums)
    eval_batch = setup.config.training.eval_batch_size
    history: list[dict] = []
    last_eval: dict[str, float] = {}
    progress = Progress(fcfg.rounds, start, log, f"federated {fcfg.strategy} ({engine})")
    if start:
        progress.note(f"resumed from the checkpoint at round {start} of {fcfg.rounds}")
    stopped = core.budget_stop(start) if start else None
    done = start
    t0 = time.perf_counter()
    try:
        for r in range(start + 1, fcfg.rounds + 1):
            if stopped:
                break
            t_round = time.perf_counter()
            state, info = round_fn(r, state)
            info["round_seconds"] = time.perf_counter() - t_round
            done = r
            stopped = core.budget_stop(done)
            halt = stop_after is not None and done >= stop_after and done < fcfg.rounds
            row = {"round": done, "split": "train", **info, **setup.privacy_report(done)}
            _append(metrics_path, {"step": done, **row})
            history.append(row)
            if done % fcfg.eval_every == 0 or done == fcfg.rounds or stopped:
                for name, arrays in eval_sets.items():
                    last_eval = {"round": done, "split": name, **evaluate(task, state["params"], arrays, eval_batch, sums_fn)}
                    _append(metrics_path, {"step": done, **last_eval})
                    history.append(last_eval)
            progress.note(describe_round(done, fcfg.rounds, row, last_eval if last_eval.get("round") == done else {}, time.perf_counter() - t0))
            if done % fcfg.checkpoint_every == 0 or done == fcfg.rounds or stopped or halt:
                save_checkpoint(run_dir, state, {"step": done, "kind": "federated"})
                if core.event is not None:
                    core.ledger.save(run_dir / LEDGER_FILE)
            progress.advance(done)
            if halt:
                progress.note(f"stopped after round {done} as asked; run the same command again to resume")
                break
    finally:
        progress.close()
    if stopped:
        progress.note(stopped)
    if done == fcfg.rounds or stopped:
        (run_dir / "params.msgpack").write_bytes(serialization.to_bytes(state["params"]))
    summary = {**setup.prepared.summary(), "engine": engine, "strategy": fcfg.strategy, "rounds": done, "run_dir": str(run_dir)}
    return FederatedResult(state["params"], done, last_eval, history, stopped, summary)


def describe_round(done: int, rounds: int, row: dict, eval_row: dict, elapsed: float) -> str:
    parts = [f"round {done}/{rounds}", f"clients {row.get('clients', 0)}"]
    if row.get("loss") is not None:
        parts.append(f"local loss {row['loss']:.4f}")
    if row.get("client_epsilon") is not None:
        parts.append(f"record-level client epsilon {row['client_epsilon']:.3g} (delta {row['client_delta']:g}, add-or-remove-one example)")
    if row.get("clip_norm") is not None:
        parts.append(f"clip {row['clip_norm']:.3g} (unclipped {row.get('unclipped_fraction', 0):.0%})")
    if row.get("epsilon") is not None:
        parts.append(f"epsilon {row['epsilon']:.3g} (delta {row['delta']:g}; {row['basis']})")
    for k in ("perplexity", "accuracy", "f1"):
        if k in eval_row:
            parts.append(f"{eval_row['split']} {k} {eval_row[k]:.4g}")
    parts.append(f"{elapsed:.0f}s")
    return ", ".join(parts)


def client_loss_info(loss_sum: float, steps: int, examples: int) -> dict[str, Any]:
    """The train row's client statistics: mean local step loss, local steps and examples."""
    return {"loss": loss_sum / steps if steps else None, "local_steps": steps, "examples": examples}
