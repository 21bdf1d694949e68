"""From an experiment config to what a trainer consumes: corpora, the task, encoded arrays.

``prepare`` resolves the source, filters users, picks the evaluation data (``data.eval_source``,
or users held out by a stable hash of their id), builds the task on the training users only (so
evaluation data never shapes the vocabulary). With a ``[canaries]`` section it then plants the
canaries in the training users (the vocabulary stays the clean one; see
:mod:`fedpriv.memorization.canaries`) and encodes the planted records, so central and federated
runs of one experiment see identical data. ``data.users = "iid"`` then reshards the planted
records over users of the same sizes (the IID control of Thakkar et al. 2021).

With a ``[privatize]`` section, :func:`load_training_corpora` replaces every word of the training
users (after the held-out split and the user filters) by its locally privatized version (M_txt or
Vickrey, :mod:`fedpriv.runner.privatize`), before the task is built: the vocabulary, the model and
every engine see only privatized text, the evaluation data stays the original. Whatever rebuilds
a run's task from its config (an audit) goes through the same function, so it rebuilds the same
vocabulary (the mechanism is deterministic given ``privatize.seed``). The record of the mechanism and its guarantee goes to the run
directory's ``privatize.json`` (:meth:`fedpriv.training.prepared.Prepared.save_assets`).

Choices made without being asked are said once in the log (``note: ...``) and recorded in the run
(``data.json``): the loaders' notes (synthetic users, dropped accounts, skipped rows) and how many
examples the task cuts to its length limit (e.g. ``vocab.seq_len``), per split.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from fedpriv.config import VALIDATION, ExperimentConfig, load_config
from fedpriv.data.corpus import FederatedCorpus
from fedpriv.data.sources import open_corpus, split_format
from fedpriv.errors import ConfigError, FedprivError
from fedpriv.memorization.canaries import plant_canaries
from fedpriv.memorization.empirical import draw_audit_canaries, plant_audit_canaries
from fedpriv.rundir import RunDir
from fedpriv.runner.privatize import privatize_training_corpus
from fedpriv.tasks.base import Batch, Task
from fedpriv.tasks.registry import build_task, check_task
from fedpriv.training.prepared import Prepared
from fedpriv.training.coverage import PUBLIC_VOCAB_USERS

ENCODE_CHUNK = 4096
#: The public split's name (``data.public_fraction`` / ``public_source``; ``data.train_on = "public"``).
PUBLIC = "public"
#: Encoded arrays larger than this (bytes, all keys of a split) are memory-mapped from a temporary
#: file (deleted at once; the mapping keeps it until the arrays are freed) instead of held in RAM.
MEMMAP_BYTES = 2 << 30


@dataclass
class Cuts:
    """Examples of a split that the task's length limit cuts, and the words it drops; the split's
    words and, for a task that splits words, their pieces (before any cut)."""

    examples: int = 0
    cut: int = 0
    words: int = 0
    words_in: int = 0
    pieces_in: int | None = None

    def add(self, words_cut: int, words: int = 0, pieces: int | None = None) -> None:
        self.examples += 1
        self.words_in += words
        if pieces is not None:
            self.pieces_in = (self.pieces_in or 0) + pieces
        if words_cut > 0:
            self.cut += 1
            self.words += words_cut

    def add_many(self, words_cut: np.ndarray, words: np.ndarray, pieces: Sequence[int | None]) -> None:
        """:meth:`add` for each example of a chunk (per-example arrays), summed with NumPy."""
        self.examples += len(words_cut)
        self.words_in += int(np.sum(words))
        known = [p for p in pieces if p is not None]
        if known:
            self.pieces_in = (self.pieces_in or 0) + int(sum(known))
        self.cut += int(np.count_nonzero(words_cut > 0))
        self.words += int(np.sum(words_cut[words_cut > 0]))


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def _rows_like(batch: Batch, n: int) -> Batch:
    """Empty arrays of ``n`` rows shaped like ``batch``'s; memory-mapped above :data:`MEMMAP_BYTES`."""
    nbytes = sum(n * v[:1].nbytes for v in batch.values())
    if nbytes <= MEMMAP_BYTES:
        return {k: np.empty((n, *v.shape[1:]), v.dtype) for k, v in batch.items()}
    out = {}
    with tempfile.TemporaryDirectory(prefix="fedpriv-encoded-") as d:
        for k, v in batch.items():
            out[k] = np.lib.format.open_memmap(os.path.join(d, f"{k}.npy"), mode="w+", dtype=v.dtype, shape=(n, *v.shape[1:]))
    return out  # the files are unlinked; the mappings keep the data until the arrays are freed


def encode_corpus(task: Task, corpus: FederatedCorpus, cuts: Cuts | None = None) -> Batch:
    """All records of ``corpus`` (users in order) encoded by ``task``, in chunks, into arrays
    allocated once for the corpus's ``num_examples`` rows (memory-mapped when large); ``cuts`` (if
    given) counts what the task's length limit drops (:meth:`~fedpriv.tasks.base.Task.encode_measured`)."""
    total = corpus.num_examples
    out: Batch | None = None
    row = 0
    if getattr(task, "encodes_flat", False) and corpus.kind == "text":  # the corpus read once as flat arrays (NWP)
        encoded = task.encode_flat(corpus.flat_text(), ENCODE_CHUNK)
    else:
        encoded = (task.encode_measured(chunk) for chunk in _chunks(corpus.records(), ENCODE_CHUNK))
    for batch, words_cut, words, pieces in encoded:
        n = len(words)
        if cuts is not None:
            cuts.add_many(words_cut, words, pieces)
        if out is None:
            out = _rows_like(batch, total)
        if row + n > total:
            raise FedprivError(f"{corpus.name}: more records than its {total} counted examples")
        for k, v in batch.items():
            out[k][row : row + n] = v
        row += n
    if out is None or row != total:
        raise FedprivError(f"{corpus.name}: {row} records encoded but {total} counted")
    return out


def check_privatize(cfg: ExperimentConfig) -> None:
    """Refuse a ``[privatize]`` section that cannot work, before any data is read (its parameters
    were checked when the config was validated): embeddings that are not there, an unresolved
    ``run:NAME`` reference, canaries (they would be planted after privatization, in the clear)."""
    p = cfg.privatize
    if p is None:
        return
    if p.embeddings.startswith("run:"):
        raise ConfigError(
            f"privatize.embeddings = {p.embeddings!r}: a run reference is resolved by `fedpriv run` in an experiment file "
            "(to that run's directory in the store); give the path of a run directory or a GloVe-style file here"
        )
    where = Path(p.embeddings)
    if not where.exists():
        raise ConfigError(f"privatize.embeddings: {p.embeddings}: no such run directory or embeddings file")
    if where.is_dir() and p.max_words is not None:
        raise ConfigError("privatize.max_words applies to a GloVe-style file, not to a run directory")
    if where.is_dir() and not RunDir(where).has_params():
        raise ConfigError(f"privatize.embeddings: {p.embeddings}: the run has no final parameters (params.msgpack); finish it first")
    if cfg.canaries is not None:
        raise ConfigError(
            "[privatize] with [canaries] is not supported: canaries are planted after the vocabulary is built, so they "
            "would reach training unprivatized, and their memorization would not measure the local mechanism"
        )


#: The last corpus a process loaded, by (source, format, options, the file's size and mtime): the
#: runs of one experiment with different data keys (seeds, the public run, audit canaries) load a
#: large source once. Only the read-only store is shared: each caller gets its own info.
_LOADED: dict[str, FederatedCorpus] = {}


def _open_cached(source: str, fmt: str | None, options: dict) -> FederatedCorpus:
    path = Path(source)
    stamp = (path.stat().st_size, path.stat().st_mtime_ns) if path.is_file() else None
    key = json.dumps([source, fmt, options, stamp], sort_keys=True, default=str)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = open_corpus(source, format=fmt, **options)
    c = _LOADED[key]
    return FederatedCorpus(c.store, c.name, copy.deepcopy(c.info))


def load_training_corpora(cfg: ExperimentConfig, log: Callable[[str], None]) -> tuple[FederatedCorpus, dict[str, FederatedCorpus]]:
    """(training users, evaluation corpora by name) of ``cfg``: loaded, filtered, split; with a
    ``[privatize]`` section the training users' words privatized (``train.info["privatized"]``
    holds the record). With public data (``data.public_fraction``: users moved out of the
    training users by a stable hash, after the test and validation users; or
    ``data.public_source``), the corpora hold it as ``PUBLIC`` (it is not evaluated: see
    :func:`prepare`)."""
    check_privatize(cfg)
    d = cfg.data
    log(f"loading {d.source} ...")
    fmt, options = split_format(d.format, d.options)
    corpus = _open_cached(d.source, fmt, options)
    for note in corpus.notes:
        log(f"note: {note}")
    if d.min_examples > 1:
        corpus = corpus.with_min_examples(d.min_examples)
    if d.max_examples_per_user is not None:
        corpus = corpus.truncated(d.max_examples_per_user)
    evals: dict[str, FederatedCorpus] = {}
    if d.eval_source is not None:
        evals["eval"] = open_corpus(d.eval_source, **d.eval_options)
        for note in evals["eval"].notes:
            log(f"note: data.eval_source: {note}")
        if evals["eval"].kind != corpus.kind:
            raise FedprivError(f"data.eval_source holds {evals['eval'].kind} examples but data.source holds {corpus.kind} ones")
    elif d.heldout_fraction > 0:
        corpus, evals["heldout"] = corpus.split_heldout_users(d.heldout_fraction, salt=f"{cfg.name}:{cfg.seed}")
    if d.validation_fraction > 0:
        corpus, evals[VALIDATION] = corpus.split_heldout_users(d.validation_fraction, salt=f"{cfg.name}:{cfg.seed}:validation")
    if d.public_fraction > 0:
        corpus, public = corpus.split_heldout_users(d.public_fraction, salt=f"{cfg.name}:{cfg.seed}:public")
        corpus.info[PUBLIC] = {"users": public.num_users, "examples": public.num_examples, "fraction": d.public_fraction, "source": d.source}
        evals[PUBLIC] = public
    elif d.public_source is not None:
        public = open_corpus(d.public_source, **d.public_options)
        for note in public.notes:
            log(f"note: data.public_source: {note}")
        if public.kind != corpus.kind:
            raise FedprivError(f"data.public_source holds {public.kind} examples but data.source holds {corpus.kind} ones")
        corpus.info[PUBLIC] = {"users": public.num_users, "examples": public.num_examples, "source": d.public_source}
        evals[PUBLIC] = public
    if cfg.privatize is not None:
        settings = cfg.privatize.model_copy(update={"seed": cfg.seed if cfg.privatize.seed is None else cfg.privatize.seed})
        loaded = corpus.info
        corpus, record = privatize_training_corpus(corpus, settings, log)
        corpus.info = {**loaded, **corpus.info, "privatized": record}
    return corpus, evals


def prepare(config: ExperimentConfig | str | os.PathLike[str], log: Callable[[str], None] | None = None) -> Prepared:
    """Load, filter, split, build the task and encode (see the module docstring)."""
    cfg = config if isinstance(config, ExperimentConfig) else load_config(Path(config))
    say = log or (lambda _msg: None)
    check_task(cfg)
    train, evals = load_training_corpora(cfg, say)
    public = evals.pop(PUBLIC, None)
    privatized = train.info.get("privatized")
    say(f"{train.num_users} training users, {train.num_examples} examples; building the {cfg.task.kind} task ...")
    if public is not None:  # the vocabulary is learned from the public data only: nothing of the private users leaks through it
        say(f"public data: {public.num_users} users, {public.num_examples} examples (never trained on privately, no canaries); the vocabulary is learned from it")
        task = build_task(cfg, public)
        if getattr(task, "vocabulary_record", None):
            task.vocabulary_record = {**task.vocabulary_record, "users": PUBLIC_VOCAB_USERS}
        if cfg.data.train_on == PUBLIC:
            public.info[PUBLIC] = {**train.info.get(PUBLIC, {}), "trained_on": True}
            train = public
    else:
        task = build_task(cfg, train)
    manifest = None
    if cfg.canaries is not None and cfg.data.train_on != PUBLIC:
        canary_seed = cfg.seed if cfg.canaries.seed is None else cfg.canaries.seed
        train, manifest = plant_canaries(train, task, cfg.canaries, canary_seed, cfg.task.kind, say)
    if cfg.data.users == "iid":
        train = train.resharded_iid(cfg.seed)
        say(f"users resharded IID: {train.num_users} users keep their example counts, records shuffled")
    audit_canaries = None
    kind = cfg.audit_canary_kind() if cfg.data.train_on != PUBLIC else None
    if kind is not None:
        a = cfg.audit
        seed = cfg.seed if cfg.canaries is None or cfg.canaries.seed is None else cfg.canaries.seed
        audit_canaries = draw_audit_canaries(task, a.empirical_canaries, a.empirical_words, kind, seed)
        train = plant_audit_canaries(train, audit_canaries)
        say(f"empirical audit: {audit_canaries.count} {kind} canaries, {int(audit_canaries.included.sum())} included (each with probability 1/2)")
    cuts = {name: Cuts() for name in ["training", *evals]}
    arrays = encode_corpus(task, train, cuts["training"])
    eval_arrays = {name: encode_corpus(task, c, cuts[name]) for name, c in evals.items()}
    for note in cut_notes(task, cuts):
        say(f"note: {note}")
    return Prepared(cfg, train, evals, task, arrays, eval_arrays, manifest, privatized, audit_canaries=audit_canaries, data=data_record(train, evals, task, cuts))


def cut_notes(task: Task, cuts: dict[str, Cuts]) -> list[str]:
    """One line per split whose examples the task's length limit cut."""
    return [
        f"{task.length_limit}: {c.cut:,} of {c.examples:,} {name} examples ({c.cut / c.examples:.1%}) are longer and were cut ({c.words:,} words dropped)"
        for name, c in cuts.items()
        if c.cut and task.length_limit is not None
    ]


def data_record(train: FederatedCorpus, evals: dict[str, FederatedCorpus], task: Task, cuts: dict[str, Cuts]) -> dict:
    """What ``data.json`` records: the notes said in the log, the loader's facts, the examples cut per split."""
    notes = list(train.notes)
    if "eval" in evals:
        notes += [f"data.eval_source: {n}" for n in evals["eval"].notes]
    facts = {k: v for k, v in train.info.items() if k not in ("notes", "privatized")}
    return {"notes": notes + cut_notes(task, cuts), "length_limit": task.length_limit, "cut": {n: vars(c) for n, c in cuts.items()}, "source": facts}
