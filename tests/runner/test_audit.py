"""End to end: a model trained on planted canaries memorizes them, a model trained without them
does not, and ``fedpriv audit`` reports it."""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import pytest

from fedpriv.central.train import train_prepared_central as run_central
from fedpriv.cli import main
from fedpriv.config import validate_config
from fedpriv.memorization.audit import audit_nwp_canary
from fedpriv.memorization.lm import NWPStepper
from fedpriv.rundir import RunDir
from fedpriv.runner.audit import load_run
from fedpriv.runner.prepare import prepare

pytestmark = pytest.mark.slow

CANDIDATES = 20_000

EXPERIMENT = {
    "name": "audit-test",
    "seed": 0,
    "data": {"source": "shakespeare", "heldout_fraction": 0.1},
    "vocab": {"size": 1000, "seq_len": 20},
    "task": {"kind": "nwp", "model": "tiny"},
    "training": {"optimizer": "adam", "learning_rate": 0.01, "batch_size": 64, "steps": 500, "eval_every": 250, "checkpoint_every": 250},
    # two configurations: ~1-2 sharers with few insertions, and ~14 sharers repeating the canary often
    "canaries": {"per_config": 3, "user_probabilities": [0.005, 0.05], "example_probabilities": [0.2], "min_expected_sharers": 0.0},
    "audit": {"rs_candidates": CANDIDATES, "extraction_examples": 100},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit")
    cfg = validate_config(EXPERIMENT)
    planted = prepare(cfg)
    run_central(planted, root / "planted")
    clean_cfg = cfg.model_copy(update={"canaries": None})
    run_central(prepare(clean_cfg), root / "clean")
    return cfg, planted, root


def test_a_model_memorizes_repeated_canaries_and_a_clean_model_does_not(runs):
    cfg, planted, root = runs
    manifest = planted.canaries
    many = [i for i, c in enumerate(manifest.canaries) if c.insertions >= 30]
    assert len(many) >= 3, [c.insertions for c in manifest.canaries]
    template = planted.task.init_params(jax.random.key(0))
    trained = NWPStepper(planted.task, RunDir(root / "planted").load_params(template)[0])
    clean = NWPStepper(planted.task, RunDir(root / "clean").load_params(template)[0])  # same (clean) vocabulary
    for i in many:
        row = audit_nwp_canary(trained, manifest, i, cfg, CANDIDATES)
        assert row["rs_memorized"] and row["bs_memorized"], row
        assert row["exposure"] > 14.0  # log2(1000^3) ~ 29.9: rank 1 among 20,000 samples
    for i in range(len(manifest.canaries)):
        row = audit_nwp_canary(clean, manifest, i, cfg, CANDIDATES)
        assert not row["rs_memorized"] and not row["bs_memorized"], row
        assert row["rs_rank"] > 20  # a canary the model never saw is not unusually likely


def test_fedpriv_audit_writes_and_prints_the_table(runs, capsys):
    cfg, planted, root = runs
    run = root / "planted"
    assert main(["audit", str(run), "--json", "--candidates", "2000"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["settings"]["rs_candidates"] == 2000
    assert len(report["canaries"]) == len(planted.canaries.canaries)
    total = report["summary"]["total"]
    assert total["rs_memorized"] == sum(r["rs_memorized"] for r in report["canaries"]) >= 3
    assert set(report["extraction"]) == {"duplicated", "unique", "validation"}
    assert json.loads((run / "audit.json").read_text())["summary"] == report["summary"]
    md = (run / "audit.md").read_text()
    assert "| c000 |" in md and "Random Sampling:" in md and "## Extraction" in md
    assert main(["audit", str(run), "--candidates", "2000"]) == 0
    shown = capsys.readouterr().out
    assert "summary by configuration" in shown and "c005" in shown


def test_audit_refuses_what_it_cannot_audit(runs, tmp_path, capsys):
    _, _, root = runs
    assert main(["audit", str(tmp_path)]) == 2
    assert "not a fedpriv run directory" in capsys.readouterr().err
    assert main(["audit", str(root / "clean")]) == 2
    assert "no [canaries] section" in capsys.readouterr().err


def test_an_unfinished_run_is_audited_from_its_checkpoint(runs, tmp_path):
    _, planted, _ = runs  # the same data and canaries: only [training] differs (what the run store shares too)
    cfg = validate_config({**EXPERIMENT, "training": {**EXPERIMENT["training"], "steps": 60, "checkpoint_every": 20}})
    run_central(dataclasses.replace(planted, config=cfg), tmp_path / "run", stop_after=40)
    _, _, source = load_run(tmp_path / "run")
    assert source == "checkpoint at step 40 (the run is unfinished)"


def test_fedpriv_audit_on_a_masked_lm_run(tmp_path, capsys):
    """The secret sharer on a (briefly trained) tiny BERT on NCBI-disease: one row per pattern
    canary, exposures in [0, log2 V], summaries per pattern and configuration."""
    cfg = validate_config(
        {
            "name": "audit-mlm-test",
            "data": {"source": "tests/data/ncbi-disease/train.tsv", "options": {"users": "sentences:10"}, "heldout_fraction": 0.0},
            "vocab": {"size": 1000},
            "task": {"kind": "mlm", "model": "tiny", "options": {"max_len": 48, "lowercase": True}},
            "training": {"optimizer": "adam", "learning_rate": 0.002, "batch_size": 16, "steps": 30, "eval_every": 30, "checkpoint_every": 30},
            "canaries": {"per_config": 2, "user_probabilities": [0.05], "example_probabilities": [0.3], "patterns": ["HS", "HSH"], "min_expected_sharers": 0.0},
        }
    )
    prepared = prepare(cfg)
    run_central(prepared, tmp_path / "mlm")
    assert main(["audit", str(tmp_path / "mlm"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["canaries"]
    assert [r["pattern"] for r in rows] == ["HS", "HS", "HSH", "HSH"]
    vocab = len(prepared.task.vocab)
    for r, c in zip(rows, prepared.canaries.canaries):
        assert r["id"] == c.id and r["insertions"] == c.insertions and r["secret"] == c.words[c.secret_index]
        assert 1 <= r["rank"] <= vocab and r["exposure"] == pytest.approx(math.log2(vocab) - math.log2(r["rank"]))
    assert set(report["summary"]["by_configuration"]) == {"HS p_u=0.05 p_e=0.3", "HSH p_u=0.05 p_e=0.3"}
    assert "| HSH |" in (tmp_path / "mlm" / "audit.md").read_text()
