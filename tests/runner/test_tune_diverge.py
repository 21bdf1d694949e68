"""Tuning when a candidate diverges, and ``--restart`` of a tuned run whose config changed."""

from __future__ import annotations

import json
import math

import pytest

from fedpriv.errors import FedprivError
from fedpriv.rundir import RunDir
from fedpriv.runner.store import run_experiment

TOML = """
name = "tune-div"
seed = 0
[data]
source = "shakespeare"
heldout_fraction = 0.1
validation_fraction = 0.1
max_examples_per_user = 8
[vocab]
size = 200
seq_len = 10
[task]
kind = "nwp"
model = "tiny"
[training]
optimizer = "sgd"
learning_rate = 0.5
batch_size = 16
steps = STEPS
eval_every = 4

[[runs]]
name = "sgd"
kind = "central"
tune = { "training.learning_rate" = [1e30, 0.5] }
tune_fraction = 0.25
"""


def test_a_diverging_candidate_loses_and_a_restart_tunes_the_changed_run_again(tmp_path):
    exp, store = tmp_path / "exp.toml", tmp_path / "store"
    exp.write_text(TOML.replace("STEPS", "12"))
    said: list[str] = []
    _, summaries, complete = run_experiment(exp, store, log=said.append)
    assert complete
    record = json.loads((store / "tune" / "sgd.json").read_text())
    lost, won = record["candidates"]
    # the candidate at learning rate 1e30 diverged: its trial is marked failed and loses
    assert lost["values"] == {"training.learning_rate": 1e30} and lost["validation_utility"] == -math.inf
    assert RunDir(store / lost["run_dir"]).failure() is not None and not RunDir(store / lost["run_dir"]).has_params()
    assert math.isfinite(won["validation_utility"]) and record["winner"] == {"training.learning_rate": 0.5}
    assert any("candidate 1" in m and "diverged" in m for m in said)
    assert json.loads((store / "sgd" / "run-config.json").read_text())["training"]["learning_rate"] == 0.5
    assert RunDir(store / won["run_dir"]).experiment_config().training.steps == 3  # a quarter of 12

    # the config changes: refused without --restart, tuned and trained again with it
    exp.write_text(TOML.replace("STEPS", "16"))
    with pytest.raises(FedprivError, match="changed"):
        run_experiment(exp, store)
    said.clear()
    _, summaries, complete = run_experiment(exp, store, log=said.append, restart=True)
    assert complete and summaries[0]["steps"] == 16
    again = json.loads((store / "tune" / "sgd.json").read_text())
    assert RunDir(store / again["candidates"][1]["run_dir"]).experiment_config().training.steps == 4
    assert again["candidates"][0]["validation_utility"] == -math.inf and again["winner"] == record["winner"]
    assert sum("tuning sgd: candidate" in m and "validation utility" in m for m in said) == 2  # both trials trained again


def test_a_candidate_refused_by_the_data_checks_is_refused_before_any_trial(tmp_path, capsys):
    """A delta of 1/N or more in the last candidate: `config check` passed it and `fedpriv run`
    trained the first candidate before refusing it. Now both refuse it up front."""
    from fedpriv.cli import main

    toml = tmp_path / "tune-delta.toml"
    text = TOML.replace("STEPS", "4").replace('tune = { "training.learning_rate" = [1e30, 0.5] }', 'tune = { "privacy.delta" = [1e-5, 0.5] }')
    toml.write_text(text.replace("[[runs]]", "[privacy]\nclip_norm = 1.0\nnoise_multiplier = 1.0\ndelta = 1e-5\n\n[[runs]]"))
    message = "run 'sgd': tune candidate {'privacy.delta': 0.5}: privacy.delta = 0.5 is at least 1/N"
    assert main(["config", "check", str(toml)]) == 2
    assert message in capsys.readouterr().err
    assert main(["run", str(toml), "--out", str(tmp_path / "store")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "store" / "tune").exists()  # no trial trained
