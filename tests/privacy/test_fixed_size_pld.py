"""Why fixed-size (sampling without replacement, replace-one) cohorts stay RDP-only.

docs/privacy.md "PLD for fixed-size cohorts" explains it; these tests pin the facts it rests on,
against a pair of output distributions that a fixed-size run can actually produce: unit i's
clipped contribution is x = +C, the record replacing it and all other records are -C (1-D), so one
step of the Gaussian sum (noise z*C) is A = g*N(2C) + (1-g)*N(0) on D against Q = N(0) on D'
(shifted by the batch's sum of -C's), g = B/N. Its hockey-stick divergence is computed here by
numerical integration, independently of dp_accounting.
"""

import math

import dp_accounting
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld
from scipy import integrate, stats

from fedpriv.privacy.accounting import GaussianSteps, delta_for, epsilon_for

REL = dp_accounting.NeighboringRelation
CASES = [(1.0, 1000, 100, 0.5), (1.0, 1000, 100, 1.0), (2.0, 1000, 200, 0.3), (0.8, 100, 10, 1.0)]


def realizable_fixed_size_delta(z: float, g: float, eps: float) -> float:
    """max over both orders of H_{e^eps}(A || Q), A = g N(2, z^2) + (1-g) N(0, z^2), Q = N(0, z^2) (units of C)."""
    a = lambda x: g * stats.norm.pdf(x, 2, z) + (1 - g) * stats.norm.pdf(x, 0, z)  # noqa: E731
    q = lambda x: stats.norm.pdf(x, 0, z)  # noqa: E731
    lim = 2 + 40 * z
    one = integrate.quad(lambda x: max(a(x) - math.exp(eps) * q(x), 0.0), -lim, lim, points=[0, 1, 2], limit=500)[0]
    other = integrate.quad(lambda x: max(q(x) - math.exp(eps) * a(x), 0.0), -lim, lim, points=[0, 1, 2], limit=500)[0]
    return max(one, other)


@pytest.mark.parametrize("z,N,B,eps", CASES)
def test_rdp_accounting_of_fixed_size_bounds_a_realizable_pair_and_sensitivity_c_would_not(z, N, B, eps):
    truth = realizable_fixed_size_delta(z, B / N, eps)
    assert delta_for(GaussianSteps("fixed", z, N, B, 1), eps, "rdp").delta >= truth
    # sensitivity C instead of 2C (the Poisson event with the same z) falls below what the run can leak
    assert delta_for(GaussianSteps("poisson", z, N, B, 1), eps, "rdp").delta < truth


@pytest.mark.parametrize("z,N,B,eps", CASES)
def test_dp_accounting_replace_one_sampled_pld_understates_fixed_size(z, N, B, eps):
    """dp_accounting's sampled Gaussian PLD under REPLACE_ONE is Poisson sampling under substitution
    (shifts +-C around a common base): well below a pair that fixed-size sampling produces."""
    replace_one = pld.from_gaussian_mechanism(z, sampling_prob=B / N, neighboring_relation=REL.REPLACE_ONE, value_discretization_interval=1e-3)
    assert replace_one.get_delta_for_epsilon(eps) < 0.5 * realizable_fixed_size_delta(z, B / N, eps)


@pytest.mark.parametrize("z,N,B,eps", CASES)
def test_add_remove_pld_at_half_the_noise_is_the_realizable_pair_for_one_step(z, N, B, eps):
    """One step: the Poisson add/remove PLD with multiplier z/2 is exactly the realizable pair
    (Balle et al. 2018, Zhu et al. 2022), so it is tight for one step; the composition is what
    dp_accounting does not prove (docs/privacy.md)."""
    one_step = pld.from_gaussian_mechanism(z / 2, sampling_prob=B / N, neighboring_relation=REL.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-3)
    assert one_step.get_delta_for_epsilon(eps) == pytest.approx(realizable_fixed_size_delta(z, B / N, eps), rel=2e-3)


def test_replace_special_sampled_pld_is_the_add_remove_pld():
    """REPLACE_SPECIAL (a record replaced by a zero record) with a sampling probability is
    dp_accounting's Poisson add/remove PLD, not sampling without replacement."""
    special = pld.from_gaussian_mechanism(1.0, sampling_prob=0.05, neighboring_relation=REL.REPLACE_SPECIAL).self_compose(20)
    add_remove = pld.from_gaussian_mechanism(1.0, sampling_prob=0.05, neighboring_relation=REL.ADD_OR_REMOVE_ONE).self_compose(20)
    assert special.get_epsilon_for_delta(1e-5) == add_remove.get_epsilon_for_delta(1e-5)


def test_pld_for_fixed_size_is_refused_with_a_pointer_to_rdp():
    event = GaussianSteps("fixed", 1.0, 1000, 100, 10, unit="user")
    with pytest.raises(Exception, match="PLD accountant does not cover sampling without replacement"):
        epsilon_for(event, 1e-5, "pld")
