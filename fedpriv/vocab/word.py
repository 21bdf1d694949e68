"""Top-K word vocabulary and fixed-length encoding, following the TFF Stack Overflow NWP convention.

Ids: 0 = pad, 1..K = the K most frequent words (ties broken alphabetically), K+1 = oov,
K+2 = bos, K+3 = eos; the vocabulary has K + 4 entries (10,004 for K = 10,000).

An example of words w_1..w_n encodes to ``[bos, id(w_1), ..., id(w_min(n,L))]`` followed by
``eos`` when n < L, then padded with 0 to length L + 1 (L = ``seq_len``, 20 by default). The
model's inputs are ``ids[:-1]`` and its targets ``ids[1:]``.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import chain, repeat

import numpy as np

from fedpriv.errors import DataFormatError, FedprivError
from fedpriv.jsonio import read_json, write_json_atomic

PAD = 0


class WordVocab:
    """K words plus pad, oov, bos and eos (see the module docstring for the id layout)."""

    def __init__(self, words: Iterable[str]):
        self.words: tuple[str, ...] = tuple(words)
        if len(set(self.words)) != len(self.words):
            raise FedprivError("vocabulary words must be distinct")
        if not self.words:
            raise FedprivError("a vocabulary needs at least one word")
        self._index = {w: i + 1 for i, w in enumerate(self.words)}
        k = len(self.words)
        self.pad, self.oov, self.bos, self.eos = PAD, k + 1, k + 2, k + 3

    @classmethod
    def from_counts(cls, counts: Counter | dict[str, int], size: int = 10_000) -> "WordVocab":
        """The ``size`` most frequent words of a word -> count mapping."""
        if size < 1:
            raise FedprivError(f"vocabulary size must be >= 1, got {size}")
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return cls(w for w, c in ranked[:size] if c > 0)

    @classmethod
    def build(cls, texts: Iterable[str], size: int = 10_000) -> "WordVocab":
        """Count the space-separated words of ``texts`` (streamed) and keep the top ``size``."""
        return cls.from_counts(count_words(texts), size)

    def __len__(self) -> int:
        """Number of ids, including the 4 special ones."""
        return len(self.words) + 4

    def id(self, word: str) -> int:
        return self._index.get(word, self.oov)

    def encode(self, text: str, seq_len: int = 20) -> np.ndarray:
        """One example -> int32 array of length ``seq_len + 1`` (see the module docstring)."""
        out = np.zeros(seq_len + 1, dtype=np.int32)
        ids = [self._index.get(w, self.oov) for w in text.split()[:seq_len]]
        out[0] = self.bos
        out[1 : 1 + len(ids)] = ids
        if len(ids) < seq_len:
            out[1 + len(ids)] = self.eos
        return out

    def encode_batch(self, texts: Iterable[str], seq_len: int = 20) -> np.ndarray:
        """Many examples -> int32 array of shape (n, seq_len + 1), row i = ``encode(texts[i])``."""
        return self.encode_words([t.split() for t in texts], seq_len)[0]

    def encode_words(self, words: Sequence[list[str]], seq_len: int = 20) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, lengths)``: examples given as word lists -> the int32 (n, seq_len + 1) array of
        :meth:`encode`, and each example's word count (int64, before the cut to ``seq_len``).
        One dictionary lookup per kept word and NumPy for the rest: no per-example array."""
        n = len(words)
        lengths = np.fromiter(map(len, words), dtype=np.int64, count=n)
        kept = np.minimum(lengths, seq_len)
        total = int(kept.sum())
        kept_words = chain.from_iterable(ws[:seq_len] for ws in words)
        flat = np.fromiter(map(self._index.get, kept_words, repeat(self.oov, total)), dtype=np.int32, count=total)
        return self._rows(flat, lengths, seq_len), lengths

    def table_ids(self, words: Sequence[str]) -> np.ndarray:
        """Each word's id here (int32; oov for a word not in the vocabulary): maps a word table's
        ids to this vocabulary's with one NumPy gather."""
        return np.fromiter(map(self._index.get, words, repeat(self.oov, len(words))), dtype=np.int32, count=len(words))

    def encode_ids(self, ids: np.ndarray, starts: np.ndarray, seq_len: int = 20) -> np.ndarray:
        """Examples given as ids of this vocabulary, flat (example i is ``ids[starts[i]:starts[i+1]]``)
        -> the int32 (n, seq_len + 1) array of :meth:`encode`, with NumPy only."""
        lengths = np.diff(starts)
        offset = np.arange(len(ids), dtype=np.int64) - np.repeat(starts[:-1], lengths)
        return self._rows(ids[offset < seq_len], lengths, seq_len)

    def _rows(self, kept_ids: np.ndarray, lengths: np.ndarray, seq_len: int) -> np.ndarray:
        """``[bos, ids..., eos, pad...]`` rows from each example's first ``seq_len`` ids (flat) and its length."""
        n = len(lengths)
        out = np.zeros((n, seq_len + 1), dtype=np.int32)
        out[:, 0] = self.bos
        kept = np.minimum(lengths, seq_len)
        rows = np.repeat(np.arange(n), kept)
        cols = 1 + np.arange(len(kept_ids)) - np.repeat(np.cumsum(kept) - kept, kept)
        out[rows, cols] = kept_ids
        short = np.flatnonzero(lengths < seq_len)
        out[short, 1 + lengths[short]] = self.eos
        return out

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Ids -> tokens, with ``<pad>``, ``<oov>``, ``<bos>``, ``<eos>`` for the special ids."""
        special = {self.pad: "<pad>", self.oov: "<oov>", self.bos: "<bos>", self.eos: "<eos>"}
        return [special[i] if i in special else self.words[i - 1] for i in map(int, ids)]

    def save(self, path: str | os.PathLike[str]) -> None:
        """JSON: ``{"format": "fedpriv-word-vocab", "words": [...]}`` (written atomically)."""
        write_json_atomic(path, {"format": "fedpriv-word-vocab", "version": 1, "words": list(self.words)})

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "WordVocab":
        obj = read_json(path, "vocabulary file")
        if not isinstance(obj, dict) or obj.get("format") != "fedpriv-word-vocab" or not isinstance(obj.get("words"), list):
            raise DataFormatError(path, None, "not a fedpriv word vocabulary")
        return cls(obj["words"])


COUNT_CHUNK = 4096


def count_words(texts: Iterable[str]) -> Counter:
    """Word counts of space-separated texts, streamed (a chunk of ``COUNT_CHUNK`` texts in memory
    at a time, counted in one call: the same counts as text by text, far fewer calls)."""
    counts: Counter = Counter()
    chunk: list[str] = []
    for t in texts:
        chunk.append(t)
        if len(chunk) == COUNT_CHUNK:
            counts.update(" ".join(chunk).split())
            chunk.clear()
    if chunk:
        counts.update(" ".join(chunk).split())
    return counts
