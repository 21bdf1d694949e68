"""A text corpus's words as flat arrays: no Python object per example or per user.

:class:`FlatText` holds every example of a corpus (users in corpus order, each user's examples in
order, as :meth:`FederatedCorpus.records` gives them) as ids into a word table: example ``i`` is
``words[tokens[starts[i]:starts[i + 1]]]``, its space-separated words. ``corpus.counts()`` cuts
the examples into users. A store that can give a user's words as ids directly (the synthetic
store: :meth:`~fedpriv.data.stores.UserStore.word_table`) is read without building any text;
any other store is read once, one split per example, words numbered in first-seen order.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain, islice

import numpy as np

from fedpriv.errors import FedprivError

_CHUNK = 4096


@dataclass(frozen=True)
class FlatText:
    """Examples as word ids (int32, flat) with offsets (int64, ``num_examples + 1``)."""

    words: tuple[str, ...]
    tokens: np.ndarray
    starts: np.ndarray

    @property
    def num_examples(self) -> int:
        return len(self.starts) - 1

    def lengths(self) -> np.ndarray:
        """Words per example (int64)."""
        return np.diff(self.starts)

    def word_counts(self) -> Counter:
        """Word -> occurrences, the words that occur (what counting the texts' words gives)."""
        n = np.bincount(self.tokens, minlength=len(self.words))
        return Counter({w: int(c) for w, c in zip(self.words, n.tolist()) if c})

    def example_words(self, i: int) -> list[str]:
        """Example ``i``'s words (for tests and inspection)."""
        return [self.words[t] for t in self.tokens[self.starts[i] : self.starts[i + 1]].tolist()]

    @classmethod
    def from_corpus(cls, corpus) -> "FlatText":  # noqa: ANN001 (a FederatedCorpus, which imports this module)
        """Every example of a text :class:`~fedpriv.data.corpus.FederatedCorpus`, in records order
        (see the module docstring)."""
        if corpus.kind != "text":
            raise FedprivError(f"{corpus.name}: flat text needs text examples, not {corpus.kind} ones")
        store = corpus.store
        table = store.word_table()
        parts: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        if table is not None:
            for u in corpus.user_ids:
                ids, lens = store.word_ids(u)
                parts.append(ids)
                lengths.append(lens)
            words = tuple(table)
        else:
            index: defaultdict[str, int] = defaultdict()
            index.default_factory = index.__len__  # a new word gets the next id
            records = corpus.records()
            while chunk := [ex.text.split() for ex in islice(records, _CHUNK)]:
                lens = np.fromiter(map(len, chunk), dtype=np.int64, count=len(chunk))
                parts.append(np.fromiter(map(index.__getitem__, chain.from_iterable(chunk)), dtype=np.int32, count=int(lens.sum())))
                lengths.append(lens)
            words = tuple(index)
        tokens = np.concatenate(parts).astype(np.int32, copy=False) if parts else np.zeros(0, np.int32)
        lens_all = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        starts = np.zeros(len(lens_all) + 1, dtype=np.int64)
        np.cumsum(lens_all, out=starts[1:])
        return cls(words, tokens, starts)

    def chunks(self, size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(tokens, starts)`` of consecutive examples, ``size`` at a time (starts from 0)."""
        for lo in range(0, self.num_examples, size):
            hi = min(lo + size, self.num_examples)
            s = self.starts[lo : hi + 1]
            yield self.tokens[s[0] : s[-1]], s - s[0]
