"""Large cohorts in the vectorized engine: bucketed chunks give the one-chunk result, small
clients are padded only to their bucket, chunk_size = "auto", and the cohort split over several
devices gives the single-device result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from federated_helpers import DP, TINY, leaves_max_diff, write_config

from fedpriv.clients.data import ClientData, next_power_of_two
from fedpriv.config import load_config
from fedpriv.engines.cohort import CohortUpdate, ShardedUpdate
from fedpriv.engines.setup import FederatedSetup
from fedpriv.engines.vectorized import VectorizedEngine, auto_chunk_size
from fedpriv.errors import ConfigError
from fedpriv.runner.prepare import prepare

ROOT = Path(__file__).resolve().parents[2]


#: The tiny experiment with clients of 1 to 16 local steps (up to 64 examples, batches of 4).
MIXED = TINY.replace("max_examples_per_user = 16", "max_examples_per_user = 64").replace("local_epochs = 2", "local_epochs = 1").replace("local_batch_size = 8", "local_batch_size = 4")


@pytest.fixture(scope="module", params=["fedavg", "dp-fedavg"])
def setup(request, tmp_path_factory):
    extra = DP if request.param == "dp-fedavg" else ""
    path = tmp_path_factory.mktemp("cfg") / "fed.toml"
    path.write_text(MIXED.format(name="fed", chunk=64, extra=extra + '\nvectorize = "scan"', flower=""))
    return FederatedSetup(prepare(path))


def mixed_cohort(s: FederatedSetup, size: int = 8) -> np.ndarray:
    """``size`` users spread over the range of client sizes (sorted user indices)."""
    order = np.argsort(s.data.counts, kind="stable")
    return np.sort(order[np.linspace(0, len(order) - 1, size).astype(int)])


def one_chunk_round(s: FederatedSetup, cohort: np.ndarray, round_: int):
    """The unbucketed computation: the whole cohort in one call, every plan padded to the
    cohort's largest (what the engine did for a chunk before buckets)."""
    state = s.core.init_state(s.initial_params())
    acc = s.core.accumulator(state)
    deltas, mask, _, _ = CohortUpdate(s, jax.devices()[:1]).deltas(state["params"], cohort, round_, len(cohort))
    acc.add(deltas, s.data.counts[cohort], mask)
    return s.core.finish_round(state, round_, acc)[0]["params"]


@pytest.mark.slow
def test_bucketed_chunks_equal_one_chunk(setup):
    s = setup
    mode = "scan" if s.fcfg.strategy == "fedavg" else "vmap"
    cohort = mixed_cohort(s)  # a cohort four times the chunk, clients of 1 to 16 steps
    want = one_chunk_round(s, cohort, 2)
    engine = VectorizedEngine(s)
    engine.cohort = CohortUpdate(s, jax.devices()[:1], mode)
    engine.mode, engine.chunk = mode, 2
    state = s.core.init_state(s.initial_params())
    acc = s.core.accumulator(state)
    chunks = engine.chunks(cohort)
    assert len(chunks) >= 4 and all(len(u) <= 2 for u, _ in chunks)
    engine.add_cohort(acc, state["params"], cohort, 2)
    got = s.core.finish_round(state, 2, acc)[0]["params"]
    assert leaves_max_diff(got, want) < 1e-5
    assert leaves_max_diff(got, state["params"]) > 1e-4  # the round moved the model


def test_a_small_client_is_padded_to_its_bucket_not_to_the_cohort(setup):
    s = setup
    f = s.fcfg
    engine = VectorizedEngine(s)
    cohort = mixed_cohort(s)
    steps = s.data.local_steps_of(cohort, f.local_epochs, f.local_batch_size, f.max_local_steps)
    assert steps.min() == 1 and steps.max() >= 8  # the population mixes small and large clients
    for mode in ("scan", "vmap"):
        engine.mode = mode
        seen = []
        for users, width in engine.chunks(cohort):
            bound = {next_power_of_two(int(x)) for x in s.data.local_steps_of(users, f.local_epochs, f.local_batch_size, None)}
            assert len(bound) == 1  # one bucket per chunk: plans padded at most to twice their steps
            plans = [s.plan(int(u), 1) for u in users]
            batches, step_mask = s.data.group_batches(users, plans, bound.pop(), width)
            assert step_mask.shape[1] < 2 * max(len(p) for p in plans) + 1
            assert step_mask.sum() == sum(len(p) for p in plans)
            seen += users.tolist()
        assert sorted(seen) == cohort.tolist()


def test_group_batches_equal_each_users_batches():
    data = ClientData({"x": np.arange(30)[:, None] * 10, "mask": np.ones(30, np.float32)}, np.array([2, 11, 17]))
    users = np.array([2, 0])
    plans = [data.plan(int(u), 3, 0, 2, 4, None) for u in users]
    group, step_mask = data.group_batches(users, plans, 16, 3)
    assert group["x"].shape == (3, 16, 4, 1) and step_mask.shape == (3, 16)
    for i, (u, p) in enumerate(zip(users, plans)):
        alone, m = data.batches(int(u), p, 16)
        assert np.array_equal(group["x"][i], alone["x"]) and np.array_equal(group["mask"][i], alone["mask"]) and np.array_equal(step_mask[i], m)
    assert group["mask"][2].sum() == 0 and step_mask[2].sum() == 0  # the padded client holds nothing
    assert np.array_equal(data.local_steps_of(np.array([0, 1, 2]), 2, 4, None), [2, 6, 10])
    assert np.array_equal(data.local_steps_of(np.array([0, 1, 2]), 2, 4, 5), [2, 5, 5])
    with pytest.raises(ValueError, match="does not fit"):
        data.group_batches(users, plans, 16, 1)


def test_auto_chunk_size_is_the_widest_power_of_two_under_the_budget():
    params = {"w": np.zeros((1000,), np.float32)}  # 12,000 bytes per client for delta, model, gradient
    assert auto_chunk_size(params, row_bytes=100, max_steps=2, batch_size=10, budget_bytes=14_000 * 8) == 8
    assert auto_chunk_size(params, 100, 2, 10, budget_bytes=14_000 * 8 - 1) == 4
    assert auto_chunk_size(params, 100, 2, 10, budget_bytes=10) == 1
    assert auto_chunk_size(params, 100, 2, 10, budget_bytes=10**15) == 4096


def test_chunk_size_takes_a_positive_count_or_auto(tmp_path):
    assert load_config(write_config(tmp_path, chunk='"auto"')).federated.chunk_size == "auto"
    for bad in ("0", '"big"'):
        with pytest.raises(ConfigError, match="chunk_size"):
            load_config(write_config(tmp_path, chunk=bad))


def test_auto_chunk_size_runs(setup):
    saved = setup.fcfg
    setup.fcfg = saved.model_copy(update={"chunk_size": "auto"})
    try:
        chunk = VectorizedEngine(setup).chunk
    finally:
        setup.fcfg = saved
    assert chunk >= 1 and chunk & (chunk - 1) == 0


@pytest.mark.slow
def test_a_group_split_over_devices_equals_the_single_device_update(setup):
    devices = jax.devices()
    if len(devices) < 4:
        pytest.skip("needs several (forced host) devices: tests/conftest.py sets 8")
    cohort = np.arange(8)
    params = setup.initial_params()
    one, mask1, loss1, _ = CohortUpdate(setup, devices[:1]).deltas(params, cohort, 1, 8)
    split = CohortUpdate(setup, devices[:4])
    assert split.update.mesh_size(8) == 4 and split.update.mesh_size(6) == 2 and split.update.mesh_size(3) == 1
    many, mask4, loss4, _ = split.deltas(params, cohort, 1, 8)
    assert leaves_max_diff(one, many) < 1e-6 and np.array_equal(mask1, mask4) and loss1 == pytest.approx(loss4, rel=1e-6)
    assert all(leaf.devices() == {devices[0]} for leaf in jax.tree_util.tree_leaves(many))  # gathered for the accumulator


SUBPROCESS = """
import json, sys
import jax, numpy as np
sys.path.insert(0, 'tests')
from federated_helpers import leaves_max_diff
from fedpriv.engines.cohort import CohortUpdate
from fedpriv.engines.setup import FederatedSetup
from fedpriv.engines.vectorized import VectorizedEngine
from fedpriv.runner.prepare import prepare

s = FederatedSetup(prepare(sys.argv[1]))
cohort = np.arange(8)
out = {"devices": len(jax.devices())}
params = {}
for name, devices in (("one", jax.devices()[:1]), ("all", jax.devices())):
    engine = VectorizedEngine(s)
    engine.cohort = CohortUpdate(s, list(devices))
    engine.chunk = 8
    state = s.core.init_state(s.initial_params())
    acc = s.core.accumulator(state)
    engine.add_cohort(acc, state["params"], cohort, 1)
    params[name] = s.core.finish_round(state, 1, acc)[0]["params"]
out["max_diff"] = leaves_max_diff(params["one"], params["all"])
print(json.dumps(out))
"""


@pytest.mark.slow
def test_forced_host_devices_give_the_single_device_result_in_a_fresh_process(tmp_path):
    cfg = write_config(tmp_path, extra=DP + '\nvectorize = "scan"')
    kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]  # the suite's other flags (conftest)
    env = {**os.environ, "XLA_FLAGS": " ".join([*kept, "--xla_force_host_platform_device_count=4"]), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", SUBPROCESS, str(cfg)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == 4
    assert out["max_diff"] < 1e-5
