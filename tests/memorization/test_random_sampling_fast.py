"""Fast Random Sampling (fedpriv.memorization.rs_fast): the reference's ranks with less work.

Every test compares with the reference (:func:`random_sampling`) on the same candidates: rank,
lower and the canary's log-perplexity must be identical, not close."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from memorization_helpers import initial_params

from fedpriv.memorization.exposure import FIT_SAMPLES, extrapolated_exposure
from fedpriv.memorization.lm import NWPStepper
from fedpriv.memorization.lstm_tables import cell, tables_for
from fedpriv.memorization.random_sampling import draw_suffixes, random_sampling, suffix_log_probs
from fedpriv.memorization.rs_audit import audit_random_sampling, fit_rows
from fedpriv.memorization.rs_fast import fast_random_sampling
from fedpriv.memorization.rs_kernels import lse_bounds
from fedpriv.models.nwp import NWPConfig
from fedpriv.tasks.nwp import NWPTask
from fedpriv.vocab.word import WordVocab

TINY_TIED = NWPConfig(embed_dim=16, lstm_units=32, projection_dim=16, tie_embeddings=True)


def stepper_for(n_words: int, model, factor: float, seed: int = 0) -> NWPStepper:
    """Random parameters scaled by ``factor`` (larger: sharper next-word distributions)."""
    task = NWPTask(WordVocab([f"w{i}" for i in range(n_words)]), seq_len=8, model=model)
    return NWPStepper(task, jax.tree_util.tree_map(lambda x: x * factor, initial_params(task, seed)))


def assert_same(stepper, canary, suffixes, prefix_words=2, score_rows=None):
    """Fast and reference results identical; the fast scores of ``score_rows`` within rounding."""
    want, ref_scores = random_sampling(stepper, canary, prefix_words, suffixes)
    got, scores, stats = fast_random_sampling(stepper, canary, prefix_words, suffixes, score_rows=score_rows)
    assert got == want, (got, want, stats)
    assert not stats.fallback
    rows = np.arange(len(suffixes)) if score_rows is None else score_rows
    # float32 sums of log-probabilities up to about 200, where one float32 ulp is 1.5e-5: "within
    # rounding" is a few ulps (rtol 5e-7 = 4 ulps), not an absolute 1e-5 that only equal rounding meets.
    np.testing.assert_allclose(scores, ref_scores[rows], rtol=5e-7, atol=1e-5)
    return got, ref_scores, stats


MODELS = [(30, "tiny", 4.0), (300, "tiny", 3.0), (200, "small", 2.0), (60, TINY_TIED, 4.0)]


@pytest.mark.parametrize("n_words,model,factor", MODELS)
def test_ranks_equal_the_reference_on_several_models_and_canaries(n_words, model, factor):
    stepper = stepper_for(n_words, model, factor)
    pool = stepper.word_ids()
    for ci in range(3):
        canary = pool[np.random.default_rng(ci).choice(len(pool), 5)]
        suffixes = draw_suffixes(pool, None, 3, 6000, canary[2:], seed=0, canary_index=ci)
        _, ref_scores, _ = assert_same(stepper, canary, suffixes, score_rows=np.arange(0, 6000, 11))
        # the best and the worst suffix planted as the canary: every other suffix above the best,
        # every other at or below the worst; a duplicate of the canary ties and counts against it
        for pick in (np.argmin, np.argmax):
            i = pick(ref_scores)
            copies = int(np.sum(np.all(suffixes == suffixes[i], axis=1)))  # the pick itself and its duplicates
            top, _, _ = assert_same(stepper, np.r_[canary[:2], suffixes[i]], np.delete(suffixes, i, axis=0), score_rows=np.arange(5))
            assert top.rank == (copies if pick is np.argmin else len(suffixes))


def test_every_candidate_of_an_enumerable_space():
    """12 words, 3-word suffixes: the whole space (1,727 others) against canaries of every rank."""
    stepper = stepper_for(12, "tiny", 4.0, seed=3)
    pool = stepper.word_ids()
    space = np.array(list(itertools.product(pool, repeat=3)), np.int32)
    prefix = np.array([stepper.vocab.bos, 2, 5], np.int32)
    ppl = -suffix_log_probs(stepper, prefix, space)
    order = np.argsort(ppl)
    for r in (0, 1, 2, 10, 100, 863, 1700, 1727):
        c = order[r]
        others = np.delete(space, c, axis=0)
        got, _, _ = assert_same(stepper, np.r_[2, 5, space[c]], others, score_rows=np.arange(3))
        assert got.rank == 1 + int(np.sum(np.delete(ppl, c) <= ppl[c]))  # a tie counts against the canary


def test_two_word_suffixes_and_other_lengths():
    stepper = stepper_for(40, "tiny", 4.0)
    pool = stepper.word_ids()
    canary = np.array([3, 4, 5, 6, 7], np.int32)
    for prefix_words in (1, 2, 3, 4):  # suffixes of 4 and 1 words use the reference
        suffixes = draw_suffixes(pool, None, 5 - prefix_words, 3000, canary[prefix_words:], seed=2, canary_index=prefix_words)
        assert_same(stepper, canary, suffixes, prefix_words)


def test_ties_are_counted_as_the_reference_counts_them():
    """A model whose next-word log-probabilities ignore the state (zero output kernel, random
    biases): a suffix scores the sum of its words' terms. Copies of the canary's suffix tie with
    it exactly and are not 'strictly lower'; its words in another order score within a float32
    rounding of it (equal, or one float32 step lower, here) and are decided by the reference.
    With zero biases too, every suffix ties and the canary ranks last: a tie never puts it ahead."""
    stepper = stepper_for(20, "tiny", 3.0)
    params = jax.tree_util.tree_map(lambda x: x, stepper.params)
    params["output"]["kernel"] = jnp.zeros_like(params["output"]["kernel"])
    params["output"]["bias"] = jax.random.normal(jax.random.key(1), params["output"]["bias"].shape)
    biased = NWPStepper(stepper.task, params)
    canary = np.array([3, 4, 5, 6, 7], np.int32)
    perms = np.array([p for p in itertools.permutations(canary[2:]) if p != tuple(canary[2:])], np.int32)
    copies = np.tile(canary[2:], (3, 1))
    suffixes = np.concatenate([copies, perms, draw_suffixes(biased.word_ids(), None, 3, 3000, canary[2:], seed=0, canary_index=0), perms])
    got, ref_scores, stats = assert_same(biased, canary, suffixes, score_rows=np.arange(10))
    c = got.canary_log_perplexity
    assert np.sum(ref_scores == c) >= len(copies)  # exact ties ...
    assert np.all(np.abs(ref_scores[: len(copies) + len(perms)] - c) < 1e-6)  # near ties ...
    assert stats.rechecked >= len(copies) + 2 * len(perms)  # ... decided by the reference
    # a word predicted with probability 1 (in float32) ends the canary: t3 = 0 exactly, so bound 1
    # (t1 + t2 <= score) is tight; word 8 scores a hair (1e-5 nats) better than the canary's 5,
    # so (8, 6, 7) and (6, 8, 7) are lower than the canary right at the pruning threshold
    bias = params["output"]["bias"].at[7].set(50.0)
    params["output"]["bias"] = bias.at[8].set(bias[5] + 1e-5)
    sure = NWPStepper(stepper.task, params)
    hair = np.array([[8, 6, 7], [6, 8, 7]], np.int32)
    tight = np.concatenate([copies, hair, draw_suffixes(sure.word_ids(), None, 3, 3000, canary[2:], seed=1, canary_index=0)])
    got, ref_scores, stats = assert_same(sure, canary, tight, score_rows=np.arange(3))
    gap = got.canary_log_perplexity - ref_scores[len(copies) : len(copies) + 2]
    assert np.all((gap > 0) & (gap < 1e-4)) and stats.rechecked >= 5
    params["output"]["bias"] = jnp.zeros_like(params["output"]["bias"])
    flat = NWPStepper(stepper.task, params)
    got, ref_scores, stats = assert_same(flat, canary, suffixes[:500], score_rows=np.arange(10))
    assert np.all(ref_scores == got.canary_log_perplexity) and stats.rechecked == 500
    assert got.rank == 501 and not got.memorized  # the flat model knows nothing: exposure 0, not log2 |R|


def trained_stepper(canary: np.ndarray, n_words: int = 50, steps: int = 300) -> NWPStepper:
    """A tiny model trained (Adam) on 256 sentences, 64 of them the canary."""
    task = NWPTask(WordVocab([f"w{i}" for i in range(n_words)]), seq_len=8, model="tiny")
    v = task.vocab
    rng = np.random.default_rng(0)
    rows = [canary if i < 64 else rng.integers(1, n_words + 1, 5) for i in range(256)]
    ids = np.zeros((256, 9), np.int32)
    for i, r in enumerate(rows):
        ids[i, : len(r) + 2] = np.r_[v.bos, r, v.eos]
    batch = {"ids": jnp.asarray(ids), "mask": jnp.ones(256)}
    params = task.init_params(jax.random.key(0))
    tx = optax.adam(0.02)

    @jax.jit
    def step(params, state):
        g = jax.grad(lambda p: jnp.mean(task.losses(p, batch, None, True)))(params)
        upd, state = tx.update(g, state, params)
        return optax.apply_updates(params, upd), state

    state = tx.init(params)
    for _ in range(steps):
        params, state = step(params, state)
    return NWPStepper(task, params)


def test_a_trained_model_memorizes_its_canary_and_the_bounds_drop_the_rest():
    canary = np.array([7, 21, 3, 38, 12], np.int32)
    stepper = trained_stepper(canary)
    pool = stepper.word_ids()
    suffixes = draw_suffixes(pool, None, 3, 20_000, canary[2:], seed=0, canary_index=0)
    got, _, stats = assert_same(stepper, canary, suffixes, score_rows=np.arange(10))
    assert got.rank == 1
    assert stats.after_bound1 < 2_000 and stats.scored < 200  # forced rows (10 + spot checks) included
    other = np.array([30, 2, 44, 9, 17], np.int32)  # never seen: not memorized
    got, _, stats = assert_same(stepper, other, draw_suffixes(pool, None, 3, 20_000, other[2:], seed=0, canary_index=1), score_rows=np.arange(10))
    assert got.rank > 100


def test_log_normalizer_bounds_hold_and_are_tight():
    """lse(p) = logsumexp(p @ w + b) lies within the bounds from an anchor a, for random output
    layers and for two columns +-R e1 (where the curvature R^2 is reached: near the anchor the
    quadratic bound is exact to second order, so a smaller constant would fail)."""
    rng = np.random.default_rng(0)

    def check(w, b, a, d):
        lse = jax.nn.logsumexp
        la = lse(a @ w + b, axis=-1)
        g = jax.nn.softmax(a @ w + b, axis=-1) @ w.T
        center = jnp.mean(w, axis=1)
        radius = jnp.max(jnp.linalg.norm(w - center[:, None], axis=0))
        lo, hi = lse_bounds(la, g, d, center, radius)
        exact = lse((a + d) @ w + b, axis=-1)
        assert np.all(lo <= exact + 1e-4) and np.all(exact <= hi + 1e-4)
        return np.asarray(hi - exact)

    for scale in (0.1, 1.0, 3.0):
        w = jnp.asarray(rng.normal(size=(8, 50)) * scale, jnp.float32)
        b = jnp.asarray(rng.normal(size=50), jnp.float32)
        a = jnp.asarray(rng.normal(size=(200, 8)), jnp.float32)
        check(w, b, a, jnp.asarray(rng.normal(size=(200, 8)) * rng.uniform(0.01, 2, (200, 1)), jnp.float32))
    r = 3.0
    w = jnp.asarray([[r, -r], [0.0, 0.0]], jnp.float32)
    steps = jnp.asarray([[x, 0.0] for x in (0.01, 0.03, 0.1)], jnp.float32)
    gap = check(w, jnp.zeros(2), jnp.zeros((3, 2)), steps)
    assert np.all(gap < 0.2 * (r * np.asarray(steps[:, 0])) ** 2)  # R^2 x^2 / 2 against log cosh(R x)


def test_tables_step_like_the_model():
    stepper = stepper_for(30, "small", 2.0)
    t = tables_for(stepper)
    assert tables_for(stepper) is t  # built once per stepper
    h, c, _, _ = stepper.run(np.array([[stepper.vocab.bos, 3, 4]] * 4, np.int32))
    tokens = np.array([1, 5, 9, 30], np.int32)
    want_h, want_c, _, _ = stepper.advance(h, c, tokens)
    got_h, got_c = cell(t.gates_in[tokens] + h @ t.wh, c)
    np.testing.assert_allclose(got_h, want_h, atol=1e-6)
    np.testing.assert_allclose(got_c, want_c, atol=1e-6)


def test_reference_scores_do_not_depend_on_the_rows_scored_with_them():
    """What the recheck relies on: the reference gives a row the same bits whatever other rows
    it scores with it (one row alone included)."""
    stepper = stepper_for(200, "small", 2.0)
    pool = stepper.word_ids()
    prefix = np.array([stepper.vocab.bos, 3, 4], np.int32)
    suffixes = draw_suffixes(pool, None, 3, 3000, np.array([-1, -1, -1]), seed=0, canary_index=0)
    full = suffix_log_probs(stepper, prefix, suffixes)
    rng = np.random.default_rng(0)
    for k in (1, 2, 65, 700):
        idx = rng.choice(len(suffixes), k, replace=False)
        assert np.array_equal(suffix_log_probs(stepper, prefix, suffixes[idx]), full[idx])
    same_start = np.flatnonzero(suffixes[:, 0] == suffixes[0, 0])  # one distinct first word
    assert np.array_equal(suffix_log_probs(stepper, prefix, suffixes[same_start]), full[same_start])


def test_audit_scores_give_the_fit_of_all_scores():
    stepper = stepper_for(40, "tiny", 4.0)
    pool = stepper.word_ids()
    canary = np.array([3, 4, 5, 6, 7], np.int32)
    n = FIT_SAMPLES + 3000
    suffixes = draw_suffixes(pool, None, 3, n, canary[2:], seed=0, canary_index=0)
    assert np.array_equal(fit_rows(10, 5), np.arange(10)) and len(fit_rows(n, 5)) == FIT_SAMPLES
    want, all_scores = random_sampling(stepper, canary, 2, suffixes)
    got, fit_scores = audit_random_sampling(stepper, canary, 2, suffixes, 512, fit_seed=5)
    assert got == want
    space = 40.0**3
    exact = extrapolated_exposure(want.canary_log_perplexity, all_scores, space, seed=5)
    assert extrapolated_exposure(got.canary_log_perplexity, fit_scores, space, seed=5) == pytest.approx(exact, abs=1e-4)
