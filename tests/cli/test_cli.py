"""The fedpriv command: --help everywhere, JSON statistics, one-line errors with non-zero exit."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedpriv.cli import main

SUBCOMMANDS = [[], ["data"], ["data", "inspect"], ["config"], ["config", "check"], ["demo"], ["privacy"], ["privacy", "epsilon"], ["privacy", "calibrate"], ["privacy", "batch-sweep"], ["vocab"], ["vocab", "build"], ["train"], ["train", "central"], ["train", "federated"], ["run"], ["report"], ["audit"], ["privatize"], ["flwr-run"]]


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
    assert stats["users"] == 115
    assert stats["load"]["skipped_no_owner"] == 0 and stats["load"]["skipped_dropped_owner"] == 12
    assert stats["notes"] == ["12 posts of account -1 (the Community account) dropped (drop_owners=['-1']; pass drop_owners=[] to keep them)"]
    assert len(stats["top_words"]) == 3


def test_inspect_conll_with_option(capsys, ncbi_train):
    assert main(["data", "inspect", str(ncbi_train), "--json", "-o", "users=sentences:100"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["kind"] == "tagged" and stats["entities"] == {"Disease": stats["entities"]["Disease"]}
    assert stats["examples_per_user"]["max"] == 100


def test_inspect_the_arxiv_slice_with_sentences(capsys):
    """The documented command on the committed slice (the full file: 56,229 users, docs/data.md)."""
    arxiv = Path(__file__).resolve().parents[1] / "data" / "arxiv-csai" / "abstracts.jsonl.gz"
    opts = ["-o", "user_column=first_author", "-o", "text_column=abstract", "-o", "unit=sentence"]
    assert main(["data", "inspect", str(arxiv), "--json", "--top", "3", *opts]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["users"] == 2198 and stats["load"]["split_rows"] == 3295 and stats["examples"] == stats["load"]["sentences"]
    assert stats["notes"][0].startswith("examples are sentences (unit='sentence'): 3,295 rows")
    assert main(["data", "inspect", str(arxiv), "--json", "-o", "format=jsonl", *opts]) == 0  # the format as an option
    assert json.loads(capsys.readouterr().out)["users"] == 2198
    assert main(["data", "inspect", str(arxiv), "--format", "csv", "-o", "format=jsonl", *opts]) == 2
    assert "the format is given twice: 'csv' and the option format='jsonl'" in capsys.readouterr().err


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
        # issue 31: a MemoryError and a RecursionError before
        (["data", "inspect", "synthetic:users=10,examples=99999999999999"], "needs about 5.24 PiB of memory"),
        (["config", "check", "--static", str(Path(__file__).parents[2] / "experiments" / "demo.toml"), "--set", "seed=" + "[" * 5000 + "]" * 5000],
         "--set seed: the value nests arrays or objects too deeply to read"),
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
    assert res.stderr.strip() == f"fedpriv: error: {bad}:2: tag 'NOPE' (the last column) is not O or B-/I-/E-/S-/L-/U-<type>; pass tag_column= to choose the column"
    ok = subprocess.run([*exe, "--version"], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.startswith("fedpriv ")


@pytest.mark.slow
def test_config_check_and_demo(capsys, tmp_path):
    assert main(["config", "check", "experiments/demo.toml"]) == 0
    assert "ok (experiment 'demo', 16 runs" in capsys.readouterr().out
    # The demo's own experiment, shortened: the same command path, a fraction of the steps.
    text = open("experiments/demo.toml").read()
    for old, new in [("seeds = [0, 1]", "seeds = [0]"), ("steps = 1500", "steps = 20"), ("steps = 300", "steps = 10"), ("steps = 60", "steps = 3"), ("rounds = 250", "rounds = 2"), ("rounds = 60", "rounds = 2"), ("rs_candidates = 20000", "rs_candidates = 300"), ("extraction_examples = 300", "extraction_examples = 20"),
                     ("max_local_steps = 16", "max_local_steps = 2"), ("clients_per_round = 100", "clients_per_round = 40")]:
        assert old in text, old
        text = text.replace(old, new)
    cfg = tmp_path / "demo.toml"
    cfg.write_text(text)
    assert main(["demo", "--json", "--config", str(cfg), "--out", str(tmp_path / "store")]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["complete"] and len(result["runs"]) == 8
    sgd = result["runs"][0]
    assert sgd["name"] == "sgd-iid-s0" and sgd["group"] == "sgd-iid" and 0 < sgd["steps"] <= 20 and sgd["eval_perplexity"] > 0
    assert sgd["audit"]["total"]["canaries"] == 18
    report = Path(result["report"])
    assert (report / "comparison.md").is_file() and (report / "comparison.csv").is_file()
    assert main(["demo", "--config", str(cfg), "--out", str(tmp_path / "store")]) == 0  # all runs skipped
    assert "| dp-sgd-iid |" in capsys.readouterr().out


QUICK = "experiments/fedavg-shakespeare-quick.toml"
#: Every command that takes an experiment config: the parameter that names it, and an argv whose
#: --set the config's validation must refuse naming the key (proof the override reached it).
CONFIG_COMMANDS = {
    ("config", "check"): (["config", "check", QUICK, "--set", "vocab.size=0"], "vocab.size: Input should be greater than or equal to 1"),
    ("train", "central"): (["train", "central", QUICK, "--set", "training.batch_size=0"], "training.batch_size: Input should be greater than or equal to 1"),
    ("train", "federated"): (["train", "federated", QUICK, "--set", "federated.rounds=0"], "federated.rounds: Input should be greater than or equal to 1"),
    ("run",): (["run", "experiments/demo.toml", "--set", "vocab.size=0"], "vocab.size: Input should be greater than or equal to 1"),
    ("demo",): (["demo", "--set", "federated.clients_per_round=0"], "federated.clients_per_round: Input should be greater than or equal to 1"),
    ("audit",): (["audit", "{run}", "--set", "audit.beam_top=99"], "audit: beam_top (99) must be <= beam_width (5)"),
}
CONFIG_PARAMS = {"config", "experiment", "path", "run_dir"}


def _commands(group, path=()):
    for name, cmd in getattr(group, "commands", {}).items():
        yield from _commands(cmd, (*path, name)) if hasattr(cmd, "commands") else [((*path, name), cmd)]


def test_every_command_taking_a_config_accepts_set(tmp_path, capsys):
    import typer

    from fedpriv.cli import app
    from fedpriv.config import load_config
    from fedpriv.rundir import RunDir

    commands = dict(_commands(typer.main.get_command(app)))
    taking = {path for path, cmd in commands.items() if CONFIG_PARAMS & {p.name for p in cmd.params}}
    assert taking == set(CONFIG_COMMANDS)
    for path in taking:
        assert "--set" in {o for p in commands[path].params for o in p.opts}, path
    run = tmp_path / "run"
    RunDir(run).create().write_config({"experiment": load_config(QUICK).model_dump()})
    for path, (argv, message) in CONFIG_COMMANDS.items():
        argv = [a.replace("{run}", str(run)) for a in argv]
        assert main([*argv, "--out", str(tmp_path / "out")] if path in {("run",), ("demo",), ("train", "central"), ("train", "federated")} else argv) == 2, path
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (path, err)
    assert main(["audit", str(run), "--set", "data.source=x"]) == 2
    assert "fedpriv audit takes audit.* keys only" in capsys.readouterr().err


def test_set_overrides_reach_the_resolved_config(capsys):
    assert main(["config", "check", QUICK, "--json", "--set", "training.steps=7", "--set", "data.options={\"unit\": \"turn\"}"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["training"]["steps"] == 7 and cfg["data"]["options"] == {"unit": "turn"}
    assert main(["config", "check", "experiments/demo.toml", "--json", "--set", "vocab.seq_len=12"]) == 0  # (at least extraction_prefix + extraction_suffix = 10)
    assert {r["config"]["vocab"]["seq_len"] for r in json.loads(capsys.readouterr().out)["runs"]} == {12}
    assert main(["config", "check", QUICK, "--set", "vocab"]) == 2
    assert "--set 'vocab': expected KEY=VALUE" in capsys.readouterr().err
    assert main(["config", "check", QUICK, "--set", "vocab.size.x=1"]) == 2
    assert "--set 'vocab.size.x': 'size' is not a table" in capsys.readouterr().err


def test_verbose_flag_anywhere_on_the_line(monkeypatch, capsys):
    monkeypatch.delenv("FEDPRIV_VERBOSE", raising=False)
    assert main(["config", "check", QUICK]) == 0
    assert os.environ["FEDPRIV_VERBOSE"] == "0"
    assert main(["config", "check", QUICK, "-v"]) == 0 and os.environ["FEDPRIV_VERBOSE"] == "1"
    assert main(["--verbose", "config", "check", QUICK]) == 0 and os.environ["FEDPRIV_VERBOSE"] == "1"
    assert "ok (experiment" in capsys.readouterr().out


def test_run_only_names_existing_runs(tmp_path, capsys):
    assert main(["run", "experiments/demo.toml", "--only", "sgd-iid,nope", "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "--only sgd-iid,nope: no run named 'nope'; the runs are sgd-iid, sgd-noniid" in err  # a group names every seed of a run
    assert not (tmp_path / "s").exists()


@pytest.mark.slow
def test_log_private_stats_flag_logs_the_unnoised_loss_and_says_so(tmp_path, capsys):
    cfg = tmp_path / "dp.toml"
    cfg.write_text('name = "dp"\n[data]\nsource = "shakespeare"\nmax_examples_per_user = 4\n[vocab]\nsize = 100\nseq_len = 8\n[task]\nkind = "nwp"\nmodel = "tiny"\n'
                   '[training]\nbatch_size = 32\nsteps = 2\neval_every = 2\ncheckpoint_every = 2\n'
                   '[privacy]\nclip_norm = 1.0\nnoise_multiplier = 1.0\ndelta = 1e-5\n')
    rows = {}
    for flag, out in (([], "quiet"), (["--log-private-stats"], "logged")):
        assert main(["train", "central", str(cfg), "--out", str(tmp_path / out), "--json", *flag]) == 0
        summary = json.loads(capsys.readouterr().out)
        rows[out] = [json.loads(line) for line in (tmp_path / out / "metrics.jsonl").read_text().splitlines() if '"train"' in line][-1]
        assert ("private statistics logged" in summary["guarantee"]) == bool(flag)
        assert "data.max_examples_per_user = 4" in summary["guarantee"]  # epsilon is about the filtered data (example level)
        assert "the memorization audit's files (canaries.json" in summary["guarantee"]  # exact statistics of the training data
        assert not [k for k in summary if k.endswith("unigram_perplexity")]  # an exact function of the training words' counts
    assert "loss" not in rows["quiet"] and rows["quiet"]["noised_update_norm"] > 0
    assert rows["logged"]["loss"] > 0 and rows["logged"]["epsilon"] == rows["quiet"]["epsilon"]


def test_inspect_prints_data_as_text_not_markup(tmp_path, capsys):
    """A note naming '[deleted]' (and a file name in brackets) is printed as written: rich markup
    would drop the bracketed word."""
    p = tmp_path / "[reddit].jsonl"
    p.write_text("".join(json.dumps({"author": a, "body": "good coffee"}) + "\n" for a in ["[deleted]", "ada", "[deleted]"]), encoding="utf-8")
    assert main(["data", "inspect", str(p), "-o", "user_column=author", "-o", "text_column=body"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "'[deleted]' (2)" in out and "[reddit].jsonl (text)" in out


def test_ctrl_c_in_a_command_exits_130_and_says_so(monkeypatch, capsys):
    """Typer turns a KeyboardInterrupt into Exit(130), which non-standalone mode returns instead of
    raising: the command used to exit 0 with no word, as if it had finished."""
    import fedpriv.runner.checks as checks

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(checks, "check_file", interrupted)
    assert main(["config", "check", "experiments/demo.toml", "--static"]) == 130
    assert "fedpriv: interrupted" in capsys.readouterr().err


def test_sigterm_in_a_command_exits_143_and_says_how_to_resume(monkeypatch, capsys):
    """A job scheduler's SIGTERM used to end a run with status -15 and no word; it now stops the
    command as Ctrl-C does (an exception where it was) and says so."""
    import os
    import signal

    import fedpriv.cli as cli
    import fedpriv.runner.checks as checks

    def terminated(*_a, **_k):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("the handler raises before this line")

    monkeypatch.setattr(cli, "_sigterm_received", False)
    monkeypatch.setattr(checks, "check_file", terminated)
    before = signal.signal(signal.SIGTERM, cli._on_sigterm)
    try:
        assert main(["config", "check", "experiments/demo.toml", "--static"]) == 143
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)
    assert "fedpriv: terminated (SIGTERM); a training run resumes from its last checkpoint when the same command runs again" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before  # (restored above; the handler had set SIG_IGN against a second one)


def test_rays_sigterm_exit_is_read_as_sigterm(monkeypatch, capsys):
    """A Flower simulation's ray.init installs a SIGTERM handler that calls sys.exit(15): the
    command still says it was terminated and exits 143 (not 15 through the teardown)."""
    import fedpriv.cli as cli
    import fedpriv.runner.checks as checks

    def ray_handler(*_a, **_k):
        raise SystemExit(15)

    monkeypatch.setattr(cli, "_sigterm_received", False)
    monkeypatch.setattr(checks, "check_file", ray_handler)
    assert main(["config", "check", "experiments/demo.toml", "--static"]) == 143
    assert "fedpriv: terminated (SIGTERM)" in capsys.readouterr().err


def test_the_command_exits_with_mains_status_and_freezes_what_is_left(monkeypatch):
    """`fedpriv` is `console()`: main's status as the exit status, and the objects still alive
    frozen out of the cyclic collector first (its shutdown passes over a million-user corpus took
    19 s); main() itself freezes nothing, since tests call it in one process."""
    import gc

    import fedpriv.cli as cli

    import signal

    monkeypatch.setattr(cli, "main", lambda: 3)
    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as e:
            cli.console()
        assert e.value.code == 3 and gc.get_freeze_count() > 0
        assert signal.getsignal(signal.SIGTERM) is cli._on_sigterm
    finally:
        gc.unfreeze()
        signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize("status", [130, 143])
def test_an_interrupted_command_runs_the_exit_handlers_and_skips_the_teardown(monkeypatch, status):
    """Interrupted while XLA still ran dispatched work, the interpreter's teardown aborted the
    process (status 134, "double free or corruption") in 4 of 6 tries on a quick federated run;
    console() now runs the exit handlers (a spill's folder is removed there) and leaves with
    os._exit. (The real race is checked by hand: 8 of 8 clean after, docs/reliability.md.)"""
    import atexit
    import gc
    import os
    import signal

    import fedpriv.cli as cli

    calls: list = []

    def leave(code):
        calls.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(cli, "main", lambda: status)
    monkeypatch.setattr(atexit, "_run_exitfuncs", lambda: calls.append("exit handlers"))
    monkeypatch.setattr(os, "_exit", leave)
    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as e:
            cli.console()
    finally:
        gc.unfreeze()
        signal.signal(signal.SIGTERM, before)
    assert e.value.code == status and calls == ["exit handlers", status]
