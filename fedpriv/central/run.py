"""Central training of a prepared experiment: SGD, or DP-SGD when the config has ``[privacy]``."""

from __future__ import annotations

import os
from collections.abc import Callable

from fedpriv.central.trainer import SGDStepper, TrainResult, make_optimizer, total_steps, train_central
from fedpriv.pipeline import Prepared


def run_central(prepared: Prepared, run_dir: str | os.PathLike[str], stop_after: int | None = None, log: Callable[[str], None] | None = None) -> TrainResult:
    cfg = prepared.config
    train = prepared.train_arrays
    os.makedirs(run_dir, exist_ok=True)
    prepared.save_assets(run_dir)
    steps = total_steps(cfg.training, len(train["mask"]))
    tx = make_optimizer(cfg.training, steps)
    if cfg.privacy is None:
        stepper = SGDStepper(prepared.task, train, prepared.train.counts(), cfg.training, cfg.seed, tx)
    else:
        from fedpriv.central.dpsgd import DPSGDStepper

        stepper = DPSGDStepper(prepared.task, train, cfg.training, cfg.privacy, cfg.seed, tx, steps, log)
    return train_central(
        prepared.task,
        train,
        prepared.train.counts(),
        cfg.training,
        cfg.seed,
        run_dir,
        eval_sets=prepared.eval_arrays,
        stepper=stepper,
        stop_after=stop_after,
        log=log,
        extra_meta={"experiment": cfg.model_dump()},
    )
