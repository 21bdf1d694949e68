"""Means with 95% bootstrap intervals over seeds and canaries, and paired contrasts.

A measurement of a run group is a list with one array per seed: the per-canary values of that
seed's run (1 or 0 for RS/BS memorized, exposure in bits), or a single value (utility). The
bootstrap is hierarchical, the way the data were made: each replicate draws the seeds with
replacement, then, within each drawn seed, its canaries with replacement; the statistic is the
mean of the pooled draws. The point estimate is the mean of the pooled values (every canary of
every seed weighs the same). The interval is the 2.5th to 97.5th percentile of the replicates.

With one seed the interval covers canaries only, and a one-value-per-seed measurement (utility)
has no interval (:func:`interval` returns None for it): one training run says nothing about
another seed's.

A contrast a - b of two groups is paired: the runs of one seed share the planted canaries, so a
replicate draws the same seeds, and within a seed the same canary indices, for both sides.
Replicates are drawn from a fixed generator, so a report is deterministic.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

REPLICATES = 2000
LEVEL = 0.95
SEED = 0x1A7


@dataclass(frozen=True)
class Estimate:
    """A mean and its interval (None when the data cannot give one)."""

    mean: float
    low: float | None
    high: float | None
    seeds: int
    values: int

    def scaled(self, factor: float) -> "Estimate":
        s = lambda v: None if v is None else v * factor  # noqa: E731
        return Estimate(self.mean * factor, s(self.low), s(self.high), self.seeds, self.values)


def _arrays(by_seed: Sequence[Sequence[float]]) -> list[np.ndarray]:
    out = [np.asarray(v, np.float64).ravel() for v in by_seed]
    if not out or any(len(v) == 0 for v in out):
        raise ValueError("every seed needs at least one value")
    return out


def _replicates(sides: list[list[np.ndarray]], reps: int, seed: int) -> np.ndarray:
    """(reps, sides) bootstrap means; the same seed and canary draws for every side."""
    draws = _draws(tuple(len(v) for v in sides[0]), reps, seed)
    out = np.empty((reps, len(sides)))
    for j, side in enumerate(sides):
        pooled = np.concatenate(side)
        for r, picks in enumerate(draws):
            out[r, j] = pooled[picks].mean()
    return out


@functools.lru_cache(maxsize=64)
def _draws(lengths: tuple[int, ...], reps: int, seed: int) -> tuple[np.ndarray, ...]:
    """Each replicate's draws as indices into the seeds' values pooled in seed order: the seeds
    drawn with replacement, then each drawn seed's values, from ``default_rng(seed)`` in that
    order. They depend on the values' counts only, so every measurement of a report with the same
    counts (most of them: one canary set per seed) shares them (read-only)."""
    rng = np.random.default_rng(seed)
    n_seeds = len(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    out = []
    for _ in range(reps):
        seeds = rng.integers(0, n_seeds, n_seeds)
        picks = np.concatenate([starts[s] + rng.integers(0, lengths[s], lengths[s]) for s in seeds])
        picks.flags.writeable = False
        out.append(picks)
    return tuple(out)


def interval(by_seed: Sequence[Sequence[float]], reps: int = REPLICATES, level: float = LEVEL, seed: int = SEED) -> Estimate:
    """The pooled mean of ``by_seed`` (one array per seed) and its hierarchical bootstrap interval."""
    data = _arrays(by_seed)
    mean = float(np.concatenate(data).mean())
    if len(data) == 1 and len(data[0]) == 1:
        return Estimate(mean, None, None, 1, 1)
    reps_ = _replicates([data], reps, seed)[:, 0]
    lo, hi = np.quantile(reps_, [(1 - level) / 2, (1 + level) / 2])
    return Estimate(mean, float(lo), float(hi), len(data), sum(len(v) for v in data))


def paired_difference(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], reps: int = REPLICATES, level: float = LEVEL, seed: int = SEED) -> Estimate:
    """mean(a) - mean(b) over paired seeds (and canaries) with its bootstrap interval. ``a`` and
    ``b`` hold the same seeds in the same order, with as many values per seed."""
    da, db = _arrays(a), _arrays(b)
    if len(da) != len(db) or any(len(x) != len(y) for x, y in zip(da, db)):
        raise ValueError("a paired contrast needs the same seeds and as many values per seed on both sides")
    mean = float(np.concatenate(da).mean() - np.concatenate(db).mean())
    if len(da) == 1 and len(da[0]) == 1:
        return Estimate(mean, None, None, 1, 1)
    r = _replicates([da, db], reps, seed)
    diff = r[:, 0] - r[:, 1]
    lo, hi = np.quantile(diff, [(1 - level) / 2, (1 + level) / 2])
    return Estimate(mean, float(lo), float(hi), len(da), sum(len(v) for v in da))
