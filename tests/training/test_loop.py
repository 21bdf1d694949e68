"""The one training loop, with a stepper whose arithmetic is known: row and evaluation cadence,
exact resume (metrics and parameters), the budget stop, and refusing another kind's checkpoint."""

from __future__ import annotations

import json
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

from fedpriv.errors import FedprivError
from fedpriv.rundir import RunDir
from fedpriv.tasks.base import Task
from fedpriv.training.loop import Stepper, run_loop


class CountTask(Task):
    """One parameter; its 'metric' is the parameter's value, so an evaluation row shows the state."""

    name = "count"

    def init_params(self, rng):
        return {"w": jnp.zeros(())}

    def encode(self, examples):
        raise NotImplementedError

    def losses(self, params, batch, rng, train):
        return jnp.zeros(len(batch["mask"]))

    def metric_sums(self, params, batch):
        return {"w": params["w"] * jnp.sum(batch["mask"]), "n": jnp.sum(batch["mask"])}

    def summarize(self, sums):
        return {"w": sums["w"] / sums["n"]}


class AddStepper(Stepper):
    """Step i adds i + 1 to w and reports loss i + 0.5; stops after ``stop_at`` steps if given."""

    kind = "central"

    def __init__(self, total: int, row_every: int, eval_every: int, checkpoint_every: int, stop_at: int | None = None):
        self.total, self.row_every, self.eval_every, self.checkpoint_every, self.stop_at = total, row_every, eval_every, checkpoint_every, stop_at
        self.saved: list[int] = []

    def init_state(self, params):
        return {"params": params}

    def step(self, state, index):
        return {"params": {"w": state["params"]["w"] + (index + 1)}}, {"loss": index + 0.5}

    def train_row(self, done: int, infos: list[dict[str, Any]]) -> dict[str, Any]:
        return {"loss": sum(i["loss"] for i in infos) / len(infos), "n": len(infos)}

    def stop_reason(self, done: int) -> str | None:
        return "budget" if self.stop_at is not None and done >= self.stop_at else None

    def save(self, run: RunDir, done: int) -> None:
        self.saved.append(done)


EVAL = {"heldout": {"mask": np.ones(3, np.float32)}}


def test_rows_evaluations_and_checkpoints_follow_their_cadence(tmp_path):
    s = AddStepper(total=7, row_every=3, eval_every=6, checkpoint_every=4)
    res = run_loop(s, CountTask(), RunDir(tmp_path), 0, {"experiment": {}}, EVAL, 8)
    rows = RunDir(tmp_path).metrics()
    assert [(r["step"], r["split"]) for r in rows] == [(3, "train"), (6, "train"), (6, "heldout"), (7, "train"), (7, "heldout")]
    assert rows[0]["loss"] == pytest.approx((0.5 + 1.5 + 2.5) / 3) and rows[0]["n"] == 3
    assert rows[3]["n"] == 1  # the last row holds only step 7
    assert rows[2]["w"] == pytest.approx(21.0) and rows[4]["w"] == pytest.approx(28.0)  # 1+..+6, 1+..+7
    assert s.saved == [4, 7] and res.done == 7 and float(res.params["w"]) == 28.0
    assert RunDir(tmp_path).has_params() and json.loads((tmp_path / "config.json").read_text()) == {"experiment": {}}


def test_a_stopped_and_resumed_run_equals_an_uninterrupted_one(tmp_path):
    full = run_loop(AddStepper(10, 3, 3, 4), CountTask(), RunDir(tmp_path / "full"), 0, {}, EVAL, 8)
    part = run_loop(AddStepper(10, 3, 3, 4), CountTask(), RunDir(tmp_path / "cut"), 0, {}, EVAL, 8, stop_after=5)
    assert part.done == 5 and not RunDir(tmp_path / "cut").has_params()
    meta = RunDir(tmp_path / "cut").checkpoint_meta()
    assert meta["step"] == 5 and meta["pending"] == [{"loss": 3.5}, {"loss": 4.5}]  # steps 4 and 5: not yet in a row
    rest = run_loop(AddStepper(10, 3, 3, 4), CountTask(), RunDir(tmp_path / "cut"), 0, {}, EVAL, 8)
    assert rest.done == 10 and float(rest.params["w"]) == float(full.params["w"]) == 55.0
    assert (tmp_path / "cut" / "metrics.jsonl").read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()


def test_a_stop_writes_the_parameters_and_a_resume_stays_stopped(tmp_path):
    res = run_loop(AddStepper(10, 5, 5, 5, stop_at=4), CountTask(), RunDir(tmp_path), 0, {}, EVAL, 8)
    assert res.done == 4 and res.stopped == "budget" and RunDir(tmp_path).has_params()
    assert [r["step"] for r in RunDir(tmp_path).metrics()] == [4, 4]  # the stop gets a row and an evaluation
    again = run_loop(AddStepper(10, 5, 5, 5, stop_at=4), CountTask(), RunDir(tmp_path), 0, {}, EVAL, 8)
    assert again.done == 4 and again.stopped == "budget" and float(again.params["w"]) == 10.0


def test_a_checkpoint_of_another_kind_is_refused(tmp_path):
    RunDir(tmp_path).save_checkpoint({"params": {"w": np.zeros(())}}, {"step": 1, "kind": "federated"})
    with pytest.raises(FedprivError, match="checkpoint of a federated run"):
        run_loop(AddStepper(3, 1, 1, 1), CountTask(), RunDir(tmp_path), 0, {}, None, 8)


def test_a_utility_target_stops_at_the_first_evaluation_that_reaches_it(tmp_path):
    from fedpriv.training.loop import Target

    target = Target("heldout", "w", 10.0)  # w after k steps is k(k+1)/2: 3 after 2, 10 after 4
    res = run_loop(AddStepper(12, 5, 2, 5), CountTask(), RunDir(tmp_path), 0, {}, EVAL, 8, target=target, snapshots=True)
    assert res.done == 4 and "reached the utility target w >= 10 on the heldout users at step 4" in res.stopped
    assert RunDir(tmp_path).snapshot_steps() == [2, 4] and float(res.params["w"]) == 10.0
    rows = RunDir(tmp_path).metrics()
    assert [(r["step"], r["split"]) for r in rows] == [(2, "train"), (2, "heldout"), (4, "train"), (4, "heldout")]
    assert RunDir(tmp_path).checkpoint_meta()["stopped"] == res.stopped
    again = run_loop(AddStepper(12, 5, 2, 5), CountTask(), RunDir(tmp_path), 0, {}, EVAL, 8, target=target)
    assert again.done == 4 and again.stopped == res.stopped  # a resumed run stays stopped at the target


def test_a_killed_run_resumes_to_the_same_target_stop(tmp_path):
    from fedpriv.training.loop import Target

    target = Target("heldout", "w", 20.0)  # reached after 6 steps (21)
    full = run_loop(AddStepper(12, 5, 2, 5), CountTask(), RunDir(tmp_path / "a"), 0, {}, EVAL, 8, target=target)
    run_loop(AddStepper(12, 5, 2, 5), CountTask(), RunDir(tmp_path / "b"), 0, {}, EVAL, 8, target=target, stop_after=3)
    rest = run_loop(AddStepper(12, 5, 2, 5), CountTask(), RunDir(tmp_path / "b"), 0, {}, EVAL, 8, target=target)
    assert full.done == rest.done == 6 and full.stopped == rest.stopped
    assert (tmp_path / "a" / "metrics.jsonl").read_text() == (tmp_path / "b" / "metrics.jsonl").read_text()


def test_a_target_on_a_split_the_run_does_not_evaluate_is_refused(tmp_path):
    from fedpriv.training.loop import Target

    with pytest.raises(FedprivError, match="utility target on 'validation'"):
        run_loop(AddStepper(3, 1, 1, 1), CountTask(), RunDir(tmp_path), 0, {}, EVAL, 8, target=Target("validation", "w", 1.0))
