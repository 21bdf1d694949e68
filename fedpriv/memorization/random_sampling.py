"""Random Sampling (Thakkar et al. 2021): is the canary the most likely of N random suffixes?

Given the canary's first ``prefix`` words, the canary's remaining words and N random suffixes of
the same length (drawn like the canary words, never equal to the canary's suffix) are scored by
log-perplexity, -sum log P(suffix word | bos, prefix, earlier suffix words) in nats. The canary is
memorized when it scores strictly lowest; its rank is 1 + the number of random suffixes scoring
at or below it. A tie does not put the canary ahead: a model that scores every suffix alike ranks
it last (exposure 0), not first.

Speed: the prefix is run once. Suffixes are scored level by level over their prefix tree: the
state after the suffix's first j words is computed once per distinct j-word start (at most V for
j = 1) and shared by every candidate with that start, so a candidate costs about one LSTM step
plus one output layer (its last word). Batches have a fixed size, and the tables of distinct
starts keep whole batches (their row count is a multiple of ``batch``), so shapes compile once
per table size and a row's score does not depend on which other rows are scored with it (with
a one-row table XLA compiled a different program and the last bit could differ).
This is the reference: :mod:`fedpriv.memorization.rs_fast` gives the same ranks with less work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.errors import FedprivError
from fedpriv.memorization.lm import NWPStepper, advance, next_log_probs

RS_STREAM = 0x5A3D


@dataclass(frozen=True)
class RandomSamplingResult:
    rank: int  # 1 = the canary scores lowest
    candidates: int  # random suffixes scored (the canary not counted)
    canary_log_perplexity: float  # nats
    at_or_below: int  # random suffixes whose log-perplexity is at most the canary's (ties count against it; = rank - 1)

    @property
    def memorized(self) -> bool:
        return self.rank == 1


def _pad_to(x: np.ndarray, size: int) -> np.ndarray:
    if len(x) == size:
        return x
    return np.concatenate([x, np.zeros((size - len(x),) + x.shape[1:], x.dtype)])


@jax.jit
def _level(params, h_tab, c_tab, parents, tokens):
    """States after feeding ``tokens`` to the parent states (rows of the tables)."""
    return advance(params, h_tab[parents], c_tab[parents], tokens)


@jax.jit
def _last_level(params, h_tab, c_tab, parents, tokens, targets):
    """log P(target | parent state + token) per row: one LSTM step and one output layer."""
    _, _, p, lse = advance(params, h_tab[parents], c_tab[parents], tokens)
    return next_log_probs(params, p, lse, targets)


@jax.jit
def _gather(params, p_tab, lse_tab, rows, targets):
    return next_log_probs(params, p_tab[rows], lse_tab[rows], targets)


def suffix_log_probs(stepper: NWPStepper, prefix: np.ndarray, suffixes: np.ndarray, batch: int = 512, progress: Callable[[int], None] | None = None) -> np.ndarray:
    """sum_j log P(suffixes[:, j] | prefix, suffixes[:, :j]) for each row (nats, float64 sum of
    float32 terms). ``prefix``: ids fed first (normally [bos, w_1, ..., w_p]); ``suffixes`` (N, S)."""
    suffixes = np.asarray(suffixes, np.int32)
    n, s = suffixes.shape
    if n == 0 or s == 0:
        raise FedprivError("no suffixes to score")
    params = stepper.params
    h0, c0, p0, lse0 = stepper.run(np.asarray(prefix, np.int32)[None, :])
    first = np.asarray(stepper.all_log_probs(p0, lse0))[0]
    total = first[suffixes[:, 0]].astype(np.float64)
    h_tab, c_tab = h0, c0  # states of the distinct starts of the previous level
    parent = np.zeros(n, np.int64)  # each candidate's row in the previous level's tables
    for j in range(1, s):
        tokens_all, targets_all = suffixes[:, j - 1], suffixes[:, j]
        if j == s - 1:  # last level: one row per candidate
            out = np.empty(n, np.float32)
            for lo in range(0, n, batch):
                hi = min(lo + batch, n)
                args = [jnp.asarray(_pad_to(a[lo:hi], batch)) for a in (parent.astype(np.int32), tokens_all, targets_all)]
                out[lo:hi] = np.asarray(_last_level(params, h_tab, c_tab, *args))[: hi - lo]
                if progress is not None:
                    progress(hi - lo)
            total += out
            break
        # intermediate level: distinct (parent, token) pairs get one state each
        keys = parent * stepper.vocab_size + tokens_all
        uniq, first_idx, inv = np.unique(keys, return_index=True, return_inverse=True)
        m = len(uniq)
        hs, cs, ps, lses = [], [], [], []
        for lo in range(0, m, batch):
            hi = min(lo + batch, m)
            rows = first_idx[lo:hi]
            par = jnp.asarray(_pad_to(parent[rows].astype(np.int32), batch))
            tok = jnp.asarray(_pad_to(tokens_all[rows], batch))
            h, c, p, lse = _level(params, h_tab, c_tab, par, tok)
            hs.append(h), cs.append(c), ps.append(p), lses.append(lse)  # whole padded blocks: see below
        h_tab, c_tab = jnp.concatenate(hs), jnp.concatenate(cs)
        p_tab, lse_tab = jnp.concatenate(ps), jnp.concatenate(lses)
        out = np.empty(n, np.float32)
        for lo in range(0, n, batch):
            hi = min(lo + batch, n)
            rows = jnp.asarray(_pad_to(inv[lo:hi].astype(np.int32), batch))
            tg = jnp.asarray(_pad_to(targets_all[lo:hi], batch))
            out[lo:hi] = np.asarray(_gather(params, p_tab, lse_tab, rows, tg))[: hi - lo]
        total += out
        parent = inv.astype(np.int64)
    return total


def draw_suffixes(pool_ids: np.ndarray, weights: np.ndarray | None, length: int, count: int, exclude: np.ndarray, seed: int, canary_index: int) -> np.ndarray:
    """``count`` random suffixes of ``length`` ids from ``pool_ids`` (by ``weights``, uniform when
    None), none equal to ``exclude``; a pure function of (seed, canary_index)."""
    rng = np.random.default_rng([seed, RS_STREAM, canary_index])
    out = pool_ids[rng.choice(len(pool_ids), size=(count, length), p=weights)]
    same = np.all(out == exclude[None, :], axis=1)
    while same.any():
        out[same] = pool_ids[rng.choice(len(pool_ids), size=(int(same.sum()), length), p=weights)]
        same = np.all(out == exclude[None, :], axis=1)
    return out


def random_sampling(
    stepper: NWPStepper,
    canary_ids: np.ndarray,
    prefix_words: int,
    suffixes: np.ndarray,
    batch: int = 512,
    progress: Callable[[int], None] | None = None,
) -> tuple[RandomSamplingResult, np.ndarray]:
    """The RS test of one canary (word ids) against ``suffixes`` (N, k - prefix_words). Returns the
    result and the random suffixes' log-perplexities (nats), for exposure."""
    canary_ids = np.asarray(canary_ids, np.int32)
    if not 1 <= prefix_words < len(canary_ids):
        raise FedprivError(f"the Random Sampling prefix ({prefix_words} words) must be shorter than the canary ({len(canary_ids)} words)")
    prefix = np.concatenate([[stepper.vocab.bos], canary_ids[:prefix_words]]).astype(np.int32)
    rows = np.concatenate([canary_ids[None, prefix_words:], np.asarray(suffixes, np.int32)])
    ppl = -suffix_log_probs(stepper, prefix, rows, batch, progress)
    at_or_below = int(np.sum(ppl[1:] <= ppl[0]))
    return RandomSamplingResult(at_or_below + 1, len(rows) - 1, float(ppl[0]), at_or_below), ppl[1:]
