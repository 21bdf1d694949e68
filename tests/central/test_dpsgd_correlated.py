"""DP-SGD with correlated noise (privacy.mechanism = banded-mf / blt): the cyclic schedule, the
guarantee, training end to end and a bitwise resume after a kill (under --secure-noise with no
noise state in the checkpoints: replayed)."""

import jax
import numpy as np
import optax
import pytest
from central_helpers import flat, run, shakespeare_nwp, tcfg
from flax import serialization

from fedpriv.central.dpsgd import DPSGDStepper
from fedpriv.config import PrivacyConfig
from fedpriv.errors import PrivacyParameterError
from fedpriv.privacy.correlated import CorrelatedSteps
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.privacy.streams import CORRELATED_SIMULATION_NOTE, SECURE_NOTE, SIMULATION_NOTE, NoiseSeed
from fedpriv.rundir import LEDGER, RunDir
from fedpriv.training.noise import SECRET_ENV, read_secret

SECRET = "00112233445566778899aabbccddeeff"


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
    assert set(checkpoint_entries(tmp_path / "part")) == {"params", "opt_state", "noise"}  # a simulation checkpoints its noise state, as before
    rest, _ = run(task, arrays, counts, tmp_path, "part", dp, cfg)
    np.testing.assert_array_equal(flat(rest.params), flat(full.params))
    assert (tmp_path / "part" / "metrics.jsonl").read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()
    ledger = PrivacyLedger.load(tmp_path / "part" / LEDGER)
    assert ledger.steps == 6 and isinstance(ledger.entries[0], CorrelatedSteps)
    row = [r for r in full.history if r["split"] == "train"][-1]
    assert 7.99 < row["epsilon"] <= 8.0
    assert "example-level, zero-out-one example; BLT, 2 buffer(s)" in row["guarantee"] and "k = 1" in row["guarantee"]
    assert np.all(np.isfinite(flat(full.params))) and not np.array_equal(flat(full.params), flat(task.init_params(jax.random.split(jax.random.key(0))[0])))


def checkpoint_entries(run_dir) -> dict:
    """The top-level entries of a run directory's checkpoint state file."""
    meta = RunDir(run_dir).checkpoint_meta()
    return serialization.msgpack_restore((run_dir / meta["state_file"]).read_bytes())


@pytest.mark.slow
def test_secure_blt_dpsgd_checkpoints_no_noise_state_and_resumes_bitwise_by_replay(nwp, tmp_path, monkeypatch):
    """Under --secure-noise the checkpoint holds parameters and optimizer state only (BLT's first
    buffer, the running sum of the draws, would reveal the noise); the resumed run rebuilds the
    buffers by replaying Z_0..Z_2 from the secret and ends bit for bit where an unbroken run ends."""
    task, arrays, counts = nwp
    monkeypatch.setenv(SECRET_ENV, SECRET)
    secret = NoiseSeed.from_secret(read_secret())
    dp = PrivacyConfig(clip_norm=0.5, noise_multiplier=1.0, delta=1e-5, mechanism="blt", buffers=2, secure_noise=True)
    cfg = tcfg()
    full, stepper = run(task, arrays, counts, tmp_path, "full", dp, cfg, noise=secret)
    assert stepper.budget.note == SECURE_NOTE
    assert set(checkpoint_entries(tmp_path / "full")) == {"params", "opt_state"}
    run(task, arrays, counts, tmp_path, "part", dp, cfg, noise=secret, stop_after=3)
    assert set(checkpoint_entries(tmp_path / "part")) == {"params", "opt_state"}
    said: list[str] = []
    rest, _ = run(task, arrays, counts, tmp_path, "part", dp, cfg, noise=secret, log=said.append)
    assert "rebuilding the correlated noise state: replaying 3 draws" in said
    np.testing.assert_array_equal(flat(rest.params), flat(full.params))
    assert (tmp_path / "part" / "metrics.jsonl").read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()
    sim, _ = run(task, arrays, counts, tmp_path, "sim", dp.model_copy(update={"secure_noise": False}), cfg)
    assert not np.array_equal(flat(sim.params), flat(full.params))  # the secret's draws, not the seed's


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
    line = lambda unit: DPSGDStepper(task, arrays, tcfg(), PrivacyConfig(clip_norm=0.5, noise_multiplier=1.0, delta=1e-5, unit=unit, **({"examples_per_user": 2} if unit == "user" else {})), 0,  # noqa: E731
                                     optax.sgd(0.1), 6, user_counts=counts).describe(3, {"loss": 1.0}, [], 1.5, 3)
    assert line("user").endswith(f"{3 * 32 / 1.5:.0f} users/s")
    assert line("example").endswith(f"{3 * 32 / 1.5:.0f} examples/s")


def test_a_correlated_runs_guarantee_says_where_its_noise_can_be_read(nwp):
    """A correlated simulation says that its seed and its checkpoints (the noise state) reveal the
    noise and that a released model needs --secure-noise; a secure correlated run carries SECURE_NOTE
    and keeps no noise state in its checkpoints, a simulation keeps it (as before)."""
    task, arrays, counts = nwp
    make = lambda mech, noise=None: DPSGDStepper(task, arrays, tcfg(), PrivacyConfig(clip_norm=0.5, noise_multiplier=1.0, delta=1e-5, mechanism=mech), 0,  # noqa: E731
                                                 optax.sgd(0.1), 6, user_counts=counts, noise=noise)
    sim = make("blt")
    assert sim.budget.note == CORRELATED_SIMULATION_NOTE and "checkpoint holds the correlated noise state" in CORRELATED_SIMULATION_NOTE
    assert "a released model needs --secure-noise" in CORRELATED_SIMULATION_NOTE
    assert make("gaussian").budget.note == SIMULATION_NOTE
    secure = make("blt", NoiseSeed.from_secret(bytes.fromhex(SECRET)))
    assert secure.budget.note == SECURE_NOTE
    state = secure.init_state(task.init_params(jax.random.key(0)))
    assert set(state) == {"params", "opt_state", "noise"}
    assert set(secure.checkpoint_state(state)) == {"params", "opt_state"} and sim.checkpoint_state(state) is state


@pytest.mark.slow
def test_optimized_banded_mf_dpsgd_resumes_bitwise_from_its_stored_strategy(nwp, tmp_path, monkeypatch):
    """coefficients = "optimized": the killed run's resume reads strategy.json back (the optimizer
    made to fail) and ends bit for bit where the unbroken run ends; the noise is calibrated for the
    optimized strategy (epsilon 8 reached, the guarantee names it)."""
    from fedpriv.central.train import train_central
    from fedpriv.privacy import optimized
    from fedpriv.rundir import STRATEGY

    task, arrays, counts = nwp
    dp = PrivacyConfig(clip_norm=0.5, target_epsilon=8.0, delta=1e-5, mechanism="banded-mf", bands=3, coefficients="optimized")
    cfg = tcfg()

    def go(name, **kw):
        RunDir(tmp_path / name).create()  # (as train_prepared_central does before building the stepper)
        stepper = DPSGDStepper(task, arrays, cfg, dp, 0, optax.sgd(cfg.learning_rate), cfg.steps, user_counts=counts, strategy_file=tmp_path / name / STRATEGY)
        return train_central(task, arrays, counts, cfg, 0, tmp_path / name, stepper=stepper, **kw), stepper

    full, stepper = go("full")
    assert not stepper.strategy.fixed and len(stepper.strategy.coefs) == 3
    go("part", stop_after=3)
    monkeypatch.setattr(optimized, "optimize_strategy", lambda _spec: (_ for _ in ()).throw(AssertionError("optimized again on resume")))
    rest, again = go("part")
    assert again.strategy == stepper.strategy
    np.testing.assert_array_equal(flat(rest.params), flat(full.params))
    assert (tmp_path / "part" / "metrics.jsonl").read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()
    assert PrivacyLedger.load(tmp_path / "part" / LEDGER).entries[0].coefs == stepper.strategy.coefs
    row = [r for r in full.history if r["split"] == "train"][-1]
    assert 7.99 < row["epsilon"] <= 8.0 and "banded MF, 3 band(s) (numerically optimized by jax-privacy" in row["guarantee"]
