"""Optimized correlated-noise strategies (coefficients = "optimized"): the accounting of the stored
coefficients equals jax-privacy's and dp_accounting's own functions, the optimized strategy's
error is at most the fixed one's, its streaming noise is C^-1 Z, and it is stored and read back."""

from __future__ import annotations

import json
import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax_privacy.matrix_factorization import buffered_toeplitz, toeplitz
from test_correlated import assert_streaming_noise_is_the_dense_inverse_times_z

from fedpriv.errors import DataFormatError, FedprivError, PrivacyParameterError
from fedpriv.privacy import optimized
from fedpriv.privacy.accounting import PLD_DISCRETIZATION, RDP_ORDERS, epsilon_for
from fedpriv.privacy.amplified import AmplifiedBandMF, CyclicPoissonSchedule
from fedpriv.privacy.correlated import CorrelatedSteps, CyclicSchedule, make_strategy
from fedpriv.privacy.optimized import OptimizationSpec, load_strategy, mean_error_times_sensitivity, resolve_strategy, strategy_for

ADD_OR_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
#: N = 400 in cohorts of 100: b = 4 groups, n = 12 steps, k = 3; 3 bands (<= b).
SCHEDULE = CyclicSchedule(400, 100, 12, seed=0)


@pytest.fixture(scope="module")
def banded():
    """The optimized 3-band strategy for SCHEDULE (jax-privacy's optimizer: about 3 s, once)."""
    return strategy_for("banded-mf", "optimized", 3, None, SCHEDULE)


def mean_error(coefs: np.ndarray, n: int) -> float:
    """jax-privacy's mean per-step squared prefix-sum error of the Toeplitz C with first column ``coefs``."""
    with jax.enable_x64(True):
        return float(jnp.mean(toeplitz.per_query_error(strategy_coef=jnp.asarray(coefs, jnp.float64), n=n)))


def minsep_sq(coefs: np.ndarray, b: int, k: int, n: int) -> float:
    with jax.enable_x64(True):
        return float(toeplitz.minsep_sensitivity_squared(jnp.asarray(coefs, jnp.float64), b, k, n=n))


def test_optimized_banded_mf_is_what_jax_privacy_returns_and_not_the_fixed_one(banded):
    with jax.enable_x64(True):
        want = np.asarray(toeplitz.optimize_banded_toeplitz(12, 3, reduction_fn=jnp.mean), np.float64)
    np.testing.assert_array_equal(np.asarray(banded.coefs), want)
    assert np.linalg.norm(want) == pytest.approx(1.0, rel=1e-12)
    assert not banded.fixed and make_strategy("banded-mf", 3).fixed
    assert "numerically optimized" in banded.describe() and "optimal max-error" in make_strategy("banded-mf", 3).describe()


def test_optimized_sensitivity_and_epsilon_equal_jax_privacy_and_dp_accounting_by_hand(banded):
    """Delta from jax-privacy's min-separation sensitivity of the stored coefficients (= sqrt(k) with
    bands <= b and norm 1), epsilon from dp_accounting's Gaussian with sigma / Delta."""
    ev = CorrelatedSteps.of(banded, 3.0, SCHEDULE)
    c = np.pad(np.asarray(banded.coefs), (0, 12 - 3))
    sq = minsep_sq(c, 4, 3, 12)
    assert sq == pytest.approx(3.0, rel=1e-12)  # k disjoint columns of norm 1
    assert ev.sensitivity_in_clip_norms == pytest.approx(math.sqrt(sq), rel=1e-12)
    for accountant, acc in (("pld", dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)), ("rdp", dp_accounting.rdp.RdpAccountant(list(RDP_ORDERS)))):
        acc.compose(dp_accounting.GaussianDpEvent(3.0 / math.sqrt(sq)))
        assert epsilon_for(ev, 1e-5, accountant).epsilon == pytest.approx(acc.get_epsilon(1e-5), rel=1e-12)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_optimized_amplified_epsilon_is_the_hand_composition(banded, accountant):
    """Amplified banded MF (3 bands, b = 4 groups of N = 5003, 50 expected, 12 steps): dp_accounting's
    k-fold Poisson-subsampled Gaussian with multiplier sigma over the stored coefficients' column norm."""
    sched = CyclicPoissonSchedule(5003, 50, 4, 12, 0, "user")
    strategy = strategy_for("banded-mf", "optimized", 3, None, sched)
    assert strategy == banded  # the same optimization (n, bands): jax-privacy's banded optimizer knows no b
    ev = AmplifiedBandMF.of(strategy, 0.9, sched)
    with jax.enable_x64(True):
        c_max = math.sqrt(float(toeplitz.sensitivity_squared(jnp.asarray(strategy.coefs, jnp.float64), n=12)))
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(50 / (5003 // 4), dp_accounting.GaussianDpEvent(0.9 / c_max)), 3)
    acc = dp_accounting.rdp.RdpAccountant(RDP_ORDERS, ADD_OR_REMOVE) if accountant == "rdp" else dp_accounting.pld.PLDAccountant(ADD_OR_REMOVE, value_discretization_interval=PLD_DISCRETIZATION)
    assert epsilon_for(ev, 1e-5, accountant).epsilon == pytest.approx(acc.compose(event).get_epsilon(1e-5), rel=1e-9)


def test_optimized_banded_mf_error_is_at_most_the_fixed_ones(banded):
    """At one sensitivity-normalized scale (mean squared prefix-sum error times Delta^2, jax-privacy's
    per_query_error and minsep sensitivity), the optimized bands beat the fixed max-error bands."""
    fixed = make_strategy("banded-mf", 3)
    spec = OptimizationSpec("banded-mf", 12, 4, 3, 3)

    def loss(s):
        c = s.toeplitz_coefs(12)
        return mean_error(c, 12) * minsep_sq(c, 4, 3, 12)

    assert loss(banded) == pytest.approx(mean_error_times_sensitivity(banded, spec), rel=1e-12)
    assert loss(fixed) == pytest.approx(mean_error_times_sensitivity(fixed, spec), rel=1e-12)
    assert loss(banded) < loss(fixed) * (1 - 1e-3)


def test_streaming_noise_of_an_optimized_strategy_is_the_dense_inverse_times_z(banded):
    assert_streaming_noise_is_the_dense_inverse_times_z(banded)


def test_the_strategy_is_stored_and_read_back_never_optimized_again(banded, tmp_path, monkeypatch):
    path = tmp_path / "strategy.json"
    spec = OptimizationSpec("banded-mf", 12, 4, 3, 3)
    said = []
    assert resolve_strategy(spec, path, said.append) == banded
    assert any(m.startswith("optimized strategy in ") and m.split()[3].endswith("s:") for m in said)
    stored = json.loads(path.read_text())
    assert stored["spec"]["steps"] == 12 and stored["strategy"]["coefs"] == list(banded.coefs)

    def refuse(_spec):
        raise AssertionError("optimized again")

    monkeypatch.setattr(optimized, "optimize_strategy", refuse)
    said.clear()
    assert resolve_strategy(spec, path, said.append) == banded
    assert said == [f"optimized strategy read from {path} (not optimized again)"]
    assert load_strategy(path) == (spec, banded)
    # A stored strategy is reused even where a new optimization would give other numbers (another machine):
    moved = json.loads(path.read_text())
    moved["strategy"]["coefs"] = [0.8, 0.5, float(math.sqrt(1 - 0.89))]
    path.write_text(json.dumps(moved))
    assert resolve_strategy(spec, path).coefs == tuple(moved["strategy"]["coefs"])
    with pytest.raises(FedprivError, match="optimized for .* use a new run directory"):
        resolve_strategy(OptimizationSpec("banded-mf", 13, 4, 4, 3), path)
    path.write_text('{"format": "fedpriv-optimized-strategy-1", "spec": {"mechanism": "blt"}}')
    with pytest.raises(DataFormatError, match="not a valid optimized strategy"):
        load_strategy(path)
    moved["strategy"]["coefs"] = [0.5, 0.8, float(math.sqrt(1 - 0.89))]  # increasing: not what the min-separation sensitivity covers
    path.write_text(json.dumps(moved))
    with pytest.raises(DataFormatError, match="increasing Toeplitz coefficients"):
        resolve_strategy(spec, path)


def test_bad_settings_are_refused_in_one_line():
    with pytest.raises(PrivacyParameterError, match=r"bands = 5 > the cyclic schedule's groups N // m = 4"):
        strategy_for("banded-mf", "optimized", 5, None, SCHEDULE)
    with pytest.raises(PrivacyParameterError, match="coefficients must be one of fixed, optimized"):
        strategy_for("banded-mf", "best", 3, None, SCHEDULE)
    with pytest.raises(PrivacyParameterError, match="BLT runs the cyclic schedule only"):
        OptimizationSpec("blt", 12, 4, 3, 2, "cyclic-poisson")
    assert strategy_for("banded-mf", "fixed", 3, None, SCHEDULE) == make_strategy("banded-mf", 3)  # fixed: today's strategy


@pytest.mark.slow
def test_optimized_blt_beats_the_rational_approximation_and_is_accounted_as_stored():
    """BLT (at most 2 buffers) for n = 12, b = 4, k = 3 (jax-privacy's BLT optimizer: about 20 s,
    mostly compiling): jax-privacy's own loss of the optimized BLT is below the RA-BLT's, and Delta is
    jax-privacy's min-separation sensitivity of the stored parameters' Toeplitz coefficients."""
    blt = strategy_for("blt", "optimized", None, 2, SCHEDULE)
    assert 1 <= len(blt.buf_decay) <= 2 and not blt.fixed
    fixed = make_strategy("blt", buffers=2)
    loss_fn = buffered_toeplitz.LossFn.build_min_sep(n=12, error="mean", min_sep=4, max_participations=3)
    with jax.enable_x64(True):
        def loss(s):
            return float(loss_fn.loss(buffered_toeplitz.BufferedToeplitz.build(buf_decay=list(s.buf_decay), output_scale=list(s.output_scale))))

        assert loss(blt) < loss(fixed) * (1 - 1e-3)
        spec = OptimizationSpec("blt", 12, 4, 3, 2)
        assert mean_error_times_sensitivity(blt, spec) == pytest.approx(loss(blt), rel=1e-9)
        c = np.asarray(buffered_toeplitz.BufferedToeplitz.build(buf_decay=list(blt.buf_decay), output_scale=list(blt.output_scale)).toeplitz_coefs(12), np.float64)
    ev = CorrelatedSteps.of(blt, 2.0, SCHEDULE)
    assert ev.sensitivity_in_clip_norms == pytest.approx(math.sqrt(minsep_sq(c, 4, 3, 12)), rel=1e-12)
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.GaussianDpEvent(2.0 / ev.sensitivity_in_clip_norms))
    assert epsilon_for(ev, 1e-5, "pld").epsilon == pytest.approx(acc.get_epsilon(1e-5), rel=1e-12)
