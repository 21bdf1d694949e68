"""The vectorized engine: a round's client updates computed in-process by JAX, a chunk at a time.

The cohort is sorted by number of local steps and cut into chunks of ``chunk_size`` clients.
Each chunk is one call of ``jit(vmap(client_update))`` over arrays of shape (K, S, B, ...): S is
the chunk's longest plan rounded up to a power of two (padded steps are skipped), K is always
the chunk size: ``chunk_size``, or a smaller cohort's size (rounded up to a power of two under
Poisson sampling, where it varies) (missing clients are padded with empty plans and weight 0), so a run compiles a handful of
shapes. The chunk's deltas go straight into the strategy's accumulator, so memory is
bounded by one chunk of deltas, whatever the cohort size. The strategy math is the one of
:mod:`fedpriv.strategies.core`, as in the Flower engine.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.clients.data import next_power_of_two
from fedpriv.clients.update import CLIENT_STREAM, make_cohort_update
from fedpriv.engines.rounds import FederatedResult, FederatedSetup, client_loss_info, run_rounds
from fedpriv.pipeline import Prepared
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


class VectorizedEngine:
    def __init__(self, setup: FederatedSetup):
        self.setup = setup
        self.mode = vectorize_mode(setup.fcfg.vectorize)
        self.update = make_cohort_update(setup.task, setup.fcfg.client_learning_rate, setup.client_dp, self.mode)
        self.chunk = setup.fcfg.chunk_size

    def client_deltas(self, params: Params, users: np.ndarray, round_: int, width: int) -> tuple[Params, np.ndarray, float, int]:
        """Deltas of ``users`` (at most ``width``), padded to ``width`` clients.
        Returns (stacked deltas, (width,) real-client mask, loss sum, real local steps)."""
        s = self.setup
        plans = [s.plan(int(u), round_) for u in users]
        steps = next_power_of_two(max(len(p) for p in plans))
        pad = width - len(users)
        parts = [s.data.batches(int(u), p, steps) for u, p in zip(users, plans)]
        empty = s.data.batches(0, np.full((0, s.fcfg.local_batch_size), -1, np.int64), steps)
        parts += [empty] * pad
        batches = {k: np.stack([b[k] for b, _ in parts]) for k in parts[0][0]}
        step_mask = np.stack([m for _, m in parts])
        keys = client_keys(s.seed, round_, np.concatenate([users, np.zeros(pad, np.int64)]))
        deltas, loss_sums = self.update(params, batches, step_mask, keys)
        mask = np.concatenate([np.ones(len(users), np.float32), np.zeros(pad, np.float32)])
        return deltas, mask, float(np.sum(np.asarray(loss_sums)[: len(users)])), int(sum(len(p) for p in plans))

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
        steps = np.array([self.setup.data.local_steps(int(u), f.local_epochs, f.local_batch_size, f.max_local_steps) for u in cohort], np.int64)
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
        counts = s.data.counts
        loss_sum, steps = 0.0, 0
        for users, width in self.chunks(cohort):
            deltas, mask, ls, st = self.client_deltas(state["params"], users, round_, width)
            examples = np.concatenate([counts[users], np.zeros(width - len(users), np.int64)])
            acc.add(deltas, examples, mask)
            loss_sum += ls
            steps += st
        state, info = s.core.finish_round(state, round_, acc)
        return state, {**client_loss_info(loss_sum, steps, int(counts[cohort].sum())), **info}


def run_vectorized(
    prepared: Prepared,
    run_dir: str | os.PathLike[str],
    stop_after: int | None = None,
    log: Callable[[str], None] | None = None,
) -> FederatedResult:
    setup = FederatedSetup(prepared, log)
    engine = VectorizedEngine(setup)
    return run_rounds(setup, run_dir, engine.round, "vectorized", stop_after, log)
