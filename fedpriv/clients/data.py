"""Each user's encoded examples, and the order a client visits them in during a round.

All training users' examples are encoded once (rows in corpus user order, ``counts[u]`` rows for
user ``u``). A client update for user ``u`` in round ``r`` takes ``E`` local epochs; each epoch
is a fresh permutation of the user's rows cut into minibatches of ``B`` (the last one short), so
one round has ``E * ceil(n_u / B)`` local steps (optionally capped). The permutation comes from
``numpy.random.default_rng([seed, r, u])``: the same in every engine and every process.

A plan is an int array ``(steps, B)`` of row positions within the user, ``-1`` marking padding.
Plans of different clients are padded to a common number of steps with all-``-1`` steps, which
the update skips, so clients of different sizes share one compiled shape. A group's examples are
gathered from the flat rows in one NumPy indexing per array (:meth:`ClientData.group_batches`),
with no per-user Python objects beyond the plan; per user the engine keeps only ``counts`` and
``offsets`` (two int64 arrays), so memory beyond the encoded rows is 16 bytes a user.
"""

from __future__ import annotations

import math

import numpy as np

from fedpriv.errors import FedprivError
from fedpriv.tasks.base import Batch

PLAN_STREAM = 0x5EED_C11E  # separates client-order randomness from every other stream of a seed


class ClientData:
    """Encoded rows of every training user; ``rows(u)`` are user ``u``'s."""

    def __init__(self, arrays: Batch, counts: np.ndarray):
        counts = np.asarray(counts, dtype=np.int64)
        if int(counts.sum()) != len(arrays["mask"]):
            raise FedprivError(f"user counts sum to {int(counts.sum())} but there are {len(arrays['mask'])} encoded rows")
        if len(counts) == 0:
            raise FedprivError("no training users")
        self.arrays = arrays
        self.counts = counts
        self.offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])

    @property
    def num_users(self) -> int:
        return len(self.counts)

    def local_steps(self, user: int, local_epochs: int, batch_size: int, max_steps: int | None) -> int:
        return int(self.local_steps_of(np.array([user]), local_epochs, batch_size, max_steps)[0])

    def local_steps_of(self, users: np.ndarray, local_epochs: int, batch_size: int, max_steps: int | None) -> np.ndarray:
        """(k,) local steps of ``users`` in a round: ``E * ceil(n_u / B)``, capped at ``max_steps``."""
        steps = local_epochs * -(-self.counts[np.asarray(users, np.int64)] // batch_size)
        return steps if max_steps is None else np.minimum(steps, max_steps)

    def plan(self, user: int, round_: int, seed: int, local_epochs: int, batch_size: int, max_steps: int | None) -> np.ndarray:
        """(steps, B) row positions within ``user`` (-1 = padding) for round ``round_``."""
        n = int(self.counts[user])
        per_epoch = math.ceil(n / batch_size)
        rng = np.random.default_rng([seed, PLAN_STREAM, round_, user])
        plan = np.full((local_epochs * per_epoch, batch_size), -1, dtype=np.int64)
        for e in range(local_epochs):
            perm = rng.permutation(n)
            block = np.full(per_epoch * batch_size, -1, dtype=np.int64)
            block[:n] = perm
            plan[e * per_epoch : (e + 1) * per_epoch] = block.reshape(per_epoch, batch_size)
        return plan if max_steps is None else plan[:max_steps]

    def batches(self, user: int, plan: np.ndarray, steps: int) -> tuple[Batch, np.ndarray]:
        """The plan's examples as arrays of shape ``(steps, B, ...)`` (plan padded with empty steps
        to ``steps``), and the (steps,) float32 mask of steps that hold at least one example."""
        out, step_mask = self.group_batches(np.array([user]), [plan], steps, 1)
        return {k: v[0] for k, v in out.items()}, step_mask[0]

    def group_batches(self, users: np.ndarray, plans: list[np.ndarray], steps: int, width: int) -> tuple[Batch, np.ndarray]:
        """The plans of ``users`` (one each, B columns) stacked to ``(width, steps, B, ...)``: each
        plan padded with empty steps to ``steps``, the group padded with empty plans to ``width``
        users; and the (width, steps) float32 mask of steps that hold at least one example. One
        gather per array; padding positions read the user's first row and are masked out."""
        k = len(plans)
        if not k <= width:
            raise ValueError(f"a group of {k} users does not fit in width {width}")
        if k != len(users):
            raise ValueError(f"{len(users)} users but {k} plans")
        batch_size = plans[0].shape[1] if k else 1
        pos = np.full((width, steps, batch_size), -1, dtype=np.int64)
        for i, plan in enumerate(plans):
            if len(plan) > steps:
                raise ValueError(f"a plan of {len(plan)} steps does not fit in {steps}")
            pos[i, : len(plan)] = plan
        real = pos >= 0
        first = np.zeros(width, np.int64)
        first[:k] = self.offsets[np.asarray(users, np.int64)]
        rows = np.where(real, first[:, None, None] + pos, first[:, None, None])
        out = {name: v[rows] for name, v in self.arrays.items() if name != "mask"}
        out["mask"] = (self.arrays["mask"][rows] * real).astype(np.float32)
        return out, real.any(axis=2).astype(np.float32)


def next_power_of_two(n: int) -> int:
    """The smallest power of two >= n (n >= 1): padded sizes, so few shapes get compiled."""
    return 1 << max(0, int(n - 1).bit_length())
