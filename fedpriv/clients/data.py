"""Each user's encoded examples, and the order a client visits them in during a round.

All training users' examples are encoded once (rows in corpus user order, ``counts[u]`` rows for
user ``u``). A client update for user ``u`` in round ``r`` takes ``E`` local epochs; each epoch
is a fresh permutation of the user's rows cut into minibatches of ``B`` (the last one short), so
one round has ``E * ceil(n_u / B)`` local steps (optionally capped). The permutation comes from
``numpy.random.default_rng([seed, r, u])``: the same in every engine and every process.

A plan is an int array ``(steps, B)`` of row positions within the user, ``-1`` marking padding.
Plans of different clients are padded to a common number of steps with all-``-1`` steps, which
the update skips, so clients of different sizes share one compiled shape.
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
        steps = local_epochs * math.ceil(int(self.counts[user]) / batch_size)
        return steps if max_steps is None else min(steps, max_steps)

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
        if len(plan) > steps:
            raise ValueError(f"a plan of {len(plan)} steps does not fit in {steps}")
        full = np.full((steps, plan.shape[1]), -1, dtype=np.int64)
        full[: len(plan)] = plan
        real = full >= 0
        rows = np.where(real, self.offsets[user] + full, self.offsets[user])
        out = {k: v[rows] for k, v in self.arrays.items() if k != "mask"}
        out["mask"] = (self.arrays["mask"][rows] * real).astype(np.float32)
        return out, real.any(axis=1).astype(np.float32)


def next_power_of_two(n: int) -> int:
    """The smallest power of two >= n (n >= 1): padded sizes, so few shapes get compiled."""
    return 1 << max(0, int(n - 1).bit_length())
