"""A warm start (``[init] from``): a run's parameters start from another run's final parameters.

The practitioners' way to make DP training learn is to start from a model trained on public data
(Gboard pretrains on public text; DP-BERT starts from public BERT). The run named by ``init.from``
must be finished and must be of the same task, model and vocabulary: its task assets (the
vocabulary file, a tokenizer) must equal, byte for byte, the ones this run's task writes, and its
parameters must have this model's structure and shapes. Nothing else about it is used.

Privacy: a warm start adds no privacy cost when the starting run saw only public data
(``data.train_on = "public"``, :mod:`fedpriv.runner.prepare`); a start from a run trained on the
private users is recorded (``summary.json``: ``init``) and its privacy is not composed here.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import jax

from fedpriv.errors import ConfigError, DataFormatError, FedprivError
from fedpriv.rundir import RunDir
from fedpriv.tasks.base import Params, Task


def _asset_files(task: Task) -> dict[str, bytes]:
    """The files ``task.save_assets`` writes (name -> bytes)."""
    with tempfile.TemporaryDirectory() as tmp:
        task.save_assets(tmp)
        return {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}


def check_warm_start(where: str | os.PathLike[str], task: Task, kind: str, model: str) -> RunDir:
    """The run directory ``where`` if a run of ``task`` may start from its final parameters; a
    one-line ConfigError naming what differs otherwise (no final parameters, another task or
    model, another vocabulary)."""
    run = RunDir(where)
    if not run.path.is_dir():
        raise ConfigError(f"init.from: {where}: no such run directory")
    if not run.has_params():
        raise ConfigError(f"init.from: {where}: the run has no final parameters (params.msgpack); finish it first")
    try:
        theirs = run.experiment_config()
    except FedprivError as e:
        raise ConfigError(f"init.from: {where}: {e}") from None
    if (theirs.task.kind, theirs.task.model) != (kind, model):
        raise ConfigError(f"init.from: {where} trained task {theirs.task.kind!r} (model {theirs.task.model!r}); this run trains {kind!r} (model {model!r})")
    for name, data in _asset_files(task).items():
        if not run.has(name) or run.file(name).read_bytes() != data:
            raise ConfigError(f"init.from: {where}: its {name} differs from this run's (another vocabulary): a warm start needs the same one")
    return run


def load_warm_start(where: str | os.PathLike[str], task: Task, kind: str, model: str) -> Params:
    """The final parameters of the run ``where`` (checked by :func:`check_warm_start`)."""
    run = check_warm_start(where, task, kind, model)
    try:
        params, _ = run.load_params(task.init_params(jax.random.key(0)))
    except DataFormatError as e:
        raise ConfigError(f"init.from: {e}") from None
    return params


def utility_target(utility: Any, metric: str, train_on: str = "private") -> float | None:
    """The value of a ``[utility]`` target: ``target``, or the final validation ``metric`` of the
    run ``above`` names plus ``margin`` (None for a run on the public data: the public model is the
    reference, not a row trained to the target). ConfigError when that run has no validation
    evaluation of ``metric``."""
    if utility is None:
        return None
    if utility.target is not None:
        return utility.target
    if train_on == "public":
        return None
    run = RunDir(utility.above)
    if not run.path.is_dir():
        raise ConfigError(f"utility.above: {utility.above}: no such run directory (a 'run:NAME' must name an earlier run of the experiment)")
    rows = [r for r in run.metrics() if r.get("split") == utility.split and r.get(metric) is not None]
    if not rows:
        raise ConfigError(f"utility.above: {run.path} has no {utility.split} evaluation of {metric}; finish it first")
    return float(rows[-1][metric]) + utility.margin


def warm_start_record(where: str | os.PathLike[str]) -> dict[str, Any]:
    """What a run's summary records of its warm start: the run, whether it saw only public data."""
    run = RunDir(where)
    cfg = run.experiment_config()
    return {"from": str(run.path), "name": run.path.name, "public": cfg.data.train_on == "public"}
