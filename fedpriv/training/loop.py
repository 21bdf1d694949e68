"""The one resumable training loop: central steps and federated rounds are both steppers under it.

A :class:`Stepper` makes one step (a DP-SGD logical batch, a federated round) from a state and a
0-based index; the loop owns everything else, so the central trainer and the federated engines
cannot drift apart:

* the initial parameters come from ``task.init_params(init_key(seed))`` (the same for central and
  federated runs of one seed);
* resume: the last checkpoint of the run directory is loaded (its kind must be the stepper's), the
  stepper restores what it keeps outside the state (the privacy ledger, checked against the
  checkpoint) and what it keeps out of checkpoints (:meth:`Stepper.checkpoint_state`: a
  ``--secure-noise`` correlated-noise run's noise state, rebuilt by :meth:`Stepper.restore_state`),
  and ``metrics.jsonl`` is cut back to the checkpoint's step;
* a train row every ``row_every`` steps (central: the loss averaged over the steps since the last
  row; federated: every round), an evaluation on every evaluation set every ``eval_every`` steps,
  and both at the end and when the stepper stops (e.g. one more step would exceed the epsilon
  budget);
* a checkpoint (state, the rows' pending infos, the stepper's extras) every ``checkpoint_every``
  steps, at the end and on a stop; ``params.msgpack`` when the run ends or stops;
* a utility target (:class:`Target`): the run stops at the first evaluation whose metric on the
  target's split is at or past the value (the stop is kept in the checkpoint, so a resumed run
  stays stopped); such a stop depends on the data, so a DP run's epsilon is then that of every
  step it may take (:meth:`Stepper.stops_on_data`), and the steps taken give ``epsilon_spent``; with ``snapshots``, the parameters of every evaluation are kept too
  (``params-<step>.msgpack``), for audits along training.

Everything a step depends on is a function of (config, seed, step index), so a run killed after a
checkpoint and resumed ends with exactly the parameters and ``metrics.jsonl`` of an uninterrupted
run. ``stop_after`` imitates such a kill (a checkpoint and nothing else), for tests and for
``--stop-after``.

What the loop refuses: resuming with another config than ``config.json`` records (naming the
changed keys; :data:`RESUMABLE_CHANGES` may change), and a run marked failed. A step whose train
loss (a DP step: its noised update's norm, never its unnoised loss) is not finite, or parameters
that are not finite when they would be checkpointed, evaluated or written, stop the run with :class:`~fedpriv.errors.TrainingDiverged`: ``failed.json`` records
why, the last checkpoint (all finite) stays, and no final parameters are written.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.config import TRAINING_AUDIT_KEYS, AuditConfig, changed_keys, normalized_config
from fedpriv.errors import ConfigChanged, DataFormatError, FedprivError, TrainingDiverged
from fedpriv.privacy.streams import INIT, STEP, stream_key
from fedpriv.rundir import CONFIG, RunDir, ledger_record
from fedpriv.tasks.base import Batch, Params, Task, add_sums, degenerate, pad_batch


#: ``config.json`` keys a resumed run may change: they do not change what is trained (the engines
#: train the same rounds; the audit runs after training, except the empirical audit's planted canaries).
RESUMABLE_CHANGES = ("engine", "experiment.federated.engine", "experiment.federated.flower",
                     *(f"experiment.audit.{k}" for k in AuditConfig.model_fields if k not in TRAINING_AUDIT_KEYS))
RESTART_HINT = "pass --restart to start afresh (or use another --out)"


@jax.jit
def all_finite(tree: Any) -> jax.Array:
    """True when every floating-point leaf of ``tree`` is finite."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def check_resumable(run: RunDir, config_meta: Mapping[str, Any]) -> None:
    """Refuse to resume ``run`` with a config other than the one its ``config.json`` records."""
    old = run.config_meta()
    if old is None:  # a checkpoint without the config it was trained with: nothing to check the new one against
        raise DataFormatError(run.path / CONFIG, None, f"is missing, but {run.path} holds a checkpoint: the config the run was trained "
                                                       f"with cannot be checked against this one; {RESTART_HINT}")
    new = json.loads(json.dumps(dict(config_meta)))
    if "experiment" in old and "experiment" in new:
        old = {**old, "experiment": normalized_config(old["experiment"])}
        new = {**new, "experiment": normalized_config(new["experiment"])}
    changed = list(dict.fromkeys(k.removeprefix("experiment.") for k in changed_keys(old, new, RESUMABLE_CHANGES)))
    if changed:
        keys = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
        raise ConfigChanged(f"{run.path}: the config changed since this run started ({keys}); {RESTART_HINT}")


def init_key(seed: int) -> jax.Array:
    """The key of the initial parameters: stream ``init`` (``split(key(seed))[0]``, the same key)."""
    return stream_key(seed, INIT)


def step_key_base(seed: int) -> jax.Array:
    """The key every step's randomness is folded from: stream ``step`` (``split(key(seed))[1]``)."""
    return stream_key(seed, STEP)


def gather(arrays: Batch, idx: np.ndarray, size: int) -> Batch:
    """Rows ``idx`` of pre-encoded arrays, padded with masked rows to ``size``."""
    return pad_batch({k: v[idx] for k, v in arrays.items()}, size)


def evaluate(task: Task, params: Params, arrays: Batch, batch_size: int, sums_fn: Callable | None = None) -> dict[str, float]:
    """Summarized metrics of ``task`` over all rows of ``arrays`` (batched, padded, masked; a batch
    is never padded beyond the rows there are)."""
    fn = sums_fn or jax.jit(task.metric_sums)
    n = len(arrays["mask"])
    batch_size = max(1, min(batch_size, n))
    total: dict[str, float] = {}
    for start in range(0, n, batch_size):
        idx = np.arange(start, min(start + batch_size, n))
        add_sums(total, fn(params, gather(arrays, idx, batch_size)))
    return task.summarize(total)


#: The step statistic a divergence check reads: a DP step's noised update norm (public) when it
#: reports one, else the train loss (non-private runs).
DIVERGENCE_KEYS = {"loss": "train loss", "noised_update_norm": "noised update's norm"}


class Stepper:
    """One step of training; the loop (:func:`run_loop`) owns everything else.

    Attributes a stepper sets: ``kind`` (checkpoint kind: "central" or "federated"), ``unit``
    ("step" or "round", for messages), ``total`` (steps in the run), ``row_every``,
    ``eval_every``, ``checkpoint_every``, ``title`` (the progress line)."""

    kind = "central"
    unit = "step"
    total = 1
    row_every = 1
    eval_every = 1
    checkpoint_every = 1
    title = "training"

    def init_state(self, params: Params) -> Any:
        raise NotImplementedError

    def step(self, state: Any, index: int) -> tuple[Any, dict[str, Any]]:
        """The state after step ``index`` (0-based) and that step's info (JSON-able, e.g. its loss)."""
        raise NotImplementedError

    def position(self, done: int) -> dict[str, Any]:
        """Columns that place a row after ``done`` steps besides ``step`` (e.g. ``epoch``, ``round``)."""
        return {}

    def train_row(self, done: int, infos: list[dict[str, Any]]) -> dict[str, Any]:
        """The train row's columns from the infos of the steps since the last row."""
        return dict(infos[-1]) if infos else {}

    def stop_reason(self, done: int) -> str | None:
        """A reason to stop before the next step (e.g. it would exceed the epsilon budget), or None."""
        return None

    def stops_on_data(self, why: str) -> None:
        """The run may stop before ``total`` for ``why``, a test of its own parameters (a utility
        target): a DP stepper's guarantee is then that of every step it may take
        (:meth:`fedpriv.privacy.budget.DPBudget.stops_on_data`); nothing to do without DP."""

    def describe(self, done: int, row: dict[str, Any], eval_rows: list[dict[str, Any]], seconds: float, since: int) -> str:
        """The progress line after a train row (``since``: steps done in this call)."""
        return f"{self.unit} {done}/{self.total}"

    def checkpoint_state(self, state: Any) -> Any:
        """What a checkpoint holds of ``state`` (default: all of it; a secure correlated-noise run
        leaves its noise state out)."""
        return state

    def restore_state(self, stored: Any, done: int, log: Callable[[str], None]) -> Any:
        """The state after ``done`` steps from what :meth:`checkpoint_state` kept of it (default:
        that, unchanged; a secure correlated-noise run rebuilds its noise state)."""
        return stored

    def save(self, run: RunDir, done: int) -> None:
        """Persist what the stepper keeps outside the state (e.g. the privacy ledger)."""

    def resume(self, run: RunDir, done: int) -> None:
        """Restore it when the run resumes after ``done`` steps."""

    def ledger(self) -> Any:
        """The privacy ledger :meth:`save` writes (a :class:`~fedpriv.privacy.ledger.PrivacyLedger`),
        or None for a run without DP noise; each checkpoint records its step count and digest."""
        return None


@dataclass(frozen=True)
class Target:
    """Stop at the first evaluation where ``metric`` on ``split`` is >= ``value``."""

    split: str
    metric: str
    value: float

    def reached(self, evals: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The evaluation row that reaches the target, or None."""
        for row in evals:
            if row["split"] == self.split:
                if self.metric not in row:
                    raise FedprivError(f"utility target: the {self.split} evaluation has no metric {self.metric!r} (it has {', '.join(sorted(row))})")
                if row[self.metric] >= self.value:
                    return row
        return None


@dataclass
class LoopResult:
    """What a run (or its resume) ended with: its parameters, the steps or rounds ``done``, the
    last evaluation row, every metrics row of the run (a resumed run's earlier rows included, so
    that running a finished run again gives the same result) and why it stopped early, if it did.
    ``unlogged``: the train row of the steps since the last one logged, not written (a run halted
    by ``stop_after`` between rows: its epsilon covers those steps too); empty otherwise."""

    params: Params
    done: int
    final_eval: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    stopped: str | None = None
    unlogged: dict[str, Any] = field(default_factory=dict)


class Progress:
    """A progress line on a terminal (rich), or a plain line per train row otherwise."""

    def __init__(self, total: int, start: int, log: Callable[[str], None] | None, title: str):
        self.log = log
        self.bar = None
        if log is not None and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self.bar = RichProgress(TextColumn(title), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"), transient=True)
            self.bar.start()
            self.task_id = self.bar.add_task(title, total=total, completed=start, info="")

    def advance(self, done: int, info: str = "") -> None:
        if self.bar is not None:
            self.bar.update(self.task_id, completed=done, info=info)

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


def run_loop(
    stepper: Stepper,
    task: Task,
    run: RunDir,
    seed: int,
    config_meta: Mapping[str, Any],
    eval_sets: Mapping[str, Batch] | None = None,
    eval_batch_size: int = 256,
    stop_after: int | None = None,
    log: Callable[[str], None] | None = None,
    target: Target | None = None,
    snapshots: bool = False,
    initial: Params | None = None,
) -> LoopResult:
    """Run (or resume) ``stepper`` to its ``total`` in ``run`` (see the module docstring).
    ``config_meta`` goes to ``config.json``; ``eval_sets``: name -> encoded rows; ``initial``:
    the starting parameters (a warm start) instead of ``task.init_params(init_key(seed))``."""
    if target is not None and target.split not in (eval_sets or {}):
        raise FedprivError(f"utility target on {target.split!r}, but the run evaluates only on {', '.join(eval_sets or {}) or 'nothing'}")
    run.create()
    failed = run.failure()
    if failed is not None:
        raise FedprivError(f"{run.path}: this run failed ({failed['reason']}); {RESTART_HINT}")
    if target is not None:  # when the run stops depends on the data: its epsilon is that of every step it may take
        stepper.stops_on_data(f"its utility target ({target.metric} >= {target.value:g} on the {target.split} users)")
    state = stepper.init_state(initial if initial is not None else task.init_params(init_key(seed)))
    start, pending, kept_stop = 0, [], None
    resumed = run.load_checkpoint(stepper.checkpoint_state(state))
    if resumed is not None:
        stored, meta = resumed
        if meta.get("kind", "central") != stepper.kind:
            raise FedprivError(f"{run.path} holds a checkpoint of a {meta.get('kind', 'central')} run, not a {stepper.kind} one; {RESTART_HINT}")
        config_meta = {**config_meta, "assets": run.asset_digests()}
        check_resumable(run, config_meta)
        run.verify_ledger(meta, stepper.ledger() is not None)
        start = int(meta["step"])
        pending = list(meta.get("pending", []))
        kept_stop = meta.get("stopped")
        stepper.resume(run, start)
        state = stepper.restore_state(stored, start, log or (lambda _m: None))
        run.truncate_metrics(start, meta.get("metrics_sha256"))  # (None: a checkpoint from before the digest)
    else:
        run.clear_metrics()
        config_meta = {**config_meta, "assets": run.asset_digests()}
    run.write_config(dict(config_meta))

    eval_sets = dict(eval_sets or {})
    sums_fn = jax.jit(task.metric_sums)
    history: list[dict[str, Any]] = run.metrics() if start else []  # a resumed run's rows so far (what it ran before)
    last_eval: dict[str, Any] = {}
    latest: dict[str, dict[str, Any]] = {}  # split -> its last evaluation
    for row in history:
        if row.get("split") != "train":
            last_eval = latest[row["split"]] = row
    progress = Progress(stepper.total, start, log, stepper.title)
    if start:
        progress.note(f"resumed from the checkpoint at {stepper.unit} {start} of {stepper.total}")
    done = start
    stopped = kept_stop or (stepper.stop_reason(start) if start else None)
    t0 = time.perf_counter()

    def check_finite(what: str, value: Any = None) -> None:
        if what in DIVERGENCE_KEYS:
            if not isinstance(value, (float, np.floating)) or math.isfinite(value):
                return
            problem = f"the {DIVERGENCE_KEYS[what]} is {value}"
        elif bool(all_finite(state_params(state))):
            return
        else:
            problem = "the parameters hold non-finite values"
        meta = run.checkpoint_meta()
        kept = int(meta["step"]) if meta is not None else None
        reason = f"training diverged at {stepper.unit} {done} of {stepper.total}: {problem}"
        run.write_failure(reason, done, kept)
        where = f"the checkpoint at {stepper.unit} {kept} is kept" if kept else "no checkpoint was written before"
        raise TrainingDiverged(f"{run.path}: {reason}; the run is marked failed ({where}); lower the learning rate, then {RESTART_HINT}")

    try:
        for index in range(start, stepper.total):
            if stopped:
                break
            state, info = stepper.step(state, index)
            done = index + 1
            what = "noised_update_norm" if "noised_update_norm" in info else "loss"  # a DP step: never its unnoised loss
            check_finite(what, info.get(what))
            pending.append(info)
            stopped = stepper.stop_reason(done)
            halt = stop_after is not None and done >= stop_after and done < stepper.total
            end = done == stepper.total or stopped
            if done % stepper.row_every == 0 or end or (target is not None and done % stepper.eval_every == 0):
                place = {"step": done, **stepper.position(done)}
                row = {**place, "split": "train", **stepper.train_row(done, pending)}
                pending = []
                run.append_metrics(row)
                history.append(row)
                evals = []
                if done % stepper.eval_every == 0 or end:
                    if eval_sets:
                        check_finite("params")
                    for name, arrays in eval_sets.items():
                        last_eval = {**place, "split": name, **evaluate(task, state_params(state), arrays, eval_batch_size, sums_fn)}
                        run.append_metrics(last_eval)
                        history.append(last_eval)
                        evals.append(last_eval)
                        latest[name] = last_eval
                    if snapshots and evals:
                        run.write_snapshot(done, state_params(state))
                    hit = target.reached(evals) if target is not None else None
                    if hit is not None and not stopped:
                        stopped = f"reached the utility target {target.metric} >= {target.value:g} on the {target.split} users at {stepper.unit} {done} ({hit[target.metric]:.4g})"
                        end = True
                progress.note(stepper.describe(done, row, evals, time.perf_counter() - t0, done - start))
            if done % stepper.checkpoint_every == 0 or end or halt:
                check_finite("params")
                ledger = stepper.ledger()
                run.save_checkpoint(stepper.checkpoint_state(state), {"step": done, "kind": stepper.kind, "pending": pending, **({"stopped": stopped} if stopped else {}),
                                            **({"ledger": ledger_record(ledger)} if ledger is not None else {})})
                stepper.save(run, done)
            progress.advance(done, f"loss {info['loss']:.3f}" if isinstance(info.get("loss"), float) else "")
            if halt:
                progress.note(f"stopped after {stepper.unit} {done} as asked; run the same command again to resume")
                break
    finally:
        progress.close()
    if stopped:
        progress.note(stopped)
    for split, row in latest.items():
        why = degenerate(row)
        if why:
            progress.note(f"warning: the model {why} on the {split} users at {stepper.unit} {row['step']}: it did not learn, and its row is flagged in the report")
    if done == stepper.total or stopped:
        run.write_params(state_params(state))
    unlogged = stepper.train_row(done, pending) if pending else {}
    return LoopResult(state_params(state), done, last_eval, history, stopped, unlogged)


#: Metrics a progress line shows per evaluated split, when present, and their short names.
SHOWN_METRICS = {"perplexity": "perplexity", "accuracy_no_oov_no_eos": "acc w/o oov,eos", "f1": "F1"}


def eval_text(eval_rows: list[dict[str, Any]]) -> list[str]:
    """Short progress-line parts for a step's evaluations: each split's shown metrics."""
    parts = []
    for row in eval_rows:
        shown = [f"{short} {row[k]:.4g}" for k, short in SHOWN_METRICS.items() if k in row]
        if not shown and "accuracy" in row:
            shown = [f"accuracy {row['accuracy']:.4g}"]
        parts += [f"{row['split']} {s}" for s in shown]
    return parts


def state_params(state: Any) -> Params:
    """The model parameters of a stepper's state (a dict with ``params``)."""
    return state["params"]
