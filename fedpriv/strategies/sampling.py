"""Which users take part in each round, as a pure function of (seed, round).

fixed: exactly m distinct users, uniform over all N-choose-m subsets (DP-FedAvg accounts it as
sampling without replacement, replace-one user). poisson: each user independently with
probability q = m/N (the cohort size varies; add-or-remove-one user). A resumed run samples the
same cohorts, and every engine samples the same users.
"""

from __future__ import annotations

import numpy as np

from fedpriv.errors import PrivacyParameterError

SAMPLER_STREAM = 0x5A3B1E


class CohortSampler:
    """The users of round r (sorted user indices: positions in the training corpus)."""

    def __init__(self, population: int, clients_per_round: int, sampling: str, seed: int):
        if sampling == "fixed" and clients_per_round > population:
            raise PrivacyParameterError(f"federated.clients_per_round = {clients_per_round} but there are only {population} training users")
        self.population = population
        self.m = min(clients_per_round, population)
        self.sampling = sampling
        self.seed = seed

    def sample(self, round_: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, SAMPLER_STREAM, round_])
        if self.sampling == "fixed":
            return np.sort(rng.choice(self.population, size=self.m, replace=False))
        return np.flatnonzero(rng.random(self.population) < self.m / self.population)


class Participation:
    """How many of rounds 1..r each user took part in (recomputed from the sampler, extended lazily)."""

    def __init__(self, sampler: CohortSampler):
        self.sampler = sampler
        self.counts = np.zeros(sampler.population, np.int64)
        self.rounds = 0

    def max_after(self, rounds: int) -> int:
        """The largest number of rounds any user took part in among rounds 1..``rounds``."""
        if rounds < self.rounds:
            self.counts[:] = 0
            self.rounds = 0
        for r in range(self.rounds + 1, rounds + 1):
            self.counts[self.sampler.sample(r)] += 1
        self.rounds = rounds
        return int(self.counts.max()) if rounds else 0
