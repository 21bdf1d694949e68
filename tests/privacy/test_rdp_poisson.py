"""fedpriv's RDP of the Poisson-subsampled Gaussian equals dp-accounting 0.6.0's to the bit."""

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp

from fedpriv.privacy.accounting import RDP_ORDERS, GaussianSteps, calibrate_noise_multiplier, epsilon_for
from fedpriv.privacy.rdp_poisson import rdp_poisson_gaussian

ORDERS = np.array(RDP_ORDERS)  # as RdpAccountant holds them: numpy floats, integer and fractional, up to 4096
FEW = np.array([1.25, 2.0, 3.5, 7.0, 20.0, 63.5])


def same(ours, theirs) -> bool:
    return ours.dtype == theirs.dtype and ours.tobytes() == theirs.tobytes()


@pytest.mark.parametrize("q, sigma", [(0.0967, 1.1), (256 / 60_000, 1.0), (0.4, 3.0), (1e-4, 30.0), (0.9, 0.7)])
def test_every_order_of_the_accountant_equals_dp_accounting(q, sigma):
    """The arXiv grid's user-level rows (q 0.097, sigma 1.1: some fractional orders do not converge
    and are inf in both), DP-SGD-sized q, the demo's DP-FedAvg, tiny q with large sigma, q near 1."""
    assert same(rdp_poisson_gaussian(q, sigma, ORDERS), dp_rdp._compute_rdp_poisson_subsampled_gaussian(q, sigma, ORDERS))


@pytest.mark.parametrize("q", [0.0, 1e-6, 0.003, 0.25, 0.999, 1.0])
@pytest.mark.parametrize("sigma", [0.0, 0.01, 0.5, 1.0, 4.0, 1e3])
def test_edge_sampling_rates_and_noise_equal_dp_accounting(q, sigma):
    assert same(rdp_poisson_gaussian(q, sigma, FEW), dp_rdp._compute_rdp_poisson_subsampled_gaussian(q, sigma, FEW))


def test_an_order_list_in_any_order_and_infinity_give_each_order_its_own_value():
    orders = np.array([63.5, np.inf, 2.0, 1.25, 20.0])
    assert same(rdp_poisson_gaussian(0.2, 1.5, orders), dp_rdp._compute_rdp_poisson_subsampled_gaussian(0.2, 1.5, orders))


def test_out_of_range_arguments_are_refused_as_dp_accounting_refuses_them():
    for q, sigma, match in [(1.5, 1.0, "Sampling rate"), (-0.1, 1.0, "Sampling rate"), (0.1, -1.0, "Noise multiplier")]:
        with pytest.raises(ValueError, match=match):
            dp_rdp._compute_rdp_poisson_subsampled_gaussian(q, sigma, FEW)
        with pytest.raises(ValueError, match=match):
            rdp_poisson_gaussian(q, sigma, FEW)


def test_a_poisson_epsilon_and_a_calibration_equal_rdp_accountant_on_the_same_events():
    """Through fedpriv's accountant: the epsilon and order of a Poisson run, and a calibration's
    sigma, with the answer at it, computed on RdpAccountant alone."""
    steps = GaussianSteps(sampling="poisson", noise_multiplier=1.3, population=51_855, batch=5_000, steps=200, unit="user")
    ours = epsilon_for(steps, 1e-5, "rdp")
    acc = dp_accounting.rdp.RdpAccountant(list(RDP_ORDERS), dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(steps.dp_event())
    assert (ours.epsilon, ours.rdp_order) == acc.get_epsilon_and_optimal_order(1e-5)
    sigma, answer = calibrate_noise_multiplier(steps, 8.0, 1e-5, "rdp")
    acc = dp_accounting.rdp.RdpAccountant(list(RDP_ORDERS), dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(GaussianSteps("poisson", sigma, 51_855, 5_000, 200, unit="user").dp_event())
    assert answer.epsilon == acc.get_epsilon(1e-5) <= 8.0
