"""The comparison report (fedpriv.report.tables, fedpriv.report.plots).

The slow tests share one real run store, trained once per session (about a minute on 2 cores) by
fedpriv.report.store.run_experiment from MINI_TOML: two SGD runs (iid, noniid order), DP-SGD,
FedAvg over iid and natural users, DP-FedAvg. Under pytest-xdist the workers share that store
(built under a lock by the first). The fast tests use synthetic data only.
"""

from __future__ import annotations

import csv
import fcntl
import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest
from matplotlib.image import imread

from fedpriv.errors import FedprivError
from fedpriv.privacy.accounting import GaussianSteps, epsilon_for
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.report import plots
from fedpriv.clients.privacy import EVERY_ROUND
from fedpriv.report.stopping import client_promise, promised_summary
from fedpriv.report.tables import DATA_FACTS_CLAUSE, NO_TARGET
from fedpriv.report.uncounted import uncounted_lines
from fedpriv.rundir import LEDGER, RunDir
from fedpriv.report.tables import (
    NOT_PRIVATE,
    PLOT_FILES,
    comparison_markdown,
    comparison_rows,
    comparison_table_lines,
    configuration_rows,
    contrast_rows,
    contrast_table_lines,
    group_csv_rows,
    group_rows,
    not_covered,
    round_up,
    data_label,
    epsilon_curves,
    run_accountant,
    stopped_at,
    unfinished_runs,
    write_report,
)

MINI_TOML = """\
name = "mini"
seed = 0
[data]
source = "shakespeare"
heldout_fraction = 0.1
[vocab]
size = 1000
[task]
kind = "nwp"
model = "tiny"
[training]
optimizer = "adam"
learning_rate = 0.01
batch_size = 32
steps = 60
eval_every = 30
checkpoint_every = 30
[federated]
rounds = 4
clients_per_round = 10
client_learning_rate = 0.5
local_batch_size = 16
max_local_steps = 4
eval_every = 2
[canaries]
per_config = 1
[audit]
rs_candidates = 2000
extraction_examples = 50

[[runs]]
name = "sgd-{order}"
kind = "central"
grid = { "training.order" = ["iid", "noniid"] }

[[runs]]
name = "dp-sgd"
kind = "central"
privacy = { clip_norm = 1.0, noise_multiplier = 1.0, delta = 1e-5, sampling = "poisson" }

[[runs]]
name = "fedavg-{users}"
kind = "federated"
grid = { users = ["iid", "natural"] }

[[runs]]
name = "dp-fedavg"
kind = "federated"
federated = { strategy = "dp-fedavg", clip_norm = 0.5, dp = { noise_multiplier = 0.5, delta = 1e-3 } }
"""
RUNS = ["sgd-iid", "sgd-noniid", "dp-sgd", "fedavg-iid", "fedavg-natural", "dp-fedavg"]
DP_RUNS = ["dp-sgd", "dp-fedavg"]
# drawn only when the store has their data: audits along training, empirical audits (neither in MINI_TOML)
DATA_DEPENDENT_PLOTS = {"memorization_vs_utility.png", "empirical_vs_theoretical.png"}
REPORT_FILES = ["comparison.md", "comparison.csv", "runs.csv", "memorized_by_configuration.csv", *[p for p in PLOT_FILES if p not in DATA_DEPENDENT_PLOTS]]


# ---- the shared store ----------------------------------------------------------------------------
def _shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory this session's xdist workers share (the session's own temp dir without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete run store of MINI_TOML (trained once per session; never modified by tests)."""
    from fedpriv.runner.store import run_experiment

    root = _shared_root(tmp_path_factory)
    built, done = root / "report-store", root / "report-store.done"
    with open(root / "report-store.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            toml = root / "mini.toml"
            toml.write_text(MINI_TOML)
            _, _, complete = run_experiment(toml, built)
            assert complete
            done.touch()
    return built


def _copy(store: Path, dst: Path) -> Path:
    shutil.copytree(store, dst, ignore=shutil.ignore_patterns("report"))
    return dst


@pytest.fixture(scope="module")
def report(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """STORE/report of a copy of the complete store."""
    return write_report(_copy(store, tmp_path_factory.mktemp("report") / "store"))


def _summary(store: Path, run: str) -> dict:
    return json.loads((store / run / "summary.json").read_text())


def _audit_rows(store: Path, run: str) -> list[dict]:
    return json.loads((store / run / "audit.json").read_text())["canaries"]


def _csv(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _assert_png(path: Path) -> None:
    assert path.is_file(), path
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100 and image.shape[2] in (3, 4)


# ---- on a real store (slow: trains the store once) -------------------------------------------------------
@pytest.mark.slow
def test_every_file_is_written(report):
    assert report.name == "report"
    for name in REPORT_FILES:
        assert (report / name).is_file(), name
    drawn = [p for p in PLOT_FILES if p not in DATA_DEPENDENT_PLOTS]
    for name in DATA_DEPENDENT_PLOTS:
        assert not (report / name).exists(), name
    for name in drawn:
        _assert_png(report / name)
    md = (report / "comparison.md").read_text()
    assert md.startswith("# ") and "exposure" in md.lower() and "bits" in md and "assumptions" in md
    assert "## Memorized canaries by configuration" in md
    for name in drawn:
        assert f"![{PLOT_FILES[name]}]({name})" in md
    assert md.index("## Plots") > md.index("## Memorized canaries by configuration")
    assert "Not finished" not in md and "differs" not in md


@pytest.mark.slow
def test_comparison_rows_match_summaries_and_audits(store, report):
    rows = _csv(report / "runs.csv")
    assert [r["run"] for r in rows] == RUNS  # experiment.json order
    groups = {r["run"]: r for r in _csv(report / "comparison.csv")}
    # grouped by privacy unit: not private first, then example-level, then user-level
    assert list(groups) == ["sgd-iid", "sgd-noniid", "fedavg-iid", "fedavg-natural", "dp-sgd", "dp-fedavg"]
    md = (report / "comparison.md").read_text()
    for row in rows:
        s, canaries = _summary(store, row["run"]), _audit_rows(store, row["run"])
        rs, bs = sum(c["rs_memorized"] for c in canaries), sum(c["bs_memorized"] for c in canaries)
        assert (int(row["rs_memorized"]), int(row["bs_memorized"]), int(row["canaries"])) == (rs, bs, len(canaries))
        assert float(row["exposure_max_bits"]) == pytest.approx(max(c["exposure"] for c in canaries))
        assert float(row["test_accuracy"]) == s["eval_accuracy"] and float(row["test_perplexity"]) == s["eval_perplexity"]
        assert float(row["test_utility"]) == s["eval_accuracy_no_oov_no_eos"] and row["utility_metric"] == "accuracy_no_oov_no_eos"
        assert row["training"] == s["kind"] and row["algorithm"] == s["algorithm"]
        g = groups[row["run"]]  # one seed: the group's mean is the run's value, its interval covers the canaries
        assert float(g["rs_memorized"]) == pytest.approx(rs) and float(g["rs_memorized_low"]) <= rs <= float(g["rs_memorized_high"])
        line = next(line for line in md.splitlines() if line.startswith(f"| {row['run']} |"))
        assert f"| {rs:.3g}/{len(canaries)} [" in line and f"| {100 * s['eval_accuracy_no_oov_no_eos']:.2f} |" in line
        if row["run"] in DP_RUNS:
            unit = "user" if row["run"] == "dp-fedavg" else "example"
            assert float(row["epsilon"]) == s["epsilon"] and float(row["delta"]) == s["delta"] and row["privacy_unit"] == unit
            relation = ", replace-one" if "replace-one" in s["guarantee"] else ""  # named when not add-or-remove-one
            assert "; not covered either: " in s["guarantee"]  # the data-facts clause, said once in the report's section instead
            assert row["assumptions"] == DATA_FACTS_CLAUSE.sub("", s["guarantee"]) and "not covered either" not in row["assumptions"]
            assert f"{round_up(s['epsilon']):.3g} per {unit}{relation} (δ = {s['delta']:.3g})" in line  # an upper bound, rounded up
        else:
            assert row["epsilon"] == "" and row["assumptions"] == NOT_PRIVATE and row["privacy_unit"] == ""
            assert "| not private | ∞ |" in line and line.endswith(f"| {NOT_PRIVATE} |")
    by_run = {r["run"]: r for r in rows}
    assert (by_run["sgd-iid"]["data"], by_run["sgd-noniid"]["data"]) == ("IID", "non-IID")
    assert (by_run["fedavg-iid"]["data"], by_run["fedavg-natural"]["data"]) == ("IID", "non-IID")
    assert (by_run["dp-sgd"]["batch"], by_run["dp-sgd"]["batch_unit"]) == ("32", "records")
    assert (by_run["dp-fedavg"]["batch"], by_run["dp-fedavg"]["batch_unit"]) == ("10", "users")


@pytest.mark.slow
def test_by_configuration_sums_to_the_totals(store, report):
    rows = _csv(report / "memorized_by_configuration.csv")
    md = (report / "comparison.md").read_text()
    for run in RUNS:
        s = _summary(store, run)["audit"]
        mine = [r for r in rows if r["run"] == run]
        assert {r["configuration"] for r in mine} == set(s["by_configuration"])
        for r in mine:
            want = s["by_configuration"][r["configuration"]]
            assert (int(r["canaries"]), int(r["rs_memorized"]), int(r["bs_memorized"])) == (want["canaries"], want["rs_memorized"], want["bs_memorized"])
        for key in ("canaries", "rs_memorized", "bs_memorized"):
            assert sum(int(r[key]) for r in mine) == s["total"][key]
    all_line = next(line for line in md.splitlines() if line.startswith("| all |"))
    cells = [c.strip() for c in all_line.strip("|").split("|")][1:]
    assert cells == [f"RS {_summary(store, r)['audit']['total']['rs_memorized']} / BS {_summary(store, r)['audit']['total']['bs_memorized']} of {_summary(store, r)['audit']['total']['canaries']}" for r in RUNS]


@pytest.mark.slow
@pytest.mark.parametrize("run", DP_RUNS)
def test_epsilon_curve_at_the_runs_parameters_is_the_runs_epsilon(store, run):
    s = _summary(store, run)
    spec = next(r for r in json.loads((store / "experiment.json").read_text())["runs"] if r["name"] == run)
    events = PrivacyLedger.load(store / run / LEDGER).entries
    curves = epsilon_curves(events, s["delta"], run_accountant(spec), s["kind"], points=3)
    assert curves["epsilon"] == pytest.approx(s["epsilon"], rel=1e-6)
    assert len(curves["panels"]) == 3
    for panel in curves["panels"]:
        i = next(i for i, x in enumerate(panel["x"]) if math.isclose(x, panel["own"], rel_tol=1e-12))
        assert panel["epsilon"][i] == pytest.approx(s["epsilon"], rel=1e-6), panel["parameter"]


@pytest.mark.slow
def test_an_unfinished_run_is_listed_as_not_finished(store, tmp_path):
    copy = _copy(store, tmp_path / "store")
    (copy / "dp-fedavg" / "summary.json").unlink()
    out = write_report(copy)
    assert [r["run"] for r in _csv(out / "runs.csv")] == [r for r in RUNS if r != "dp-fedavg"]
    md = (out / "comparison.md").read_text()
    # it left metrics: the report says where it stopped (the last round of its metrics)
    last = max(json.loads(line)["step"] for line in (copy / "dp-fedavg" / "metrics.jsonl").read_text().splitlines() if line)
    assert re.search(rf"Not finished \(no summary\.json\): dp-fedavg \(round {last}(, validation [^)]* at round \d+)?\)\.", md), md
    assert not any(line.startswith("| dp-fedavg |") for line in md.splitlines())
    _assert_png(out / "epsilon_vs_parameters.png")  # dp-sgd is still there
    (copy / "dp-fedavg" / "metrics.jsonl").unlink()  # a run that never wrote a row: its name alone
    assert stopped_at(RunDir(copy / "dp-fedavg")) == ""
    assert comparison_markdown("x", [], [], [], ["dp-fedavg"], [], []).count("Not finished (no summary.json): dp-fedavg.") == 1


@pytest.mark.slow
def test_without_a_dp_run_the_epsilon_plot_is_skipped_and_said_so(store, tmp_path):
    copy = _copy(store, tmp_path / "store")
    for run in DP_RUNS:
        (copy / run / "summary.json").unlink()
    out = write_report(copy)
    md = (out / "comparison.md").read_text()
    assert not (out / "epsilon_vs_parameters.png").exists()
    assert "epsilon_vs_parameters.png not drawn" in md and "](epsilon_vs_parameters.png)" not in md
    assert re.search(r"Not finished \(no summary\.json\): dp-sgd \(step \d+[^)]*\), dp-fedavg \(round \d+[^)]*\)\.", md), md
    for name in ("memorized_by_configuration.png", "exposure_vs_insertions.png", "utility_vs_epsilon.png"):
        _assert_png(out / name)


@pytest.mark.slow
def test_an_empirical_bound_above_epsilon_is_a_bug_only_where_the_relations_match(store, tmp_path):
    """A lower bound above the accountant's epsilon proves a privacy bug only when that epsilon bounds the
    audit's relation (added or removed canaries); for replace-one or zero-out epsilons it is a strong sign."""
    copy = _copy(store, tmp_path / "store")
    for run, bounds in (("dp-sgd", True), ("dp-fedavg", False)):
        path = copy / run / "summary.json"
        s = json.loads(path.read_text())
        s["empirical"] = {"kind": "example", "unit": "example", "canaries": 100, "epsilon_lower_bound": s["epsilon"] * 2, "delta": s["delta"],
                          "accountant_bounds_audit": bounds}
        path.write_text(json.dumps(s))
    md = (write_report(copy) / "comparison.md").read_text()
    assert "PRIVACY BUG: the empirical lower bound exceeds the accountant's epsilon for dp-sgd." in md
    assert "exceeds the accountant's epsilon for dp-fedavg, whose epsilon is for another neighbouring relation" in md
    assert "PRIVACY BUG: the empirical lower bound exceeds the accountant's epsilon for dp-sgd, dp-fedavg" not in md


# ---- fast: no store ------------------------------------------------------------------------------------------
def test_a_directory_without_experiment_json_is_refused(tmp_path):
    (tmp_path / "some-run").mkdir()
    with pytest.raises(FedprivError, match=r"not a run store \(no experiment\.json\)"):
        write_report(tmp_path)
    assert not (tmp_path / "report").exists()


def _synthetic_summary(name, kind, **kw):
    audit = {"total": {"canaries": 2, "inserted": 2, "rs_memorized": 1, "bs_memorized": 0, "exposure_mean": 3.0, "exposure_max": 5.0}, "by_configuration": {}}
    return {"name": name, "kind": kind, "users": "natural", "eval_accuracy": 0.2, "eval_perplexity": 90.0, "audit": audit, **kw}


def test_rows_are_pure_and_label_the_data():
    runs = [{"name": n, "kind": k} for n, k in [("a", "central"), ("b", "federated"), ("c", "central"), ("late", "federated")]]
    summaries = {
        "a": _synthetic_summary("a", "central", algorithm="SGD", order="noniid", batch_size=64),
        "b": _synthetic_summary("b", "federated", algorithm="DP-FedAvg", users="iid", clients_per_round=50, epsilon=2.5, delta=1e-5, guarantee="user-level, replace-one"),
        "c": _synthetic_summary("c", "central", algorithm="SGD", order="iid", batch_size=8, epsilon=None, guarantee="none (no noise)"),
    }
    rows = comparison_rows(runs, summaries)
    assert [r["run"] for r in rows] == ["a", "b", "c"] and unfinished_runs(runs, summaries) == ["late"]
    assert [r["data"] for r in rows] == ["non-IID", "IID", "IID"]
    assert [(r["batch"], r["batch_unit"]) for r in rows] == [(64, "records"), (50, "users"), (8, "records")]
    assert [r["assumptions"] for r in rows] == [NOT_PRIVATE, "user-level, replace-one", NOT_PRIVATE]
    assert (rows[1]["epsilon"], rows[1]["delta"]) == (2.5, 1e-5) and rows[2]["epsilon"] is None
    assert data_label({"kind": "federated", "users": "natural"}) == "non-IID"


def test_client_side_dp_shows_its_record_level_epsilon():
    runs = [{"name": n, "kind": "federated"} for n in ("client", "both")]
    client = {"client_epsilon": 3.0, "client_delta": 1e-5, "client_guarantee": "record-level, add-or-remove-one example: 40 Gaussian steps"}
    summaries = {
        "client": _synthetic_summary("client", "federated", algorithm="FedAvg", clients_per_round=5, **client),
        "both": _synthetic_summary("both", "federated", algorithm="DP-FedAvg", clients_per_round=5, epsilon=8.0, delta=1e-3, guarantee="user-level, replace-one", **client),
    }
    one, both = comparison_rows(runs, summaries)
    assert (one["epsilon"], one["delta"]) == (3.0, 1e-5) and one["assumptions"].startswith("record-level")
    assert (both["epsilon"], both["delta"]) == (8.0, 1e-3) and both["assumptions"].startswith("user-level") and "record-level" in both["assumptions"]


def test_the_headline_utility_column_is_the_tasks():
    runs = [{"name": "ner", "kind": "central"}]
    summaries = {"ner": _synthetic_summary("ner", "central", algorithm="SGD", batch_size=32, eval_f1=0.4123, utility=0.4123, utility_metric="f1", utility_label="entity F1")}
    rows = group_rows(comparison_rows(runs, summaries), {})
    header, _, ner = comparison_table_lines(rows)
    cells = [c.strip() for c in header.strip("|").split("|")]
    col = cells.index("test entity F1 (%)")
    assert [c.strip() for c in ner.strip("|").split("|")][col] == "41.23"  # one seed: no interval on utility
    assert cells.index("test entity F1 (%)") < cells.index("test accuracy (%)")


def test_configuration_rows_group_canaries_per_run():
    canary = lambda p_u, p_e, rs, bs, e: {"p_u": p_u, "p_e": p_e, "rs_memorized": rs, "bs_memorized": bs, "exposure": e, "insertions": 3}  # noqa: E731
    canaries = {"x": [canary(1e-4, 1.0, True, True, 9.0), canary(1e-4, 1.0, True, False, 7.0), canary(2e-5, 0.1, False, False, 1.0)],
                "y": [canary(1e-4, 1.0, False, False, 2.0), canary(2e-5, 0.1, True, False, 6.0)]}
    rows = configuration_rows(["x", "y", "unaudited"], canaries)
    assert [r["configuration"] for r in rows] == ["p_u=2e-05 p_e=0.1", "p_u=0.0001 p_e=1"]
    assert rows[1]["cells"]["x"] == {"canaries": 2, "rs_memorized": 2, "bs_memorized": 1, "exposure_mean_bits": 8.0, "exposure_max_bits": 9.0, "exposure_at_ceiling": 0}
    assert rows[0]["cells"]["y"]["rs_memorized"] == 1 and "unaudited" not in rows[0]["cells"]


@pytest.mark.parametrize("kind, event", [
    ("central", GaussianSteps("poisson", 1.1, 10_000, 64, 500)),
    ("federated", GaussianSteps("fixed", 0.8, 300, 20.0, 30, "user")),
    ("central", GaussianSteps("none", 5.0, 100, 100, 10)),
])
def test_epsilon_curves_contain_the_events_own_epsilon(kind, event):
    delta = 1e-5
    curves = epsilon_curves([event], delta, "rdp", kind, points=3)
    want = epsilon_for(event, delta, "rdp").epsilon
    assert curves["epsilon"] == want
    assert [p["parameter"] for p in curves["panels"]] == ["noise_multiplier", "rounds" if kind == "federated" else "epochs", *(["batch"] if event.sampling != "none" else [])]
    for p in curves["panels"]:
        assert len(p["x"]) == len(p["epsilon"]) >= 3
        assert p["epsilon"][p["x"].index(p["own"])] == pytest.approx(want, rel=1e-12)
    sigma = curves["panels"][0]
    assert sigma["epsilon"] == sorted(sigma["epsilon"], reverse=True)  # more noise, less epsilon
    with pytest.raises(FedprivError, match="one mechanism"):
        epsilon_curves([event, event.with_steps(2)], delta)


def _plot_all(out: Path) -> list[Path]:
    series = [{"run": "sgd", "private": False, "epsilon": None, "insertions": [0, 3, 30, 30], "exposure": [1.0, 2.0, 12.0, 14.0]},
              {"run": "dp", "private": True, "epsilon": 0.9, "insertions": [0, 3, 30, 30], "exposure": [1.0, 1.5, 2.0, 1.0]}]
    panels = [{"label": name, "x": [1.0, 2.0, 4.0], "epsilon": [3.0, 1.0, 0.4], "own": 2.0, "log_x": True} for name in ("σ", "epochs", "batch")]
    curves = [{"run": "dp", "delta": 1e-5, "accountant": "rdp", "epsilon": 1.0, "panels": panels}]
    points = [{"run": "sgd", "epsilon": None, "accuracy": 0.25}, {"run": "dp", "epsilon": 0.9, "accuracy": 0.2}, {"run": "dp2", "epsilon": 8.0, "accuracy": 0.22}]
    out.mkdir()
    return [
        plots.plot_memorized_by_configuration(["p_u=1e-05 p_e=0.1", "p_u=0.0001 p_e=1"], ["sgd", "dp"], [[1, 3], [0, 0]], out / "bars.png"),
        plots.plot_exposure_vs_insertions(series, out / "exposure.png"),
        plots.plot_epsilon_vs_parameters(curves, out / "epsilon.png"),
        plots.plot_utility_vs_epsilon(points, out / "utility.png"),
    ]


def test_plots_are_valid_images_and_deterministic(tmp_path):
    first, second = _plot_all(tmp_path / "a"), _plot_all(tmp_path / "b")
    for a, b in zip(first, second):
        _assert_png(a)
        assert a.read_bytes() == b.read_bytes(), a.name


def test_the_utility_plot_uses_the_headline_utility():
    from fedpriv.report.tables import utility_points

    ner = [{"run": "b", "epsilon": 3.0, "test_accuracy": 0.92, "test_utility": 0.14, "utility_label": "entity F1"}, {"run": "c", "epsilon": None, "test_utility": None}]
    assert utility_points(ner) == [{"run": "b", "group": "b", "unit": None, "relation": None, "delta": None, "epsilon": 3.0, "accuracy": 0.14,
                                    "metric": "test entity F1"}]  # token accuracy is mostly the O tag


def test_the_utility_plot_marks_each_unit_and_draws_seeds_as_one_group():
    from fedpriv.report.tables import utility_points

    rows = [{"run": f"{g}-s{k}", "group": g, "privacy_unit": unit, "epsilon": eps, "test_utility": 0.5}
            for g, unit, eps in (("sgd", None, None), ("dpsgd", "example", 2.0), ("dpfedavg", "user", 2.0), ("clientdp", "example (client-side)", 9.0))
            for k in (0, 1)]
    points = utility_points(rows)
    assert [p["unit"] for p in points[::2]] == [None, "example-level DP", "user-level DP", "record-level DP inside each client"]
    styles = plots.utility_point_styles(points)
    assert [s[0] for s in styles] == [0, 0, 1, 1, 2, 2, 3, 3]  # one colour per group, whatever the seed
    assert [s[1] for s in styles[::2]] == ["x", "o", "s", "^"]  # one marker per unit: the same epsilon 2.0 is not one scale
    assert [s[2] for s in styles] == ["sgd", None, "dpsgd (example-level DP)", None, "dpfedavg (user-level DP)", None,
                                      "clientdp (record-level DP inside each client)", None]


# ---- seeds, intervals, flags, contrasts (synthetic) -----------------------------------------------------------
def _canaries(rs: list[int], exposure: list[float]) -> list[dict]:
    return [{"p_u": 1e-4, "p_e": 1.0, "rs_memorized": bool(r), "bs_memorized": False, "exposure": e, "insertions": 3} for r, e in zip(rs, exposure)]


def _seeded_store():
    runs, summaries, canaries = [], {}, {}
    for group, kind, rs, util in (("sgd", "central", [1, 1, 0, 1], (0.20, 0.21)), ("fedavg", "federated", [0, 0, 1, 0], (0.19, 0.20))):
        for seed, u in zip((0, 1), util):
            name = f"{group}-s{seed}"
            runs.append({"name": name, "kind": kind, "group": group, "seed": seed})
            summaries[name] = _synthetic_summary(name, kind, group=group, seed=seed, algorithm="SGD" if kind == "central" else "FedAvg", batch_size=32,
                                                 clients_per_round=10, utility=u, utility_metric="accuracy_no_oov_no_eos", utility_label="accuracy w/o OOV, EOS")
            canaries[name] = _canaries(rs, [10.0 * r + seed for r in rs])
            summaries[name]["audit"] = {"total": {"canaries": 4, "rs_memorized": sum(rs), "bs_memorized": 0}, "by_configuration": {}}
    return runs, summaries, canaries


def test_seeds_of_a_run_are_one_row_with_intervals():
    runs, summaries, canaries = _seeded_store()
    rows = group_rows(comparison_rows(runs, summaries), canaries)
    assert [r["run"] for r in rows] == ["sgd", "fedavg"] and [r["seeds"] for r in rows] == [2, 2]
    sgd = rows[0]
    assert sgd["rs_memorized"].mean == pytest.approx(3.0) and sgd["rs_memorized"].low <= 3.0 <= sgd["rs_memorized"].high
    assert sgd["test_utility"].mean == pytest.approx(0.205) and sgd["test_utility"].low == pytest.approx(0.20) and sgd["test_utility"].high == pytest.approx(0.21)
    assert sgd["exposure_mean"].mean == pytest.approx((7.5 + 8.5) / 2)
    line = comparison_table_lines(rows)[2]
    assert "| 3/4 [" in line and "| 20.50 [20.00–21.00] |" in line


def test_a_groups_epsilon_is_what_each_seed_promises_at_most_never_a_mean():
    """Seeds promise different epsilons (their populations differ; runs stored before the stop on
    the data was counted printed 8.0 and 6.78 in the arXiv report): the group prints their range and
    keeps the largest, whichever seed holds it, rounded up when printed; a mean (7.39) would print
    less than one run promises, and so would 7.89 for 7.8944."""
    runs, summaries = [], {}
    for group, spent in (("dp", (6.78, 8.0)), ("same", (8.0, 8.0)), ("up", (7.8944, 7.8944))):
        for seed, eps in enumerate(spent):
            name = f"{group}-s{seed}"
            runs.append({"name": name, "kind": "federated", "group": group, "seed": seed})
            summaries[name] = _synthetic_summary(name, "federated", group=group, seed=seed, algorithm="DP-FedAvg", clients_per_round=10,
                                                 epsilon=eps, delta=1e-5, guarantee="user-level, add-or-remove-one", privacy_unit="user")
    rows = {r["run"]: r for r in group_rows(comparison_rows(runs, summaries), {})}
    assert (rows["dp"]["epsilon"], rows["dp"]["epsilon_min"]) == (8.0, 6.78)
    assert (rows["same"]["epsilon"], rows["same"]["epsilon_min"]) == (8.0, 8.0)
    assert not any(r["flag"] for r in rows.values())
    header, _, *lines = comparison_table_lines(list(rows.values()))
    col = [c.strip() for c in header.strip("|").split("|")].index("ε (δ)")
    cells = {line.strip("|").split("|")[0].strip(): line.strip("|").split("|")[col].strip() for line in lines}
    assert cells["dp"].startswith("6.78–8 ") and cells["dp"].endswith("(δ = 1e-05)")
    assert cells["same"].startswith("8 ") and "–" not in cells["same"]
    assert cells["up"].startswith("7.9 per user")
    flat = {r["run"]: r for r in group_csv_rows(list(rows.values()))}
    assert (flat["dp"]["epsilon"], flat["dp"]["epsilon_min"]) == (8.0, 6.78)


@pytest.mark.parametrize("second", [dict(delta=1e-3), dict(privacy_unit="example"), dict(guarantee="user-level, replace-one")])
def test_seeds_whose_guarantees_differ_are_flagged_not_merged_silently(second):
    """Two seeds of one group trained under different δ, unit or neighbouring relation (a config
    edited between two calls): one ε column cannot hold both promises, and the row says so."""
    runs, summaries = [], {}
    for seed in (0, 1):
        kw = dict(epsilon=8.0 - 2 * seed, delta=1e-5, guarantee="user-level, add-or-remove-one", privacy_unit="user")
        if seed == 1:
            kw.update(second)
        name = f"dp-s{seed}"
        runs.append({"name": name, "kind": "federated", "group": "dp", "seed": seed})
        summaries[name] = _synthetic_summary(name, "federated", group="dp", seed=seed, algorithm="DP-FedAvg", clients_per_round=10, **kw)
    (row,) = group_rows(comparison_rows(runs, summaries), {})
    assert "guarantees differ" in row["flag"] and "not one promise" in row["flag"]


def test_an_epsilon_of_another_relation_than_add_or_remove_one_names_it_in_its_cell():
    rows = []
    for name, relation in (("poisson", "add-or-remove-one"), ("fixed", "replace-one"), ("blt", "zero-out-one")):
        s = _synthetic_summary(name, "federated", algorithm="DP-FedAvg", clients_per_round=10, epsilon=8.0, delta=1e-5, privacy_unit="user",
                               guarantee=f"user-level, {relation} user")
        rows += group_rows(comparison_rows([{"name": name, "kind": "federated"}], {name: s}), {})
    header, _, *lines = comparison_table_lines(rows)
    col = [c.strip() for c in header.strip("|").split("|")].index("ε (δ)")
    cells = [line.strip("|").split("|")[col].strip() for line in lines]
    assert cells == ["8 per user (δ = 1e-05)", "8 per user, replace-one (δ = 1e-05)", "8 per user, zero-out-one (δ = 1e-05)"]


def test_a_run_stored_before_the_stop_on_the_data_was_counted_promises_all_its_planned_steps(tmp_path):
    """A DP run that stopped at its utility target after 130 of 200 rounds, stored with the epsilon
    of the 130 (as fedpriv did before): the report promises the epsilon of all 200 (computed here
    with dp_accounting through epsilon_for), keeps the 130's as epsilon_spent and says why."""
    event = GaussianSteps("poisson", 1.1, 50_000, 5_000, 130, "user")
    spent = epsilon_for(event, 1e-5, "pld").epsilon
    config = {"federated": {"rounds": 200, "dp": {"accountant": "pld", "delta": 1e-5, "epsilon_budget": None}}}
    stored = _synthetic_summary("r", "federated", epsilon=spent, delta=1e-5, guarantee="user-level, add-or-remove-one user; 130 steps", privacy_unit="user",
                                target={"metric": "accuracy_no_oov_no_eos", "value": 0.2, "reached": True, "at": "round", "when": 130})
    out = promised_summary(stored, [event], config)
    assert out["epsilon"] == pytest.approx(epsilon_for(event.with_steps(200), 1e-5, "pld").epsilon, rel=1e-12) and out["epsilon"] > spent
    assert out["epsilon_spent"] == spent and out["promised_steps"] == 200 and "all 200 rounds" in out["guarantee"] and "ex-post" in out["guarantee"]
    assert promised_summary(out, [event], config) == out  # recorded by a new run: unchanged
    assert promised_summary({**stored, "target": None}, [event], config)["epsilon"] == spent  # no target: no stop on the data
    central = {"training": {"steps": 130}, "privacy": {"accountant": "pld", "delta": 1e-5}}
    assert promised_summary({**stored, "kind": "central"}, [event], central)["epsilon"] == spent  # it ran every planned step
    epochs = {"training": {"epochs": 2.0, "batch_size": 5_000}, "privacy": {"accountant": "pld", "delta": 1e-5}}  # user-level: epochs of records
    unknown = promised_summary({**stored, "kind": "central"}, [event], epochs)
    assert unknown["epsilon"] == spent and unknown["epsilon_ex_post"] and "ex-post" in not_covered(unknown)


def test_contrasts_are_paired_by_seed():
    runs, summaries, canaries = _seeded_store()
    notes: list[str] = []
    rows = contrast_rows([{"name": "central vs federated", "a": "sgd", "b": "fedavg"}, {"name": "x", "a": "sgd", "b": "nope"}], comparison_rows(runs, summaries), canaries, notes)
    by = {r["quantity"]: r for r in rows}
    assert by["RS memorized (canaries)"]["difference"] == pytest.approx(2.0)
    assert by["accuracy w/o OOV, EOS (points)"]["difference"] == pytest.approx(1.0)  # 20.5% - 19.5%
    assert all(r["seeds"] == 2 for r in rows) and notes == ["contrast 'x': nope has no finished run"]
    assert all(r["comparable"] == NO_TARGET for r in rows)  # these runs had no utility target: nothing matched their utilities
    assert contrast_table_lines(rows)[0].endswith("| seeds | at matched utility |")
    target = {"metric": "accuracy_no_oov_no_eos", "value": 0.15, "split": "validation", "at": "round", "reached": True, "when": 10, "reached_value": 0.16}
    for s in summaries.values():
        s["target"] = target
    rows = contrast_rows([{"name": "central vs federated", "a": "sgd", "b": "fedavg"}], comparison_rows(runs, summaries), canaries, [])
    assert rows and all(r["comparable"] == "yes" for r in rows)  # every run stopped at its target


def test_a_contrast_with_a_flagged_run_is_not_at_matched_utility():
    runs, summaries, canaries = _seeded_store()
    summaries["fedavg-s1"]["target"] = {"metric": "accuracy_no_oov_no_eos", "value": 0.3, "split": "validation", "at": "round",
                                        "reached": False, "when": None, "reached_value": 0.2}
    rows = contrast_rows([{"name": "c", "a": "sgd", "b": "fedavg"}], comparison_rows(runs, summaries), canaries, [])
    assert rows and all(r["comparable"] == "no: fedavg-s1 flagged" for r in rows)
    assert all(line.endswith("| no: fedavg-s1 flagged |") for line in contrast_table_lines(rows)[2:])


def test_rows_that_did_not_learn_or_missed_the_target_are_flagged():
    runs = [{"name": n, "kind": "federated"} for n in ("stuck", "short", "ok")]
    target = {"metric": "accuracy_no_oov_no_eos", "value": 0.18, "split": "validation", "at": "round"}
    summaries = {
        "stuck": _synthetic_summary("stuck", "federated", degenerate="predicts <oov>/<eos> at 100% of positions", target={**target, "reached": False, "when": None, "reached_value": 0.0}),
        "short": _synthetic_summary("short", "federated", target={**target, "reached": False, "when": None, "reached_value": 0.15}),
        "ok": _synthetic_summary("ok", "federated", target={**target, "reached": True, "when": 40, "reached_value": 0.181}),
    }
    rows = {r["run"]: r for r in group_rows(comparison_rows(runs, summaries), {})}
    assert rows["stuck"]["flag"].startswith("did not learn: predicts <oov>/<eos>") and "not comparable" in rows["stuck"]["flag"]
    assert rows["short"]["flag"] == "missed the utility target (best 15.00% < 18.00% on validation): not comparable"
    assert rows["ok"]["flag"] == "" and rows["ok"]["target"] == "reached, at round 40"


SCALED = [  # two configurations whose p_u the scaling rule multiplied by 72.4, one it did not
    {"p_u": 2e-5, "p_u_effective": 2e-5 * 72.4, "p_e": 0.01, "rs_memorized": True, "bs_memorized": False, "exposure": 3.0, "insertions": 2},
    {"p_u": 1e-4, "p_u_effective": 1e-4 * 72.4, "p_e": 1.0, "rs_memorized": False, "bs_memorized": False, "exposure": 1.0, "insertions": 9},
    {"p_u": 0.5, "p_u_effective": 0.5, "p_e": 1.0, "rs_memorized": False, "bs_memorized": False, "exposure": 1.0, "insertions": 9},
]
SCALED_LABELS = ["p_u=0.00145 (2e-05 x72.4) p_e=0.01", "p_u=0.00724 (0.0001 x72.4) p_e=1", "p_u=0.5 p_e=1"]


def test_configuration_labels_show_the_scaled_p_u():
    """The log says "p_u scaled x72.4": the audit's and the report's labels say so too."""
    from fedpriv.memorization.audit import summarize

    assert list(summarize(SCALED, "nwp")["by_configuration"]) == SCALED_LABELS
    rows = configuration_rows(["run"], {"run": SCALED})
    assert sorted(r["configuration"] for r in rows) == sorted(SCALED_LABELS)


def test_audit_table_never_cuts_a_configuration_label(capsys):
    from fedpriv.cli import _print_audit
    from fedpriv.memorization.audit import summarize

    rows = [{**r, "id": f"c{i}", "sharers": 1, "rs_rank": 1, "exposure_extrapolated": 2.0} for i, r in enumerate(SCALED)]
    _print_audit({"task": "nwp", "parameters": "final parameters", "canaries": rows, "summary": summarize(rows, "nwp")})
    out = capsys.readouterr().out
    for label in SCALED_LABELS:
        assert label in out
    assert "…" not in out


def test_memorized_bars_legend_covers_no_bar_and_labels_fit():
    fig = plots.memorized_by_configuration_figure(SCALED_LABELS, ["sgd-iid", "dp-sgd-iid-long-name", "fedavg-natural", "dp-fedavg-natural"], [[6, 6, 6]] * 4)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (ax,) = fig.axes
    legend = ax.get_legend().get_window_extent(renderer)
    bars = [p.get_window_extent(renderer) for p in ax.patches]
    assert len(bars) == 12 and not any(legend.overlaps(b) for b in bars)
    page = fig.bbox
    for artist in [ax.get_legend(), *ax.get_xticklabels()]:
        box = artist.get_window_extent(renderer)
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0, artist


def test_epsilon_curves_leave_out_points_the_pld_accountant_refuses():
    """A PLD run's sigma panel reaches sigma/4 = 0.28, under the PLD accountant's bound (0.3): that
    point is NaN and listed as skipped (never answered by RDP instead); the run's own point is exact."""
    event = GaussianSteps("poisson", 1.11, 1000, 100.0, 20, "user")
    curves = epsilon_curves([event], 1e-5, "pld", "central", points=3)
    sigma = curves["panels"][0]
    assert sigma["x"][0] == pytest.approx(1.11 / 4) and math.isnan(sigma["epsilon"][0])
    assert sigma["skipped"] == [sigma["x"][0]]
    assert sigma["epsilon"][1] == pytest.approx(epsilon_for(event, 1e-5, "pld").epsilon, rel=1e-12) == curves["epsilon"]
    assert all(math.isfinite(e) for e in sigma["epsilon"][1:])


def test_run_accountant_reads_the_federated_dp_section():
    """DP-FedAvg names its accountant under [federated.dp]: the report's curves must use it (a PLD
    run's curves computed by RDP disagreed with its summary's epsilon)."""
    assert run_accountant({"kind": "federated", "config": {"federated": {"dp": {"accountant": "pld"}}}}) == "pld"
    assert run_accountant({"kind": "federated", "config": {"federated": {"dp": None}}}) == "rdp"
    assert run_accountant({"kind": "central", "config": {"privacy": {"accountant": "pld"}}}) == "pld"
    assert run_accountant({"kind": "central", "config": {}}) == "rdp"


def test_a_run_with_a_public_split_is_not_said_to_have_a_private_vocabulary():
    """Runs trained before the vocabulary record named the public users carry the old sentence in
    their guarantee; the report states what the config did (vocabulary from the public split)."""
    from fedpriv.report.tables import PRE_PUBLIC_VOCAB_NOTE, PUBLIC_VOCAB_NOTE
    old = "epsilon = 7 at delta = 1e-05 (RDP); the vocabulary of the 5000 most frequent training words is not private (raw counts of the training users; vocab.dp makes it a DP stage); simulation"
    assert PRE_PUBLIC_VOCAB_NOTE.sub(PUBLIC_VOCAB_NOTE, old) == f"epsilon = 7 at delta = 1e-05 (RDP); {PUBLIC_VOCAB_NOTE}; simulation"


def test_the_data_facts_clause_is_said_once_in_the_section_not_in_each_row():
    """Runs stored before the clause (or with its shorter 2026-11-28 form) and after it read alike."""
    from fedpriv.training.coverage import DATA_FACTS_NOTE
    old = ("not covered either: data.json and the summary's data notes and vocabulary counts (examples cut, words dropped, pieces per word) "
           "and each round's wall time, exact statistics of the training data; release the model without them")
    base = "epsilon = 2 at delta = 1e-05 (PLD); user-level, add-or-remove-one user"
    tail = "; simulation: the noise is reproducible from the run's seed"
    runs = [{"name": n, "kind": "federated"} for n in ("new", "old", "none")]
    summaries = {n: _synthetic_summary(n, "federated", epsilon=2.0, delta=1e-5, guarantee=g)
                 for n, g in (("new", f"{base}; {DATA_FACTS_NOTE}{tail}"), ("old", f"{base}; {old}{tail}"), ("none", base + tail))}
    assert [r["assumptions"] for r in comparison_rows(runs, summaries)] == [base + tail] * 3


def test_what_no_epsilon_counts_is_listed_beside_the_private_rows():
    """The validation users (the stop, the target, the tuning), the ex-post epsilon of a run that
    stopped early, each tuning choice, the test users and the experiment's own declared choices."""
    summaries = {
        "dp": _synthetic_summary("dp", "federated", epsilon=8.0, epsilon_spent=6.4, promised_steps=200, delta=1e-5, group="dp",
                                 target={"value": 0.2, "reached": True, "above": {"run": "public"}}, tuned={"winner": {"federated.server_learning_rate": 0.003}}),
        "sgd": _synthetic_summary("sgd", "central", target={"value": 0.2, "reached": True}),
        "full": _synthetic_summary("full", "central", epsilon=7.0, epsilon_spent=7.0, promised_steps=100, delta=1e-5, target={"value": 0.2, "reached": False}),
    }
    tunings = {"dp": {"winner": {"federated.server_learning_rate": 0.003}, "metric": "accuracy_no_oov_no_eos",
                      "candidates": [{"values": {"federated.server_learning_rate": v}, "validation_utility": 0.2} for v in (0.003, 0.01)]}}
    text = "\n".join(uncounted_lines(summaries, tunings, ["The model size was chosen on the validation users."]))
    assert "## What ε does not count" in text
    assert "full:" not in text  # it ran every step: nothing ex-post to list
    assert "when each of the 3 run(s) with a utility target stops, the target itself" in text and "which candidate each tuning grid keeps" in text
    assert "dp: 6.4 of 8" in text and "ex-post" in text
    assert "`federated.server_learning_rate` = 0.003 was chosen among 2 candidates" in text
    assert "The test users." in text and "**Declared by the experiment.** The model size was chosen on the validation users." in text
    assert "**What the runs write beside their models.**" in text and "`canaries.json` names each canary's sharers" in text
    assert uncounted_lines({"sgd": summaries["sgd"]}, {}, ["x"]) == []  # no private run: no epsilon to qualify
    # without a target or tuning, validation users evaluated are still named; an audited run names the audit's files
    plain = {"dp": _synthetic_summary("dp", "central", epsilon=2.0, delta=1e-5, validation_accuracy=0.1)}
    assert "**The validation users.** Their utility and perplexity are printed without noise." in "\n".join(uncounted_lines(plain, {}, []))
    unaudited = {"dp": _synthetic_summary("dp", "central", epsilon=2.0, delta=1e-5, audit=None)}
    text = "\n".join(uncounted_lines(unaudited, {}, []))
    assert "validation users" not in text and "canaries.json" not in text and "**What the runs write beside their models.**" in text


def test_an_experiments_uncounted_choices_reach_its_report(store, tmp_path):
    copy = _copy(store, tmp_path / "s")
    exp = json.loads((copy / "experiment.json").read_text())
    (copy / "experiment.json").write_text(json.dumps({**exp, "uncounted_choices": ["The clip norm was probed on the validation users."]}))
    text = (write_report(copy) / "comparison.md").read_text()
    assert "## What ε does not count" in text and "**Declared by the experiment.** The clip norm was probed on the validation users." in text
    (copy / "experiment.json").write_text(json.dumps({**exp, "uncounted_choices": "not a list"}))
    with pytest.raises(FedprivError, match="uncounted_choices"):
        write_report(copy)


def test_a_warm_start_from_a_run_on_the_private_users_is_named_as_not_covered():
    """[init] from a run trained on the private users (even a non-private one): the ε printed is the
    new run's alone, so the row says its start is not covered; from the public model, nothing."""
    base = dict(epsilon=2.0, delta=1e-5, privacy_unit="user", guarantee="user-level, add-or-remove-one user")
    private = _synthetic_summary("dp", "federated", init={"from": "/s/fedavg", "name": "fedavg", "public": False}, **base)
    public = _synthetic_summary("dp", "federated", init={"from": "/s/public", "name": "public", "public": True}, **base)
    assert "starts from run fedavg, trained on the private users" in not_covered(private)
    assert not_covered(public) == "" and not_covered(_synthetic_summary("dp", "federated", **base)) == ""


def test_a_user_level_epsilon_over_resharded_users_says_they_are_synthetic():
    base = dict(epsilon=2.0, delta=1e-5, privacy_unit="user", guarantee="user-level, add-or-remove-one user")
    iid = _synthetic_summary("dp", "federated", **{**base, "users": "iid"})
    assert "its users are synthetic" in not_covered(iid) and "synthetic" not in not_covered(_synthetic_summary("dp", "federated", **base))


def test_a_stored_client_side_dp_run_that_stopped_early_is_flagged_ex_post():
    """Client-side DP-SGD's record-level ε of a run stored before it counted every planned round:
    the participation of the rounds not taken cannot be recomputed, so the row says its ε is ex-post."""
    config = {"federated": {"rounds": 40}}
    stored = _synthetic_summary("c", "federated", client_epsilon=3.0, client_delta=1e-5, client_guarantee="record-level, add-or-remove-one example",
                                rounds=10, target={"value": 0.2, "reached": True})
    out = client_promise(stored, config)
    assert out["client_epsilon_ex_post"] and "after 10 of 40 rounds" in out["client_guarantee"] and "ex-post" in not_covered(out)
    assert "client_epsilon_ex_post" not in client_promise({**stored, "rounds": 40}, config)  # it ran every round
    new = {**stored, "client_guarantee": stored["client_guarantee"] + "; " + EVERY_ROUND + ": it may stop earlier"}
    assert "client_epsilon_ex_post" not in client_promise(new, config)  # a new run counted every round already
