"""User-level DP-SGD's population (issue 30, point 8): the N the accountant is told is the number
of users the sampler draws from, one definition for both."""

from __future__ import annotations

import numpy as np

from fedpriv.central.users import UserBatches, sampled_population


def test_the_accounted_population_is_the_sampled_one():
    counts = np.array([3, 0, 2, 4, 0, 1])
    assert sampled_population(counts) == 4
    ub = UserBatches(counts, "fixed", 4, 20, 2, seed=0)
    assert ub.num_users == 4
    users_of = np.repeat(np.arange(len(counts)), counts)
    drawn = set()
    for step in range(20):
        users = {int(u) for u in users_of[ub.indices(step)[:, 0]]}
        assert len(users) == 4  # fixed size B = N: every sampled batch is the whole population
        drawn |= users
    assert drawn == {0, 2, 3, 5}  # the users with examples, and only they
    # Poisson: q = B/N over the same N; each user of the population is drawn at rate q.
    ub = UserBatches(counts, "poisson", 2, 400, 1, seed=1)
    hits = np.zeros(len(counts))
    for step in range(400):
        np.add.at(hits, users_of[ub.indices(step)[:, 0]], 1)
    assert hits[1] == hits[4] == 0
    rate = hits[[0, 2, 3, 5]] / 400
    assert np.all(np.abs(rate - 2 / 4) < 4 * np.sqrt(0.25 / 400))  # q = B/N = 0.5, not B/len(counts) = 1/3
