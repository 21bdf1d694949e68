"""fedpriv's RDP of sampling without replacement equals dp-accounting 0.6.0's to the bit."""

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp

from fedpriv.privacy.accounting import RDP_ORDERS, GaussianSteps, epsilon_for
from fedpriv.privacy.rdp_wor import EXACT_MAX_ORDER, rdp_sample_wor_gaussian

ORDERS = np.array(RDP_ORDERS)  # as RdpAccountant holds them: numpy floats
FEW = np.array([1.5, 2.0, 2.5, 3.0, 7.25, 20.0, 63.5])  # the exact branch, integer and fractional orders (cheap)
BOUNDARY = np.array([255.5, 256.0, 256.5, 300.0])  # the last exact order, one between the branches, one by Stirling


@pytest.mark.parametrize("q, sigma", [(0.1, 1.2), (1e-4, 30.0)])
def test_every_order_of_the_accountant_equals_dp_accounting(q, sigma):
    assert max(RDP_ORDERS) > EXACT_MAX_ORDER  # the Stirling branch is exercised
    ours = rdp_sample_wor_gaussian(q, sigma, ORDERS)
    theirs = dp_rdp._compute_rdp_sample_wor_gaussian(q, sigma, ORDERS)
    assert ours.dtype == theirs.dtype and ours.tobytes() == theirs.tobytes()


@pytest.mark.parametrize("q", [0.0, 1e-6, 0.003, 0.25, 0.999, 1.0])
@pytest.mark.parametrize("sigma", [0.01, 0.5, 1.0, 4.0, 1e3])
def test_edge_sampling_rates_and_noise_equal_dp_accounting(q, sigma):
    ours = rdp_sample_wor_gaussian(q, sigma, FEW)
    theirs = dp_rdp._compute_rdp_sample_wor_gaussian(q, sigma, FEW)
    assert ours.dtype == theirs.dtype and ours.tobytes() == theirs.tobytes()


def test_the_orders_around_the_branch_boundary_equal_dp_accounting():
    assert rdp_sample_wor_gaussian(0.02, 0.9, BOUNDARY).tobytes() == dp_rdp._compute_rdp_sample_wor_gaussian(0.02, 0.9, BOUNDARY).tobytes()


def test_an_order_list_in_any_order_gives_each_order_its_own_value():
    shuffled = FEW[::-1].copy()
    assert rdp_sample_wor_gaussian(0.2, 1.5, shuffled).tobytes() == dp_rdp._compute_rdp_sample_wor_gaussian(0.2, 1.5, shuffled).tobytes()


def test_a_fixed_size_epsilon_equals_rdp_accountant_on_the_same_event():
    """Through fedpriv's accountant: fixed-size DP-FedAvg (replace-one, sigma/2 per unit of 2C)."""
    steps = GaussianSteps(sampling="fixed", noise_multiplier=1.3, population=1000, batch=50, steps=200, unit="user")
    ours = epsilon_for(steps, 1e-5, "rdp")
    acc = dp_accounting.rdp.RdpAccountant(list(RDP_ORDERS), dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(steps.dp_event())
    eps, order = acc.get_epsilon_and_optimal_order(1e-5)
    assert (ours.epsilon, ours.rdp_order) == (eps, order)
