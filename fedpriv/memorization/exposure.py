"""Exposure (Carlini et al. 2019): how far ahead of the alternatives a model ranks a canary.

For a canary c among a candidate space R (every suffix the canary could have had), scored by
log-perplexity (lower = more likely), ``exposure = log2 |R| - log2 rank(c)`` in bits, with
rank 1 for the most likely. It lies in [0, log2 |R|]; log2 |R| means the canary is ranked first.
Ties count against the canary (rank = 1 + the other members scoring at or below it), so a model
that scores every candidate alike gets exposure 0, not log2 |R|.

Three ways to get it, from most to least exact:

* :func:`exact_exposure`: R enumerated and scored.
* :func:`interpolated_exposure`: from N suffixes sampled uniformly from R; the canary's rank in R
  is estimated as 1 + (k / N) (|R| - 1), k of the N scoring at or below it. With k = 0 it saturates at log2 |R|:
  the *ceiling* of the estimate (:func:`at_ceiling`), the most it can give, not a measurement. A canary that beat all
  N draws has, with 95% confidence, at least :func:`beat_every_draw_bound` bits (about log2 (N / 3)), and at most
  log2 |R| (rank 1 in R); its estimate jumps from about log2 N (k = 1) to log2 |R| (k = 0).
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
#: The ``exposure_method`` of an audit row whose exposure was interpolated from sampled suffixes
#: (``"exact"``: R enumerated; masked-LM rows rank the secret among the whole vocabulary, also exact).
SAMPLED = "sampled"


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


def at_ceiling(exposure: float, space_log2: float | None, method: str | None) -> bool:
    """Whether a canary's exposure is the ceiling of a sampled estimate: interpolated from sampled
    suffixes (``method`` ``"sampled"``) and equal to log2 |R| (``space_log2``), i.e. the canary beat
    every sampled suffix. The value is then the largest the estimate can give, not a measurement.
    An enumerated R (``"exact"``) at log2 |R| is a measurement (the canary beat every member)."""
    if method != SAMPLED or space_log2 is None or exposure is None:
        return False
    return float(exposure) >= float(space_log2) - 1e-9 * max(1.0, abs(float(space_log2)))


def beat_every_draw_bound(sampled: int, space_size: float, confidence: float = 0.95) -> float:
    """The exposure (bits) that a canary scoring below every one of ``sampled`` suffixes drawn
    independently from R has at least, with probability ``confidence``. If a fraction f of the other
    members of R scores at or below the canary, no draw hits them with probability (1 - f)^N; that is
    at least 1 - confidence only when f <= f* = 1 - (1 - confidence)^(1/N). So, at that confidence,
    rank <= 1 + f* (|R| - 1) and exposure >= log2 |R| - log2 (1 + f* (|R| - 1)), about log2 (N / 3)
    bits at 95%. The draws are taken as uniform over R, as :func:`interpolated_exposure` takes them."""
    if sampled < 1 or not 0 < confidence < 1 or space_size < 2:
        raise FedprivError(f"need sampled >= 1 (got {sampled}), 0 < confidence < 1 (got {confidence}) and |R| >= 2 (got {space_size})")
    f = -math.expm1(math.log1p(-confidence) / sampled)
    return max(0.0, math.log2(space_size) - math.log2(1 + f * (space_size - 1)))


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
