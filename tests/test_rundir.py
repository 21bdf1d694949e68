"""The run directory's files: written safely, read back, damaged files named."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flax import serialization

from fedpriv.errors import DataFormatError, FedprivError
from fedpriv.rundir import CHECKPOINT, METRICS, PARAMS, RunDir


def test_checkpoints_replace_each_other_whole_and_damage_is_named(tmp_path):
    run = RunDir(tmp_path)
    state = {"w": np.arange(6.0).reshape(2, 3), "n": {"b": np.ones(2)}}
    run.save_checkpoint(state, {"step": 3})
    run.save_checkpoint(state, {"step": 4, "kind": "federated"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4.msgpack", CHECKPOINT]
    loaded, meta = run.load_checkpoint(state)
    assert meta["step"] == 4 and meta["kind"] == "federated" and np.array_equal(loaded["w"], state["w"])
    # msgpack, not pickle: the bytes are plain serialized arrays
    assert serialization.msgpack_restore((tmp_path / "checkpoint-4.msgpack").read_bytes())["n"]["b"].tolist() == [1.0, 1.0]
    (tmp_path / "checkpoint-4.msgpack").write_bytes(b"garbage")
    with pytest.raises(DataFormatError, match="unreadable checkpoint"):
        run.load_checkpoint(state)
    (tmp_path / CHECKPOINT).write_text("{")
    with pytest.raises(DataFormatError, match="unreadable checkpoint"):
        run.checkpoint_meta()
    assert RunDir(tmp_path / "nothing").load_checkpoint(state) is None


def test_metrics_are_appended_and_cut_back_to_a_step(tmp_path):
    run = RunDir(tmp_path)
    for step in (1, 2, 2, 3):
        run.append_metrics({"step": step, "split": "train"})
    run.truncate_metrics(2)
    assert [r["step"] for r in run.metrics()] == [1, 2, 2]
    assert (tmp_path / METRICS).read_text().count("\n") == 3
    run.clear_metrics()
    assert run.metrics() == []


def test_parameters_final_else_the_last_checkpoint(tmp_path):
    run = RunDir(tmp_path)
    template = {"w": np.zeros(2, np.float32)}
    with pytest.raises(FedprivError, match="no parameters"):
        run.load_params(template)
    run.save_checkpoint({"params": {"w": np.ones(2, np.float32)}, "opt": {}}, {"step": 7})
    params, where = run.load_params(template)
    assert params["w"].tolist() == [1.0, 1.0] and where == "checkpoint at step 7 (the run is unfinished)"
    run.write_params({"w": np.full(2, 2.0, np.float32)})
    params, where = run.load_params(template)
    assert params["w"].tolist() == [2.0, 2.0] and where == "final parameters"
    assert not (tmp_path / (PARAMS + ".partial")).exists()
    assert run.read_params_tree()["w"].tolist() == [2.0, 2.0]


def test_the_experiment_config_is_read_back_and_a_bad_one_named(tmp_path):
    run = RunDir(tmp_path)
    with pytest.raises(FedprivError, match="not a run directory"):
        run.experiment_config()
    run.write_config({"experiment": {"name": "x", "seed": 4}})
    assert run.experiment_config().seed == 4
    (tmp_path / "config.json").write_text(json.dumps({"training": {}}))
    with pytest.raises(FedprivError, match="no experiment config recorded"):
        run.experiment_config()
