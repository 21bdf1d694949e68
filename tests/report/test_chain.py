"""Chains compose epsilon only within one privacy unit (issue 30, point 3)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from fedpriv.privacy.group import group_privacy
from fedpriv.report.chain import NOT_COMPOSED, chain_privacy, chain_stages, compose

NCBI = "tests/data/ncbi-disease/train.tsv"


def _chain(unit: str, bound: int | None = None) -> dict:
    """A DP vocabulary (example-level: Gaussian tuples cut per example, every example one tuple)
    learned by run ``pub``, then DP-SGD of ``unit`` on the same data in run ``dp``."""
    vocab = {"source": NCBI, "longest_example_words": 100,
             "dp": {"mechanism": "gaussian", "epsilon": 0.5, "delta": 1e-6, "partition": "example", "tuple_size": 256, "guarantee": "g"}}
    dp = {"name": "dp", "kind": "central", "task": "mlm", "data_source": NCBI, "starts_from": {"pretrained": "pub"},
          "epsilon": 1.0, "delta": 1e-6, "sampling": "poisson", "guarantee": f"{unit}-level DP-SGD", "privacy_unit": unit}
    if bound is not None:
        dp["max_examples_per_user"] = bound
    return {"pub": {"name": "pub", "kind": "central", "task": "mlm", "data_source": "shakespeare", "vocabulary": vocab}, "dp": dp}


def test_user_level_dp_sgd_and_an_example_level_vocabulary_are_not_summed():
    s = _chain("user")
    c = compose(chain_stages("dp", s), NCBI)
    assert c["status"] == NOT_COMPOSED and c["epsilon"] is None and c["delta"] is None
    assert set(c["units"]) == {"example", "user"} and "different units" in c["why"]
    own = chain_privacy("dp", s)  # the row keeps the run's own user-level figure, not a sum "per example"
    assert (own["epsilon"], own["unit"]) == (1.0, "user") and "not composed" in own["assumptions"]


def test_same_unit_still_composes():
    c = compose(chain_stages("dp", _chain("example")), NCBI)
    assert c["status"] == "private" and c["epsilon"] == pytest.approx(1.5) and c["delta"] == pytest.approx(2e-6)


def test_across_units_with_a_per_user_bound_states_the_group_privacy_conversion():
    c = compose(chain_stages("dp", _chain("user", bound=4)), NCBI)
    assert c["status"] == NOT_COMPOSED and c["epsilon"] is None  # stated, never printed as the chain's figure
    e4, d4 = group_privacy(0.5, 1e-6, 4)
    assert (e4, d4) == (2.0, pytest.approx(1e-6 * (1 + math.exp(0.5) + math.exp(1.0) + math.exp(1.5))))
    assert f"({e4:.4g}, {d4:.3g}) per user" in c["why"] and f"({e4 + 1.0:.4g}, {d4 + 1e-6:.3g}) per user" in c["why"]


def test_a_replace_one_example_stage_is_not_read_per_user():
    """Group privacy over k examples turns add-or-remove-one example into one user of at most k
    examples; a replace-one example-level stage (fixed-size batches: N fixed) gets no per-user figure."""
    from fedpriv.report.chain import Stage, across_units

    fixed = Stage("a", "nwp", "shakespeare", 2.0, 1e-6, "replace-one example", False, "example")
    user = Stage("b", "nwp", "shakespeare", 3.0, 1e-6, "user-level", False, "user", 4)
    why = compose([fixed, user], "shakespeare")["why"]
    assert "no per-user figure: nwp (a) is not an add-or-remove-one example guarantee" in why and "per user of at most" not in why
    assert "per user of at most k = 4" in across_units([dataclasses.replace(fixed, composable=True), user])  # the same stage, add-or-remove-one


def test_a_per_user_figure_with_delta_of_one_or_more_is_not_printed():
    """Group privacy over k = 100 examples at epsilon 0.5 per example gives delta far above 1:
    said, not printed as a figure."""
    from fedpriv.report.chain import Stage, across_units

    ex = Stage("a", "nwp", "shakespeare", 0.5, 1e-6, "example-level", True, "example")
    user = Stage("b", "nwp", "shakespeare", 3.0, 1e-6, "user-level", False, "user", 100)
    why = across_units([ex, user])
    assert "no per-user figure: per user of at most k = 100 examples" in why and "a delta of 1 or more" in why and "-> (" not in why
    assert "-> (" in across_units([ex, dataclasses.replace(user, examples_per_user=4)])  # a small group: the figure


def test_group_privacy_matches_the_chain_argument_and_vadhans_bound():
    for eps, delta, k in [(0.3, 1e-7, 2), (1.0, 1e-5, 8), (2.5, 1e-9, 3)]:
        ek, dk = group_privacy(eps, delta, k)
        assert ek == pytest.approx(k * eps)
        assert dk == pytest.approx(delta * (math.exp(k * eps) - 1) / (math.exp(eps) - 1))
        assert dk <= k * math.exp((k - 1) * eps) * delta  # Vadhan 2017, Lemma 2.2's looser form
    assert group_privacy(0.7, 1e-6, 1) == (0.7, 1e-6)
