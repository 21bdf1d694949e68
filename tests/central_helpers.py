"""Shared by the central DP-SGD tests: a small Shakespeare NWP task and its encoded data, a
training config, and a run of DP-SGD through the central loop."""

from __future__ import annotations

import jax
import numpy as np
import optax

from fedpriv.central.dpsgd import DPSGDStepper
from fedpriv.central.train import train_central
from fedpriv.config import TrainingConfig
from fedpriv.data.shakespeare import load_shakespeare
from fedpriv.runner.prepare import encode_corpus
from fedpriv.tasks.nwp import NWPTask
from fedpriv.vocab.word import WordVocab


def shakespeare_nwp():
    """(task, encoded arrays, user counts): speakers with >= 40 lines, 400 words, seq_len 10, tiny LSTM."""
    corpus = load_shakespeare().with_min_examples(40)
    vocab = WordVocab.build((e.text for e in corpus.records()), 400)
    task = NWPTask(vocab, seq_len=10, model="tiny")
    return task, encode_corpus(task, corpus), corpus.counts()


def tcfg(**kw) -> TrainingConfig:
    base = dict(optimizer="sgd", learning_rate=0.5, batch_size=32, steps=6, eval_every=3, checkpoint_every=2)
    base.update(kw)
    return TrainingConfig(**base)


def run(task, arrays, counts, tmp_path, name, dp, cfg, noise=None, **kw):
    """DP-SGD with ``dp`` trained by the central loop into ``tmp_path / name``: (result, stepper).
    ``noise``: a :class:`~fedpriv.privacy.streams.NoiseSeed` (default: the seed 0, a simulation)."""
    stepper = DPSGDStepper(task, arrays, cfg, dp, 0, optax.sgd(cfg.learning_rate), cfg.steps, user_counts=counts, noise=noise)
    return train_central(task, arrays, counts, cfg, 0, tmp_path / name, stepper=stepper, **kw), stepper


def flat(params) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(params)])
