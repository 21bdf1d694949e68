"""Canaries (the federated secret sharer), Random Sampling, Beam Search, exposure and the audit."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from memorization_helpers import initial_params

from fedpriv.config import CanariesConfig, validate_config
from fedpriv.data.corpus import FederatedCorpus
from fedpriv.data.examples import TextExample
from fedpriv.errors import ConfigError, FedprivError
from fedpriv.memorization.audit import enumerate_suffixes
from fedpriv.memorization.beam_search import beam_search
from fedpriv.memorization.canaries import Manifest, choose_insertions, plant_canaries, scale_factor
from fedpriv.memorization.exposure import exact_exposure, exposure_from_rank, extrapolated_exposure, interpolated_exposure
from fedpriv.memorization.lm import NWPStepper
from fedpriv.memorization.random_sampling import draw_suffixes, random_sampling, suffix_log_probs
from fedpriv.runner.prepare import prepare
from fedpriv.tasks.nwp import NWPTask
from fedpriv.vocab.word import WordVocab


def tiny_task(n_words: int = 30) -> NWPTask:
    return NWPTask(WordVocab([f"w{i}" for i in range(n_words)]), seq_len=8, model="tiny")


def sharpened_params(task: NWPTask, seed: int = 0, factor: float = 4.0):
    """Random parameters scaled up so next-word distributions are far from uniform."""
    return jax.tree_util.tree_map(lambda x: x * factor, initial_params(task, seed))


def full_log_probs(task: NWPTask, params, ids: np.ndarray) -> np.ndarray:
    """log P(ids[:, t+1] | ids[:, :t+1]) from the model's full forward pass, (B, L-1). Jitted: one
    program instead of op-by-op calls (the same bits as eager here, checked on these models)."""
    padded = np.concatenate([ids, np.zeros((len(ids), 1), np.int32)], axis=1)
    lp = np.asarray(jax.jit(lambda p, x: jax.nn.log_softmax(task.logits(p, x), axis=-1))(params, jnp.asarray(padded)))
    return np.take_along_axis(lp[:, : ids.shape[1] - 1], ids[:, 1:, None], axis=2)[..., 0]


# ---- config ---------------------------------------------------------------------------------------
def test_canaries_config_refuses_bad_values():
    for bad in ({"user_probabilities": [0.0]}, {"example_probabilities": [1.5]}, {"patterns": ["HH"]}, {"patterns": ["HSS"]}, {"words": 2}):
        with pytest.raises(ConfigError):
            validate_config({"name": "x", "canaries": bad})
    with pytest.raises(ConfigError, match="beam_top"):
        validate_config({"name": "x", "audit": {"beam_width": 3, "beam_top": 5}})
    cfg = validate_config({"name": "x", "canaries": {}})
    assert cfg.canaries.words == 5 and len(cfg.canaries.user_probabilities) * len(cfg.canaries.example_probabilities) * cfg.canaries.per_config == 90


# ---- the federated secret sharer -------------------------------------------------------------------
def test_sharer_sampling_matches_p_u_and_p_e():
    """Over 40,000 users (30 examples each): the fraction of sharers is p_u and the fraction of a
    sharer's examples replaced is p_e, each within 4 binomial standard deviations."""
    n, per_user = 40_000, 30
    counts = np.full(n, per_user)
    probs = [(0.01, 0.1), (0.05, 0.5), (0.002, 1.0)]
    sharers, replaced = choose_insertions(counts, probs, seed=7)
    for c, (pu, pe) in enumerate(probs):
        k = len(sharers[c])
        assert abs(k - n * pu) <= 4 * math.sqrt(n * pu * (1 - pu)), (c, k)
        hits = sum(1 for u in sharers[c] for ci in replaced[int(u)].values() if ci == c)
        if c == 0:  # nothing planted before canary 0, so its count is exactly its draws
            trials = k * per_user
            assert abs(hits - trials * pe) <= 4 * math.sqrt(trials * pe * (1 - pe)), hits
    # p_e = 1: every example of every sharer carries a canary (possibly an earlier one)
    assert all(len(replaced[int(u)]) == per_user for u in sharers[2])
    again, _ = choose_insertions(counts, probs, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(sharers, again))


def test_scaling_rule_is_exact():
    cfg = CanariesConfig(user_probabilities=[1 / 50_000, 3 / 50_000, 1 / 5_000], min_expected_sharers=2.0)
    assert scale_factor(cfg, 1000) == pytest.approx(2.0 / (1000 / 50_000))  # 100x
    assert scale_factor(cfg, 342_477) == 1.0  # Thakkar et al.'s population expects ~6.8 already
    assert scale_factor(CanariesConfig(min_expected_sharers=0.0), 10) == 1.0


@pytest.fixture(scope="module")
def planted():
    cfg = validate_config(
        {
            "name": "canary-test",
            "data": {"source": "shakespeare", "heldout_fraction": 0.1},
            "vocab": {"size": 500, "seq_len": 20},
            "task": {"kind": "nwp", "model": "tiny"},
            "canaries": {"per_config": 3, "user_probabilities": [0.02, 0.1], "example_probabilities": [0.05, 0.5], "min_expected_sharers": 0.0},
        }
    )
    return cfg, prepare(cfg)


def test_planting_is_exact_and_recorded(planted, tmp_path):
    cfg, p = planted
    m = p.canaries
    assert len(m.canaries) == 12 and len({c.words for c in m.canaries}) == 12
    vocab = set(p.task.vocab.words)
    texts = [ex.text for ex in p.train.records()]
    for c in m.canaries:
        assert len(c.words) == 5 and set(c.words) <= vocab
        assert texts.count(c.text) == c.insertions == sum(c.insertions_by_sharer)
        for u, k in zip(c.sharers, c.insertions_by_sharer):
            assert sum(ex.text == c.text for ex in p.train.examples(u)) == k
    # the canaries never occur in the clean corpus
    clean = prepare(cfg.model_copy(update={"canaries": None}))
    clean_text = " \n ".join(ex.text for ex in clean.train.records())
    assert not any(c.text in clean_text for c in m.canaries)
    assert clean.task.vocab.words == p.task.vocab.words  # the vocabulary is the clean one
    assert p.train.num_examples == clean.train.num_examples
    assert sum(a != b for a, b in zip(clean.train.records(), p.train.records())) == m.total_insertions
    # the same config plants the same canaries (central and federated runs prepare separately)
    again = prepare(cfg)
    assert again.canaries.canaries == m.canaries
    assert np.array_equal(again.train_arrays["ids"], p.train_arrays["ids"])
    m.save(tmp_path)
    assert Manifest.load(tmp_path).canaries == m.canaries


def test_canaries_for_masked_lm_follow_the_patterns():
    corpus = FederatedCorpus.from_dict({f"u{i}": [TextExample(f"a{i % 7} b{i % 5} c{i % 3} d e f")] * 5 for i in range(60)})
    words = [f"a{i}" for i in range(7)] + [f"b{i}" for i in range(5)] + ["c0", "c1", "c2", "d", "e", "f"]
    task = NWPTask(WordVocab(words), seq_len=8, model="tiny")
    cfg = CanariesConfig(per_config=2, user_probabilities=[0.5], example_probabilities=[0.5], patterns=["HS", "HHSHH"], min_expected_sharers=0)
    planted_corpus, m = plant_canaries(corpus, task, cfg, seed=3, task_kind="mlm")
    assert [c.pattern for c in m.canaries] == ["HS", "HS", "HHSHH", "HHSHH"]
    assert [len(c.words) for c in m.canaries] == [2, 2, 5, 5]
    assert [c.secret_index for c in m.canaries] == [1, 1, 2, 2]
    _, m_nwp = plant_canaries(corpus, task, cfg, seed=3, task_kind="nwp")
    assert all(c.pattern is None and len(c.words) == 5 for c in m_nwp.canaries)


def test_too_small_a_vocabulary_is_refused():
    corpus = FederatedCorpus.from_dict({"u": [TextExample("a b")]})
    with pytest.raises(FedprivError, match="usable words"):
        plant_canaries(corpus, NWPTask(WordVocab(["a", "b"]), seq_len=4, model="tiny"), CanariesConfig(), 0, "nwp")


# ---- scoring --------------------------------------------------------------------------------------
def test_stepper_and_prefix_tree_scores_equal_the_full_model():
    task = tiny_task()
    params = sharpened_params(task)
    stepper = NWPStepper(task, params)
    rng = np.random.default_rng(0)
    prefix = np.array([task.vocab.bos, 3, 4], np.int32)
    # repeated starts exercise the shared-prefix levels; batch 16 exercises padding
    suffixes = np.concatenate([rng.integers(1, 31, (40, 3)), np.tile([[5, 6, 7]], (5, 1)), rng.integers(1, 31, (5, 1)).repeat(3, 1)]).astype(np.int32)
    got = suffix_log_probs(stepper, prefix, suffixes, batch=16)
    ids = np.concatenate([np.tile(prefix, (len(suffixes), 1)), suffixes], axis=1)
    want = full_log_probs(task, params, ids)[:, 2:].sum(axis=1)
    np.testing.assert_allclose(got, want, atol=2e-5)
    for s in (1, 2, 4):  # other suffix lengths
        suf = rng.integers(1, 31, (20, s)).astype(np.int32)
        ids = np.concatenate([np.tile(prefix, (20, 1)), suf], axis=1)
        np.testing.assert_allclose(suffix_log_probs(stepper, prefix, suf, batch=8), full_log_probs(task, params, ids)[:, 2:].sum(axis=1), atol=2e-5)


def test_random_sampling_rank_and_suffix_draws():
    task = tiny_task()
    stepper = NWPStepper(task, sharpened_params(task))
    pool = stepper.word_ids()
    canary = np.array([3, 4, 5, 6, 7], np.int32)
    suffixes = draw_suffixes(pool, None, 3, 5000, canary[2:], seed=1, canary_index=0)
    assert suffixes.shape == (5000, 3) and not np.any(np.all(suffixes == canary[2:], axis=1))
    assert np.array_equal(suffixes, draw_suffixes(pool, None, 3, 5000, canary[2:], seed=1, canary_index=0))
    assert not np.array_equal(suffixes, draw_suffixes(pool, None, 3, 5000, canary[2:], seed=1, canary_index=1))
    res, scores = random_sampling(stepper, canary, 2, suffixes, batch=1024)
    assert res.rank == 1 + int(np.sum(scores <= res.canary_log_perplexity)) and res.candidates == 5000
    # the most likely suffix in the pool, planted as "the canary", ranks first
    best = suffixes[np.argmin(scores)]
    top, _ = random_sampling(stepper, np.r_[canary[:2], best], 2, suffixes[~np.all(suffixes == best, axis=1)], batch=1024)
    assert top.rank == 1 and top.memorized
    with pytest.raises(FedprivError, match="prefix"):
        random_sampling(stepper, canary, 5, suffixes)


def test_beam_search_finds_the_exact_top_continuations():
    """With the beam as wide as every 2-word start (6^2), beam search is exhaustive: its top 5 are
    the 5 best of all 6^3 continuations scored by the full model."""
    task = tiny_task(6)
    params = sharpened_params(task, seed=2)
    stepper = NWPStepper(task, params)
    prefix = np.array([task.vocab.bos, 2], np.int32)
    found = beam_search(stepper, prefix, 3, width=36, top=5)
    allsuf = enumerate_suffixes(stepper.word_ids(), 3, np.array([-1, -1, -1]))
    ids = np.concatenate([np.tile(prefix, (len(allsuf), 1)), allsuf], axis=1)
    scores = full_log_probs(task, params, ids)[:, 1:].sum(axis=1)
    order = np.argsort(-scores)[:5]
    assert [seq for seq, _ in found] == [tuple(int(t) for t in allsuf[i]) for i in order]
    np.testing.assert_allclose([s for _, s in found], scores[order], atol=2e-5)
    narrow = beam_search(stepper, prefix, 3, width=5, top=5)
    assert all(1 <= t <= 6 for seq, _ in narrow for t in seq)  # never pad/oov/bos/eos
    with pytest.raises(FedprivError):
        beam_search(stepper, prefix, 3, width=3, top=5)
    with pytest.raises(FedprivError, match="continuations exist"):
        beam_search(stepper, prefix, 1, width=10, top=7)


# ---- exposure -------------------------------------------------------------------------------------
def test_exposure_formulas():
    assert exposure_from_rank(1, 1024) == 10.0 and exposure_from_rank(1024, 1024) == 0.0
    assert exact_exposure(1.0, np.array([0.5, 2.0, 3.0, 0.1])) == pytest.approx(math.log2(5) - math.log2(3))
    assert interpolated_exposure(0, 100, 2**20) == 20.0
    # half the samples below the canary: estimated rank 1 + (|R| - 1) / 2
    assert interpolated_exposure(50, 100, 1001) == pytest.approx(math.log2(1001) - math.log2(501))
    with pytest.raises(FedprivError):
        interpolated_exposure(5, 3, 100)
    # ties count against the canary: a model that scores every candidate alike exposes nothing
    assert exact_exposure(1.0, np.array([1.0, 2.0, 1.0])) == pytest.approx(math.log2(4) - math.log2(3))
    assert exact_exposure(1.0, np.ones(1023)) == 0.0
    # and the skew-normal has nothing to fit (scipy's fit raised FitError and stopped the audit)
    assert extrapolated_exposure(1.0, np.ones(50), 1024) is None


def test_exposure_on_an_enumerable_toy_matches_brute_force():
    """40 words, 3-word suffixes: |R| = 64,000 candidates, all scored. Interpolating from the whole
    space is the exact value; from 2,000 samples it and the skew-normal extrapolation agree with
    brute force within 0.3 bits for canaries of exposure <= 6 bits, and the extrapolation within
    3 bits in the far tail (ranks 1-60 of 64,000, where 2,000 samples see no or few candidates
    below the canary and the fitted tail decides; measured gaps there were <= 2.4 bits)."""
    task = tiny_task(40)
    stepper = NWPStepper(task, sharpened_params(task))
    allsuf = enumerate_suffixes(stepper.word_ids(), 3, np.array([-1, -1, -1]))
    ppl = -suffix_log_probs(stepper, np.array([task.vocab.bos, 3, 4], np.int32), allsuf, batch=8192)
    order = np.argsort(ppl)
    rng = np.random.default_rng(0)
    for r in (0, 3, 60, 1000, 10_000, 32_000):
        c = order[r]
        others = np.delete(ppl, c)
        exact = exact_exposure(ppl[c], others)
        assert exact == pytest.approx(math.log2(64_000) - math.log2(r + 1))
        assert interpolated_exposure(int(np.sum(others <= ppl[c])), len(others), 64_000) == pytest.approx(exact)
        sample = others[rng.choice(len(others), 2000, replace=False)]
        extra = extrapolated_exposure(ppl[c], sample, 64_000)
        inter = interpolated_exposure(int(np.sum(sample <= ppl[c])), 2000, 64_000)
        if exact <= 6:
            assert abs(extra - exact) <= 0.3 and abs(inter - exact) <= 0.3, (r, exact, extra, inter)
        else:
            assert abs(extra - exact) <= 3.0, (r, exact, extra)


def test_the_audit_counts_and_marks_exposures_at_the_sampled_ceiling():
    """audit.json's summary counts the canaries whose sampled estimate is log2 |R| (they beat every
    sampled suffix: a ceiling, not a measurement) and audit.md marks them; an enumerated R at log2
    |R| is a measurement and is not marked."""
    from fedpriv.memorization.audit import markdown, summarize

    def row(i, exposure, method):
        return {"id": f"c{i}", "p_u": 1.0, "p_e": 1.0, "sharers": 1, "insertions": 1, "rs_memorized": exposure > 30, "rs_rank": 1.0,
                "bs_memorized": False, "exposure": exposure, "exposure_extrapolated": 20.0, "exposure_method": method, "candidate_space_log2": 36.9}

    rows = [row(0, 36.9, "sampled"), row(1, 12.0, "sampled"), row(2, 36.9, "exact")]
    summary = summarize(rows, "nwp")
    assert summary["total"]["exposure_at_ceiling"] == 1 and summary["total"]["exposure_max"] == 36.9
    report = {"task": "nwp", "run_dir": "r", "parameters": "p", "summary": summary, "canaries": rows,
              "settings": {"rs_candidates": 20000, "beam_width": 5, "beam_top": 5}}
    text = markdown(report)
    assert text.count("(ceiling)") == 2  # the capped canary's cell, and the note naming the mark
    assert "| c0 |" in text and "36.9 (ceiling)" in text.split("| c0 |")[1].split("\n")[0]
    assert "(ceiling)" not in text.split("| c2 |")[1].split("\n")[0]
    assert "1 exposure(s) marked (ceiling) beat every sampled suffix" in text
