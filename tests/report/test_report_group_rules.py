"""Group rows, contrasts, intervals and planned steps of the report: rules a mutation review found untested."""

from __future__ import annotations

import math

import numpy as np
import pytest


def test_interval_bounds_are_the_2_5th_and_97_5th_percentiles():
    """Each side of the interval, not only its width (a 5th-percentile low bound keeps the width within 10%)."""
    from fedpriv.report.intervals import interval

    values = (np.random.default_rng(7).random(4000) < 0.3).astype(float)
    est = interval([values])
    p = values.mean()
    half = 1.96 * math.sqrt(p * (1 - p) / len(values))
    assert p - est.low == pytest.approx(half, rel=0.08) and est.high - p == pytest.approx(half, rel=0.08)


def _s(name, kind="federated", **kw):
    audit = {"total": {"canaries": 2, "inserted": 2, "rs_memorized": 1, "bs_memorized": 0, "exposure_mean": 3.0, "exposure_max": 5.0}, "by_configuration": {}}
    return {"name": name, "kind": kind, "users": "natural", "eval_accuracy": 0.2, "eval_perplexity": 90.0, "audit": audit, "algorithm": "FedAvg",
            "clients_per_round": 10, **kw}


def _two_seeds(group, per_seed):
    runs, summaries = [], {}
    for seed, kw in enumerate(per_seed):
        name = f"{group}-s{seed}"
        runs.append({"name": name, "kind": "federated", "group": group, "seed": seed})
        summaries[name] = _s(name, group=group, seed=seed, **kw)
    return runs, summaries


def test_a_groups_empirical_epsilon_is_its_smallest_seeds_lower_bound():
    from fedpriv.report.tables import comparison_rows, group_rows

    runs, summaries = _two_seeds("dp", [{"empirical": {"epsilon_lower_bound": e, "unit": "user"}} for e in (1.2, 0.5)])
    (row,) = group_rows(comparison_rows(runs, summaries), {})
    assert row["empirical_epsilon"] == 0.5  # the largest of two 95% lower bounds is not one


def test_a_contrast_with_one_untargeted_side_is_not_at_matched_utility():
    from fedpriv.report.tables import NO_TARGET, comparison_rows, contrast_rows

    target = {"metric": "accuracy", "value": 0.1, "split": "validation", "at": "round", "reached": True, "when": 4, "reached_value": 0.12}
    ra, sa = _two_seeds("a", [{"target": target, "utility": 0.2}] * 2)
    rb, sb = _two_seeds("b", [{"utility": 0.3}] * 2)
    rows = contrast_rows([{"name": "c", "a": "a", "b": "b"}], comparison_rows(ra + rb, {**sa, **sb}), {}, [])
    assert rows and all(r["comparable"] == NO_TARGET for r in rows)


def test_the_target_cell_gives_the_seeds_range_smallest_first():
    from fedpriv.report.tables import comparison_rows, group_rows

    t = {"metric": "accuracy", "value": 0.1, "split": "validation", "at": "round", "reached": True, "reached_value": 0.12}
    runs, summaries = _two_seeds("g", [{"target": {**t, "when": 40}}, {"target": {**t, "when": 30}}])
    (row,) = group_rows(comparison_rows(runs, summaries), {})
    assert row["target"] == "2/2 reached, at rounds 30–40"


def test_a_max_at_the_ceiling_is_marked_only_when_the_max_is_the_ceiling():
    """Seeds draw their own held-out users, so their vocabularies and |R| can differ: seed 0's canary
    at its ceiling (20 bits) is below seed 1's measured 21 bits, and the max (21) is a measurement."""
    from fedpriv.report.tables import comparison_rows, group_rows

    base = {"p_u": 1e-4, "p_e": 1.0, "insertions": 3, "rs_memorized": True, "bs_memorized": False, "rs_candidates": 2000}
    canaries = {"g-s0": [{**base, "exposure": 20.0, "exposure_method": "sampled", "candidate_space_log2": 20.0}],
                "g-s1": [{**base, "exposure": 21.0, "exposure_method": "exact", "candidate_space_log2": 22.0}]}
    runs, summaries = _two_seeds("g", [{}, {}])
    summaries["g-s0"]["audit"]["total"] = {"canaries": 1, "exposure_max": 20.0}
    summaries["g-s1"]["audit"] = {"total": {"canaries": 1, "exposure_max": 21.0}}
    (row,) = group_rows(comparison_rows(runs, summaries, canaries), canaries)
    assert row["exposure_at_ceiling"] == 1 and row["exposure_max_bits"] == 21.0 and row["exposure_max_at_ceiling"] is False


def test_the_all_row_of_the_configuration_table_weighs_exposure_by_canaries():
    """Masked-LM cells (no RS/BS) show exposure: the 'all' row's mean is over canaries, not configurations."""
    from fedpriv.report.tables import configuration_rows, configuration_table_lines

    c = {"pattern": "HSH", "p_e": 1.0, "insertions": 1}
    rows = [{**c, "p_u": 0.1, "exposure": 9.0}] + [{**c, "p_u": 0.5, "exposure": 1.0}] * 3
    lines = configuration_table_lines(configuration_rows(["r"], {"r": rows}), ["r"])
    assert lines[-1] == "| all | exposure 3.00 bits (max 9.00) of 4 |"  # (9 + 1 + 1 + 1) / 4, not (9 + 1) / 2


def test_planned_steps_of_an_example_level_run_count_a_partial_last_batch():
    from fedpriv.privacy.accounting import GaussianSteps
    from fedpriv.report.stopping import planned_steps

    event = GaussianSteps("poisson", 1.0, 1000, 64.0, 10, "example")
    assert planned_steps({"training": {"epochs": 2.0, "batch_size": 64}}, "central", event) == 32  # 2 x ceil(1000 / 64)
