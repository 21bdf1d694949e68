"""What the report's numbers are: exposure at the ceiling of its estimate, what each epsilon in
the CSV files protects, one utility-vs-epsilon panel per promise, and each seed's population.

All synthetic (no store is trained): summaries, audit rows and ledger events written here.
"""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from fedpriv.memorization.exposure import at_ceiling, beat_every_draw_bound, interpolated_exposure
from fedpriv.privacy.accounting import GaussianSteps
from fedpriv.report import plots
from fedpriv.report.tables import (
    COMPARISON_COLUMNS,
    CONFIGURATION_COLUMNS,
    RUN_COLUMNS,
    comparison_markdown,
    comparison_rows,
    comparison_table_lines,
    configuration_rows,
    exposure_series,
    group_csv_rows,
    group_rows,
    utility_points,
    write_csv,
)

SPACE = 1250.0**2  # |R|: 1,250 words, a 2-word suffix: log2 |R| = 20.6 bits
DRAWS = 2000  # sampled suffixes per canary


def _canary(i: int, beaten_by: int, extrapolated: float | None = None, method: str = "sampled") -> dict:
    """An NWP audit row: ``beaten_by`` of the DRAWS sampled suffixes score at or below the canary."""
    exposure = interpolated_exposure(beaten_by, DRAWS, SPACE) if method == "sampled" else math.log2(SPACE) - math.log2(1 + beaten_by)
    return {"id": f"c{i}", "p_u": 1e-4, "p_e": 1.0, "insertions": 3, "rs_memorized": beaten_by == 0, "bs_memorized": False, "rs_rank": beaten_by + 1,
            "rs_candidates": DRAWS, "exposure": exposure, "exposure_method": method, "exposure_extrapolated": extrapolated,
            "candidate_space_log2": math.log2(SPACE)}


def _summary(name: str, kind: str = "federated", canaries: list[dict] | None = None, **kw) -> dict:
    exps = [c["exposure"] for c in canaries or []]
    total = {"canaries": len(exps), "rs_memorized": sum(c["rs_memorized"] for c in canaries or []), "bs_memorized": 0,
             "exposure_mean": float(np.mean(exps)) if exps else None, "exposure_max": max(exps) if exps else None}
    return {"name": name, "kind": kind, "users": "natural", "algorithm": kw.pop("algorithm", "FedAvg"), "clients_per_round": 10, "eval_accuracy": 0.2,
            "eval_perplexity": 90.0, "utility": 0.2, "utility_metric": "accuracy", "utility_label": "accuracy", "audit": {"total": total, "by_configuration": {}}, **kw}


def _cells(lines: list[str], run: str) -> dict[str, str]:
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    row = next(line for line in lines if line.startswith(f"| {run} |"))
    return dict(zip(header, (c.strip() for c in row.strip("|").split("|"))))


# ---- 1. exposure at the ceiling of its estimate ---------------------------------------------------------
def test_a_canary_that_beats_every_draw_is_at_the_ceiling_not_measured():
    """k = 0 of N draws gives log2 |R| (20.6 bits), the most the interpolation can give; k = 1 gives
    about log2 N. What the draws show is a 95% lower bound: the rank at which missing every draw
    has probability 5%."""
    top = interpolated_exposure(0, DRAWS, SPACE)
    assert top == pytest.approx(math.log2(SPACE)) and round(top, 1) == 20.6
    assert interpolated_exposure(1, DRAWS, SPACE) == pytest.approx(math.log2(DRAWS), abs=0.01)
    assert at_ceiling(top, math.log2(SPACE), "sampled")
    assert not at_ceiling(interpolated_exposure(1, DRAWS, SPACE), math.log2(SPACE), "sampled")
    assert not at_ceiling(top, math.log2(SPACE), "exact")  # R enumerated: rank 1 in R is measured
    bound = beat_every_draw_bound(DRAWS, SPACE)
    f = (2 ** (math.log2(SPACE) - bound) - 1) / (SPACE - 1)  # the fraction of R at or below a canary at the bound
    assert (1 - f) ** DRAWS == pytest.approx(0.05, rel=1e-6)
    assert math.log2(DRAWS / 3.2) < bound < math.log2(DRAWS) < top


def _ceiling_store():
    """sgd: 2 of 3 canaries (seed 0) and 1 of 3 (seed 1) beat every draw; dp: none; exact: R enumerated, rank 1."""
    canaries = {
        "sgd-s0": [_canary(0, 0, 17.5), _canary(1, 0, 12.25), _canary(2, 40, 5.0)],
        "sgd-s1": [_canary(0, 0, None), _canary(1, 3, 9.0), _canary(2, 500, 2.0)],
        "dp-s0": [_canary(0, 1, 11.5), _canary(1, 20, 6.0), _canary(2, 700, 1.0)],
        "dp-s1": [_canary(0, 2, 10.0), _canary(1, 30, 5.5), _canary(2, 900, 0.5)],
        "exact-s0": [_canary(0, 0, 15.0, method="exact"), _canary(1, 9, 6.0, method="exact")],
    }
    runs, summaries = [], {}
    for name, rows in canaries.items():
        group, seed = name.rsplit("-s", 1)
        runs.append({"name": name, "kind": "federated", "group": group, "seed": int(seed)})
        private = dict(epsilon=2.0, delta=1e-5, privacy_unit="user", guarantee="user-level, add-or-remove-one user") if group == "dp" else {}
        summaries[name] = _summary(name, canaries=rows, group=group, seed=int(seed), **private)
    return runs, summaries, canaries


def test_a_max_at_the_ceiling_is_marked_with_its_extrapolation_and_the_mean_counts_them():
    runs, summaries, canaries = _ceiling_store()
    run_rows = comparison_rows(runs, summaries, canaries)
    rows = {r["run"]: r for r in group_rows(run_rows, canaries)}
    sgd, dp, exact = rows["sgd"], rows["dp"], rows["exact"]
    assert (sgd["exposure_at_ceiling"], sgd["exposure_scored"], sgd["exposure_max_at_ceiling"]) == (3, 6, True)
    assert sgd["exposure_max_extrapolated_bits"] == 17.5
    assert (dp["exposure_at_ceiling"], dp["exposure_max_at_ceiling"]) == (0, False) and dp["exposure_max_extrapolated_bits"] == 11.5
    assert (exact["exposure_at_ceiling"], exact["exposure_max_at_ceiling"]) == (0, False)  # a measurement, not a ceiling
    lines = comparison_table_lines(list(rows.values()))
    assert _cells(lines, "sgd")["exposure max (bits)"] == "20.6 at ceiling, extrapolated 17.5"
    assert _cells(lines, "sgd")["exposure mean (bits)"].endswith(" (3/6 at ceiling)")
    assert _cells(lines, "dp")["exposure max (bits)"] == f"{math.log2(DRAWS):.3g}" and "ceiling" not in _cells(lines, "dp")["exposure mean (bits)"]
    assert _cells(lines, "exact")["exposure max (bits)"] == "20.6"
    md = comparison_markdown("x", list(rows.values()), [], [r["name"] for r in runs], [], [], [])
    note = next(line for line in md.splitlines() if line.startswith("- sgd:"))
    bound = beat_every_draw_bound(DRAWS, SPACE)
    assert note == (f"- sgd: 3 of 6 canaries at the ceiling log2 |R| = 20.6 bits; each beat all 2,000 sampled suffixes, so its exposure is at least "
                    f"{bound:.3g} bits (95% confidence); extrapolated (bits): sgd-s0 17.5, 12.2; sgd-s1 none.")
    assert "**Exposure at the ceiling.**" in md and "not a measurement" in md
    assert not any(line.startswith(("- dp:", "- exact:")) for line in md.splitlines())
    # runs.csv and comparison.csv carry the same facts
    by_run = {r["run"]: r for r in run_rows}
    assert (by_run["sgd-s0"]["exposure_at_ceiling"], by_run["sgd-s1"]["exposure_at_ceiling"], by_run["dp-s0"]["exposure_at_ceiling"]) == (2, 1, 0)
    for columns in (RUN_COLUMNS, COMPARISON_COLUMNS):
        assert {"exposure_at_ceiling", "exposure_max_at_ceiling", "exposure_max_extrapolated_bits"} <= set(columns)
    flat = {r["run"]: r for r in group_csv_rows(list(rows.values()))}
    assert (flat["sgd"]["exposure_at_ceiling"], flat["sgd"]["exposure_max_at_ceiling"], flat["sgd"]["exposure_max_extrapolated_bits"]) == (3, True, 17.5)
    config = configuration_rows(["sgd-s0", "dp-s0"], canaries)
    assert [row["cells"]["sgd-s0"]["exposure_at_ceiling"] for row in config] == [2] and "exposure_at_ceiling" in CONFIGURATION_COLUMNS
    series = {s["run"]: s for s in exposure_series(["sgd-s0", "dp-s0"], summaries, canaries)}
    assert series["sgd-s0"]["ceiling"] == [True, True, False] and series["dp-s0"]["ceiling"] == [False] * 3


# ---- 2. what each epsilon of the CSV files protects --------------------------------------------------------
def _privacy_store():
    """DP runs, two seeds each: example-level Poisson DP-SGD (δ 1e-5), user-level Poisson and
    fixed-size DP-FedAvg (δ 1e-3), client-side record-level DP-SGD (δ 1e-5); their guarantees do not name the relation: the ledger knows it."""
    spec = {
        "dpsgd": ("central", "example", GaussianSteps("poisson", 1.0, 5000, 64.0, 100, "example"), 1e-5),
        "poisson": ("federated", "user", GaussianSteps("poisson", 1.0, 300, 20.0, 50, "user"), 1e-3),
        "fixed": ("federated", "user", GaussianSteps("fixed", 1.0, 300, 20.0, 50, "user"), 1e-3),
        "client": ("federated", "example (client-side)", GaussianSteps("poisson", 1.0, 5000, 64.0, 100, "example"), 1e-5),
    }
    runs, summaries, ledgers = [], {}, {}
    for group, (kind, unit, event, delta) in spec.items():
        for seed in (0, 1):
            name = f"{group}-s{seed}"
            runs.append({"name": name, "kind": kind, "group": group, "seed": seed})
            summaries[name] = _summary(name, kind, group=group, seed=seed, epsilon=3.0 + seed, delta=delta, privacy_unit=unit, batch_size=64,
                                       guarantee=f"{unit}-level; {event.sampling_text()}")
            ledgers[name] = [event]
    runs.append({"name": "sgd-s0", "kind": "central", "group": "sgd", "seed": 0})
    summaries["sgd-s0"] = _summary("sgd-s0", "central", group="sgd", seed=0, batch_size=64)
    return runs, summaries, ledgers


def test_the_csv_files_say_what_each_epsilon_protects(tmp_path):
    runs, summaries, ledgers = _privacy_store()
    run_rows = comparison_rows(runs, summaries, {}, ledgers)
    groups = group_rows(run_rows, {})
    write_csv(tmp_path / "runs.csv", RUN_COLUMNS, run_rows)
    write_csv(tmp_path / "comparison.csv", COMPARISON_COLUMNS, group_csv_rows(groups))
    for name, key in (("runs.csv", "run"), ("comparison.csv", "run")):
        with (tmp_path / name).open(newline="") as f:
            table = {r[key]: r for r in csv.DictReader(f)}
        for run in table:
            group = run.rsplit("-s", 1)[0]
            got = (table[run]["epsilon_unit"], table[run]["neighbouring"], table[run]["delta"])
            want = {"dpsgd": ("example", "add-or-remove-one", "1e-05"), "poisson": ("user", "add-or-remove-one", "0.001"),
                    "fixed": ("user", "replace-one", "0.001"), "sgd": ("", "", ""),
                    "client": ("example (client-side)", "add-or-remove-one", "1e-05")}[group]  # a record inside a client: not dpsgd's promise
            assert got == want, (name, run, got)
    cells = {r["run"]: r for r in groups}
    assert "replace-one" in _cells(comparison_table_lines(groups), "fixed")["ε (δ)"]  # the ledger's relation reaches the ε cell
    assert cells["poisson"]["neighbouring"] == "add-or-remove-one"


def test_seeds_of_two_relations_or_deltas_are_not_one_csv_promise():
    runs, summaries, ledgers = _privacy_store()
    ledgers["fixed-s1"] = [GaussianSteps("poisson", 1.0, 300, 20.0, 50, "user")]
    summaries["fixed-s1"]["delta"] = 1e-2
    (fixed,) = [r for r in group_rows(comparison_rows(runs, summaries, {}, ledgers), {}) if r["run"] == "fixed"]
    assert fixed["neighbouring"] == "mixed (replace-one, add-or-remove-one)" and "guarantees differ" in fixed["flag"]
    assert fixed["delta"] == 1e-2  # every seed promises (largest ε, largest δ)


# ---- 3. one utility-vs-epsilon panel per (unit, relation, δ) -----------------------------------------------
def test_the_utility_plot_never_puts_two_promises_on_one_axis():
    runs, summaries, ledgers = _privacy_store()
    points = utility_points(comparison_rows(runs, summaries, {}, ledgers))
    fig = plots.utility_vs_epsilon_figure(points)
    labels = sorted(ax.get_xlabel() for ax in fig.axes)
    assert labels == ["ε (example-level DP, add-or-remove-one, δ = 1e-05; log scale)",
                      "ε (record-level DP inside each client, add-or-remove-one, δ = 1e-05; log scale)",  # per example too, but not DP-SGD's promise
                      "ε (user-level DP, add-or-remove-one, δ = 0.001; log scale)", "ε (user-level DP, replace-one, δ = 0.001; log scale)"]
    legend = [t.get_text() for t in fig.axes[-1].get_legend().get_texts()]
    assert legend == ["dpsgd (example-level DP, add-or-remove-one, δ = 1e-05)", "sgd", "poisson (user-level DP, add-or-remove-one, δ = 0.001)",
                      "fixed (user-level DP, replace-one, δ = 0.001)", "client (record-level DP inside each client, add-or-remove-one, δ = 1e-05)"]
    for ax in fig.axes:  # each panel: its own promise's two seeds and the non-private run at the edge
        assert sum(len(c.get_offsets()) for c in ax.collections) == 3
    one = plots.utility_vs_epsilon_figure([p for p in points if p["group"] in ("poisson", "sgd")])
    assert [ax.get_xlabel() for ax in one.axes] == ["ε (user-level DP, add-or-remove-one, δ = 0.001; log scale)"]


# ---- 4. each seed draws its own held-out users: its own N and q ------------------------------------------------
def test_a_row_states_each_seeds_population_when_the_seeds_differ():
    """The split of held-out users is salted with the seed, so user-level DP-SGD trained on 346
    users in seed 0 and 287 in seed 1: the row's assumptions cannot be seed 0's alone."""
    runs, summaries, ledgers = [], {}, {}
    for seed, users in ((0, 346), (1, 287)):
        name = f"dp-sgd-user-s{seed}"
        event = GaussianSteps("poisson", 1.0, users, 20.0, 40, "user")
        runs.append({"name": name, "kind": "central", "group": "dp-sgd-user", "seed": seed})
        summaries[name] = _summary(name, "central", group="dp-sgd-user", seed=seed, epsilon=4.0, delta=1e-5, privacy_unit="user", batch_size=20,
                                   guarantee=f"epsilon = 4 at delta = 1e-05; user-level, add-or-remove-one user; {event.sampling_text()}")
        ledgers[name] = [event]
    run_rows = comparison_rows(runs, summaries, {}, ledgers)
    assert [(r["population"], r["sampling_rate"]) for r in run_rows] == [(346, 20 / 346), (287, 20 / 287)]
    (row,) = group_rows(run_rows, {})
    text = row["assumptions"]
    assert text.startswith("dp-sgd-user-s0 (each seed's own guarantee is in runs.csv): epsilon = 4")
    assert text.endswith(f"N and q differ by seed (each seed draws its own held-out users): dp-sgd-user-s0 N = 346 users and q = {20 / 346:.6g}; "
                         f"dp-sgd-user-s1 N = 287 users and q = {20 / 287:.6g}")
    assert text in _cells(comparison_table_lines([row]), "dp-sgd-user")["assumptions"].replace("\\|", "|")
    assert "population" in RUN_COLUMNS and "sampling_rate" in RUN_COLUMNS
    same = {n: {**s, "guarantee": "user-level, add-or-remove-one user"} for n, s in summaries.items()}
    (plain,) = group_rows(comparison_rows(runs, same), {})
    assert plain["assumptions"] == "user-level, add-or-remove-one user"  # one text for every seed: said once, as it was


def test_an_exposure_contrast_says_how_many_canaries_of_each_side_are_at_the_ceiling():
    """The means count ceiling canaries at log2 |R|: the contrast of two means says how many of
    each side's were there (Markdown cell and contrasts.csv), and the RS contrast is unchanged."""
    from fedpriv.report.tables import CONTRAST_COLUMNS, contrast_rows, contrast_table_lines

    run_rows = [{"run": "sgd-s0", "group": "sgd", "seed": 0, "canaries": 3, "target_metric": "acc", "test_utility": 0.1},
                {"run": "dp-s0", "group": "dp", "seed": 0, "canaries": 3, "target_metric": "acc", "test_utility": 0.1}]
    canaries = {"sgd-s0": [_canary(0, 0), _canary(1, 0), _canary(2, 40)], "dp-s0": [_canary(i, 40) for i in range(3)]}  # beaten by no draw: at the ceiling
    rows = contrast_rows([{"name": "c", "a": "sgd", "b": "dp"}], run_rows, canaries, [])
    exposure = [r for r in rows if r["quantity"] == "exposure mean (bits)"]
    assert [r["exposure_at_ceiling"] for r in exposure] == ["2/3 − 0/3"] and "exposure_at_ceiling" in CONTRAST_COLUMNS
    assert all("exposure_at_ceiling" not in r for r in rows if r["quantity"] != "exposure mean (bits)")
    assert any("exposure mean (bits) (at ceiling: 2/3 − 0/3)" in line for line in contrast_table_lines(rows))
