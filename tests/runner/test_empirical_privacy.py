"""The attack against the guarantee: a DP run's empirical lower bound sits below its accountant's
epsilon, and the same run with a tenth of the accounted noise (a privacy bug) exceeds it.

DP-FedAvg with random-direction canary clients (Andrew et al. 2024): 400 canaries, each a member
with probability 1/2; Poisson sampling of 100 of ~230 clients per round for 30 rounds at noise
multiplier 6 (epsilon about 1.8 at delta 1e-5, user-level, checked against dp_accounting). The real clients barely move the model (a
tiny client learning rate), so what separates members from non-members is the noise alone.
"""

from __future__ import annotations

import dataclasses

import dp_accounting
import dp_accounting.pld
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp

from fedpriv.config import validate_config
from fedpriv.engines.setup import FederatedSetup, train_federated
from fedpriv.engines.vectorized import VectorizedEngine
from fedpriv.runner.audit import empirical_audit
from fedpriv.runner.prepare import prepare

pytestmark = pytest.mark.slow

Z = 6.0
RAW = {
    "name": "audit-bug", "seed": 0,
    "data": {"source": "shakespeare", "heldout_fraction": 0.9, "max_examples_per_user": 2},
    "vocab": {"size": 100, "seq_len": 8}, "task": {"kind": "nwp", "model": "tiny"},
    "federated": {"strategy": "dp-fedavg", "rounds": 30, "clients_per_round": 100, "sampling": "poisson", "clip_norm": 0.5,
                  "local_batch_size": 4, "max_local_steps": 1, "client_learning_rate": 0.001, "eval_every": 30,
                  "dp": {"noise_multiplier": Z, "delta": 1e-5}},
    "audit": {"empirical": True, "empirical_canaries": 400, "empirical_kind": "client"},
}


@pytest.fixture(scope="module")
def prepared():
    return prepare(validate_config(RAW))


def audit_with_noise_scale(prepared, run_dir, scale: float, accountant: str = "rdp") -> dict:
    if accountant != "rdp":  # the same run accounted by another accountant (the data and the noise are the same)
        fed = {**RAW["federated"], "dp": {**RAW["federated"]["dp"], "accountant": accountant}}
        prepared = dataclasses.replace(prepared, config=validate_config({**RAW, "federated": fed}))
    setup = FederatedSetup(prepared)
    assert setup.core.budget.noise_multiplier == Z
    assert setup.core.population == prepared.train.num_users + int(prepared.audit_canaries.included.sum())
    setup.core.aggregator.noise_multiplier = Z * scale  # scale < 1 is the bug: less noise than the ledger accounts
    train_federated(setup, VectorizedEngine(setup), run_dir)
    return empirical_audit(run_dir, prepared=prepared)


def rdp_epsilon(q: float, rounds: int, z: float, delta: float) -> float:
    """dp_accounting's own RDP epsilon for ``rounds`` Poisson-sampled Gaussian rounds (add/remove one user)."""
    acc = dp_rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), rounds))
    return acc.get_epsilon(delta)


def pld_epsilon(q: float, rounds: int, z: float, delta: float) -> float:
    """dp_accounting's own PLD epsilon for the same rounds."""
    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), rounds))
    return acc.get_epsilon(delta)


def test_the_empirical_lower_bound_stays_below_the_accountants_epsilon(prepared, tmp_path):
    r = audit_with_noise_scale(prepared, tmp_path / "ok", 1.0, accountant="pld")
    # the population: the training users and the canary clients that are members (they are users too)
    q = 100 / (prepared.train.num_users + int(prepared.audit_canaries.included.sum()))
    # the run's own accountant (PLD here), as its summary states it: not RDP's larger figure
    assert r["accountant_epsilon"] == pytest.approx(pld_epsilon(q, 30, Z, 1e-5), rel=1e-9) and r["unit"] == "user"
    assert r["accountant_epsilon"] < rdp_epsilon(q, 30, Z, 1e-5)
    assert 1.0 < r["accountant_epsilon"] < 2.5
    assert (r["relation"], r["accountant_relation"], r["accountant_bounds_audit"]) == ("add-or-remove-one user", "add-or-remove-one user", True)
    assert 0.0 <= r["epsilon_lower_bound"] <= r["accountant_epsilon"]
    assert r["epsilon_lower_bound_fdp"] <= r["accountant_epsilon"]


def test_a_tenth_of_the_accounted_noise_is_caught(prepared, tmp_path):
    r = audit_with_noise_scale(prepared, tmp_path / "bug", 0.1)
    q = 100 / (prepared.train.num_users + int(prepared.audit_canaries.included.sum()))
    assert r["accountant_epsilon"] == pytest.approx(rdp_epsilon(q, 30, Z, 1e-5), rel=1e-9)  # the default accountant
    # measured: lower bound 3.4 (f-DP 5.8) against the claimed 1.67; AUROC 0.99
    assert r["epsilon_lower_bound"] > r["accountant_epsilon"] and r["auroc"] > 0.9
