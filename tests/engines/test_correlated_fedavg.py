"""DP-FedAvg with correlated noise (federated.dp.mechanism = blt): the cyclic cohorts, the
guarantee, a bitwise resume after a kill (under secure_noise with no noise state in the
checkpoints: replayed), and the config's refusals."""

from __future__ import annotations


import jax.numpy as jnp
import numpy as np
import pytest
from federated_helpers import BLT, SECURE_BLT, train_cut_and_resume, write_config
from flax import serialization

from fedpriv.config import FederatedConfig, load_config
from fedpriv.engines.setup import FederatedSetup
from fedpriv.errors import ConfigError, PrivacyParameterError
from fedpriv.privacy.streams import SECURE_NOTE
from fedpriv.rundir import RunDir
from fedpriv.runner.prepare import prepare
import fedpriv.training.noise as noise_module
from fedpriv.training.noise import SECRET_ENV

SECRET = "00112233445566778899aabbccddeeff"


@pytest.mark.slow
def test_blt_dp_fedavg_trains_and_resumes_bitwise(tmp_path):
    cfg = write_config(tmp_path, extra=BLT)
    full = train_cut_and_resume(cfg, tmp_path)
    assert checkpoint_entries(tmp_path / "cut") == {"params", "opt", "clip", "noise"}  # a simulation checkpoints its noise state, as before
    rows = [r for r in full.history if r["split"] == "train"]
    assert 7.99 < rows[-1]["epsilon"] <= 8.0 and rows[0]["epsilon"] < rows[-1]["epsilon"]
    assert all("user-level, zero-out-one user; BLT, 2 buffer(s)" in r["guarantee"] and "fixed groups of 6" in r["guarantee"] for r in rows)


def checkpoint_entries(run_dir) -> set[str]:
    """The top-level entries of a run directory's checkpoint state file."""
    meta = RunDir(run_dir).checkpoint_meta()
    return set(serialization.msgpack_restore((run_dir / meta["state_file"]).read_bytes()))


@pytest.mark.slow
def test_secure_blt_dp_fedavg_checkpoints_no_noise_state_and_resumes_bitwise_by_replay(tmp_path, monkeypatch):
    """Under secure_noise the server checkpoint holds parameters, server optimizer and clip state
    only; the resumed run (cut after round 1) rebuilds BLT's buffers by replaying Z_1 from the secret
    and ends bit for bit where an unbroken run ends; the guarantee carries SECURE_NOTE."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    monkeypatch.setattr(noise_module, "fresh_nonce", lambda: bytes(16))  # the unbroken and the cut run start with one nonce (each start draws its own)
    full = train_cut_and_resume(write_config(tmp_path, extra=SECURE_BLT), tmp_path)
    assert checkpoint_entries(tmp_path / "full") == checkpoint_entries(tmp_path / "cut") == {"params", "opt", "clip"}
    rows = [r for r in full.history if r["split"] == "train"]
    assert all(r["guarantee"].endswith(SECURE_NOTE) for r in rows)


def test_the_server_rebuilds_its_noise_state_from_the_secret_and_says_so(tmp_path, monkeypatch):
    """ServerCore: a secure BLT state leaves ``noise`` out of its checkpoint, and the state rebuilt
    after 3 rounds is the one the rounds left, bit for bit (a simulation's is kept unchanged)."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    core = FederatedSetup(prepare(write_config(tmp_path, extra=SECURE_BLT))).core
    state = core.init_state({"w": jnp.linspace(-1.0, 1.0, 6)})
    for r in (1, 2, 3):
        state, _ = core.finish_round(state, r, core.accumulator(state))
    stored = core.checkpoint_state(state)
    assert set(stored) == {"params", "opt", "clip"}
    said: list[str] = []
    rebuilt = core.restore_state(stored, 3, said.append)
    assert said == ["rebuilding the correlated noise state: replaying 3 draws"]
    assert jnp.any(state["noise"]["w"] != 0) and bool(jnp.array_equal(rebuilt["noise"]["w"], state["noise"]["w"]))
    assert not bool(jnp.array_equal(core.restore_state(stored, 2, said.append)["noise"]["w"], state["noise"]["w"]))


def test_cohorts_are_the_cyclic_groups(tmp_path):
    setup = FederatedSetup(prepare(write_config(tmp_path, extra=BLT.replace('mechanism = "blt", buffers = 2, target_epsilon = 8.0', 'mechanism = "banded-mf", bands = 1, noise_multiplier = 1.0'))))
    core = setup.core
    b = core.sampler.groups
    assert b == core.population // 6
    cohorts = [core.sampler.sample(r) for r in range(1, b + 2)]
    assert all(len(c) == 6 for c in cohorts)
    assert len(set(np.concatenate(cohorts[:b]).tolist())) == 6 * b  # every group once in b rounds
    assert np.array_equal(cohorts[0], cohorts[b])  # then again


@pytest.mark.parametrize(
    "fed, message",
    [
        (dict(sampling="poisson"), "runs the cyclic cohort schedule it is accounted for .* not 'poisson' sampling; set sampling = 'cyclic' or drop it"),
        (dict(sampling="cyclic", dp={"noise_multiplier": 1.0, "delta": 1e-5}), "sampling = 'cyclic' is the cohort schedule of the correlated-noise mechanisms"),
        (dict(dp={"mechanism": "blt", "noise_multiplier": 1.0, "delta": 1e-5, "adaptive_clip": True}), "adaptive_clip is not supported"),
        (dict(dp={"mechanism": "banded-mf", "noise_multiplier": 1.0, "delta": 1e-5}), "needs bands"),
        (dict(dp={"mechanism": "gaussian", "bands": 2, "noise_multiplier": 1.0, "delta": 1e-5}), "bands applies to mechanism"),
        (dict(dp={"mechanism": "blt", "target_epsilon": 1.0, "epsilon_budget": 1.0, "delta": 1e-5}), "epsilon_budget is not supported"),
        (dict(dp={"mechanism": "gaussian", "coefficients": "optimized", "noise_multiplier": 1.0, "delta": 1e-5}), "coefficients applies to mechanism = 'banded-mf' or 'blt'"),
        (dict(dp={"mechanism": "blt", "coefficients": "best", "noise_multiplier": 1.0, "delta": 1e-5}), "Input should be 'fixed' or 'optimized'"),
    ],
)
def test_config_refuses_what_the_accountant_does_not_cover(fed, message):
    base = dict(strategy="dp-fedavg", rounds=3, clients_per_round=2, clip_norm=1.0, dp={"mechanism": "blt", "noise_multiplier": 1.0, "delta": 1e-5})
    base.update(fed)
    with pytest.raises(ValueError, match=message):
        FederatedConfig(**base)


def test_cyclic_may_be_named_over_an_inherited_fixed_sampling():
    cfg = FederatedConfig(strategy="dp-fedavg", rounds=3, clients_per_round=2, clip_norm=1.0, sampling="cyclic", dp={"mechanism": "blt", "target_epsilon": 8.0, "delta": 1e-5, "accountant": "pld"})
    assert cfg.sampling == "cyclic" and cfg.dp.accountant == "pld"


def test_too_many_rounds_for_the_stated_participation_are_refused(tmp_path):
    extra = 'strategy = "dp-fedavg"\nclip_norm = 0.3\ndp = { mechanism = "banded-mf", bands = 1, noise_multiplier = 1.0, delta = 1e-3, max_participations = 1 }'
    p = write_config(tmp_path, extra=extra.replace("[federated]", ""))
    text = p.read_text().replace("rounds = 3", "rounds = 100")
    p.write_text(text)
    with pytest.raises(PrivacyParameterError, match=r"federated.dp.max_participations = 1: 100 steps over \d+ groups of 6"):
        FederatedSetup(prepare(p))


OPTIMIZED_BMF = BLT.replace('mechanism = "blt", buffers = 2', 'mechanism = "banded-mf", bands = 2, coefficients = "optimized"')


@pytest.mark.slow
def test_optimized_banded_mf_dp_fedavg_stores_its_strategy_and_resumes_bitwise_without_optimizing(tmp_path, monkeypatch):
    """coefficients = "optimized": the strategy is optimized once before round 1 and stored in the run
    directory with what it was optimized for; the run cut after round 1 resumes bit for bit reading it
    back (the optimizer made to fail on resume), and the ledger's events carry its coefficients."""
    import json

    from fedpriv.engines.vectorized import run_vectorized
    from fedpriv.privacy import optimized
    from fedpriv.privacy.ledger import PrivacyLedger
    from fedpriv.rundir import LEDGER, STRATEGY
    from federated_helpers import leaves_max_diff

    cfg = write_config(tmp_path, extra=OPTIMIZED_BMF)
    said: list[str] = []
    full = run_vectorized(prepare(cfg), tmp_path / "full", log=said.append)
    assert any(m.startswith("optimized strategy in ") for m in said)
    stored = json.loads((tmp_path / "full" / STRATEGY).read_text())
    assert stored["spec"]["mechanism"] == "banded-mf" and stored["spec"]["steps"] == 3 and stored["spec"]["size"] == 2
    coefs = tuple(stored["strategy"]["coefs"])
    assert [e.coefs for e in PrivacyLedger.load(tmp_path / "full" / LEDGER).entries] == [coefs]
    assert run_vectorized(prepare(cfg), tmp_path / "cut", stop_after=1).done == 1
    cut = json.loads((tmp_path / "cut" / STRATEGY).read_text())
    assert (cut["spec"], cut["strategy"]) == (stored["spec"], stored["strategy"])

    def refuse(_spec):
        raise AssertionError("optimized again on resume")

    monkeypatch.setattr(optimized, "optimize_strategy", refuse)
    said.clear()
    resumed = run_vectorized(prepare(cfg), tmp_path / "cut", log=said.append)
    assert resumed.done == 3 and leaves_max_diff(full.params, resumed.params) == 0.0
    assert f"optimized strategy read from {tmp_path / 'cut' / STRATEGY} (not optimized again)" in said
    strip = lambda p: [{k: v for k, v in json.loads(x).items() if k != "round_seconds"} for x in p.read_text().splitlines()]  # noqa: E731
    assert strip(tmp_path / "full" / "metrics.jsonl") == strip(tmp_path / "cut" / "metrics.jsonl")
    rows = [r for r in full.history if r["split"] == "train"]
    assert 7.99 < rows[-1]["epsilon"] <= 8.0 and "banded MF, 2 band(s) (numerically optimized by jax-privacy" in rows[-1]["guarantee"]


def test_optimized_banded_mf_with_more_bands_than_groups_is_refused_before_training(tmp_path):
    p = write_config(tmp_path, extra=OPTIMIZED_BMF.replace("bands = 2", "bands = 400"))
    with pytest.raises(PrivacyParameterError, match=r"federated.dp.coefficients = 'optimized' with federated.dp.bands = 400 > the cyclic schedule's groups N // m = \d+"):
        FederatedSetup(prepare(p))


def test_a_client_setup_builds_no_strategy_budget_or_calibration(tmp_path, monkeypatch):
    """A ClientApp's setup (``client=True``) adds no noise: it never optimizes a strategy (which can
    take tens of seconds per client process) nor calibrates, and keeps no budget; its accumulator
    clips to the S it is given, as the server's does, and its sampler is the server's."""
    from fedpriv.privacy import optimized
    from fedpriv.strategies import server as server_module

    def refuse(*_a, **_k):
        raise AssertionError("a client process optimized or calibrated")

    cfg = write_config(tmp_path, extra=OPTIMIZED_BMF)  # target_epsilon: the server calibrates
    server = FederatedSetup(prepare(cfg))
    monkeypatch.setattr(optimized, "optimize_strategy", refuse)
    monkeypatch.setattr(server_module, "DPBudget", refuse)
    client = FederatedSetup(prepare(cfg), client=True)
    assert client.core.budget is None and server.core.budget is not None
    assert client.core.noising_matrix is None and server.core.noising_matrix is not None
    assert [client.core.sampler.sample(r).tolist() for r in (1, 2, 3)] == [server.core.sampler.sample(r).tolist() for r in (1, 2, 3)]
    params = server.initial_params()
    a, b = client.core.make_accumulator(params, 0.25), server.core.make_accumulator(params, 0.25)
    assert (a.clip_norm, a.weighted) == (b.clip_norm, b.weighted) == (0.25, False)
    with pytest.raises(RuntimeError, match="cannot finish a DP-FedAvg round"):  # never a noiseless private round
        client.core.finish_round({"params": params, "clip": 0}, 1, a)
