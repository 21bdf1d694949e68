"""A DP run that stops at its utility target (#32's runs do) promises the epsilon of every step it
may take: when it stops depends on the data, so the epsilon of the steps it took is an ex-post
figure, not a guarantee. Checked end to end on a real DP-SGD and a real DP-FedAvg run, against
dp_accounting through epsilon_for, and in the report."""

from __future__ import annotations

import json

import pytest

from fedpriv.cli import main
from fedpriv.privacy.accounting import epsilon_for
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.rundir import LEDGER

EXPERIMENT = """
name = "stop"
[data]
source = "synthetic:users=60,examples=1200"
heldout_fraction = 0.1
validation_fraction = 0.1
[vocab]
size = 80
seq_len = 8
[task]
kind = "nwp"
model = "tiny"
[utility]
target = 1e-6                   # reached at the first evaluation: the run stops there
[training]
batch_size = 16
steps = 40
eval_every = 2
checkpoint_every = 2
[federated]
rounds = 40
clients_per_round = 10
local_batch_size = 8
max_local_steps = 1
eval_every = 2
checkpoint_every = 2
[audit]
empirical = false

[[runs]]
name = "dp-sgd"
kind = "central"
privacy = { clip_norm = 1.0, noise_multiplier = 0.7, delta = 1e-5 }

[[runs]]
name = "dp-fedavg"
kind = "federated"
federated = { strategy = "dp-fedavg", clip_norm = 0.5, dp = { noise_multiplier = 0.7, delta = 1e-3 } }
[[runs]]
name = "client-dp"
kind = "federated"
federated = { client_dp = { clip_norm = 1.0, noise_multiplier = 0.7, delta = 1e-5, sampling_rate = 0.5 } }
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("stop")
    (root / "exp.toml").write_text(EXPERIMENT)
    assert main(["run", str(root / "exp.toml"), "--out", str(root / "store")]) == 0
    return root / "store"


@pytest.mark.parametrize("run", ["dp-sgd", "dp-fedavg"])
def test_a_run_stopped_at_its_target_promises_all_its_planned_steps(store, run):
    s = json.loads((store / run / "summary.json").read_text())
    (event,) = PrivacyLedger.load(store / run / LEDGER).entries
    assert s["target"]["reached"] and event.steps == 2  # it stopped at the first evaluation, of 40 planned
    assert s["epsilon"] == pytest.approx(epsilon_for(event.with_steps(40), s["delta"]).epsilon, rel=1e-12)
    assert s["epsilon_spent"] == pytest.approx(epsilon_for(event, s["delta"]).epsilon, rel=1e-12)
    assert s["epsilon_spent"] < 0.9 * s["epsilon"] and s["promised_steps"] == 40
    assert "depends on the data" in s["guarantee"] and "ex-post" in s["guarantee"]
    word = "rounds" if run == "dp-fedavg" else "steps"
    assert f"all 40 {word}" in s["guarantee"]


def test_the_report_prints_the_promise_not_the_steps_taken(store):
    rows = {r["run"]: r for r in __import__("csv").DictReader((store / "report" / "runs.csv").open())}
    for run in ("dp-sgd", "dp-fedavg"):
        s = json.loads((store / run / "summary.json").read_text())
        assert float(rows[run]["epsilon"]) == pytest.approx(s["epsilon"], rel=1e-12)
    report = (store / "report" / "comparison.md").read_text()
    assert "the ledger gives epsilon" not in report  # the curves are drawn for the promise, at its 40 steps


def test_client_side_dp_counts_the_participation_of_every_planned_round(store):
    """Record-level client-side DP-SGD of a run with a utility target (it may stop on its data at
    any evaluation): from its first round on, its ε counts the most frequent user's participation
    over all 40 planned rounds, the figure a run that never stopped ends with."""
    from fedpriv.clients.privacy import EVERY_ROUND

    s = json.loads((store / "client-dp" / "summary.json").read_text())
    rows = [json.loads(line) for line in (store / "client-dp" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    assert EVERY_ROUND in s["client_guarantee"] and len({r["client_epsilon"] for r in train}) == 1
    assert train[0]["client_epsilon"] == s["client_epsilon"]
