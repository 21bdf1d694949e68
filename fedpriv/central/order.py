"""The order in which central training visits records, deterministic by (seed, epoch).

* ``iid``: every epoch, all records shuffled.
* ``noniid``: every epoch, users in a random order, each user's records contiguous and in source
  order (the central regime that sees one person's data in a burst).

Step k uses positions [k*B, (k+1)*B) of epoch k // steps_per_epoch's order; the last batch of an
epoch may be short (the trainer pads it with masked rows). So a run resumed at any step visits
exactly the records an uninterrupted run would.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

Order = Literal["iid", "noniid"]


def epoch_order(counts: np.ndarray, order: Order, seed: int, epoch: int) -> np.ndarray:
    """Record indices (into the flattened records, users in corpus order) for one epoch."""
    counts = np.asarray(counts, dtype=np.int64)
    rng = np.random.default_rng([seed, epoch, 0xC0])
    total = int(counts.sum())
    if order == "iid":
        return rng.permutation(total)
    if order == "noniid":
        offsets = np.concatenate([[0], np.cumsum(counts)])
        users = rng.permutation(len(counts))
        return np.concatenate([np.arange(offsets[u], offsets[u + 1]) for u in users]) if total else np.zeros(0, np.int64)
    raise ValueError(f"order must be 'iid' or 'noniid', got {order!r}")


class BatchSchedule:
    """Which records each step uses (see the module docstring)."""

    def __init__(self, counts: np.ndarray, order: Order, seed: int, batch_size: int):
        self.counts = np.asarray(counts, dtype=np.int64)
        self.order, self.seed, self.batch_size = order, seed, batch_size
        self.num_records = int(self.counts.sum())
        self.steps_per_epoch = math.ceil(self.num_records / batch_size)
        self._epoch = -1
        self._perm = np.zeros(0, np.int64)

    def indices(self, step: int) -> np.ndarray:
        epoch, pos = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._perm = epoch_order(self.counts, self.order, self.seed, epoch)
            self._epoch = epoch
        return self._perm[pos * self.batch_size : (pos + 1) * self.batch_size]
