"""User-level batches for central DP-SGD: each step samples USERS, each sampled user brings
``k`` of its examples (jax-privacy's ``UserSelectionStrategy``; a user's examples are taken in a
shuffled cycle, so a user with fewer than k examples repeats them).

Sampling: cyclic (correlated noise: :class:`~fedpriv.privacy.correlated.CyclicSchedule` over the
users, each user's examples still taken by jax-privacy's ``UserSelectionStrategy``), cyclic Poisson
(amplified banded MF: jax-privacy's ``CyclicPoissonSampling`` with b groups, the selection of a
:class:`~fedpriv.privacy.amplified.CyclicPoissonSchedule`), Poisson (each user independently with q = B/N; jax-privacy's ``CyclicPoissonSampling``
with a cycle of 1) or fixed-size (exactly B of N users without replacement, independently at
every step: ``FixedBatchSampling``), the assumptions the accountant makes for add-or-remove-one
and replace-one user. The iterator is replayed from the start when a run resumes, so step i's
batch is a function of (seed, i), as every other batch in fedpriv.

N, the population the accountant is told (``num_users``), is the number of users the sampler
can draw: those with at least one example (:func:`sampled_population`); a user without examples is
never sampled, so counting it would understate q = B/N.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
from jax_privacy.batch_selection import BatchSelectionStrategy, CyclicPoissonSampling, FixedBatchSampling, PartitionType, UserSelectionStrategy

from fedpriv.errors import PrivacyParameterError
from fedpriv.privacy.amplified import CyclicPoissonSchedule
from fedpriv.privacy.correlated import CyclicSchedule

USER_STREAM = 0x05E5


def sampled_population(counts: np.ndarray) -> int:
    """N: the users with at least one example, the only ones the sampler draws (``user_ids``)."""
    return int(np.count_nonzero(np.asarray(counts, np.int64) > 0))


@dataclasses.dataclass(frozen=True)
class ScheduledSampling(BatchSelectionStrategy):
    """jax-privacy's batch selection over a :class:`~fedpriv.privacy.correlated.CyclicSchedule`:
    batch i is the schedule's group i mod b (the correlated-noise mechanisms' participation)."""

    schedule: CyclicSchedule

    def batch_iterator(self, num_examples: int, rng=None) -> Iterator[np.ndarray]:  # noqa: ANN001
        if num_examples != self.schedule.population:
            raise PrivacyParameterError(f"the cyclic schedule covers {self.schedule.population} users, the data has {num_examples}")
        for i in range(self.schedule.steps):
            yield self.schedule.sample(i)


class UserBatches:
    """Step i's sampled users and their examples: an int array (users, k) of record indices
    (records in corpus user order, ``counts[u]`` records for user u)."""

    def __init__(self, counts: np.ndarray, sampling: str, batch: int, steps: int, examples_per_user: int, seed: int, groups: int | None = None):
        counts = np.asarray(counts, np.int64)
        self.num_users = sampled_population(counts)
        if sampling == "fixed" and batch > self.num_users:
            raise PrivacyParameterError(f"training.batch_size = {batch} users > {self.num_users} training users: a fixed-size batch needs B <= N")
        self.schedule: CyclicSchedule | CyclicPoissonSchedule | None = None
        if sampling == "cyclic":  # correlated noise: the users in fixed groups of B, group i mod b at step i
            self.schedule = CyclicSchedule(self.num_users, batch, steps, seed, "user")
            base = ScheduledSampling(self.schedule)
        elif sampling == "cyclic-poisson":  # amplified banded MF: users drawn into b groups, group i mod b Poisson-sampled
            self.schedule = CyclicPoissonSchedule(self.num_users, batch, int(groups), steps, seed, "user")
            base = self.schedule.selection
        elif sampling == "poisson":
            base = CyclicPoissonSampling(sampling_prob=batch / self.num_users, iterations=steps, partition_type=PartitionType.INDEPENDENT)
        else:
            base = FixedBatchSampling(batch_size=batch, iterations=steps)
        self.k = examples_per_user
        self.strategy = UserSelectionStrategy(base, examples_per_user_per_batch=examples_per_user, shuffle_per_user=True)
        self.user_ids = np.repeat(np.arange(len(counts)), counts)  # record -> user position; empty users never appear
        self.seed = seed
        self._it: Iterator[np.ndarray] | None = None
        self._next = 0

    def indices(self, step: int) -> np.ndarray:
        """(users sampled at ``step``, k) record indices."""
        if self._it is None or step < self._next:
            self._it = self.strategy.batch_iterator(self.user_ids, np.random.default_rng([self.seed, USER_STREAM]))
            self._next = 0
        batch = None
        while self._next <= step:
            batch = next(self._it)
            self._next += 1
        return np.asarray(batch, np.int64).reshape(-1, self.k)
