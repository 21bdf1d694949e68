"""The vectorized engine: a round's client updates computed in-process by JAX, a chunk at a time.

The cohort is sorted by number of local steps and cut into chunks of ``chunk_size`` clients.
Each chunk is one call of :class:`~fedpriv.engines.cohort.CohortUpdate` (the same call a Flower
ClientApp makes for the users of one message) over arrays of shape (K, S, B, ...): S is the
chunk's longest plan rounded up to a power of two (padded steps are skipped), K is always the
chunk size: ``chunk_size``, or a smaller cohort's size (rounded up to a power of two under
Poisson sampling, where it varies) (missing clients are padded with empty plans and weight 0),
so a run compiles a handful of shapes. The chunk's deltas go straight into the strategy's
accumulator, so memory is bounded by one chunk of deltas, whatever the cohort size. The strategy
math is the one of :mod:`fedpriv.strategies.server`, as in the Flower engine.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from fedpriv.clients.data import next_power_of_two
from fedpriv.engines.cohort import CohortUpdate
from fedpriv.engines.setup import FederatedSetup, train_federated
from fedpriv.training.loop import LoopResult
from fedpriv.training.prepared import Prepared


class VectorizedEngine:
    """Round r's cohort computed in-process, a chunk of users per jitted call."""

    name = "vectorized"

    def __init__(self, setup: FederatedSetup):
        self.setup = setup
        self.cohort = CohortUpdate(setup)
        self.mode = self.cohort.mode
        self.chunk = setup.fcfg.chunk_size

    def chunks(self, cohort: np.ndarray) -> list[tuple[np.ndarray, int]]:
        """The cohort cut into (users, width) chunks of at most ``chunk_size`` clients.

        vmap (padding is computed): users are grouped by their step count rounded up to a power
        of two, so padding at most doubles a client's steps, and a chunk's width is its size
        rounded up to a power of two. scan (padding is skipped): consecutive slices of one width
        (the cohort size under fixed sampling, a power of two under Poisson), so few programs
        get compiled."""
        f = self.setup.fcfg
        if self.mode == "scan":
            n = len(cohort)
            width = min(self.chunk, n if f.sampling == "fixed" else next_power_of_two(max(n, 1)))
            return [(cohort[i : i + width], width) for i in range(0, n, width)]
        steps = np.array([self.setup.local_steps(int(u)) for u in cohort], np.int64)
        buckets = np.array([next_power_of_two(int(x)) for x in steps], np.int64)
        out = []
        for b in np.unique(buckets):
            group = cohort[buckets == b]
            for start in range(0, len(group), self.chunk):
                users = group[start : start + self.chunk]
                out.append((users, min(self.chunk, next_power_of_two(len(users)))))
        return out

    def round(self, round_: int, state: dict) -> tuple[dict, dict]:
        s = self.setup
        cohort = s.core.sampler.sample(round_)
        acc = s.core.accumulator(state)
        if s.canary_clients is not None:  # audit canaries: their directions, then the real users
            cohort, canaries = s.canary_clients.split(cohort)
            s.canary_clients.add(acc, state["params"], canaries)
        loss_sum, steps = 0.0, 0
        for users, width in self.chunks(cohort):
            deltas, mask, ls, st = self.cohort.deltas(state["params"], users, round_, width)
            weights = np.concatenate([s.weights(users), np.zeros(width - len(users), np.int64)])
            acc.add(deltas, weights, mask)
            loss_sum += ls
            steps += st
        state, info = s.core.finish_round(state, round_, acc)
        return state, s.round_info(loss_sum, steps, int(s.data.counts[cohort].sum()), info)


def run_vectorized(
    prepared: Prepared,
    run_dir: str | os.PathLike[str],
    stop_after: int | None = None,
    log: Callable[[str], None] | None = None,
) -> LoopResult:
    setup = FederatedSetup(prepared, log)
    return train_federated(setup, VectorizedEngine(setup), run_dir, stop_after, log)
