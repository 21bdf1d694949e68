"""DP-FedAvg with amplified banded MF (sampling = "cyclic-poisson"): the cohorts, the guarantee,
a bitwise resume after a kill, and the refusal of a schedule that breaks the participation."""

from __future__ import annotations


import pytest
from federated_helpers import train_cut_and_resume, write_config

from fedpriv.engines.setup import FederatedSetup
from fedpriv.errors import PrivacyParameterError
from fedpriv.privacy.amplified import AmplifiedBandMF, CyclicPoissonSchedule
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.rundir import LEDGER
from fedpriv.runner.prepare import prepare

AMPLIFIED = (
    'strategy = "dp-fedavg"\nclip_norm = 0.3\nsampling = "cyclic-poisson"\n'
    'dp = { mechanism = "banded-mf", bands = 2, groups = 3, target_epsilon = 8.0, delta = 1e-3 }\nserver_optimizer = "momentum"'
)


@pytest.mark.slow
def test_amplified_banded_mf_dp_fedavg_trains_and_resumes_bitwise(tmp_path):
    cfg = write_config(tmp_path, extra=AMPLIFIED)
    full = train_cut_and_resume(cfg, tmp_path)
    rows = [r for r in full.history if r["split"] == "train"]
    assert 7.99 < rows[-1]["epsilon"] <= 8.0
    assert all("user-level, add-or-remove-one user; banded MF, 2 band(s)" in r["guarantee"] and "b = 3 groups" in r["guarantee"] for r in rows)
    ledger = PrivacyLedger.load(tmp_path / "cut" / LEDGER)
    assert ledger.steps == 3 and isinstance(ledger.entries[0], AmplifiedBandMF) and ledger.entries[0].groups == 3


def test_cohorts_are_poisson_samples_of_the_round_s_group(tmp_path):
    setup = FederatedSetup(prepare(write_config(tmp_path, extra=AMPLIFIED.replace("target_epsilon = 8.0", "noise_multiplier = 1.0"))))
    core = setup.core
    s = core.sampler
    assert isinstance(s, CyclicPoissonSchedule) and s.groups == 3 and core.m == 6
    assert s.sampling_probability == 6 / (core.population // 3)
    cohorts = [s.sample(r) for r in range(1, 4)]
    assert not (set(cohorts[0].tolist()) & set(cohorts[1].tolist())) and not (set(cohorts[1].tolist()) & set(cohorts[2].tolist()))
    assert isinstance(core.budget.event, AmplifiedBandMF) and core.budget.event.sampling_probability == s.sampling_probability


def test_a_schedule_that_breaks_the_stated_participation_is_refused_before_training(tmp_path):
    p = write_config(tmp_path, extra=AMPLIFIED.replace("target_epsilon = 8.0", "target_epsilon = 8.0, max_participations = 1"))
    FederatedSetup(prepare(p))  # rounds 1, 2, 3: each group eligible once
    p.write_text(p.read_text().replace("rounds = 3", "rounds = 4"))
    with pytest.raises(PrivacyParameterError, match=r"^federated.dp.max_participations = 1: 4 steps over b = 3 groups let one user take part up to 2 times"):
        FederatedSetup(prepare(p))
    p.write_text(p.read_text().replace("max_participations = 1", "min_separation = 4"))
    with pytest.raises(PrivacyParameterError, match=r"^federated.dp.min_separation = 4: federated.dp.groups = 3 lets one user take part again after 3 steps"):
        FederatedSetup(prepare(p))
