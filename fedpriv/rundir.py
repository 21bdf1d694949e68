"""The one owner of a run directory's files: every name, and how each is read and written.

A run directory is self-describing: what a later stage needs (an audit, a report, a run that
starts from this one, an embedding space) is read from these files, never by replaying the
pipeline that made them::

    config.json            what the trainer ran: {"experiment": the resolved ExperimentConfig, ...}
    run-config.json        the resolved config a run store wrote before training (fedpriv run)
    metrics.jsonl          one JSON object per train row and per evaluation ("step", "split", ...)
    checkpoint.json        the last checkpoint's metadata ("step", "kind", ...), naming
    checkpoint-<step>.msgpack   the state (parameters, optimizer, clip state) as msgpack
    params.msgpack         the final parameters (written when the run ends, or stops at its budget or
                           its utility target)
    params-<step>.msgpack  parameters saved at an evaluation along training (audit.along)
    audit-<step>.json      the audit of those parameters
    privacy_ledger.json    the DP events recorded so far (:class:`fedpriv.privacy.ledger.PrivacyLedger`)
    canaries.json          the planted canaries (:class:`fedpriv.memorization.canaries.Manifest`)
    audit_canaries.json    the empirical audit's canaries and which are members
    empirical.json         the empirical privacy audit: lower bounds on epsilon from those canaries
    privatize.json         the [privatize] stage: mechanism, parameters, embeddings, guarantee
    data.json              what preparing the data decided on its own: notes, examples cut per split
    vocab.json             an NWP run's word vocabulary (:class:`fedpriv.vocab.word.WordVocab`)
    tokenizer.json         a BERT run's tokenizer (and its vocabulary's released record)
    vocabulary.json        the full record of a vocabulary the run learned (raw-data figures included)
    audit.json, audit.md   the memorization audit
    summary.json           written last by a run store: the run is complete

A run store (``fedpriv run``) is a directory of run directories plus ``experiment.json`` and, for
an experiment's ``[[measure]]`` entries, ``measure/NAME/measure.json`` and ``deniability.png``.

Checkpoints are written safely: the state goes to ``checkpoint-<step>.msgpack`` first (msgpack of
the arrays, flax.serialization, never pickle), then ``checkpoint.json`` naming it replaces the old
one atomically, then older state files are removed; a crash at any point leaves the previous
checkpoint or the new one, whole. JSON files are written atomically too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from flax import serialization

from fedpriv.config import ExperimentConfig, validate_config
from fedpriv.errors import DataFormatError, FedprivError
from fedpriv.jsonio import read_json, write_json_atomic

CONFIG = "config.json"
RUN_CONFIG = "run-config.json"
METRICS = "metrics.jsonl"
CHECKPOINT = "checkpoint.json"
PARAMS = "params.msgpack"
LEDGER = "privacy_ledger.json"
CANARIES = "canaries.json"
EMPIRICAL_CANARIES = "audit_canaries.json"
EMPIRICAL = "empirical.json"
PRIVATIZE = "privatize.json"
DATA = "data.json"
WORD_VOCAB = "vocab.json"
TOKENIZER = "tokenizer.json"
VOCABULARY = "vocabulary.json"
AUDIT_JSON, AUDIT_MD = "audit.json", "audit.md"


def along_audit(step: int) -> str:
    """The audit of the parameters saved after ``step`` steps or rounds (``audit-<step>.json``)."""
    return f"audit-{int(step)}.json"

SUMMARY = "summary.json"
#: A run store's record of its experiment (every run's name, kind and resolved config).
EXPERIMENT = "experiment.json"
#: A run store's learning-rate trials (``tune/GROUP/<i>/``) and their records (``tune/GROUP.json``).
TUNE_DIR = "tune"
#: A run store's ``[[measure]]`` results: ``measure/NAME/measure.json`` and its plot.
MEASURE_DIR, MEASURE_FILE, PLOT_FILE = "measure", "measure.json", "deniability.png"


def measure_dir(store: str | os.PathLike[str], name: str) -> Path:
    """Where the ``[[measure]]`` entry ``name`` of a run store is written."""
    return Path(store) / MEASURE_DIR / name


class RunDir:
    """A run directory: ``RunDir(path).file(name)`` and one reader/writer per file."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def file(self, name: str) -> Path:
        return self.path / name

    def has(self, name: str) -> bool:
        return (self.path / name).is_file()

    def create(self) -> "RunDir":
        self.path.mkdir(parents=True, exist_ok=True)
        return self

    # ---- JSON files ------------------------------------------------------------------------------
    def write_json(self, name: str, obj: Any, indent: int | None = None) -> Path:
        return write_json_atomic(self.path / name, obj, indent=indent)

    def read_json(self, name: str, what: str | None = None) -> Any:
        return read_json(self.path / name, what or name)

    # ---- config.json: what the trainer ran ------------------------------------------------------
    def write_config(self, meta: dict[str, Any]) -> None:
        """``config.json``: ``meta`` holds ``experiment`` (the resolved config) and the trainer's facts."""
        (self.path / CONFIG).write_text(json.dumps(meta, indent=1))

    def experiment_config(self) -> ExperimentConfig:
        """The resolved experiment config the run was trained with (``config.json``)."""
        path = self.path / CONFIG
        try:
            meta = json.loads(path.read_text())
        except FileNotFoundError:
            raise FedprivError(f"{self.path}: not a run directory (no {CONFIG}); train first with fedpriv train") from None
        except ValueError as e:
            raise FedprivError(f"{path}: unreadable ({e})") from None
        if "experiment" not in meta:
            raise FedprivError(f"{path}: no experiment config recorded; retrain with this version of fedpriv")
        return validate_config(meta["experiment"], str(path))

    # ---- metrics.jsonl --------------------------------------------------------------------------
    def append_metrics(self, row: dict[str, Any]) -> None:
        with open(self.path / METRICS, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def truncate_metrics(self, step: int) -> None:
        """Keep the rows up to ``step`` (a resumed run writes the rest again)."""
        path = self.path / METRICS
        if not path.exists():
            return
        keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
        tmp = path.with_name(path.name + ".partial")
        tmp.write_text("".join(line + "\n" for line in keep))
        os.replace(tmp, path)

    def clear_metrics(self) -> None:
        (self.path / METRICS).unlink(missing_ok=True)

    def metrics(self) -> list[dict[str, Any]]:
        path = self.path / METRICS
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    # ---- checkpoints --------------------------------------------------------------------------------
    def save_checkpoint(self, state: Any, meta: dict[str, Any]) -> None:
        """Write ``state`` (a pytree of arrays) and ``meta`` (JSON-able, must hold ``step``)."""
        d = self.create().path
        name = f"checkpoint-{int(meta['step'])}.msgpack"
        tmp = d / (name + ".partial")
        tmp.write_bytes(serialization.to_bytes(state))
        os.replace(tmp, d / name)
        write_json_atomic(d / CHECKPOINT, {**meta, "state_file": name}, indent=1)
        for old in d.glob("checkpoint-*.msgpack"):
            if old.name != name:
                old.unlink(missing_ok=True)

    def checkpoint_meta(self) -> dict[str, Any] | None:
        """The last checkpoint's metadata, or None when there is none."""
        path = self.path / CHECKPOINT
        if not path.is_file():
            return None
        try:
            meta = json.loads(path.read_text())
            int(meta["step"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DataFormatError(path, None, f"unreadable checkpoint ({e}); delete the directory to start over") from None
        return meta

    def load_checkpoint(self, template: Any) -> tuple[Any, dict[str, Any]] | None:
        """``(state, meta)`` of the last checkpoint, or None. ``template``: a state of the same
        structure (fresh parameters and optimizer state)."""
        meta = self.checkpoint_meta()
        if meta is None:
            return None
        try:
            state = serialization.from_bytes(template, (self.path / meta["state_file"]).read_bytes())
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DataFormatError(self.path / CHECKPOINT, None, f"unreadable checkpoint ({e}); delete the directory to start over") from None
        return state, meta

    # ---- parameters -------------------------------------------------------------------------------
    def write_params(self, params: Any) -> None:
        tmp = self.path / (PARAMS + ".partial")
        tmp.write_bytes(serialization.to_bytes(params))
        os.replace(tmp, self.path / PARAMS)

    def has_params(self) -> bool:
        return self.has(PARAMS)

    def write_snapshot(self, step: int, params: Any) -> None:
        """Parameters after ``step`` steps or rounds, kept for an audit along training."""
        name = f"params-{int(step)}.msgpack"
        tmp = self.path / (name + ".partial")
        tmp.write_bytes(serialization.to_bytes(params))
        os.replace(tmp, self.path / name)

    def snapshot_steps(self) -> list[int]:
        """Steps with saved parameters (:meth:`write_snapshot`), in order."""
        steps = []
        for p in self.path.glob("params-*.msgpack"):
            tail = p.name[len("params-") : -len(".msgpack")]
            if tail.isdigit():
                steps.append(int(tail))
        return sorted(steps)

    def load_snapshot(self, step: int, template: Any) -> Any:
        path = self.path / f"params-{int(step)}.msgpack"
        try:
            return serialization.from_bytes(template, path.read_bytes())
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DataFormatError(path, None, f"unreadable parameters ({e})") from None

    def read_params_tree(self) -> Any:
        """The final parameters as a raw nested dict of arrays (no template needed)."""
        path = self.path / PARAMS
        try:
            return serialization.msgpack_restore(path.read_bytes())
        except FileNotFoundError:
            raise FedprivError(f"{self.path}: no final parameters ({PARAMS}); finish the run first") from None
        except Exception as e:  # msgpack raises several unrelated types on damaged input
            raise FedprivError(f"{path}: unreadable parameters ({type(e).__name__}: {e})") from None

    def load_params(self, template: Any) -> tuple[Any, str]:
        """The final parameters, else the last checkpoint's: ``(params, where from)``."""
        if self.has_params():
            return serialization.from_bytes(template, (self.path / PARAMS).read_bytes()), "final parameters"
        meta = self.checkpoint_meta()
        if meta is not None:
            raw = serialization.msgpack_restore((self.path / meta["state_file"]).read_bytes())
            return serialization.from_state_dict(template, raw["params"]), f"checkpoint at step {meta['step']} (the run is unfinished)"
        raise FedprivError(f"{self.path}: no parameters (neither {PARAMS} nor a checkpoint)")

    # ---- the run store's files ------------------------------------------------------------------
    def has_summary(self) -> bool:
        return self.has(SUMMARY)

    def summary(self) -> dict[str, Any]:
        return self.read_json(SUMMARY, "run summary")

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json_atomic(self.path / SUMMARY, summary)

    def audit_summary(self) -> dict[str, Any] | None:
        return self.read_json(AUDIT_JSON, "audit")["summary"] if self.has(AUDIT_JSON) else None
