"""Adaptive clipping (Andrew et al. 2021): z_delta, the geometric update, noise scales, convergence.

Fixed seeds throughout; tolerances are stated next to each statistical check.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedpriv.errors import PrivacyParameterError
from fedpriv.privacy.adaptive_clip import (
    AdaptiveClipInfo,
    AdaptiveClipState,
    adaptive_clip_and_noise,
    init_adaptive_clip,
    noised_unclipped_fraction,
    value_noise_multiplier,
)
from fedpriv.privacy.aggregate import clip_and_noise

M = 10  # units per round in the exact tests


def units_with_norms(norms, dim=6, seed=0) -> dict[str, np.ndarray]:
    """One unit per norm, split over two leaves, each unit of exactly that global L2 norm."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(len(norms), dim))
    x *= (np.asarray(norms, np.float64) / np.linalg.norm(x, axis=1))[:, None]
    return {"a": x[:, :2].astype(np.float32), "b": x[:, 2:].reshape(len(norms), 2, -1).astype(np.float32)}


# --- z_delta -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "z, sigma_b, expected",
    [
        (1.0, 1.0, 1 / math.sqrt(1 - 1 / 4)),  # 1.1547005383792517
        (0.5, 5.0, 1 / math.sqrt(4 - 1 / 100)),
        (2.0, 1.5, 1 / math.sqrt(1 / 4 - 1 / 9)),
        (1.1, 5.0, (1.1**-2 - 0.01) ** -0.5),
        (0.0, 0.0, 0.0),  # no privacy: no value noise, count noise allowed to be zero
        (0.0, 3.0, 0.0),
    ],
)
def test_value_noise_multiplier_exact(z, sigma_b, expected):
    zd = value_noise_multiplier(z, sigma_b)
    assert zd == pytest.approx(expected, rel=1e-12)
    if z > 0:
        # composition of the two Gaussian mechanisms (count sensitivity 1/2) gives back exactly z
        assert zd**-2 + (2 * sigma_b) ** -2 == pytest.approx(z**-2, rel=1e-12)
        assert zd > z


def test_value_noise_multiplier_tends_to_z_with_huge_count_noise():
    assert value_noise_multiplier(1.0, 1e6) == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize("z, sigma_b", [(1.0, 0.5), (1.0, 0.0), (1.0, 0.3), (4.0, 2.0)])
def test_value_noise_multiplier_refuses_too_little_count_noise(z, sigma_b):
    with pytest.raises(PrivacyParameterError, match="count_noise_stddev"):
        value_noise_multiplier(z, sigma_b)


# --- the update: sign and exact geometric step ----------------------------------------------------


def run_exact(norms, clip, gamma=0.5, eta=0.2, denominator=M, mask=None):
    """One round with sigma_b = 0 and z = 0 (deterministic)."""
    state = init_adaptive_clip(clip, gamma, eta, count_noise_stddev=0.0, noise_multiplier=0.0)
    tree = units_with_norms(norms)
    return tree, state, adaptive_clip_and_noise(tree, jax.random.key(0), state, denominator, mask)


@pytest.mark.parametrize(
    "n_unclipped, gamma, eta",
    [(0, 0.5, 0.2), (10, 0.5, 0.2), (3, 0.5, 0.2), (7, 0.8, 1.0), (5, 0.5, 0.3)],
)
def test_geometric_step_exact_without_count_noise(n_unclipped, gamma, eta):
    clip = 2.0
    norms = [1.0] * n_unclipped + [5.0] * (M - n_unclipped)
    _, state, (_, new, info) = run_exact(norms, clip, gamma, eta)
    b = n_unclipped / M
    expected = clip * math.exp(-eta * (b - gamma))
    # float32 state: 1e-6 relative
    assert float(new.clip_norm) == pytest.approx(expected, rel=1e-6)
    assert float(info.next_clip_norm) == float(new.clip_norm)
    assert float(info.noised_unclipped_fraction) == pytest.approx(b, abs=1e-7)
    assert int(info.aggregate.unclipped_count) == n_unclipped
    # hyperparameters are carried unchanged
    for name in ("target_quantile", "learning_rate", "count_noise_stddev", "noise_multiplier", "value_noise_multiplier"):
        assert float(getattr(new, name)) == float(getattr(state, name))


def test_clip_moves_up_when_all_clipped_and_down_when_none():
    _, _, (_, up, _) = run_exact([10.0] * M, 1.0)
    _, _, (_, down, _) = run_exact([0.1] * M, 1.0)
    assert float(up.clip_norm) > 1.0
    assert float(down.clip_norm) < 1.0
    assert float(up.clip_norm) == pytest.approx(math.exp(0.2 * 0.5), rel=1e-6)
    assert float(down.clip_norm) == pytest.approx(math.exp(-0.2 * 0.5), rel=1e-6)


def test_norm_equal_to_clip_counts_as_unclipped():
    # b_i = 1 iff norm <= C; a unit (0, 2, 0, ...) has global norm exactly 2.0 in float32
    tree = {"a": np.zeros((M, 2), np.float32), "b": np.zeros((M, 2, 2), np.float32)}
    tree["a"][:, 1] = 2.0
    state = init_adaptive_clip(2.0, 0.5, 0.2, 0.0, 0.0)
    result, new, info = adaptive_clip_and_noise(tree, jax.random.key(0), state, M)
    assert int(info.aggregate.unclipped_count) == M
    np.testing.assert_array_equal(np.asarray(result["a"][1]), 2.0)  # unclipped: 10 * 2 / 10
    assert float(new.clip_norm) < 2.0


def test_values_are_clip_and_noise_at_the_pre_update_clip():
    norms = [0.5, 1.0, 3.0, 4.0, 0.2, 9.0, 2.0, 0.7, 1.5, 6.0]
    tree, state, (result, new, info) = run_exact(norms, 1.2)
    ref, ref_info = clip_and_noise(tree, jax.random.split(jax.random.key(0))[0], 1.2, 0.0, M)
    for k in tree:
        np.testing.assert_array_equal(np.asarray(result[k]), np.asarray(ref[k]))
    assert float(info.aggregate.clip_norm) == pytest.approx(1.2, rel=1e-7)
    assert float(new.clip_norm) != pytest.approx(1.2, rel=1e-3)


def test_poisson_count_is_centered_with_public_denominator():
    # 7 real units of 9 (2 padded), expected count 5, 3 unclipped: the released fraction is
    # (sum(b_i - 1/2) + noise) / 5 + 1/2 = (3 - 3.5) / 5 + 0.5 = 0.4 (not 3/5, not 3/7)
    norms = [0.1, 0.1, 0.1, 9.0, 9.0, 9.0, 9.0, 0.1, 0.1]
    mask = np.array([1, 1, 1, 1, 1, 1, 1, 0, 0], np.float32)
    _, _, (_, new, info) = run_exact(norms, 1.0, denominator=5.0, mask=mask)
    assert int(info.aggregate.num_units) == 7 and int(info.aggregate.unclipped_count) == 3
    assert float(info.noised_unclipped_fraction) == pytest.approx(0.4, abs=1e-6)
    assert float(new.clip_norm) == pytest.approx(math.exp(-0.2 * (0.4 - 0.5)), rel=1e-6)


def test_fraction_is_clamped_before_the_update():
    # 9 real of 9 with expected count 5, all unclipped: b_tilde = (9 - 4.5)/5 + 0.5 = 1.4 -> 1
    _, _, (_, new, info) = run_exact([0.1] * 9, 1.0, denominator=5.0)
    assert float(info.noised_unclipped_fraction) == pytest.approx(1.4, abs=1e-6)
    assert float(new.clip_norm) == pytest.approx(math.exp(-0.2 * (1.0 - 0.5)), rel=1e-6)


# --- noise scales (statistical) --------------------------------------------------------------------


def test_value_noise_uses_z_delta_times_pre_update_clip():
    # 4 units, all far above C = 1, so C jumps to ~exp(eta * gamma) = e^0.5 after the round.
    z, sigma_b, clip, eta = 1.0, 1.0, 1.0, 1.0
    z_delta = value_noise_multiplier(z, sigma_b)  # 1.1547
    state = init_adaptive_clip(clip, 0.5, eta, sigma_b, z)
    rng = np.random.default_rng(3)
    tree = {"a": rng.normal(size=(4, 100_000)).astype(np.float32) * 10, "b": rng.normal(size=(4, 100_000)).astype(np.float32) * 10}
    denom = 4.0
    result, new, info = adaptive_clip_and_noise(tree, jax.random.key(11), state, denom)
    # reference clipped sum at the pre-update C, float64
    x = {k: np.asarray(v, np.float64) for k, v in tree.items()}
    norms = np.sqrt(sum(np.sum(v**2, axis=1) for v in x.values()))
    f = np.minimum(1.0, clip / norms)
    noise = np.concatenate([(np.asarray(result[k], np.float64) * denom - (x[k] * f[:, None]).sum(0)) for k in x])
    std = noise.std()
    # 200k coordinates: relative SE of the std 0.16%; tolerance 1%
    assert abs(std / (z_delta * clip) - 1) < 0.01, std
    new_clip = float(new.clip_norm)
    assert new_clip > 1.4  # the update really moved C
    for wrong in (z_delta * new_clip, z * clip, z * new_clip):
        assert abs(std / wrong - 1) > 0.01, wrong
    assert float(info.aggregate.noise_stddev) == pytest.approx(z_delta * clip, rel=1e-6)


def test_count_noise_has_std_sigma_b():
    # the released fraction over 20k keys: (b_tilde - 1/2) * m - (sum b - n/2) ~ N(0, sigma_b^2)
    sigma_b = 2.0
    b = jnp.float32(3.0)
    keys = jax.random.split(jax.random.key(21), 20_000)
    frac = jax.jit(jax.vmap(lambda k: noised_unclipped_fraction(b, M, k, sigma_b, M)))(keys)
    noise = (np.asarray(frac, np.float64) - 0.5) * M - (3.0 - M / 2)
    # 20k samples: relative SE of the std 0.5%; tolerance 3% (~6 SE); rejects sigma_b/m, 2*sigma_b
    assert abs(noise.std() / sigma_b - 1) < 0.03, noise.std()
    assert abs(noise.mean()) < 3 * sigma_b / math.sqrt(noise.size)


def test_count_noise_inside_adaptive_round_has_std_sigma_b():
    # the full round, vmapped over keys: the released fraction varies with std sigma_b / m
    sigma_b = 3.0
    state = init_adaptive_clip(1.0, 0.5, 0.2, sigma_b, 1.0)
    tree = units_with_norms([0.5] * 4 + [5.0] * 6)
    keys = jax.random.split(jax.random.key(5), 5_000)
    frac = jax.jit(jax.vmap(lambda k: adaptive_clip_and_noise(tree, k, state, M)[2].noised_unclipped_fraction))(keys)
    frac = np.asarray(frac, np.float64)
    # 5k samples: relative SE 1%; tolerance 5%
    assert abs(frac.std() * M / sigma_b - 1) < 0.05, frac.std()
    assert abs(frac.mean() - 0.4) < 3 * (sigma_b / M) / math.sqrt(frac.size)


# --- convergence ------------------------------------------------------------------------------------


M_SIM, MU, S = 100, math.log(3.0), 0.5  # units per round; lognormal(MU, S) norms


def _one_round(state, key):
    k_norm, k_dir, k_agg = jax.random.split(key, 3)
    norms = jnp.exp(MU + S * jax.random.normal(k_norm, (M_SIM,)))
    d = jax.random.normal(k_dir, (M_SIM, 4))
    d = d / jnp.linalg.norm(d, axis=1, keepdims=True)
    _, state, _ = adaptive_clip_and_noise({"x": d * norms[:, None]}, k_agg, state, M_SIM)
    return state, state.clip_norm


_simulate = jax.jit(lambda state, keys: jax.lax.scan(_one_round, state, keys)[1])  # compiled once


def simulate(initial_clip, gamma, rounds=200, seed=0):
    """Rounds of M_SIM units with fresh lognormal norms; the clip norm after each round."""
    state = init_adaptive_clip(initial_clip, gamma, 0.2, count_noise_stddev=M_SIM / 20, noise_multiplier=1.0)
    return np.asarray(_simulate(state, jax.random.split(jax.random.key(seed), rounds)))


@pytest.mark.parametrize("initial_clip, gamma", [(0.3, 0.5), (30.0, 0.5), (1.0, 0.8), (20.0, 0.2)])
def test_converges_to_target_quantile(initial_clip, gamma):
    target = math.exp(MU + S * NormalDist().inv_cdf(gamma))  # the gamma-quantile of the norms
    clips = simulate(initial_clip, gamma)
    # after 200 rounds (eta = 0.2, m = 100, sigma_b = m/20) C sits within 10% of the quantile
    assert abs(clips[-1] / target - 1) < 0.10, (clips[-1], target)
    assert abs(clips[-50:].mean() / target - 1) < 0.10
    # and it started far away (more than 3x off), so the test is about the update, not the start
    assert abs(math.log(initial_clip / target)) > math.log(3)


# --- state & jit ------------------------------------------------------------------------------------


def test_state_is_a_pytree_of_float32_arrays_and_jit_matches_eager():
    state = init_adaptive_clip(1.0, 0.5, 0.2, 5.0, 1.0)
    assert isinstance(state, AdaptiveClipState)
    leaves = jax.tree_util.tree_leaves(state)
    assert len(leaves) == 6 and all(leaf.dtype == jnp.float32 and leaf.shape == () for leaf in leaves)
    tree = units_with_norms([0.5, 2.0, 0.1, 3.0, 1.0, 0.9, 4.0, 0.2, 1.1, 0.3])
    key = jax.random.key(2)
    r1, s1, i1 = adaptive_clip_and_noise(tree, key, state, M)
    r2, s2, i2 = jax.jit(adaptive_clip_and_noise)(tree, key, state, M)
    assert isinstance(i2, AdaptiveClipInfo)
    for k in tree:
        np.testing.assert_allclose(np.asarray(r1[k]), np.asarray(r2[k]), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(float(s1.clip_norm), float(s2.clip_norm), rtol=1e-6)


# --- validation -------------------------------------------------------------------------------------


GOOD = dict(initial_clip=1.0, target_quantile=0.5, learning_rate=0.2, count_noise_stddev=5.0, noise_multiplier=1.0)


@pytest.mark.parametrize(
    "name, bad",
    [
        ("initial_clip", 0.0),
        ("initial_clip", -1.0),
        ("initial_clip", float("inf")),
        ("target_quantile", -0.1),
        ("target_quantile", 1.1),
        ("target_quantile", float("nan")),
        ("learning_rate", 0.0),
        ("learning_rate", -0.2),
        ("count_noise_stddev", -1.0),
        ("count_noise_stddev", 0.4),  # <= z/2 with z = 1
        ("noise_multiplier", -1.0),
        ("noise_multiplier", float("nan")),
    ],
)
def test_init_refuses_bad_parameters(name, bad):
    with pytest.raises(PrivacyParameterError, match=name):
        init_adaptive_clip(**{**GOOD, name: bad})


def test_init_accepts_edges():
    init_adaptive_clip(**{**GOOD, "target_quantile": 0.0})
    init_adaptive_clip(**{**GOOD, "target_quantile": 1.0})
    state = init_adaptive_clip(**{**GOOD, "noise_multiplier": 0.0, "count_noise_stddev": 0.0})
    assert float(state.value_noise_multiplier) == 0.0
    state = init_adaptive_clip(**GOOD)
    assert float(state.value_noise_multiplier) == pytest.approx(value_noise_multiplier(1.0, 5.0), rel=1e-6)
