"""The vectorized engine: a round's client updates computed in-process by JAX, a chunk at a time.

The cohort's users are grouped into buckets by their number of local steps rounded up to a power
of two, and each bucket is cut into chunks of at most ``chunk_size`` clients. Each chunk is one
call of :class:`~fedpriv.engines.cohort.CohortUpdate` (the same call a Flower ClientApp makes for
the users of one message) over arrays of shape (K, S, B, ...): S is the bucket's bound (so a
client's plan is padded at most to twice its steps, never to the cohort's largest client: a user
with one short example costs one step, whatever else was sampled), K the chunk's width (vmap:
the chunk's size rounded up to a power of two; scan: the cohort size under fixed sampling, a
power of two under Poisson, at most ``chunk_size``; padded clients have empty plans and weight
0), so a run compiles a handful of shapes. The chunk's deltas go straight into the strategy's
accumulator, so memory is bounded by one chunk of deltas and inputs, whatever the cohort size.
Bucketing and chunking change only the order in which the deltas are added (results equal to
float rounding). ``chunk_size = "auto"``: the widest power of two whose chunk fits
:data:`AUTO_CHUNK_FRACTION` of the device's memory (:func:`auto_chunk_size`). The strategy math
is the one of :mod:`fedpriv.strategies.server`, as in the Flower engine.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import jax
import numpy as np

from fedpriv.clients.data import next_power_of_two
from fedpriv.engines.cohort import CohortUpdate
from fedpriv.engines.setup import FederatedSetup, train_federated
from fedpriv.rundir import RunDir
from fedpriv.training.loop import LoopResult
from fedpriv.strategies.aggregators import DeltaAccumulator
from fedpriv.tasks.base import Params
from fedpriv.training.prepared import Prepared

#: ``chunk_size = "auto"``: one chunk's deltas, local models, gradients and inputs stay under
#: this fraction of the device's memory (an accelerator's ``bytes_limit``, or the host's RAM).
AUTO_CHUNK_FRACTION = 1 / 16
#: ``chunk_size = "auto"`` never exceeds this many clients per chunk.
AUTO_CHUNK_MAX = 4096


def device_memory_bytes(device: jax.Device | None = None) -> int:
    """Memory of ``device`` (default: the first of the default backend): an accelerator's
    ``bytes_limit``, else the host's physical memory."""
    device = device or jax.devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def auto_chunk_size(params: Params, row_bytes: int, max_steps: int, batch_size: int, budget_bytes: int) -> int:
    """The largest power of two K <= :data:`AUTO_CHUNK_MAX` with K clients' (delta, local model
    and gradient: 3 x the float32 parameters, plus ``max_steps * batch_size`` input rows of
    ``row_bytes``) under ``budget_bytes``; at least 1. Activations come on top of this bound
    (under vmap they grow with K too; under scan, one client's at a time)."""
    per_client = 3 * 4 * sum(int(x.size) for x in jax.tree_util.tree_leaves(params)) + max_steps * batch_size * row_bytes
    k = max(1, budget_bytes // max(per_client, 1))
    return min(AUTO_CHUNK_MAX, 1 << (int(k).bit_length() - 1))


class VectorizedEngine:
    """Round r's cohort computed in-process, a chunk of users per jitted call."""

    name = "vectorized"

    def __init__(self, setup: FederatedSetup):
        self.setup = setup
        self.cohort = CohortUpdate(setup)
        self.mode = self.cohort.mode
        self.chunk = self.chunk_size()

    def chunk_size(self) -> int:
        """Clients per chunk: ``federated.chunk_size``, or the ``"auto"`` bound (module docstring)."""
        f, data = self.setup.fcfg, self.setup.data
        if f.chunk_size != "auto":
            return int(f.chunk_size)
        row_bytes = sum(v[:1].nbytes for v in data.arrays.values())
        longest = int(self.setup.local_steps_of(np.array([int(np.argmax(data.counts))]))[0])
        params = jax.eval_shape(self.setup.initial_params)
        budget = int(device_memory_bytes() * AUTO_CHUNK_FRACTION)
        return auto_chunk_size(params, row_bytes, next_power_of_two(longest), f.local_batch_size, budget)

    def chunks(self, cohort: np.ndarray) -> list[tuple[np.ndarray, int]]:
        """The cohort cut into (users, width) chunks of at most ``chunk_size`` clients, users
        grouped into buckets by their step count rounded up to a power of two, so a client's
        plan is padded at most to twice its steps.

        vmap (padding is computed): a chunk's width is its size rounded up to a power of two.
        scan (padded clients are skipped at run time): every chunk has one width (the cohort
        size under fixed sampling, a power of two under Poisson and cyclic Poisson), so one program is compiled
        per bucket."""
        f = self.setup.fcfg
        cohort = np.asarray(cohort, np.int64)
        steps = self.setup.local_steps_of(cohort)
        buckets = np.array([next_power_of_two(int(x)) for x in np.maximum(steps, 1)], np.int64)
        n = len(cohort)
        scan_width = min(self.chunk, n if f.sampling not in ("poisson", "cyclic-poisson") else next_power_of_two(max(n, 1)))
        out = []
        for b in np.unique(buckets):
            group = cohort[buckets == b]
            for start in range(0, len(group), self.chunk):
                users = group[start : start + self.chunk]
                out.append((users, scan_width if self.mode == "scan" else min(self.chunk, next_power_of_two(len(users)))))
        return out

    def round(self, round_: int, state: dict) -> tuple[dict, dict]:
        s = self.setup
        cohort = s.core.sampler.sample(round_)
        acc = s.core.accumulator(state)
        if s.canary_clients is not None:  # audit canaries: their directions, then the real users
            cohort, canaries = s.canary_clients.split(cohort)
            s.canary_clients.add(acc, state["params"], canaries)
        loss_sum, steps = self.add_cohort(acc, state["params"], cohort, round_)
        state, info = s.core.finish_round(state, round_, acc)
        return state, s.round_info(loss_sum, steps, int(s.data.counts[cohort].sum()), info)

    def add_cohort(self, acc: DeltaAccumulator, params: Params, cohort: np.ndarray, round_: int) -> tuple[float, int]:
        """Add the deltas of ``cohort`` (real users) to ``acc``, a chunk at a time.
        Returns (sum of the users' local loss sums, real local steps)."""
        loss_sum, steps = 0.0, 0
        for users, width in self.chunks(cohort):
            deltas, mask, ls, st = self.cohort.deltas(params, users, round_, width)
            weights = np.concatenate([self.setup.weights(users), np.zeros(width - len(users), np.int64)])
            acc.add(deltas, weights, mask)
            loss_sum += ls
            steps += st
        return loss_sum, steps


def run_vectorized(
    prepared: Prepared,
    run_dir: str | os.PathLike[str],
    stop_after: int | None = None,
    log: Callable[[str], None] | None = None,
) -> LoopResult:
    RunDir(run_dir).create()  # before the setup, which may store an optimized strategy there
    setup = FederatedSetup(prepared, log, run_dir)
    return train_federated(setup, VectorizedEngine(setup), run_dir, stop_after, log)
