"""DP-SGD with correlated noise (privacy.mechanism = banded-mf / blt): the cyclic schedule, the
guarantee, training end to end and a bitwise resume after a kill."""

import jax
import numpy as np
import optax
import pytest
from central_helpers import flat, run, shakespeare_nwp, tcfg

from fedpriv.central.dpsgd import DPSGDStepper
from fedpriv.config import PrivacyConfig
from fedpriv.errors import PrivacyParameterError
from fedpriv.privacy.correlated import CorrelatedSteps
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.rundir import LEDGER


@pytest.fixture(scope="module")
def nwp():
    return shakespeare_nwp()


@pytest.mark.slow
def test_blt_dpsgd_trains_and_resumes_bitwise(nwp, tmp_path):
    task, arrays, counts = nwp
    dp = PrivacyConfig(clip_norm=0.5, target_epsilon=8.0, delta=1e-5, mechanism="blt", buffers=2)
    cfg = tcfg()
    full, stepper = run(task, arrays, counts, tmp_path, "full", dp, cfg)
    assert stepper.schedule is not None and stepper.schedule.groups == len(arrays["mask"]) // 32
    assert [len(stepper.sample(t)) for t in range(6)] == [32] * 6
    run(task, arrays, counts, tmp_path, "part", dp, cfg, stop_after=3)
    rest, _ = run(task, arrays, counts, tmp_path, "part", dp, cfg)
    np.testing.assert_array_equal(flat(rest.params), flat(full.params))
    assert (tmp_path / "part" / "metrics.jsonl").read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()
    ledger = PrivacyLedger.load(tmp_path / "part" / LEDGER)
    assert ledger.steps == 6 and isinstance(ledger.entries[0], CorrelatedSteps)
    row = [r for r in full.history if r["split"] == "train"][-1]
    assert 7.99 < row["epsilon"] <= 8.0
    assert "example-level, zero-out-one example; BLT, 2 buffer(s)" in row["guarantee"] and "k = 1" in row["guarantee"]
    assert np.all(np.isfinite(flat(full.params))) and not np.array_equal(flat(full.params), flat(task.init_params(jax.random.split(jax.random.key(0))[0])))


@pytest.mark.slow
def test_user_level_banded_mf_samples_groups_of_users(nwp, tmp_path):
    task, arrays, counts = nwp
    dp = PrivacyConfig(clip_norm=0.5, noise_multiplier=1.0, delta=1e-5, unit="user", examples_per_user=2, mechanism="banded-mf", bands=2)
    cfg = tcfg(batch_size=4, steps=3, eval_every=3, checkpoint_every=3)
    res, stepper = run(task, arrays, counts, tmp_path, "user", dp, cfg)
    users = np.repeat(np.arange(len(counts)), counts)
    groups = [set(users[stepper.sample(t)[:, 0]].tolist()) for t in range(3)]
    assert all(len(g) == 4 for g in groups) and not (groups[0] & groups[1]) and not (groups[1] & groups[2])
    b = stepper.schedule.groups
    assert set(stepper.schedule.sample(0).tolist()) == groups[0] and np.array_equal(stepper.schedule.sample(b), stepper.schedule.sample(0))
    row = [r for r in res.history if r["split"] == "train"][-1]
    assert "user-level, zero-out-one user; banded MF, 2 band(s)" in row["guarantee"] and f"b = {b} " in row["guarantee"]


def test_a_schedule_that_breaks_the_stated_participation_is_refused(nwp):
    task, arrays, counts = nwp
    n = len(arrays["mask"])
    dp = PrivacyConfig(clip_norm=0.5, noise_multiplier=1.0, delta=1e-5, mechanism="banded-mf", bands=1, max_participations=1)
    steps = n // 32 + 1  # one step more than the groups: the first group comes back
    with pytest.raises(PrivacyParameterError, match="privacy.max_participations = 1: .* take part 2 times"):
        DPSGDStepper(task, arrays, tcfg(steps=steps), dp, 0, optax.sgd(0.1), steps, user_counts=counts)


def test_the_progress_line_counts_what_the_batch_counts(nwp):
    """training.batch_size is users under user-level DP-SGD: the progress rate says users/s."""
    task, arrays, counts = nwp
    line = lambda unit: DPSGDStepper(task, arrays, tcfg(), PrivacyConfig(clip_norm=0.5, noise_multiplier=1.0, delta=1e-5, unit=unit, examples_per_user=2), 0,  # noqa: E731
                                     optax.sgd(0.1), 6, user_counts=counts).describe(3, {"loss": 1.0}, [], 1.5, 3)
    assert line("user").endswith(f"{3 * 32 / 1.5:.0f} users/s")
    assert line("example").endswith(f"{3 * 32 / 1.5:.0f} examples/s")


def test_a_correlated_runs_guarantee_does_not_point_to_secure_noise_it_refuses(nwp):
    """--secure-noise is refused with banded-mf/blt, so their guarantee must not say a released model needs it."""
    from fedpriv.privacy.streams import CORRELATED_SIMULATION_NOTE, SIMULATION_NOTE

    task, arrays, counts = nwp
    make = lambda mech: DPSGDStepper(task, arrays, tcfg(), PrivacyConfig(clip_norm=0.5, noise_multiplier=1.0, delta=1e-5, mechanism=mech), 0,  # noqa: E731
                                     optax.sgd(0.1), 6, user_counts=counts)
    assert make("blt").budget.note == CORRELATED_SIMULATION_NOTE and "--secure-noise is not available" in CORRELATED_SIMULATION_NOTE
    assert make("gaussian").budget.note == SIMULATION_NOTE
