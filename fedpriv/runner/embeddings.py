"""Embedding spaces from fedpriv runs: the input embedding table and vocabulary of a trained NWP
run, or the WordPiece space of a finished BERT run, read from the run directory
(:mod:`fedpriv.rundir`); and :func:`load_embeddings`, a run directory or a GloVe-style file by
what the path is. The space itself is :class:`fedpriv.privacy.local.embeddings.EmbeddingSpace`.

* NWP run: ``params["embed"]["embedding"]`` (shape (K + 4, d)) and its vocabulary (ids 0 pad,
  1..K words, K+1 oov, K+2 bos, K+3 eos; :mod:`fedpriv.vocab.word`). Allowed outputs: the K
  words fedpriv's normalizer leaves unchanged (all of them for a corpus fedpriv normalized).
* BERT run (``mlm`` or ``bert-ner``): the rows are the WordPiece vocabulary's pieces
  (``tokenizer.json``), the table is the encoder's ``token_embed`` embedding. Allowed outputs:
  every piece except [PAD] [UNK] [CLS] [SEP] [MASK] and ``[unusedN]``; unknown input is [UNK].
  Such a space measures pieces, not words; text privatization refuses it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from fedpriv.errors import FedprivError
from fedpriv.privacy.local.embeddings import EmbeddingSpace, load_glove, normalizer_fixed_point
from fedpriv.rundir import PARAMS, TOKENIZER, WORD_VOCAB, RunDir
from fedpriv.tasks.bert_run import load_pretrained
from fedpriv.tasks.mlm import PieceVocab
from fedpriv.tasks.nwp import NWPTask
from fedpriv.vocab.word import WordVocab

BERT_TASKS = ("mlm", "bert-ner")


def load_run_embeddings(run_dir: str | os.PathLike[str], log: Callable[[str], None] | None = None) -> EmbeddingSpace:
    """The input embedding table and vocabulary of a trained NWP run, or of a finished BERT run
    (:func:`load_bert_run_embeddings`).

    NWP: the vocabulary is the run's ``vocab.json`` and the table ``params["embed"]["embedding"]``
    of its final parameters (or its last checkpoint's); nothing is rebuilt from the corpus."""
    run = RunDir(run_dir)
    cfg = run.experiment_config()
    if cfg.task.kind in BERT_TASKS:
        return load_bert_run_embeddings(run.path, cfg.task.kind, cfg.name)
    if cfg.task.kind != "nwp":
        raise FedprivError(f"{run.path}: a {cfg.task.kind!r} run; embedding spaces come from NWP or BERT (mlm, bert-ner) runs or a GloVe-style text file")
    if not run.has(WORD_VOCAB):
        raise FedprivError(f"{run.path}: an NWP run without {WORD_VOCAB} (written by fedpriv before runs kept their vocabulary); train it again")
    task = NWPTask(WordVocab.load(run.file(WORD_VOCAB)), cfg.vocab.seq_len, cfg.task.model, **cfg.task.options)
    vocab = task.vocab
    params, where = run.load_params(task.init_params(jax.random.key(0)))
    try:
        table = np.asarray(params["embed"]["embedding"], dtype=np.float32)
    except (KeyError, TypeError):
        raise FedprivError(f"{run.path}: the parameters have no embed/embedding table") from None
    if table.shape[0] != len(vocab):
        raise FedprivError(f"{run.path}: the embedding table has {table.shape[0]} rows but the vocabulary {len(vocab)} ids")
    k = len(vocab.words)
    words = ["<pad>", *vocab.words, "<oov>", "<bos>", "<eos>"]
    allowed = [i for i in range(1, k + 1) if normalizer_fixed_point(words[i])]
    if not allowed:
        raise FedprivError(f"{run.path}: no vocabulary word is a normalized token")
    return EmbeddingSpace(
        words,
        table,
        allowed,
        vocab.oov,
        source=f"run {run.path} ({where})",
        info={"kind": "fedpriv-nwp-run", "vocab_words": k, "experiment": cfg.name, "not_output": k - len(allowed)},
    )


def load_bert_run_embeddings(run_dir: str | os.PathLike[str], kind: str = "mlm", experiment: str | None = None) -> EmbeddingSpace:
    """The WordPiece space of a finished BERT run: rows = the pieces of its ``tokenizer.json``,
    table = the encoder's ``token_embed`` embedding of its final ``params.msgpack``, allowed = every
    piece but [PAD] [UNK] [CLS] [SEP] [MASK] and [unusedN] (the masked LM's replacement pool),
    unknown input = [UNK]. Corpus words become pieces with the run's tokenizer
    (:meth:`EmbeddingSpace.corpus_ids`)."""
    run = Path(run_dir)
    if not (run / TOKENIZER).is_file():
        raise FedprivError(f"{run}: a {kind!r} run without {TOKENIZER}; is it a finished fedpriv BERT run?")
    if not (run / PARAMS).is_file():
        raise FedprivError(f"{run}: a {kind!r} run without final parameters ({PARAMS}); finish the run first")
    pre = load_pretrained(run)
    try:
        table = np.asarray(pre.encoder["token_embed"]["embedding"], dtype=np.float32)
    except (KeyError, TypeError):
        raise FedprivError(f"{run / PARAMS}: the encoder has no token_embed/embedding table") from None
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
