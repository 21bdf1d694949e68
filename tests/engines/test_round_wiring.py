"""How a federated run reaches its rounds: step i is round i+1, a round trains that round's cohort with that round's
plans, each user gets its own key whatever its place in a group, and the prepared (warm-start) parameters are the start."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from federated_helpers import TINY, leaves_max_diff, write_config


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    from fedpriv.engines.setup import FederatedSetup
    from fedpriv.runner.prepare import prepare

    return FederatedSetup(prepare(write_config(tmp_path_factory.mktemp("cfg"))))


def test_a_groups_keys_are_its_users_keys_whatever_their_position(tiny_setup, monkeypatch):
    """The tiny NWP model takes no randomness, so a key bug does not show in its deltas: check
    the keys the cohort update is handed."""
    from fedpriv.clients.update import client_key
    from fedpriv.engines.cohort import CohortUpdate

    cohort = CohortUpdate(tiny_setup, jax.devices()[:1])
    seen = {}

    def fake(params, batches, step_mask, keys):
        seen["keys"] = keys
        k = step_mask.shape[0]
        return jax.tree_util.tree_map(lambda p: jnp.zeros((k, *p.shape), p.dtype), params), jnp.zeros(k)

    monkeypatch.setattr(cohort, "update", fake)
    users = np.array([7, 3, 0])
    cohort.deltas(tiny_setup.initial_params(), users, 5, 4)
    for i, u in enumerate(users):
        assert np.array_equal(jax.random.key_data(seen["keys"][i]), jax.random.key_data(client_key(tiny_setup.seed, 5, int(u))))


def test_step_i_of_a_federated_run_is_round_i_plus_1(tiny_setup):
    from fedpriv.engines.setup import RoundStepper

    class Engine:
        name = "fake"
        rounds: list[int] = []

        def round(self, round_, state):
            self.rounds.append(round_)
            return state, {}

    e = Engine()
    stepper = RoundStepper(tiny_setup, e)
    stepper.step({}, 0)
    stepper.step({}, 4)
    assert e.rounds == [1, 5]


def test_a_vectorized_round_trains_the_rounds_cohort_with_the_rounds_plans(tiny_setup):
    """engine.round(r) = the sampler's round-r cohort, every user's round-r plan, in one chunk."""
    from fedpriv.engines.cohort import CohortUpdate
    from fedpriv.engines.vectorized import VectorizedEngine

    s = tiny_setup
    r = 3
    state = s.core.init_state(s.initial_params())
    got, _ = VectorizedEngine(s).round(r, state)
    cohort = s.core.sampler.sample(r)
    acc = s.core.accumulator(state)
    deltas, mask, _, _ = CohortUpdate(s, jax.devices()[:1]).deltas(state["params"], cohort, r, len(cohort))
    acc.add(deltas, s.weights(cohort), mask)
    want = s.core.finish_round(state, r, acc)[0]["params"]
    assert leaves_max_diff(got["params"], want) < 1e-6


def test_a_federated_run_starts_from_the_prepared_initial_parameters(tmp_path, monkeypatch):
    """A warm start ([init] from) reaches training through prepared.initial_params: a federated
    run from other parameters ends elsewhere, exactly where one round from them leads."""
    from fedpriv.engines.setup import FederatedSetup
    from fedpriv.engines.vectorized import VectorizedEngine, run_vectorized
    from fedpriv.runner.prepare import prepare

    p = tmp_path / "fed.toml"
    p.write_text(TINY.format(name="fed", chunk=64, extra="", flower="").replace("rounds = 3", "rounds = 1"))
    prepared = prepare(p)
    start = prepared.task.init_params(jax.random.key(12345))
    monkeypatch.setattr(type(prepared), "initial_params", lambda self, seed: start)
    got = run_vectorized(prepared, tmp_path / "run").params
    setup = FederatedSetup(prepared)
    want, _ = VectorizedEngine(setup).round(1, setup.core.init_state(start))
    assert leaves_max_diff(got, want["params"]) == 0.0
