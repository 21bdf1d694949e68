"""Experiment configs: TOML validated against the schema, errors naming the key path."""

import pytest

from fedpriv.config import load_config, validate_config
from fedpriv.errors import ConfigError


def test_demo_experiment_is_valid():
    from fedpriv.runner.grid import load_experiment

    name, specs = load_experiment("experiments/demo.toml")
    assert name == "demo" and all(s.config.data.source == "shakespeare" and s.config.vocab.size == 2000 for s in specs)


def test_defaults():
    cfg = validate_config({"name": "x"})
    assert cfg.seed == 0 and cfg.data.heldout_fraction == 0.1 and cfg.vocab.seq_len == 20


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"name": "x", "data": {"sorce": "shakespeare"}}, r"data\.sorce: unknown key"),
        ({"name": "x", "vocab": {"size": "big"}}, r"vocab\.size: Input should be a valid integer"),
        ({"name": "x", "vocab": {"size": 0}}, r"vocab\.size: Input should be greater than or equal to 1"),
        ({"name": "x", "data": {"heldout_fraction": 1.5}}, r"data\.heldout_fraction: Input should be less than 1"),
        ({"name": "x", "seed": 1.5}, r"seed: Input should be a valid integer"),
        ({"name": "x", "trainig": {}}, r"trainig: unknown key"),
        ({"name": "x", "training": {"order": "random"}}, r"training\.order: Input should be .iid. or .noniid."),
        # the accountants' range of z, refused naming the key (it came from the accountant without one)
        ({"name": "x", "federated": {"rounds": 2, "clients_per_round": 4, "client_dp": {"clip_norm": 1.0, "noise_multiplier": 1e-4, "delta": 1e-3}}},
         r"federated\.client_dp\.noise_multiplier: 0\.0001 is outside \[0\.001, 1e\+06\]"),
        ({"name": "x", "privacy": {"clip_norm": 1.0, "noise_multiplier": 2e6, "delta": 1e-5}}, r"privacy\.noise_multiplier: 2e\+06 is outside"),
        # a clip norm that overflows float32 (1e308 passed and ended as 'diverged ... lower the learning rate')
        ({"name": "x", "privacy": {"clip_norm": 1e308, "noise_multiplier": 1.0, "delta": 1e-5}}, r"privacy\.clip_norm: 1e\+308 is above 1e\+30"),
        # keys that would be ignored are refused (never silently dropped)
        ({"name": "x", "privacy": {"clip_norm": 1.0, "noise_multiplier": 1.0, "delta": 1e-5, "examples_per_user": 4}},
         r"privacy: examples_per_user = 4 applies to unit = 'user' only"),
        ({"name": "x", "federated": {"strategy": "dp-fedavg", "rounds": 2, "clients_per_round": 4, "clip_norm": 0.5,
                                     "dp": {"noise_multiplier": 1.0, "delta": 1e-3, "clip_count_stddev": 3.0, "clip_learning_rate": 0.1}}},
         r"federated.dp: clip_learning_rate, clip_count_stddev apply to adaptive clipping only \(they would be ignored\)"),
        # DP-SGD samples its batches: a non-IID order was ignored (same parameters) yet labelled 'non-IID' in the report
        ({"name": "x", "training": {"order": "noniid"}, "privacy": {"clip_norm": 1.0, "noise_multiplier": 1.0, "delta": 1e-5}},
         r"training\.order = 'noniid' does not apply to DP-SGD \(\[privacy\]\): its batches are sampled"),
        ({"name": "x", "training": {"learning_rate": 0}}, r"training\.learning_rate: Input should be greater than 0"),
        ({}, r"name: Field required"),
    ],
)
def test_bad_keys_and_types_are_refused_by_path(raw, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(raw, "exp.toml")


def test_toml_errors_name_the_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('name = "x"\n[data\nsource = 1\n')
    with pytest.raises(ConfigError, match=r"bad.toml: TOML syntax error.*line 2"):
        load_config(p)
    p.write_text('name = "x"\n[data]\nsource = 3\n')
    with pytest.raises(ConfigError, match=r"bad.toml: data\.source: Input should be a valid string"):
        load_config(p)
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "missing.toml")


def test_every_shipped_experiment_is_valid():
    import tomllib
    from pathlib import Path

    from fedpriv.runner.grid import load_experiment

    files = sorted(Path("experiments").glob("*.toml"))
    assert len(files) >= 3
    grids = 0
    for f in files:
        if "runs" in tomllib.loads(f.read_text()):  # an experiment grid: every run resolves
            grids += 1
            assert load_experiment(f)[1]
        else:
            load_config(f)
    assert grids >= 4  # demo, thakkar-table1, thakkar-table1-small, stackexchange


def test_pld_accounting_of_fixed_size_dp_sgd_batches_is_refused():
    """PLD in dp_accounting covers Poisson sampling, not batches of exactly B sampled without
    replacement: such a run would print a Poisson epsilon for a schedule it does not describe."""
    from fedpriv.config import PrivacyConfig

    with pytest.raises(ValueError, match="accountant = 'pld' does not cover sampling = 'fixed'"):
        PrivacyConfig(clip_norm=1.0, noise_multiplier=1.0, delta=1e-5, sampling="fixed", accountant="pld")
    assert PrivacyConfig(clip_norm=1.0, noise_multiplier=1.0, delta=1e-5, sampling="poisson", accountant="pld").accountant == "pld"


def test_train_central_refuses_a_config_whose_privacy_is_federated(tmp_path, capsys):
    """`fedpriv train central` on a DP-FedAvg config used to train plain SGD and exit 0: central
    training does not read [federated.dp]. Refused before any data is read, nothing written."""
    from fedpriv.cli import main
    from fedpriv.config import check_kind

    raw = {
        "name": "x", "data": {"source": "shakespeare"}, "vocab": {"size": 200}, "task": {"kind": "nwp", "model": "tiny"},
        "training": {"batch_size": 8, "steps": 2},
        "federated": {"strategy": "dp-fedavg", "rounds": 2, "clients_per_round": 4, "clip_norm": 0.5, "dp": {"noise_multiplier": 1.0, "delta": 1e-3}},
    }
    with pytest.raises(ConfigError, match=r"privacy is \[federated.dp\], which central training does not read: it would train without DP"):
        check_kind(validate_config(raw), "central")
    check_kind(validate_config(raw), "federated")
    check_kind(validate_config({**raw, "privacy": {"clip_norm": 1.0, "noise_multiplier": 1.0, "delta": 1e-5}}), "central")  # its own DP-SGD keys
    check_kind(validate_config({**raw, "federated": {"rounds": 2, "clients_per_round": 4}}), "central")  # plain FedAvg keys: nothing lost
    cfg = tmp_path / "dpfed.toml"
    cfg.write_text(
        'name = "x"\n[data]\nsource = "shakespeare"\n[vocab]\nsize = 200\n[task]\nkind = "nwp"\nmodel = "tiny"\n[training]\nbatch_size = 8\nsteps = 2\n'
        '[federated]\nstrategy = "dp-fedavg"\nrounds = 2\nclients_per_round = 4\nclip_norm = 0.5\n[federated.dp]\nnoise_multiplier = 1.0\ndelta = 1e-3\n'
    )
    assert main(["train", "central", str(cfg), "--out", str(tmp_path / "run")]) == 2
    assert "which central training does not read" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
