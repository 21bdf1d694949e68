"""The one training loop, with a stepper whose arithmetic is known: row and evaluation cadence,
exact resume (metrics and parameters), the budget stop, refusing another kind's checkpoint or a
changed config, and failing a run whose loss or parameters become non-finite."""

from __future__ import annotations

import json
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

from fedpriv.errors import ConfigChanged, DataFormatError, FedprivError, TrainingDiverged
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
    assert RunDir(tmp_path).has_params() and json.loads((tmp_path / "config.json").read_text()) == {"experiment": {}, "assets": {}}


def test_a_stopped_and_resumed_run_equals_an_uninterrupted_one(tmp_path):
    full = run_loop(AddStepper(10, 3, 3, 4), CountTask(), RunDir(tmp_path / "full"), 0, {}, EVAL, 8)
    part = run_loop(AddStepper(10, 3, 3, 4), CountTask(), RunDir(tmp_path / "cut"), 0, {}, EVAL, 8, stop_after=5)
    assert part.done == 5 and not RunDir(tmp_path / "cut").has_params()
    meta = RunDir(tmp_path / "cut").checkpoint_meta()
    assert meta["step"] == 5 and meta["pending"] == [{"loss": 3.5}, {"loss": 4.5}]  # steps 4 and 5: not yet in a row
    assert part.unlogged == {"loss": 4.0, "n": 2}  # the row steps 4 and 5 would make (its epsilon: that of every step done)
    assert full.unlogged == {}
    rest = run_loop(AddStepper(10, 3, 3, 4), CountTask(), RunDir(tmp_path / "cut"), 0, {}, EVAL, 8)
    assert rest.done == 10 and float(rest.params["w"]) == float(full.params["w"]) == 55.0
    assert (tmp_path / "cut" / "metrics.jsonl").read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()
    # The result of a resumed run, and of a finished run run again, is the whole run's.
    again = run_loop(AddStepper(10, 3, 3, 4), CountTask(), RunDir(tmp_path / "full"), 0, {}, EVAL, 8)
    for result in (rest, again):
        assert result.history == full.history and result.final_eval == full.final_eval == {"step": 10, "split": "heldout", "w": 55.0}


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


class BlowUpStepper(AddStepper):
    """AddStepper whose step ``at`` (1-based) makes w infinite; ``loss_too``: and reports loss NaN."""

    def __init__(self, total: int, checkpoint_every: int, at: int, loss_too: bool):
        super().__init__(total, 1, 100, checkpoint_every)
        self.at, self.loss_too = at, loss_too

    def step(self, state, index):
        state, info = super().step(state, index)
        if index + 1 >= self.at:
            state = {"params": {"w": state["params"]["w"] * jnp.inf}}
            if self.loss_too and index + 1 > self.at:
                info = {"loss": float("nan")}
        return state, info


@pytest.mark.parametrize("loss_too", [True, False], ids=["loss", "params"])
def test_a_diverged_run_fails_keeps_its_last_checkpoint_and_writes_no_parameters(tmp_path, loss_too):
    run = RunDir(tmp_path)
    with pytest.raises(TrainingDiverged, match="training diverged at step") as e:
        run_loop(BlowUpStepper(10, 3, at=5, loss_too=loss_too), CountTask(), run, 0, {}, EVAL, 8)
    # the loss is checked every step (NaN at step 6); the parameters where they would be kept (step 6)
    assert "step 6 of 10" in str(e.value) and "the checkpoint at step 3 is kept" in str(e.value)
    assert run.checkpoint_meta()["step"] == 3 and not run.has_params()
    state, _ = run.load_checkpoint({"params": {"w": jnp.zeros(())}})
    assert float(state["params"]["w"]) == 6.0  # 1 + 2 + 3: finite
    assert run.failure()["step"] == 6 and "diverged" in run.failure()["reason"]
    assert all(r["step"] <= 6 and np.isfinite(r["loss"]) for r in run.metrics() if r["split"] == "train")
    with pytest.raises(FedprivError, match="this run failed .*pass --restart"):
        run_loop(AddStepper(10, 1, 100, 3), CountTask(), run, 0, {}, EVAL, 8)
    run.reset()  # what --restart does
    assert run_loop(AddStepper(10, 1, 100, 3), CountTask(), run, 0, {}, EVAL, 8).done == 10


def test_resuming_with_another_config_is_refused_naming_the_keys(tmp_path):
    run = RunDir(tmp_path)
    meta = {"experiment": {"seed": 0, "training": {"learning_rate": 0.1, "steps": 10}, "federated": None, "audit": {"rs_candidates": 5}}}
    run_loop(AddStepper(10, 3, 3, 4), CountTask(), run, 0, meta, EVAL, 8, stop_after=4)
    changed = {"experiment": {**meta["experiment"], "seed": 1, "training": {"learning_rate": 0.2, "steps": 10}}}
    with pytest.raises(ConfigChanged, match=r"the config changed since this run started \(seed, training.learning_rate\); pass --restart"):
        run_loop(AddStepper(10, 3, 3, 4), CountTask(), run, 0, changed, EVAL, 8)
    audit_only = {"experiment": {**meta["experiment"], "audit": {"rs_candidates": 50}}, "engine": "flower"}
    assert run_loop(AddStepper(10, 3, 3, 4), CountTask(), run, 0, audit_only, EVAL, 8).done == 10  # nothing trained differs


def test_a_checkpoint_without_its_config_is_not_resumed(tmp_path):
    """With config.json gone, any config would have resumed the checkpoint (steps 1-4 at one learning
    rate, the rest at another, config.json recording only the second)."""
    run = RunDir(tmp_path)
    meta = {"experiment": {"seed": 0, "training": {"learning_rate": 0.1, "steps": 10}}}
    run_loop(AddStepper(10, 3, 3, 4), CountTask(), run, 0, meta, EVAL, 8, stop_after=4)
    (tmp_path / "config.json").unlink()
    with pytest.raises(DataFormatError, match=r"config.json: is missing, but .* holds a checkpoint: the config the run was trained with cannot be checked"):
        run_loop(AddStepper(10, 3, 3, 4), CountTask(), run, 0, meta, EVAL, 8)
    assert run.checkpoint_meta()["step"] == 4 and not run.has_params()


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


class NoisedStepper(AddStepper):
    """A DP-like stepper: each step reports its noised update's norm; step ``at`` (1-based) makes
    it ``bad_norm``, and every step reports an unnoised loss ``loss``."""

    def __init__(self, at: int, bad_norm: float, loss: float):
        super().__init__(6, 1, 100, 2)
        self.at, self.bad_norm, self.loss = at, bad_norm, loss

    def step(self, state, index):
        state, _ = super().step(state, index)
        return state, {"noised_update_norm": self.bad_norm if index + 1 == self.at else 1.0, "loss": self.loss}

    def train_row(self, done: int, infos: list[dict[str, Any]]) -> dict[str, Any]:
        return {"noised_update_norm": infos[-1]["noised_update_norm"]}


def test_a_dp_step_diverges_on_its_noised_update_never_on_its_unnoised_loss(tmp_path):
    with pytest.raises(TrainingDiverged, match="training diverged at step 4 of 6: the noised update's norm is nan"):
        run_loop(NoisedStepper(4, float("nan"), 0.5), CountTask(), RunDir(tmp_path / "a"), 0, {}, None, 8)
    # an unnoised loss (logged with --log-private-stats) that is not finite does not decide the stop
    res = run_loop(NoisedStepper(4, 1.0, float("nan")), CountTask(), RunDir(tmp_path / "b"), 0, {}, None, 8)
    assert [r["step"] for r in res.history if r["split"] == "train"][-1] == 6
