"""[vocab] dp for the word vocabularies of nwp and ner; refused where a kind cannot use it; the
guarantee and the report name a vocabulary that is not private (issue 30, point 2)."""

from __future__ import annotations

import pytest

from fedpriv.config import validate_config
from fedpriv.data.sources import open_corpus
from fedpriv.errors import ConfigError
from fedpriv.privacy.accounting import GaussianSteps
from fedpriv.privacy.budget import DPBudget
from fedpriv.report.tables import not_covered
from fedpriv.tasks.ner import TokenVocab, normalize_token
from fedpriv.tasks.registry import build_task
from fedpriv.training.coverage import coverage
from fedpriv.vocab.dp_histogram import dp_histogram
from fedpriv.vocab.word import WordVocab

NCBI = "tests/data/ncbi-disease/train.tsv"
DP = {"dp": "gaussian", "epsilon": 0.9, "delta": 1e-5, "tuple_size": 16}


@pytest.fixture(scope="module")
def shakespeare():
    return open_corpus("shakespeare")


def _cfg(kind: str, vocab: dict, **task) -> object:
    return validate_config({"name": "v", "seed": 5, "task": {"kind": kind, "model": "tiny" if kind == "nwp" else "small", **task}, "vocab": vocab})


def test_nwp_vocab_dp_is_honoured_not_ignored(shakespeare):
    # Before: [vocab] dp was accepted for nwp and the top-K words of the raw counts were used.
    plain = build_task(_cfg("nwp", {"size": 5000}), shakespeare)
    task = build_task(_cfg("nwp", {"size": 5000, **DP}), shakespeare)
    hist = dp_histogram((ex.words() for ex in shakespeare.records()), "gaussian", seed=5, epsilon=0.9, delta=1e-5, tuple_size=16, partition="example")
    assert task.vocab.words == WordVocab.from_counts(hist.counts, 5000).words  # the DP histogram's top words, noise seeded by the experiment seed
    assert len(task.vocab.words) == hist.words_kept < len(plain.vocab.words)  # words under the threshold are not released
    rec = task.vocabulary_record
    assert rec["dp"]["epsilon"] == pytest.approx(0.9) and rec["dp"]["unit"] == "16-word tuple" and rec["source"] == "shakespeare"
    assert plain.vocabulary_record["dp"] is None


def test_ner_vocab_dp_builds_the_token_vocabulary_from_the_histogram():
    corpus = open_corpus(NCBI, users="sentences:9")
    task = build_task(_cfg("ner", {**DP, "tuple_size": 128}, options={"vocab_size": 300}), corpus)
    hist = dp_histogram(([normalize_token(t) for t in ex.words()] for ex in corpus.records()), "gaussian", seed=5, epsilon=0.9, delta=1e-5,
                        tuple_size=128, partition="example")
    assert task.vocab.words == TokenVocab.from_counts(hist.counts, 300).words and 0 < len(task.vocab.words) <= 300
    assert task.vocabulary_record["dp"]["mechanism"] == "gaussian"


@pytest.mark.parametrize("kind", ["nwp", "ner"])
@pytest.mark.parametrize("key, value", [("source", "shakespeare"), ("alphabet", "ascii"), ("public", "shakespeare")])
def test_vocab_keys_a_kind_cannot_use_are_refused_at_validation(kind, key, value):
    with pytest.raises(ConfigError, match=f"vocab.{key} applies to BERT tasks .* not task.kind = '{kind}'"):
        _cfg(kind, {key: value})


def test_the_guarantee_names_a_vocabulary_that_is_not_private(shakespeare):
    cfg = _cfg("nwp", {"size": 50})
    task = build_task(cfg, shakespeare)
    budget = DPBudget(GaussianSteps("poisson", 1.0, 1000, 10.0, 5), 1.0, None, 1e-5)
    budget.coverage = coverage(cfg, task, "example")
    budget.record()
    g = budget.report()["guarantee"]
    assert g.startswith("epsilon = ") and "the vocabulary of the 50 most frequent training words is not private" in g
    dp_task = build_task(_cfg("nwp", {"size": 50, **DP}), shakespeare)
    note = coverage(_cfg("nwp", {"size": 50, **DP}), dp_task, "user").statement(1.0, 1e-5)
    assert "separate DP stage, not included in this epsilon: (0.9, 1e-05)-DP per 16-word tuple" in note


def test_the_report_flags_a_dp_run_whose_vocabulary_is_not_private():
    s = {"name": "r", "task": "nwp", "data_source": "shakespeare", "epsilon": 2.0, "privacy_unit": "user",
         "vocabulary": {"source": "shakespeare", "users": "training users", "dp": None, "vocab_size": 50}}
    assert not_covered(s).startswith("vocabulary not private (50 entries")
    assert not_covered({**s, "vocabulary": None}).startswith("vocabulary not private")  # a run stored before vocabulary records
    assert not_covered({**s, "vocabulary": {**s["vocabulary"], "dp": {"epsilon": 0.5}}}) == ""
    assert not_covered({**s, "epsilon": None}) == ""  # a run without DP: nothing is covered
    # a vocabulary learned from the public split holds nothing of the private users
    assert not_covered({**s, "vocabulary": {**s["vocabulary"], "users": "public users"}}) == ""
    assert not_covered(s, public_vocabulary=True) == ""  # a run stored before its record said so: its config's public split


def test_a_stored_config_with_every_vocab_key_at_its_default_still_validates():
    stored = _cfg("ner", {**DP}).model_dump(mode="json")  # config.json lists source = None, alphabet = "data", ...
    assert validate_config(stored).vocab.dp == "gaussian"


SYNTH = "synthetic:users=600,examples=3000,vocab_size=300,seed=1"
USER_DP = {**DP, "partition": "user"}


def test_a_user_partition_config_validates_and_an_impossible_one_is_refused():
    assert _cfg("nwp", {"size": 50, **USER_DP}).vocab.partition == "user"
    with pytest.raises(ConfigError, match="epsilon"):  # the same checks as the other partitions, at validation
        _cfg("nwp", {"size": 50, **USER_DP, "epsilon": 1.5})


def test_nwp_user_partition_builds_the_histogram_over_the_training_users():
    corpus = open_corpus(SYNTH)
    cfg = _cfg("nwp", {"size": 200, **USER_DP})
    task = build_task(cfg, corpus)
    # one word list per training user, all its examples' words: the per-user histogram, seeded by the experiment seed
    per_user = [[w for ex in exs for w in ex.words()] for _, exs in corpus.users()]
    hist = dp_histogram(per_user, "gaussian", seed=5, epsilon=0.9, delta=1e-5, tuple_size=16, partition="user")
    assert hist.units == corpus.num_users == 600
    assert task.vocab.words == WordVocab.from_counts(hist.counts, 200).words and len(task.vocab.words) > 0
    per_example = dp_histogram((ex.words() for ex in corpus.records()), "gaussian", seed=5, epsilon=0.9, delta=1e-5, tuple_size=16,
                               partition="example")
    assert per_example.counts != hist.counts  # not the per-example histogram under another name
    rec = task.vocabulary_record
    assert rec["dp"]["unit"] == "user" and rec["dp"]["partition"] == "user" and rec["users_counted"] == 600
    assert "examples" not in rec and "longest_example_words" not in rec  # nothing the chain report could compose per example
    assert max(map(len, per_user)) == rec["longest_user_words"]
    note = coverage(cfg, task, "user").statement(1.0, 1e-5)
    assert "separate DP stage, not included in this epsilon: (0.9, 1e-05)-DP per user added or removed (gaussian histogram" in note


def test_ner_user_partition_counts_normalized_tokens_per_user():
    corpus = open_corpus(NCBI, users="sentences:9")
    task = build_task(_cfg("ner", {**USER_DP, "tuple_size": 128}, options={"vocab_size": 300}), corpus)
    per_user = [[normalize_token(t) for ex in exs for t in ex.words()] for _, exs in corpus.users()]
    hist = dp_histogram(per_user, "gaussian", seed=5, epsilon=0.9, delta=1e-5, tuple_size=128, partition="user")
    assert task.vocab.words == TokenVocab.from_counts(hist.counts, 300).words
    assert task.vocabulary_record["dp"]["unit"] == "user" and task.vocabulary_record["users_counted"] == corpus.num_users


def test_nwp_prepare_on_a_synthetic_source_uses_the_per_user_histogram():
    from fedpriv.runner.prepare import prepare

    cfg = validate_config({"name": "v", "seed": 5, "data": {"source": SYNTH}, "task": {"kind": "nwp", "model": "tiny"},
                           "vocab": {"size": 200, **USER_DP}})
    p = prepare(cfg)
    per_user = [[w for ex in exs for w in ex.words()] for _, exs in p.train.users()]  # the TRAINING users only
    hist = dp_histogram(per_user, "gaussian", seed=5, epsilon=0.9, delta=1e-5, tuple_size=16, partition="user")
    assert p.train.num_users < 600 and hist.units == p.train.num_users
    assert p.task.vocab.words == WordVocab.from_counts(hist.counts, 200).words
    assert p.task.vocabulary_record["dp"]["unit"] == "user" and p.task.vocabulary_record["users_counted"] == p.train.num_users
