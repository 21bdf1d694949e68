"""The one clip-and-noise aggregation: exact clip bound, noise scale, denominator, mask, jit.

Reference sums are recomputed independently in NumPy float64. Statistical checks use fixed seeds
and ~200k coordinates, so the sample std has relative standard error 1/sqrt(2*200k) ~ 0.16%:
a 1% tolerance is ~6 standard errors wide and still separates every plausible wrong scale.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedpriv.errors import FedprivError, PrivacyParameterError
from fedpriv.privacy.aggregate import (
    AggregateInfo,
    add_gaussian_noise,
    check_clip_norm,
    check_denominator,
    check_noise_multiplier,
    clip_and_noise,
    clip_factors,
    clip_units,
    clipped_sum,
    global_norms,
    noise_and_normalize,
)

SHAPES = {"w": (3, 4), "b": (5,), "k": (2, 2, 3)}


def random_tree(n: int, seed: int, scales) -> dict[str, np.ndarray]:
    """n units of 3 leaves of different shapes; unit i has global norm ~ scales[i]."""
    rng = np.random.default_rng(seed)
    tree = {name: rng.normal(size=(n, *shape)) for name, shape in SHAPES.items()}
    norms = np.sqrt(sum(np.sum(v.reshape(n, -1) ** 2, axis=1) for v in tree.values()))
    factor = np.asarray(scales, np.float64) / norms
    return {k: (v * factor.reshape((n,) + (1,) * (v.ndim - 1))).astype(np.float32) for k, v in tree.items()}


def np_norms(tree) -> np.ndarray:
    leaves = [np.asarray(v, np.float64) for v in tree.values()]
    n = leaves[0].shape[0]
    return np.sqrt(sum(np.sum(v.reshape(n, -1) ** 2, axis=1) for v in leaves))


def np_clipped_sum(tree, clip, mask=None) -> dict[str, np.ndarray]:
    """Independent float64 reference: sum_i w_i * min(1, C/||x_i||) * x_i."""
    norms = np_norms(tree)
    n = norms.shape[0]
    factor = np.minimum(1.0, clip / np.maximum(norms, 1e-300))
    w = np.ones(n) if mask is None else np.asarray(mask, np.float64)
    out = {}
    for k, v in tree.items():
        v = np.asarray(v, np.float64)
        keep = (w != 0).reshape((n,) + (1,) * (v.ndim - 1))
        scaled = v * (factor * w).reshape((n,) + (1,) * (v.ndim - 1))
        out[k] = np.where(keep, scaled, 0.0).sum(axis=0)
    return out


C = 1.7
N = 9  # units per tree in most tests (one shape set keeps eager-op compilation, and the file, fast)
# norms spanning well below, just below, exactly at, just above and far above C; one zero unit
SCALES = [0.0, 0.1, 1.0, C * 0.999, C, C * 1.001, 3.0, 50.0, 1e4]


# --- clipping: exact bound, untouched units, reference sum ---------------------------------------


def test_global_norms_match_numpy():
    tree = random_tree(N, 0, SCALES)
    np.testing.assert_allclose(np.asarray(global_norms(tree)), np_norms(tree), rtol=1e-6, atol=1e-7)


def test_clip_factors_min_one_and_no_nan_at_zero():
    norms = jnp.array([0.0, 0.5, 2.0, 4.0, 8.0])
    f = np.asarray(clip_factors(norms, 2.0))
    assert not np.isnan(f).any()
    np.testing.assert_array_equal(f, [1.0, 1.0, 1.0, 0.5, 0.25])


def test_clipped_units_within_bound_and_small_units_untouched():
    tree = random_tree(N, 1, SCALES)
    clipped, norms = clip_units(tree, C)
    after = np_norms(clipped)
    # bound: every clipped unit's norm (recomputed in float64) <= C up to 1e-6 relative
    assert np.all(after <= C * (1 + 1e-6)), after
    # units over C land on C (not below: the factor is C/norm, not something smaller)
    over = np.asarray(norms) > C
    np.testing.assert_allclose(after[over], C, rtol=1e-6)
    # units at or under C are bit-for-bit unchanged (factor exactly 1.0)
    for k in tree:
        np.testing.assert_array_equal(np.asarray(clipped[k])[~over], tree[k][~over])
    assert over.sum() == 4 and (~over).sum() == 5


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_clipped_sum_matches_float64_reference(seed):
    rng = np.random.default_rng(seed)
    scales = np.exp(rng.uniform(np.log(0.05), np.log(40.0), size=N))  # spans both sides of C
    tree = random_tree(N, seed, scales)
    got, norms = clipped_sum(tree, C)
    ref = np_clipped_sum(tree, C)
    for k in tree:
        assert got[k].shape == tree[k].shape[1:]
        # float32 sum of 9 terms of size <= C: 1e-5 absolute/relative is ample
        np.testing.assert_allclose(np.asarray(got[k], np.float64), ref[k], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(norms), np_norms(tree), rtol=1e-6)


def test_clipped_sum_catches_wrong_clip():
    # the reference distinguishes C from another clip: sanity for the test above
    tree = random_tree(N, 5, np.linspace(0.5, 10.0, N))
    got, _ = clipped_sum(tree, C)
    wrong = np_clipped_sum(tree, 2 * C)
    assert not all(np.allclose(np.asarray(got[k]), wrong[k], rtol=1e-5, atol=1e-5) for k in tree)


# --- noise: scale, mean, independence, determinism --------------------------------------------


# Note: XLA's float32 division on CPU is not always correctly rounded (1 ulp from NumPy's), so
# "exactly sum / denominator" is checked against the same division done by jax.numpy, and
# against the float64 reference to 1e-6 relative.


def noise_of(result, ref, denominator):
    return {k: np.asarray(result[k], np.float64) * denominator - ref[k] for k in ref}


def big_tree(n=4, seed=10):
    rng = np.random.default_rng(seed)
    # 'a' and 'b' have the same shape: reusing one key for both would make their noise identical
    return {
        "a": rng.normal(size=(n, 100_000)).astype(np.float32),
        "b": rng.normal(size=(n, 100_000)).astype(np.float32),
        "c": rng.normal(size=(n, 40, 25)).astype(np.float32),
    }


def test_noise_scale_is_z_times_c_on_the_sum():
    clip, z, denom = 2.5, 1.3, 7.0  # z*C = 3.25; C, z, z*C*sqrt(2), z*C/denom all differ by >> 1%
    tree = big_tree()
    result, info = clip_and_noise(tree, jax.random.key(0), clip, z, denom)
    noise = np.concatenate([v.ravel() for v in noise_of(result, np_clipped_sum(tree, clip), denom).values()])
    assert noise.size == 201_000
    std = noise.std()
    target = z * clip
    assert abs(std / target - 1) < 0.01, std
    # the same tolerance rejects the plausible wrong scales
    for wrong in (z, clip, z * clip * math.sqrt(2), z * clip / denom, 2 * z * clip):
        assert abs(std / wrong - 1) > 0.01, wrong
    # mean within 3 standard errors of 0
    assert abs(noise.mean()) < 3 * target / math.sqrt(noise.size)
    assert float(info.noise_stddev) == pytest.approx(target, rel=1e-6)
    assert float(info.clip_norm) == pytest.approx(clip, rel=1e-7)


def test_noise_independent_across_leaves_and_per_leaf_scale():
    clip, z, denom = 1.0, 2.0, 3.0
    tree = big_tree(seed=11)
    result, _ = clip_and_noise(tree, jax.random.key(1), clip, z, denom)
    noise = noise_of(result, np_clipped_sum(tree, clip), denom)
    a, b = noise["a"].ravel(), noise["b"].ravel()
    corr = np.corrcoef(a, b)[0, 1]
    # |corr| of independent samples has std 1/sqrt(1e5) ~ 0.0032; 0.015 is ~5 std
    assert abs(corr) < 0.015, corr
    for k in ("a", "b"):  # each leaf alone (100k coords): relative SE 0.22%, tolerance 1.5%
        assert abs(noise[k].std() / (z * clip) - 1) < 0.015


def test_add_gaussian_noise_deterministic_by_key():
    tree = {"x": jnp.zeros((50, 3)), "y": jnp.zeros((7,))}
    n1 = add_gaussian_noise(tree, jax.random.key(3), 1.0)
    n2 = add_gaussian_noise(tree, jax.random.key(3), 1.0)
    n3 = add_gaussian_noise(tree, jax.random.key(4), 1.0)
    for k in tree:
        np.testing.assert_array_equal(np.asarray(n1[k]), np.asarray(n2[k]))
        assert not np.allclose(np.asarray(n1[k]), np.asarray(n3[k]))
    # zero stddev adds exact zeros
    n0 = add_gaussian_noise(tree, jax.random.key(3), 0.0)
    for k in tree:
        np.testing.assert_array_equal(np.asarray(n0[k]), 0.0)


def test_clip_and_noise_deterministic_by_key():
    tree = random_tree(N, 12, np.linspace(0.1, 5, N))
    r1, _ = clip_and_noise(tree, jax.random.key(7), C, 1.0, 8)
    r2, _ = clip_and_noise(tree, jax.random.key(7), C, 1.0, 8)
    r3, _ = clip_and_noise(tree, jax.random.key(8), C, 1.0, 8)
    for k in tree:
        np.testing.assert_array_equal(np.asarray(r1[k]), np.asarray(r2[k]))
        assert not np.allclose(np.asarray(r1[k]), np.asarray(r3[k]))


def test_clip_and_noise_is_noise_and_normalize_of_clipped_sum():
    # one implementation of the noise: the ghost-clipping path gets the same numbers
    tree = random_tree(N, 13, np.linspace(0.1, 5, N))
    key = jax.random.key(9)
    r1, _ = clip_and_noise(tree, key, C, 1.1, 5.0)
    s, _ = clipped_sum(tree, C)
    r2 = noise_and_normalize(s, key, C, 1.1, 5.0)
    for k in tree:
        np.testing.assert_array_equal(np.asarray(r1[k]), np.asarray(r2[k]))


# --- denominator: fixed vs expected count ------------------------------------------------------


def test_denominator_fixed_count_exact_without_noise():
    m = N
    tree = random_tree(m, 14, SCALES)
    result, info = clip_and_noise(tree, jax.random.key(0), C, 0.0, m)
    s, _ = clipped_sum(tree, C)
    for k in tree:
        np.testing.assert_array_equal(np.asarray(result[k]), np.asarray(s[k] / m))
        np.testing.assert_allclose(np.asarray(result[k]), np_clipped_sum(tree, C)[k] / m, rtol=1e-5, atol=1e-6)
    assert float(info.noise_stddev) == 0.0
    assert int(info.num_units) == m


def test_denominator_expected_count_under_poisson_not_realized_count():
    # Poisson: q = 0.005 of 1000 -> expected 5; this sample drew 7 (padded to 9)
    q, population = 0.005, 1000
    expected = q * population
    mask = np.array([1] * 7 + [0] * 2, np.float32)
    tree = random_tree(N, 15, np.linspace(0.2, 4.0, N))
    result, info = clip_and_noise(tree, jax.random.key(0), C, 0.0, expected, mask=mask)
    s, _ = clipped_sum(tree, C, mask)
    ref = np_clipped_sum(tree, C, mask)
    for k in tree:
        np.testing.assert_array_equal(np.asarray(result[k]), np.asarray(s[k] / expected))
        np.testing.assert_allclose(np.asarray(result[k]), ref[k] / expected, rtol=1e-5, atol=1e-6)
        assert not np.allclose(np.asarray(result[k]), ref[k] / 7, rtol=1e-3)  # not the realized count
    assert int(info.num_units) == 7


# --- mask ---------------------------------------------------------------------------------------


def test_masked_units_contribute_nothing_and_are_not_counted():
    real = random_tree(5, 16, [0.5, 1.0, 2.0, 3.0, 0.2])
    pad = {k: np.full((4, *v.shape[1:]), 1e6, np.float32) for k, v in real.items()}
    pad["w"][1] = np.nan  # even non-finite padding must not leak in
    tree = {k: np.concatenate([real[k], pad[k]]) for k in real}
    mask = np.array([1, 1, 1, 1, 1, 0, 0, 0, 0], np.float32)
    result, info = clip_and_noise(tree, jax.random.key(2), C, 0.0, 5.0, mask=mask)
    ref, _ = clipped_sum(real, C)
    for k in real:
        assert np.isfinite(np.asarray(result[k])).all()
        np.testing.assert_array_equal(np.asarray(result[k]), np.asarray(ref[k] / 5.0))
    assert int(info.num_units) == 5
    assert int(info.unclipped_count) == 3  # norms 0.5, 1.0, 0.2 <= 1.7
    assert float(info.mean_norm) == pytest.approx(np.mean([0.5, 1.0, 2.0, 3.0, 0.2]), rel=1e-5)


def test_info_counts_without_mask():
    tree = random_tree(N, 17, SCALES)
    _, info = clip_and_noise(tree, jax.random.key(0), C, 1.0, 9)
    assert isinstance(info, AggregateInfo)
    assert int(info.num_units) == 9
    assert int(info.unclipped_count) == int(np.sum(np.asarray(global_norms(tree)) <= np.float32(C)))
    assert float(info.mean_norm) == pytest.approx(np.mean(np_norms(tree)), rel=1e-5)


def test_all_masked_gives_zero_sum_and_zero_mean_norm():
    tree = random_tree(N, 18, np.arange(1, N + 1))
    result, info = clip_and_noise(tree, jax.random.key(0), C, 0.0, 2.0, mask=np.zeros(N, np.float32))
    for k in tree:
        np.testing.assert_array_equal(np.asarray(result[k]), 0.0)
    assert int(info.num_units) == 0 and float(info.mean_norm) == 0.0


# --- jit ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("static", [("denominator",), ()])
def test_jit_matches_eager(static):
    tree = random_tree(N, 19, SCALES)
    mask = np.array([1, 1, 0, 1, 1, 1, 0, 1, 1], np.float32)
    key = jax.random.key(5)
    eager, ie = clip_and_noise(tree, key, C, 0.9, 7.0, mask=mask)
    jitted = jax.jit(clip_and_noise, static_argnames=static)
    got, ig = jitted(tree, key, C, 0.9, 7.0, mask=mask)
    for k in tree:
        # same random bits; fused arithmetic may differ in the last float32 ulp
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(eager[k]), rtol=1e-6, atol=1e-6)
    for a, b in zip(ie, ig):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


# --- validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "1.0", None, True])
def test_check_clip_norm_refuses(bad):
    with pytest.raises(PrivacyParameterError, match=r"clip_norm.*> 0"):
        check_clip_norm(bad)


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), "x"])
def test_check_noise_multiplier_refuses(bad):
    with pytest.raises(PrivacyParameterError, match=r"noise_multiplier.*>= 0"):
        check_noise_multiplier(bad)


def test_check_noise_multiplier_zero_only_when_allowed():
    assert check_noise_multiplier(0) == 0.0
    with pytest.raises(PrivacyParameterError, match=r"noise_multiplier.*> 0"):
        check_noise_multiplier(0.0, allow_zero=False)
    assert check_noise_multiplier(np.float32(1.5), allow_zero=False) == 1.5


@pytest.mark.parametrize("bad", [0, -3, float("nan"), float("inf")])
def test_check_denominator_refuses(bad):
    with pytest.raises(PrivacyParameterError, match=r"denominator.*> 0"):
        check_denominator(bad)


def test_checks_accept_and_return_floats_and_custom_names():
    assert check_clip_norm(np.float64(0.5)) == 0.5
    assert check_denominator(np.int64(12)) == 12.0
    with pytest.raises(PrivacyParameterError, match=r"^dp\.clip_norm must"):
        check_clip_norm(-1, name="dp.clip_norm")
    assert issubclass(PrivacyParameterError, FedprivError)


def test_a_sum_fed_in_chunks_through_initial_equals_the_sum_fed_at_once():
    # ``initial`` carries a running total: chunk after chunk adds the units in the same order as
    # one call over all units, so the floats are identical (the engines rely on it), and the
    # masked unit (non-finite) still adds nothing.
    tree = {k: np.asarray(v, np.float32) for k, v in random_tree(9, 21, np.linspace(0.3, 5.0, 9)).items()}
    tree["b"][4] = np.inf
    mask = np.array([1, 1, 1, 1, 0, 1, 1, 1, 1], np.float32)
    whole, whole_norms = clipped_sum(tree, C, mask)
    total = None
    norms = []
    for lo, hi in [(0, 2), (2, 7), (7, 9)]:
        total, n = clipped_sum({k: v[lo:hi] for k, v in tree.items()}, C, mask[lo:hi], initial=total)
        norms.append(np.asarray(n))
    ref = np_clipped_sum({k: v.astype(np.float64) for k, v in tree.items()}, C, mask)
    for k in tree:
        np.testing.assert_array_equal(np.asarray(total[k]), np.asarray(whole[k]))
        np.testing.assert_allclose(np.asarray(total[k]), ref[k], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.concatenate(norms), np.asarray(whole_norms))


def test_a_unit_with_non_finite_values_contributes_nothing_so_the_sensitivity_holds():
    """A client whose local training diverged sends NaN or inf: its clipped contribution is zero
    (norm 0 <= C), not a NaN that would spoil the sum (and stop the run on one user's data)."""
    real = random_tree(3, 21, [0.5, 2.0, 3.0])
    bad = {k: np.zeros((2, *v.shape[1:])) for k, v in real.items()}
    bad["w"][0, 0, 0], bad["b"][1, 2] = np.nan, np.inf
    tree = {k: np.concatenate([real[k], bad[k]]) for k in real}
    total, norms = clipped_sum(tree, C)
    ref, _ = clipped_sum(real, C)
    for k in real:
        np.testing.assert_array_equal(np.asarray(total[k]), np.asarray(ref[k]))
    masked, _ = clipped_sum(tree, C, weights=np.ones(5, np.float32))
    for k in real:
        np.testing.assert_array_equal(np.asarray(masked[k]), np.asarray(ref[k]))
    assert list(np.asarray(clip_factors(jnp.asarray([0.5, np.nan, np.inf]), C))) == [1.0, 0.0, 0.0]
    clipped, _ = clip_units(tree, C)
    assert np.isfinite(np.asarray(global_norms(clipped))).all() and float(np.max(np.asarray(global_norms(clipped)))) <= C * (1 + 1e-6)
