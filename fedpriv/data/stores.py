"""Backends that hold a corpus's users: in memory, on disk (SQLite), or derived from another store.

A store answers three questions: which users (in a fixed order), how many examples a user
has, and what those examples are. :class:`~fedpriv.data.corpus.FederatedCorpus` wraps a store
and never assumes the whole corpus fits in memory; loaders for big sources return lazy stores
(:class:`SqliteStore`, the TFF SQLite store, the synthetic store) that build a user's examples
only when asked.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from fedpriv.data.examples import Example, Kind, TaggedExample, TextExample, example_from_json, kind_of
from fedpriv.errors import EmptyCorpusError, FedprivError

_DIGITS = re.compile(r"^[0-9]+$")


def user_sort_key(user_id: str) -> tuple:
    """Natural order of user ids: numeric ids numerically (before others), then strings."""
    if _DIGITS.match(user_id):
        return (0, len(user_id.lstrip("0")), user_id.lstrip("0"), user_id)
    return (1, 0, user_id, user_id)


class UserStore(ABC):
    """Read access to users and their examples. Subclasses fix ``kind`` and the user order."""

    kind: Kind

    @abstractmethod
    def user_ids(self) -> Sequence[str]:
        """All user ids, in the store's deterministic order."""

    @abstractmethod
    def examples(self, user_id: str) -> list[Example]:
        """The user's examples in source order. Raises KeyError for an unknown user."""

    def counts(self) -> np.ndarray:
        """Examples per user (int64), aligned with :meth:`user_ids`. Override when cheaper."""
        return np.fromiter((len(self.examples(u)) for u in self.user_ids()), dtype=np.int64)

    def word_table(self) -> Sequence[str] | None:
        """For a text store that holds words as ids: the words, so that :meth:`word_ids` can be
        read without building text (:class:`fedpriv.data.flat.FlatText`). None otherwise."""
        return None

    def word_ids(self, user_id: str) -> tuple[np.ndarray, np.ndarray]:
        """The user's examples as ``(ids into word_table(), flat; words per example, int64)``: the
        same words as splitting the texts of :meth:`examples`. Only where :meth:`word_table` is not None."""
        raise NotImplementedError


class MemoryStore(UserStore):
    """Users held in a dict of lists; ordered by :func:`user_sort_key`."""

    def __init__(self, users: dict[str, list[Example]], kind: Kind):
        self.kind = kind
        self._users = users
        self._ids = tuple(sorted(users, key=user_sort_key))

    def user_ids(self) -> Sequence[str]:
        return self._ids

    def examples(self, user_id: str) -> list[Example]:
        return list(self._users[user_id])

    def counts(self) -> np.ndarray:
        return np.array([len(self._users[u]) for u in self._ids], dtype=np.int64)


def _grouped(flats: list[np.ndarray], lengths: np.ndarray, order: np.ndarray, starts: np.ndarray, block: int = 1 << 16) -> list[np.ndarray]:
    """Flat per-example runs (``lengths[i]`` values each, in source order) rearranged so that
    example ``order[k]`` comes k-th (``starts``: the new offsets); a block of examples at a time,
    so that the index arrays stay small whatever the corpus's size (no gather when already in order)."""
    if len(order) == 0 or bool(np.all(order[1:] > order[:-1])):
        return [f.copy() for f in flats]
    old_starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=old_starts[1:])
    outs = [np.empty(int(starts[-1]), dtype=f.dtype) for f in flats]
    for a in range(0, len(order), block):
        b = min(a + block, len(order))
        idx = order[a:b]
        lo, hi = int(starts[a]), int(starts[b])
        gather = np.repeat(old_starts[idx] - (starts[a:b] - lo), lengths[idx]) + np.arange(hi - lo, dtype=np.int64)
        for f, out in zip(flats, outs):
            out[lo:hi] = f[gather]
    return outs


class PackedStore(UserStore):
    """A loaded corpus as flat arrays: no Python object per example (what loaders build in memory).

    Every example's words are int32 ids into one word table (``tokens``, flat), cut by int64
    ``starts``; examples are grouped by user in :func:`user_sort_key` order, each user's in source
    order, and ``user_starts`` cuts them into users. Tagged examples keep their tags the same way
    (ids into a tag table, aligned with the tokens). A user's examples are rebuilt when asked.
    Timestamps are one float64 each (with a flag for "none"). An example that the arrays would not
    give back exactly (a text whose words joined by single spaces are not the text itself, from an
    un-normalized source; a timestamp that is not a float, such as an int) is kept as it was, aside, so every
    example comes back exactly as the loader gave it. About 4 bytes a word and 21 an example,
    against about 300 for the example objects and their strings.
    """

    def __init__(self, kind: Kind, user_ids: Sequence[str], user_starts: np.ndarray, words: Sequence[str],
                 tokens: np.ndarray, starts: np.ndarray, timestamps: np.ndarray, has_time: np.ndarray,
                 tags: Sequence[str] = (), tag_ids: np.ndarray | None = None, aside: dict[int, Example] | None = None):
        self.kind = kind
        self._ids = tuple(user_ids)
        self._index = {u: i for i, u in enumerate(self._ids)}
        self._user_starts = user_starts
        self._words = tuple(words)
        self._tokens, self._starts = tokens, starts
        self._times, self._has_time = timestamps, has_time
        self._tags, self._tag_ids = tuple(tags), tag_ids
        self._aside = aside or {}

    @classmethod
    def build(cls, stream: Iterable[tuple[str, Example]], kind: Kind, name: str = "corpus") -> "PackedStore":
        """Collect ``(user_id, example)`` pairs (users in any order, interleaved) into flat arrays;
        EmptyCorpusError when there are none, FedprivError for an example of another kind."""
        from array import array
        from collections import defaultdict

        def numbering() -> defaultdict[str, int]:
            table: defaultdict[str, int] = defaultdict()
            table.default_factory = table.__len__  # a new key gets the next number
            return table

        users, words, tags = numbering(), numbering(), numbering()
        owner, lengths, tokens, tag_ids = array("i"), array("q"), array("i"), array("i")
        times, has_time = array("d"), array("b")
        aside: dict[int, Example] = {}
        tagged = kind == "tagged"
        for n, (user_id, ex) in enumerate(stream):
            if kind_of(ex) != kind:
                raise FedprivError(f"{name}: mixed example kinds in one corpus: expected {kind}")
            owner.append(users[user_id])
            if tagged:
                toks = ex.tokens
                tag_ids.extend(map(tags.__getitem__, ex.tags))
            else:
                toks = ex.text.split()
                if " ".join(toks) != ex.text:
                    aside[n] = ex
            lengths.append(len(toks))
            tokens.extend(map(words.__getitem__, toks))
            t = ex.timestamp
            if t is not None and not isinstance(t, float):  # an int (2**60 + 1 is no float64)
                aside[n] = ex
            times.append(t if isinstance(t, float) else 0.0)  # (an example aside keeps its own)
            has_time.append(t is not None)
        if not users:
            raise EmptyCorpusError(f"{name}: the source produced no examples")
        ids = sorted(users, key=user_sort_key)
        rank = np.empty(len(ids), dtype=np.int64)
        rank[np.fromiter(map(users.__getitem__, ids), dtype=np.int64, count=len(ids))] = np.arange(len(ids))
        user_of = rank[np.frombuffer(owner, dtype=np.int32)]
        order = np.argsort(user_of, kind="stable")  # by user, source order within
        user_starts = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(np.bincount(user_of, minlength=len(ids)), out=user_starts[1:])
        del user_of
        lens = np.frombuffer(lengths, dtype=np.int64)
        starts = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens[order], out=starts[1:])
        if aside:
            position = np.empty(len(order), dtype=np.int64)
            position[order] = np.arange(len(order))
            aside = {int(position[n]): ex for n, ex in aside.items()}
        ids_in_order = [np.frombuffer(tokens, dtype=np.int32)] + ([np.frombuffer(tag_ids, dtype=np.int32)] if tagged else [])
        flat = _grouped(ids_in_order, lens, order, starts)
        return cls(
            kind, ids, user_starts, tuple(words), flat[0], starts,
            np.frombuffer(times, dtype=np.float64)[order], np.frombuffer(has_time, dtype=np.bool_)[order],
            tuple(tags), flat[1] if tagged else None, aside,
        )

    def user_ids(self) -> Sequence[str]:
        return self._ids

    def counts(self) -> np.ndarray:
        return np.diff(self._user_starts)

    def _range(self, user_id: str) -> tuple[int, int]:
        i = self._index[user_id]  # KeyError for an unknown user
        return int(self._user_starts[i]), int(self._user_starts[i + 1])

    def examples(self, user_id: str) -> list[Example]:
        lo, hi = self._range(user_id)
        s = self._starts[lo : hi + 1].tolist()
        toks = self._tokens[s[0] : s[-1]].tolist()
        words = self._words
        times = [t if h else None for t, h in zip(self._times[lo:hi].tolist(), self._has_time[lo:hi].tolist())]
        base = s[0]
        out: list[Example]
        if self.kind == "tagged":
            tags, tag_ids = self._tags, self._tag_ids[s[0] : s[-1]].tolist()
            out = [
                TaggedExample(tuple(words[w] for w in toks[a - base : b - base]), tuple(tags[g] for g in tag_ids[a - base : b - base]), t)
                for a, b, t in zip(s, s[1:], times)
            ]
        else:
            out = [TextExample(" ".join([words[w] for w in toks[a - base : b - base]]), t) for a, b, t in zip(s, s[1:], times)]
        if self._aside:
            for k in range(hi - lo):
                if lo + k in self._aside:
                    out[k] = self._aside[lo + k]
        return out

    def word_table(self) -> Sequence[str] | None:
        return self._words if self.kind == "text" else None

    def word_ids(self, user_id: str) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = self._range(user_id)
        return self._tokens[self._starts[lo] : self._starts[hi]], np.diff(self._starts[lo : hi + 1])


def is_corpus_store(path: Path) -> bool:
    """Whether ``path`` is a corpus store a spill wrote (an SQLite file whose meta names a kind):
    a spill may replace only such a file."""
    try:
        with open(path, "rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                return False
        con = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            return con.execute("SELECT value FROM meta WHERE key='kind'").fetchone() is not None
        finally:
            con.close()
    except (OSError, sqlite3.Error):
        return False


class SqliteStore(UserStore):
    """A spilled corpus on disk: one row per example, indexed by user. Memory-bounded to build and read.

    Build it with :meth:`build` from a stream of ``(user_id, example)`` pairs; only a batch of
    rows is in memory at any time.
    """

    _BATCH = 5000

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._con = sqlite3.connect(str(self.path), check_same_thread=False)
        row = self._con.execute("SELECT value FROM meta WHERE key='kind'").fetchone()
        if row is None:
            raise FedprivError(f"{self.path}: not a fedpriv corpus store (no 'kind' in meta)")
        self.kind = row[0]
        ids = [r[0] for r in self._con.execute("SELECT DISTINCT user_id FROM examples")]
        self._ids = tuple(sorted(ids, key=user_sort_key))
        self._counts: np.ndarray | None = None

    @classmethod
    def build(
        cls, path: str | os.PathLike[str], stream: Iterable[tuple[str, Example]], kind: Kind
    ) -> "SqliteStore":
        """Write ``stream`` to a new SQLite file at ``path`` (written to a temp name, then renamed);
        FedprivError, and nothing left, when it cannot be written there."""
        if not str(path) or "\x00" in str(path):
            raise FedprivError(f"spill_to {str(path)!r}: not a file path")
        path = Path(path)
        if path.is_dir():
            raise FedprivError(f"spill_to {path}: not a file path (a folder is there)")
        if path.exists() and path.stat().st_size > 0 and not is_corpus_store(path):  # an empty file (mkstemp's) is free to fill
            raise FedprivError(f"spill_to {path}: a file that is not a fedpriv corpus store is there; remove it or name a new file (a spill file is written anew)")
        tmp = path.with_name(path.name + ".partial")
        if tmp.exists():
            tmp.unlink()
        try:
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))  # a copy of the users' data: readable by its owner only
            con = sqlite3.connect(str(tmp))
        except (sqlite3.Error, OSError) as e:
            if not isinstance(e, OSError):  # (an OSError: nothing was created)
                tmp.unlink(missing_ok=True)
            raise FedprivError(f"spill_to {path}: cannot write a corpus store there ({getattr(e, 'strerror', None) or e})") from None
        try:
            con.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
            con.execute("CREATE TABLE examples (user_id TEXT, seq INTEGER, payload TEXT)")
            con.execute("INSERT INTO meta VALUES ('kind', ?)", (kind,))
            seq: dict[str, int] = {}
            batch: list[tuple[str, int, str]] = []
            for user_id, ex in stream:
                if kind_of(ex) != kind:
                    raise FedprivError(f"mixed example kinds in one corpus: expected {kind}")
                n = seq.get(user_id, 0)
                seq[user_id] = n + 1
                batch.append((user_id, n, json.dumps(ex.to_json())))
                if len(batch) >= cls._BATCH:
                    con.executemany("INSERT INTO examples VALUES (?, ?, ?)", batch)
                    batch.clear()
            if batch:
                con.executemany("INSERT INTO examples VALUES (?, ?, ?)", batch)
            if not seq:
                raise EmptyCorpusError("the source produced no examples")
            con.execute("CREATE INDEX by_user ON examples (user_id, seq)")
            con.commit()
        except BaseException as e:
            con.close()
            tmp.unlink(missing_ok=True)
            if isinstance(e, sqlite3.Error):
                raise FedprivError(f"spill_to {path}: cannot write a corpus store there ({e})") from None
            raise
        con.close()
        os.replace(tmp, path)
        return cls(path)

    def user_ids(self) -> Sequence[str]:
        return self._ids

    def examples(self, user_id: str) -> list[Example]:
        rows = self._con.execute(
            "SELECT payload FROM examples WHERE user_id=? ORDER BY seq", (user_id,)
        ).fetchall()
        if not rows:
            raise KeyError(user_id)
        return [example_from_json(json.loads(r[0]), self.kind) for r in rows]

    def counts(self) -> np.ndarray:
        if self._counts is None:
            got = dict(self._con.execute("SELECT user_id, COUNT(*) FROM examples GROUP BY user_id"))
            self._counts = np.array([got[u] for u in self._ids], dtype=np.int64)
        return self._counts


class SubsetStore(UserStore):
    """A subset of another store's users, in the given order."""

    def __init__(self, base: UserStore, user_ids: Sequence[str], counts: np.ndarray | None = None):
        self.kind = base.kind
        self._base = base
        self._ids = tuple(user_ids)
        self._counts = counts

    def user_ids(self) -> Sequence[str]:
        return self._ids

    def examples(self, user_id: str) -> list[Example]:
        return self._base.examples(user_id)

    def counts(self) -> np.ndarray:
        if self._counts is None:
            self._counts = super().counts()
        return self._counts

    def word_table(self) -> Sequence[str] | None:
        return self._base.word_table()

    def word_ids(self, user_id: str) -> tuple[np.ndarray, np.ndarray]:
        return self._base.word_ids(user_id)


class MappedStore(UserStore):
    """Each user's examples passed through ``fn``; users left with no example are dropped.

    Finding which users survive needs one pass over the base store (one user in memory at a
    time); the result of that pass is the user list and the counts, not the examples.
    """

    def __init__(self, base: UserStore, fn: Callable[[list[Example]], list[Example]]):
        self.kind = base.kind
        self._base = base
        self._fn = fn
        ids, counts = [], []
        for u in base.user_ids():
            n = len(fn(base.examples(u)))
            if n:
                ids.append(u)
                counts.append(n)
        self._ids = tuple(ids)
        self._counts = np.array(counts, dtype=np.int64)

    def user_ids(self) -> Sequence[str]:
        return self._ids

    def examples(self, user_id: str) -> list[Example]:
        out = self._fn(self._base.examples(user_id))
        if not out:
            raise KeyError(user_id)
        return out

    def counts(self) -> np.ndarray:
        return self._counts


class TruncatedStore(UserStore):
    """Each user's first ``max_examples`` examples. The counts follow from the base's counts, so
    unlike :class:`MappedStore` no pass over the examples is needed (a lazy store stays lazy)."""

    def __init__(self, base: UserStore, max_examples: int, base_counts: np.ndarray):
        self.kind = base.kind
        self._base = base
        self._max = max_examples
        keep = np.asarray(base_counts, dtype=np.int64) > 0
        ids = base.user_ids()
        self._ids = tuple(ids) if keep.all() else tuple(u for u, k in zip(ids, keep) if k)
        counts = np.asarray(base_counts, dtype=np.int64)[keep]
        self._counts = np.minimum(counts, max_examples) if max_examples < np.iinfo(np.int64).max else counts  # (a cap above int64: no cap)

    def user_ids(self) -> Sequence[str]:
        return self._ids

    def examples(self, user_id: str) -> list[Example]:
        out = self._base.examples(user_id)[: self._max]
        if not out:
            raise KeyError(user_id)
        return out

    def counts(self) -> np.ndarray:
        return self._counts

    def word_table(self) -> Sequence[str] | None:
        return self._base.word_table()

    def word_ids(self, user_id: str) -> tuple[np.ndarray, np.ndarray]:
        ids, lengths = self._base.word_ids(user_id)
        lengths = lengths[: self._max]
        return ids[: int(lengths.sum())], lengths


class ReshardedStore(UserStore):
    """The IID control: all records shuffled (by ``seed``) and dealt out sequentially to synthetic users.

    Synthetic user ``j`` gets as many records as the base's ``j``-th user had, so the number of
    users, the per-user counts (in order) and the multiset of records are all kept. The
    permutation is one uint32/uint64 array over all records; examples are fetched lazily from
    the base store (with a small cache of base users).
    """

    def __init__(self, base: UserStore, seed: int, base_counts: np.ndarray, cache_users: int = 256):
        self.kind = base.kind
        self._base = base
        self._base_ids = base.user_ids()
        self._counts = np.asarray(base_counts, dtype=np.int64)
        total = int(self._counts.sum())
        dtype = np.uint32 if total < 2**32 else np.uint64
        perm = np.arange(total, dtype=dtype)
        np.random.default_rng(seed).shuffle(perm)
        self._perm = perm
        self._offsets = np.concatenate([[0], np.cumsum(self._counts)])
        width = len(str(max(len(self._counts) - 1, 0)))
        self._ids = tuple(f"iid-{j:0{width}d}" for j in range(len(self._counts)))
        self._index = {u: j for j, u in enumerate(self._ids)}
        self._cache: OrderedDict[int, list[Example]] = OrderedDict()
        self._cache_users = cache_users

    def user_ids(self) -> Sequence[str]:
        return self._ids

    def counts(self) -> np.ndarray:
        return self._counts

    def _base_examples(self, b: int) -> list[Example]:
        if b in self._cache:
            self._cache.move_to_end(b)
            return self._cache[b]
        exs = self._base.examples(self._base_ids[b])
        self._cache[b] = exs
        if len(self._cache) > self._cache_users:
            self._cache.popitem(last=False)
        return exs

    def examples(self, user_id: str) -> list[Example]:
        j = self._index[user_id]
        glob = self._perm[self._offsets[j] : self._offsets[j + 1]].astype(np.int64)
        src = np.searchsorted(self._offsets, glob, side="right") - 1
        local = glob - self._offsets[src]
        return [self._base_examples(int(b))[int(i)] for b, i in zip(src, local)]

