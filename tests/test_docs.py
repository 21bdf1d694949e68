"""The code blocks of the docs run as written: docs/custom_tasks.md's task, a package outside
fedpriv, runs through its Python example and (slow) through every command the page lists."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).parent.parent / "docs"
FEDPRIV_ROOT = Path(__file__).resolve().parent.parent


def blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", path.read_text(), flags=re.S)


def write_plugin(root: Path) -> tuple[Path, Path, Path]:
    """The page's package (``src/mytasks``), config and experiment, written under ``root``."""
    module, example = blocks(DOCS / "custom_tasks.md", "python")
    tomls = blocks(DOCS / "custom_tasks.md", "toml")
    config = next(t for t in tomls if t.startswith('name = "unigram"'))
    runs = next(t for t in tomls if t.startswith("[[runs]]"))
    pkg = root / "src" / "mytasks"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "unigram.py").write_text(module)
    work = root / "work"
    work.mkdir()
    (work / "unigram.toml").write_text(config)
    (work / "unigram-runs.toml").write_text(config + "\n" + runs)
    return root / "src", work, Path(example)


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    src, work, _ = write_plugin(tmp_path)
    monkeypatch.syspath_prepend(str(src))
    yield src, work
    for name in [m for m in sys.modules if m.startswith("mytasks")]:
        del sys.modules[name]


def test_custom_task_python_example_runs(plugin, capsys, monkeypatch):
    src, work = plugin
    (example,) = blocks(DOCS / "custom_tasks.md", "python")[1:]
    monkeypatch.chdir(work)
    namespace: dict = {}
    exec(compile(example, "docs/custom_tasks.md", "exec"), namespace)
    # A unigram model fit to Shakespeare: far better than uniform over 2,004 ids.
    assert namespace["result"].final_eval["perplexity"] < 600
    assert "held-out perplexity of the unigram task" in capsys.readouterr().out
    assert (work / "runs" / "unigram-example" / "metrics.jsonl").is_file()
    # Run again (a notebook cell re-run): the finished run resumes and gives the same result.
    first = namespace["result"]
    exec(compile(example, "docs/custom_tasks.md", "exec"), namespace)
    assert namespace["result"].final_eval == first.final_eval and namespace["result"].history == first.history


def test_custom_task_config_prepares_with_its_notes(plugin):
    """The page's config builds the plugged task; the examples cut to seq_len are counted exactly."""
    from fedpriv.config import load_config
    from fedpriv.runner.prepare import prepare

    _, work = plugin
    said: list[str] = []
    p = prepare(load_config(work / "unigram.toml"), said.append)
    assert type(p.task).__name__ == "UnigramTask" and p.canaries is not None
    longer = [len(e.words()) - 12 for e in p.train.records() if len(e.words()) > 12]
    cut = p.data["cut"]["training"]
    words_in = sum(len(e.words()) for e in p.train.records())
    assert cut == {"examples": p.train.num_examples, "cut": len(longer), "words": sum(longer), "words_in": words_in, "pieces_in": None}
    line = f"note: vocab.seq_len = 12 words: {len(longer):,} of {p.train.num_examples:,} training examples"
    assert sum(m.startswith(line) for m in said) == 1
    assert line.removeprefix("note: ") in (DOCS / "custom_tasks.md").read_text().replace("\n", " "), "the page quotes this log line"


def fedpriv_commands() -> list[list[str]]:
    (bash,) = blocks(DOCS / "custom_tasks.md", "bash")
    return [shlex.split(line) for line in bash.splitlines() if line.startswith("fedpriv ")]


@pytest.mark.slow
def test_custom_task_runs_through_every_command(tmp_path):
    """The page's package, outside fedpriv and on PYTHONPATH only, through config check, central
    training, audit, federated training on both engines and ``fedpriv run --only``, as the installed
    command runs them (a subprocess each; stderr a file, as a CI log is)."""
    src, work, _ = write_plugin(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(FEDPRIV_ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("FEDPRIV_VERBOSE", None)
    done = []
    for args in fedpriv_commands():
        json_out = ["--json"] if args[1] in ("train", "audit") else []
        res = subprocess.run([sys.executable, "-m", "fedpriv.cli", *args[1:], *json_out], cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, (args, res.stderr[-3000:])
        done.append((args[1:3], res))
    out = {" ".join(a): r.stdout for a, r in done if a[0] != "train" or a[1] == "central"}
    assert "2 runs: central, fedavg" in out["config check"]
    central = json.loads(out["train central"])
    assert central["task"] == "unigram" and central["steps"] == 40 and central["final_perplexity"] < 2000
    assert any(n.startswith("vocab.seq_len = 12 words:") for n in central["notes"])
    audit = json.loads(out["audit runs/unigram-central"])
    assert audit["task"] == "unigram" and audit["settings"]["rs_candidates"] == 1000
    assert audit["summary"]["total"]["canaries"] == 2 and all(r["rs_candidates"] == 1000 for r in audit["canaries"])
    assert [json.loads(r.stdout)["engine"] for a, r in done if a == ["train", "federated"]] == ["vectorized", "flower"]
    runs = work / "runs"
    vec = json.loads((runs / "unigram-vectorized" / "data.json").read_text())
    assert vec["cut"]["training"]["cut"] > 0
    finals = {}
    for engine in ("vectorized", "flower"):
        rows = [json.loads(line) for line in (runs / f"unigram-{engine}" / "metrics.jsonl").read_text().splitlines()]
        finals[engine] = [r for r in rows if r["split"] == "heldout"][-1]["perplexity"]
    assert finals["flower"] == pytest.approx(finals["vectorized"], rel=1e-4)  # the same rounds on both engines
    store = runs / "unigram-store"
    assert (store / "central" / "summary.json").is_file() and not (store / "fedavg").exists()
    summary = json.loads((store / "central" / "summary.json").read_text())
    assert summary["audit"]["total"]["canaries"] == 2 and any("vocab.seq_len" in n for n in summary["data_notes"])
    # Quiet logs: no known-harmless third-party message, no colour code in a file.
    for _, res in done:
        for noise in ("os.fork()", "FutureWarning", "Manually terminating", "_compute_log_a_frac", "DEPRECATED FEATURE", "\x1b["):
            assert noise not in res.stderr, (noise, res.stderr[-2000:])
