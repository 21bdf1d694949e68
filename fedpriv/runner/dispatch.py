"""The one engine dispatch: train (or resume) one run of a prepared experiment, central or
federated on its engine. The CLI (``fedpriv train``), the run store (``fedpriv run``) and the
benchmarks all train through :func:`train_run`."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from fedpriv.central.train import train_prepared_central
from fedpriv.engines.vectorized import run_vectorized
from fedpriv.config import check_kind
from fedpriv.errors import ConfigError
from fedpriv.runner.checks import check_prepared
from fedpriv.runner.prepare import prepare
from fedpriv.training.loop import LoopResult
from fedpriv.training.prepared import Prepared

KINDS = ("central", "federated")
ENGINES = ("vectorized", "flower")


def run_kind(prepared: Prepared) -> str:
    """``federated`` when the experiment has a ``[federated]`` section, else ``central``."""
    return "federated" if prepared.config.federated is not None else "central"


def train_run(
    prepared: Prepared,
    run_dir: str | os.PathLike[str],
    kind: str | None = None,
    engine: str | None = None,
    stop_after: int | None = None,
    log: Callable[[str], None] | None = None,
) -> LoopResult:
    """Train ``prepared`` into ``run_dir`` (an existing checkpoint there is resumed).

    ``kind``: central (SGD, or DP-SGD with ``[privacy]``) or federated (default: by the config's
    sections); ``engine``: vectorized or flower (default: ``federated.engine``). ``stop_after``:
    stop with a checkpoint once this many steps or rounds are done in total. The checks of
    :mod:`fedpriv.runner.checks` run first; their warnings go to ``log`` (else stderr)."""
    kind = kind or run_kind(prepared)
    if kind not in KINDS:
        raise ConfigError(f"unknown run kind {kind!r}; choose one of {', '.join(KINDS)}")
    check_kind(prepared.config, kind, f"experiment {prepared.config.name!r}")
    for w in check_prepared(prepared, kind):
        (log or (lambda m: print(f"fedpriv: {m}", file=sys.stderr)))(f"warning: {w}")
    if kind == "central":
        return train_prepared_central(prepared, run_dir, stop_after, log)
    if prepared.config.federated is None:
        raise ConfigError(f"experiment {prepared.config.name!r}: no [federated] section (see experiments/fedavg-shakespeare.toml)")
    engine = engine or prepared.config.federated.engine
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if engine == "flower":  # imported here: Flower (and Ray) load only for runs on its engine
        from fedpriv.engines.flower.simulation import run_flower_simulation

        return run_flower_simulation(prepared, prepare, run_dir, stop_after, log)
    return run_vectorized(prepared, run_dir, stop_after, log)
