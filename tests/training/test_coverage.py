"""Filters before DP (issue 30, point 6): the group size the guarantee accounts for is what the
filters actually do to one added or removed example, and the guarantee states it in numbers."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from fedpriv.config import DataConfig
from fedpriv.data.corpus import FederatedCorpus
from fedpriv.data.examples import TextExample
from fedpriv.privacy.accounting import GaussianSteps
from fedpriv.privacy.budget import DPBudget
from fedpriv.training.coverage import Coverage, filter_group


def _filtered(users: dict[str, list[str]], data: DataConfig) -> Counter:
    """The multiset of (user, text) training records after the data filters, as prepare applies them."""
    corpus = FederatedCorpus.from_dict({u: [TextExample(t) for t in texts] for u, texts in users.items()})
    if data.min_examples > 1:
        corpus = corpus.with_min_examples(data.min_examples)
    if data.max_examples_per_user is not None:
        corpus = corpus.truncated(data.max_examples_per_user)
    return Counter((u, ex.text) for u, exs in corpus.users() for ex in exs)


def _changed(a: Counter, b: Counter) -> int:
    return sum(((a - b) + (b - a)).values())


@pytest.mark.parametrize("data", [DataConfig(max_examples_per_user=3), DataConfig(min_examples=4), DataConfig(min_examples=4, max_examples_per_user=3),
                                  DataConfig(min_examples=2, max_examples_per_user=5), DataConfig()])
def test_one_added_example_changes_at_most_k_filtered_examples_and_k_is_reached(data):
    users = {"a": [f"a{i}" for i in range(6)], "b": ["b0", "b1", "b2"], "c": ["c0"], "d": [f"d{i}" for i in range(4)]}
    base = _filtered(users, data)
    worst = 0
    for u in users:  # add one example at every position of every user's list, and to a new user
        for pos in range(len(users[u]) + 1):
            grown = {**users, u: users[u][:pos] + ["new"] + users[u][pos:]}
            worst = max(worst, _changed(base, _filtered(grown, data)))
        for pos in range(len(users[u])):  # and remove each one
            shrunk = {**users, u: users[u][:pos] + users[u][pos + 1:]}
            worst = max(worst, _changed(base, _filtered({k: v for k, v in shrunk.items() if v}, data)))
    k, why = filter_group(data)
    assert worst == k  # the bound holds and is tight on this corpus
    assert (k == 1) == (why == "")


def test_the_guarantee_states_the_filtered_data_and_the_raw_data_figure():
    data = DataConfig(max_examples_per_user=8)  # experiments/empirical-privacy.toml
    k, why = filter_group(data)
    budget = DPBudget(GaussianSteps("poisson", 1.0, 2000, 64.0, 800), 1.0, None, 1e-5)
    budget.coverage = Coverage((), k, why)
    for _ in range(3):
        budget.record()
    rep = budget.report()
    eps, delta = rep["epsilon"], rep["delta"]
    g = rep["guarantee"]
    assert "epsilon is with respect to the filtered training data: data.max_examples_per_user = 8 keeps each user's first 8" in g
    assert f"epsilon = {2 * eps:.4g} at delta = {delta * (1 + math.exp(eps)):.3g}" in g  # group of 2: (2 eps, (1 + e^eps) delta)
    assert Coverage((), 1, "").statement(eps, delta) == ""


@pytest.mark.parametrize("eps", [10.0, 23.3, 1e6])
def test_a_raw_data_figure_with_delta_of_one_or_more_is_not_printed(eps):
    """With a large epsilon, group privacy over k examples gives delta_k >= 1 (z = 0.3 printed
    'epsilon = 23.3 at delta = 1.15'), or overflows a float (target_epsilon = 1e6 ended in an
    internal OverflowError after step 1): no figure, and why."""
    from fedpriv.privacy.group import group_privacy, vacuous

    k = 8
    ek, dk = group_privacy(eps, 1e-5, k)
    assert ek == k * eps and vacuous(dk)
    text = Coverage((), k, "data.max_examples_per_user = 8 keeps each user's first 8").statement(eps, 1e-5)
    assert "no raw-data figure is given" in text and "a delta of 1 or more" in text and "at delta =" not in text
    ek, dk = group_privacy(1.0, 1e-5, k)  # below it, the figure: (k eps, delta sum_(i<k) e^(i eps)), exact
    assert not vacuous(dk) and dk == pytest.approx(1e-5 * (math.exp(8.0) - 1) / (math.exp(1.0) - 1), rel=1e-12)
    assert f"epsilon = 8 at delta = {dk:.3g}" in Coverage((), k, "x").statement(1.0, 1e-5)
    assert group_privacy(3.0, 0.0, 400) == (1200.0, 0.0)  # pure DP stays pure, whatever e^(k eps)


def test_group_privacy_doctest():
    import doctest

    from fedpriv.privacy import group

    result = doctest.testmod(group)
    assert result.failed == 0 and result.attempted >= 4


def test_a_correlated_noise_run_gives_no_raw_data_figure():
    """Group privacy over the filters assumes the sampling is symmetric in record order; the cyclic schedule
    of a correlated-noise mechanism is by record index (and by N), so its guarantee gives no raw-data figure."""
    from fedpriv.config import validate_config
    from fedpriv.training.coverage import coverage

    raw = {"name": "c", "data": {"source": "shakespeare", "max_examples_per_user": 8}, "task": {"kind": "nwp", "model": "tiny"},
           "privacy": {"clip_norm": 1.0, "noise_multiplier": 2.0, "delta": 1e-6}}
    gaussian = coverage(validate_config(raw), None, "example").statement(1.0, 1e-6)
    blt = coverage(validate_config({**raw, "privacy": {**raw["privacy"], "mechanism": "blt"}}), None, "example").statement(1.0, 1e-6)
    assert "by group privacy" in gaussian and "no raw-data figure" not in gaussian
    assert "epsilon is with respect to the filtered training data" in blt
    assert "no raw-data figure is given: under the correlated-noise mechanism's cyclic schedule" in blt and "by group privacy" not in blt


def test_a_replace_one_guarantee_gives_no_raw_data_figure():
    """Fixed-size batches give a replace-one epsilon (N fixed); a filter turns one added raw example into
    a change of N, which no group of replacements covers, so no group-privacy figure is printed."""
    from fedpriv.config import validate_config
    from fedpriv.training.coverage import coverage

    raw = {"name": "c", "data": {"source": "shakespeare", "min_examples": 5}, "task": {"kind": "nwp", "model": "tiny"},
           "privacy": {"clip_norm": 1.0, "noise_multiplier": 2.0, "delta": 1e-6, "sampling": "fixed"}}
    fixed = coverage(validate_config(raw), None, "example").statement(1.0, 1e-6)
    assert "epsilon is with respect to the filtered training data: data.min_examples = 5" in fixed
    assert "no raw-data figure is given: fixed-size batches give a replace-one epsilon" in fixed and "by group privacy" not in fixed
