"""RMS prefix-sum noise per user of the cohort, fixed vs optimized correlated-noise strategies, at the
arXiv grid's settings (docs/correlated_noise.md, "At the grid's cohort of 5,000"); accounting only.

For each row: the strategy (fixed, or ``coefficients = "optimized"``: jax-privacy's optimizer, timed),
sigma per draw calibrated by fedpriv to epsilon 8 at delta 1e-5 (PLD) on that strategy's event,
and sigma * sqrt(mean over t of jax-privacy's per-query prefix-sum error of C) / B, the noise of the
running sum in clip norms per user of the cohort (B the cohort). The Gaussian reference is one band
at b = 1 (Poisson, q = B / N).

    PYTHONPATH=. .venv/bin/python benchmarks/optimized_strategies.py [--population 51220] [--steps 200]

``--amplification-choice`` also runs jax-privacy's ``optimize_coefs_for_amplifications`` (which picks
the bands among the divisors of N, RDP) and prints the row of the bands it picks.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax_privacy.matrix_factorization import toeplitz

from fedpriv.privacy.accounting import calibrate_noise_multiplier
from fedpriv.privacy.amplified import AmplifiedBandMF, CyclicPoissonSchedule
from fedpriv.privacy.correlated import CorrelatedSteps, CyclicSchedule
from fedpriv.privacy.optimized import strategy_for

EPSILON, DELTA = 8.0, 1e-5


def rms_prefix_error(strategy, n: int) -> float:
    """sqrt(mean over t of the per-query squared prefix-sum error of C^-1 Z, Z ~ N(0, 1))."""
    with jax.enable_x64(True):
        return math.sqrt(float(jnp.mean(toeplitz.per_query_error(strategy_coef=jnp.asarray(strategy.toeplitz_coefs(n), jnp.float64), n=n))))


def row(label: str, mechanism: str, coefficients: str, size: int, schedule, relation: str) -> str:
    start = time.perf_counter()
    bands, buffers = (size, None) if mechanism == "banded-mf" else (None, size)
    strategy = strategy_for(mechanism, coefficients, bands, buffers, schedule)
    seconds = time.perf_counter() - start
    event = (AmplifiedBandMF if isinstance(schedule, CyclicPoissonSchedule) else CorrelatedSteps).of(strategy, 1.0, schedule)
    sigma, _ = calibrate_noise_multiplier(event, EPSILON, DELTA, "pld")
    rms = sigma * rms_prefix_error(strategy, schedule.steps) / schedule.cohort
    memory = len(strategy.coefs) - 1 if mechanism == "banded-mf" else len(strategy.buf_decay)
    took = f"{seconds:.1f} s" if coefficients == "optimized" else "-"
    return f"| {label}, {coefficients} ({memory} state arrays) | {relation} | {sigma:.4f} | {rms:.3e} | {took} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--population", type=int, default=51220)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--amplification-choice", action="store_true")
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("absl").setLevel(logging.ERROR)  # dp_accounting's RDP convergence notes inside jax-privacy's band choice
    N, n = a.population, a.steps
    print("| mechanism, participation, coefficients | relation | sigma per draw (PLD) | RMS prefix-sum error / B | optimization (CPU) |")
    print("| --- | --- | --- | --- | --- |")
    print(row("1 band = Gaussian, Poisson q = 5,000 / N", "banded-mf", "fixed", 1, CyclicPoissonSchedule(N, 5000, 1, n, 0), "add-or-remove-one"), flush=True)
    for bands in (4, 8):
        sched = CyclicPoissonSchedule(N, 5000, bands, n, 0)
        for coefficients in ("fixed", "optimized"):
            print(row(f"banded MF, {bands} bands, cyclic Poisson b = {bands}", "banded-mf", coefficients, bands, sched, "add-or-remove-one"), flush=True)
    for cohort in (5000, 1000):
        sched = CyclicSchedule(N, cohort, n, 0)
        for coefficients in ("fixed", "optimized"):
            label = f"BLT, {'at most ' if coefficients == 'optimized' else ''}4 buffers, cyclic b = {sched.groups} at {cohort:,} (k = {sched.max_participations})"
            print(row(label, "blt", coefficients, 4, sched, "zero-out-one"), flush=True)
    if a.amplification_choice:
        start = time.perf_counter()
        with jax.enable_x64(True):
            coefs, _ = toeplitz.optimize_coefs_for_amplifications(n, dataset_size=N, expected_batch_size=5000, epsilon=EPSILON, delta=DELTA)
        bands = len(np.asarray(coefs))
        print(f"jax-privacy's optimize_coefs_for_amplifications picks {bands} band(s) ({time.perf_counter() - start:.1f} s)")
        if bands > 0:
            print(row(f"banded MF, {bands} bands (jax-privacy's choice), cyclic Poisson b = {bands}", "banded-mf", "optimized", bands,
                      CyclicPoissonSchedule(N, 5000, bands, n, 0), "add-or-remove-one"))


if __name__ == "__main__":
    main()
