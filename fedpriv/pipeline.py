"""From an experiment config to the data every training of the experiment uses.

``prepare_data`` resolves the source, filters users, holds out users by a stable hash, builds the
top-K word vocabulary on the training users only (so held-out users never shape the vocabulary)
and encodes the training records to fixed-length id sequences.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedpriv.config import ExperimentConfig, load_config
from fedpriv.data.corpus import FederatedCorpus
from fedpriv.data.sources import open_corpus
from fedpriv.errors import FedprivError
from fedpriv.vocab.word import WordVocab


@dataclass
class PreparedData:
    config: ExperimentConfig
    train: FederatedCorpus
    heldout: FederatedCorpus | None
    vocab: WordVocab
    train_ids: np.ndarray  # (records, seq_len + 1) int32, records in corpus order

    def summary(self) -> dict:
        ids = self.train_ids
        body = ids[:, 1:]
        real = body[(body != self.vocab.pad) & (body != self.vocab.eos)]
        return {
            "experiment": self.config.name,
            "source": self.train.name,
            "train_users": self.train.num_users,
            "train_examples": self.train.num_examples,
            "heldout_users": self.heldout.num_users if self.heldout is not None else 0,
            "heldout_examples": self.heldout.num_examples if self.heldout is not None else 0,
            "vocab_size_with_specials": len(self.vocab),
            "encoded_shape": f"{ids.shape[0]} x {ids.shape[1]}",
            "oov_rate": float((real == self.vocab.oov).mean()) if real.size else 0.0,
        }


def prepare_data(config: ExperimentConfig | str | os.PathLike[str], log: Callable[[str], None] | None = None) -> PreparedData:
    """Load, filter, split, build the vocabulary and encode (see the module docstring)."""
    cfg = config if isinstance(config, ExperimentConfig) else load_config(Path(config))
    say = log or (lambda _msg: None)
    d = cfg.data
    say(f"loading {d.source} ...")
    corpus = open_corpus(d.source, format=d.format, **d.options)
    if corpus.kind != "text":
        raise FedprivError(f"{d.source}: the NWP pipeline needs text examples, this source has {corpus.kind} ones")
    if d.min_examples > 1:
        corpus = corpus.with_min_examples(d.min_examples)
    if d.max_examples_per_user is not None:
        corpus = corpus.truncated(d.max_examples_per_user)
    heldout = None
    if d.heldout_fraction > 0:
        corpus, heldout = corpus.split_heldout_users(d.heldout_fraction, salt=f"{cfg.name}:{cfg.seed}")
    say(f"{corpus.num_users} training users, {corpus.num_examples} examples; building the vocabulary ...")
    texts = [ex.text for ex in corpus.records()]
    vocab = WordVocab.build(texts, cfg.vocab.size)
    ids = vocab.encode_batch(texts, cfg.vocab.seq_len)
    return PreparedData(cfg, corpus, heldout, vocab, ids)
