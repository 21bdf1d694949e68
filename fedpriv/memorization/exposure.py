"""Exposure (Carlini et al. 2019): how far ahead of the alternatives a model ranks a canary.

For a canary c among a candidate space R (every suffix the canary could have had), scored by
log-perplexity (lower = more likely), ``exposure = log2 |R| - log2 rank(c)`` in bits, with
rank 1 for the most likely. It lies in [0, log2 |R|]; log2 |R| means the canary is ranked first.
Ties count against the canary (rank = 1 + the other members scoring at or below it), so a model
that scores every candidate alike gets exposure 0, not log2 |R|.

Three ways to get it, from most to least exact:

* :func:`exact_exposure`: R enumerated and scored.
* :func:`interpolated_exposure`: from N suffixes sampled uniformly from R; the canary's rank in R
  is estimated as 1 + (k / N) (|R| - 1), k of the N scoring at or below it. With k = 0 it saturates at log2 |R|.
* :func:`extrapolated_exposure`: a skew-normal fitted to the sampled log-perplexities (Carlini et
  al. 2019, Section 4.3) gives the fraction of R scoring at most the canary, F; exposure is
  -log2 F, clipped to [0, log2 |R|] (rank >= 1 in R). It resolves canaries more likely than every
  sample, where interpolation saturates. None when the samples have no spread (every one the
  same score: nothing to fit).
"""

from __future__ import annotations

import math

import numpy as np

from fedpriv.errors import FedprivError

FIT_SAMPLES = 100_000


def exposure_from_rank(rank: float, space_size: float) -> float:
    """log2 |R| - log2 rank (bits)."""
    if not 1 <= rank <= space_size:
        raise FedprivError(f"rank {rank} must be in [1, {space_size}]")
    return math.log2(space_size) - math.log2(rank)


def exact_exposure(canary_score: float, other_scores: np.ndarray) -> float:
    """Exposure when ``other_scores`` are the log-perplexities of every other member of R."""
    others = np.asarray(other_scores)
    return exposure_from_rank(1 + int(np.sum(others <= canary_score)), len(others) + 1)


def interpolated_exposure(at_or_below: int, sampled: int, space_size: float) -> float:
    """Exposure from ``at_or_below`` of ``sampled`` random candidates scoring at or below the canary."""
    if sampled < 1 or not 0 <= at_or_below <= sampled:
        raise FedprivError(f"need 0 <= at_or_below ({at_or_below}) <= sampled ({sampled}) and sampled >= 1")
    return exposure_from_rank(1 + at_or_below / sampled * (space_size - 1), space_size)


def extrapolated_exposure(canary_score: float, sample_scores: np.ndarray, space_size: float, seed: int = 0) -> float | None:
    """-log2 F(canary_score) under a skew-normal fitted (maximum likelihood) to at most
    ``FIT_SAMPLES`` of ``sample_scores`` (a deterministic subsample), clipped to [0, log2 |R|];
    None when the scores have no spread (a model that scores every candidate alike)."""
    from scipy.stats import skewnorm

    x = np.asarray(sample_scores, np.float64)
    if len(x) < 10:
        raise FedprivError(f"a skew-normal fit needs at least 10 sampled scores, got {len(x)}")
    if len(x) > FIT_SAMPLES:
        x = x[np.random.default_rng(seed).choice(len(x), FIT_SAMPLES, replace=False)]
    if not np.ptp(x) > 0:  # scipy's fit raises FitError on constant data; there is no distribution to extrapolate
        return None
    a, loc, scale = skewnorm.fit(x)
    log_f = float(skewnorm.logcdf(canary_score, a, loc, scale))
    bits = -log_f / math.log(2) if math.isfinite(log_f) else math.inf
    return float(min(max(bits, 0.0), math.log2(space_size)))
