"""Record-level accounting of client-side DP-SGD (each client runs DP-SGD on its own examples).

Within a round, a participating client makes E passes over a shuffled partition of its examples,
so each example is in at most E local steps, each a Gaussian mechanism with sensitivity C
(add-or-remove-one example: the denominator is the public local batch size B) and noise sigma*C.
Shuffled batches give no subsampling amplification that the accountants cover, so none is
claimed: after rounds 1..r an example of a user who took part in k of them has been through at
most k*E such mechanisms. The report is the worst case over the training users, with k the
largest participation count so far (the sampler is a function of (seed, round), so the counts are
recomputed, not stored). This bound is loose; it is what the tool can state honestly.
"""

from __future__ import annotations

import numpy as np

from fedpriv.config import FederatedConfig
from fedpriv.errors import PrivacyParameterError
from fedpriv.privacy.accounting import GaussianSteps, check_delta, epsilon_for
from fedpriv.strategies.core import CohortSampler


def check_client_dp(fcfg: FederatedConfig) -> bool:
    """True when client-side DP-SGD is on; refuses a partial set of its keys."""
    keys = {"client_clip_norm": fcfg.client_clip_norm, "client_noise_multiplier": fcfg.client_noise_multiplier, "client_delta": fcfg.client_delta}
    given = [k for k, v in keys.items() if v is not None]
    if given and len(given) < len(keys):
        missing = sorted(set(keys) - set(given))
        raise PrivacyParameterError(f"client-side DP-SGD needs all of client_clip_norm, client_noise_multiplier, client_delta; missing {', '.join(missing)}")
    if given:
        check_delta(fcfg.client_delta)
    return bool(given)


class Participation:
    """How many of rounds 1..r each user took part in (recomputed from the sampler, extended lazily)."""

    def __init__(self, sampler: CohortSampler):
        self.sampler = sampler
        self.counts = np.zeros(sampler.population, np.int64)
        self.rounds = 0

    def max_after(self, rounds: int) -> int:
        if rounds < self.rounds:
            self.counts[:] = 0
            self.rounds = 0
        for r in range(self.rounds + 1, rounds + 1):
            self.counts[self.sampler.sample(r)] += 1
        self.rounds = rounds
        return int(self.counts.max()) if rounds else 0


def record_level_report(fcfg: FederatedConfig, participation: Participation, rounds: int) -> dict:
    """``client_epsilon`` at ``client_delta`` and its guarantee after ``rounds`` rounds."""
    k = participation.max_after(rounds) * fcfg.local_epochs
    if k == 0:
        return {"client_epsilon": 0.0, "client_delta": fcfg.client_delta, "client_guarantee": "no local steps yet"}
    event = GaussianSteps("none", fcfg.client_noise_multiplier, 1, 1, k, "example")
    ans = epsilon_for(event, fcfg.client_delta)
    return {
        "client_epsilon": ans.epsilon,
        "client_delta": fcfg.client_delta,
        "client_guarantee": f"record-level, add-or-remove-one example: {k} Gaussian steps (noise multiplier {fcfg.client_noise_multiplier}, no amplification from shuffled local batches); epsilon = {ans.epsilon:.4g} at delta = {fcfg.client_delta:g}",
    }
