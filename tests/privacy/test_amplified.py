"""Amplified banded MF (fedpriv/privacy/amplified.py): checked against its definitions.

epsilon is dp_accounting's composition of k = ceil(n / b) Poisson-subsampled Gaussians with
q = m / (N // b) and multiplier sigma / (C's largest column norm), built here by hand; one band
is Poisson DP-SGD / DP-FedAvg; the sampler keeps each unit in the steps of its group and takes it
with probability q; a schedule that breaks the participation is refused."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld as dp_pld
from dp_accounting import rdp as dp_rdp

from fedpriv.config import FederatedConfig, PrivacyConfig
from fedpriv.errors import PrivacyParameterError
from fedpriv.privacy.accounting import PLD_DISCRETIZATION, RDP_ORDERS, GaussianSteps, epsilon_for
from fedpriv.privacy.amplified import AmplifiedBandMF, CyclicPoissonSchedule
from fedpriv.privacy.correlated import Strategy, make_strategy
from fedpriv.privacy.ledger import PrivacyLedger

ADD_OR_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


def by_hand(q: float, multiplier: float, k: int, delta: float, accountant: str) -> float:
    """dp_accounting's own composition: k Poisson-subsampled Gaussians, add-or-remove-one."""
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(multiplier)), k)
    if accountant == "rdp":
        acc = dp_rdp.RdpAccountant(RDP_ORDERS, ADD_OR_REMOVE)
    else:
        acc = dp_pld.PLDAccountant(ADD_OR_REMOVE, value_discretization_interval=PLD_DISCRETIZATION)
    return acc.compose(event).get_epsilon(delta)


def event(bands: int, groups: int, z: float = 0.9, population: int = 5000, m: int = 50, steps: int = 30, unit: str = "user") -> AmplifiedBandMF:
    return AmplifiedBandMF.of(make_strategy("banded-mf", bands), z, CyclicPoissonSchedule(population, m, groups, steps, 0, unit))


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
@pytest.mark.parametrize("steps", [30, 2])
def test_epsilon_is_the_hand_composition(accountant, steps):
    """3 bands, b = 4 groups of N = 5003, m = 50 expected: q = 50 / (5003 // 4) = 50 / 1250 (not
    4 * 50 / 5003), k = ceil(n / 4), the multiplier sigma over the norm of C's first column (its
    bands over n steps: all three at n = 30, the first two at n = 2, where that norm is below 1)."""
    ev = event(3, 4, population=5003, steps=steps)
    c = np.asarray(ev.coefs)
    c_max = float(np.linalg.norm(c[:steps]))
    assert (steps >= 3) == math.isclose(c_max, 1.0, rel_tol=1e-12)
    assert ev.sensitivity_in_clip_norms == pytest.approx(c_max, rel=1e-12)
    want = by_hand(50 / 1250, 0.9 / c_max, math.ceil(steps / 4), 1e-5, accountant)
    got = epsilon_for(ev, 1e-5, accountant)
    assert got.epsilon == pytest.approx(want, rel=1e-9)
    assert got.relation == "add-or-remove-one" and "k = " + str(math.ceil(steps / 4)) in got.sampling and "b = 4 groups" in got.sampling


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
@pytest.mark.parametrize("unit", ["example", "user"])
def test_one_band_is_poisson_dpsgd(accountant, unit):
    """One band (C = I): with b = 1 the epsilon is exactly Poisson DP-SGD / DP-FedAvg's (q = m / N,
    n steps); with b = 5 it is exactly Poisson's with q = m / (N // b) = 5m / N over k = ceil(n / 5)
    steps (the same units, each eligible one step in five)."""
    n, N, m, z = 23, 5000, 40, 1.5
    assert epsilon_for(event(1, 1, z, N, m, n, unit), 1e-6, accountant).epsilon == epsilon_for(GaussianSteps("poisson", z, N, m, n, unit), 1e-6, accountant).epsilon
    five = epsilon_for(event(1, 5, z, N, m, n, unit), 1e-6, accountant).epsilon
    assert five == epsilon_for(GaussianSteps("poisson", z, N, 5 * m, math.ceil(n / 5), unit), 1e-6, accountant).epsilon
    assert five > epsilon_for(GaussianSteps("poisson", z, N, m, n, unit), 1e-6, accountant).epsilon  # b > bands gains nothing with one band


def test_the_event_is_jax_privacys_amplified_bandmf_event():
    from jax_privacy.experimental.accounting import amplified_bandmf_event

    ev = event(2, 3, z=1.3, steps=10)
    assert ev.dp_event() == amplified_bandmf_event(1.3 / ev.sensitivity_in_clip_norms, 10, num_bands=3, sampling_prob=50 / (5000 // 3))


def test_the_ledger_merges_and_round_trips(tmp_path):
    """40 recorded steps are one entry whose epsilon is that of the 40-step event, read back equal;
    it moves only when k = ceil(n / b) does."""
    ev, sigma = event(4, 4, steps=40), 1.7
    ans = epsilon_for(replace(ev, noise_multiplier=sigma), 1e-5, "rdp")
    ledger = PrivacyLedger()
    for _ in range(40):
        ledger.record(replace(ev, noise_multiplier=sigma, steps=1))
    assert len(ledger.entries) == 1 and ledger.steps == 40
    ledger.save(tmp_path / "ledger.json")
    (entry,) = json.loads((tmp_path / "ledger.json").read_text())["entries"]
    assert entry["sampling"] == "cyclic-poisson" and entry["groups"] == 4 and entry["steps"] == 40  # the ledger names the schema
    back = PrivacyLedger.load(tmp_path / "ledger.json")
    assert back.entries == ledger.entries and back.epsilon(1e-5, "rdp").epsilon == ans.epsilon
    at = lambda n: epsilon_for(replace(ev, noise_multiplier=sigma, steps=n), 1e-5, "rdp").epsilon  # noqa: E731
    assert at(37) == ans.epsilon > at(36)  # k = ceil(n / 4): 10 participations from step 37 on, 9 up to 36


def test_the_sampler_keeps_each_unit_in_its_group_and_samples_it_with_q():
    """N = 3000 in b = 5 groups, m = 30 expected: q = 30 / 600 = 0.05. Over n = 200 steps each unit
    is eligible in exactly n / b = 40 of them, so the (unit, step) inclusions are
    Binomial(N * 40, q): mean 6000, sd 75.5; seed 0 must land within 4 sd."""
    N, m, b, n = 3000, 30, 5, 200
    s = CyclicPoissonSchedule(N, m, b, n, seed=0)
    assert s.sampling_probability == 0.05 and s.max_participations == 40
    residues = [set() for _ in range(N)]
    counts = np.zeros(N, np.int64)
    for t in range(n):
        batch = s.sample(t)
        assert np.all(np.diff(batch) > 0) and batch.min() >= 0 and batch.max() < N
        counts[batch] += 1
        for u in batch:
            residues[u].add(t % b)
    assert all(len(r) <= 1 for r in residues)  # each unit only in the steps of one group: at least b apart
    trials = N * n // b
    mean, sd = trials * 0.05, math.sqrt(trials * 0.05 * 0.95)
    assert abs(counts.sum() - mean) < 4 * sd
    assert counts.max() <= s.max_participations
    again = CyclicPoissonSchedule(N, m, b, n, seed=0)  # deterministic by seed, whatever the order asked
    assert np.array_equal(again.sample(170), s.sample(170)) and np.array_equal(again.sample(3), s.sample(3))  # (3: drawn again)
    assert np.array_equal(again.sample(150), s.sample(150))
    assert not np.array_equal(CyclicPoissonSchedule(N, m, b, n, seed=1).sample(3), s.sample(3))


def test_a_schedule_that_breaks_the_participation_is_refused():
    s = CyclicPoissonSchedule(1000, 10, 4, 40, 0)
    with pytest.raises(PrivacyParameterError, match=r"^federated.dp.bands = 5 > federated.dp.groups = 4: amplified banded MF needs at most b bands"):
        s.check("federated.dp", 5, None, None)
    with pytest.raises(PrivacyParameterError, match=r"^privacy.min_separation = 6: privacy.groups = 4 lets one user take part again after 4 steps"):
        s.check("privacy", 4, None, 6)
    with pytest.raises(PrivacyParameterError, match=r"^--max-participations = 9: 40 steps over b = 4 groups let one user take part up to 10 times"):
        s.check("--", 4, 9, None)
    s.check("privacy", 4, 10, 4)  # the participation it keeps
    once = CyclicPoissonSchedule(1000, 10, 4, 4, 0)  # 4 steps over 4 groups: each user at most once, any separation holds
    assert once.max_participations == 1
    once.check("privacy", 4, 1, 50)
    with pytest.raises(PrivacyParameterError, match="needs N // b >= 300"):
        CyclicPoissonSchedule(1000, 300, 4, 40, 0)
    with pytest.raises(PrivacyParameterError, match="infinitely many bands"):
        AmplifiedBandMF.of(Strategy("blt", buf_decay=(0.9, 0.4), output_scale=(0.3, 0.1)), 1.0, s)
    with pytest.raises(PrivacyParameterError, match="bands = 5 > groups = 4"):
        AmplifiedBandMF(1.0, 1000, 10.0, 40, "user", 4, make_strategy("banded-mf", 5).coefs)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(mechanism="blt"), "sampling = 'cyclic-poisson' amplifies banded MF only: BLT has infinitely many bands"),
        (dict(mechanism="banded-mf", bands=4, groups=3), "bands = 4 > groups = 3: amplified banded MF needs at most b bands"),
        (dict(mechanism="gaussian"), "sampling = 'cyclic-poisson' is the schedule of the correlated-noise mechanisms; set mechanism = 'banded-mf'"),
    ],
)
def test_the_config_refuses_what_amplification_does_not_cover(kw, message):
    with pytest.raises(ValueError, match=message):
        PrivacyConfig(clip_norm=1.0, noise_multiplier=1.0, delta=1e-5, sampling="cyclic-poisson", **kw)
    dp = {k: v for k, v in kw.items()} | {"noise_multiplier": 1.0, "delta": 1e-5}
    with pytest.raises(ValueError, match=message.replace("set mechanism", "set dp.mechanism").replace("is the schedule", "is the cohort schedule")):
        FederatedConfig(strategy="dp-fedavg", rounds=3, clients_per_round=2, clip_norm=1.0, sampling="cyclic-poisson", dp=dp)


def test_groups_needs_cyclic_poisson_and_defaults_to_bands():
    with pytest.raises(ValueError, match="groups applies to sampling = 'cyclic-poisson'"):
        PrivacyConfig(clip_norm=1.0, noise_multiplier=1.0, delta=1e-5, mechanism="banded-mf", bands=2, groups=4)
    cfg = FederatedConfig(strategy="dp-fedavg", rounds=3, clients_per_round=2, clip_norm=1.0, sampling="cyclic-poisson",
                          dp={"mechanism": "banded-mf", "bands": 3, "noise_multiplier": 1.0, "delta": 1e-5, "accountant": "pld"})
    from fedpriv.config import amplified_groups

    assert amplified_groups(cfg.dp) == 3


def test_the_docstring_examples_run_and_the_audit_compares_under_add_or_remove():
    import doctest

    import fedpriv.privacy.amplified as amplified
    from fedpriv.memorization.empirical import audit_relations

    result = doctest.testmod(amplified, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
    rel = audit_relations("user", "cyclic-poisson")  # each unit's group is its own draw: add-or-remove, as the canaries
    assert rel["accountant_relation"] == "add-or-remove-one user" and rel["accountant_bounds_audit"] is True
