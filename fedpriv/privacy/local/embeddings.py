"""The embedding space the local mechanisms work in: words, their ids and vectors, and which ids
may be output.

* a fedpriv run's space (an NWP run's words, a BERT run's WordPiece pieces) is read from its run
  directory by :mod:`fedpriv.runner.embeddings`. A subword space measures pieces, not words:
  :meth:`EmbeddingSpace.corpus_ids` turns corpus words into piece ids with the run's tokenizer,
  and text privatization refuses it (it would write pieces in place of words).
* :func:`load_glove`: a GloVe-style text file, one ``word v1 v2 ... vd`` per line (a word2vec
  text header ``count dim`` on the first line is accepted too). No download: give a local file.
  An extra ``<oov>`` row (the mean vector) is appended for words the file lacks. Allowed
  outputs: the words fedpriv's normalizer leaves unchanged (``normalize(w) == w``), so privatized
  text loads back exactly as written.

Words outside the vocabulary are embedded at the OOV row, so every unknown word is the same point
for the mechanisms: they are indistinguishable from each other, and the metric guarantee holds
with d(x, x') = ||phi'(x) - phi'(x')||, phi' sending unknown words to the OOV vector.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedpriv.data.tokenize import tokenize
from fedpriv.errors import DataFormatError, FedprivError
from fedpriv.privacy.local.mechanisms import TokenIndex

OOV_WORD = "<oov>"


class EmbeddingSpace:
    """Words (one per row of ``table``), a word -> id index, the (V, d) float32 table, the sorted ids
    that may be output (``allowed``) and the row unknown words take (``oov_id``).

    ``pieces``: for a subword space (a BERT run's WordPiece vocabulary), one corpus word -> the ids
    of its pieces; ``unit`` is then ``"piece"`` (else ``"word"``: a row per word)."""

    def __init__(
        self,
        words: Sequence[str],
        table: Any,
        allowed: Any,
        oov_id: int,
        source: str = "embeddings",
        info: dict | None = None,
        pieces: Callable[[str], Sequence[int]] | None = None,
    ):
        self.words: tuple[str, ...] = tuple(words)
        self.table = np.ascontiguousarray(np.asarray(table, dtype=np.float32))
        if self.table.ndim != 2 or self.table.shape[0] != len(self.words):
            raise FedprivError(f"{source}: {len(self.words)} words but a table of shape {self.table.shape}")
        if not np.all(np.isfinite(self.table)):
            raise FedprivError(f"{source}: the embedding table holds non-finite values")
        self.allowed = np.unique(np.asarray(allowed, dtype=np.int64)).astype(np.int32)
        if self.allowed.size == 0:
            raise FedprivError(f"{source}: no word may be output (the allowed set is empty)")
        if not 0 <= oov_id < len(self.words):
            raise FedprivError(f"{source}: oov id {oov_id} outside the table")
        self.oov_id = int(oov_id)
        self.source = source
        self.info: dict = dict(info or {})
        self._index: dict[str, int] = {}
        for i, w in enumerate(self.words):
            self._index.setdefault(w, i)
        self._token_index: TokenIndex | None = None
        self._pieces = pieces

    @property
    def unit(self) -> str:
        """``"word"`` (a row per word) or ``"piece"`` (a row per subword piece)."""
        return "word" if self._pieces is None else "piece"

    def corpus_ids(self, words: Iterable[str]) -> np.ndarray:
        """The ids a model of this space sees for a sequence of corpus words: one per word (the OOV
        row for unknown words), or for a subword space the pieces of each word in order."""
        if self._pieces is None:
            return self.ids(words)
        fn = self._pieces
        return np.array([i for w in words for i in fn(w)], dtype=np.int64)

    # ---- the lookup protocol of privatize_text -------------------------------------------------
    def id(self, word: str) -> int:
        """The row of ``word``; the OOV row for a word not in the vocabulary."""
        return self._index.get(word, self.oov_id)

    def ids(self, words: Iterable[str]) -> np.ndarray:
        return np.array([self._index.get(w, self.oov_id) for w in words], dtype=np.int64)

    def word(self, i: int) -> str:
        return self.words[int(i)]

    def __contains__(self, word: object) -> bool:
        return word in self._index and self._index[word] != self.oov_id  # type: ignore[index]

    def __len__(self) -> int:
        return len(self.words)

    @property
    def dim(self) -> int:
        return int(self.table.shape[1])

    def index(self) -> TokenIndex:
        """The table prepared for nearest-neighbour search over the allowed ids (built once)."""
        if self._token_index is None:
            self._token_index = TokenIndex(self.table, self.allowed)
        return self._token_index

    def describe(self) -> dict:
        return {
            "source": self.source,
            "rows": len(self.words),
            "dim": self.dim,
            "allowed_outputs": int(self.allowed.size),
            "oov_word": self.words[self.oov_id],
            "unit": self.unit,
            **self.info,
        }

    def __repr__(self) -> str:
        return f"EmbeddingSpace({self.source!r}, rows={len(self.words)}, dim={self.dim}, allowed={self.allowed.size})"


# ---- GloVe-style text -----------------------------------------------------------------------------
def normalizer_fixed_point(word: str) -> bool:
    return tokenize(word) == [word]


def load_glove(path: str | os.PathLike[str], max_words: int | None = None) -> EmbeddingSpace:
    """A GloVe-style text file: ``word v1 ... vd`` per line, UTF-8, the same d on every line.

    A first line of exactly two integers (word2vec's ``count dim`` header) is skipped. Blank lines
    are skipped. A word may contain spaces (some GloVe releases have such entries): the last d
    fields are the vector. ``max_words`` keeps the first N vectors (GloVe files are ordered by
    frequency). Malformed lines raise :class:`DataFormatError` naming the file and the 1-based
    line: too few or too many fields for the dimension, a value that is not a finite number,
    invalid UTF-8, a word given a second vector (naming its first line)."""
    p = Path(path)
    if not p.is_file():
        raise FedprivError(f"{p}: no such embeddings file")
    if max_words is not None and max_words < 1:
        raise FedprivError(f"max_words must be >= 1, got {max_words}")
    words: list[str] = []
    rows: list[np.ndarray] = []
    seen: dict[str, int] = {}  # word -> its line
    dim: int | None = None
    with open(p, "rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataFormatError(p, n, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            fields = line.rstrip(" ").split(" ")
            if dim is None and n == 1 and len(fields) == 2 and all(x.isdigit() for x in fields):
                continue  # word2vec text header: count dim
            if dim is None:
                if len(fields) < 2:
                    raise DataFormatError(p, n, "expected 'word v1 v2 ...' (a word and at least one number)")
                dim = len(fields) - 1
            if len(fields) < dim + 1:
                raise DataFormatError(p, n, f"expected a word and {dim} numbers, got {len(fields)} fields")
            if len(fields) > dim + 1 and _is_float(fields[1]):
                raise DataFormatError(p, n, f"expected a word and {dim} numbers (the first line's count), got {len(fields) - 1} numbers")
            word = " ".join(fields[:-dim])
            if not word:
                raise DataFormatError(p, n, "empty word")
            try:
                vec = np.array([float(x) for x in fields[-dim:]], dtype=np.float64)
            except ValueError:
                bad = next(x for x in fields[-dim:] if not _is_float(x))
                raise DataFormatError(p, n, f"{bad[:40]!r} is not a number (expected {dim} numbers after the word)") from None
            if not np.all(np.isfinite(vec)) or np.any(np.abs(vec) > 3.0e38):
                raise DataFormatError(p, n, "non-finite value in the vector")
            if word in seen:
                raise DataFormatError(p, n, f"{word[:40]!r} has a second vector (its first is on line {seen[word]}); an embedding file gives each word one vector")
            seen[word] = n
            words.append(word)
            rows.append(vec.astype(np.float32))
            if max_words is not None and len(words) >= max_words:
                break
    if not words:
        raise DataFormatError(p, None, "no vectors in the file")
    if OOV_WORD in seen:
        raise DataFormatError(p, None, f"the file has a vector for {OOV_WORD!r}, which fedpriv reserves for unknown words")
    table = np.stack(rows)
    oov = table.mean(axis=0, keepdims=True)
    allowed = [i for i, w in enumerate(words) if normalizer_fixed_point(w)]
    if not allowed:
        raise DataFormatError(p, None, "no word of the file is a normalized token (lowercase word or single punctuation mark)")
    return EmbeddingSpace(
        [*words, OOV_WORD],
        np.concatenate([table, oov]),
        allowed,
        len(words),
        source=f"glove {p}",
        info={"kind": "glove-text", "vectors": len(words), "not_output": len(words) - len(allowed)},
    )


def _is_float(x: str) -> bool:
    try:
        float(x)
    except ValueError:
        return False
    return True
