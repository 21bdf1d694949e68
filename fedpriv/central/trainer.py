"""The central trainer: minibatch training over records, with evaluation, metrics and resumable checkpoints.

One step: take the step's records (see :mod:`fedpriv.central.order`), pad them to the batch size
with masked rows (fixed shapes: one compilation), compute the gradient, apply the optax update.
The gradient function is pluggable: the default is the gradient of the mean per-example loss
(non-private SGD); DP-SGD passes its own clip-and-noise gradient.

Everything a step depends on is a function of (config, seed, step): the records (batch schedule),
the random key (``fold_in(key(seed), step)``) and the state. So a run killed after a checkpoint
and resumed ends with exactly the same parameters and ``metrics.jsonl`` as an uninterrupted run.

Run directory: ``config.json`` (resolved config), ``metrics.jsonl`` (one JSON object per
evaluation: step, epoch, split, metrics), ``checkpoint.json`` + ``checkpoint-<step>.msgpack``,
and ``params.msgpack`` at the end.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import serialization

from fedpriv.central.checkpoint import load_checkpoint, save_checkpoint
from fedpriv.central.order import BatchSchedule
from fedpriv.config import TrainingConfig
from fedpriv.errors import FedprivError
from fedpriv.tasks.base import Batch, Params, Task, add_sums, pad_batch

GradFn = Callable[[Params, Mapping[str, jax.Array], jax.Array], tuple[jax.Array, Params]]
"""(params, batch, rng) -> (loss, gradient pytree)."""

METRICS_FILE = "metrics.jsonl"


def make_optimizer(cfg: TrainingConfig, total_steps: int) -> optax.GradientTransformation:
    """optax SGD / momentum / Adam with a constant, cosine or warmup+cosine learning rate."""
    lr: Any = cfg.learning_rate
    if cfg.schedule == "cosine":
        lr = optax.cosine_decay_schedule(cfg.learning_rate, max(total_steps, 1))
    elif cfg.schedule == "warmup_cosine":
        lr = optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, cfg.warmup_steps, max(total_steps, cfg.warmup_steps + 1))
    if cfg.optimizer == "sgd":
        return optax.sgd(lr)
    if cfg.optimizer == "momentum":
        return optax.sgd(lr, momentum=cfg.momentum)
    return optax.adam(lr)


def total_steps(cfg: TrainingConfig, num_records: int) -> int:
    if (cfg.steps is None) == (cfg.epochs is None):
        raise FedprivError("training: give exactly one of steps or epochs")
    if cfg.steps is not None:
        return cfg.steps
    return max(1, math.ceil(cfg.epochs * math.ceil(num_records / cfg.batch_size)))


def gather(arrays: Batch, idx: np.ndarray, size: int) -> Batch:
    """Rows ``idx`` of pre-encoded arrays, padded with masked rows to ``size``."""
    return pad_batch({k: v[idx] for k, v in arrays.items()}, size)


def evaluate(task: Task, params: Params, arrays: Batch, batch_size: int, sums_fn: Callable | None = None) -> dict[str, float]:
    """Summarized metrics of ``task`` over all rows of ``arrays`` (batched, padded, masked)."""
    fn = sums_fn or jax.jit(task.metric_sums)
    n = len(arrays["mask"])
    total: dict[str, float] = {}
    for start in range(0, n, batch_size):
        idx = np.arange(start, min(start + batch_size, n))
        add_sums(total, fn(params, gather(arrays, idx, batch_size)))
    return task.summarize(total)


def sgd_gradient(task: Task) -> GradFn:
    """The non-private gradient: of the mean per-example loss over the batch's real rows."""

    def grad_fn(params, batch, rng):
        return jax.value_and_grad(task.mean_loss)(params, batch, rng, True)

    return grad_fn


@dataclass
class TrainResult:
    params: Params
    steps: int
    final_eval: dict[str, float]
    history: list[dict] = field(default_factory=list)
    stopped: str | None = None


class Progress:
    """A progress line on a terminal (rich), or a plain line per evaluation otherwise."""

    def __init__(self, total: int, start: int, log: Callable[[str], None] | None, title: str):
        self.log = log
        self.total = total
        self.bar = None
        if log is not None and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn

            self.bar = RichProgress(TextColumn(title), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"), transient=True)
            self.bar.start()
            self.task_id = self.bar.add_task(title, total=total, completed=start, info="")

    def advance(self, step: int, info: str = "") -> None:
        if self.bar is not None:
            self.bar.update(self.task_id, completed=step, info=info)

    def note(self, message: str) -> None:
        if self.log is None:
            return
        if self.bar is not None:
            self.bar.console.print(message, markup=False)
        else:
            self.log(message)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


class Stepper:
    """Runs one training step. The trainer owns the loop, evaluation, metrics and checkpoints;
    a stepper owns how a step's records are chosen and turned into an update."""

    #: steps in one pass over the records (for the ``epoch`` column of the metrics)
    steps_per_epoch: int = 1

    def init_state(self, params: Params) -> dict:
        raise NotImplementedError

    def step(self, state: dict, step: int) -> tuple[dict, jax.Array]:
        """The state after step ``step`` (0-based) and that step's mean training loss."""
        raise NotImplementedError

    def after_step(self, done: int) -> str | None:
        """Called after ``done`` steps (also at the start, with the steps already done); returns a
        reason to stop before the next step (e.g. it would exceed the privacy budget), or None."""
        return None

    def report(self, done: int) -> dict:
        """Extra columns for the train row of ``metrics.jsonl`` (e.g. epsilon)."""
        return {}

    def save(self, run_dir: Path, done: int) -> None:
        """Persist what the stepper keeps outside the state (e.g. the privacy ledger)."""

    def resume(self, run_dir: Path, done: int) -> None:
        """Restore it when the run resumes at step ``done``."""


class SGDStepper(Stepper):
    """Non-private minibatch training: the schedule's records, padded; one jitted update per step."""

    def __init__(self, task: Task, train: Batch, user_counts: np.ndarray, cfg: TrainingConfig, seed: int, tx: optax.GradientTransformation, grad_fn: GradFn | None = None):
        self.task, self.train, self.cfg, self.tx = task, train, cfg, tx
        self.schedule = BatchSchedule(user_counts, cfg.order, seed, cfg.batch_size)
        self.steps_per_epoch = self.schedule.steps_per_epoch
        self.base_key = step_key_base(seed)
        grad_fn = grad_fn or sgd_gradient(task)

        @jax.jit
        def step_fn(state, batch, step):
            loss, grads = grad_fn(state["params"], batch, jax.random.fold_in(self.base_key, step))
            updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
            return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, loss

        self._step_fn = step_fn

    def init_state(self, params: Params) -> dict:
        return {"params": params, "opt_state": self.tx.init(params)}

    def step(self, state: dict, step: int) -> tuple[dict, jax.Array]:
        return self._step_fn(state, gather(self.train, self.schedule.indices(step), self.cfg.batch_size), step)


def step_key_base(seed: int) -> jax.Array:
    """The key every step's randomness is folded from (the init key is the other half)."""
    return jax.random.split(jax.random.key(seed))[1]


def init_key(seed: int) -> jax.Array:
    return jax.random.split(jax.random.key(seed))[0]


def train_central(
    task: Task,
    train: Batch,
    user_counts: np.ndarray,
    cfg: TrainingConfig,
    seed: int,
    run_dir: str | os.PathLike[str],
    eval_sets: Mapping[str, Batch] | None = None,
    grad_fn: GradFn | None = None,
    stepper: Stepper | None = None,
    stop_after: int | None = None,
    log: Callable[[str], None] | None = None,
    extra_meta: dict | None = None,
) -> TrainResult:
    """Train ``task`` on pre-encoded ``train`` rows (users in corpus order, ``user_counts`` rows each).

    ``eval_sets``: name -> encoded rows, evaluated every ``cfg.eval_every`` steps and at the end.
    ``stepper``: how a step is made (default :class:`SGDStepper`, with ``grad_fn`` if given).
    ``stop_after``: stop (with a checkpoint) once this many steps are done in total — what a
    killed run looks like, for tests. Resumes from ``run_dir``'s checkpoint when there is one.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    num = len(train["mask"])
    if num == 0:
        raise FedprivError("no training records")
    if int(np.sum(user_counts)) != num:
        raise FedprivError(f"user_counts sum to {int(np.sum(user_counts))} but there are {num} records")
    steps = total_steps(cfg, num)
    if stepper is None:
        stepper = SGDStepper(task, train, user_counts, cfg, seed, make_optimizer(cfg, steps), grad_fn)
    state = stepper.init_state(task.init_params(init_key(seed)))
    eval_sets = dict(eval_sets or {})
    sums_fn = jax.jit(task.metric_sums)
    start, loss_acc = 0, [0.0, 0]
    metrics_path = run_dir / METRICS_FILE
    resumed = load_checkpoint(run_dir, state)
    if resumed is not None:
        state, meta = resumed
        start = int(meta["step"])
        loss_acc = list(meta["loss_acc"])
        stepper.resume(run_dir, start)
        _truncate_metrics(metrics_path, start)
    elif metrics_path.exists():
        metrics_path.unlink()
    (run_dir / "config.json").write_text(json.dumps({"training": cfg.model_dump(), "seed": seed, "task": task.name, **(extra_meta or {})}, indent=1))

    history: list[dict] = []
    progress = Progress(steps, start, log, f"training {task.name}")
    if start:
        progress.note(f"resumed from the checkpoint at step {start} of {steps}")
    last_eval: dict[str, float] = {}
    stopped: str | None = None
    t0 = time.perf_counter()
    done = start
    stopped = stepper.after_step(start) if start else None
    if stopped:
        progress.close()
        progress.note(stopped)
        return TrainResult(state["params"], start, {}, history, stopped)
    try:
        for step in range(start, steps):
            state, loss = stepper.step(state, step)
            loss_acc[0] += float(loss)
            loss_acc[1] += 1
            done = step + 1
            stopped = stepper.after_step(done)
            # stop_after imitates a kill: a checkpoint and nothing else, so the resumed run's
            # metrics are those of an uninterrupted run.
            halt = stop_after is not None and done >= stop_after and done < steps
            if done % cfg.eval_every == 0 or done == steps or stopped:
                epoch = done / stepper.steps_per_epoch
                row = {"step": done, "epoch": epoch, "split": "train", "loss": loss_acc[0] / max(loss_acc[1], 1), **stepper.report(done)}
                _append(metrics_path, row)
                history.append(row)
                loss_acc = [0.0, 0]
                for name, arrays in eval_sets.items():
                    last_eval = {"step": done, "epoch": epoch, "split": name, **evaluate(task, state["params"], arrays, cfg.eval_batch_size, sums_fn)}
                    _append(metrics_path, last_eval)
                    history.append(last_eval)
                rate = (done - start) * cfg.batch_size / max(time.perf_counter() - t0, 1e-9)
                progress.note(_describe(done, steps, row, last_eval, rate))
            if done % cfg.checkpoint_every == 0 or done == steps or stopped or halt:
                save_checkpoint(run_dir, state, {"step": done, "loss_acc": loss_acc})
                stepper.save(run_dir, done)
            progress.advance(done, f"loss {float(loss):.3f}")
            if stopped or halt:
                progress.note(stopped or f"stopped after step {done} as asked; run the same command again to resume")
                break
    finally:
        progress.close()
    if done == steps or stopped:
        (run_dir / "params.msgpack").write_bytes(serialization.to_bytes(state["params"]))
    return TrainResult(state["params"], done, last_eval, history, stopped)


def _describe(done: int, steps: int, train_row: dict, eval_row: dict, rate: float) -> str:
    parts = [f"step {done}/{steps}", f"train loss {train_row['loss']:.4f}"]
    if train_row.get("epsilon") is not None:
        parts.append(f"epsilon {train_row['epsilon']:.3g} (delta {train_row['delta']:g}; {train_row.get('basis', '')})")
    for k in ("perplexity", "accuracy", "f1", "loss"):
        if k in eval_row:
            parts.append(f"{eval_row['split']} {k} {eval_row[k]:.4g}")
    parts.append(f"{rate:.0f} examples/s")
    return ", ".join(parts)


def _append(path: Path, row: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def _truncate_metrics(path: Path, step: int) -> None:
    """Keep the metric lines up to the checkpoint's step (a resumed run rewrites the rest)."""
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text("".join(line + "\n" for line in keep))
    os.replace(tmp, path)
