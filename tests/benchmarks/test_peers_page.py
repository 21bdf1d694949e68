"""The peers page (benchmarks/peers/run.py): hand-written sections survive a rebuild, and the pfl
section says when the two tools differ or fedpriv is behind (no benchmark runs here)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[2] / "benchmarks" / "peers" / "run.py"


@pytest.fixture
def run(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("peers_run_under_test", RUN)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.syspath_prepend(str(RUN.parent))
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "ENVS", tmp_path / "envs")
    monkeypatch.setattr(mod, "RESULTS", tmp_path / "envs" / "results")
    monkeypatch.setattr(mod, "PAGE", tmp_path / "benchmarks.md")
    (tmp_path / "envs" / "results").mkdir(parents=True)
    yield mod
    sys.modules.pop("peers_run_under_test", None)


def pfl_result(rel_diff: float, fedpriv_s: float, pfl_s: float, flower_s: float) -> dict:
    timing = {"cohort": 1000, "variant": "fedavg", "local_steps": 1750, "fedpriv_median_s": fedpriv_s, "pfl_median_s": pfl_s,
              "fedpriv_updates_per_s": 1000 / fedpriv_s, "pfl_updates_per_s": 1000 / pfl_s, "fedpriv_over_pfl_speed": pfl_s / fedpriv_s,
              "fedpriv_peak_mb": 900.0, "pfl_peak_mb": 700.0}
    return {"command": "x", "when": "2026-11-26 15:00", "wall_s": 1.0, "users": 3000, "model": "tiny", "rounds": 2, "repeats": 1, "clip_norm": 0.5,
            "noise_multiplier": 1.0, "versions": {"pfl": "0.6.0", "torch": "2.13.0", "dp_accounting": "0.5.1", "prv_accountant": "0.2.0", "threads": 1},
            "local": {"epochs": 1, "batch": 16, "client_lr": 0.3, "server": "sgd 1.0"},
            "population": {"users": 3000, "examples": 60000, "counts_max": 32, "params": 336932},
            "equiv": [{"strategy": "fedavg", "clip": None, "users": 100, "update_norm": 0.2, "peer_update_norm": 0.2, "max_abs_diff": 1e-7, "rel_diff": rel_diff}],
            "timing": [timing], "flower": [{"cohort": 1000, "median_s": flower_s, "updates_per_s": 1000 / flower_s, "flwr": "1.41.0"}], "epsilon": []}


def test_a_hand_written_section_survives_a_rebuild(run):
    run.PAGE.write_text("# Benchmarks\n\n## (f) Scaling of the vectorized engine\n\nmeasured by hand: 1,652 MiB\n\n## Not measured\n\n- x\n")
    page = run.page()
    assert "## (f) Scaling of the vectorized engine\n\nmeasured by hand: 1,652 MiB" in page
    assert page.count("## (f)") == 1


def test_pfl_section_same_and_ahead(run):
    (run.RESULTS / "pfl.json").write_text(json.dumps(pfl_result(2e-7, fedpriv_s=10.0, pfl_s=20.0, flower_s=200.0)))
    page = run.page()
    assert "## (h) FedAvg and DP-FedAvg against pfl-research" in page
    assert "**same**" in page and "NOT the same" not in page
    assert "**2.00x**" in page and "**20.0x**" in page
    assert "NOT as fast as pfl" not in page and "NOT 10x Flower" not in page


def test_pfl_section_says_when_different_or_behind(run):
    (run.RESULTS / "pfl.json").write_text(json.dumps(pfl_result(2e-4, fedpriv_s=20.0, pfl_s=10.0, flower_s=100.0)))
    page = run.page()
    assert "**NOT the same**" in page
    assert "fedpriv is NOT as fast as pfl at m = 1,000 (fedavg): 0.50x" in page
    assert "fedpriv is NOT 10x Flower at m = 1,000: 5.0x" in page
