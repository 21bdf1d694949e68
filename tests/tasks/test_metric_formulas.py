"""Utility metric formulas pinned: NWP perplexity per token, NER entities cut by the length limit."""

from __future__ import annotations

import math

import pytest


def test_nwp_perplexity_is_exp_of_the_loss_per_token():
    from fedpriv.tasks.nwp import NWPTask
    from fedpriv.vocab.word import WordVocab

    task = NWPTask(WordVocab(["a", "b"]), seq_len=4, model="tiny")
    sums = {"examples": 2.0, "tokens": 8.0, "loss_sum": 8 * math.log(3.0), "correct": 4.0, "tokens_no_oov": 8.0, "correct_no_oov": 4.0,
            "tokens_no_oov_eos": 6.0, "correct_no_oov_eos": 3.0}
    out = task.summarize(sums)
    assert out["perplexity"] == pytest.approx(3.0) and out["loss"] == pytest.approx(math.log(3.0))


def test_ner_entities_cut_by_the_length_limit_count_as_missed():
    import jax.numpy as jnp

    from fedpriv.tasks.ner_metrics import chunk_tables, summarize_tagging, tagging_sums

    tags = ["O", "B-PER", "I-PER"]
    tables = chunk_tables(tags)
    gold = jnp.array([[1, 2, 0]], jnp.int32)  # one PER entity, predicted exactly
    sums = tagging_sums(gold, gold, jnp.array([3]), tables, jnp.ones((1, 3)), jnp.ones(1), 0.0, gold_cut=jnp.array([1.0]))
    out = summarize_tagging({k: float(v) if k != "pred_hist" else v for k, v in sums.items()})
    assert (out["entities_gold"], out["entities_correct"]) == (2, 1) and out["recall"] == 0.5
