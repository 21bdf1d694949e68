"""Means with hierarchical bootstrap intervals (seeds, then canaries), on cases whose answer is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedpriv.report.intervals import interval, paired_difference


def test_constant_values_give_a_point_interval():
    est = interval([[3.0] * 10, [3.0] * 10])
    assert (est.mean, est.low, est.high, est.seeds, est.values) == (3.0, 3.0, 3.0, 2, 20)


def test_one_seed_of_many_canaries_matches_the_normal_approximation():
    rng = np.random.default_rng(7)
    values = (rng.random(4000) < 0.3).astype(float)
    est = interval([values])
    p, n = values.mean(), len(values)
    half = 1.96 * math.sqrt(p * (1 - p) / n)
    assert est.mean == pytest.approx(p)
    # tolerance: the bootstrap percentile interval of a proportion at n = 4000 is within 10% of the Wald width
    assert (est.high - est.low) == pytest.approx(2 * half, rel=0.1)
    assert est.low < p < est.high


def test_seed_variation_enters_the_interval():
    # Two seeds, constant within each: a replicate's mean is 0, 0.5 or 1 (probabilities 1/4, 1/2, 1/4).
    est = interval([[0.0] * 5, [1.0] * 5])
    assert est.mean == 0.5 and est.low == 0.0 and est.high == 1.0
    # the same spread within one seed is canary noise only: far narrower with 10 canaries per value
    within = interval([[0.0] * 5 + [1.0] * 5])
    assert 0.0 < within.low < 0.5 < within.high < 1.0


def test_one_value_from_one_seed_has_no_interval():
    est = interval([[0.21]])
    assert est.mean == 0.21 and est.low is None and est.high is None


def test_paired_differences_cancel_what_the_sides_share():
    rng = np.random.default_rng(1)
    a = [rng.normal(10, 3, 8), rng.normal(12, 3, 8)]
    b = [x - 1.0 for x in a]  # the same canaries, one bit less each
    est = paired_difference(a, b)
    assert est.mean == pytest.approx(1.0) and est.low == pytest.approx(1.0) and est.high == pytest.approx(1.0)
    unpaired_width = interval([np.concatenate(a)]).high - interval([np.concatenate(a)]).low
    assert unpaired_width > 1.0  # the pairing is what removes the shared noise
    with pytest.raises(ValueError, match="same seeds"):
        paired_difference(a, a[:1])


def test_intervals_are_deterministic():
    data = [[0.0, 1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0, 0.0]]
    assert interval(data) == interval(data)


def _replicates_drawn_afresh(sides, reps, seed):
    """The hierarchical bootstrap as written before its draws were shared: every replicate draws
    the seeds, then each drawn seed's canaries, from a new generator, per call."""
    rng = np.random.default_rng(seed)
    n_seeds = len(sides[0])
    out = np.empty((reps, len(sides)))
    for r in range(reps):
        seeds = rng.integers(0, n_seeds, n_seeds)
        picks = [rng.integers(0, len(sides[0][s]), len(sides[0][s])) for s in seeds]
        for j, side in enumerate(sides):
            out[r, j] = np.concatenate([side[s][p] for s, p in zip(seeds, picks)]).mean()
    return out


@pytest.mark.parametrize("lengths", [(18,), (18, 18), (5, 1, 9)])
def test_shared_draws_give_the_bits_of_fresh_draws(lengths):
    """Measurements with the same counts reuse one set of draws (_draws): the replicates are the
    same floats as drawing afresh for each, whatever values came first."""
    from fedpriv.report.intervals import SEED, _replicates

    rng = np.random.default_rng(11)
    for _ in range(2):  # the second pass reads the remembered draws
        sides = [[(rng.random(n) < 0.4).astype(float) for n in lengths], [rng.random(n) * 30 for n in lengths]]
        for got_sides in (sides, sides[:1]):
            assert _replicates(got_sides, 300, SEED).tobytes() == _replicates_drawn_afresh(got_sides, 300, SEED).tobytes()
