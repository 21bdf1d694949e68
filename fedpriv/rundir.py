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
    strategy.json          an optimized correlated-noise strategy (``coefficients = "optimized"``): what it was
                           optimized for and its coefficients, written before the first step and
                           read back on resume (:mod:`fedpriv.privacy.optimized`)
    canaries.json          the planted canaries (:class:`fedpriv.memorization.canaries.Manifest`)
    audit_canaries.json    the empirical audit's canaries and which are members
    empirical.json         the empirical privacy audit: lower bounds on epsilon from those canaries
    privatize.json         the [privatize] stage: mechanism, parameters, embeddings, guarantee
    data.json              what preparing the data decided on its own: notes, examples cut per split
    vocab.json             an NWP run's word vocabulary (:class:`fedpriv.vocab.word.WordVocab`)
    tokenizer.json         a BERT run's tokenizer (and its vocabulary's released record)
    vocabulary.json        the full record of a vocabulary the run learned (raw-data figures included)
    audit.json, audit.md   the memorization audit
    failed.json            the run failed (e.g. its loss became non-finite): why, and where; never reported
    summary.json           written last by a run store: the run is complete
    .fedpriv               the marker: this folder is a fedpriv run (or a store, or a vocabulary or
                           report folder); fedpriv writes only into empty folders or marked ones
    .fedpriv.lock          the lock: the process that writes the folder holds an exclusive OS lock
                           on it (:func:`hold`), and its pid and command are written inside

A run store (``fedpriv run``) is a directory of run directories plus ``experiment.json`` and, for
an experiment's ``[[measure]]`` entries, ``measure/NAME/measure.json`` and ``deniability.png``.

Checkpoints are written safely: the state goes to ``checkpoint-<step>.msgpack`` first (msgpack of
the arrays, flax.serialization, never pickle), then ``checkpoint.json`` naming it replaces the old
one atomically, then older state files are removed; a crash at any point leaves the previous
checkpoint or the new one, whole. JSON files are written atomically too.

Run state is tamper-evident against accidental or hand edits (not against a determined attacker
with write access, who can rewrite every digest): ``checkpoint.json`` records the step, its state
file ``checkpoint-<step>.msgpack`` and that file's SHA-256, the privacy ledger's step count and
digest, and (once the run ends) the digest of ``params.msgpack``; ``config.json`` records the
digests of the run's vocabulary files. Resume and audit check them against each other and refuse
a mismatch in one line. ``metrics.jsonl`` rows carry their step; a second row of one step and split
is refused. Run directories written before fedpriv recorded these are refused (train them again).

A run directory is data, not instructions: every file is checked for its shape when read (a
one-line :class:`~fedpriv.errors.DataFormatError` naming the file), a checkpoint names only a
state file of its own directory, a checkpoint or parameters of another model's shapes are
refused, and the config read back drops the loader options that would write files
(:data:`fedpriv.config.WRITE_OPTIONS`).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from flax import serialization

from fedpriv.config import ExperimentConfig, name_problem, validate_config
from fedpriv.errors import DataFormatError, FedprivError, RunDirInUse
from fedpriv.jsonio import json_text, read_json, sha256_bytes, sha256_file, write_bytes_atomic, write_json_atomic

CONFIG = "config.json"
RUN_CONFIG = "run-config.json"
METRICS = "metrics.jsonl"
CHECKPOINT = "checkpoint.json"
PARAMS = "params.msgpack"
LEDGER = "privacy_ledger.json"
STRATEGY = "strategy.json"
CANARIES = "canaries.json"
EMPIRICAL_CANARIES = "audit_canaries.json"
EMPIRICAL = "empirical.json"
PRIVATIZE = "privatize.json"
DATA = "data.json"
WORD_VOCAB = "vocab.json"
TOKENIZER = "tokenizer.json"
VOCABULARY = "vocabulary.json"
AUDIT_JSON, AUDIT_MD = "audit.json", "audit.md"
#: The marker that makes a folder fedpriv's (its JSON names the kind: run, store, vocab, report).
MARKER = ".fedpriv"
#: The lock file of a run directory or store (:func:`hold`).
LOCK = ".fedpriv.lock"
#: Files of a run whose digests ``config.json`` records (the vocabulary the model was trained with).
ASSET_FILES = (WORD_VOCAB, TOKENIZER)
#: What to tell the owner of a run directory written before fedpriv recorded digests and markers.
OLD_RUN_HINT = "written before fedpriv recorded digests of its run state, or edited by hand; train it again (--restart, or a new --out)"


def along_audit(step: int) -> str:
    """The audit of the parameters saved after ``step`` steps or rounds (``audit-<step>.json``)."""
    return f"audit-{int(step)}.json"

SUMMARY = "summary.json"
FAILED = "failed.json"
STATE_FILE = re.compile(r"^checkpoint-[0-9]+\.msgpack$")
#: Parameters along training and their audits (audit.along): ``params-<step>.msgpack``, ``audit-<step>.json``.
SNAPSHOT_FILE = re.compile(r"^params-([0-9]+)\.msgpack$")
ALONG_FILE = re.compile(r"^audit-[0-9]+\.json$")
#: Files a fresh start (``--restart``) removes: what training and the store wrote, never anything else.
RUN_FILES = (CONFIG, RUN_CONFIG, METRICS, CHECKPOINT, PARAMS, LEDGER, STRATEGY, AUDIT_JSON, AUDIT_MD, EMPIRICAL, SUMMARY, FAILED)
#: A run store's record of its experiment (every run's name, kind and resolved config).
EXPERIMENT = "experiment.json"
#: A run store's learning-rate trials (``tune/GROUP/<i>/``) and their records (``tune/GROUP.json``).
TUNE_DIR = "tune"
#: A run store's ``[[measure]]`` results: ``measure/NAME/measure.json`` and its plot.
MEASURE_DIR, MEASURE_FILE, PLOT_FILE = "measure", "measure.json", "deniability.png"


_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number", bool: "true or false", type(None): "null"}


class Obj:
    """The shape of a JSON object: ``fields`` (key -> shape, checked where present), ``required`` keys;
    ``or_null``: null is accepted too."""

    def __init__(self, fields: dict[str, Any], required: tuple[str, ...] = (), or_null: bool = False):
        self.fields, self.required, self.or_null = fields, required, or_null


class Each:
    """The shape of a JSON object with any keys, or of a list (``list_=True``), each value of ``shape``;
    ``or_null``: null is accepted too; ``fields``: keys of an object whose value has a shape of its own."""

    def __init__(self, shape: Any, list_: bool = False, or_null: bool = False, fields: dict[str, Any] | None = None):
        self.shape, self.list_, self.or_null, self.fields = shape, list_, or_null, fields or {}


def _is(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in types
    return isinstance(value, types)


def _shape_problem(obj: Any, shape: Any, where: str) -> str | None:
    """Where ``obj`` departs from ``shape`` (a tuple of types, Obj or Each), or None."""
    if isinstance(shape, tuple):
        if _is(obj, shape):
            return None
        want = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in shape)
        return f"{where or 'the file'} must be {want}, got {json.dumps(obj)[:40]}"
    if isinstance(shape, (Each, Obj)) and shape.or_null and obj is None:
        return None
    container = list if isinstance(shape, Each) and shape.list_ else dict
    if not isinstance(obj, container):
        return f"{where or 'the file'} must be {_TYPE_NAMES[container]}, got {json.dumps(obj)[:40]}"
    if isinstance(shape, Each):
        items = enumerate(obj) if shape.list_ else obj.items()
        for k, v in items:
            sub = shape.shape if shape.list_ else shape.fields.get(k, shape.shape)
            problem = _shape_problem(v, sub, f"{where}[{k!r}]" if shape.list_ else f"{where}.{k}".lstrip("."))
            if problem:
                return problem
        return None
    for k in shape.required:
        if k not in obj:
            return f"{where or 'the file'} has no {k!r}"
    for k, sub in shape.fields.items():
        if k in obj:
            problem = _shape_problem(obj[k], sub, f"{where}.{k}".lstrip("."))
            if problem:
                return problem
    return None


def expect_shape(obj: Any, path: str | os.PathLike[str], what: str, shape: Any) -> Any:
    """``obj`` when it has ``shape`` (see :class:`Obj`, :class:`Each`); else a one-line
    DataFormatError naming the file and the key."""
    problem = _shape_problem(obj, shape, "")
    if problem:
        raise DataFormatError(path, None, f"not {'an' if what[0] in 'aeiou' else 'a'} {what}: {problem}")
    return obj


NUM = (int, float)
NUM_OR_NULL = (int, float, type(None))
STR_OR_NULL = (str, type(None))
SCALAR = (int, float, str, bool, type(None))
#: An audit's memorized counts and exposures: overall, and by configuration.
AUDIT_TOTALS = Each(NUM_OR_NULL)
AUDIT_SUMMARY = Obj({"total": AUDIT_TOTALS, "by_configuration": Each(AUDIT_TOTALS)}, ("total",))
#: An empirical privacy audit (``empirical.json``): the bounds, the attack's statistics, the accountant's epsilon.
EMPIRICAL_SHAPE = Obj({
    "kind": (str,), "unit": (str,), "canaries": (int,), "score": (str,), "parameters": (str,), "epsilon_lower_bound": NUM,
    "epsilon_lower_bound_fdp": NUM, "epsilon_gdp_estimate": NUM, "tpr_at_fpr": NUM, "fpr": NUM, "auroc": NUM, "confidence": NUM,
    "delta": NUM, "members": (int,), "non_members": (int,), "accountant_epsilon": NUM_OR_NULL, "seconds": NUM,
    "member_score_mean": NUM, "non_member_score_mean": NUM,
}, ("kind", "unit", "canaries", "epsilon_lower_bound", "delta"))
#: What data preparation decided on its own (``data.json``).
DATA_SHAPE = Obj({"notes": Each((str,), list_=True), "length_limit": (str, int, float, type(None)), "cut": Each((dict,)), "source": (dict,)}, ("notes",))
#: A utility target's record in a summary (:func:`fedpriv.runner.summary.target_record`).
TARGET_SHAPE = Obj({"metric": (str,), "value": NUM, "split": (str,), "reached": (bool,), "at": (str,), "when": NUM_OR_NULL, "reached_value": NUM_OR_NULL},
                   ("metric", "value", "reached"))
CANARY_ROW = Obj({
    "id": (str, int), "p_u": NUM, "p_e": NUM, "p_u_effective": NUM_OR_NULL, "pattern": STR_OR_NULL, "sharers": NUM_OR_NULL,
    "insertions": (int,), "rs_memorized": (bool, type(None)), "bs_memorized": (bool, type(None)), "rs_rank": NUM_OR_NULL, "rank": NUM_OR_NULL,
    "exposure": NUM_OR_NULL, "exposure_extrapolated": NUM_OR_NULL, "rs_candidates": NUM_OR_NULL,
}, ("p_u", "p_e", "insertions"))  # (every audit writes its canaries' insertions; the exposure plot reads them)
AUDIT_SHAPE = Obj({
    "task": (str,), "parameters": (str,), "run_dir": (str,), "settings": Each(SCALAR, fields={"rs_candidates": NUM_OR_NULL}), "summary": AUDIT_SUMMARY,
    "canaries": Each(CANARY_ROW, list_=True), "extraction": Each(Each(NUM_OR_NULL), or_null=True),
}, ("summary",))
#: What the report and later stages read from ``summary.json`` (other keys are free-form).
SUMMARY_SHAPE = Obj({
    "name": (str,), "kind": (str,), "algorithm": (str,), "users": (str,), "order": (str,), "task": (str,), "engine": STR_OR_NULL,
    "data_source": (str,), "eval_source": STR_OR_NULL, "sampling": STR_OR_NULL,
    "epsilon": NUM_OR_NULL, "delta": NUM_OR_NULL, "guarantee": STR_OR_NULL,
    "client_epsilon": NUM_OR_NULL, "client_delta": NUM_OR_NULL, "client_guarantee": STR_OR_NULL,
    "batch_size": NUM_OR_NULL, "clients_per_round": NUM_OR_NULL, "steps": NUM_OR_NULL, "rounds": NUM_OR_NULL,
    "noise_multiplier_config": NUM_OR_NULL, "clip_norm": NUM_OR_NULL, "seconds": NUM_OR_NULL,
    "eval_split": STR_OR_NULL, "eval_accuracy": NUM_OR_NULL, "eval_perplexity": NUM_OR_NULL, "eval_f1": NUM_OR_NULL, "eval_loss": NUM_OR_NULL,
    "audit": Obj({"total": AUDIT_TOTALS, "by_configuration": Each(AUDIT_TOTALS)}), "privatize": Obj({"guarantee": STR_OR_NULL, "mechanism": STR_OR_NULL, "eta": NUM_OR_NULL, "t": NUM_OR_NULL}),
    "vocabulary": Obj({"source": STR_OR_NULL, "vocab_size": NUM_OR_NULL, "pieces_per_word": NUM_OR_NULL}), "starts_from": Each((str,)),
    "pieces_per_word": NUM_OR_NULL,
    "group": (str,), "seed": NUM_OR_NULL, "canary_seed": NUM_OR_NULL, "privacy_unit": STR_OR_NULL, "examples_per_user": NUM_OR_NULL,
    "utility_metric": STR_OR_NULL, "utility_label": STR_OR_NULL, "utility": NUM_OR_NULL, "degenerate": STR_OR_NULL,
    "target": TARGET_SHAPE, "empirical": EMPIRICAL_SHAPE, "along": Each(Each(NUM_OR_NULL), list_=True),
    "data_notes": Each((str,), list_=True), "tuned": Obj({"winner": (dict,), "metric": STR_OR_NULL, "record": (str,)}),
}, ("name", "kind"))
CHECKPOINT_SHAPE = Obj({"step": (int,), "kind": (str,), "pending": (list,), "state_file": (str,)}, ("step", "state_file"))
RUN_RECORD = Obj({
    "name": (str,), "kind": (str,), "group": STR_OR_NULL, "seed": NUM_OR_NULL, "tune": (dict,), "tune_fraction": NUM,
    # what the report reads of a run's config: a public split, the accountant of its epsilon
    "config": Obj({"data": Obj({"public_fraction": NUM_OR_NULL}, or_null=True), "privacy": Obj({"accountant": STR_OR_NULL}, or_null=True),
                   "federated": Obj({"dp": Obj({"accountant": STR_OR_NULL}, or_null=True)}, or_null=True)}),
}, ("name", "kind", "config"))
CONTRAST = Obj({"name": (str,), "a": (str,), "b": (str,)}, ("name", "a", "b"))
STORE_RECORD = Obj({"name": (str,), "runs": Each(RUN_RECORD, list_=True), "contrasts": Each(CONTRAST, list_=True),
                    "uncounted_choices": Each((str,), list_=True)}, ("name", "runs"))
#: ``tune/GROUP.json``: a group's learning-rate (or other key) choice on the validation users.
TUNING_SHAPE = Obj({
    "group": (str,), "keys": Each((str,), list_=True), "fraction": NUM, "split": (str,), "metric": (str, type(None)),
    "candidates": Each(Obj({"values": (dict,), "validation_utility": NUM, "run_dir": (str,)}, ("values", "validation_utility")), list_=True),
    "winner": (dict,),
}, ("group", "candidates", "winner"))
#: ``config.json``: the resolved experiment and the task's headline utility (metric name, label).
CONFIG_SHAPE = Obj({"experiment": (dict,), "utility": Each((str,), list_=True)})


def read_store_record(store: str | os.PathLike[str]) -> dict[str, Any]:
    """A run store's ``experiment.json``, checked: a name, and runs each with a name that names a
    directory of the store, a kind and a config."""
    path = Path(store) / EXPERIMENT
    exp = expect_shape(read_json(path, "experiment file"), path, "run store's experiment file", STORE_RECORD)
    for i, run in enumerate(exp["runs"]):
        problem = name_problem(run["name"])
        if problem:
            raise DataFormatError(path, f"runs[{i}]", f"run {problem}")
    return exp


def measure_dir(store: str | os.PathLike[str], name: str) -> Path:
    """Where the ``[[measure]]`` entry ``name`` of a run store is written."""
    return Path(store) / MEASURE_DIR / name


KINDS = {"run": "run directory", "store": "run store", "vocab": "vocabulary folder", "report": "report folder"}


def marker_kind(path: str | os.PathLike[str]) -> str | None:
    """The kind of fedpriv folder ``path`` is (``run``, ``store``, ``vocab``, ``report``) by its
    marker, or None (no marker, or an unreadable one)."""
    m = Path(path) / MARKER
    if m.is_symlink() or not m.is_file():
        return None
    try:
        kind = json.loads(m.read_text(encoding="utf-8")).get("fedpriv")
    except (OSError, ValueError, AttributeError):
        return None
    return kind if kind in KINDS else None


def claim(path: str | os.PathLike[str], kind: str, force: bool = False, create: bool = True) -> Path:
    """Make ``path`` a fedpriv folder of ``kind`` (see :data:`KINDS`), or refuse in one line.

    A missing or empty folder is made and marked; a folder marked ``kind`` is taken as it is; a
    folder of another fedpriv kind is always refused, and a non-empty folder without a marker
    (the user's files, or a run written before fedpriv marked its folders) is refused unless
    ``force`` (then it is marked). ``create`` False: only check (nothing is made or marked)."""
    path = Path(path)
    what = KINDS[kind]
    if path.exists() and not path.is_dir():
        raise FedprivError(f"{path}: exists and is not a directory; a {what} is a folder")
    have = marker_kind(path) if path.is_dir() else None
    if have == kind:
        return path
    if have is not None:
        raise FedprivError(f"{path}: is a fedpriv {KINDS[have]}, not a {what}; use another folder")
    if path.is_dir() and any(p.name not in (LOCK, MARKER + ".partial") for p in path.iterdir()) and not force:  # (a kill while marking)
        hint = "pass --force to write into it anyway, or choose" if kind in ("vocab", "report") else "choose"
        raise FedprivError(
            f"{path}: not empty and not a fedpriv {what} (no {MARKER} marker); fedpriv writes only into its own folders: "
            f"{hint} a new or empty folder (a folder fedpriv wrote before it marked its folders: train it again into a new one)"
        )
    if not create:
        return path
    path.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path / MARKER, {"fedpriv": kind, "note": f"this folder is a fedpriv {what}; fedpriv writes into it"})
    return path


#: Locks this process holds: real path -> [file descriptor, depth] (a process may take its own lock again).
_HELD: dict[str, list[int]] = {}


def _command() -> str:
    """This process's command line, as the user typed it (``python -m fedpriv.cli`` shows as ``fedpriv``)."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    if name in ("__main__.py", "-c"):
        name = "fedpriv"
    return " ".join([name, *sys.argv[1:]])[:300]


@contextmanager
def hold(path: str | os.PathLike[str], kind: str = "run", create: bool = True) -> Iterator[Path]:
    """Own the folder ``path`` (a run directory or store) while the block runs: :func:`claim` it
    (``create`` False: it must be a fedpriv folder of ``kind`` already, e.g. a run to audit), then take an exclusive OS advisory lock (``flock``) on its :data:`LOCK` file, which holds this
    process's pid and command. Another process holding it makes this one refuse at once, in one
    line naming that process. The OS releases the lock when the process exits, even on ``kill -9``."""
    if not create and marker_kind(path) != kind:
        why = "does not exist" if not Path(path).exists() else f"has no {MARKER} marker of a fedpriv {KINDS[kind]}"
        raise FedprivError(f"{path}: not a fedpriv {KINDS[kind]} ({why}; a folder fedpriv wrote before it marked its folders must be trained again)")
    path = claim(path, kind)
    key = os.path.realpath(path)
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield path
        finally:
            _HELD[key][1] -= 1
        return
    lock = path / LOCK
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = json.loads(os.read(fd, 4096).decode("utf-8"))
            who = f"pid {int(holder['pid'])} ({str(holder['command'])[:200]})"
        except (OSError, ValueError, KeyError, TypeError):
            who = "another process"
        os.close(fd)
        raise RunDirInUse(f"{path}: in use by {who}; wait until it ends, or use another --out") from None
    except BaseException:
        os.close(fd)
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "command": _command()}).encode("utf-8"), 0)
        _HELD[key] = [fd, 1]
        yield path
    finally:
        _HELD.pop(key, None)
        os.close(fd)  # releases the lock


def ledger_record(ledger: Any) -> dict[str, Any]:
    """What a checkpoint records of the privacy ledger it goes with: its step count and the digest
    of the exact file :meth:`fedpriv.privacy.ledger.PrivacyLedger.save` writes."""
    return {"steps": int(ledger.steps), "sha256": sha256_bytes(json_text(ledger.to_json(), indent=1).encode("utf-8"))}


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
        """Make (or take) the folder as a fedpriv run directory (:func:`claim`): a non-empty
        folder that is not one is refused."""
        claim(self.path, "run")
        return self

    def reset(self) -> None:
        """Start afresh: remove the files training and the store wrote (RUN_FILES, checkpoint
        states, parameters and audits along training, partial writes); nothing else in the directory is touched.
        Only a fedpriv run directory is cleared (:func:`claim` refuses any other non-empty folder)."""
        if not self.path.is_dir():
            return
        claim(self.path, "run")
        for name in RUN_FILES:
            (self.path / name).unlink(missing_ok=True)
        for p in self.path.iterdir():
            ours = any(r.match(p.name) for r in (STATE_FILE, SNAPSHOT_FILE, ALONG_FILE)) or p.name.endswith(".partial")
            if ours and p.is_file():
                p.unlink()

    # ---- JSON files ------------------------------------------------------------------------------
    def write_json(self, name: str, obj: Any, indent: int | None = None) -> Path:
        return write_json_atomic(self.path / name, obj, indent=indent)

    def read_json(self, name: str, what: str | None = None) -> Any:
        return read_json(self.path / name, what or name)

    # ---- config.json: what the trainer ran ------------------------------------------------------
    def write_config(self, meta: dict[str, Any]) -> None:
        """``config.json``: ``meta`` holds ``experiment`` (the resolved config) and the trainer's facts."""
        write_json_atomic(self.path / CONFIG, meta, indent=1)

    def config_meta(self) -> dict[str, Any] | None:
        """``config.json`` as written (None when there is none), checked to be a JSON object."""
        path = self.path / CONFIG
        if not path.is_file():
            return None
        meta = expect_shape(read_json(path, "run config"), path, "run config", CONFIG_SHAPE)
        if "utility" in meta and len(meta["utility"]) != 2:
            raise DataFormatError(path, None, "not a run config: utility must be [metric, label]")
        return meta

    def utility(self) -> tuple[str, str]:
        """The task's headline utility (metric, label) that ``config.json`` records (accuracy by default)."""
        meta = self.config_meta() or {}
        metric, label = meta.get("utility") or ("accuracy", "accuracy")
        return metric, label

    def experiment_config(self) -> ExperimentConfig:
        """The resolved experiment config the run was trained with (``config.json``), without
        loader options that write files (the directory is data, not instructions)."""
        path = self.path / CONFIG
        meta = self.config_meta()
        if meta is None:
            raise FedprivError(f"{self.path}: not a run directory (no {CONFIG}); train first with fedpriv train")
        if "experiment" not in meta:
            raise FedprivError(f"{path}: no experiment config recorded; retrain with this version of fedpriv")
        return validate_config(meta["experiment"], str(path)).without_write_targets()

    # ---- the vocabulary the run was trained with -------------------------------------------------
    def asset_digests(self) -> dict[str, str]:
        """SHA-256 of each vocabulary file the run holds (:data:`ASSET_FILES`), by name."""
        return {name: sha256_file(self.path / name) for name in ASSET_FILES if self.has(name)}

    def check_assets(self) -> None:
        """Refuse vocabulary files that differ from the digests ``config.json`` recorded at training
        (e.g. replaced by ``vocab build`` or edited): the model would disagree with its vocabulary."""
        meta = self.config_meta()
        if meta is None:
            return
        recorded = meta.get("assets")
        if not isinstance(recorded, dict):
            if self.has(CHECKPOINT) or self.has(PARAMS):
                raise FedprivError(f"{self.path / CONFIG}: records no digests of the run's vocabulary; {OLD_RUN_HINT}")
            return
        for name in ASSET_FILES:
            want = recorded.get(name)
            if want is None and not self.has(name):
                continue
            if want is None or not self.has(name) or sha256_file(self.path / name) != want:
                state = "is missing" if not self.has(name) else "is not the one the run was trained with" if want else "was not written by the run"
                raise FedprivError(f"{self.path / name}: {state} (its SHA-256 differs from the digest {CONFIG} recorded); the model and its vocabulary would disagree; {OLD_RUN_HINT}")

    # ---- metrics.jsonl --------------------------------------------------------------------------
    def append_metrics(self, row: dict[str, Any]) -> None:
        with open(self.path / METRICS, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def truncate_metrics(self, step: int, want_sha256: str | None = None) -> None:
        """Keep the rows up to ``step`` (a resumed run writes the rest again); a torn last line
        (a kill during an append) is dropped. ``want_sha256``: the digest the checkpoint of
        ``step`` recorded of the file (:meth:`metrics_sha256`); rows kept that are not exactly
        those (lost to a full disk, emptied, edited) are refused before the file is touched, since
        the resumed history would silently lack them."""
        path = self.path / METRICS
        keep = [json.dumps(row) for row in self._metric_rows(torn_tail_ok=True) if row["step"] <= step]
        data = "".join(line + "\n" for line in keep).encode("utf-8")
        if want_sha256 is not None and sha256_bytes(data) != want_sha256:
            raise DataFormatError(path, None, f"its {len(keep)} row(s) up to step {step} are not the ones the checkpoint of that step recorded "
                                              "(rows lost, as to a full disk, or edited); train it again (--restart, or a new --out)")
        if path.exists():
            write_bytes_atomic(path, data)

    def metrics_sha256(self) -> str:
        """SHA-256 of ``metrics.jsonl`` as it stands (of no bytes when there is none): a checkpoint records it."""
        path = self.path / METRICS
        return sha256_file(path) if path.is_file() else sha256_bytes(b"")

    def clear_metrics(self) -> None:
        (self.path / METRICS).unlink(missing_ok=True)

    def metrics(self) -> list[dict[str, Any]]:
        """Every row of ``metrics.jsonl``; DataFormatError naming the line of a damaged one."""
        return self._metric_rows(torn_tail_ok=False)

    def metrics_so_far(self) -> list[dict[str, Any]]:
        """The rows of a run that may have been killed: a torn last line is skipped."""
        return self._metric_rows(torn_tail_ok=True)

    def _metric_rows(self, torn_tail_ok: bool) -> list[dict[str, Any]]:
        path = self.path / METRICS
        if not path.is_file():
            return []
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DataFormatError(path, None, f"unreadable metrics ({e})") from None
        lines = text.split("\n")
        rows = []
        seen: dict[tuple[int, Any], int] = {}
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                if torn_tail_ok and i == len(lines) and not text.endswith("\n"):
                    break  # the last append was cut short: that row comes after the checkpoint
                raise DataFormatError(path, i, f"not a JSON metrics row ({e}); delete the run directory or pass --restart to start over") from None
            if _shape_problem(row, Obj({"step": (int,)}, ("step",)), ""):
                raise DataFormatError(path, i, "a metrics row must be a JSON object with an integer 'step'")
            key = (row["step"], json.dumps(row.get("split")))
            if key in seen:
                raise DataFormatError(path, i, f"a second row of step {row['step']}, split {row.get('split')!r} (the first is line {seen[key]}): two runs wrote into this directory? Train it again (--restart, or a new --out)")
            seen[key] = i
            rows.append(row)
        return rows

    # ---- checkpoints --------------------------------------------------------------------------------
    def save_checkpoint(self, state: Any, meta: dict[str, Any]) -> None:
        """Write ``state`` (a pytree of arrays) and ``meta`` (JSON-able, must hold ``step``)."""
        d = self.create().path
        name = f"checkpoint-{int(meta['step'])}.msgpack"
        data = to_msgpack(state)
        write_bytes_atomic(d / name, data)
        write_json_atomic(d / CHECKPOINT, {**meta, "state_file": name, "state_sha256": sha256_bytes(data), "metrics_sha256": self.metrics_sha256()}, indent=1)
        for old in d.glob("checkpoint-*.msgpack"):
            if old.name != name:
                old.unlink(missing_ok=True)

    def checkpoint_meta(self) -> dict[str, Any] | None:
        """The last checkpoint's metadata, or None when there is none; its state file must be a
        ``checkpoint-<step>.msgpack`` of this directory."""
        path = self.path / CHECKPOINT
        if not path.is_file():
            return None
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise DataFormatError(path, None, f"unreadable checkpoint ({e}); delete the directory to start over") from None
        expect_shape(meta, path, "checkpoint record", CHECKPOINT_SHAPE)
        if meta["step"] < 0 or not STATE_FILE.match(meta["state_file"]):
            raise DataFormatError(path, None, f"not a checkpoint record: step {meta['step']}, state file {meta['state_file'][:60]!r} (a checkpoint-<step>.msgpack of this directory expected)")
        if meta["state_file"] != f"checkpoint-{meta['step']}.msgpack":
            raise DataFormatError(path, None, f"step {meta['step']} but state file {meta['state_file']!r}: the checkpoint record was edited; {OLD_RUN_HINT}")
        return meta

    def verify_checkpoint(self, meta: dict[str, Any]) -> None:
        """Refuse a checkpoint whose state file's SHA-256 is not the one ``checkpoint.json`` records
        (or that records none: an older fedpriv, or an edit)."""
        path = self.path / CHECKPOINT
        want = meta.get("state_sha256")
        if not isinstance(want, str):
            raise DataFormatError(path, None, f"records no digest of its state file; {OLD_RUN_HINT}")
        state = self.path / meta["state_file"]
        if state.is_file() and sha256_file(state) != want:
            raise DataFormatError(state, None, f"its SHA-256 is not the one {CHECKPOINT} records for step {meta['step']} (replaced or edited); {OLD_RUN_HINT}")

    def verify_ledger(self, meta: dict[str, Any], private: bool) -> None:
        """Refuse a privacy ledger that disagrees with the checkpoint: the checkpoint's ledger record
        must count its step, and ``privacy_ledger.json`` must be the file it records, or a ledger
        of fewer steps (a kill between the checkpoint's write and the ledger's; resume rebuilds it).
        ``private``: the run records a ledger (a checkpoint without a ledger record is refused)."""
        path = self.path / CHECKPOINT
        rec = meta.get("ledger")
        if rec is None:
            if private:
                raise DataFormatError(path, None, f"records no privacy ledger for a DP run; {OLD_RUN_HINT}")
            return
        if not isinstance(rec, dict) or not isinstance(rec.get("steps"), int) or not isinstance(rec.get("sha256"), str):
            raise DataFormatError(path, "ledger", "not a ledger record (steps and sha256 expected)")
        if rec["steps"] != meta["step"]:
            raise DataFormatError(path, None, f"step {meta['step']} but its privacy ledger record counts {rec['steps']} steps: the checkpoint record was edited; {OLD_RUN_HINT}")
        ledger = self.path / LEDGER
        if not ledger.is_file():
            return
        from fedpriv.privacy.ledger import PrivacyLedger

        steps = PrivacyLedger.load(ledger).steps
        if steps < rec["steps"] or (steps == rec["steps"] and sha256_file(ledger) == rec["sha256"]):
            return
        raise DataFormatError(ledger, None, f"holds {steps} steps but is not the ledger {CHECKPOINT} records for step {meta['step']} (edited?); {OLD_RUN_HINT}")

    def verify_params(self) -> None:
        """Refuse ``params.msgpack`` when its SHA-256 is not the one ``checkpoint.json`` records."""
        meta = self.checkpoint_meta()
        if not self.has_params():
            return
        want = meta.get("params_sha256") if meta is not None else None
        if not isinstance(want, str):
            raise DataFormatError(self.path / PARAMS, None, f"{CHECKPOINT} records no digest of these parameters; {OLD_RUN_HINT}")
        if sha256_file(self.path / PARAMS) != want:
            raise DataFormatError(self.path / PARAMS, None, f"its SHA-256 is not the one {CHECKPOINT} records (replaced or edited); {OLD_RUN_HINT}")

    def verify(self, private: bool) -> None:
        """The checks an audit makes before it trusts the run: the checkpoint, its state file, the
        privacy ledger, the final parameters and the vocabulary agree with the digests recorded."""
        meta = self.checkpoint_meta()
        if meta is not None:
            self.verify_checkpoint(meta)
            self.verify_ledger(meta, private)
            ledger = self.path / LEDGER
            rec = meta.get("ledger")
            if rec is not None and (not ledger.is_file() or sha256_file(ledger) != rec["sha256"]):
                raise DataFormatError(ledger, None, f"is not the ledger {CHECKPOINT} records for step {meta['step']} (a kill before it was written?); run the training command again to repair it")
        elif self.has_params():
            raise DataFormatError(self.path / PARAMS, None, f"parameters without a checkpoint record; {OLD_RUN_HINT}")
        self.verify_params()
        self.check_assets()

    def load_checkpoint(self, template: Any) -> tuple[Any, dict[str, Any]] | None:
        """``(state, meta)`` of the last checkpoint, or None. ``template``: a state of the same
        structure (fresh parameters and optimizer state); a state of other shapes is refused."""
        meta = self.checkpoint_meta()
        if meta is None:
            return None
        self.verify_checkpoint(meta)
        state = self._restore(template, self.path / meta["state_file"], "checkpoint")
        return state, meta

    # ---- parameters -------------------------------------------------------------------------------
    def write_params(self, params: Any) -> None:
        """``params.msgpack``, its SHA-256 recorded first in ``checkpoint.json`` (the run's last
        checkpoint, of the same parameters)."""
        data = to_msgpack(params)
        meta = self.checkpoint_meta()
        if meta is not None:  # the digest first: a kill between the two writes leaves no parameters without it
            write_json_atomic(self.path / CHECKPOINT, {**meta, "params_sha256": sha256_bytes(data)}, indent=1)
        write_bytes_atomic(self.path / PARAMS, data)

    def has_params(self) -> bool:
        return self.has(PARAMS)

    def write_snapshot(self, step: int, params: Any) -> None:
        """Parameters after ``step`` steps or rounds, kept for an audit along training."""
        write_bytes_atomic(self.path / f"params-{int(step)}.msgpack", to_msgpack(params))

    def snapshot_steps(self) -> list[int]:
        """Steps with saved parameters (:meth:`write_snapshot`), in order."""
        steps = []
        for p in self.path.glob("params-*.msgpack"):
            m = SNAPSHOT_FILE.match(p.name)
            if m and p.is_file():
                steps.append(int(m.group(1)))
        return sorted(steps)

    def load_snapshot(self, step: int, template: Any) -> Any:
        """The parameters saved after ``step``; DataFormatError when damaged or of other shapes."""
        return self._restore(template, self.path / f"params-{int(step)}.msgpack", "parameters")

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
            return self._restore(template, self.path / PARAMS, "parameters"), "final parameters"
        meta = self.checkpoint_meta()
        if meta is not None:
            state = self._restore({"params": template}, self.path / meta["state_file"], "checkpoint", partial=True)
            return state["params"], f"checkpoint at step {meta['step']} (the run is unfinished)"
        raise FedprivError(f"{self.path}: no parameters (neither {PARAMS} nor a checkpoint)")

    @staticmethod
    def _restore(template: Any, path: Path, what: str, partial: bool = False) -> Any:
        """``template`` filled from the msgpack file ``path``; DataFormatError when it is damaged
        or holds another structure or other shapes (e.g. another model size). ``partial``: the
        file may hold more top-level entries than ``template`` (a checkpoint read for its params)."""
        hint = "delete the run directory or pass --restart to start over"
        try:
            raw = serialization.msgpack_restore(path.read_bytes())
        except FileNotFoundError:
            raise DataFormatError(path, None, f"the {what} file is missing; {hint}") from None
        except Exception as e:  # msgpack raises several unrelated types on damaged input
            raise DataFormatError(path, None, f"unreadable {what} ({type(e).__name__}: {e}); {hint}") from None
        if partial and isinstance(raw, dict):
            raw = {k: raw[k] for k in template if k in raw}
        want = serialization.to_state_dict(template)
        problem = _tree_mismatch(want, raw, "")
        if problem:
            raise DataFormatError(path, None, f"the {what} holds {problem} (another model or config?); {hint}")
        return serialization.from_state_dict(template, raw)

    # ---- the run store's files ------------------------------------------------------------------
    def has_summary(self) -> bool:
        return self.has(SUMMARY)

    def summary(self) -> dict[str, Any]:
        path = self.path / SUMMARY
        summary = expect_shape(read_json(path, "run summary"), path, "run summary", SUMMARY_SHAPE)
        if summary.get("epsilon") is not None and summary.get("delta") is None:
            raise DataFormatError(path, None, "not a run summary: an epsilon without its delta")
        return summary

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json_atomic(self.path / SUMMARY, summary)

    def audit(self) -> dict[str, Any]:
        """``audit.json``, checked: a summary object and a list of canary rows (objects)."""
        path = self.path / AUDIT_JSON
        return expect_shape(read_json(path, "audit"), path, "audit", AUDIT_SHAPE)

    def audit_summary(self) -> dict[str, Any] | None:
        return self.audit()["summary"] if self.has(AUDIT_JSON) else None

    def along_audit(self, step: int) -> dict[str, Any]:
        """``audit-<step>.json`` (audit.along), checked like ``audit.json``, for that step."""
        path = self.path / along_audit(step)
        audit = expect_shape(read_json(path, "audit"), path, "audit", Obj({**AUDIT_SHAPE.fields, "step": (int,)}, ("summary", "step")))
        if audit["step"] != int(step):
            raise DataFormatError(path, None, f"not the audit of step {step}: it says step {audit['step']}")
        return audit

    def empirical(self) -> dict[str, Any]:
        """``empirical.json``, checked: the bounds and the attack's statistics."""
        path = self.path / EMPIRICAL
        return expect_shape(read_json(path, "empirical audit"), path, "empirical audit", EMPIRICAL_SHAPE)

    def data_record(self) -> dict[str, Any] | None:
        """``data.json`` (what preparing the data decided on its own), checked, or None."""
        path = self.path / DATA
        if not path.is_file():
            return None
        return expect_shape(read_json(path, "data record"), path, "data record", DATA_SHAPE)

    def record(self, name: str, what: str) -> dict[str, Any]:
        """A free-form JSON record of the run (``privatize.json``, ``vocabulary.json``, ``tokenizer.json``): a JSON object."""
        path = self.path / name
        return expect_shape(read_json(path, what), path, what, Obj({}))

    # ---- failure --------------------------------------------------------------------------------
    def write_failure(self, reason: str, step: int, checkpoint_step: int | None) -> None:
        """Mark the run failed (``failed.json``): it is never reported as a result."""
        self.write_json(FAILED, {"reason": reason, "step": step, "checkpoint_step": checkpoint_step}, indent=1)

    def failure(self) -> dict[str, Any] | None:
        """Why the run failed (``failed.json``), or None."""
        path = self.path / FAILED
        if not path.is_file():
            return None
        return expect_shape(read_json(path, "failure record"), path, "failure record", Obj({"reason": (str,), "step": (int,)}, ("reason",)))


def _sorted_keys(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _sorted_keys(tree[k]) for k in sorted(tree, key=str)}
    return tree


def to_msgpack(tree: Any) -> bytes:
    """``tree`` as msgpack with every dict's keys in sorted order (JAX's pytree order), so the same
    values give the same bytes whether they come from a training step or a restored checkpoint."""
    return serialization.msgpack_serialize(_sorted_keys(serialization.to_state_dict(tree)))


def _tree_mismatch(want: Any, got: Any, where: str) -> str | None:
    """Where the state dict ``got`` differs from ``want`` in structure or array shapes, or None."""
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(want) != set(got):
            missing = sorted(set(want) - set(got)) if isinstance(got, dict) else []
            return f"other entries at {where or 'the top'}" + (f" (no {missing[0]!r})" if missing else "")
        for k in want:
            problem = _tree_mismatch(want[k], got[k], f"{where}/{k}")
            if problem:
                return problem
        return None
    if hasattr(want, "shape"):
        shape = getattr(got, "shape", None)
        if shape is None or tuple(shape) != tuple(np.shape(want)):
            return f"an array of shape {shape} at {where}, where {tuple(np.shape(want))} was expected"
    return None
