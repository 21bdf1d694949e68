"""DP-SGD with amplified banded MF (privacy.sampling = "cyclic-poisson"): example-level batches
Poisson-sampled from the step's group, user-level DP-SGD trained end to end with a bitwise resume
after a kill."""

import numpy as np
import optax
import pytest
from central_helpers import flat, run, shakespeare_nwp, tcfg

from fedpriv.central.dpsgd import DPSGDStepper
from fedpriv.config import PrivacyConfig
from fedpriv.privacy.amplified import AmplifiedBandMF, CyclicPoissonSchedule
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.rundir import LEDGER


@pytest.fixture(scope="module")
def nwp():
    return shakespeare_nwp()


def test_example_level_batches_are_poisson_samples_of_the_step_s_group(nwp):
    task, arrays, counts = nwp
    n = len(arrays["mask"])
    dp = PrivacyConfig(clip_norm=0.5, noise_multiplier=1.0, delta=1e-5, mechanism="banded-mf", bands=2, groups=4, sampling="cyclic-poisson")
    stepper = DPSGDStepper(task, arrays, tcfg(steps=12), dp, 0, optax.sgd(0.1), 12, user_counts=counts)
    s = stepper.schedule
    assert isinstance(s, CyclicPoissonSchedule) and s.groups == 4 and s.sampling_probability == 32 / (n // 4)
    batches = [stepper.sample(t) for t in range(12)]
    seen = {}
    for t, batch in enumerate(batches):
        for u in batch.tolist():
            assert seen.setdefault(u, t % 4) == t % 4  # an example only in the steps of its group
    assert len({len(b) for b in batches}) > 1  # Poisson: the batch size varies (the denominator stays 32)
    ev = stepper.budget.event
    assert isinstance(ev, AmplifiedBandMF) and ev.unit == "example" and ev.groups == 4


@pytest.mark.slow
def test_user_level_amplified_banded_mf_trains_and_resumes_bitwise(nwp, tmp_path):
    task, arrays, counts = nwp
    dp = PrivacyConfig(clip_norm=0.5, target_epsilon=8.0, delta=1e-5, unit="user", examples_per_user=2, mechanism="banded-mf", bands=2,
                       groups=2, sampling="cyclic-poisson")
    cfg = tcfg(batch_size=4)
    full, stepper = run(task, arrays, counts, tmp_path, "full", dp, cfg)
    users = np.repeat(np.arange(len(counts)), counts)
    groups = [set(users[stepper.sample(t)[:, 0]].tolist()) for t in range(6)]
    assert not (set().union(*groups[0::2]) & set().union(*groups[1::2]))  # a user only in even or only in odd steps
    run(task, arrays, counts, tmp_path, "part", dp, cfg, stop_after=3)
    rest, _ = run(task, arrays, counts, tmp_path, "part", dp, cfg)
    np.testing.assert_array_equal(flat(rest.params), flat(full.params))
    assert (tmp_path / "part" / "metrics.jsonl").read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()
    ledger = PrivacyLedger.load(tmp_path / "part" / LEDGER)
    assert ledger.steps == 6 and isinstance(ledger.entries[0], AmplifiedBandMF)
    row = [r for r in full.history if r["split"] == "train"][-1]
    assert 7.99 < row["epsilon"] <= 8.0
    assert "user-level, add-or-remove-one user; banded MF, 2 band(s)" in row["guarantee"] and "k = 3 times, at least b = 2 steps apart" in row["guarantee"]
    assert np.all(np.isfinite(flat(full.params)))
