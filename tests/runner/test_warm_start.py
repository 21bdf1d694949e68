"""A public warm start (#32): the public split is disjoint from every other split and holds no
canaries; the vocabulary is learned from it; ``[init] from`` loads exactly the public run's final
parameters and refuses another task, model or vocabulary, before any training."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from fedpriv.cli import main
from fedpriv.config import validate_config
from fedpriv.errors import ConfigError
from fedpriv.rundir import RunDir
from fedpriv.runner.grid import read_experiment
from fedpriv.training.coverage import vocabulary_note
from fedpriv.runner.prepare import PUBLIC, load_training_corpora, prepare

EXPERIMENT = """
name = "warm"
[data]
source = "synthetic:users=60,examples=1200"
heldout_fraction = 0.1
validation_fraction = 0.1
public_fraction = 0.25
[vocab]
size = 80
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
[federated]
rounds = 2
clients_per_round = 5
local_batch_size = 8
max_local_steps = 1
client_learning_rate = 0.5
[canaries]
per_config = 1
[audit]
rs_candidates = 50
extraction_examples = 0

[[runs]]
name = "public"
kind = "central"
data = { train_on = "public" }

[[runs]]
name = "sgd-warm"
kind = "central"
init = { from = "run:public" }

[[runs]]
name = "fedavg-warm"
kind = "federated"
init = { from = "run:public" }
"""


def _config(**data):
    raw = {"name": "warm", "data": {"source": "synthetic:users=60,examples=1200", "heldout_fraction": 0.1, "validation_fraction": 0.1,
                                    "public_fraction": 0.25, **data},
           "vocab": {"size": 80, "seq_len": 8}, "task": {"kind": "nwp", "model": "tiny"}, "canaries": {"per_config": 1},
           "audit": {"extraction_examples": 0}}
    return validate_config(raw)


def test_the_public_split_is_disjoint_from_every_other_split_and_holds_no_canary():
    cfg = _config()
    train, evals = load_training_corpora(cfg, lambda _m: None)
    public = set(evals[PUBLIC].user_ids)
    assert public and set(train.user_ids)
    for name in ("heldout", "validation"):
        assert not public & set(evals[name].user_ids), name
    assert not public & set(train.user_ids)
    prepared = prepare(cfg)
    assert PUBLIC not in prepared.eval  # never evaluated as a split of its own
    sharers = {u for c in prepared.canaries.canaries for u in c.sharers}
    assert sharers and sharers <= set(train.user_ids) and not sharers & public
    # the vocabulary is the public users' own: a word only the private users write is out of it
    public_words = {w for ex in evals[PUBLIC].records() for w in ex.words()}
    assert set(prepared.task.vocab.words) <= public_words
    # ... and the guarantee says nothing uncovered of it (the private users' counts were not read)
    assert prepared.task.vocabulary_record["users"] == "public users"
    assert vocabulary_note(prepared.task.vocabulary_record, cfg) is None
    private = _config(public_fraction=0.0)
    assert "not private" in vocabulary_note(prepare(private).task.vocabulary_record, private)


def test_a_run_on_the_public_data_trains_on_the_public_users_without_canaries():
    prepared = prepare(_config(train_on="public"))
    public = load_training_corpora(_config(), lambda _m: None)[1][PUBLIC]
    assert list(prepared.train.user_ids) == list(public.user_ids)
    assert prepared.canaries is None and prepared.audit_canaries is None


def test_train_on_public_needs_public_data_and_no_privacy():
    with pytest.raises(ConfigError, match="needs a public split"):
        validate_config({"name": "x", "data": {"train_on": "public"}})
    with pytest.raises(ConfigError, match="a central run without"):
        validate_config({"name": "x", "data": {"public_fraction": 0.1, "train_on": "public"}, "privacy": {"clip_norm": 1.0, "noise_multiplier": 1.0, "delta": 1e-5}})
    with pytest.raises(ConfigError, match="not both"):
        validate_config({"name": "x", "data": {"public_fraction": 0.1, "public_source": "shakespeare"}})


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("warm")
    exp = root / "exp.toml"
    exp.write_text(EXPERIMENT)
    assert main(["run", str(exp), "--out", str(root / "store")]) == 0
    return root / "store"


@pytest.mark.slow
def test_the_warm_start_loads_exactly_the_public_runs_parameters(store):
    specs = read_experiment(store.parent / "exp.toml").runs
    warm = next(s for s in specs if s.name == "sgd-warm")
    cfg = warm.config.model_copy(update={"init": warm.config.init.model_copy(update={"from_": str(store / "public")})})
    prepared = prepare(cfg)
    start = prepared.initial_params(cfg.seed)
    public, _ = RunDir(store / "public").load_params(prepared.task.init_params(jax.random.key(0)))
    for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(public), strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    fresh = prepared.task.init_params(jax.random.key(0))
    assert not all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(fresh)))
    summaries = {n: json.loads((store / n / "summary.json").read_text()) for n in ("public", "sgd-warm", "fedavg-warm")}
    assert summaries["public"]["trained_on"] == "public" and "audit" not in summaries["public"]
    for n in ("sgd-warm", "fedavg-warm"):
        assert summaries[n]["init"] == {"from": str((store / "public").resolve()), "name": "public", "public": True}
        assert summaries[n]["audit"]["total"]["canaries"] > 0
    report = (store / "report" / "comparison.md").read_text()
    assert "SGD (warm start: public model)" in report and "FedAvg (warm start: public model)" in report
    assert "Public data: " in report and "Run public trained on the public data alone (final validation utility " in report


@pytest.mark.slow
def test_the_warm_start_refuses_another_model_or_vocabulary_before_training(store, tmp_path):
    base = {"name": "warm", "data": {"source": "synthetic:users=60,examples=1200", "heldout_fraction": 0.1, "validation_fraction": 0.1, "public_fraction": 0.25},
            "vocab": {"size": 80, "seq_len": 8}, "task": {"kind": "nwp", "model": "tiny"},
            "training": {"steps": 2, "batch_size": 8}, "init": {"from": str(store / "public")}}
    small = validate_config({**base, "task": {"kind": "nwp", "model": "small"}})
    with pytest.raises(ConfigError, match=r"trained task 'nwp' \(model 'tiny'\); this run trains 'nwp' \(model 'small'\)"):
        prepare(small).initial_params(0)
    other_vocab = validate_config({**base, "vocab": {"size": 60, "seq_len": 8}})
    with pytest.raises(ConfigError, match="vocab.json differs from this run's"):
        prepare(other_vocab).initial_params(0)
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    with pytest.raises(ConfigError, match="no final parameters"):
        prepare(validate_config({**base, "init": {"from": str(unfinished)}})).initial_params(0)
    # through the CLI: one line, and nothing trained
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text(
        'name = "warm"\n[data]\nsource = "synthetic:users=60,examples=1200"\nheldout_fraction = 0.1\nvalidation_fraction = 0.1\npublic_fraction = 0.25\n'
        f'[vocab]\nsize = 60\nseq_len = 8\n[task]\nkind = "nwp"\nmodel = "tiny"\n[training]\nsteps = 2\nbatch_size = 8\n[init]\nfrom = "{store / "public"}"\n'
    )
    assert main(["train", "central", str(cfg_file), "--out", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run" / "checkpoint.json").exists()


@pytest.mark.slow
def test_the_guarantee_names_a_warm_start_from_a_run_on_the_private_users(store):
    """A DP run that starts from the public model owes nothing to it; one that starts from a run on
    the private users (here central SGD without DP) says so in its guarantee, not only in the report."""
    from fedpriv.training.coverage import coverage, warm_start_note

    dp = {"clip_norm": 1.0, "noise_multiplier": 1.0, "delta": 1e-5}
    public = validate_config({**_config().model_dump(by_alias=True), "privacy": dp, "init": {"from": str(store / "public")}})
    assert warm_start_note(public) is None and warm_start_note(_config()) is None
    private = public.model_copy(update={"init": public.init.model_copy(update={"from_": str(store / "sgd-warm")})})
    note = warm_start_note(private)
    assert note == (f"the parameters start from run {store / 'sgd-warm'} ([init] from), trained on the private users: "
                    "that run's privacy is not included in this epsilon")
    assert note in coverage(private, None, "example").statement(1.0, 1e-5)
    other = private.model_copy(update={"data": private.data.model_copy(update={"source": "shakespeare"})})
    assert "trained on synthetic:users=60,examples=1200:" in warm_start_note(other)  # a run on another corpus is named by its source


@pytest.mark.slow
def test_a_target_above_a_run_is_its_final_validation_utility_plus_the_margin(store, tmp_path):
    from fedpriv.config import UtilityConfig
    from fedpriv.training.warmstart import utility_target

    metric = "accuracy_no_oov_no_eos"
    rows = [r for r in RunDir(store / "public").metrics() if r.get("split") == "validation"]
    assert len(rows) >= 2  # the final evaluation, not the best one, is the reference
    above = UtilityConfig(above=str(store / "public"), margin=0.02)
    assert utility_target(above, metric) == pytest.approx(rows[-1][metric] + 0.02)
    assert utility_target(above, metric, train_on="public") is None  # the public model is the reference, not trained to it
    assert utility_target(UtilityConfig(target=0.3), metric) == 0.3
    with pytest.raises(ConfigError, match="no such run directory"):
        utility_target(UtilityConfig(above=str(tmp_path / "missing")), metric)
    with pytest.raises(ConfigError, match="one of them"):
        validate_config({"name": "x", "data": {"validation_fraction": 0.1}, "utility": {"target": 0.2, "above": "run:public"}})
