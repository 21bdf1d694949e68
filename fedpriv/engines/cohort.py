"""The deltas of a group of users in one jitted call: what the vectorized engine runs per chunk
and a Flower ClientApp runs per message.

Each user's plan (:meth:`~fedpriv.engines.setup.FederatedSetup.plan`) is padded to the group's
longest plan rounded up to a power of two; the group is padded with empty plans to ``width``
users (weight 0), so a run compiles a handful of shapes. The update is
:func:`fedpriv.clients.update.make_cohort_update`: ``scan`` (one user after another, padding
skipped: CPUs) or ``vmap`` (all at once: accelerators); ``auto`` picks by backend. Every user's
key is ``client_key(seed, round, user)``, so a user's delta does not depend on which group, or
which engine, computed it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.clients.data import next_power_of_two
from fedpriv.clients.update import CLIENT_STREAM, make_cohort_update
from fedpriv.engines.setup import FederatedSetup
from fedpriv.tasks.base import Params


def client_keys(seed: int, round_: int, users: np.ndarray) -> jax.Array:
    """``client_key(seed, round_, u)`` for every u of ``users``, as one batched key array."""
    base = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), CLIENT_STREAM), round_)
    return jax.vmap(lambda u: jax.random.fold_in(base, u))(jnp.asarray(users, jnp.uint32))


def vectorize_mode(setting: str) -> str:
    """``auto``: scan on CPU (batching clients gains nothing there and padding costs in full),
    vmap on accelerators."""
    if setting != "auto":
        return setting
    return "scan" if jax.default_backend() == "cpu" else "vmap"


class CohortUpdate:
    """The jitted update of a group of users of one experiment."""

    def __init__(self, setup: FederatedSetup):
        self.setup = setup
        self.mode = vectorize_mode(setup.fcfg.vectorize)
        self.update = make_cohort_update(setup.task, setup.fcfg.client_learning_rate, setup.client_dp, self.mode)

    def deltas(self, params: Params, users: np.ndarray, round_: int, width: int) -> tuple[Params, np.ndarray, float, int]:
        """Deltas of ``users`` (at most ``width``), padded to ``width`` users.
        Returns (stacked deltas, (width,) real-user mask, sum of the users' loss sums, real local steps)."""
        s = self.setup
        users = np.asarray(users, np.int64)
        if not 0 < len(users) <= width:
            raise ValueError(f"a group of {len(users)} users does not fit in width {width}")
        plans = [s.plan(int(u), round_) for u in users]
        steps = next_power_of_two(max(len(p) for p in plans))
        pad = width - len(users)
        cols = max(p.shape[1] for p in plans)
        if s.client_dp is not None:  # client-side DP-SGD's steps vary in size (Poisson: rounded up to a power of two); every planned step is live
            cols = next_power_of_two(cols) if s.client_dp_sampling_rate < 1.0 else cols
            plans = [np.pad(p, ((0, 0), (0, cols - p.shape[1])), constant_values=-1) for p in plans]
        parts = [s.data.batches(int(u), p, steps) for u, p in zip(users, plans)]
        if s.client_dp is not None:  # a step that took no example still adds its noise
            parts = [(b, (np.arange(steps) < len(p)).astype(np.float32)) for (b, _), p in zip(parts, plans)]
        empty = s.data.batches(0, np.full((0, cols), -1, np.int64), steps)
        parts += [empty] * pad
        batches = {k: np.stack([b[k] for b, _ in parts]) for k in parts[0][0]}
        step_mask = np.stack([m for _, m in parts])
        keys = client_keys(s.seed, round_, np.concatenate([users, np.zeros(pad, np.int64)]))
        deltas, loss_sums = self.update(params, batches, step_mask, keys)
        mask = np.concatenate([np.ones(len(users), np.float32), np.zeros(pad, np.float32)])
        return deltas, mask, float(np.sum(np.asarray(loss_sums)[: len(users)])), int(sum(len(p) for p in plans))
