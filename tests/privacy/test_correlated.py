"""Correlated noise (fedpriv/privacy/correlated.py): checked against its definitions.

One band is DP-SGD; the streaming noise is the dense C^-1 Z; the sensitivity is the brute-force
maximum over participation patterns and jax-privacy's; epsilon is dp_accounting's Gaussian with
multiplier sigma / Delta; the cyclic schedule keeps (k, b); the per-coordinate noise scale is the
claimed one."""

from __future__ import annotations

import itertools
import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax_privacy.matrix_factorization import toeplitz

from fedpriv.errors import PrivacyParameterError
from fedpriv.privacy.accounting import RDP_ORDERS, epsilon_for
from fedpriv.privacy.aggregate import correlated_noise_and_normalize, init_noise_state, noise_and_normalize
from fedpriv.privacy.correlated import CorrelatedSteps, CyclicSchedule, Strategy, make_strategy
from fedpriv.privacy.ledger import PrivacyLedger

#: A small BLT given by its parameters (RA-BLT's construction takes seconds; the runs use it).
SMALL_BLT = Strategy("blt", buf_decay=(0.9, 0.4), output_scale=(0.3, 0.1))
TREE = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), "b": jnp.arange(5.0)}


def steps_of(strategy, tree, keys, clip=1.5, z=0.7, denominator=4.0):
    matrix = strategy.noising_matrix()
    state = init_noise_state(matrix, tree)
    step = jax.jit(lambda t, k, s: correlated_noise_and_normalize(t, k, clip, z, denominator, matrix, s))
    out = []
    for k in keys:
        r, state = step(tree, k, state)
        out.append(r)
    return out


def test_one_band_is_dpsgd_same_noise_same_updates():
    """banded MF with one band (C = I) adds DP-SGD's noise float for float, so the optimizer
    takes the same steps."""
    keys = [jax.random.fold_in(jax.random.key(5), t) for t in range(4)]
    mf = steps_of(make_strategy("banded-mf", 1), TREE, keys)
    gauss = jax.jit(lambda t, k: noise_and_normalize(t, k, 1.5, 0.7, 4.0))
    tx = optax.adam(0.1)
    p_mf = p_g = jax.tree.map(jnp.zeros_like, TREE)
    s_mf = s_g = tx.init(p_mf)
    for k, g_mf in zip(keys, mf):
        g = gauss(TREE, k)
        for name in g:
            np.testing.assert_array_equal(np.asarray(g_mf[name]), np.asarray(g[name]))
        u, s_mf = tx.update(g_mf, s_mf, p_mf)
        p_mf = optax.apply_updates(p_mf, u)
        u, s_g = tx.update(g, s_g, p_g)
        p_g = optax.apply_updates(p_g, u)
    for name in p_g:
        np.testing.assert_array_equal(np.asarray(p_mf[name]), np.asarray(p_g[name]))


@pytest.mark.parametrize("strategy", [make_strategy("banded-mf", 3), SMALL_BLT], ids=["banded-mf-3", "blt-2-buffers"])
def test_streaming_noise_is_the_dense_inverse_times_z(strategy):
    assert_streaming_noise_is_the_dense_inverse_times_z(strategy)


def assert_streaming_noise_is_the_dense_inverse_times_z(strategy, n: int = 7) -> None:
    """Step t's noise is row t of C^-1 Z, Z_t the i.i.d. draw DP-SGD would add at step t (also
    used by test_optimized.py)."""
    zero = jax.tree.map(jnp.zeros_like, TREE)
    keys = [jax.random.fold_in(jax.random.key(1), t) for t in range(n)]
    streamed = steps_of(strategy, zero, keys, denominator=1.0)
    iid = [noise_and_normalize(zero, k, 1.5, 0.7, 1.0) for k in keys]
    c = np.asarray(toeplitz.materialize_lower_triangular(jnp.asarray(strategy.toeplitz_coefs(n), jnp.float32)), np.float64)
    c_inv = np.linalg.inv(c)
    assert not np.allclose(c_inv, np.eye(n))  # the noise is correlated
    for name in TREE:
        z = np.stack([np.asarray(d[name], np.float64) for d in iid])
        dense = np.tensordot(c_inv, z, axes=1)
        got = np.stack([np.asarray(s[name]) for s in streamed])
        np.testing.assert_allclose(got, dense, rtol=2e-5, atol=2e-6)


def brute_force_sensitivity(c: np.ndarray, b: int) -> float:
    """max ||C u|| over 0/1 participation vectors u whose ones are at least b apart (C >= 0)."""
    n, best = len(c), 0.0
    for u in itertools.product((0, 1), repeat=n):
        ones = [i for i, x in enumerate(u) if x]
        if all(j - i >= b for i, j in zip(ones, ones[1:])):
            best = max(best, float(np.linalg.norm(c @ np.asarray(u, float))))
    return best


@pytest.mark.parametrize("strategy", [make_strategy("banded-mf", 3), SMALL_BLT], ids=["banded-mf-3", "blt-2-buffers"])
def test_sensitivity_is_the_worst_participation_pattern(strategy):
    n, b = 10, 3  # N = 31 users in cohorts of 10: b = 3 groups, k = 4
    sched = CyclicSchedule(31, 10, n, seed=0)
    assert (sched.groups, sched.max_participations) == (3, 4)
    ev = CorrelatedSteps.of(strategy, 1.0, sched)
    c = np.asarray(toeplitz.materialize_lower_triangular(jnp.asarray(strategy.toeplitz_coefs(n))), np.float64)
    assert ev.sensitivity_in_clip_norms == pytest.approx(brute_force_sensitivity(c, b), rel=1e-6)


def test_sensitivity_and_epsilon_equal_jax_privacy_and_dp_accounting_by_hand():
    """banded MF, 4 bands, N = 1000 users, m = 100 per round, 25 rounds: b = 10, k = 3."""
    sched = CyclicSchedule(1000, 100, 25, seed=0)
    ev = CorrelatedSteps.of(make_strategy("banded-mf", 4), 3.0, sched)
    coefs = toeplitz.optimal_max_error_strategy_coefs(4)
    coefs = np.asarray(coefs, np.float64) / np.linalg.norm(np.asarray(coefs, np.float64))
    with jax.enable_x64(True):
        sq = float(toeplitz.minsep_sensitivity_squared(jnp.asarray(np.pad(coefs, (0, 21))), 10, 3, n=25))
    assert ev.sensitivity_in_clip_norms == pytest.approx(math.sqrt(sq), rel=1e-12)
    for accountant, acc in (("pld", dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)), ("rdp", dp_accounting.rdp.RdpAccountant(list(RDP_ORDERS)))):
        acc.compose(dp_accounting.GaussianDpEvent(3.0 / math.sqrt(sq)))
        ours = epsilon_for(ev, 1e-5, accountant)
        assert ours.epsilon == pytest.approx(acc.get_epsilon(1e-5), rel=1e-12)
        assert "k = 3" in ours.sampling and "b = 10" in ours.sampling and ours.relation == "zero-out-one"


def test_cyclic_schedule_keeps_k_and_b():
    sched = CyclicSchedule(103, 10, 35, seed=4)  # 10 groups of 10, 3 users never sampled
    seen: dict[int, list[int]] = {}
    for t in range(sched.steps):
        users = sched.sample(t)
        assert len(users) == 10 and len(set(users.tolist())) == 10
        for u in users.tolist():
            seen.setdefault(u, []).append(t)
    assert len(seen) == 100
    assert max(len(v) for v in seen.values()) == sched.max_participations == 4
    assert min(j - i for v in seen.values() for i, j in zip(v, v[1:])) == sched.groups == 10
    assert np.array_equal(sched.sample(3), CyclicSchedule(103, 10, 35, seed=4).sample(13))  # the same group every b steps
    assert not np.array_equal(sched.sample(3), CyclicSchedule(103, 10, 35, seed=5).sample(3))


def test_schedule_that_breaks_the_stated_participation_is_refused():
    sched = CyclicSchedule(48_700, 1000, 100, seed=0)  # b = 48, k = 3
    sched.check("federated.dp", 3, 48)
    with pytest.raises(PrivacyParameterError, match=r"federated.dp.max_participations = 2: .* take part 3 times; use at most 96 steps"):
        sched.check("federated.dp", 2, None)
    with pytest.raises(PrivacyParameterError, match=r"federated.dp.min_separation = 50: .* only 48 groups"):
        sched.check("federated.dp", None, 50)
    short = CyclicSchedule(48_700, 1000, 48, seed=0)  # 48 steps over 48 groups: each user at most once, so any separation holds
    assert short.max_participations == 1
    short.check("federated.dp", 1, 50)
    with pytest.raises(PrivacyParameterError, match=r"min_separation = 50: .* only 48 groups"):
        CyclicSchedule(48_700, 1000, 49, seed=0).check("federated.dp", None, 50)  # one step more: group 0 comes back at step 48
    with pytest.raises(PrivacyParameterError, match="needs at least that many"):
        CyclicSchedule(10, 11, 5, seed=0)


def test_noise_scale_per_coordinate_matches_the_claim():
    """Fixed seed, 100,000 coordinates: the empirical std of step t's noise on the sum is
    z * C * ||row t of C^-1|| (z * C for DP-SGD), within 1%."""
    n, z, clip = 6, 0.8, 2.0
    zero = {"w": jnp.zeros(100_000)}
    keys = [jax.random.fold_in(jax.random.key(11), t) for t in range(n)]
    for strategy in (make_strategy("banded-mf", 1), make_strategy("banded-mf", 3), SMALL_BLT):
        got = steps_of(strategy, zero, keys, clip=clip, z=z, denominator=1.0)
        c = np.asarray(toeplitz.materialize_lower_triangular(jnp.asarray(strategy.toeplitz_coefs(n))), np.float64)
        claim = z * clip * np.linalg.norm(np.linalg.inv(c), axis=1)
        empirical = np.array([float(np.std(np.asarray(g["w"]))) for g in got])
        np.testing.assert_allclose(empirical, claim, rtol=0.01)
        if strategy.mechanism == "banded-mf" and len(strategy.coefs) == 1:
            np.testing.assert_allclose(claim, z * clip)


def test_ledger_keeps_a_correlated_event_and_merges_its_steps(tmp_path):
    sched = CyclicSchedule(1000, 100, 25, seed=0)
    ev = CorrelatedSteps.of(SMALL_BLT, 2.0, sched)
    ledger = PrivacyLedger()
    for _ in range(25):
        ledger.record(ev.with_steps(1))
    assert len(ledger.entries) == 1 and ledger.steps == 25
    ledger.save(tmp_path / "l.json")
    again = PrivacyLedger.load(tmp_path / "l.json")
    assert again.entries == ledger.entries
    assert again.epsilon(1e-5).epsilon == epsilon_for(ev, 1e-5).epsilon
    # epsilon grows with the steps released (more participations, a larger sensitivity)
    assert epsilon_for(ev.with_steps(5), 1e-5).epsilon < epsilon_for(ev, 1e-5).epsilon


def test_the_report_draws_epsilon_curves_of_a_correlated_run():
    from fedpriv.report.tables import epsilon_curves

    ev = CorrelatedSteps.of(make_strategy("banded-mf", 2), 2.0, CyclicSchedule(1000, 100, 20, seed=0))
    out = epsilon_curves([ev], 1e-5, "rdp", "federated", points=3)
    assert [p["parameter"] for p in out["panels"]] == ["noise_multiplier", "rounds"]  # no batch panel: no sampling
    assert out["epsilon"] == epsilon_for(ev, 1e-5).epsilon
    rounds = out["panels"][1]
    assert rounds["epsilon"] == sorted(rounds["epsilon"])  # more rounds, more participations, a larger epsilon


def test_blt_inverse_equals_jax_privacy_build_inverse():
    """fedpriv's elementwise C^-1 of a BLT (privacy/correlated.py blt_inverse) is jax-privacy's
    StreamingMatrixBuilder.build_inverse, step for step on a pytree, to float32 rounding."""
    from jax_privacy.matrix_factorization import buffered_toeplitz

    blt = Strategy("blt", buf_decay=(0.95, 0.7, 0.3), output_scale=(0.2, 0.15, 0.05))
    ours = blt.noising_matrix()
    theirs = buffered_toeplitz.StreamingMatrixBuilder(buf_decay=np.asarray(blt.buf_decay, np.float32), output_scale=np.asarray(blt.output_scale, np.float32)).build_inverse()
    np.testing.assert_allclose(np.asarray(ours.materialize(12)), np.asarray(theirs.materialize(12)), rtol=1e-6, atol=1e-7)
    s_ours, s_theirs = init_noise_state(ours, TREE), init_noise_state(theirs, TREE)
    assert jax.tree.map(jnp.shape, s_ours) == jax.tree.map(jnp.shape, s_theirs)  # the same checkpointed state
    for t in range(6):
        y = jax.tree.map(lambda x: jax.random.normal(jax.random.fold_in(jax.random.key(3), t), x.shape), TREE)
        a, s_ours = ours.multiply_next(y, s_ours)
        b, s_theirs = theirs.multiply_next(y, s_theirs)
        for name in TREE:
            np.testing.assert_allclose(np.asarray(a[name]), np.asarray(b[name]), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mechanism", ["blt", "banded-mf"])
def test_secure_noise_is_accepted_with_a_correlated_mechanism(mechanism):
    """Its checkpoints hold no noise state (a resume replays the draws), so a secret noise source is
    allowed with banded MF and BLT: in the config and on the command line, central and federated."""
    from fedpriv.config import validate_config
    from fedpriv.training.noise import noise_seed, with_secure_noise

    keys = {"mechanism": mechanism, **({"bands": 2} if mechanism == "banded-mf" else {})}
    base = {"name": "s", "data": {"source": "shakespeare"}, "task": {"kind": "nwp", "model": "tiny"}}
    central = {**base, "privacy": {"clip_norm": 1.0, "noise_multiplier": 2.0, "delta": 1e-6, **keys}}
    fed = {**base, "federated": {"strategy": "dp-fedavg", "rounds": 2, "clients_per_round": 4, "clip_norm": 1.0,
                                 "dp": {"noise_multiplier": 2.0, "delta": 1e-6, **keys}}}
    assert validate_config({**central, "privacy": {**central["privacy"], "secure_noise": True}}).privacy.secure_noise
    assert validate_config({**fed, "federated": {**fed["federated"], "dp": {**fed["federated"]["dp"], "secure_noise": True}}}).federated.dp.secure_noise
    for raw in (central, fed):  # `--secure-noise` on the command line
        assert noise_seed(with_secure_noise(validate_config(raw))).secure


@pytest.mark.parametrize("strategy", [make_strategy("banded-mf", 3), SMALL_BLT], ids=["banded-mf-3", "blt-2-buffers"])
def test_replaying_the_draws_rebuilds_the_noise_state_bit_for_bit(strategy):
    """The state C^-1 keeps depends on the draws Z_1..Z_t only (not on the clipped sums): replayed
    through the same compiled step on zero sums, with the keys in order, it is the trained state bit
    for bit; with the keys in another order it is not (the state is the noise)."""
    from fedpriv.privacy.aggregate import replay_noise_state

    matrix = strategy.noising_matrix()
    step = jax.jit(lambda t, k, s: correlated_noise_and_normalize(t, k, 1.5, 0.7, 4.0, matrix, s))
    zero = jax.tree.map(jnp.zeros_like, TREE)
    keys = [jax.random.fold_in(jax.random.key(4), t) for t in range(6)]
    state = init_noise_state(matrix, TREE)
    for t, k in enumerate(keys):  # training: a different clipped sum at every step
        _, state = step(jax.tree.map(lambda x: x * (t + 1), TREE), k, state)
    replay = lambda ks: replay_noise_state(lambda s, k: step(zero, k, s)[1], init_noise_state(matrix, TREE), ks)  # noqa: E731
    rebuilt = replay(keys)
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(jax.tree.leaves(rebuilt), jax.tree.leaves(state)))
    assert any(np.any(np.asarray(x) != 0) for x in jax.tree.leaves(state))
    shuffled = replay(keys[::-1])
    assert not all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(jax.tree.leaves(shuffled), jax.tree.leaves(state)))


def test_the_replay_docstring_example_runs():
    """``replay_noise_state``'s ``>>>`` example (pytest does not collect doctests)."""
    import doctest

    import fedpriv.privacy.aggregate as aggregate

    result = doctest.testmod(aggregate, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
