"""Bad input through every command: each file of the corpus (tests/reliability/corpus) goes
through ``config check``, ``train``, ``run`` and ``data inspect``. Each must end with exit code 2
and one line on stderr (``fedpriv: error: ...``, never "internal error"), write nothing outside
the output folder (``runs/`` under the working directory), and leave the corpus as it was.
``config check`` and ``train`` must print the same line: they run the same validation.
"""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

import pytest

from fedpriv.cli import main

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
    """Every file under ``root`` with a digest of its bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).digest() for p in sorted(root.rglob("*")) if p.is_file()}


def _kind(path: Path) -> str:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
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
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
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
        assert _refused(_args("config check", path), tmp_path / "b", capsys, monkeypatch) == line  # one validation
    assert str(path) in line, line  # the message names the file
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


def test_the_corpus_lists_every_file_and_the_docs_list_the_corpus():
    assert sorted(CONFIGS) == sorted(p.name for p in (CORPUS / "configs").iterdir())
    assert sorted(DATA) == sorted(p.name for p in (CORPUS / "data").iterdir())
    doc = (Path(__file__).parents[1] / "docs" / "reliability.md").read_text()
    missing = [n for n in [*CONFIGS, *DATA] if f"`{n}`" not in doc]
    assert not missing, f"docs/reliability.md does not list {missing}"
