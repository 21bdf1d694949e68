"""FederatedCorpus: user_id -> that user's examples, the one data structure both engines consume.

Order rules (deterministic, independent of hash seeds):

* users are iterated in the store's order; stores built from files order users naturally
  (numeric ids numerically, then other ids as strings; see :func:`user_sort_key`);
* a user's examples are in source order;
* :meth:`FederatedCorpus.records` is the concatenation of the users' examples in that order.

Nothing here loads the whole corpus unless asked: a user's examples are built when requested.
"""

from __future__ import annotations

import hashlib
import numbers
import os
import re
import tempfile
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from fedpriv.data.examples import Example, Kind, TaggedExample, TextExample, kind_of
from fedpriv.data.flat import FlatText
from fedpriv.data.stores import (
    MappedStore,
    MemoryStore,
    PackedStore,
    ReshardedStore,
    SqliteStore,
    SubsetStore,
    TruncatedStore,
    UserStore,
)
from fedpriv.errors import EmptyCorpusError, FedprivError


class FederatedCorpus:
    """A population of users, each holding examples (text for NWP, tokens+tags for NER)."""

    def __init__(self, store: UserStore, name: str = "corpus", info: dict | None = None):
        self.store = store
        self.name = name
        #: Facts about how the corpus was loaded (e.g. skipped records), for inspection; corpora
        #: derived from this one (subsets, splits, filters) keep them.
        self.info: dict = dict(info or {})
        self._counts: np.ndarray | None = None
        self._flat: FlatText | None = None
        if len(store.user_ids()) == 0:
            raise EmptyCorpusError(f"{name}: the corpus has no users")

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_dict(cls, users: Mapping[object, Sequence[Example]], name: str = "corpus") -> "FederatedCorpus":
        """An in-memory corpus. A key is read as the file loaders read an id
        (:func:`normalized_user_id`: an integer printed, a string trimmed and in NFC form): two keys
        that give one id (``1`` and ``"1"``, ``"ann"`` and ``"ann "``) are refused, naming both (one
        user would silently take the other's place); a value that is no example is refused. Examples that hold nothing (a text empty or only
        whitespace, a tagged example without tokens) are skipped and counted in a note
        (:func:`note_skipped_empty`, as the file loaders do); users left with no example are
        dropped; an empty result is refused."""
        keys: dict[str, object] = {}
        kept: dict[str, list[Example]] = {}
        skipped = 0
        for key, exs in users.items():
            uid = normalized_user_id(key if isinstance(key, (str, int)) else str(key))
            if not uid:
                raise FedprivError(f"{name}: the user key {key!r} is an empty id")
            if uid in keys:
                raise FedprivError(
                    f"{name}: the user keys {keys[uid]!r} and {key!r} are both the user id {uid!r}: one user would take the "
                    "other's place; give every user one key"
                )
            keys[uid] = key
            exs = list(exs)
            wrong = next((ex for ex in exs if not isinstance(ex, (TextExample, TaggedExample))), None)
            if wrong is not None:
                raise FedprivError(f"{name}: user {uid!r} holds {type(wrong).__name__} {str(wrong)[:40]!r}; examples are TextExample or TaggedExample "
                                   "(fedpriv.data.examples), e.g. TextExample('some text')")
            keep = [ex for ex in exs if not is_empty_example(ex)]
            skipped += len(exs) - len(keep)
            if keep:
                kept[uid] = keep
        if not kept:
            raise EmptyCorpusError(f"{name}: the corpus has no users with examples")
        kinds = {kind_of(ex) for exs in kept.values() for ex in exs}
        if len(kinds) != 1:
            raise FedprivError(f"{name}: mixed example kinds {sorted(kinds)} in one corpus")
        kind = kinds.pop()
        corpus = cls(MemoryStore(kept, kind), name)
        note_skipped_empty(corpus, skipped, "examples", kind)
        note_user_id_variants(corpus, kept, fold_hint="give each group one key if it is one person")
        return corpus

    @classmethod
    def from_stream(
        cls,
        stream: Iterable[tuple[str, Example]],
        kind: Kind,
        name: str = "corpus",
        spill_to: str | os.PathLike[str] | None = None,
    ) -> "FederatedCorpus":
        """Collect ``(user_id, example)`` pairs into flat arrays in memory (:class:`PackedStore`: no
        object per example). With ``spill_to`` (a file path), the examples go to an on-disk SQLite
        store as they stream instead, so memory stays bounded whatever the source's size."""
        if spill_to is not None:
            return cls(SqliteStore.build(spill_to, stream, kind), name)
        return cls(PackedStore.build(stream, kind, name), name)

    def note(self, message: str, **facts: object) -> None:
        """Record a choice the loader made on its own (synthetic users, dropped records): the
        message goes to ``info["notes"]`` (said once in the log and recorded in the run, see
        :mod:`fedpriv.runner.prepare`), the facts to ``info``."""
        self.info.update(facts)
        self.info["notes"] = [*self.info.get("notes", []), message]

    @property
    def notes(self) -> list[str]:
        """The loader's notes (see :meth:`note`)."""
        return list(self.info.get("notes", []))

    # ---- access -------------------------------------------------------------------------
    @property
    def kind(self) -> Kind:
        return self.store.kind

    @property
    def user_ids(self) -> Sequence[str]:
        return self.store.user_ids()

    @property
    def num_users(self) -> int:
        return len(self.store.user_ids())

    def __len__(self) -> int:
        return self.num_users

    def __contains__(self, user_id: object) -> bool:
        return _as_user_id(user_id) in set(self.user_ids)

    def counts(self) -> np.ndarray:
        """Examples per user (int64), aligned with :attr:`user_ids`."""
        if self._counts is None:
            self._counts = np.asarray(self.store.counts(), dtype=np.int64)
        return self._counts

    @property
    def num_examples(self) -> int:
        return int(self.counts().sum())

    def examples(self, user_id: str | int) -> list[Example]:
        """One user's examples, in source order. Ids are strings; an integer is read as the id it
        prints (``corpus.examples(1004)`` is user ``"1004"``)."""
        try:
            return self.store.examples(_as_user_id(user_id))
        except KeyError:
            hint = "" if isinstance(user_id, str) else f" (user ids are strings, such as {self.user_ids[0]!r})"
            raise FedprivError(f"{self.name}: no user {user_id!r}{hint}") from None

    __getitem__ = examples

    def users(self) -> Iterator[tuple[str, list[Example]]]:
        """``(user_id, examples)`` for every user, one user in memory at a time."""
        for u in self.user_ids:
            yield u, self.store.examples(u)

    __iter__ = users

    def records(self) -> Iterator[Example]:
        """The flattened view for central training: every example, users in order, each user's in order."""
        for _, exs in self.users():
            yield from exs

    def flat_text(self) -> FlatText:
        """Every example's words as flat arrays (:class:`~fedpriv.data.flat.FlatText`), read once
        and kept: the vocabulary and the encoding of one corpus share one read."""
        if self._flat is None:
            self._flat = FlatText.from_corpus(self)
        return self._flat

    def __repr__(self) -> str:
        return f"FederatedCorpus({self.name!r}, kind={self.kind}, users={self.num_users})"

    # ---- derived corpora ------------------------------------------------------------------
    def subset(self, user_ids: Sequence[str], name: str | None = None) -> "FederatedCorpus":
        """The given users (in the given order); their counts are taken from this corpus's (every
        store counts without building examples), so a lazy store stays lazy."""
        index = {u: i for i, u in enumerate(self.user_ids)}
        missing = [u for u in user_ids if u not in index]
        if missing:
            raise FedprivError(f"{self.name}: unknown users {missing[:5]}")
        counts = self.counts()[np.fromiter((index[u] for u in user_ids), dtype=np.int64, count=len(user_ids))]
        return FederatedCorpus(SubsetStore(self.store, user_ids, counts), name or self.name, self.info)

    def sample_users(self, k: int, seed: int) -> "FederatedCorpus":
        """``k`` users drawn uniformly without replacement (deterministic by ``seed``); builds only them."""
        if not 0 < k <= self.num_users:
            raise FedprivError(f"cannot sample k={k} users from {self.num_users}; need 0 < k <= {self.num_users}")
        idx = np.random.default_rng(seed).choice(self.num_users, size=k, replace=False)
        ids = self.user_ids
        return self.subset([ids[int(i)] for i in idx], name=f"{self.name}[sample {k}, seed {seed}]")

    def map_users(self, fn: Callable[[list[Example]], list[Example]], name: str | None = None) -> "FederatedCorpus":
        """Apply ``fn`` to each user's examples; users left with none are dropped (one pass to find them)."""
        store = MappedStore(self.store, fn)
        if not store.user_ids():
            raise EmptyCorpusError(f"{name or self.name}: no user has any example left after filtering")
        return FederatedCorpus(store, name or self.name, self.info)

    def with_min_examples(self, n: int) -> "FederatedCorpus":
        """Only users with at least ``n`` examples."""
        keep = [u for u, c in zip(self.user_ids, self.counts()) if c >= n]
        if not keep:
            raise EmptyCorpusError(f"{self.name}: no user has {n} or more examples")
        return self.subset(keep, name=f"{self.name}[>= {n} examples]")

    def truncated(self, max_examples: int) -> "FederatedCorpus":
        """Each user's first ``max_examples`` examples (the TFF Stack Overflow cap on client data)."""
        if max_examples < 1:
            raise FedprivError(f"max_examples must be >= 1, got {max_examples}")
        store = TruncatedStore(self.store, max_examples, self.counts())
        if not store.user_ids():
            raise EmptyCorpusError(f"{self.name}[<= {max_examples} per user]: no user has any example left after filtering")
        return FederatedCorpus(store, f"{self.name}[<= {max_examples} per user]", self.info)

    def resharded_iid(self, seed: int) -> "FederatedCorpus":
        """The IID control: shuffle all records and deal them out sequentially to synthetic users,
        keeping the number of users and the per-user example counts (user j of the result has as
        many examples as user j of this corpus)."""
        return FederatedCorpus(ReshardedStore(self.store, seed, self.counts()), f"{self.name}[iid seed {seed}]", self.info)

    def split_heldout_users(self, fraction: float, salt: str = "fedpriv-heldout") -> tuple["FederatedCorpus", "FederatedCorpus"]:
        """``(train, heldout)`` by a stable hash of the user id: a user is held out when
        ``sha256(salt:user_id)`` read as a fraction of 2**64 is below ``fraction``. Stable across
        runs, machines and corpus sizes (a user's side never depends on the other users)."""
        if not 0.0 < fraction < 1.0:
            raise FedprivError(f"heldout fraction must be in (0, 1), got {fraction}")
        train, held = [], []
        for u in self.user_ids:
            (held if stable_unit_hash(u, salt) < fraction else train).append(u)
        if not train or not held:
            side = "train" if not train else "heldout"
            raise EmptyCorpusError(f"{self.name}: the {side} side of a {fraction} held-out split has no users")
        return self.subset(train, f"{self.name}[train]"), self.subset(held, f"{self.name}[heldout]")

    def split_by_time(self, cutoff: float | str | datetime) -> tuple["FederatedCorpus", "FederatedCorpus"]:
        """``(before, after)``: examples with timestamp < cutoff, and >= cutoff. Users are kept on
        each side where they have examples there. ``cutoff`` is epoch seconds, an ISO date or a datetime."""
        t = to_epoch_seconds(cutoff)

        def check(exs: list[Example]) -> list[Example]:
            for ex in exs:
                if ex.timestamp is None:
                    raise FedprivError(f"{self.name}: split_by_time needs timestamps, and an example has none")
            return exs

        before = self.map_users(lambda exs: [e for e in check(exs) if e.timestamp < t], f"{self.name}[before]")
        after = self.map_users(lambda exs: [e for e in check(exs) if e.timestamp >= t], f"{self.name}[after]")
        return before, after


def normalized_user_id(value: str | int) -> str:
    """An id as a user: an integer printed, a string trimmed and in Unicode NFC form (every loader's
    reading of an id, and :meth:`FederatedCorpus.from_dict`'s of a key)."""
    return str(value) if isinstance(value, int) else unicodedata.normalize("NFC", value).strip()


_INVISIBLE_IN_ID = re.compile("[\u00ad\u200b-\u200f\u2060\ufeff]")


def loose_user_id(uid: str) -> str:
    """``uid`` with what a reader does not see as a difference removed: compatibility forms (NFKC:
    full-width letters, no-break spaces), invisible characters, runs of whitespace."""
    return " ".join(_INVISIBLE_IN_ID.sub("", unicodedata.normalize("NFKC", uid)).split())


def note_user_id_variants(
    corpus: FederatedCorpus, ids: Iterable[str], case_kept: bool = True, fold_hint: str = "user_id_case='fold' makes each group one user"
) -> None:
    """Say how many groups of ``ids`` (the corpus's distinct user ids) differ only in letter case
    (when ``case_kept``: ids were not casefolded) or only in spacing, width or invisible characters:
    they stay apart, so one person with k such ids is k users (counts only: the ids themselves are
    the private users' names)."""
    ids = list(ids)
    if case_kept:
        groups = [k for k in Counter(u.casefold() for u in ids).values() if k > 1]
        if groups:
            corpus.note(
                f"{len(groups):,} groups of user ids of {corpus.name} ({sum(groups):,} ids) differ only in letter case; they are "
                f"kept apart, so one person with k such ids counts as k users, and a per-user epsilon covers that person "
                f"only as k users (group privacy); {fold_hint}",
                user_ids_differing_in_case=sum(groups),
            )
    groups = [k for k in Counter(loose_user_id(u) for u in ids).values() if k > 1]
    if groups:
        corpus.note(
            f"{len(groups):,} groups of user ids of {corpus.name} ({sum(groups):,} ids) differ only in spacing, character width or "
            "invisible characters ('John Smith', 'John  Smith', 'Ｊｏｈｎ Smith'); they are kept apart, so one person with k such ids "
            "counts as k users, and a per-user epsilon covers that person only as k users (group privacy)",
            user_ids_differing_in_spacing=sum(groups),
        )


def _as_user_id(user_id: object) -> object:
    """An integer user id as the string it prints (ids are strings: ``1004`` is user ``"1004"``)."""
    if isinstance(user_id, numbers.Integral) and not isinstance(user_id, bool):
        return str(int(user_id))
    return user_id


def is_empty_example(example: Example) -> bool:
    """Whether an example holds nothing to train on: a text empty or only whitespace, a tagged
    example without tokens."""
    if isinstance(example, TextExample):
        return not example.text.strip()
    return len(example.tokens) == 0


def note_skipped_empty(corpus: FederatedCorpus, count: int, items: str = "rows", kind: Kind = "text") -> None:
    """Say that ``count`` ``items`` of the source (rows, examples) gave no example because their
    text or token list was empty, and record ``skipped_empty``: the note every loader writes for them."""
    if count:
        what = "text" if kind == "text" else "token list"
        corpus.note(f"{count} {items} of {corpus.name} have an empty {what} and were skipped", skipped_empty=count)


def stable_unit_hash(user_id: str, salt: str) -> float:
    """A user's position in [0, 1), from SHA-256 (independent of Python's hash seed)."""
    digest = hashlib.sha256(f"{salt}:{user_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def to_epoch_seconds(t: float | int | str | datetime) -> float:
    """Epoch seconds (UTC) from a number, an ISO-8601 string or a datetime (naive means UTC)."""
    if isinstance(t, (int, float)):
        return float(t)
    if isinstance(t, str):
        try:
            t = datetime.fromisoformat(t)
        except ValueError:
            raise FedprivError(f"not an ISO-8601 time: {t!r}") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.timestamp()


def default_spill_path(source: str | os.PathLike[str]) -> Path:
    """Where a big source is spilled when the caller names no place: a file named after the source
    in a fresh private temporary folder (``tempfile.mkdtemp``: mode 0700, so no other user can read
    the copy of the data, whatever the umask). The caller owns the folder and removes it
    (``shutil.rmtree(path.parent)``) when the spill is no longer used."""
    folder = tempfile.mkdtemp(prefix="fedpriv-spill-")
    return Path(folder) / (Path(source).name + ".fedpriv.sqlite")
