"""Comparisons a reviewer would accept, end to end on a tiny experiment: seeds, validation users,
a utility target, learning rates chosen on validation users, audits along training, user-level
DP-SGD, contrasts, and the report's intervals and flags."""

from __future__ import annotations

import csv
import json

import pytest

from fedpriv.config import ConfigError
from fedpriv.report.tables import write_report
from fedpriv.runner.grid import load_experiment

TOML = """
name = "cmp"
seeds = [0, 1]
[data]
source = "shakespeare"
heldout_fraction = 0.1
validation_fraction = 0.1
max_examples_per_user = 16
[vocab]
size = 300
seq_len = 10
[task]
kind = "nwp"
model = "tiny"
[training]
optimizer = "adam"
learning_rate = 0.01
batch_size = 32
steps = 60
eval_every = 20
[federated]
rounds = 12
clients_per_round = 10
local_batch_size = 8
max_local_steps = 4
client_learning_rate = 0.5
server_optimizer = "adam"
server_learning_rate = 0.01
eval_every = 4
[canaries]
per_config = 2
user_probabilities = [0.0002]
example_probabilities = [1.0]
[audit]
rs_candidates = 300
extraction_examples = 0
along = true
[utility]
target = 0.05

[[runs]]
name = "sgd"
kind = "central"

[[runs]]
name = "fedavg"
kind = "federated"
tune = { "federated.server_learning_rate" = [0.003, 0.03] }
tune_fraction = 0.5

[[runs]]
name = "user-dpsgd"
kind = "central"
training = { batch_size = 16 }
privacy = { unit = "user", examples_per_user = 2, clip_norm = 1.0, noise_multiplier = 0.8, delta = 1e-4 }

[[contrasts]]
name = "central vs federated"
a = "sgd"
b = "fedavg"
"""


def test_seeds_expand_every_run_with_its_own_training_and_canary_seed(tmp_path):
    p = tmp_path / "x.toml"
    p.write_text(TOML)
    _, specs = load_experiment(p)
    assert [s.name for s in specs] == ["sgd-s0", "sgd-s1", "fedavg-s0", "fedavg-s1", "user-dpsgd-s0", "user-dpsgd-s1"]
    assert [(s.group, s.seed, s.config.seed, s.config.canaries.seed) for s in specs[:2]] == [("sgd", 0, 0, 0), ("sgd", 1, 1, 1)]
    assert specs[2].tune == {"federated.server_learning_rate": [0.003, 0.03]} and specs[2].tune_fraction == 0.5
    fixed = tmp_path / "fixed.toml"
    fixed.write_text(TOML.replace("per_config = 2", "per_config = 2\nseed = 9"))
    assert {s.config.canaries.seed for s in load_experiment(fixed)[1]} == {9}  # a fixed canary seed stays


@pytest.mark.parametrize(
    "edit, message",
    [
        (('seeds = [0, 1]', 'seeds = [0, 1]\nseed = 3'), "give seed or seeds, not both"),
        (('seeds = [0, 1]', 'seeds = [0, 0]'), "seeds must be distinct"),
        (('validation_fraction = 0.1', 'validation_fraction = 0.0'), "set data.validation_fraction"),
        (('tune = { "federated.server_learning_rate" = [0.003, 0.03] }', 'tune = { "data.heldout_fraction" = [0.1, 0.2] }'), "tune must map dotted keys of training., federated., privacy."),
        (('tune = { "federated.server_learning_rate" = [0.003, 0.03] }', 'tune = { "federated.server_learning_rate" = [0.003, -1.0] }'), "tune candidate"),
        (('a = "sgd"', 'a = "nope"'), "a = 'nope' names no run"),
    ],
)
def test_bad_comparison_settings_are_refused_before_training(tmp_path, edit, message):
    p = tmp_path / "x.toml"
    p.write_text(TOML.replace(*edit, 1))
    with pytest.raises(ConfigError, match=message):
        load_experiment(p)


@pytest.mark.slow
def test_a_tiny_experiment_end_to_end(run_toml):
    store, summaries = run_toml(TOML)
    by = {s["name"]: s for s in summaries}
    assert set(by) == {"sgd-s0", "sgd-s1", "fedavg-s0", "fedavg-s1", "user-dpsgd-s0", "user-dpsgd-s1"}
    # the tuning: one record for the group, its winner in both seeds' configs
    record = json.loads((store / "tune" / "fedavg.json").read_text())
    assert [c["values"]["federated.server_learning_rate"] for c in record["candidates"]] == [0.003, 0.03]
    best = max(record["candidates"], key=lambda c: c["validation_utility"])
    assert record["winner"] == best["values"]
    for seed in (0, 1):
        cfg = json.loads((store / f"fedavg-s{seed}" / "run-config.json").read_text())
        assert cfg["federated"]["server_learning_rate"] == record["winner"]["federated.server_learning_rate"]
        assert by[f"fedavg-s{seed}"]["tuned"]["winner"] == record["winner"]
    # seeds and the target: recorded per run; a run that reached the target stopped there
    for name, s in by.items():
        assert s["seed"] == s["canary_seed"] == int(name[-1]) and s["utility_metric"] == "accuracy_no_oov_no_eos"
        t = s["target"]
        if t["reached"]:
            rows = [json.loads(line) for line in (store / name / "metrics.jsonl").read_text().splitlines()]
            last = rows[-1]["step"]
            assert t["when"] == (last if s["kind"] == "central" else rows[-1]["round"]) and t["reached_value"] >= 0.05
        # the target is the validation users' (never the test users'): reached_value is the validation row's there, else their best
        metrics = [json.loads(line) for line in (store / name / "metrics.jsonl").read_text().splitlines()]
        val = [r for r in metrics if r["split"] == "validation"]
        expect = next(r for r in val if r.get(t["at"], r["step"]) == t["when"]) if t["reached"] else max(val, key=lambda r: r[t["metric"]])
        assert t["reached_value"] == expect[t["metric"]], (name, t)
        assert len(s["along"]) >= 1 and all(p["validation_utility"] is not None for p in s["along"])
    assert by["user-dpsgd-s0"]["privacy_unit"] == "user" and "user-level" in by["user-dpsgd-s0"]["guarantee"]
    # the report: one row per run group, intervals, contrasts, the plot along training
    report = write_report(store)
    groups = list(csv.DictReader((report / "comparison.csv").open()))
    assert [g["run"] for g in groups] == ["sgd", "fedavg", "user-dpsgd"] and all(g["seeds"] == "2" for g in groups)
    contrasts = list(csv.DictReader((report / "contrasts.csv").open()))
    assert {c["quantity"] for c in contrasts} >= {"RS memorized (canaries)", "exposure mean (bits)"}
    assert (report / "memorization_vs_utility.png").is_file()
    md = (report / "comparison.md").read_text()
    assert "## Contrasts" in md and "per user (δ = 0.0001)" in md
