"""One key stream per mechanism (fedpriv/privacy/streams.py): the production key of every
mechanism is its stream's, the streams are disjoint for every index a run can reach, and the
privatize keys no longer replay DP-FedAvg's noise (issue 30, point 5)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedpriv.data.examples import TextExample
from fedpriv.privacy.local.embeddings import EmbeddingSpace
from fedpriv.privacy.streams import AUDIT_CANARY, CLIENT, CORRELATED_NOISE, DP_FEDAVG, INIT, LOCAL_INPUTS, PRIVATIZE, STEP, STREAMS, secret_root, secret_root_from, stream_key

#: The most users, steps/rounds, tokens per user and canaries a run can reach (issue 30).
MAX_USERS, MAX_STEPS = 10**7, 10**7


def data(k: jax.Array) -> tuple[int, ...]:
    return tuple(int(x) for x in np.asarray(jax.random.key_data(k)).reshape(-1))


def test_split_is_fold_in_on_this_jax():
    """The fact the registry rests on: a split of the root is a first-level fold."""
    for seed in (0, 7, 2**31 - 1):
        k = jax.random.key(seed)
        parts = jax.random.split(k, 6)
        assert all(data(parts[i]) == data(jax.random.fold_in(k, i)) for i in range(6))


def test_every_mechanism_draws_from_its_own_stream():
    """The production key functions are the registry's (and the simulation keys did not move:
    init and step are still the two halves of split(key(seed)))."""
    from fedpriv.clients.update import client_key
    from fedpriv.engines.cohort import client_keys
    from fedpriv.memorization.empirical import _key as audit_key
    from fedpriv.privacy.local.corpus import privatize_root
    from fedpriv.strategies.server import NOISE_STREAM
    from fedpriv.training.loop import init_key, step_key_base

    seed, r, u = 3, 5, 11
    root = jax.random.key(seed)
    assert data(init_key(seed)) == data(jax.random.split(root)[0]) == data(stream_key(seed, INIT))
    assert data(step_key_base(seed)) == data(jax.random.split(root)[1]) == data(stream_key(seed, STEP))
    assert data(client_key(seed, r, u)) == data(jax.random.fold_in(jax.random.fold_in(stream_key(seed, CLIENT), r), u))
    assert data(client_keys(seed, r, np.array([u]))[0]) == data(client_key(seed, r, u))
    assert NOISE_STREAM == DP_FEDAVG.id == 0x4015E  # DP-FedAvg's round r key is fold_in(stream_key(seed, DP_FEDAVG), r)
    assert data(audit_key(seed, 4)) == data(jax.random.fold_in(stream_key(seed, AUDIT_CANARY), 4))
    assert data(privatize_root(seed)) == data(stream_key(seed, PRIVATIZE))


def test_correlated_noise_keys_are_their_own_stream():
    """banded MF / BLT draw Z_r from fold_in(stream_key(seed, CORRELATED_NOISE), r), on both sides."""
    from fedpriv.config import FederatedConfig
    from fedpriv.strategies.server import ServerCore

    fed = FederatedConfig(strategy="dp-fedavg", rounds=3, clients_per_round=2, clip_norm=1.0, dp={"mechanism": "banded-mf", "bands": 2, "noise_multiplier": 1.0, "delta": 1e-5})
    core = ServerCore(fed, population=10, seed=3)
    assert data(core.noise_base) == data(stream_key(3, CORRELATED_NOISE)) != data(stream_key(3, DP_FEDAVG))
    import inspect

    from fedpriv.central import dpsgd

    src = inspect.getsource(dpsgd.DPSGDStepper)
    assert "stream_key(self.noise.root, CORRELATED_NOISE)" in src and "fold_in(self.correlated_key, step)" in src


def test_server_noise_key_is_the_dp_fedavg_stream():
    from fedpriv.config import FederatedConfig
    from fedpriv.strategies.server import ServerCore

    core = ServerCore(FederatedConfig(strategy="dp-fedavg", rounds=3, clients_per_round=2, clip_norm=1.0, dp={"noise_multiplier": 1.0, "delta": 1e-5}), population=10, seed=3)
    assert data(core.noise_base) == data(stream_key(3, DP_FEDAVG))


def test_streams_are_disjoint_for_every_reachable_index():
    """Formal part: every key of a stream is ``fold_in(root, id)`` followed by that stream's own
    indices, so the first-level values a mechanism reaches are exactly {its id}, whatever the
    number of users (< 1e7), steps or rounds (< 1e7) or tokens; distinct uint32 ids give distinct
    first-level keys (threefry's fold_in is a permutation of the counter). Empirical part: the
    second-level keys of every stream for the first 2,000 indices (step, round, user) never meet
    across streams, nor meet a first-level key."""
    ids = [s.id for s in STREAMS]
    assert len(set(ids)) == len(ids) and all(0 <= i < 2**32 for i in ids)
    # The ids below 1e7 are the legacy ones a simulation's keys were always drawn from; no
    # mechanism folds a user, step or token into the root itself any more, so these are reached
    # only as stream ids. The privatization stream sits above every index a run can reach.
    assert min(PRIVATIZE.id, LOCAL_INPUTS.id, CORRELATED_NOISE.id) >= max(MAX_USERS, MAX_STEPS)
    root = jax.random.key(0)
    idx = jnp.arange(2000, dtype=jnp.uint32)
    first = {data(stream_key(root, s)) for s in STREAMS}
    assert len(first) == len(STREAMS)
    seen: set[tuple[int, ...]] = set(first)
    for s in STREAMS:
        level2 = jax.random.key_data(jax.vmap(lambda i, k=stream_key(root, s): jax.random.fold_in(k, i))(idx))
        rows = {tuple(int(x) for x in row) for row in np.asarray(level2)}
        assert len(rows) == idx.size and not rows & seen, s.name
        seen |= rows


def test_the_old_privatize_scheme_is_what_this_check_catches():
    """The disjointness check above can fail: privatize's old keys ``fold_in(key(seed), user)``
    reach every first-level value below the number of users, hence every legacy stream id."""
    old_first_level = range(MAX_USERS)
    simulation_streams = [s for s in STREAMS if s not in (PRIVATIZE, LOCAL_INPUTS, CORRELATED_NOISE)]
    assert len(simulation_streams) == 5 and all(s.id in old_first_level for s in simulation_streams)
    assert all(s.id not in old_first_level for s in (PRIVATIZE, LOCAL_INPUTS, CORRELATED_NOISE))


@pytest.mark.slow
def test_privatize_keys_never_replay_dp_fedavg_noise():
    """Issue 30, point 5, reproduced through the production path: user number 262,494
    (= DP-FedAvg's stream id) of a privatized corpus used the keys of DP-FedAvg's round noise
    (token r drew d_chi from the round-r key). Its words must now differ from a privatization with
    those keys."""
    from fedpriv.privacy.local.corpus import privatize_users
    from fedpriv.privacy.local.mechanisms import privatize_streams, privatize_tokens

    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(40)]
    space = EmbeddingSpace([*words, "<oov>"], rng.normal(size=(41, 8)), np.arange(40), 40, source="test")
    text = " ".join(words[i] for i in rng.integers(0, 40, 60))
    seed, target = 0, DP_FEDAVG.id

    def users():
        for i in range(target):
            yield f"e{i}", []  # users before the target hold no words: only its position matters
        yield "target", [TextExample(text)]

    (_u, _exs, new), *_ = [row for row in privatize_users(users(), space, "txt", 0.5, seed=seed, batch_tokens=64) if row[0] == "target"]
    ids = space.ids(text.split())
    # DP-FedAvg's noise of round r is drawn from fold_in(fedavg_noise_base, r); privatize_tokens
    # draws token r from fold_in(key, r): with this key it privatizes with round r's noise key.
    fedavg_noise_base = jax.random.fold_in(jax.random.key(seed), DP_FEDAVG.id)
    with_fedavg_keys = np.asarray(privatize_tokens(fedavg_noise_base, ids, space.index(), 0.5))
    # The old scheme, fold_in(fold_in(key(seed), user), token), was exactly that for this user.
    old_scheme = privatize_streams(jax.random.key(seed), np.full(ids.size, target, np.uint32), np.arange(ids.size, dtype=np.uint32), ids, space.index(), 0.5)
    np.testing.assert_array_equal(np.asarray(old_scheme), with_fedavg_keys)
    got = np.array([space.id(w) for w in new[0]])
    assert np.mean(got != with_fedavg_keys) > 0.5  # eta = 0.5 in 8 dimensions: most tokens move, so two draws differ
    # The new scheme is the privatize stream's, from the same seed.
    new_scheme = privatize_streams(stream_key(seed, PRIVATIZE), np.full(ids.size, target, np.uint32), np.arange(ids.size, dtype=np.uint32), ids, space.index(), 0.5)
    np.testing.assert_array_equal(got, np.asarray(new_scheme))


def test_secret_roots_are_fresh_and_64_bit():
    a, b = secret_root(), secret_root()
    assert data(a) != data(b)
    assert data(secret_root_from(bytes(range(8)))) == (0x03020100, 0x07060504)


def test_the_docstring_examples_run():
    """The ``>>>`` examples of the modules this issue added to (pytest does not collect doctests)."""
    import doctest

    import fedpriv.memorization.empirical as empirical
    import fedpriv.privacy.local.corpus as corpus
    import fedpriv.privacy.streams as streams

    for module in (streams, corpus, empirical):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0 and result.attempted > 0, module.__name__


def test_audit_relations_under_fixed_size_sampling():
    """Audit canaries are added or removed; under fixed-size sampling the accountant's epsilon is
    replace-one, which does not bound them: the audit says so instead of comparing (point 8)."""
    from fedpriv.memorization.empirical import audit_relations

    fixed = audit_relations("user", "fixed")
    assert fixed["relation"] == "add-or-remove-one user" and fixed["accountant_relation"] == "replace-one user"
    assert fixed["accountant_bounds_audit"] is False and "does not bound" in fixed["relation_note"]
    poisson = audit_relations("example", "poisson")
    assert poisson["accountant_bounds_audit"] is True and poisson["relation_note"] is None
    assert audit_relations("user", None)["accountant_relation"] is None
