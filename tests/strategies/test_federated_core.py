"""Server math of FedAvg / FedAvg+Clip / DP-FedAvg: sampling, clipping, weights, noise, accounting."""

from __future__ import annotations

import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fedpriv.config import FederatedConfig, validate_config
from fedpriv.errors import ConfigError, PrivacyParameterError
from fedpriv.privacy.accounting import RDP_ORDERS, GaussianSteps, epsilon_for
from fedpriv.privacy.adaptive_clip import adaptive_clip_and_noise, init_adaptive_clip
from fedpriv.privacy.aggregate import clip_and_noise
from fedpriv.strategies.aggregators import DeltaAccumulator
from fedpriv.strategies.sampling import CohortSampler
from fedpriv.strategies.server import ServerCore

DP_KEYS = ("noise_multiplier", "target_epsilon", "delta", "epsilon_budget", "accountant", "adaptive_clip", "target_unclipped_quantile", "clip_learning_rate", "clip_count_stddev")


def fcfg(**kw) -> FederatedConfig:
    """A [federated] config; the DP keys among ``kw`` go into its ``dp`` table."""
    base = {"rounds": 3, "clients_per_round": 4}
    dp = {k: kw.pop(k) for k in DP_KEYS if k in kw}
    return FederatedConfig(**{**base, **kw, **({"dp": dp} if dp else {})})


def zeros_params(*shapes):
    return {f"w{i}": jnp.zeros(s, jnp.float32) for i, s in enumerate(shapes)}


def stack(deltas):
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *deltas)


def tree_norm(t) -> float:
    return float(np.sqrt(sum(float(jnp.sum(jnp.square(x))) for x in jax.tree_util.tree_leaves(t))))


# ---- sampling ------------------------------------------------------------------------------------
def test_fixed_sampling_gives_m_distinct_users_every_round():
    s = CohortSampler(population=37, clients_per_round=9, sampling="fixed", seed=1)
    for r in range(1, 200):
        c = s.sample(r)
        assert len(c) == 9 and len(set(c.tolist())) == 9
        assert c.min() >= 0 and c.max() < 37


def test_fixed_sampling_is_uniform_over_users_chi_square():
    # 4000 rounds of m = 10 of N = 50: each user is expected 800 times. Chi-square goodness of fit
    # against the uniform; with the fixed seed the p-value is a fixed number, and a sampler that
    # favoured some users (e.g. always the first m) gives p ~ 0.
    N, m, R = 50, 10, 4000
    s = CohortSampler(N, m, "fixed", seed=7)
    counts = np.bincount(np.concatenate([s.sample(r) for r in range(1, R + 1)]), minlength=N)
    assert counts.sum() == m * R
    p = stats.chisquare(counts).pvalue
    assert p > 1e-3, (p, counts.min(), counts.max())
    # pairs too: every pair of users should be co-sampled about R * m(m-1)/(N(N-1)) times
    pair = np.zeros((N, N))
    for r in range(1, R + 1):
        c = s.sample(r)
        pair[np.ix_(c, c)] += 1
    expected = R * m * (m - 1) / (N * (N - 1))
    off = pair[~np.eye(N, dtype=bool)]
    assert abs(off.mean() - expected) < 1e-9
    assert off.std() < 3 * math.sqrt(expected)


def test_sampling_is_a_function_of_seed_and_round():
    a = CohortSampler(100, 10, "fixed", seed=3)
    b = CohortSampler(100, 10, "fixed", seed=3)
    assert np.array_equal(a.sample(5), b.sample(5))
    assert not np.array_equal(a.sample(5), a.sample(6))
    assert not np.array_equal(a.sample(5), CohortSampler(100, 10, "fixed", seed=4).sample(5))


def test_poisson_sampling_has_expected_size_m():
    s = CohortSampler(200, 20, "poisson", seed=0)
    sizes = np.array([len(s.sample(r)) for r in range(1, 2001)])
    # Binomial(200, 0.1): mean 20, std 4.24; the mean of 2000 rounds has std 0.095
    assert abs(sizes.mean() - 20) < 0.5
    assert 3.6 < sizes.std() < 4.9


def test_fixed_sampling_refuses_more_clients_than_users():
    with pytest.raises(PrivacyParameterError, match="only 5 training users"):
        CohortSampler(5, 6, "fixed", 0)


# ---- aggregation ---------------------------------------------------------------------------------
def test_fedavg_weights_by_example_count():
    core = ServerCore(fcfg(strategy="fedavg", clients_per_round=2), population=10, seed=0)
    state = core.init_state(zeros_params((3,)))
    d1, d2 = {"w0": jnp.array([1.0, 0.0, 2.0])}, {"w0": jnp.array([0.0, 4.0, -2.0])}
    acc = core.accumulator(state)
    acc.add(stack([d1, d2]), np.array([3, 1]))
    new, info = core.finish_round(state, 1, acc)
    want = (3 * np.array([1.0, 0.0, 2.0]) + 1 * np.array([0.0, 4.0, -2.0])) / 4
    np.testing.assert_allclose(new["params"]["w0"], want, rtol=1e-6)
    assert info["clients"] == 2


def test_fedavg_clip_clips_each_delta_and_averages_uniformly():
    S = 1.0
    core = ServerCore(fcfg(strategy="fedavg-clip", clients_per_round=2, clip_norm=S), population=10, seed=0)
    state = core.init_state(zeros_params((2,), (1,)))
    big = {"w0": jnp.array([3.0, 4.0]), "w1": jnp.array([0.0])}  # norm 5 -> clipped to 1
    small = {"w0": jnp.array([0.3, 0.0]), "w1": jnp.array([0.4])}  # norm 0.5, untouched
    acc = core.accumulator(state)
    acc.add(stack([big, small]), np.array([1000, 1]))  # counts must not matter
    new, info = core.finish_round(state, 1, acc)
    want_w0 = (np.array([0.6, 0.8]) + np.array([0.3, 0.0])) / 2
    np.testing.assert_allclose(new["params"]["w0"], want_w0, rtol=1e-6)
    np.testing.assert_allclose(new["params"]["w1"], [0.2], rtol=1e-6)
    assert info["unclipped_fraction"] == 0.5
    np.testing.assert_allclose(sorted(acc.all_norms), [0.5, 5.0], rtol=1e-6)


def test_every_clipped_delta_has_norm_at_most_S():
    # One client per round: the applied update (server SGD, lr 1) is clip(d)/m with m = 1, so its
    # norm is exactly min(|d|, S) whatever the delta's scale.
    S = 0.7
    rng = np.random.default_rng(0)
    for scale in (0.01, 0.5, 3.0, 1e4):
        core = ServerCore(fcfg(strategy="fedavg-clip", clients_per_round=1, clip_norm=S), population=3, seed=0)
        state = core.init_state(zeros_params((50,), (7, 3)))
        d = {"w0": jnp.asarray(rng.normal(size=50) * scale, jnp.float32), "w1": jnp.asarray(rng.normal(size=(7, 3)) * scale, jnp.float32)}
        acc = core.accumulator(state)
        acc.add(stack([d]), np.array([5]))
        new, _ = core.finish_round(state, 1, acc)
        assert tree_norm(new["params"]) <= S * (1 + 1e-6)
        np.testing.assert_allclose(tree_norm(new["params"]), min(tree_norm(d), S), rtol=1e-5)


def dp_core(z=1.3, S=0.5, m=8, N=100, **kw) -> ServerCore:
    return ServerCore(fcfg(strategy="dp-fedavg", clients_per_round=m, clip_norm=S, noise_multiplier=z, delta=1e-5, **kw), population=N, seed=11)


def test_dp_fedavg_noise_std_per_coordinate_is_zS_over_m():
    # All deltas zero: the update is pure noise. 400,000 coordinates; the sample std of n normals
    # has relative standard error 1/sqrt(2n) = 0.11%, so 1% tolerance is > 9 standard errors, and a
    # noise scale off by sqrt(m), by m, or applied to the average instead of the sum fails.
    z, S, m = 1.3, 0.5, 8
    core = dp_core(z, S, m)
    state = core.init_state(zeros_params((400, 1000)))
    acc = core.accumulator(state)
    acc.add(stack([zeros_params((400, 1000))] * m), np.ones(m))
    new, info = core.finish_round(state, 1, acc)
    x = np.asarray(new["params"]["w0"]).ravel()
    assert abs(x.std() / (z * S / m) - 1) < 0.01
    assert abs(x.mean()) < 5 * (z * S / m) / math.sqrt(x.size)
    assert info["noise_stddev"] == pytest.approx(z * S / m)
    # normality (Kolmogorov-Smirnov against N(0, (zS/m)^2))
    assert stats.kstest(x[:20000] / (z * S / m), "norm").pvalue > 1e-3


def test_dp_fedavg_weights_are_uniform_not_by_example_count():
    # Same round key -> same noise; the difference between two runs is the noise-free average.
    m = 3
    deltas = [{"w0": jnp.array([0.1, 0.0])}, {"w0": jnp.array([0.0, 0.2])}, {"w0": jnp.array([0.3, 0.3])}]
    results = []
    for ds, counts in ((deltas, np.array([1, 50, 1000])), ([{"w0": jnp.zeros(2)}] * 3, np.array([1, 1, 1]))):
        core = dp_core(z=1.0, S=10.0, m=m)
        state = core.init_state(zeros_params((2,)))
        acc = core.accumulator(state)
        acc.add(stack(ds), counts)
        results.append(np.asarray(core.finish_round(state, 1, acc)[0]["params"]["w0"]))
    np.testing.assert_allclose(results[0] - results[1], [0.4 / 3, 0.5 / 3], atol=1e-6)


def test_dp_fedavg_with_poisson_cohorts_divides_by_the_expected_m_not_the_realized_count():
    """Under Poisson sampling the sum is divided by m = qN, public, never by the realized cohort
    size (private, and a sensitivity that would change with it): 3 clients arrive where m = 5.
    (Every other aggregation test fed exactly m clients, so a mutant dividing by the realized
    count passed them.)"""
    m = 5
    deltas = [{"w0": jnp.array([0.1, 0.0])}, {"w0": jnp.array([0.0, 0.2])}, {"w0": jnp.array([0.3, 0.3])}]
    results = []
    for ds in (deltas, [{"w0": jnp.zeros(2)}] * 3):  # the same round key: the same noise; the difference is the noise-free sum / m
        core = dp_core(z=1.0, S=10.0, m=m, sampling="poisson")
        state = core.init_state(zeros_params((2,)))
        acc = core.accumulator(state)
        acc.add(stack(ds), np.ones(3))
        results.append(np.asarray(core.finish_round(state, 1, acc)[0]["params"]["w0"]))
    np.testing.assert_allclose(results[0] - results[1], [0.4 / m, 0.5 / m], atol=1e-6)


def test_chunked_accumulation_equals_the_shared_clip_and_noise():
    rng = np.random.default_rng(1)
    m, S, z = 10, 1.0, 0.8
    deltas = [{"a": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32), "b": jnp.asarray(rng.normal(size=5), jnp.float32)} for _ in range(m)]
    core = dp_core(z=z, S=S, m=m)
    state = core.init_state(jax.tree_util.tree_map(jnp.zeros_like, deltas[0]))
    acc = core.accumulator(state)
    for part in (deltas[:3], deltas[3:4], deltas[4:]):
        acc.add(stack(part), np.ones(len(part)))
    new, _ = core.finish_round(state, 5, acc)
    key = jax.random.fold_in(core.noise_base, 5)
    want, _ = clip_and_noise(stack(deltas), key, S, z, m)
    for k in want:
        np.testing.assert_allclose(new["params"][k], want[k], rtol=1e-5, atol=1e-6)


def test_adaptive_clipping_matches_the_shared_adaptive_code():
    rng = np.random.default_rng(2)
    m, S, z = 6, 1.0, 1.0
    deltas = [{"a": jnp.asarray(rng.normal(size=7) * s, jnp.float32)} for s in (0.1, 0.2, 0.3, 1.0, 2.0, 3.0)]
    core = dp_core(z=z, S=S, m=m, adaptive_clip=True, clip_count_stddev=2.0)
    state = core.init_state({"a": jnp.zeros(7)})
    acc = core.accumulator(state)
    acc.add(stack(deltas[:4]), np.ones(4))
    acc.add(stack(deltas[4:]), np.ones(2))
    new, info = core.finish_round(state, 2, acc)
    key = jax.random.fold_in(core.noise_base, 2)
    want, want_state, _ = adaptive_clip_and_noise(stack(deltas), key, init_adaptive_clip(S, 0.5, 0.2, 2.0, z), m)
    np.testing.assert_allclose(new["params"]["a"], want["a"], rtol=1e-5, atol=1e-6)
    assert float(new["clip"].clip_norm) == pytest.approx(float(want_state.clip_norm), rel=1e-6)
    assert info["next_clip_norm"] == pytest.approx(float(want_state.clip_norm), rel=1e-6)


def test_adaptive_clipping_reports_the_noise_it_adds_z_delta_S_over_m():
    # The values get z_delta > z (values and count together cost z): the info must say z_delta*S/m,
    # the std measured on a pure-noise update (400,000 coordinates: 1% is > 9 standard errors),
    # and the row holds the noised unclipped fraction (the DP release), not the exact one.
    from fedpriv.privacy.adaptive_clip import value_noise_multiplier

    z, S, m, sigma_b = 1.3, 0.5, 8, 2.0
    core = dp_core(z, S, m, adaptive_clip=True, clip_count_stddev=sigma_b)
    state = core.init_state(zeros_params((400, 1000)))
    acc = core.accumulator(state)
    acc.add(stack([zeros_params((400, 1000))] * m), np.ones(m))
    new, info = core.finish_round(state, 1, acc)
    z_delta = value_noise_multiplier(z, sigma_b)
    assert z_delta > z * 1.05 and info["noise_stddev"] == pytest.approx(z_delta * S / m)
    assert abs(np.asarray(new["params"]["w0"]).std() / (z_delta * S / m) - 1) < 0.01
    assert info["noised_unclipped_fraction"] != info["unclipped_fraction"] == 1.0
    assert info["noised_update_norm"] > 0  # public: what a DP run's divergence check reads


# ---- accounting ----------------------------------------------------------------------------------
def run_zero_rounds(core: ServerCore, rounds: int) -> None:
    state = core.init_state(zeros_params((2,)))
    for r in range(1, rounds + 1):
        acc = core.accumulator(state)
        acc.add(stack([zeros_params((2,))] * core.m), np.ones(core.m))
        state, _ = core.finish_round(state, r, acc)


@pytest.mark.parametrize("sampling", ["fixed", "poisson"])
def test_epsilon_after_R_rounds_equals_dp_accounting_directly(sampling):
    z, m, N, R, delta = 1.1, 10, 500, 7, 1e-5
    core = ServerCore(fcfg(strategy="dp-fedavg", clients_per_round=m, clip_norm=1.0, noise_multiplier=z, delta=delta, sampling=sampling, rounds=R), N, seed=0)
    run_zero_rounds(core, R)
    got = core.privacy_report()
    acc = dp_accounting.rdp.RdpAccountant(list(RDP_ORDERS), dp_accounting.NeighboringRelation.REPLACE_ONE if sampling == "fixed" else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    if sampling == "fixed":
        # replace-one user: the clipped sum moves by up to 2S, so the Gaussian is z/2 relative to it
        event = dp_accounting.SampledWithoutReplacementDpEvent(N, m, dp_accounting.GaussianDpEvent(z / 2))
    else:
        event = dp_accounting.PoissonSampledDpEvent(m / N, dp_accounting.GaussianDpEvent(z))
    acc.compose(dp_accounting.SelfComposedDpEvent(event, R))
    assert got["epsilon"] == pytest.approx(acc.get_epsilon(delta), rel=1e-12)
    assert got["epsilon"] == pytest.approx(epsilon_for(GaussianSteps(sampling, z, N, m, R, "user"), delta).epsilon, rel=1e-12)
    assert "user" in got["guarantee"] and ("replace-one" in got["guarantee"] if sampling == "fixed" else "add-or-remove" in got["guarantee"])


def test_target_epsilon_is_calibrated_before_training():
    core = ServerCore(fcfg(strategy="dp-fedavg", clients_per_round=10, clip_norm=1.0, target_epsilon=3.0, delta=1e-5, rounds=20), 500, seed=0)
    run_zero_rounds(core, 20)
    assert core.privacy_report()["epsilon"] == pytest.approx(3.0, rel=2e-3)
    assert core.privacy_report()["epsilon"] <= 3.0


def test_epsilon_budget_stops_before_the_round_that_would_exceed_it():
    ev = GaussianSteps("fixed", 1.0, 200, 10, 1, "user")
    budget = epsilon_for(ev.with_steps(4), 1e-5).epsilon * 1.0001
    core = ServerCore(fcfg(strategy="dp-fedavg", clients_per_round=10, clip_norm=1.0, noise_multiplier=1.0, delta=1e-5, rounds=10, epsilon_budget=budget), 200, seed=0)
    assert core.budget.max_steps == 4
    assert core.stop_reason(3) is None
    assert "budget" in core.stop_reason(4)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"strategy": "fedavg", "clip_norm": 1.0}, "takes no clipping"),
        ({"strategy": "fedavg-clip"}, "needs clip_norm"),
        ({"strategy": "fedavg-clip", "clip_norm": 1.0, "dp": {"noise_multiplier": 1.0, "delta": 1e-5}}, "adds no noise"),
        ({"strategy": "dp-fedavg", "clip_norm": 1.0}, "needs a \\[federated.dp\\] table"),
        ({"strategy": "dp-fedavg", "clip_norm": 1.0, "dp": {"noise_multiplier": 1.0}}, "federated.dp.delta: Field required"),
        ({"strategy": "dp-fedavg", "clip_norm": 1.0, "dp": {"delta": 1e-5}}, "exactly one of noise_multiplier or target_epsilon"),
        ({"strategy": "dp-fedavg", "clip_norm": 1.0, "dp": {"delta": 1e-5, "noise_multiplier": 1.0, "target_epsilon": 2.0}}, "exactly one"),
        ({"strategy": "dp-fedavg", "clip_norm": 1.0, "dp": {"delta": 1e-5, "noise_multiplier": 0.0}}, "no privacy"),
        ({"noise_multiplier": 1.0}, "federated.noise_multiplier is now federated.dp.noise_multiplier"),
        ({"client_clip_norm": 1.0}, "federated.client_clip_norm is now federated.client_dp.clip_norm"),
        ({"num_supernodes": 2}, "federated.num_supernodes is now federated.flower.num_supernodes"),
    ],
)
def test_impossible_strategy_parameters_are_refused_when_the_config_is_read(kw, match):
    with pytest.raises(ConfigError, match=match):
        validate_config({"name": "x", "federated": {"rounds": 3, "clients_per_round": 4, **kw}})


def test_budget_that_no_round_fits_is_refused_before_training():
    with pytest.raises(PrivacyParameterError, match="even one round"):
        ServerCore(fcfg(strategy="dp-fedavg", clients_per_round=10, clip_norm=1.0, noise_multiplier=0.3, delta=1e-5, epsilon_budget=0.01), 200, seed=0)


@pytest.mark.parametrize("strategy", ["fedavg", "fedavg-clip"])
def test_sums_of_groups_add_up_to_the_sum_of_all_deltas(strategy):
    """A Flower ClientApp with sum_on_client accumulates its group from zero with the server's
    clip and weights; the server adds the groups' sums (add_sum). Same total, weights and norms
    as adding every delta, up to the order of float additions."""
    extra = {} if strategy == "fedavg" else {"clip_norm": 0.8}
    core = ServerCore(fcfg(strategy=strategy, clients_per_round=7, **extra), population=50, seed=0)
    state = core.init_state(zeros_params((40,), (3, 5)))
    rng = np.random.default_rng(4)
    deltas = [{k: jnp.asarray(rng.normal(0, 0.3, v.shape), jnp.float32) for k, v in state["params"].items()} for _ in range(7)]
    counts = np.array([3, 17, 1, 8, 8, 2, 30])
    whole = core.accumulator(state)
    whole.add(stack(deltas), counts)
    parts = core.accumulator(state)
    for lo, hi in [(0, 3), (3, 6), (6, 7)]:
        group = core.make_accumulator(state["params"], core.current_clip(state))
        group.add(stack(deltas[lo:hi]), counts[lo:hi])
        parts.add_sum(group.total, counts[lo:hi], group.all_norms)
    assert parts.weight_sum == whole.weight_sum == (counts.sum() if strategy == "fedavg" else 7)
    np.testing.assert_array_equal(parts.all_norms, whole.all_norms)
    for k in whole.total:
        np.testing.assert_allclose(parts.total[k], whole.total[k], rtol=1e-6, atol=1e-6)
    if strategy != "fedavg":  # the clip really ran: some norms exceed S, and the sum is shorter
        assert (whole.all_norms > 0.8).any()
        raw = sum(np.asarray(jax.tree_util.tree_leaves(d)[0]) for d in deltas)
        assert not np.allclose(raw, whole.total[sorted(whole.total)[0]])


def test_accumulator_ignores_padded_clients():
    acc = DeltaAccumulator({"w": jnp.zeros(2)}, 1.0, weighted=False)
    acc.add({"w": jnp.array([[0.5, 0.0], [np.nan, np.inf]])}, np.array([1, 1]), mask=np.array([1.0, 0.0]))
    np.testing.assert_array_equal(acc.total["w"], [0.5, 0.0])
    assert acc.weight_sum == 1.0 and len(acc.all_norms) == 1


def test_each_strategy_is_a_composition_of_aggregators():
    from fedpriv.strategies.aggregators import AdaptiveClipping, ClippedMean, GaussianNoise, WeightedMean

    assert isinstance(ServerCore(fcfg(strategy="fedavg"), 10, 0).aggregator, WeightedMean)
    clip = ServerCore(fcfg(strategy="fedavg-clip", clip_norm=0.5), 10, 0).aggregator
    assert type(clip) is ClippedMean and clip.initial_clip == 0.5 and clip.denominator == 4.0
    dp = ServerCore(fcfg(strategy="dp-fedavg", clip_norm=0.5, noise_multiplier=1.2, delta=1e-5), 10, 0).aggregator
    assert type(dp) is GaussianNoise and dp.noise_multiplier == 1.2 and type(dp.inner) is ClippedMean
    ada = ServerCore(fcfg(strategy="dp-fedavg", clip_norm=0.5, noise_multiplier=1.2, delta=1e-5, adaptive_clip=True, clip_count_stddev=6.0), 10, 0).aggregator
    assert type(ada) is AdaptiveClipping and type(ada.inner) is GaussianNoise and ada.count_noise_stddev == 6.0
    with pytest.raises(ConfigError, match=r"clip_count_stddev \(its default m/20 = 4/20 = 0.2\) must be > noise_multiplier / 2 = 0.6"):
        ServerCore(fcfg(strategy="dp-fedavg", clip_norm=0.5, noise_multiplier=1.2, delta=1e-5, adaptive_clip=True), 10, 0)  # refused when built, not at round 1
