"""The embedding space the local mechanisms work in: words, their ids and vectors, and which ids
may be output.

* :func:`load_run_embeddings`: the input embedding table of a trained fedpriv NWP run
  (``params["embed"]["embedding"]``, shape (K + 4, d)) and its vocabulary (ids 0 pad, 1..K words,
  K+1 oov, K+2 bos, K+3 eos; see :mod:`fedpriv.vocab.word`). Allowed outputs: the K words (those
  fedpriv's normalizer leaves unchanged, which is all of them for a corpus fedpriv normalized).
* A finished fedpriv BERT run (``mlm`` or ``bert-ner``; :mod:`fedpriv.tasks.bert_run`): the rows
  are the WordPiece vocabulary's pieces (``tokenizer.json``), the table is the encoder's
  ``token_embed`` embedding (``params.msgpack``). Allowed outputs: every piece except [PAD] [UNK]
  [CLS] [SEP] [MASK] and ``[unusedN]``; unknown input is the [UNK] row. Such a space measures
  pieces, not words: :meth:`EmbeddingSpace.corpus_ids` turns corpus words into piece ids with the
  run's tokenizer (lowercasing as it says), and text privatization refuses it (it would write
  pieces in place of words).
* :func:`load_glove`: a GloVe-style text file, one ``word v1 v2 ... vd`` per line (a word2vec
  text header ``count dim`` on the first line is accepted too). No download: give a local file.
  An extra ``<oov>`` row (the mean vector) is appended for words the file lacks. Allowed
  outputs: the words fedpriv's normalizer leaves unchanged (``normalize(w) == w``), so privatized
  text loads back exactly as written.
* :func:`load_embeddings`: any of them, by what the path is (a directory: a run; a file: GloVe).

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


# ---- a fedpriv run ---------------------------------------------------------------------------------
BERT_TASKS = ("mlm", "bert-ner")


def load_run_embeddings(run_dir: str | os.PathLike[str], log: Callable[[str], None] | None = None) -> EmbeddingSpace:
    """The input embedding table and vocabulary of a trained NWP run, or of a finished BERT run
    (:func:`load_bert_run_embeddings`).

    NWP: the vocabulary is rebuilt as training built it: the run's experiment config
    (``run_config``) is loaded, its training corpora are resolved and the task is built (the first
    steps of :func:`fedpriv.pipeline.prepare`; canary planting and encoding are skipped, as the
    vocabulary is built before either). Then ``load_params`` reads the final parameters (or the
    last checkpoint's) and ``params["embed"]["embedding"]`` is the table."""
    import jax

    from fedpriv.memorization.audit import load_params, run_config
    from fedpriv.pipeline import load_training_corpora
    from fedpriv.tasks.registry import build_task

    run = Path(run_dir)
    cfg = run_config(run)
    if cfg.task.kind in BERT_TASKS:
        return load_bert_run_embeddings(run, cfg.task.kind, cfg.name)
    if cfg.task.kind != "nwp":
        raise FedprivError(f"{run}: a {cfg.task.kind!r} run; embedding spaces come from NWP or BERT (mlm, bert-ner) runs or a GloVe-style text file")
    train, _ = load_training_corpora(cfg, log or (lambda _m: None))
    task = build_task(cfg, train)
    vocab = task.vocab  # type: ignore[attr-defined]
    params, where = load_params(run, task.init_params(jax.random.key(0)))
    try:
        table = np.asarray(params["embed"]["embedding"], dtype=np.float32)
    except (KeyError, TypeError):
        raise FedprivError(f"{run}: the parameters have no embed/embedding table") from None
    if table.shape[0] != len(vocab):
        raise FedprivError(f"{run}: the embedding table has {table.shape[0]} rows but the vocabulary {len(vocab)} ids")
    k = len(vocab.words)
    words = ["<pad>", *vocab.words, "<oov>", "<bos>", "<eos>"]
    allowed = [i for i in range(1, k + 1) if _normalizer_fixed_point(words[i])]
    if not allowed:
        raise FedprivError(f"{run}: no vocabulary word is a normalized token")
    return EmbeddingSpace(
        words,
        table,
        allowed,
        vocab.oov,
        source=f"run {run} ({where})",
        info={"kind": "fedpriv-nwp-run", "vocab_words": k, "experiment": cfg.name, "not_output": k - len(allowed)},
    )


def load_bert_run_embeddings(run_dir: str | os.PathLike[str], kind: str = "mlm", experiment: str | None = None) -> EmbeddingSpace:
    """The WordPiece space of a finished BERT run: rows = the pieces of its ``tokenizer.json``,
    table = the encoder's ``token_embed`` embedding of its final ``params.msgpack``, allowed = every
    piece but [PAD] [UNK] [CLS] [SEP] [MASK] and [unusedN] (the masked LM's replacement pool),
    unknown input = [UNK]. Corpus words become pieces with the run's tokenizer
    (:meth:`EmbeddingSpace.corpus_ids`)."""
    from fedpriv.tasks.bert_run import PARAMS_FILE, TOKENIZER_FILE, load_pretrained
    from fedpriv.tasks.mlm import PieceVocab

    run = Path(run_dir)
    if not (run / TOKENIZER_FILE).is_file():
        raise FedprivError(f"{run}: a {kind!r} run without {TOKENIZER_FILE}; is it a finished fedpriv BERT run?")
    if not (run / PARAMS_FILE).is_file():
        raise FedprivError(f"{run}: a {kind!r} run without final parameters ({PARAMS_FILE}); finish the run first")
    pre = load_pretrained(run)
    try:
        table = np.asarray(pre.encoder["token_embed"]["embedding"], dtype=np.float32)
    except (KeyError, TypeError):
        raise FedprivError(f"{run / PARAMS_FILE}: the encoder has no token_embed/embedding table") from None
    vocab = PieceVocab(pre.tokenizer.wordpiece, pre.tokenizer.lowercase)
    return EmbeddingSpace(
        vocab.tokens,
        table,
        vocab.pool,
        vocab.unk,
        source=f"run {run} (final parameters)",
        info={"kind": "fedpriv-bert-run", "task": kind, "pieces": len(vocab), "lowercase": vocab.lowercase,
              "experiment": experiment, "not_output": len(vocab) - int(vocab.pool.size)},
        pieces=vocab.word_ids,
    )


# ---- GloVe-style text -----------------------------------------------------------------------------
def _normalizer_fixed_point(word: str) -> bool:
    return tokenize(word) == [word]


def load_glove(path: str | os.PathLike[str], max_words: int | None = None) -> EmbeddingSpace:
    """A GloVe-style text file: ``word v1 ... vd`` per line, UTF-8, the same d on every line.

    A first line of exactly two integers (word2vec's ``count dim`` header) is skipped. Blank lines
    are skipped. A word may contain spaces (some GloVe releases have such entries): the last d
    fields are the vector. ``max_words`` keeps the first N vectors (GloVe files are ordered by
    frequency). A repeated word keeps its first vector (later ones are counted in ``info``).
    Malformed lines raise :class:`DataFormatError` naming the file and the 1-based line: too few
    or too many fields for the dimension, a value that is not a finite number, invalid UTF-8."""
    p = Path(path)
    if not p.is_file():
        raise FedprivError(f"{p}: no such embeddings file")
    if max_words is not None and max_words < 1:
        raise FedprivError(f"max_words must be >= 1, got {max_words}")
    words: list[str] = []
    rows: list[np.ndarray] = []
    seen: set[str] = set()
    duplicates = 0
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
                duplicates += 1
                continue
            seen.add(word)
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
    allowed = [i for i, w in enumerate(words) if _normalizer_fixed_point(w)]
    if not allowed:
        raise DataFormatError(p, None, "no word of the file is a normalized token (lowercase word or single punctuation mark)")
    return EmbeddingSpace(
        [*words, OOV_WORD],
        np.concatenate([table, oov]),
        allowed,
        len(words),
        source=f"glove {p}",
        info={"kind": "glove-text", "vectors": len(words), "duplicates_skipped": duplicates, "not_output": len(words) - len(allowed)},
    )


def _is_float(x: str) -> bool:
    try:
        float(x)
    except ValueError:
        return False
    return True


def load_embeddings(
    spec: str | os.PathLike[str], max_words: int | None = None, log: Callable[[str], None] | None = None, pieces: bool = False
) -> EmbeddingSpace:
    """A run directory (NWP, or BERT when ``pieces``) or a GloVe-style text file, by what ``spec``
    is. Without ``pieces`` a subword space (a BERT run) is refused: privatizing text needs a row
    per word."""
    p = Path(spec)
    if p.is_dir():
        if max_words is not None:
            raise FedprivError("max_words applies to GloVe-style files, not to run directories")
        space = load_run_embeddings(p, log)
        if space.unit != "word" and not pieces:
            raise FedprivError(
                f"{p}: a BERT run's embedding space holds WordPiece pieces, not words; privatizing text needs word "
                "embeddings (an NWP run or a GloVe-style file). BERT spaces are for measurements ([[measure]])."
            )
        return space
    if p.is_file():
        return load_glove(p, max_words)
    raise FedprivError(f"{spec}: no such run directory or embeddings file")
