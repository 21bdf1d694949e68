"""Simulation vs released noise (issue 30, point 1): a training run's guarantee says that its noise
is reproducible from its seed; --secure-noise draws the noise and the sampling from a secret that
is never stored, and a resumed secure run refuses to go on without that same secret."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from fedpriv.config import load_config
from fedpriv.errors import ConfigError
from fedpriv.privacy.streams import SECURE_NOTE, SIMULATION_NOTE
from fedpriv.rundir import RunDir
from fedpriv.runner.dispatch import train_run
from fedpriv.runner.prepare import prepare
import fedpriv.training.noise as noise_module
from fedpriv.training.noise import KEYING, SECRET_ENV, noise_seed, with_secure_noise

BASE = """
name = "noise"
seed = 5
[data]
source = "synthetic:users=30,examples=300"
[vocab]
size = 100
seq_len = 8
[task]
kind = "nwp"
model = "tiny"
[training]
optimizer = "adam"
learning_rate = 0.01
batch_size = 8
steps = 4
eval_every = 2
checkpoint_every = 2
"""
DP_SGD = "[privacy]\nclip_norm = 1.0\nnoise_multiplier = 1.0\ndelta = 1e-4\n"
SECRET = "00112233445566778899aabbccddeeff"


def config(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return load_config(path)


def params(run):
    import jax

    return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(RunDir(run).read_params_tree())])


def train_rows(run):
    return [r for r in RunDir(run).metrics() if r["split"] == "train"]


@pytest.mark.slow
def test_secure_noise_is_secret_and_resumes_only_with_its_secret(tmp_path, monkeypatch):
    sim = prepare(config(tmp_path, BASE + DP_SGD))
    train_run(sim, tmp_path / "sim", "central")
    assert all(r["guarantee"].endswith(SIMULATION_NOTE) for r in train_rows(tmp_path / "sim"))

    secure = dataclasses.replace(sim, config=with_secure_noise(sim.config))  # the same data, prepared once
    monkeypatch.setenv(SECRET_ENV, SECRET)
    train_run(secure, tmp_path / "other", "central")  # a start of its own: a nonce of its own
    nonce = bytes(range(16))
    monkeypatch.setattr(noise_module, "fresh_nonce", lambda: nonce)  # "full" and "part" start with one nonce, so they draw the same noise
    train_run(secure, tmp_path / "full", "central")
    train_run(secure, tmp_path / "part", "central", stop_after=2)
    monkeypatch.setattr(noise_module, "fresh_nonce", lambda: pytest.fail("a resume draws no new nonce"))
    meta = json.loads((tmp_path / "part" / "config.json").read_text())
    noise = noise_seed(secure.config, tmp_path / "part")
    assert meta["noise"] == {"secure": True, "secret_sha256": noise.fingerprint, "keying": KEYING, "nonce": nonce.hex(), "run_sha256": noise.run_digest}
    assert SECRET not in (tmp_path / "part" / "config.json").read_text()
    # Resuming without the secret, or with another one, is refused in one line before any step.
    monkeypatch.delenv(SECRET_ENV)
    with pytest.raises(ConfigError, match=f"resuming a --secure-noise run needs its secret: set {SECRET_ENV}"):
        train_run(secure, tmp_path / "part", "central")
    monkeypatch.setenv(SECRET_ENV, "ff" * 16)
    with pytest.raises(ConfigError, match="is not the secret this --secure-noise run started with"):
        train_run(secure, tmp_path / "part", "central")
    monkeypatch.setenv(SECRET_ENV, SECRET)
    # A run keyed otherwise (started by an older fedpriv: no keying recorded) would replay other noise: refused.
    stored = (tmp_path / "part" / "config.json").read_text()
    older = json.loads(stored)
    del older["noise"]["keying"], older["noise"]["run_sha256"], older["noise"]["nonce"]
    (tmp_path / "part" / "config.json").write_text(json.dumps(older))
    with monkeypatch.context() as m:
        m.setattr(noise_module, "fresh_nonce", lambda: nonce)  # (no nonce recorded: a fresh one, even the same, keys other noise)
        with pytest.raises(ConfigError, match="noise was keyed to it differently"):
            train_run(secure, tmp_path / "part", "central")
    (tmp_path / "part" / "config.json").write_text(stored)
    train_run(secure, tmp_path / "part", "central")
    np.testing.assert_array_equal(params(tmp_path / "part"), params(tmp_path / "full"))  # the same secret and nonce replay the same noise
    assert not np.array_equal(params(tmp_path / "full"), params(tmp_path / "sim"))  # not the seed's noise
    # Another start of the same config under the same secret draws other noise: the difference of
    # two released models (trained on two versions of the data) must not cancel it.
    assert json.loads((tmp_path / "other" / "config.json").read_text())["noise"]["nonce"] != nonce.hex()
    assert np.linalg.norm(params(tmp_path / "other") - params(tmp_path / "full")) > 0.1 * np.linalg.norm(params(tmp_path / "full") - params(tmp_path / "sim"))
    rows = train_rows(tmp_path / "full")
    assert all(r["guarantee"].endswith(SECURE_NOTE) for r in rows)
    assert [r["epsilon"] for r in rows] == [r["epsilon"] for r in train_rows(tmp_path / "sim")]  # same accounting


def test_secure_noise_config_is_checked(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="adds no DP noise"):
        with_secure_noise(config(tmp_path, BASE))
    cfg = with_secure_noise(config(tmp_path, BASE + DP_SGD))
    assert cfg.privacy.secure_noise and noise_seed(cfg).secure
    assert not noise_seed(config(tmp_path, BASE + DP_SGD)).secure
    fed = BASE + '[federated]\nstrategy = "dp-fedavg"\nrounds = 2\nclients_per_round = 4\nclip_norm = 0.5\n[federated.dp]\nnoise_multiplier = 1.0\ndelta = 1e-4\n'
    assert with_secure_noise(config(tmp_path, fed)).federated.dp.secure_noise
    with pytest.raises(ConfigError, match="client-side DP-SGD"):
        with_secure_noise(config(tmp_path, fed + "[federated.client_dp]\nclip_norm = 1.0\nnoise_multiplier = 1.0\ndelta = 1e-4\n"))
    # Without the variable, every secure run draws a fresh secret from the OS.
    monkeypatch.delenv(SECRET_ENV, raising=False)
    a, b = noise_seed(cfg), noise_seed(cfg)
    assert a.fingerprint != b.fingerprint and a.entropy != b.entropy
    monkeypatch.setenv(SECRET_ENV, "abc")
    with pytest.raises(ConfigError, match="hex digits"):
        noise_seed(cfg)
    monkeypatch.setenv(SECRET_ENV, "ab" * 8)
    with pytest.raises(ConfigError, match="at least 128"):
        noise_seed(cfg)


def test_the_secure_noise_flag_refuses_runs_without_dp_noise_in_one_line(capsys):
    """--secure-noise on a run (or an experiment) that adds no DP noise: exit 2, one line, before
    any data is read."""
    from fedpriv.cli import main

    assert main(["train", "federated", "experiments/fedavg-shakespeare-quick.toml", "--secure-noise"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedpriv: error:") and "adds no DP noise" in err and len(err.splitlines()) == 1


def test_runs_under_one_secret_draw_independent_noise_and_every_bit_of_it_counts(tmp_path, monkeypatch):
    """Two runs under one FEDPRIV_NOISE_SECRET (two seeds, two learning rates of a tuning grid, or
    one config started twice, on data that differ by one user) must not share noise: the
    difference of two released models would cancel it. A resume (the same config and nonce,
    another engine or audit) draws the same; a secret that differs only in its last byte draws
    other noise."""
    import jax

    def root(cfg):
        return np.asarray(jax.random.key_data(noise_seed(cfg).root)), noise_seed(cfg).entropy

    monkeypatch.setenv(SECRET_ENV, SECRET)
    cfg = with_secure_noise(config(tmp_path, BASE + DP_SGD))
    assert not np.array_equal(root(cfg)[0], root(cfg)[0])  # two starts of one config: two nonces, independent noise
    monkeypatch.setattr(noise_module, "fresh_nonce", lambda: bytes(16))  # below: what the config adds to the nonce
    key, entropy = root(cfg)
    for other in (cfg.model_copy(update={"seed": 6}), cfg.model_copy(update={"training": cfg.training.model_copy(update={"learning_rate": 0.02})})):
        k, e = root(other)
        assert not np.array_equal(k, key) and e != entropy
    resumed = cfg.model_copy(update={"audit": cfg.audit.model_copy(update={"rs_candidates": 7})})
    k, e = root(resumed)
    assert np.array_equal(k, key) and e == entropy
    planted = cfg.model_copy(update={"audit": cfg.audit.model_copy(update={"empirical": not cfg.audit.empirical})})  # plants other audit canaries
    assert root(planted)[1] != entropy
    monkeypatch.setenv(SECRET_ENV, SECRET[:-2] + "ef")
    k, e = root(cfg)
    assert not np.array_equal(k, key) and e != entropy


def test_a_dp_vocabulary_drawn_from_the_seed_is_refused_with_secure_noise(tmp_path):
    """The DP vocabulary's noise comes from the seed: a --secure-noise run that builds one would
    release a vocabulary whose noise anyone recomputes, under a guarantee that says 'secret'."""
    cfg = config(tmp_path, BASE.replace("seq_len = 8\n", "seq_len = 8\ndp = \"gaussian\"\nepsilon = 0.5\n") + DP_SGD)
    with pytest.raises(ConfigError, match="vocab.dp draws the DP vocabulary's noise from the seed"):
        with_secure_noise(cfg)
