"""Central minibatch training over records: the central steppers' shared rows, and plain SGD.

One step: take the step's records (:mod:`fedpriv.central.order`), pad them to the batch size with
masked rows (fixed shapes: one compilation), compute the gradient, apply the optax update. The
randomness of step k is ``fold_in(step_key_base(seed), k)``. DP-SGD
(:class:`fedpriv.central.dpsgd.DPSGDStepper`) is the other central stepper.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import optax

from fedpriv.central.order import BatchSchedule
from fedpriv.config import TrainingConfig
from fedpriv.errors import FedprivError
from fedpriv.tasks.base import Batch, Params, Task
from fedpriv.training.loop import Stepper, eval_text, gather, step_key_base

GradFn = Callable[[Params, Mapping[str, jax.Array], jax.Array], tuple[jax.Array, Params]]
"""(params, batch, rng) -> (loss, gradient pytree)."""


def sgd_gradient(task: Task) -> GradFn:
    """The non-private gradient: of the mean per-example loss over the batch's real rows."""

    def grad_fn(params, batch, rng):
        return jax.value_and_grad(task.mean_loss)(params, batch, rng, True)

    return grad_fn


class CentralStepper(Stepper):
    """What central steppers share: train rows every ``eval_every`` steps with the loss averaged
    over the steps since the last row, an ``epoch`` column, progress lines in examples/s (users/s for user-level DP-SGD)."""

    kind = "central"
    unit = "step"
    #: what ``training.batch_size`` counts, for the progress line's rate (user-level DP-SGD: users)
    batch_unit = "examples"

    def __init__(self, task: Task, cfg: TrainingConfig, total_steps: int, steps_per_epoch: int, tx: optax.GradientTransformation):
        self.task, self.cfg, self.tx = task, cfg, tx
        self.total = total_steps
        self.steps_per_epoch = steps_per_epoch
        self.row_every = self.eval_every = cfg.eval_every
        self.checkpoint_every = cfg.checkpoint_every
        self.title = f"training {task.name}"

    def init_state(self, params: Params) -> dict:
        return {"params": params, "opt_state": self.tx.init(params)}

    def privacy_report(self) -> dict[str, Any]:
        """The train row's privacy columns (none for plain SGD)."""
        return {}

    def position(self, done: int) -> dict[str, Any]:
        return {"epoch": done / self.steps_per_epoch}

    def train_row(self, done: int, infos: list[dict[str, Any]]) -> dict[str, Any]:
        total = 0.0
        for info in infos:
            total += info["loss"]
        return {"loss": total / max(len(infos), 1), **self.privacy_report()}

    def describe(self, done: int, row: dict[str, Any], eval_rows: list[dict[str, Any]], seconds: float, since: int) -> str:
        loss = f"train loss {row['loss']:.4f}" if row.get("loss") is not None else f"noised update norm {row.get('noised_update_norm') or 0:.4g}"
        parts = [f"step {done}/{self.total}", loss]
        if row.get("epsilon") is not None:
            parts.append(f"epsilon {row['epsilon']:.3g} (delta {row['delta']:g}; {row.get('basis', '')})")
        parts += eval_text(eval_rows)
        parts.append(f"{since * self.cfg.batch_size / max(seconds, 1e-9):.0f} {self.batch_unit}/s")
        return ", ".join(parts)


class SGDStepper(CentralStepper):
    """Non-private minibatch training: the schedule's records, padded; one jitted update per step."""

    def __init__(self, task: Task, train: Batch, user_counts: np.ndarray, cfg: TrainingConfig, seed: int, tx: optax.GradientTransformation, total_steps: int, grad_fn: GradFn | None = None):
        schedule = BatchSchedule(user_counts, cfg.order, seed, cfg.batch_size)
        super().__init__(task, cfg, total_steps, schedule.steps_per_epoch, tx)
        self.train, self.schedule = train, schedule
        base_key = step_key_base(seed)
        grad_fn = grad_fn or sgd_gradient(task)

        @jax.jit
        def step_fn(state, batch, step):
            loss, grads = grad_fn(state["params"], batch, jax.random.fold_in(base_key, step))
            updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
            return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, loss

        self._step_fn = step_fn

    def step(self, state: dict, index: int) -> tuple[dict, dict[str, Any]]:
        state, loss = self._step_fn(state, gather(self.train, self.schedule.indices(index), self.cfg.batch_size), index)
        return state, {"loss": float(loss)}


def total_steps(cfg: TrainingConfig, num_records: int) -> int:
    """The run's steps: ``training.steps``, or ``ceil(epochs * ceil(N / B))``."""
    if (cfg.steps is None) == (cfg.epochs is None):
        raise FedprivError("training: give exactly one of steps or epochs")
    if cfg.steps is not None:
        return cfg.steps
    return max(1, math.ceil(cfg.epochs * math.ceil(num_records / cfg.batch_size)))
