"""Empirical privacy: audit canaries included at random, planted at the right unit, scored, and
bounded from below with jax-privacy's one-run auditor."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedpriv.data.shakespeare import load_shakespeare
from fedpriv.errors import FedprivError
from fedpriv.memorization.empirical import (
    CANARY_USER_PREFIX,
    AuditCanaries,
    client_direction,
    direction_scores,
    draw_audit_canaries,
    empirical_bounds,
    plant_audit_canaries,
)
from fedpriv.tasks.nwp import NWPTask
from fedpriv.vocab.word import WordVocab


@pytest.fixture(scope="module")
def corpus_and_task():
    corpus = load_shakespeare().truncated(4).subset(list(load_shakespeare().user_ids)[:40])
    vocab = WordVocab.build((e.text for e in corpus.records()), 200)
    return corpus, NWPTask(vocab, seq_len=10, model="tiny")


def test_inclusion_is_a_fair_coin_per_canary_and_fixed_by_the_seed(corpus_and_task):
    _, task = corpus_and_task
    a = draw_audit_canaries(task, 2000, 5, "example", seed=3)
    assert abs(a.included.mean() - 0.5) < 3 * 0.5 / np.sqrt(2000)  # within 3 standard errors of 1/2
    b = draw_audit_canaries(task, 2000, 5, "example", seed=3)
    assert np.array_equal(a.included, b.included) and a.words == b.words
    assert not np.array_equal(a.included, draw_audit_canaries(task, 2000, 5, "example", seed=4).included)
    assert all(len(w) == 5 and all(x in task.vocab.words for x in w) for w in a.words)


@pytest.mark.parametrize("kind", ["example", "user"])
def test_only_members_are_planted_at_the_canarys_unit(corpus_and_task, kind):
    corpus, task = corpus_and_task
    canaries = draw_audit_canaries(task, 30, 4, kind, seed=1)
    planted = plant_audit_canaries(corpus, canaries)
    texts = [e.text for e in planted.records()]
    for member, words, host in zip(canaries.included, canaries.words, canaries.hosts):
        assert texts.count(" ".join(words)) == (1 if member else 0)
        assert (host is not None) == bool(member)
    members = int(canaries.included.sum())
    assert planted.num_examples == corpus.num_examples + members
    if kind == "user":  # each member is a new user holding only its canary
        assert planted.num_users == corpus.num_users + members
        for host, words in zip(canaries.hosts, canaries.words):
            if host is not None:
                assert host.startswith(CANARY_USER_PREFIX) and [e.text for e in planted.examples(host)] == [" ".join(words)]
    else:  # each member joins an existing user
        assert planted.num_users == corpus.num_users


def test_the_manifest_round_trips(tmp_path, corpus_and_task):
    _, task = corpus_and_task
    a = draw_audit_canaries(task, 10, 3, "user", seed=2)
    a.save(tmp_path)
    assert AuditCanaries.load(tmp_path).to_json() == a.to_json()
    with pytest.raises(FedprivError, match="empirical = true"):
        AuditCanaries.load(tmp_path / "nothing")


def test_bounds_are_positive_for_separated_scores_and_zero_for_indistinguishable_ones():
    rng = np.random.default_rng(0)
    included = rng.random(1000) < 0.5
    separated = np.where(included, 10.0, 0.0) + rng.normal(0, 0.1, 1000)
    strong = empirical_bounds(separated, included, 1e-5)
    assert strong["epsilon_lower_bound"] > 2.0 and strong["auroc"] == pytest.approx(1.0)
    noise = rng.normal(0, 1, 1000)
    weak = empirical_bounds(noise, included, 1e-5)
    assert weak["epsilon_lower_bound"] < 0.5 and abs(weak["auroc"] - 0.5) < 0.1
    with pytest.raises(FedprivError, match="both members and non-members"):
        empirical_bounds(noise, np.ones(1000, bool), 1e-5)


def test_the_bound_is_jax_privacys_one_run_bound_at_95_percent_confidence():
    """Cross-check against jax-privacy's auditor called directly, at significance 0.05 (a
    significance of 0.95 gave a far larger 'bound' and passed every other test)."""
    from jax_privacy.auditing import CanaryScoreAuditor

    rng = np.random.default_rng(0)
    included = rng.random(1000) < 0.5
    scores = np.where(included, 1.0, 0.0) + rng.normal(0, 1.0, 1000)
    bounds = empirical_bounds(scores, included, 1e-5)
    want = CanaryScoreAuditor(scores[included], scores[~included]).epsilon_one_run(0.05, 1e-5)
    assert bounds["epsilon_lower_bound"] == pytest.approx(want, rel=1e-9) and bounds["confidence"] == 0.95


def test_a_data_canarys_score_is_minus_its_loss(corpus_and_task):
    """Members were trained on, so they score higher: the score is minus the loss (a score of
    plus the loss turns every bound into one about non-members)."""
    from fedpriv.data.examples import TextExample
    from fedpriv.memorization.empirical import canary_scores

    _, task = corpus_and_task
    params = task.init_params(jax.random.key(0))
    canaries = draw_audit_canaries(task, 6, 5, "example", seed=1)
    encoded = task.encode([TextExample(" ".join(w)) for w in canaries.words])
    losses = np.asarray(task.losses(params, encoded, jax.random.key(0), False))
    np.testing.assert_allclose(canary_scores(task, params, canaries), -losses, rtol=1e-5)


def test_a_client_directions_norm_and_its_cosine_score():
    template = {"w": jnp.zeros((30, 20)), "b": jnp.zeros(7)}
    u = client_direction(5, 3, template, 2.5)
    assert float(jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree.leaves(u)))) == pytest.approx(2.5, rel=1e-5)
    final = jax.tree.map(lambda a, b: a + b, template, client_direction(5, 3, template, 1.0))  # the model moved along canary 3
    scores = direction_scores(5, 6, template, final)
    assert scores[3] == pytest.approx(1.0, abs=1e-5) and np.all(np.abs(np.delete(scores, 3)) < 0.3)
