"""A run halted by --stop-after between two train rows: its summary's epsilon is that of every step
(round) it took, not that of the last row logged (which was one step short), checked against
dp_accounting through epsilon_for on the ledger's event."""

from __future__ import annotations

import json

import pytest

from fedpriv.cli import main
from fedpriv.privacy.accounting import epsilon_for
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.rundir import LEDGER, RunDir

CONFIG = """
name = "halt"
seed = 1
[data]
source = "synthetic:users=40,examples=400"
[vocab]
size = 80
seq_len = 8
[task]
kind = "nwp"
model = "tiny"
[training]
batch_size = 16
steps = 6
eval_every = 2
checkpoint_every = 2
[privacy]
clip_norm = 1.0
noise_multiplier = 1.0
delta = 1e-5
"""
FEDERATED = CONFIG.split("[privacy]")[0] + """
[federated]
strategy = "dp-fedavg"
rounds = 6
clients_per_round = 8
clip_norm = 0.5
local_batch_size = 8
max_local_steps = 1
eval_every = 2
checkpoint_every = 2
dp = { noise_multiplier = 1.0, delta = 1e-3 }
"""


@pytest.mark.parametrize("kind, text", [("central", CONFIG), ("federated", FEDERATED)])
def test_a_halted_runs_summary_has_the_epsilon_of_every_step_it_took(tmp_path, capsys, kind, text):
    config = tmp_path / "c.toml"
    config.write_text(text)
    run = tmp_path / "run"
    assert main(["train", kind, str(config), "--out", str(run), "--stop-after", "3", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    (event,) = PrivacyLedger.load(run / LEDGER).entries
    assert event.steps == 3
    assert summary["epsilon"] == pytest.approx(epsilon_for(event, summary["delta"]).epsilon, rel=1e-12)
    logged = [r for r in RunDir(run).metrics() if r["split"] == "train"]
    if kind == "central":  # DP-SGD logs a train row every eval_every steps; DP-FedAvg every round
        assert [r["step"] for r in logged] == [2]
        assert summary["epsilon"] > logged[-1]["epsilon"] and "; 3 steps;" in summary["guarantee"]
    else:
        assert [r["round"] for r in logged] == [1, 2, 3] and summary["epsilon"] == logged[-1]["epsilon"]
