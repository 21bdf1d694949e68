"""Client-side DP-SGD (record-level DP inside each client) and its accounting."""

from __future__ import annotations

import dp_accounting
import jax
import numpy as np
import pytest
from federated_helpers import leaves_max_diff, write_config

from fedpriv.clients.privacy import RecordLevelPrivacy, dp_plan
from fedpriv.clients.update import ClientDP, client_key, make_client_update
from fedpriv.config import ClientDPConfig, load_config, validate_config
from fedpriv.engines.setup import FederatedSetup
from fedpriv.errors import ConfigError
from fedpriv.runner.prepare import prepare
from fedpriv.strategies.sampling import CohortSampler, Participation

B = 8


def client_dp_config(tmp_path, client_dp: str):
    """The tiny experiment with ``federated.client_dp = {client_dp}`` (one local epoch: client-side
    DP-SGD fixes its own local steps)."""
    p = write_config(tmp_path, extra=client_dp)
    p.write_text(p.read_text().replace("local_epochs = 2", "local_epochs = 1"))
    return p


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
    rep = RecordLevelPrivacy(ClientDPConfig(clip_norm=1.0, noise_multiplier=2.0, delta=1e-5, local_steps=2)).report(Participation(s).max_after(10))
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
    lines: list[str] = []
    res = run_vectorized(prepare(client_dp_config(tmp_path, extra)), tmp_path / "r", log=lines.append)
    rows = [r for r in res.history if r["split"] == "train"]
    eps = [r["client_epsilon"] for r in rows]
    assert len(rows) == 3 and eps == sorted(eps) and eps[0] > 0
    assert rows[0]["epsilon"] is None  # fedavg: no user-level guarantee, only the record-level one
    # the progress line states the relation and the sampling next to the epsilon it prints
    said = [line for line in lines if "record-level client epsilon" in line]
    assert said and all("add-or-remove-one example; every example in every local step, no sampling amplification)" in line for line in said), lines


# ---- a fixed number of noisy local steps, whatever n_u (issue 30, point 4) -----------------------------
K, SIGMA, C_SMALL = 3, 50.0, 0.01


def _noise_ratio(deltas, i, setup, k):
    """The std of client ``i``'s delta over every coordinate, over the noise std sqrt(k) lr sigma C / B
    of k noisy steps (the clipped sums are at most n C < 0.2 in norm, over ~20k coordinates)."""
    flat = np.concatenate([np.asarray(x[i]).ravel() for x in jax.tree_util.tree_leaves(deltas)])
    return flat.std() / (np.sqrt(k) * setup.fcfg.client_learning_rate * SIGMA * C_SMALL / B)


@pytest.fixture(scope="module")
def dp_runtime(tmp_path_factory):
    """A ClientApp's runtime for the tiny experiment with client-side DP-SGD (K steps, q = 1), and
    two users with n_u = B and B + 1 examples."""
    from fedpriv.engines.flower.apps import ClientRuntime

    cfg = client_dp_config(tmp_path_factory.mktemp("cdpk"), f"client_dp = {{ clip_norm = {C_SMALL}, noise_multiplier = {SIGMA}, delta = 1e-5, local_steps = {K} }}")
    rt = ClientRuntime(load_config(cfg), prepare)
    counts = rt.setup.data.counts
    return rt, [int(np.flatnonzero(counts == B)[0]), int(np.flatnonzero(counts == B + 1)[0])]


def test_one_step_on_at_most_B_examples_is_the_one_epoch_local_sgd_plan(dp_runtime):
    rt, _ = dp_runtime
    setup, f = rt.setup, rt.setup.fcfg
    user = int(np.flatnonzero(setup.data.counts <= B)[0])
    one = dp_plan(int(setup.data.counts[user]), 1, 1.0, setup.seed, 2, user, B)
    assert np.array_equal(one, setup.data.plan(user, 2, setup.seed, 1, f.local_batch_size, None))


def test_clients_with_kB_and_kB_plus_1_examples_run_the_same_number_of_noisy_steps(dp_runtime):
    # Before: ceil(n_u / B) local steps, so one more example at n_u = kB added a whole noise draw,
    # visible in the delta's variance. Now every client makes exactly K noisy steps.
    rt, users = dp_runtime
    setup = rt.setup
    assert [len(setup.plan(u, 1)) for u in users] == [setup.local_steps(u) for u in users] == [K, K]
    deltas, _mask, _loss, steps = rt.cohort.deltas(setup.initial_params(), np.array(users), 1, 2)
    assert steps == 2 * K
    for i in range(2):
        assert abs(_noise_ratio(deltas, i, setup, K) - 1) < 0.02


def test_a_dp_run_weights_clients_uniformly_and_its_replies_carry_no_example_count(dp_runtime, monkeypatch):
    from flwr.app import ConfigRecord, Message, MessageType, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fedpriv.engines.flower.strategy import ARRAYS, CONFIG, METRICS, params_to_record

    rt, users = dp_runtime
    assert rt.setup.weights(np.array(users)).tolist() == [1, 1]  # not [B, B + 1]
    for k in ("_run_id", "_node_id", "_task_id"):  # the identity a Flower process has (messages need it), as in a ClientApp
        monkeypatch.setattr(TaskIdentity, k, 1)
    content = RecordDict({ARRAYS: params_to_record(rt.setup.initial_params()), CONFIG: ConfigRecord({"users": users, "round": 1})})
    metrics = rt.train(Message(content=content, dst_node_id=1, message_type=MessageType.TRAIN)).content[METRICS]
    assert dict(metrics)["weights"] == [1, 1] and set(metrics) == {"users", "weights"}  # no n_u, no unnoised loss or step count


@pytest.mark.slow
def test_an_empty_poisson_step_still_adds_its_noise(tmp_path):
    q, steps_k = 0.05, 4
    cfg = client_dp_config(tmp_path, f"client_dp = {{ clip_norm = {C_SMALL}, noise_multiplier = {SIGMA}, delta = 1e-5, local_steps = {steps_k}, sampling_rate = {q} }}")
    setup = FederatedSetup(prepare(cfg))
    user = int(np.flatnonzero(setup.data.counts <= 4)[0])
    plan = setup.plan(user, 1)
    assert plan.shape[0] == steps_k and (plan < 0).all(axis=1).any()  # some step took no example
    from fedpriv.engines.cohort import CohortUpdate

    deltas, _mask, _loss, steps = CohortUpdate(setup).deltas(setup.initial_params(), np.array([user]), 1, 1)
    assert steps == steps_k and abs(_noise_ratio(deltas, 0, setup, steps_k) - 1) < 0.02


def test_poisson_plan_takes_each_example_with_probability_q():
    plan = dp_plan(40, 500, 0.25, seed=7, round_=3, user=11, batch_size=8)
    taken = np.zeros((500, 40), bool)
    for s, row in enumerate(plan):
        taken[s, row[row >= 0]] = True
        assert len(set(row[row >= 0])) == (row >= 0).sum()  # no example twice in a step
    # 20,000 Bernoulli(0.25) draws: the mean is within 0.012 (4 standard errors)
    assert abs(taken.mean() - 0.25) < 0.012
    assert np.array_equal(plan, dp_plan(40, 500, 0.25, seed=7, round_=3, user=11, batch_size=8))
    assert not np.array_equal(plan, dp_plan(40, 500, 0.25, seed=7, round_=4, user=11, batch_size=8))
    full = dp_plan(5, 2, 1.0, 0, 1, 1, batch_size=8)  # q = 1: every example in every step, a fresh order each
    assert full.shape == (2, 8) and all(sorted(row[row >= 0]) == list(range(5)) for row in full)
    assert dp_plan(12, 3, 1.0, 0, 1, 1, batch_size=8).shape == (3, 12)


def test_record_level_epsilon_with_poisson_steps_is_the_sampled_gaussian_composed():
    s = CohortSampler(30, 5, "fixed", seed=2)
    k = Participation(s).max_after(10)
    rep = RecordLevelPrivacy(ClientDPConfig(clip_norm=1.0, noise_multiplier=1.2, delta=1e-5, local_steps=3, sampling_rate=0.1)).report(k)
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.2)), 3 * k)
    assert rep["client_epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-3)
    assert f"{3 * k} Gaussian steps" in rep["client_guarantee"] and "q = 0.1" in rep["client_guarantee"]


def test_client_dp_refuses_local_epochs_and_a_cap_below_its_steps():
    base = {"rounds": 1, "clients_per_round": 1, "client_dp": {"clip_norm": 1.0, "noise_multiplier": 1.0, "delta": 1e-5, "local_steps": 3}}
    with pytest.raises(ConfigError, match="federated.local_epochs does not apply"):
        validate_config({"name": "x", "federated": {**base, "local_epochs": 2}})
    with pytest.raises(ConfigError, match="federated.max_local_steps = 2 is below client_dp.local_steps = 3"):
        validate_config({"name": "x", "federated": {**base, "max_local_steps": 2}})
    assert validate_config({"name": "x", "federated": {**base, "max_local_steps": 3}}).federated.client_dp.local_steps == 3
