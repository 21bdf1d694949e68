"""Client-side DP-SGD (record-level DP inside each client) and its accounting."""

from __future__ import annotations

import dp_accounting
import jax
import numpy as np
import pytest
from federated_helpers import leaves_max_diff, write_config

from fedpriv.clients.privacy import RecordLevelPrivacy
from fedpriv.clients.update import ClientDP, client_key, make_client_update
from fedpriv.config import ClientDPConfig, validate_config
from fedpriv.engines.setup import FederatedSetup
from fedpriv.errors import ConfigError
from fedpriv.runner.prepare import prepare
from fedpriv.strategies.sampling import CohortSampler, Participation

B = 8


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return FederatedSetup(prepare(write_config(tmp_path_factory.mktemp("cdp"))))


def one_user(setup, pick):
    counts = setup.data.counts
    return int(np.flatnonzero(pick(counts))[0])


def test_huge_clip_and_no_noise_is_plain_local_sgd(setup):
    user = one_user(setup, lambda c: c == 2 * B)  # two full batches per epoch
    plan = setup.plan(user, 1)
    b, m = setup.data.batches(user, plan, len(plan))
    params, key = setup.initial_params(), client_key(0, 1, user)
    plain, _ = jax.jit(make_client_update(setup.task, 0.5))(params, b, m, key)
    private, _ = jax.jit(make_client_update(setup.task, 0.5, ClientDP(1e6, 1e-12, B)))(params, b, m, key)
    assert leaves_max_diff(plain, private) < 1e-5


def test_local_noise_std_is_sigma_C_over_B(setup):
    # One local step (a user with <= B examples, one epoch): delta = -lr (clipped sum + noise) / B.
    # The clipped sum has norm <= n*C = 0.08 in total; the noise has std sigma*C/B per coordinate
    # over ~20k coordinates (norm ~ 90 here), so the measured std is the noise's within 2%
    # (the sample std of 20k normals has relative standard error 0.5%).
    user = one_user(setup, lambda c: c <= B)
    fcfg_epochs = setup.fcfg.local_epochs
    plan = setup.plan(user, 1)[: len(setup.plan(user, 1)) // fcfg_epochs]
    assert len(plan) == 1
    b, m = setup.data.batches(user, plan, 1)
    C, sigma, lr = 0.01, 50.0, 1.0
    delta, _ = jax.jit(make_client_update(setup.task, lr, ClientDP(C, sigma, B)))(setup.initial_params(), b, m, client_key(0, 1, user))
    flat = np.concatenate([np.asarray(x).ravel() for x in jax.tree_util.tree_leaves(delta)])
    assert flat.size > 10_000
    assert abs(flat.std() / (lr * sigma * C / B) - 1) < 0.02


def test_participation_counts_match_brute_force():
    s = CohortSampler(30, 5, "fixed", seed=2)
    p = Participation(s)
    counts = np.zeros(30, int)
    for r in range(1, 41):
        counts[s.sample(r)] += 1
        assert p.max_after(r) == counts.max()
    assert p.max_after(3) == np.bincount(np.concatenate([s.sample(r) for r in (1, 2, 3)]), minlength=30).max()


def test_record_level_epsilon_is_k_composed_gaussians():
    s = CohortSampler(30, 5, "fixed", seed=2)
    rep = RecordLevelPrivacy(ClientDPConfig(clip_norm=1.0, noise_multiplier=2.0, delta=1e-5), local_epochs=2).report(Participation(s).max_after(10))
    k = 2 * Participation(s).max_after(10)
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(2.0), k)
    assert rep["client_epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-3)
    assert f"{k} Gaussian steps" in rep["client_guarantee"] and "record-level" in rep["client_guarantee"]


def test_partial_client_dp_keys_are_refused():
    with pytest.raises(ConfigError, match="federated.client_dp.delta: Field required"):
        validate_config({"name": "x", "federated": {"rounds": 1, "clients_per_round": 1, "client_dp": {"clip_norm": 1.0, "noise_multiplier": 1.0}}})
    assert validate_config({"name": "x", "federated": {"rounds": 1, "clients_per_round": 1}}).federated.client_dp is None


@pytest.mark.slow
def test_run_with_client_dp_reports_record_level_epsilon_each_round(tmp_path):
    from fedpriv.engines.vectorized import run_vectorized

    extra = "client_dp = { clip_norm = 1.0, noise_multiplier = 1.5, delta = 1e-5 }"
    res = run_vectorized(prepare(write_config(tmp_path, extra=extra)), tmp_path / "r")
    rows = [r for r in res.history if r["split"] == "train"]
    eps = [r["client_epsilon"] for r in rows]
    assert len(rows) == 3 and eps == sorted(eps) and eps[0] > 0
    assert rows[0]["epsilon"] is None  # fedavg: no user-level guarantee, only the record-level one
