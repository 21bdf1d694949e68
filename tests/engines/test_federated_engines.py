"""Client updates and the two engines: the same seed and config give the same global model."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
from federated_helpers import DP, DP_ADAPTIVE, SECURE_BLT, leaves_max_diff, write_config

from fedpriv.clients.data import ClientData, next_power_of_two
from fedpriv.clients.update import client_key, make_client_update
from fedpriv.config import load_config
from fedpriv.engines.cohort import CohortUpdate, client_keys
from fedpriv.engines.flower.strategy import check_reply_sum, check_reply_users, params_to_record, record_to_arrays
from fedpriv.engines.setup import FederatedSetup, RoundStepper
from fedpriv.engines.vectorized import VectorizedEngine, run_vectorized
from fedpriv.errors import ConfigError, FedprivError
from fedpriv.runner.dispatch import train_run
from fedpriv.runner.prepare import prepare
import fedpriv.training.noise as noise_module
from fedpriv.training.noise import SECRET_ENV


# ---- client plans and the local update ----------------------------------------------------------
def test_plan_visits_every_example_once_per_epoch():
    data = ClientData({"x": np.arange(20)[:, None], "mask": np.ones(20, np.float32)}, np.array([7, 13]))
    plan = data.plan(1, round_=4, seed=0, local_epochs=3, batch_size=4, max_steps=None)
    assert plan.shape == (3 * math.ceil(13 / 4), 4)
    per_epoch = plan.reshape(3, -1)
    for e in range(3):
        assert sorted(per_epoch[e][per_epoch[e] >= 0].tolist()) == list(range(13))
    assert not np.array_equal(per_epoch[0], per_epoch[1])  # a fresh permutation each epoch
    assert np.array_equal(plan, data.plan(1, 4, 0, 3, 4, None))
    assert not np.array_equal(plan, data.plan(1, 5, 0, 3, 4, None))
    assert len(data.plan(1, 4, 0, 3, 4, max_steps=5)) == 5
    batches, step_mask = data.batches(1, plan[:2], steps=4)
    assert batches["x"].shape == (4, 4, 1) and step_mask.tolist() == [1, 1, 0, 0]
    rows = batches["x"][:2, :, 0][batches["mask"][:2] > 0]
    assert set(rows.tolist()) <= set(range(7, 20))  # user 1's rows only


def test_next_power_of_two():
    assert [next_power_of_two(n) for n in (1, 2, 3, 4, 5, 31, 32, 33)] == [1, 2, 4, 4, 8, 32, 32, 64]


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    path = write_config(tmp_path_factory.mktemp("cfg"))
    return FederatedSetup(prepare(path))


def test_client_update_is_local_sgd_and_padding_steps_are_no_ops(tiny_setup):
    s = tiny_setup
    task, params = s.task, s.initial_params()
    user = int(np.argmax(s.data.counts))
    plan = s.plan(user, 1)
    key = client_key(s.seed, 1, user)
    update = jax.jit(make_client_update(task, 0.5))
    b, m = s.data.batches(user, plan, len(plan))
    delta, loss_sum = update(params, b, m, key)
    # by hand: one SGD step per plan row on the task's mean loss
    p = params
    losses = []
    grad = jax.jit(jax.value_and_grad(task.mean_loss), static_argnums=3)
    for i in range(len(plan)):
        batch = {k: v[i] for k, v in b.items()}
        loss, g = grad(p, batch, jax.random.fold_in(key, i), True)
        p = jax.tree_util.tree_map(lambda a, gg: a - 0.5 * gg, p, g)
        losses.append(float(loss))
    want = jax.tree_util.tree_map(lambda a, c: a - c, p, params)
    assert leaves_max_diff(delta, want) < 1e-6
    assert float(loss_sum) == pytest.approx(sum(losses), rel=1e-5)
    # the same plan padded to twice the steps: identical delta
    b2, m2 = s.data.batches(user, plan, 2 * len(plan))
    delta2, loss2 = update(params, b2, m2, key)
    assert leaves_max_diff(delta, delta2) == 0.0 and float(loss2) == float(loss_sum)


def test_stacked_deltas_in_a_record_round_trip_and_wrong_shapes_are_refused(tiny_setup):
    params = tiny_setup.initial_params()
    stacked = jax.tree_util.tree_map(lambda p: np.stack([np.asarray(p), 2 * np.asarray(p), -np.asarray(p)]), params)
    back = record_to_arrays(params_to_record(stacked), params, 3)
    assert leaves_max_diff(back, stacked) == 0.0
    with pytest.raises(FedprivError, match=r"where \(2, "):
        record_to_arrays(params_to_record(stacked), params, 2)
    with pytest.raises(FedprivError, match="where"):
        record_to_arrays(params_to_record(stacked), params)  # one user's delta expected


def test_a_client_runtime_holds_the_shapes_of_the_initial_params_not_their_values(tiny_setup):
    # A ClientApp process decodes the server's arrays against a template of shapes and dtypes
    # (jax.eval_shape: the model's initialization is traced, never compiled or run there).
    from fedpriv.engines.flower.apps import ClientRuntime

    runtime = ClientRuntime(tiny_setup.config, lambda _cfg, _log: tiny_setup.prepared)
    params = tiny_setup.initial_params()
    assert jax.tree_util.tree_structure(runtime.template) == jax.tree_util.tree_structure(params)
    assert all(isinstance(t, jax.ShapeDtypeStruct) and (t.shape, t.dtype) == (p.shape, p.dtype)
               for t, p in zip(jax.tree_util.tree_leaves(runtime.template), jax.tree_util.tree_leaves(params)))
    stacked = jax.tree_util.tree_map(lambda p: np.stack([np.asarray(p), -np.asarray(p)]), params)
    assert leaves_max_diff(record_to_arrays(params_to_record(stacked), runtime.template, 2), stacked) == 0.0
    acc = runtime.setup.core.make_accumulator(runtime.template, 0.3)
    assert all((a.shape, a.dtype) == (p.shape, p.dtype) and not np.any(a) for a, p in zip(jax.tree_util.tree_leaves(acc.total), jax.tree_util.tree_leaves(params)))


def test_a_reply_adds_at_most_one_delta_per_sampled_user():
    seen: set[int] = set()
    check_reply_users(2, [1, 4], 2, {1, 4, 9}, seen)
    assert seen == {1, 4}
    with pytest.raises(FedprivError, match="not sampled"):
        check_reply_users(2, [9, 12], 2, {1, 4, 9}, set())
    with pytest.raises(FedprivError, match="twice"):
        check_reply_users(2, [4, 9], 2, {1, 4, 9}, seen)
    with pytest.raises(FedprivError, match="one per distinct user"):
        check_reply_users(2, [9, 9], 2, {1, 4, 9}, set())
    with pytest.raises(FedprivError, match="one per distinct user"):
        check_reply_users(2, [9], 2, {1, 4, 9}, set())
    with pytest.raises(FedprivError, match="one per distinct user"):
        check_reply_users(2, [], 0, {1, 4, 9}, set())


def test_a_summed_reply_needs_a_norm_per_user_and_a_clipped_length():
    check_reply_sum(2, [1, 4], [0.1, 3.0], 2 * 0.5, 0.5)  # at the bound K * S
    check_reply_sum(2, [1, 4], [0.1, 3.0], 1e9, math.inf)  # fedavg: no clip, no bound
    with pytest.raises(FedprivError, match="one per user"):
        check_reply_sum(2, [1, 4], [0.1], 0.2, 0.5)
    with pytest.raises(FedprivError, match="did not clip"):
        check_reply_sum(2, [1, 4], [0.1, 3.0], 2 * 0.5 * 1.001, 0.5)
    with pytest.raises(FedprivError, match="did not clip"):
        check_reply_sum(2, [1, 4], [0.1, 3.0], float("nan"), 0.5)


def test_a_group_of_users_gets_each_user_its_own_delta(tiny_setup):
    # What a ClientApp computes for one message of several users, padded to a wider group, is
    # each user's single-user update: grouping never mixes users.
    cohort = CohortUpdate(tiny_setup)
    params = tiny_setup.initial_params()
    users = np.array([3, 0, 7])
    group, mask, loss_sum, steps = cohort.deltas(params, users, 2, 4)
    assert mask.tolist() == [1, 1, 1, 0]
    total_loss, total_steps = 0.0, 0
    for i, u in enumerate(users):
        alone, _, loss, st = cohort.deltas(params, np.array([u]), 2, 1)
        assert leaves_max_diff(jax.tree_util.tree_map(lambda d: d[i], group), jax.tree_util.tree_map(lambda d: d[0], alone)) <= 1e-6
        total_loss, total_steps = total_loss + loss, total_steps + st
    assert steps == total_steps and loss_sum == pytest.approx(total_loss, rel=1e-6)
    assert leaves_max_diff(jax.tree_util.tree_map(lambda d: d[3], group), jax.tree_util.tree_map(np.zeros_like, params)) == 0.0
    with pytest.raises(ValueError, match="does not fit"):
        cohort.deltas(params, users, 2, 2)


def test_batched_client_keys_equal_the_per_client_key():
    users = np.array([0, 5, 17, 260])
    keys = client_keys(9, 4, users)
    for i, u in enumerate(users):
        assert np.array_equal(jax.random.key_data(keys[i]), jax.random.key_data(client_key(9, 4, int(u))))


def test_vmap_chunks_group_clients_of_similar_length(tiny_setup):
    engine = VectorizedEngine(tiny_setup)
    engine.mode = "vmap"
    cohort = np.arange(tiny_setup.data.num_users)
    seen = []
    for users, width in engine.chunks(cohort):
        assert len(users) <= width <= tiny_setup.fcfg.chunk_size
        steps = [tiny_setup.data.local_steps(int(u), 2, 8, None) for u in users]
        assert max(steps) <= 2 * min(steps) or max(steps) <= 2
        seen.extend(users.tolist())
    assert sorted(seen) == cohort.tolist()


# ---- whole runs: chunking, resume, engines -------------------------------------------------------
@pytest.mark.parametrize("extra", ["", DP])
def test_chunk_size_and_vectorize_mode_do_not_change_the_result(tmp_path, extra):
    a = run_vectorized(prepare(write_config(tmp_path, "a", 64, extra + '\nvectorize = "scan"')), tmp_path / "ra")
    b = run_vectorized(prepare(write_config(tmp_path, "b", 2, extra + '\nvectorize = "vmap"')), tmp_path / "rb")
    c = run_vectorized(prepare(write_config(tmp_path, "c", 4, extra + '\nvectorize = "scan"')), tmp_path / "rc")
    assert leaves_max_diff(a.params, b.params) < 1e-5
    assert leaves_max_diff(a.params, c.params) < 1e-5


def test_resumed_run_ends_exactly_like_an_uninterrupted_one(tmp_path):
    cfg = write_config(tmp_path, extra=DP)
    full = run_vectorized(prepare(cfg), tmp_path / "full")
    part = run_vectorized(prepare(cfg), tmp_path / "cut", stop_after=1)
    assert part.done == 1 and (tmp_path / "cut" / "privacy_ledger.json").exists()
    resumed = run_vectorized(prepare(cfg), tmp_path / "cut")
    assert resumed.done == 3
    assert leaves_max_diff(full.params, resumed.params) == 0.0
    full_lines = (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()
    cut_lines = (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
    strip = lambda ls: [{k: v for k, v in json.loads(x).items() if k != "round_seconds"} for x in ls]  # noqa: E731 (wall time differs)
    assert strip(full_lines) == strip(cut_lines)


def test_dp_run_reports_epsilon_with_its_guarantee_every_round(tmp_path):
    res = run_vectorized(prepare(write_config(tmp_path, extra=DP)), tmp_path / "r")
    rows = [r for r in res.history if r["split"] == "train"]
    assert [r["round"] for r in rows] == [1, 2, 3]
    eps = [r["epsilon"] for r in rows]
    assert eps == sorted(eps) and eps[0] > 0
    assert all("user-level" in r["guarantee"] and "without replacement" in r["guarantee"] for r in rows)
    assert all(r["clients"] == 6 and r["clip_norm"] == pytest.approx(0.3) for r in rows)
    # only noised or public statistics (issue 30): no unnoised loss, example counts, delta norms, exact unclipped fraction
    private = ("loss", "local_steps", "examples", "mean_delta_norm", "unclipped_fraction")
    assert all(not set(private) & set(r) and r["noised_update_norm"] > 0 for r in rows)
    assert all("the vocabulary of the 300 most frequent training words is not private" in r["guarantee"] for r in rows)
    setup = FederatedSetup(prepare(load_config(write_config(tmp_path, extra=DP))))
    line = RoundStepper(setup, VectorizedEngine(setup)).describe(3, rows[-1], [], 1.0, 3)
    assert f"epsilon {rows[-1]['epsilon']:.3g} (delta 0.001; user-level, replace-one, 6 of 261 without replacement)" in line


def test_log_private_stats_puts_them_back_and_says_so(tmp_path):
    p = write_config(tmp_path, extra=DP)
    p.write_text(p.read_text().replace("eval_batch_size = 256", "eval_batch_size = 256\nlog_private_stats = true"))
    setup = FederatedSetup(prepare(load_config(p)))
    row = setup.round_info(6.0, 3, 40, {"clients": 5, "mean_delta_norm": 0.2, "unclipped_fraction": 0.5, "clip_norm": 0.3})
    assert (row["loss"], row["examples"], row["clients"], row["unclipped_fraction"]) == (2.0, 40, 5, 0.5)
    setup.core.budget.record()
    assert "private statistics logged (--log-private-stats)" in setup.privacy_report(1)["guarantee"]


def test_federated_run_needs_a_federated_section(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('name = "x"\n[task]\nkind = "nwp"\n')
    with pytest.raises(ConfigError, match="no \\[federated\\] section"):
        train_run(prepare(load_config(p)), tmp_path / "r", kind="federated")


def test_record_level_privacy_section_is_refused_for_federated_runs(tmp_path):
    p = write_config(tmp_path, extra="")
    p.write_text(p.read_text() + "\n[privacy]\nclip_norm = 1.0\nnoise_multiplier = 1.0\ndelta = 1e-5\n")
    with pytest.raises(ConfigError, match="central training"):
        FederatedSetup(prepare(load_config(p)))


ONE_ACTOR = "\nclient_num_cpus = 2"  # [federated.flower]: one Ray actor on a 2-core machine


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    ["", SECURE_BLT + "|" + ONE_ACTOR, DP + "|users_per_message = 4" + ONE_ACTOR, DP_ADAPTIVE + "|users_per_message = 4\nsum_on_client = true" + ONE_ACTOR,
     "|users_per_message = 4\nsum_on_client = true" + ONE_ACTOR],
    # 6 users: groups of 4 and 2 (padded); adaptive clipping moves S by the norms the ClientApps report;
    # BLT's correlated noise drawn from a secret (secure_noise) on the cyclic groups, one user per message.
    # fedavg runs one ClientApp actor per CPU (several processes answer one round); the others one
    # actor (each actor imports JAX, prepares the data and traces the client update: seconds each)
    ids=["fedavg", "secure-blt-dp-fedavg", "dp-fedavg-4-users-per-message", "dp-fedavg-adaptive-summed-on-client", "fedavg-summed-on-client"],
)
def test_flower_engine_matches_the_vectorized_engine(tmp_path, extra, flower_on_shared_ray, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "00112233445566778899aabbccddeeff")  # read by secure_noise only,
    monkeypatch.setattr(noise_module, "fresh_nonce", lambda: bytes(16))  # with one nonce for both engines' runs (each start draws its own)
    federated, _, flower = extra.partition("|")
    prepared = prepare(load_config(write_config(tmp_path, extra=federated, flower=flower)))
    vec = train_run(prepared, tmp_path / "vec", engine="vectorized")
    mine = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the command's handler (fedpriv.cli._on_sigterm) stands in here

    def handler(*_a):
        pass

    signal.signal(signal.SIGTERM, handler)
    try:
        flw = train_run(prepared, tmp_path / "flw", engine="flower")
    finally:
        after = signal.signal(signal.SIGTERM, mine)
    assert after is handler  # ray.init's sys.exit(15) handler does not outlive the simulation
    assert flw.done == vec.done == 3
    assert leaves_max_diff(vec.params, flw.params) <= 1e-5
    assert flw.final_eval["perplexity"] == pytest.approx(vec.final_eval["perplexity"], rel=1e-4)


@pytest.mark.slow
def test_cli_train_federated_prints_rounds_and_a_json_summary(tmp_path, capsys):
    cfg = write_config(tmp_path, extra=DP)
    proc = subprocess.run(
        [sys.executable, "-m", "fedpriv.cli", "train", "federated", str(cfg), "--out", str(tmp_path / "r"), "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert summary["rounds"] == 3 and summary["engine"] == "vectorized" and summary["strategy"] == "dp-fedavg"
    assert summary["epsilon"] > 0 and "user-level" in summary["guarantee"]
    assert "final_perplexity" in summary
    from fedpriv.cli import main

    assert main(["train", "federated", str(cfg), "--engine", "nope"]) == 2  # (the refusal in process: a second interpreter and JAX import cost seconds)
    assert "unknown engine" in capsys.readouterr().err
