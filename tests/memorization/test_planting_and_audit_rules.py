"""Canary planting and audit rules: the first canary keeps an example, only p_u is scaled, the exact/sampled switch, the inserted count."""

from __future__ import annotations

import math

import numpy as np
import pytest


def test_an_example_two_canaries_pick_keeps_the_first_canary():
    from fedpriv.memorization.canaries import choose_insertions

    _, replaced = choose_insertions(np.full(6, 4), [(1.0, 1.0), (1.0, 1.0)], seed=3)
    assert {c for slot in replaced.values() for c in slot.values()} == {0}


def test_the_scaling_rule_scales_p_u_only_never_p_e():
    """100 users of 20 examples, p_u 0.001 scaled x50 (5 expected sharers), p_e 0.02: each sharer has
    about 0.4 of its 20 examples replaced; with p_e scaled too (x50 -> 1) all 20 would be."""
    from fedpriv.config import CanariesConfig
    from fedpriv.data.corpus import FederatedCorpus
    from fedpriv.data.examples import TextExample
    from fedpriv.memorization.canaries import plant_canaries
    from fedpriv.tasks.nwp import NWPTask
    from fedpriv.vocab.word import WordVocab

    task = NWPTask(WordVocab([f"w{i}" for i in range(30)]), seq_len=8, model="tiny")
    corpus = FederatedCorpus.from_dict({f"u{i}": [TextExample(f"x{i} q{j}") for j in range(20)] for i in range(100)})
    cfg = CanariesConfig(per_config=2, user_probabilities=[0.001], example_probabilities=[0.02], min_expected_sharers=5.0)
    _, manifest = plant_canaries(corpus, task, cfg, seed=0, task_kind="nwp")
    assert manifest.scale == pytest.approx(50.0)
    sharers = sum(len(c.sharers) for c in manifest.canaries)
    assert sharers > 0 and all(c.effective_user_probability == pytest.approx(0.05) for c in manifest.canaries)
    assert manifest.total_insertions <= 0.25 * 20 * sharers  # p_e 0.02: ~0.02 of the examples, far from all


def test_a_candidate_space_of_n_plus_one_is_enumerated_and_its_exposure_is_exact():
    """4 words, 3-word suffixes: |R| = 64, so 63 candidates are every other suffix: enumerated ("exact"),
    and exposure = log2 64 - log2 rank (|R| counts the canary)."""
    from fedpriv.config import validate_config
    from fedpriv.memorization.audit import audit_nwp_canary
    from fedpriv.memorization.canaries import Canary, Manifest
    from fedpriv.memorization.lm import NWPStepper
    from fedpriv.tasks.nwp import NWPTask
    from fedpriv.vocab.word import WordVocab
    from memorization_helpers import initial_params

    task = NWPTask(WordVocab([f"w{i}" for i in range(30)]), seq_len=8, model="tiny")
    stepper = NWPStepper(task, initial_params(task, 0))
    pool = ["w1", "w2", "w3", "w4"]
    manifest = Manifest([Canary("c000", ("w1", "w2", "w3", "w4", "w1"), 1.0, 1.0, 1.0)], 0, 1, 1.0, "uniform", pool=pool, weights=np.full(4, 0.25))
    cfg = validate_config({"name": "x", "audit": {"rs_candidates": 63}})
    row = audit_nwp_canary(stepper, manifest, 0, cfg, 63)
    assert row["exposure_method"] == "exact" and row["rs_candidates"] == 63 and row["candidate_space_log2"] == 6.0
    assert row["exposure"] == pytest.approx(6.0 - math.log2(row["rs_rank"]))


def test_the_audit_summary_counts_canaries_inserted_at_least_once():
    from fedpriv.memorization.audit import summarize

    rows = [{"p_u": 1.0, "p_e": 1.0, "insertions": k, "rs_memorized": False, "bs_memorized": False, "exposure": 1.0} for k in (0, 1, 3)]
    assert summarize(rows, "nwp")["total"]["inserted"] == 2
