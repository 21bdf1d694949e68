"""Bad input through every command: each file of the corpus (tests/reliability/corpus) goes
through ``config check``, ``train``, ``run`` and ``data inspect``. Each must end with exit code 2
and one line on stderr (``fedpriv: error: ...``, never "internal error"), write nothing outside
the output folder (``runs/`` under the working directory), and leave the corpus as it was.
``config check`` and ``train`` must print the same line: they run the same validation.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import signal
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedpriv.cli import main
from fedpriv.errors import DataFormatError
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.rundir import CHECKPOINT, CONFIG, DATA as DATA_RECORD, EMPIRICAL, FAILED, LEDGER, LOCK, METRICS, SUMMARY, RunDir, along_audit

CORPUS = Path(__file__).parent / "reliability" / "corpus"
CONFIGS = tomllib.loads((CORPUS / "configs.toml").read_text())
DATA = tomllib.loads((CORPUS / "data.toml").read_text())
ESCAPES = [Path("/tmp/fedpriv-escape"), Path("/tmp/fedpriv-escape-run")]

#: A valid config whose source is replaced by each data file of the corpus.
DATA_CONFIG = """name = "bad-data"
[data]
source = {source}
options = {options}
heldout_fraction = 0.0
[vocab]
size = 50
seq_len = 8
[task]
kind = "{kind}"
model = "tiny"
[training]
batch_size = 1
steps = 2
"""


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with a digest of its bytes; the lock files of run directories
    (``.fedpriv.lock``: who holds the folder, left for the OS lock to reuse) are not data."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).digest() for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".fedpriv.lock"}


def _kind(path: Path) -> str:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        return "central"
    return "federated" if "federated" in raw and "runs" not in raw else "central"


def _args(command: str, path: Path, options: dict | None = None) -> list[str]:
    if command == "config check":
        return ["config", "check", str(path)]
    if command == "train":
        return ["train", _kind(path), str(path), "--json"]
    if command == "run":
        return ["run", str(path), "--json", "--no-report"]
    return ["data", "inspect", str(path), "--json", *(a for k, v in (options or {}).items() for a in ("-o", f"{k}={v}"))]


def _refused(command: list[str], tmp_path: Path, capsys, monkeypatch) -> str:
    """Run ``command`` in a fresh working directory under ``tmp_path``: it must exit 2 with one
    stderr line and write nothing outside ``runs/`` there. Returns that line."""
    work = tmp_path / "work"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    before = _tree(tmp_path)
    code = main(command)
    err = capsys.readouterr().err
    assert code == 2, (code, err)
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("fedpriv: error: ") and "internal error" not in err and "Traceback" not in err, err
    after = {k: v for k, v in _tree(tmp_path).items() if not k.startswith("work/runs/")}
    assert after == before, sorted(set(after) ^ set(before))
    assert not any(p.exists() for p in ESCAPES)
    return err.strip()


def _is_experiment(path: Path) -> bool:
    try:
        return "runs" in tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        return False


@pytest.mark.parametrize("command", ["config check", "train", "run", "data inspect"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_bad_config_is_refused_by_every_command(name, command, tmp_path, capsys, monkeypatch):
    """Its trainer (train for a config, run for an experiment file) prints config check's line."""
    entry = CONFIGS[name]
    path = CORPUS / "configs" / name
    digest = _tree(path) if path.is_dir() else hashlib.sha256(path.read_bytes()).digest()
    trainer = "run" if _is_experiment(path) else "train"
    if command == "config check" and entry.get("trains"):
        assert main(["config", "check", str(path)]) == 0, capsys.readouterr().err  # fine until it trains
        return
    line = _refused(_args(command, path), tmp_path / "a", capsys, monkeypatch)
    if command in ("config check", trainer):
        assert entry["expect"] in line, line
    if command == trainer and not entry.get("trains"):
        other = _refused(_args("config check", path), tmp_path / "b", capsys, monkeypatch)
        assert other.replace(str(tmp_path / "b"), str(tmp_path / "a")) == line  # one validation (a message may name the working directory)
    assert str(path) in line or entry.get("trains"), line  # the message names the file (a diverged run: its run directory)
    assert (_tree(path) if path.is_dir() else hashlib.sha256(path.read_bytes()).digest()) == digest


def _checked_and_trained(path: Path, tmp_path: Path, capsys, monkeypatch) -> str:
    """config check and train of ``path`` refuse it with the same line (one validation)."""
    lines = [_refused(_args(c, path), tmp_path / c.replace(" ", "-"), capsys, monkeypatch) for c in ("config check", "train")]
    assert lines[0] == lines[1]
    return lines[0]


@pytest.mark.parametrize("command", ["config check + train", "run", "data inspect"])
@pytest.mark.parametrize("name", sorted(DATA))
def test_every_bad_data_file_is_refused_by_every_command(name, command, tmp_path, capsys, monkeypatch):
    entry = DATA[name]
    data = CORPUS / "data" / name
    digest = hashlib.sha256(data.read_bytes()).digest()
    options = entry.get("options", {})
    if command == "data inspect":
        path = data
    else:
        kind = "ner" if name.endswith(".conll") or "tags_column" in options else "nwp"
        inline = "{ " + ", ".join(f'{k} = "{v}"' for k, v in options.items()) + " }"
        text = DATA_CONFIG.format(source=f'"{data}"', options=inline, kind=kind)
        if command == "run":
            text += '\n[[runs]]\nname = "r"\nkind = "central"\n'
        path = tmp_path / "config" / "bad-data.toml"
        path.parent.mkdir()
        path.write_text(text)
    if command == "config check + train":
        line = _checked_and_trained(path, tmp_path, capsys, monkeypatch)
    else:
        line = _refused(_args(command, path, options), tmp_path, capsys, monkeypatch)
    assert entry["expect"] in line, line
    assert hashlib.sha256(data.read_bytes()).digest() == digest


# ---- issue 31: config paths the corpus cannot hold (a FIFO, a device, a huge, deep or unreadable file) ----
@contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Fail instead of hanging: SIGALRM raises inside a blocked open or an endless read."""

    def fail(*_: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _special_config(case: str, where: Path, monkeypatch) -> tuple[Path, str]:
    """The path of a config of kind ``case`` made under ``where``, and the message it must get."""
    valid = (CORPUS / "configs" / "lr-nan.toml").read_text()
    if case == "fifo":
        path = where / "config.toml"
        os.mkfifo(path)
        return path, "not a regular file (a FIFO, a device or a socket); give a TOML file"
    if case == "device":
        return Path("/dev/zero"), "not a regular file (a FIFO, a device or a socket); give a TOML file"
    if case == "huge":
        path = where / "config.toml"
        path.write_text(valid + "# padding\n" * 110_000)
        return path, "larger than 1,048,576 bytes, the most a config file may hold"
    if case == "deep-json":
        path = where / "config.json"
        path.write_text('{"name": ' + "[" * 5000 + "]" * 5000 + "}")
        return path, "arrays and objects nest more than 32 levels deep"
    path = where / "config.toml"  # unreadable: Click used to refuse it with its three-line usage error
    path.write_text(valid)
    path.chmod(0)
    if os.access(path, os.R_OK):  # root reads it anyway; what Click asks the kernel, answered as for a user
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if Path(p) == path and mode & os.R_OK else real(p, mode, *a, **k))
        return path, "training.learning_rate: Input should be a finite number"  # (root: read, then validated)
    return path, "cannot read (Permission denied)"


@pytest.mark.parametrize("command", ["config check", "train", "run"])
@pytest.mark.parametrize("case", ["fifo", "device", "huge", "deep-json", "unreadable"])
def test_a_config_that_is_not_a_small_readable_regular_file_is_refused_in_one_line(case, command, tmp_path, capsys, monkeypatch):
    """A FIFO used to block ``config check`` forever and /dev/zero to be read forever; a nested
    JSON config ended in RecursionError; an unreadable one got Click's usage error."""
    where = tmp_path / "in"
    where.mkdir()
    path, message = _special_config(case, where, monkeypatch)
    argv = {"config check": ["config", "check", str(path)], "train": ["train", "central", str(path), "--json"], "run": ["run", str(path), "--json", "--no-report"]}[command]
    if command == "run" and case == "deep-json":
        message = "TOML syntax error"  # (run reads experiment files, TOML only)
    if command == "run" and message.startswith("training.learning_rate"):
        message = "an experiment needs at least one [[runs]] entry"
    with _deadline(20):
        line = _refused(argv, tmp_path / "a", capsys, monkeypatch)
    assert line.startswith(f"fedpriv: error: {path}: ") and message in line, line


@pytest.mark.parametrize("empirical", [False, True])
def test_an_audit_that_cannot_write_its_files_is_refused_before_its_work(empirical, tmp_path, capsys, monkeypatch):
    """A read-only run directory: `audit` used to prepare the data and run every test, then fail
    to write. Now one line before any work (no progress line), and nothing written. Root writes
    into a read-only directory anyway; for it the target is a folder, which nobody can write."""
    from fedpriv.config import validate_config

    run = tmp_path / "run"
    cfg = validate_config({**VALID, "audit": {**VALID["audit"], "empirical": empirical, "empirical_canaries": 4}})
    RunDir(run).create().write_config({"experiment": cfg.model_dump()})
    target = run / (EMPIRICAL if empirical else "audit.md")
    if os.geteuid() == 0:
        target.mkdir()
        where = target
    else:
        run.chmod(0o555)
        where = run
    before = _tree(tmp_path)
    try:
        code = main(["audit", str(run), *(["--empirical"] if empirical else [])])
    finally:
        run.chmod(0o755)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"fedpriv: error: {where}: cannot write there (") and "into the run directory: make it writable first" in err, err
    assert _tree(tmp_path) == before


def test_the_corpus_lists_every_file_and_the_docs_list_the_corpus():
    assert sorted(CONFIGS) == sorted(p.name for p in (CORPUS / "configs").iterdir())
    assert sorted(DATA) == sorted(p.name for p in (CORPUS / "data").iterdir())
    doc = (Path(__file__).parents[1] / "docs" / "reliability.md").read_text()
    missing = [n for n in [*CONFIGS, *DATA] if f"`{n}`" not in doc]
    assert not missing, f"docs/reliability.md does not list {missing}"


# ---- fuzzing: random values anywhere in a config, random JSON anywhere in a run store --------------
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
VALID = {
    "name": "fuzz", "seed": 1,
    "data": {"source": "synthetic:users=20,examples=200", "heldout_fraction": 0.1, "options": {}},
    "vocab": {"size": 100, "seq_len": 12},
    "task": {"kind": "nwp", "model": "tiny", "options": {}},
    "training": {"optimizer": "adam", "learning_rate": 0.01, "batch_size": 8, "steps": 4},
    "privacy": {"clip_norm": 1.0, "noise_multiplier": 1.0, "delta": 1e-5, "accountant": "rdp"},
    "canaries": {"per_config": 1, "user_probabilities": [0.1], "example_probabilities": [0.5]},
    "audit": {"rs_candidates": 10, "extraction_examples": 5},
}
FEDERATED = {"rounds": 2, "clients_per_round": 4, "strategy": "dp-fedavg", "clip_norm": 0.5, "dp": {"noise_multiplier": 1.0, "delta": 1e-3}, "flower": {"num_supernodes": 2}}


def _paths(tree: dict, prefix: tuple = ()) -> list[tuple]:
    out = []
    for k, v in tree.items():
        out.append((*prefix, k))
        if isinstance(v, dict):
            out += _paths(v, (*prefix, k))
    return out


def _set(tree: Any, path: tuple, value: Any) -> Any:
    tree = copy.deepcopy(tree)
    node = tree
    for k in path[:-1]:
        node = node[k] if isinstance(node, dict) else node[int(k) % len(node)]
    if isinstance(node, list):
        node[int(path[-1]) % len(node)] = value
    else:
        node[path[-1]] = value
    return tree


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), federated=st.booleans())
def test_fuzzed_configs_are_accepted_or_refused_in_one_line(data, federated, tmp_path_factory, capsys):
    base = {**{k: v for k, v in VALID.items() if not (federated and k == "privacy")}, **({"federated": FEDERATED} if federated else {})}
    paths = _paths(base) + [("training", "bogus")] + ([("federated", "dp", "bogus")] if federated else [])
    path = data.draw(st.sampled_from(paths), label="key")
    raw = _set(base, path, data.draw(JSON_VALUES, label="value"))
    cfg = tmp_path_factory.mktemp("fuzz") / "config.json"
    cfg.write_text(json.dumps(raw))
    code = main(["config", "check", "--static", str(cfg)])
    err = capsys.readouterr().err
    assert code in (0, 2), err
    assert code == 0 or (err.count("\n") == 1 and err.startswith(f"fedpriv: error: {cfg}") and "internal error" not in err), err


STORE = Path(__file__).parent / "reliability" / "store"
STORE_FILES = ["experiment.json", "dp-sgd/summary.json", "dp-sgd/audit.json", "dp-fedavg/summary.json", "dp-fedavg/audit.json"]


def _json_paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _json_paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            out += _json_paths(v, (*prefix, i))
    return out


def _report_a_store_with(root: Path, name: str, where: tuple, value: Any, capsys) -> tuple[int, str]:
    """`fedpriv report` on a copy of STORE (under ``root``) whose ``name`` holds ``value`` at
    ``where``: its exit code and stderr, checked to be a report or one line, and to write nothing
    outside the store's report folder."""
    store = root / "store"
    shutil.copytree(STORE, store, ignore=shutil.ignore_patterns("privacy_ledger.json"))  # (ledgers: below; their curves take seconds)
    doc = json.loads((store / name).read_text())
    (store / name).write_text(json.dumps(value if not where else _set(doc, where, value)))
    before = _tree(root)
    code = main(["report", str(store)])
    err = capsys.readouterr().err
    assert code in (0, 2), err
    assert code == 0 or (err.count("\n") == 1 and "internal error" not in err), err
    assert {k: v for k, v in _tree(root).items() if not k.startswith("store/report/") and k != f"store/{LOCK}"} == before  # (report holds the store's lock)
    return code, err


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_run_store_files_are_reported_or_refused_in_one_line(data, tmp_path_factory, capsys):
    """`fedpriv report` on a store whose experiment.json, summary.json or audit.json holds a
    random JSON value somewhere: a report or one line, and nothing written outside the store."""
    name = data.draw(st.sampled_from(STORE_FILES), label="file")
    doc = json.loads((STORE / name).read_text())
    where = data.draw(st.sampled_from(_json_paths(doc)), label="path")
    _report_a_store_with(tmp_path_factory.mktemp("store"), name, where, data.draw(JSON_VALUES, label="value"), capsys)


@pytest.mark.parametrize("where, value, refused", [
    (("canaries", 0, "p_u_effective"), [], True),   # found by the fuzz test above: was a TypeError
    (("canaries", 0, "p_u_effective"), "0.1", True),
    (("canaries", 0, "p_u"), 0, False),              # a scaled p_u over a configured 0: labelled without a factor
    (("canaries", 0, "p_u_effective"), None, False),
])
def test_a_canary_rows_scaled_p_u_is_checked_before_it_is_formatted(where, value, refused, tmp_path, capsys):
    code, err = _report_a_store_with(tmp_path, "dp-sgd/audit.json", where, value, capsys)
    assert code == (2 if refused else 0), err
    if refused:
        assert "dp-sgd/audit.json" in err and "p_u_effective" in err, err


@pytest.mark.parametrize("value, refused", [
    (None, True),           # found by a sweep of the store files: the exposure plot takes int(insertions), was a TypeError
    (float("nan"), True),   # was a ValueError
    (float("inf"), True),   # was an OverflowError
    (2.5, True),            # a count
    ("missing", True),      # was a KeyError
    (0, False),
])
def test_a_canary_rows_insertions_are_a_count(value, refused, tmp_path, capsys):
    row = json.loads((STORE / "dp-sgd" / "audit.json").read_text())["canaries"][0]
    row = {k: v for k, v in row.items() if k != "insertions"} if value == "missing" else {**row, "insertions": value}
    code, err = _report_a_store_with(tmp_path, "dp-sgd/audit.json", ("canaries", 0), row, capsys)
    assert code == (2 if refused else 0), err
    if refused:
        assert "dp-sgd/audit.json" in err and "insertions" in err, err


@pytest.mark.parametrize("where, value, refused", [
    (("settings", "rs_candidates"), "abc", True),   # found by a sweep of the store files: the report's introduction formats it with ','
    (("settings", "rs_candidates"), "", True),      # (was a ValueError)
    (("settings", "rs_candidates"), None, False),
    (("settings", "rs_prefix"), [2], True),         # every other setting: a scalar, as before
])
def test_an_audits_settings_are_checked_before_they_are_formatted(where, value, refused, tmp_path, capsys):
    code, err = _report_a_store_with(tmp_path, "dp-sgd/audit.json", where, value, capsys)
    assert code == (2 if refused else 0), err
    if refused:
        assert "dp-sgd/audit.json" in err and f"settings.{where[-1]}" in err, err


@pytest.mark.parametrize("where, value, refused", [
    (("runs", 0, "config", "data"), [1], True),                          # was an AttributeError (has_public_split)
    (("runs", 0, "config", "data", "public_fraction"), "abc", True),     # was a ValueError
    (("runs", 0, "config", "data", "public_fraction"), [0.5], True),     # was a TypeError
    (("runs", 0, "config", "privacy", "accountant"), 5, True),           # the report's epsilon curves read it (run_accountant)
    (("runs", 1, "config", "federated", "dp"), [1], True),               # ditto: was an AttributeError with a ledger
    (("runs", 1, "config", "federated", "dp"), None, False),             # FedAvg without DP
])
def test_a_run_records_config_is_checked_where_the_report_reads_it(where, value, refused, tmp_path, capsys):
    """experiment.json: the keys of a run's config that the report reads (data.public_fraction,
    the accountant of [privacy] or [federated.dp]) are checked when the store record is read."""
    code, err = _report_a_store_with(tmp_path, "experiment.json", where, value, capsys)
    assert code == (2 if refused else 0), err
    if refused:
        assert "experiment.json" in err and ".".join(str(k) for k in where[2:]) in err.replace("[0]", "").replace("[1]", ""), err


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_fuzzed_run_directory_files_are_read_or_refused(data):
    """Checkpoint records, metrics rows, failure records, privacy ledgers, summaries, run configs,
    data records, empirical audits, audits along training and tuning records holding random JSON:
    read, or refused with a DataFormatError naming the file; never another exception."""
    import tempfile
    from types import SimpleNamespace

    from fedpriv.runner.tune import read_tuning

    with tempfile.TemporaryDirectory() as d:
        run = RunDir(d)
        which = data.draw(st.sampled_from(["checkpoint", "metrics", "failure", "ledger", "summary", "config", "data", "empirical", "along", "tuning"]), label="file")
        audit = json.loads((STORE / "dp-sgd" / "audit.json").read_text())
        template = {
            "checkpoint": {"step": 4, "kind": "central", "pending": [], "state_file": "checkpoint-4.msgpack"},
            "failure": {"reason": "x", "step": 1, "checkpoint_step": None},
            "ledger": json.loads((STORE / "dp-sgd" / "privacy_ledger.json").read_text()),
            "summary": json.loads((STORE / "dp-sgd" / "summary.json").read_text()),
            "metrics": {"step": 1, "split": "train", "loss": 1.0},
            "config": {"experiment": {"name": "x"}, "utility": ["accuracy_no_oov", "accuracy"]},
            "data": {"notes": ["a note"], "length_limit": "vocab.seq_len = 8 words", "cut": {"training": {"examples": 3, "cut": 1}}, "source": {}},
            "empirical": {"kind": "example", "unit": "example", "canaries": 10, "epsilon_lower_bound": 0.5, "delta": 1e-5, "members": 5, "accountant_epsilon": None},
            "along": {**audit, "step": 4},
            "tuning": {"group": "r", "keys": ["training.learning_rate"], "candidates": [{"values": {"training.learning_rate": 0.1}, "validation_utility": 0.2}],
                       "winner": {"training.learning_rate": 0.1}},
        }[which]
        where = data.draw(st.sampled_from(_json_paths(template)), label="path")
        value = data.draw(JSON_VALUES, label="value")
        doc = value if not where else _set(template, where, value)
        file = {"checkpoint": CHECKPOINT, "metrics": METRICS, "failure": FAILED, "ledger": LEDGER, "summary": SUMMARY, "config": CONFIG, "data": DATA_RECORD,
                "empirical": EMPIRICAL, "along": along_audit(4), "tuning": "tuning.json"}[which]
        Path(d, file).write_text(json.dumps(doc))
        read = {
            "checkpoint": run.checkpoint_meta, "metrics": run.metrics, "failure": run.failure,
            "ledger": lambda: PrivacyLedger.load(run.file(LEDGER)), "summary": run.summary, "config": run.utility, "data": run.data_record,
            "empirical": run.empirical, "along": lambda: run.along_audit(4),
            "tuning": lambda: read_tuning(run.file("tuning.json"), SimpleNamespace(name="r", tune={"training.learning_rate": [0.1, 0.3]})),
        }[which]
        try:
            read()
        except DataFormatError as e:
            assert file in str(e) and "\n" not in str(e)
