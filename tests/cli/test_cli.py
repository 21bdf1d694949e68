"""The fedpriv command: --help everywhere, JSON statistics, one-line errors with non-zero exit."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedpriv.cli import main

SUBCOMMANDS = [[], ["data"], ["data", "inspect"], ["config"], ["config", "check"], ["demo"], ["privacy"], ["privacy", "epsilon"], ["privacy", "calibrate"], ["privacy", "batch-sweep"], ["vocab"], ["vocab", "build"], ["train"], ["train", "central"], ["train", "federated"], ["run"], ["report"], ["audit"], ["privatize"]]


@pytest.mark.parametrize("args", SUBCOMMANDS, ids=lambda a: " ".join(a) or "root")
def test_every_subcommand_has_help(args, capsys):
    assert main([*args, "--help"]) == 0
    assert "Usage:" in capsys.readouterr().out


def test_inspect_shakespeare_json(capsys):
    assert main(["data", "inspect", "shakespeare", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["users"] == 299 and stats["examples"] == 12625
    per = stats["examples_per_user"]
    assert per["min"] == 1 and per["max"] == 409
    assert sum(b["users"] for b in per["histogram"]) == 299
    assert stats["top_words"][0] == {"word": ",", "count": 19844}


def test_inspect_coffee_dump_json(capsys, coffee_posts):
    assert main(["data", "inspect", str(coffee_posts), "--json", "--top", "3"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["users"] == 116
    assert stats["load"]["skipped_no_owner"] == 0
    assert len(stats["top_words"]) == 3


def test_inspect_conll_with_option(capsys, ncbi_train):
    assert main(["data", "inspect", str(ncbi_train), "--json", "-o", "users=sentences:100"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["kind"] == "tagged" and stats["entities"] == {"Disease": stats["entities"]["Disease"]}
    assert stats["examples_per_user"]["max"] == 100


def test_human_output(capsys):
    assert main(["data", "inspect", "shakespeare", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "299" in out and "most frequent words" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["data", "inspect", "no/such/file.jsonl"], "no such file or directory"),
        (["data", "inspect", "shakespeare", "-o", "bogus=1"], "unknown option(s) bogus"),
        (["data", "inspect", "shakespeare", "-o", "novalue"], "expected KEY=VALUE"),
        (["config", "check", "no/such.toml"], "no such file"),
    ],
)
def test_errors_are_one_line_with_exit_2(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedpriv: error:") and message in err
    assert "\n" not in err and "Traceback" not in err


def test_usage_error_exits_non_zero(capsys):
    assert main(["data", "inspect"]) == 2
    assert "Missing argument" in capsys.readouterr().err


def test_installed_command_prints_no_traceback(tmp_path):
    bad = tmp_path / "bad.conll"
    bad.write_text("a\tO\nb\tNOPE\n")
    exe = [sys.executable, "-m", "fedpriv.cli"]
    res = subprocess.run([*exe, "data", "inspect", str(bad)], capture_output=True, text=True)
    assert res.returncode == 2
    assert res.stderr.strip() == f"fedpriv: error: {bad}:2: tag 'NOPE' is not O or B-/I-/E-/S-/L-/U-<type>"
    ok = subprocess.run([*exe, "--version"], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.startswith("fedpriv ")


@pytest.mark.slow
def test_config_check_and_demo(capsys, tmp_path):
    assert main(["config", "check", "experiments/demo.toml"]) == 0
    assert "ok (experiment 'demo', 7 runs" in capsys.readouterr().out
    # The demo's own experiment, shortened: the same command path, a fraction of the steps.
    text = open("experiments/demo.toml").read()
    for old, new in [("steps = 1500", "steps = 20"), ("steps = 300", "steps = 10"), ("rounds = 150", "rounds = 2"), ("rounds = 60", "rounds = 2"), ("rs_candidates = 20000", "rs_candidates = 300"), ("extraction_examples = 300", "extraction_examples = 20")]:
        assert old in text
        text = text.replace(old, new)
    cfg = tmp_path / "demo.toml"
    cfg.write_text(text)
    assert main(["demo", "--json", "--config", str(cfg), "--out", str(tmp_path / "store")]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["complete"] and len(result["runs"]) == 7
    sgd = result["runs"][0]
    assert sgd["name"] == "sgd-iid" and sgd["steps"] == 20 and sgd["eval_perplexity"] > 0
    assert sgd["audit"]["total"]["canaries"] == 18
    report = Path(result["report"])
    assert (report / "comparison.md").is_file() and (report / "comparison.csv").is_file()
    assert main(["demo", "--config", str(cfg), "--out", str(tmp_path / "store")]) == 0  # all runs skipped
    assert "| dp-sgd-iid |" in capsys.readouterr().out
