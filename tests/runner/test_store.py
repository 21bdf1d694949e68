"""The run store under failure: a diverged run is marked failed, left out of the report and
skipped later; a changed run is refused naming its keys until ``--restart`` starts it afresh."""

from __future__ import annotations

import json

import pytest

from fedpriv.cli import main

EXPERIMENT = """
name = "store-test"
[data]
source = "synthetic:users=20,examples=200"
[vocab]
size = 100
seq_len = 8
[task]
kind = "nwp"
model = "tiny"
[training]
optimizer = "sgd"
learning_rate = 0.5
batch_size = 8
steps = 4
eval_every = 2
checkpoint_every = 2

[[runs]]
name = "ok"
kind = "central"

[[runs]]
name = "boom"
kind = "central"
training = { learning_rate = BOOM_LR }
"""


def _run(exp, store, capsys, *extra):
    code = main(["run", str(exp), "--out", str(store), "--json", *extra])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err.strip()


@pytest.mark.slow
def test_a_diverged_run_is_marked_failed_left_out_and_restarted_on_request(tmp_path, capsys):
    exp, store = tmp_path / "exp.toml", tmp_path / "store"
    exp.write_text(EXPERIMENT.replace("BOOM_LR", "1e30"))
    code, out, err = _run(exp, store, capsys)
    assert code == 2 and err.count("\n") == 0 and "1 run(s) failed and are left out of the report (boom: training diverged at step 2 of 4" in err
    assert out["complete"] and [r["name"] for r in out["runs"]] == ["ok"]
    assert (store / "boom" / "failed.json").is_file() and not (store / "boom" / "summary.json").exists()
    report = (store / "report" / "comparison.md").read_text()
    assert "Run boom failed and is not compared" in report and "| boom |" not in report and "| ok |" in report
    assert [line.split(",")[0] for line in (store / "report" / "comparison.csv").read_text().splitlines()[1:]] == ["ok"]

    ok_params = (store / "ok" / "params.msgpack").read_bytes()
    failed = (store / "boom" / "failed.json").read_text()
    code, _, err = _run(exp, store, capsys)  # nothing retrained: the failure stays, once
    assert code == 2 and "boom" in err and (store / "boom" / "failed.json").read_text() == failed

    exp.write_text(EXPERIMENT.replace("BOOM_LR", "0.5"))
    code, _, err = _run(exp, store, capsys)
    assert code == 2 and err == f"fedpriv: error: {store / 'boom'}: the run's config changed since it was started (training.learning_rate); pass --restart to start it afresh, or use another --out"

    code, out, err = _run(exp, store, capsys, "--restart")
    assert code == 0, err
    assert [r["name"] for r in out["runs"]] == ["ok", "boom"] and not (store / "boom" / "failed.json").exists()
    assert (store / "ok" / "params.msgpack").read_bytes() == ok_params  # the unchanged finished run is kept
    assert "| boom |" in (store / "report" / "comparison.md").read_text()


def test_restarting_only_some_runs_refuses_when_another_changed_too(tmp_path):
    """--only with --restart: a changed run left out would get the new config's record while its
    files stay those of the old one; refused before any work."""
    from fedpriv.errors import ConfigChanged
    from fedpriv.jsonio import write_json_atomic
    from fedpriv.runner.grid import read_experiment
    from fedpriv.rundir import LOCK, MARKER, claim
    from fedpriv.runner.store import run_experiment

    exp, store = tmp_path / "exp.toml", tmp_path / "store"
    exp.write_text(EXPERIMENT.replace("BOOM_LR", "0.5"))
    old = read_experiment(exp)
    write_json_atomic(claim(store, "store") / "experiment.json", {"name": old.name, "runs": [s.record() for s in old.runs]})
    for s in old.runs:
        claim(store / s.name, "run")
    exp.write_text(EXPERIMENT.replace("BOOM_LR", "0.5").replace("steps = 4", "steps = 6"))  # both runs change
    with pytest.raises(ConfigChanged, match=r"store/boom: the run's config changed too; add it to --only"):
        run_experiment(exp, store, restart=True, only=["ok"])
    assert sorted(p.name for p in store.iterdir() if p.name not in (MARKER, LOCK)) == ["boom", "experiment.json", "ok"]
    assert [p.name for p in (store / "ok").iterdir()] == [MARKER]
