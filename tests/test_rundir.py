"""The run directory's files: written safely, read back, damaged files named."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from flax import serialization

from fedpriv.errors import DataFormatError, FedprivError
from fedpriv.rundir import CHECKPOINT, DATA, EMPIRICAL, MARKER, METRICS, PARAMS, RunDir, read_store_record


def test_checkpoints_replace_each_other_whole_and_damage_is_named(tmp_path):
    run = RunDir(tmp_path)
    state = {"w": np.arange(6.0).reshape(2, 3), "n": {"b": np.ones(2)}}
    run.save_checkpoint(state, {"step": 3})
    run.save_checkpoint(state, {"step": 4, "kind": "federated"})
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != MARKER) == ["checkpoint-4.msgpack", CHECKPOINT]
    loaded, meta = run.load_checkpoint(state)
    assert meta["step"] == 4 and meta["kind"] == "federated" and np.array_equal(loaded["w"], state["w"])
    # msgpack, not pickle: the bytes are plain serialized arrays
    assert serialization.msgpack_restore((tmp_path / "checkpoint-4.msgpack").read_bytes())["n"]["b"].tolist() == [1.0, 1.0]
    (tmp_path / "checkpoint-4.msgpack").write_bytes(b"garbage")
    with pytest.raises(DataFormatError, match="SHA-256 is not the one checkpoint.json records for step 4"):
        run.load_checkpoint(state)
    (tmp_path / CHECKPOINT).write_text("{")
    with pytest.raises(DataFormatError, match="unreadable checkpoint"):
        run.checkpoint_meta()
    assert RunDir(tmp_path / "nothing").load_checkpoint(state) is None


def test_metrics_are_appended_and_cut_back_to_a_step(tmp_path):
    run = RunDir(tmp_path)
    for step, split in ((1, "train"), (2, "train"), (2, "validation"), (3, "train")):
        run.append_metrics({"step": step, "split": split})
    run.truncate_metrics(2)
    assert [r["step"] for r in run.metrics()] == [1, 2, 2]
    assert (tmp_path / METRICS).read_text().count("\n") == 3
    run.clear_metrics()
    assert run.metrics() == []


def test_a_checkpoint_records_the_metrics_and_a_resume_refuses_rows_lost_or_edited(tmp_path):
    """A full disk (or a hand) that empties, cuts or edits metrics.jsonl before a resume: the resumed
    history would lack those rows (their epsilon and guarantee too), so the resume is refused, the file untouched."""
    run = RunDir(tmp_path).create()
    for step in (1, 2):
        run.append_metrics({"step": step, "split": "train", "epsilon": 0.1 * step})
    run.save_checkpoint({"w": np.zeros(2)}, {"step": 2})
    want = run.checkpoint_meta()["metrics_sha256"]
    assert want == run.metrics_sha256()
    run.append_metrics({"step": 3, "split": "train", "epsilon": 0.3})  # after the checkpoint: cut back on resume
    run.truncate_metrics(2, want)
    assert [r["step"] for r in run.metrics()] == [1, 2]
    whole = (tmp_path / METRICS).read_bytes()
    for damaged in (b"", whole.split(b"\n")[0] + b"\n", whole.replace(b"0.2", b"0.02")):  # emptied, cut at a line, edited
        (tmp_path / METRICS).write_bytes(damaged)
        with pytest.raises(DataFormatError, match="up to step 2 are not the ones the checkpoint of that step recorded"):
            run.truncate_metrics(2, want)
        assert (tmp_path / METRICS).read_bytes() == damaged
    (tmp_path / METRICS).unlink()
    with pytest.raises(DataFormatError, match="0 row"):
        run.truncate_metrics(2, want)


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


# ---- a run directory is data, not instructions --------------------------------------------------
def test_a_checkpoint_names_only_a_state_file_of_its_own_directory(tmp_path):
    run = RunDir(tmp_path / "run")
    state = {"w": np.ones(2, np.float32)}
    run.save_checkpoint(state, {"step": 2})
    outside = tmp_path / "secret.msgpack"
    outside.write_bytes(serialization.to_bytes(state))
    for bad in ["../secret.msgpack", str(outside), "checkpoint-2.msgpack/../../secret.msgpack", 7]:
        (run.path / CHECKPOINT).write_text(json.dumps({"step": 2, "state_file": bad}))
        with pytest.raises(DataFormatError, match="checkpoint.json"):
            run.load_checkpoint(state)
    for meta in ([1, 2], {"step": "2", "state_file": "checkpoint-2.msgpack"}, {"step": -1, "state_file": "checkpoint-2.msgpack"}, {"state_file": "checkpoint-2.msgpack"}):
        (run.path / CHECKPOINT).write_text(json.dumps(meta))
        with pytest.raises(DataFormatError, match="checkpoint"):
            run.checkpoint_meta()


def test_a_checkpoint_or_parameters_of_another_model_are_refused(tmp_path):
    run = RunDir(tmp_path)
    run.save_checkpoint({"params": {"w": np.ones((2, 3), np.float32)}}, {"step": 1})
    with pytest.raises(DataFormatError, match=r"array of shape \(2, 3\) at /params/w, where \(4, 3\) was expected"):
        run.load_checkpoint({"params": {"w": np.zeros((4, 3), np.float32)}})
    with pytest.raises(DataFormatError, match="other entries"):
        run.load_checkpoint({"params": {"v": np.zeros((2, 3), np.float32)}})
    run.write_params({"w": np.ones((2, 3), np.float32)})
    with pytest.raises(DataFormatError, match="parameters holds an array of shape"):
        run.load_params({"w": np.zeros(3, np.float32)})
    (tmp_path / PARAMS).write_bytes((tmp_path / PARAMS).read_bytes()[:10])  # truncated
    with pytest.raises(DataFormatError, match="unreadable parameters"):
        run.load_params({"w": np.zeros((2, 3), np.float32)})


def test_a_torn_last_metrics_line_is_dropped_on_resume_and_other_damage_named(tmp_path):
    run = RunDir(tmp_path)
    run.append_metrics({"step": 1, "split": "train"})
    run.append_metrics({"step": 2, "split": "train"})
    with open(tmp_path / METRICS, "a") as f:
        f.write('{"step": 3, "spl')  # a kill during the append
    with pytest.raises(DataFormatError, match=r"metrics.jsonl:3: not a JSON metrics row"):
        run.metrics()
    run.truncate_metrics(2)
    assert [r["step"] for r in run.metrics()] == [1, 2]
    (tmp_path / METRICS).write_text('{"step": 1}\n{"step": 2\n{"step": 3}\n')
    with pytest.raises(DataFormatError, match=r"metrics.jsonl:2"):
        run.truncate_metrics(3)  # damage before the last line is not a torn append
    (tmp_path / METRICS).write_text('{"step": 1}\n["not", "a", "row"]\n')
    with pytest.raises(DataFormatError, match=r"metrics.jsonl:2: a metrics row must be a JSON object"):
        run.metrics()


def test_the_config_read_back_drops_loader_options_that_write_files(tmp_path):
    run = RunDir(tmp_path)
    victim = tmp_path.parent / "victim.txt"
    run.write_config({"experiment": {"name": "x", "data": {"source": "a.jsonl", "options": {"spill_to": str(victim), "user_column": "u"}, "eval_options": {"spill_to": "x"}}}})
    cfg = run.experiment_config()
    assert cfg.data.options == {"user_column": "u"} and cfg.data.eval_options == {}


def test_store_records_and_summaries_are_checked_for_shape(tmp_path):
    (tmp_path / "experiment.json").write_text(json.dumps({"name": "e", "runs": [{"name": "/etc", "kind": "central", "config": {}}]}))
    with pytest.raises(DataFormatError, match=r"experiment.json \(runs\[0\]\): run name '/etc' must be letters"):
        read_store_record(tmp_path)
    for bad in ([], {"name": "e"}, {"name": "e", "runs": [3]}, {"name": "e", "runs": [{"name": "report", "kind": "central", "config": {}}]}):
        (tmp_path / "experiment.json").write_text(json.dumps(bad))
        with pytest.raises(DataFormatError, match="experiment.json"):
            read_store_record(tmp_path)
    run = RunDir(tmp_path / "r").create()
    run.write_summary({"name": "r", "kind": "central", "epsilon": "big"})
    with pytest.raises(DataFormatError, match="not a run summary: epsilon must be an integer or a number or null, got \"big\""):
        run.summary()


def test_files_of_seeds_targets_tuning_and_empirical_audits_are_checked_for_shape(tmp_path):
    run = RunDir(tmp_path / "r").create()
    audit = {"summary": {"total": {"rs_memorized": 1}}, "canaries": []}
    run.write_json("audit-4.json", {**audit, "step": 4})
    assert run.along_audit(4)["summary"]["total"] == {"rs_memorized": 1}
    run.write_json("audit-6.json", {**audit, "step": 4})
    with pytest.raises(DataFormatError, match=r"audit-6.json: not the audit of step 6: it says step 4"):
        run.along_audit(6)
    run.write_json("audit-8.json", {"summary": {"total": []}, "step": 8})
    with pytest.raises(DataFormatError, match=r"audit-8.json: not an audit: summary.total must be an object"):
        run.along_audit(8)
    run.write_json(EMPIRICAL, {"kind": "example", "unit": "example", "canaries": 10, "epsilon_lower_bound": "high", "delta": 1e-5})
    with pytest.raises(DataFormatError, match=r"empirical.json: not an empirical audit: epsilon_lower_bound must be an integer or a number"):
        run.empirical()
    run.write_json(DATA, {"notes": "cut"})
    with pytest.raises(DataFormatError, match=r"data.json: not a data record: notes must be a list"):
        run.data_record()
    run.write_config({"experiment": {}, "utility": ["accuracy"]})
    with pytest.raises(DataFormatError, match=r"config.json: not a run config: utility must be \[metric, label\]"):
        run.utility()
    run.write_summary({"name": "r", "kind": "central", "target": {"metric": "accuracy", "value": 0.2, "reached": "yes"}})
    with pytest.raises(DataFormatError, match=r"summary.json: not a run summary: target.reached must be true or false"):
        run.summary()
    (tmp_path / "r" / "params-4.msgpack").write_bytes(b"\x81\xa1w")  # truncated msgpack
    with pytest.raises(DataFormatError, match=r"params-4.msgpack: unreadable parameters"):
        run.load_snapshot(4, {"w": np.zeros(3, np.float32)})


def test_a_fresh_start_removes_snapshots_along_audits_and_the_empirical_audit(tmp_path):
    run = RunDir(tmp_path).create()
    for name in ("params-2.msgpack", "audit-2.json", EMPIRICAL, "audit_canaries.json", "notes.txt"):
        (tmp_path / name).write_text("x")
    run.reset()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != MARKER) == ["audit_canaries.json", "notes.txt"]  # (the canaries are planted again)
    assert run.snapshot_steps() == []


def test_a_tuning_record_must_choose_a_candidate_of_the_runs_grid(tmp_path):
    from fedpriv.runner.tune import read_tuning

    spec = SimpleNamespace(name="r", tune={"training.learning_rate": [0.1, 0.3]})
    record = {"group": "r", "keys": ["training.learning_rate"], "candidates": [{"values": {"training.learning_rate": 0.1}, "validation_utility": 0.2}],
              "winner": {"training.learning_rate": 0.1}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(record))
    assert read_tuning(path, spec)["winner"] == {"training.learning_rate": 0.1}
    path.write_text(json.dumps({**record, "winner": {"data.options": {"spill_to": "/etc/passwd"}}}))
    with pytest.raises(DataFormatError, match=r"r.json: the winner .* is not a candidate of run 'r'.s tune grid"):
        read_tuning(path, spec)
    path.write_text(json.dumps({**record, "candidates": {}}))
    with pytest.raises(DataFormatError, match=r"r.json: not a tuning record: candidates must be a list"):
        read_tuning(path, spec)


def test_the_same_parameters_give_the_same_bytes_in_any_key_order(tmp_path):
    """A state restored from a checkpoint keeps its template's key order, a trained one JAX's
    sorted order; a run resumed at its last checkpoint must write the uninterrupted run's bytes."""
    w, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(3, np.float32)
    RunDir(tmp_path / "a").create().write_params({"out": {"w": w, "b": b}, "emb": {"e": b}})
    RunDir(tmp_path / "b").create().write_params({"emb": {"e": b}, "out": {"b": b, "w": w}})
    assert (tmp_path / "a" / PARAMS).read_bytes() == (tmp_path / "b" / PARAMS).read_bytes()
