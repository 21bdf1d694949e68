"""Training on locally privatized text: the ``[privatize]`` stage of the pipeline.

The training users' words go through M_txt or Vickrey (fedpriv.privacy.local) before the task and
its vocabulary are built; evaluation data stays the original. Embeddings: small GloVe-style files
written here (random 16-dimensional vectors for the most frequent words), or a trained run.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import jax
import numpy as np
import pytest

from fedpriv.config import validate_config
from fedpriv.data.sources import open_corpus
from fedpriv.errors import ConfigError
from fedpriv.privacy.local.embeddings import load_glove
from fedpriv.privacy.local.mechanisms import privatize_text
from fedpriv.privacy.streams import PRIVATIZE as PRIVATIZE_STREAM
from fedpriv.privacy.streams import stream_key
from fedpriv.rundir import PRIVATIZE as PRIVATIZE_FILE
from fedpriv.runner.prepare import load_training_corpora, prepare

QUIET = lambda _m: None  # noqa: E731


def _glove(path: Path, words: list[str], seed: int) -> Path:
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as f:
        for w in words:
            f.write(w + " " + " ".join(f"{x:.5f}" for x in rng.normal(size=16)) + "\n")
    return path


@pytest.fixture(scope="module")
def shk_glove(tmp_path_factory) -> Path:
    counts = Counter(w for ex in open_corpus("shakespeare").records() for w in ex.words())
    return _glove(tmp_path_factory.mktemp("glove") / "shk.txt", [w for w, _ in counts.most_common(300)], 0)


def _raw(where: Path | str | None, **privatize) -> dict:
    raw = {
        "name": "privatized",
        "seed": 0,
        "data": {"source": "shakespeare", "min_examples": 3, "max_examples_per_user": 3},
        "vocab": {"size": 150, "seq_len": 10},
        "task": {"kind": "nwp", "model": "tiny"},
        "training": {"batch_size": 16, "steps": 3, "eval_every": 3, "checkpoint_every": 3, "eval_batch_size": 64},
    }
    if where is not None:
        raw["privatize"] = {"mechanism": "txt", "eta": 1.0, "embeddings": str(where), **privatize}
    return raw


def _cfg(where: Path | str | None, **privatize):
    return validate_config(_raw(where, **privatize))


def _words(corpus) -> dict[str, list[list[str]]]:
    return {u: [ex.words() for ex in exs] for u, exs in corpus.users()}


@pytest.fixture(scope="module")
def plain():
    return prepare(_cfg(None))


@pytest.fixture(scope="module")
def private(shk_glove):
    return prepare(_cfg(shk_glove))


# ---- parameters refused ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "privatize, message",
    [
        ({"eta": 0.0}, "eta must be finite and > 0"),
        ({"eta": -3}, "eta must be finite and > 0"),
        ({"eta": float("inf")}, "privatize.eta: Input should be a finite number"),  # refused by the one number check, before the range
        ({"mechanism": "vickrey", "t": 1.5}, r"t \(the Vickrey tuning parameter\) must be in \[0, 1\]"),
        ({"mechanism": "vickrey", "t": -0.1}, r"must be in \[0, 1\]"),
        ({"mechanism": "vickrey"}, "needs t in"),
        ({"mechanism": "vickrey", "t": 0.5, "k": 1}, "k must be >= 2"),
        ({"t": 0.5}, "use it with mechanism 'vickrey'"),
        ({"mechanism": "rep"}, "outputs vectors, not words"),
        ({"mechanism": "laplace"}, "privatize.mechanism"),
        ({"embeddings": ""}, "privatize.embeddings"),
        ({"max_words": 0}, "privatize.max_words"),
        ({"colour": "red"}, "privatize.colour: unknown key"),
    ],
)
def test_impossible_parameters_are_refused_by_the_config(privatize, message):
    import re

    with pytest.raises(ConfigError) as e:
        _cfg("embeddings.txt", **privatize)
    assert re.search(message, str(e.value)), str(e.value)
    assert str(e.value).startswith("config: privatize")


def test_what_cannot_run_is_refused_before_any_data_is_read(tmp_path, shk_glove, monkeypatch):
    import fedpriv.runner.prepare as pipeline

    def no_data(*_a, **_k):
        raise AssertionError("data was read")

    monkeypatch.setattr(pipeline, "open_corpus", no_data)
    unfinished = tmp_path / "unfinished-run"
    unfinished.mkdir()
    cases = [
        (_cfg(tmp_path / "nowhere.txt"), "no such run directory or embeddings file"),
        (_cfg("run:base"), "a run reference is resolved by `fedpriv run`"),
        (_cfg(unfinished), "no final parameters"),
        (_cfg(unfinished, max_words=10), "applies to a GloVe-style file"),
        (validate_config({**_raw(shk_glove), "canaries": {}}), r"\[privatize\] with \[canaries\] is not supported"),
    ]
    for cfg, message in cases:
        with pytest.raises(ConfigError, match=message):
            prepare(cfg)


# ---- what is privatized -------------------------------------------------------------------------------
def test_training_users_are_privatized_and_keep_their_shape(plain, private, shk_glove):
    space = load_glove(shk_glove)
    before, after = _words(plain.train), _words(private.train)
    assert list(private.train.user_ids) == list(plain.train.user_ids)  # same users, same order
    assert all(len(a) == len(b) and all(len(x) == len(y) for x, y in zip(a, b)) for a, b in zip(before.values(), after.values()))
    pairs = [(x, y) for u in before for ex_a, ex_b in zip(before[u], after[u]) for x, y in zip(ex_a, ex_b)]
    known = [(x, y) for x, y in pairs if x in space]
    changed = sum(x != y for x, y in known) / len(known)
    assert changed > 0.8, changed  # eta = 1 against 16-dim N(0, 1) vectors: mean noise radius 16
    outputs = {space.words[i] for i in space.allowed}
    assert {y for _, y in pairs} <= outputs
    # The vocabulary is learned from the privatized text, so it holds output words only.
    assert set(private.task.vocab.words) <= outputs and private.task.vocab.words != plain.task.vocab.words
    assert private.summary()["privatized"] == "txt eta=1"


def test_evaluation_data_is_the_original_text(plain, private):
    assert set(private.eval) == {"heldout"}
    assert _words(private.eval["heldout"]) == _words(plain.eval["heldout"])
    from fedpriv.runner.prepare import encode_corpus

    original = encode_corpus(private.task, plain.eval["heldout"])
    assert all(np.array_equal(original[k], private.eval_arrays["heldout"][k]) for k in original)


def test_huge_eta_leaves_known_words_unchanged(plain, shk_glove):
    train, _ = load_training_corpora(_cfg(shk_glove, eta=1e7), QUIET)
    space = load_glove(shk_glove)
    before, after = _words(plain.train), _words(train)
    pairs = [(x, y) for u in before for a, b in zip(before[u], after[u]) for x, y in zip(a, b)]
    assert all(x == y for x, y in pairs if x in space)
    # Unknown words all sit at the one OOV point, so they all become the same (nearest) word.
    assert len({y for x, y in pairs if x not in space}) == 1
    assert sum(x == y for x, y in pairs) / len(pairs) > 0.7


def test_same_seed_same_data_other_seed_other_data(private, shk_glove):
    again = prepare(_cfg(shk_glove, seed=0))  # privatize.seed defaults to the experiment's seed (0)
    assert _words(again.train) == _words(private.train)
    assert all(np.array_equal(again.train_arrays[k], private.train_arrays[k]) for k in again.train_arrays)
    other, _ = load_training_corpora(_cfg(shk_glove, seed=1), QUIET)
    assert _words(other) != _words(private.train)


def test_one_implementation_user_i_uses_fold_in_of_the_seed(plain, private, shk_glove):
    """User i's words are privatize_text with key fold_in(fold_in(key(seed), PRIVATIZE), i) (the
    privatize stream) over its examples in order."""
    space = load_glove(shk_glove)
    for i in (0, 7):
        u = plain.train.user_ids[i]
        words = [w for ex in plain.train[u] for w in ex.words()]
        new, note = privatize_text(jax.random.fold_in(stream_key(0, PRIVATIZE_STREAM), i), words, space, space, "txt", 1.0)
        assert new == [w for ex in private.train[u] for w in ex.words()]
    assert note == private.privatized["guarantee"]


def test_vickrey_records_its_parameters_and_the_run_gets_privatize_json(shk_glove, tmp_path):
    p = prepare(_cfg(shk_glove, mechanism="vickrey", t=0.5, eta=3, seed=4))
    p.save_assets(tmp_path)
    rec = json.loads((tmp_path / PRIVATIZE_FILE).read_text())
    assert (rec["mechanism"], rec["eta"], rec["t"], rec["k"], rec["seed"]) == ("vickrey", 3.0, 0.5, 2, 4)
    assert rec["embeddings"]["spec"] == str(shk_glove) and rec["embeddings"]["dim"] == 16
    assert "eta·d_chi per token" in rec["guarantee"] and "Vickrey" in rec["guarantee"]
    assert rec["users"] == p.train.num_users and rec["tokens"] == sum(len(ex.words()) for ex in p.train.records())
    assert "evaluation data is the original text" in rec["privatized"]
    assert 0 < rec["raw_text_statistics"]["changed_fraction"] < 1


def test_ner_tokens_are_privatized_and_tags_kept(tmp_path):
    train_path, eval_path = Path("tests/data/wnut17/emerging.dev.conll"), Path("tests/data/wnut17/emerging.test.annotated")
    counts = Counter(t.lower() for ex in open_corpus(str(train_path), users="sentences:50").records() for t in ex.words())
    glove = _glove(tmp_path / "wnut.txt", [w for w, _ in counts.most_common(300) if w.isalpha()], 1)
    space = load_glove(glove)
    raw = {
        "name": "ner-privatized",
        "data": {"source": str(train_path), "options": {"users": "sentences:50"}, "heldout_fraction": 0.0, "eval_source": str(eval_path), "eval_options": {"users": "sentences:50"}},
        "task": {"kind": "ner", "options": {"head": "softmax", "embed_dim": 16, "hidden": 16, "char_dim": 0}},
        "privatize": {"mechanism": "txt", "eta": 1e7, "embeddings": str(glove)},
    }
    p = prepare(validate_config(raw))
    original = open_corpus(str(train_path), users="sentences:50")
    assert list(p.train.user_ids) == list(original.user_ids)
    n = known = 0
    for (_, a), (_, b) in zip(original.users(), p.train.users()):
        for x, y in zip(a, b):
            assert y.tags == x.tags and len(y.tokens) == len(x.tokens)
            for tok, new in zip(x.tokens, y.tokens):
                n += 1
                assert new in space and new == new.lower()
                if tok.lower() in space:  # looked up case-insensitively; at huge eta, unchanged (lowercased)
                    known += 1
                    assert new == tok.lower()
    assert known > n / 3
    assert [ex.tokens for ex in p.eval["eval"].records()] == [ex.tokens for ex in open_corpus(str(eval_path), users="sentences:50").records()]


def test_central_nwp_run_on_privatized_shakespeare(private, tmp_path):
    from fedpriv.central.train import train_prepared_central as run_central

    run = tmp_path / "run"
    result = run_central(private, run, log=QUIET)
    assert result.done == 3
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r.get("split") == "heldout"]
    assert evals and np.isfinite(evals[-1]["loss"])
    rec = json.loads((run / PRIVATIZE_FILE).read_text())
    assert rec["mechanism"] == "txt" and "eta·d_chi" in rec["guarantee"]
    assert json.loads((run / "config.json").read_text())["experiment"]["privatize"]["eta"] == 1.0


@pytest.mark.slow
def test_embeddings_from_an_earlier_run_directory(plain, tmp_path):
    """The experiment's chain: a non-private NWP run, then a run privatized with its embedding table;
    rebuilding the privatized run's vocabulary from its directory gives the one it trained with."""
    from fedpriv.central.train import train_prepared_central as run_central
    from fedpriv.runner.embeddings import load_run_embeddings

    base = tmp_path / "base"
    run_central(plain, base, log=QUIET)
    cfg = _cfg(base, eta=20.0)
    p = prepare(cfg)
    space = load_run_embeddings(base)
    assert p.privatized["embeddings"]["kind"] == "fedpriv-nwp-run"
    assert {w for ex in p.train.records() for w in ex.words()} <= {space.words[i] for i in space.allowed}
    run = tmp_path / "private"
    run_central(p, run, log=QUIET)
    again = load_run_embeddings(run)  # rebuilds the task through load_training_corpora: privatizes again
    assert again.words[1 : len(p.task.vocab.words) + 1] == p.task.vocab.words
