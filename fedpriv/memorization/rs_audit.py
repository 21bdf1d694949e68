"""Random Sampling as ``fedpriv audit`` runs it: the rank, and the scores the exposure fit reads.

The audit needs the canary's rank among N random suffixes (from
:func:`fedpriv.memorization.rs_fast.fast_random_sampling`, the reference's rank with the least
work) and, for the skew-normal extrapolation, the log-perplexities that
:func:`fedpriv.memorization.exposure.extrapolated_exposure` fits: all N when N <= FIT_SAMPLES,
else the deterministic subsample it draws itself. Only those are scored in full, so passing them
to it gives the fit it would make from all N scores.
"""

from __future__ import annotations

import numpy as np

from fedpriv.memorization.exposure import FIT_SAMPLES
from fedpriv.memorization.lm import NWPStepper
from fedpriv.memorization.random_sampling import RandomSamplingResult
from fedpriv.memorization.rs_fast import fast_random_sampling


def fit_rows(n: int, seed: int) -> np.ndarray:
    """The rows of n scores that ``extrapolated_exposure(..., seed=seed)`` fits, in its order."""
    if n <= FIT_SAMPLES:
        return np.arange(n)
    return np.random.default_rng(seed).choice(n, FIT_SAMPLES, replace=False)


def audit_random_sampling(stepper: NWPStepper, canary_ids: np.ndarray, prefix_words: int, suffixes: np.ndarray, batch: int, fit_seed: int) -> tuple[RandomSamplingResult, np.ndarray]:
    """The RS result of one canary and the log-perplexities (nats) of ``fit_rows(N, fit_seed)``."""
    rows = fit_rows(len(suffixes), fit_seed)
    result, scores, _ = fast_random_sampling(stepper, canary_ids, prefix_words, suffixes, batch, score_rows=rows)
    return result, scores
