"""Central training: SGD over records, or DP-SGD when the config has ``[privacy]``, under the one loop."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fedpriv.central.dpsgd import DPSGDStepper
from fedpriv.central.sgd import CentralStepper, GradFn, SGDStepper, total_steps
from fedpriv.config import TrainingConfig
from fedpriv.errors import FedprivError
from fedpriv.rundir import STRATEGY, RunDir
from fedpriv.tasks.base import Batch, Params, Task
from fedpriv.training.coverage import coverage
from fedpriv.training.loop import LoopResult, Target, run_loop
from fedpriv.training.noise import check_secret_on_resume, noise_meta, noise_seed
from fedpriv.training.optimizers import make_optimizer
from fedpriv.training.prepared import Prepared


def training_optimizer(cfg: TrainingConfig, steps: int):
    """The ``[training]`` optimizer over ``steps`` steps."""
    return make_optimizer(cfg.optimizer, cfg.learning_rate, cfg.momentum, cfg.schedule, cfg.warmup_steps, steps)


def train_central(
    task: Task,
    train: Batch,
    user_counts: np.ndarray,
    cfg: TrainingConfig,
    seed: int,
    run_dir: str | os.PathLike[str],
    eval_sets: Mapping[str, Batch] | None = None,
    grad_fn: GradFn | None = None,
    stepper: CentralStepper | None = None,
    stop_after: int | None = None,
    log: Callable[[str], None] | None = None,
    extra_meta: dict[str, Any] | None = None,
    target: Target | None = None,
    snapshots: bool = False,
    initial: Params | None = None,
) -> LoopResult:
    """Train ``task`` on pre-encoded ``train`` rows (users in corpus order, ``user_counts`` rows each).

    ``eval_sets``: name -> encoded rows, evaluated every ``cfg.eval_every`` steps and at the end.
    ``stepper``: how a step is made (default :class:`SGDStepper`, with ``grad_fn`` if given).
    ``stop_after``: stop with a checkpoint once this many steps are done in total (a kill).
    ``target``: stop at a utility target; ``snapshots``: keep every evaluation's parameters;
    ``initial``: the starting parameters (a warm start; default: the task's fresh ones of ``seed``).
    Resumes from the run directory's checkpoint when there is one."""
    num = len(train["mask"])
    if num == 0:
        raise FedprivError("no training records")
    if int(np.sum(user_counts)) != num:
        raise FedprivError(f"user_counts sum to {int(np.sum(user_counts))} but there are {num} records")
    steps = total_steps(cfg, num)
    if stepper is None:
        stepper = SGDStepper(task, train, user_counts, cfg, seed, training_optimizer(cfg, steps), steps, grad_fn)
    meta = {"training": cfg.model_dump(), "seed": seed, "task": task.name, "utility": list(task.utility), **(extra_meta or {})}
    return run_loop(stepper, task, RunDir(run_dir), seed, meta, eval_sets, cfg.eval_batch_size, stop_after, log, target, snapshots, initial)


def central_stepper(prepared: Prepared, log: Callable[[str], None] | None = None, run_dir: str | os.PathLike[str] | None = None) -> CentralStepper:
    """The stepper of a prepared experiment: SGD, or DP-SGD with ``[privacy]``. ``run_dir``: the
    run directory an optimized correlated-noise strategy is stored in (and read back from)."""
    cfg = prepared.config
    train = prepared.train_arrays
    steps = total_steps(cfg.training, len(train["mask"]))
    tx = training_optimizer(cfg.training, steps)
    if cfg.privacy is None:
        return SGDStepper(prepared.task, train, prepared.train.counts(), cfg.training, cfg.seed, tx, steps)
    stepper = DPSGDStepper(prepared.task, train, cfg.training, cfg.privacy, cfg.seed, tx, steps, log, prepared.train.counts(), noise_seed(cfg, run_dir),
                           RunDir(run_dir).file(STRATEGY) if run_dir is not None else None)
    stepper.budget.coverage = coverage(cfg, prepared.task, cfg.privacy.unit, cfg.training.log_private_stats)
    return stepper


def train_prepared_central(prepared: Prepared, run_dir: str | os.PathLike[str], stop_after: int | None = None, log: Callable[[str], None] | None = None) -> LoopResult:
    """Central training of a prepared experiment: SGD, or DP-SGD with ``[privacy]``."""
    cfg = prepared.config
    train = prepared.train_arrays
    RunDir(run_dir).create()
    prepared.save_assets(run_dir)
    stepper = central_stepper(prepared, log, run_dir)
    noise = getattr(stepper, "noise", None)
    if noise is not None:
        check_secret_on_resume(run_dir, noise)
    return train_central(
        prepared.task, train, prepared.train.counts(), cfg.training, cfg.seed, run_dir,
        eval_sets=prepared.eval_arrays, stepper=stepper, stop_after=stop_after, log=log, extra_meta={"experiment": cfg.model_dump(), **(noise_meta(noise) if noise else {})},
        target=prepared.target(), snapshots=cfg.audit.along, initial=prepared.initial_params(cfg.seed),
    )
