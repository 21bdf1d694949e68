"""``fedpriv train federated``: one entry point over the engines, and its summary."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedpriv.config import load_config
from fedpriv.engines.rounds import FederatedResult
from fedpriv.errors import ConfigError

ENGINES = ("vectorized", "flower")


def run_federated(
    config_path: str | os.PathLike[str],
    run_dir: str | os.PathLike[str] | None = None,
    engine: str | None = None,
    stop_after: int | None = None,
    log: Callable[[str], None] | None = None,
) -> FederatedResult:
    """Train the experiment's ``[federated]`` section with ``engine`` (default: the config's).
    The run directory defaults to ``runs/NAME-federated``; a checkpoint there is resumed."""
    cfg = load_config(config_path)
    if cfg.federated is None:
        raise ConfigError(f"{config_path}: no [federated] section (see experiments/fedavg-shakespeare.toml)")
    engine = engine or cfg.federated.engine
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    run_dir = Path(run_dir) if run_dir is not None else Path("runs") / f"{cfg.name}-federated"
    if engine == "flower":
        from fedpriv.engines.flower_sim import run_flower_simulation

        return run_flower_simulation(config_path, run_dir, stop_after, log)
    from fedpriv.engines.vectorized import run_vectorized
    from fedpriv.pipeline import prepare

    return run_vectorized(prepare(cfg, log), run_dir, stop_after, log)


def federated_summary(result: FederatedResult) -> dict[str, Any]:
    """The run's summary: data, engine, rounds, final evaluation and epsilon with its guarantee."""
    out = dict(result.summary)
    out.update({f"final_{k}": v for k, v in result.final_eval.items() if k not in ("round", "split")})
    train_rows = [r for r in result.history if r.get("split") == "train"]
    if train_rows and train_rows[-1].get("epsilon") is not None:
        last = train_rows[-1]
        out.update(epsilon=last["epsilon"], delta=last["delta"], guarantee=last["guarantee"])
    if result.stopped:
        out["stopped"] = result.stopped
    return out
