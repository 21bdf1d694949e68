"""``fedpriv report STORE``: the comparison report of a run store, in ``STORE/report/``.

Written files (see :func:`write_report`)::

    comparison.md                    the comparison table (Thakkar et al. 2021, Tables 1-2), the
                                     memorized-canaries-by-configuration table, notes, plot links
    comparison.csv                   the comparison table, raw numbers (one row per finished run)
    memorized_by_configuration.csv   one row per (configuration, run): canaries, RS, BS, exposure
    memorized_by_configuration.png   RS-memorized canaries per (p_u, p_e), one bar per run
    exposure_vs_insertions.png       per-canary exposure (bits) against insertions + 1 (log x)
    epsilon_vs_parameters.png        per DP run: epsilon against sigma, epochs/rounds, batch/users
                                     (Hoory et al. 2021, Figure 1); only when a DP run exists
    utility_vs_epsilon.png           held-out accuracy (%) against epsilon
    chains.md                        when runs start from earlier runs (BERT chains): the
                                     pretrained encoders with each stage's epsilon, the composed
                                     epsilon and the fine-tuned F1 (:mod:`fedpriv.report.chain`)
    measurements.md                  when the store has [[measure]] results (STORE/measure/): per
    deniability-NAME.png             measurement, N_w / S_w / inversion accuracy per eta, and the
                                     N_w / S_w plot (:mod:`fedpriv.report.measurements`)

Everything is read back from the store's files (``experiment.json``, each run's ``summary.json``,
``audit.json`` and ``privacy_ledger.json``); nothing is retrained. The table-building functions
are pure (data in, rows out); :func:`write_report` reads, builds and writes.

Units: exposure in bits (log2 |R| - log2 rank, Carlini et al. 2019); accuracy as a fraction in the
rows and CSV files, as a percentage in the Markdown; epsilon is unitless, its unit of privacy
(example or user), neighbouring relation, sampling and accountant are in its guarantee string.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fedpriv.errors import FedprivError
from fedpriv.privacy.accounting import GaussianSteps, epsilon_for
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.report import plots
from fedpriv.report.chain import chains_markdown
from fedpriv.report.measurements import write_measurements
from fedpriv.rundir import AUDIT_JSON, EXPERIMENT, LEDGER, RunDir, read_store_record

REPORT_DIR = "report"
MAX_CURVES = 12  # DP runs drawn in epsilon_vs_parameters.png (one row of panels each)
NOT_PRIVATE = "not private"
PLOT_FILES = {
    "memorized_by_configuration.png": "RS-memorized canaries by configuration",
    "exposure_vs_insertions.png": "exposure against insertions",
    "epsilon_vs_parameters.png": "epsilon against the DP parameters",
    "utility_vs_epsilon.png": "held-out accuracy against epsilon",
}

# comparison.csv columns, in order (raw values; see comparison_rows)
COMPARISON_COLUMNS = [
    "run", "training", "algorithm", "data", "batch", "batch_unit", "canaries", "rs_memorized", "bs_memorized",
    "exposure_mean_bits", "exposure_max_bits", "test_accuracy", "test_perplexity", "test_f1", "epsilon", "delta", "assumptions",
]
CONFIGURATION_COLUMNS = ["configuration", "pattern", "p_u", "p_e", "run", "canaries", "rs_memorized", "bs_memorized", "exposure_mean_bits", "exposure_max_bits"]


# ---- reading the store ----------------------------------------------------------------------------
@dataclass
class StoreContents:
    """What the report reads from a store. ``summaries``, ``canaries`` and ``ledgers`` hold the
    finished runs only (those with ``summary.json``), keyed by run name."""

    name: str
    runs: list[dict[str, Any]]
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)
    canaries: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    audit_settings: dict[str, Any] = field(default_factory=dict)
    ledgers: dict[str, list[GaussianSteps]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # run name -> why (failed.json): never compared


def read_store(store: Path) -> StoreContents:
    """Read ``experiment.json`` and every finished run's summary, audit rows and privacy ledger.
    FedprivError when ``store`` is not a run store (no ``experiment.json``)."""
    exp_path = store / EXPERIMENT
    if not exp_path.is_file():
        raise FedprivError(f"{store}: not a run store (no {EXPERIMENT}); make one with fedpriv run EXPERIMENT.toml --out {store}")
    exp = read_store_record(store)
    out = StoreContents(exp["name"], exp["runs"])
    for run in out.runs:
        rd = RunDir(store / run["name"])
        failed = rd.failure()
        if failed is not None:
            out.failed[run["name"]] = failed["reason"]
            continue
        if not rd.has_summary():
            continue
        out.summaries[run["name"]] = rd.summary()
        if rd.has(AUDIT_JSON):
            audit = rd.audit()
            out.canaries[run["name"]] = list(audit.get("canaries", []))
            out.audit_settings = out.audit_settings or dict(audit.get("settings", {}))
        if rd.has(LEDGER):
            out.ledgers[run["name"]] = PrivacyLedger.load(rd.file(LEDGER)).entries
    return out


# ---- pure table builders --------------------------------------------------------------------------
def is_private(summary: Mapping[str, Any]) -> bool:
    """A run is private when its summary reports an epsilon (DP-SGD, DP-FedAvg) or a record-level
    client epsilon (federated with client-side DP-SGD)."""
    return summary.get("epsilon") is not None or summary.get("client_epsilon") is not None


def privacy_columns(summary: Mapping[str, Any]) -> tuple[float | None, float | None, str]:
    """(epsilon, delta, assumptions) of a run: the user- or example-level guarantee of DP-SGD and
    DP-FedAvg; for client-side DP-SGD alone, its record-level one; with both, the user-level
    epsilon and both guarantees."""
    if summary.get("epsilon") is not None:
        text = summary.get("guarantee") or "DP, guarantee not recorded"
        if summary.get("client_epsilon") is not None:
            text += f"; and client-side DP-SGD: {summary.get('client_guarantee')}"
        return summary["epsilon"], summary.get("delta"), text
    if summary.get("client_epsilon") is not None:
        return summary["client_epsilon"], summary.get("client_delta"), summary.get("client_guarantee") or "client-side DP-SGD"
    local = summary.get("privatize")
    if local:  # no DP on the model, but the training text was privatized on the client
        return None, None, f"{NOT_PRIVATE} (no DP on the model); training text locally privatized: {local.get('guarantee', local.get('mechanism'))}"
    return None, None, NOT_PRIVATE


def data_label(summary: Mapping[str, Any]) -> str:
    """'IID' or 'non-IID': a central run's record order (iid / noniid), a federated run's users
    (iid: records resharded over same-size users / natural)."""
    if summary.get("kind") == "central":
        return "IID" if summary.get("order", "iid") == "iid" else "non-IID"
    return "IID" if summary.get("users") == "iid" else "non-IID"


def batch_of(summary: Mapping[str, Any]) -> tuple[int | None, str]:
    """(size, unit) of a step's minibatch: records per step (central; the expected size under
    Poisson sampling) or users per round (federated)."""
    if summary.get("kind") == "central":
        return summary.get("batch_size"), "records"
    return summary.get("clients_per_round"), "users"


def comparison_rows(runs: Sequence[Mapping[str, Any]], summaries: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per finished run, in ``runs`` (experiment.json) order, with COMPARISON_COLUMNS:
    memorized counts out of ``canaries``; exposure in bits; test accuracy as a fraction and
    perplexity on the held-out split; epsilon/delta None and assumptions 'not private' for a
    non-DP run."""
    rows = []
    for run in runs:
        s = summaries.get(run["name"])
        if s is None:
            continue
        total = (s.get("audit") or {}).get("total", {})
        batch, unit = batch_of(s)
        epsilon, delta, assumptions = privacy_columns(s)
        rows.append({
            "run": run["name"],
            "training": s.get("kind", run.get("kind")),
            "algorithm": s.get("algorithm"),
            "data": data_label(s),
            "batch": batch,
            "batch_unit": unit,
            "canaries": total.get("canaries"),
            "rs_memorized": total.get("rs_memorized"),
            "bs_memorized": total.get("bs_memorized"),
            "exposure_mean_bits": total.get("exposure_mean"),
            "exposure_max_bits": total.get("exposure_max"),
            "test_accuracy": s.get("eval_accuracy"),
            "test_perplexity": s.get("eval_perplexity"),
            "test_f1": s.get("eval_f1"),  # entity-level F1 of NER tasks
            "epsilon": epsilon,
            "delta": delta,
            "assumptions": assumptions,
        })
    return rows


def unfinished_runs(runs: Sequence[Mapping[str, Any]], summaries: Mapping[str, Any]) -> list[str]:
    """Names of the runs without a summary, in experiment order."""
    return [r["name"] for r in runs if r["name"] not in summaries]


def configuration_key(canary: Mapping[str, Any]) -> str:
    """The audit's name of a canary's configuration, e.g. ``p_u=2e-05 p_e=0.01`` (pattern first
    for masked-LM pattern canaries); the same string as audit.summarize uses."""
    return (f"{canary['pattern']} " if canary.get("pattern") else "") + f"p_u={canary['p_u']:.3g} p_e={canary['p_e']:.3g}"


def _count(rows: Sequence[Mapping[str, Any]], key: str) -> int | None:
    """How many rows have ``key`` true; None when no row has the key (e.g. RS on masked-LM)."""
    if not rows or key not in rows[0]:
        return None
    return sum(bool(r[key]) for r in rows)


def configuration_rows(run_names: Sequence[str], canaries: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Memorized canaries per (pattern, p_u, p_e) configuration and run, from the per-canary audit
    rows: one row per configuration (sorted by pattern, p_u, p_e), with ``cells[run]`` =
    {canaries, rs_memorized, bs_memorized, exposure_mean_bits, exposure_max_bits} for every run
    of ``run_names`` that has audit rows."""
    groups: dict[tuple, dict[str, list[Mapping[str, Any]]]] = {}
    for run in run_names:
        for c in canaries.get(run, []):
            groups.setdefault((c.get("pattern") or "", c["p_u"], c["p_e"]), {}).setdefault(run, []).append(c)
    rows = []
    for (pattern, p_u, p_e), by_run in sorted(groups.items(), key=lambda kv: kv[0]):
        cells = {}
        for run in run_names:
            rs = by_run.get(run, [])
            if run not in canaries:
                continue
            exps = [float(r["exposure"]) for r in rs if r.get("exposure") is not None]
            cells[run] = {
                "canaries": len(rs),
                "rs_memorized": _count(rs, "rs_memorized"),
                "bs_memorized": _count(rs, "bs_memorized"),
                "exposure_mean_bits": sum(exps) / len(exps) if exps else None,
                "exposure_max_bits": max(exps) if exps else None,
            }
        rows.append({"configuration": configuration_key({"pattern": pattern, "p_u": p_u, "p_e": p_e}), "pattern": pattern or None, "p_u": p_u, "p_e": p_e, "cells": cells})
    return rows


def configuration_csv_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """configuration_rows in long form: one row per (configuration, run), CONFIGURATION_COLUMNS."""
    return [
        {"configuration": r["configuration"], "pattern": r["pattern"], "p_u": r["p_u"], "p_e": r["p_e"], "run": run, **cell}
        for r in rows
        for run, cell in r["cells"].items()
    ]


# ---- epsilon curves (the project's accountant) ----------------------------------------------------
def _geometric(center: float, span: float, points: int) -> list[float]:
    """``points`` values from center/span to center*span, evenly spaced in log, center exactly in."""
    half = points // 2
    values = [center * span ** (i / half) for i in range(-half, half + 1)] if half else [center]
    values[half] = center
    return values


def _integers(values: Sequence[float], lo: int, hi: int, own: int) -> list[int]:
    return sorted({min(hi, max(lo, round(v))) for v in values} | {own})


def epsilon_curves(events: Sequence[GaussianSteps], delta: float, accountant: str = "rdp", kind: str = "central", points: int = 7) -> dict[str, Any]:
    """epsilon at ``delta`` as each DP parameter of a run's ledger event varies, the others held:

    * ``noise_multiplier``: sigma per noise draw (as configured), sigma0/4 .. 4*sigma0;
    * ``epochs`` (central; expected passes over the units, steps*B/N) or ``rounds`` (federated):
      steps0/10 .. 10*steps0 steps;
    * ``batch``: records per step (central) or users per round (federated), B0/8 .. min(N, 8*B0),
      with the number of epochs held (steps = round(epochs*N/B)); absent without sampling.

    Every point is :func:`fedpriv.privacy.accounting.epsilon_for` on the event with one field
    replaced, and every panel contains the run's own parameters (``own``), whose epsilon is the
    run's. A ledger of more than one entry (a mechanism changed mid-run) is refused."""
    if len(events) != 1:
        raise FedprivError(f"epsilon curves need a ledger of one mechanism, got {len(events)} entries")
    ev = events[0]

    def eps(e: GaussianSteps) -> float:
        return epsilon_for(e, delta, accountant).epsilon  # type: ignore[arg-type]

    q = ev.sampling_probability
    epochs = ev.steps * q
    panels = []
    sigmas = _geometric(ev.noise_multiplier, 4.0, points)
    panels.append({"parameter": "noise_multiplier", "label": "noise multiplier σ (per draw)", "x": sigmas,
                   "epsilon": [eps(replace(ev, noise_multiplier=s)) for s in sigmas], "own": ev.noise_multiplier, "log_x": True})
    steps = _integers(_geometric(ev.steps, 10.0, points), 1, 10**9, ev.steps)
    step_x = [float(s) for s in steps] if kind == "federated" else [s * q for s in steps]
    panels.append({"parameter": "rounds" if kind == "federated" else "epochs",
                   "label": "rounds" if kind == "federated" else "epochs (steps × B/N)", "x": step_x,
                   "epsilon": [eps(ev.with_steps(s)) for s in steps], "own": float(ev.steps) if kind == "federated" else epochs, "log_x": True})
    if ev.sampling != "none":
        batches = _integers(_geometric(ev.batch, 8.0, points), 1, ev.population, round(ev.batch))
        if float(ev.batch) not in batches:  # a fractional expected batch: keep the run's own exactly
            batches = sorted(set(batches) | {ev.batch})
        values = [eps(replace(ev, batch=float(b), steps=ev.steps if b == ev.batch else max(1, round(epochs * ev.population / b)))) for b in batches]
        unit = "users per round" if kind == "federated" else "batch size (records)"
        panels.append({"parameter": "batch", "label": f"{unit}, {epochs:.3g} epochs held", "x": [float(b) for b in batches],
                       "epsilon": values, "own": float(ev.batch), "log_x": True})
    return {"epsilon": eps(ev), "delta": delta, "accountant": accountant, "event": ev, "panels": panels}


def run_accountant(run: Mapping[str, Any]) -> str:
    """The accountant a run's config names ('rdp' unless its privacy/federated section says 'pld')."""
    cfg = run.get("config") or {}
    section = cfg.get("privacy") if run.get("kind") == "central" else cfg.get("federated")
    return str((section or {}).get("accountant") or "rdp")


# ---- formatting ------------------------------------------------------------------------------------
def _num(v: Any, fmt: str = ".3g") -> str:
    return "—" if v is None else format(v, fmt)


def _of(k: Any, n: Any) -> str:
    return "—" if k is None else f"{k}/{n}"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def epsilon_text(epsilon: float | None, delta: float | None) -> str:
    """'0.578 (δ = 0.0001)', or '∞' for a non-private run."""
    return "∞" if epsilon is None else f"{epsilon:.3g} (δ = {delta:.3g})"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table's lines; ``|`` in cells escaped."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return lines + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]


def comparison_table_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The comparison table as Markdown lines (accuracy in %, exposure in bits)."""
    header = ["run", "training", "algorithm", "data", "batch", "RS memorized", "BS memorized", "exposure mean (bits)", "exposure max (bits)",
              "test accuracy (%)", "test perplexity", "ε (δ)", "assumptions"]
    body = [[
        r["run"], r["training"], r["algorithm"], r["data"], "—" if r["batch"] is None else f"{r['batch']:g} {r['batch_unit']}",
        _of(r["rs_memorized"], r["canaries"]), _of(r["bs_memorized"], r["canaries"]), _num(r["exposure_mean_bits"]), _num(r["exposure_max_bits"]),
        "—" if r["test_accuracy"] is None else f"{100 * r['test_accuracy']:.2f}", _num(r["test_perplexity"], ".1f"),
        epsilon_text(r["epsilon"], r["delta"]), r["assumptions"],
    ] for r in rows]
    if any(r.get("test_f1") is not None for r in rows):  # NER runs: entity F1 after the perplexity
        header.insert(11, "test entity F1 (%)")
        for line, r in zip(body, rows):
            line.insert(11, "—" if r.get("test_f1") is None else f"{100 * r['test_f1']:.2f}")
    return markdown_table(header, body)


def configuration_cell(cell: Mapping[str, Any] | None) -> str:
    """'RS k / BS k of n' (— for a test the task has no result for); masked-LM canaries, which have
    no RS/BS test, show their mean and max exposure instead."""
    if cell is None:
        return "—"
    if cell.get("rs_memorized") is None and cell.get("bs_memorized") is None and cell.get("exposure_mean_bits") is not None:
        return f"exposure {cell['exposure_mean_bits']:.2f} bits (max {cell['exposure_max_bits']:.2f}) of {cell['canaries']}"
    return f"RS {_num(cell['rs_memorized'], 'd')} / BS {_num(cell['bs_memorized'], 'd')} of {cell['canaries']}"


def configuration_table_lines(rows: Sequence[Mapping[str, Any]], run_names: Sequence[str]) -> list[str]:
    """The memorized-by-configuration table as Markdown lines, with an 'all' row of the sums."""
    runs = [r for r in run_names if any(r in row["cells"] for row in rows)]
    body = [[row["configuration"], *(configuration_cell(row["cells"].get(r)) for r in runs)] for row in rows]
    totals = []
    for r in runs:
        cells = [row["cells"][r] for row in rows if r in row["cells"]]
        add = lambda k: None if any(c[k] is None for c in cells) else sum(c[k] for c in cells)  # noqa: E731
        scored = [c for c in cells if c.get("exposure_mean_bits") is not None]
        n = sum(c["canaries"] for c in scored)
        mean = sum(c["exposure_mean_bits"] * c["canaries"] for c in scored) / n if n else None
        top = max((c["exposure_max_bits"] for c in scored), default=None)
        totals.append(configuration_cell({"rs_memorized": add("rs_memorized"), "bs_memorized": add("bs_memorized"), "canaries": add("canaries"),
                                          "exposure_mean_bits": mean, "exposure_max_bits": top}))
    return markdown_table(["configuration", *runs], [*body, ["all", *totals]])


def introduction(name: str, settings: Mapping[str, Any]) -> list[str]:
    """The heading and the paragraph on how to read the tables."""
    cand = settings.get("rs_candidates")
    prefix, width, top = settings.get("rs_prefix", 2), settings.get("beam_width", 5), settings.get("beam_top", 5)
    return [
        f"# Memorization and privacy report: experiment {name}",
        "",
        "Each row is one training run over the same planted corpus (the same held-out users and the same canaries), "
        "laid out like Thakkar et al. (2021), Tables 1-2. "
        f"**RS memorized** k/n: of the n canaries, k have a lower log-perplexity after their {prefix}-word prefix than every one of "
        f"{f'{cand:,}' if cand is not None else 'the audit'} random suffixes (Random Sampling). "
        f"**BS memorized**: canaries whose suffix is among the top {top} beam-search (width {width}) continuations of their first word (Beam Search). "
        "**Exposure**, in bits, is log2 |R| − log2 rank of the canary among all possible suffixes R (Carlini et al. 2019; the rank is "
        "estimated from the sampled suffixes when R is large): a typical random suffix has about 1 bit, the maximum is log2 |R|. "
        "**Data**: for central runs IID means records shuffled and non-IID users in random order with their records contiguous; "
        "for federated runs IID means records resharded over synthetic same-size users and non-IID the natural users. "
        "**Batch** is records per step (central; the expected size under Poisson sampling) or users per round (federated). "
        "Test accuracy (next-token, %) and perplexity are on the held-out users. "
        "**ε** is at the δ shown; what it protects (one example or one user), the neighbouring relation "
        "(add-or-remove-one or replace-one), the sampling and the accountant are stated in the assumptions column, "
        "and epsilons under different assumptions are not directly comparable. ∞ / not private: no noise was added.",
        "",
    ]


def comparison_markdown(
    name: str,
    rows: Sequence[Mapping[str, Any]],
    config_rows: Sequence[Mapping[str, Any]],
    run_names: Sequence[str],
    unfinished: Sequence[str],
    notes: Sequence[str],
    plots: Sequence[str],
    settings: Mapping[str, Any] | None = None,
) -> str:
    """The whole comparison.md: introduction, comparison table, unfinished runs, the
    by-configuration table, notes, and the plots as image links."""
    lines = introduction(name, settings or {})
    lines += comparison_table_lines(rows)
    if unfinished:
        lines += ["", "Not finished (no summary.json): " + ", ".join(unfinished) + "."]
    lines += ["", "## Memorized canaries by configuration", "",
              "Rows are canary configurations (p_u: probability a user shares the canary; p_e: probability each of a sharer's "
              "examples is replaced by it); cells are RS-memorized / BS-memorized of the canaries in that configuration (masked-LM canaries, which have no RS/BS test: mean and max exposure of the secret, in bits).", ""]
    lines += configuration_table_lines(config_rows, run_names) if config_rows else ["No audited run."]
    if notes:
        lines += ["", "## Notes", "", *(f"- {n}" for n in notes)]
    if plots:
        lines += ["", "## Plots", ""]
        for p in plots:
            lines += [f"![{PLOT_FILES.get(p, p)}]({p})", ""]
    return "\n".join(lines).rstrip() + "\n"


def write_csv(path: Path, columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> Path:
    """``rows`` as CSV with ``columns`` (None written as an empty field)."""
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, columns, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if r.get(k) is None else r[k] for k in columns})
    return path


# ---- plot inputs --------------------------------------------------------------------------------------
def exposure_series(run_names: Sequence[str], summaries: Mapping[str, Mapping[str, Any]], canaries: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Per audited run: label, private flag, epsilon, and per-canary insertions and exposure (bits)."""
    out = []
    for run in run_names:
        rows = [c for c in canaries.get(run, []) if c.get("exposure") is not None]
        if not rows:
            continue
        s = summaries[run]
        out.append({"run": run, "private": is_private(s), "epsilon": s.get("epsilon"),
                    "insertions": [int(c["insertions"]) for c in rows], "exposure": [float(c["exposure"]) for c in rows]})
    return out


def utility_points(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """(run, epsilon or None, utility as a fraction, metric name) per row: the test entity F1 when
    any run has one (NER: token accuracy is dominated by the O tag), else held-out accuracy."""
    key, metric = ("test_f1", "entity F1") if any(r.get("test_f1") is not None for r in rows) else ("test_accuracy", "held-out accuracy")
    return [{"run": r["run"], "epsilon": r["epsilon"], "accuracy": r[key], "metric": metric} for r in rows if r.get(key) is not None]


def dp_curves(contents: StoreContents, notes: list[str]) -> list[dict[str, Any]]:
    """epsilon_curves of every finished DP run, with a note for each run it cannot draw (no or a
    mixed ledger) or whose accountant's epsilon differs from the summary's."""
    out = []
    for run in contents.runs:
        s = contents.summaries.get(run["name"])
        if s is None or s.get("epsilon") is None:  # the curves follow the server-side ledger (DP-SGD, DP-FedAvg)
            continue
        events = contents.ledgers.get(run["name"])
        if not events:
            notes.append(f"{run['name']}: no {LEDGER}, so no epsilon curves.")
            continue
        if len(events) != 1:
            notes.append(f"{run['name']}: the ledger has {len(events)} mechanisms; epsilon curves need one.")
            continue
        c = epsilon_curves(events, float(s["delta"]), run_accountant(run), s.get("kind", run["kind"]))
        c["run"] = run["name"]
        if not math.isclose(c["epsilon"], float(s["epsilon"]), rel_tol=1e-6):
            notes.append(f"{run['name']}: the ledger gives epsilon {c['epsilon']:.6g}, the summary {s['epsilon']:.6g}.")
        out.append(c)
    return out


# ---- the report ------------------------------------------------------------------------------------------
def write_report(store: str | os.PathLike[str]) -> Path:
    """Write STORE/report/ (the files in the module docstring) and return that directory.
    FedprivError when STORE has no experiment.json."""

    store = Path(store)
    contents = read_store(store)
    out = store / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    names = [r["name"] for r in contents.runs if r["name"] in contents.summaries]
    rows = comparison_rows(contents.runs, contents.summaries)
    config_rows = configuration_rows(names, contents.canaries)
    write_csv(out / "comparison.csv", COMPARISON_COLUMNS, rows)
    write_csv(out / "memorized_by_configuration.csv", CONFIGURATION_COLUMNS, configuration_csv_rows(config_rows))

    notes: list[str] = []
    drawn: list[str] = []
    for stale in PLOT_FILES:  # a plot left from an earlier report must not outlive its data
        (out / stale).unlink(missing_ok=True)
    if any(cell.get("rs_memorized") is not None for row in config_rows for cell in row["cells"].values()):
        audited = [n for n in names if n in contents.canaries]
        counts = [[(row["cells"].get(n) or {}).get("rs_memorized") or 0 for row in config_rows] for n in audited]
        plots.plot_memorized_by_configuration([r["configuration"] for r in config_rows], audited, counts, out / "memorized_by_configuration.png")
        drawn.append("memorized_by_configuration.png")
    series = exposure_series(names, contents.summaries, contents.canaries)
    if series:
        plots.plot_exposure_vs_insertions(series, out / "exposure_vs_insertions.png")
        drawn.append("exposure_vs_insertions.png")
    else:
        notes.append("No per-canary exposure: exposure_vs_insertions.png not drawn.")
    curves = dp_curves(contents, notes)
    if len(curves) > MAX_CURVES:
        notes.append(f"epsilon_vs_parameters.png draws the first {MAX_CURVES} of the {len(curves)} DP runs.")
        curves = curves[:MAX_CURVES]
    if curves:
        plots.plot_epsilon_vs_parameters(curves, out / "epsilon_vs_parameters.png")
        drawn.append("epsilon_vs_parameters.png")
    elif not any(is_private(s) for s in contents.summaries.values()):
        notes.append("No differentially private run finished: epsilon_vs_parameters.png not drawn.")
    points = utility_points(rows)
    if points:
        plots.plot_utility_vs_epsilon(points, out / "utility_vs_epsilon.png")
        drawn.append("utility_vs_epsilon.png")

    chains = chains_markdown(contents.summaries)
    (out / "chains.md").unlink(missing_ok=True)
    if chains:
        (out / "chains.md").write_text(chains, encoding="utf-8")
        notes.append("Runs start from earlier runs: chains.md has each pretrained encoder's stages, composed epsilon and fine-tuned F1.")

    for name, why in contents.failed.items():
        notes.append(f"Run {name} failed and is not compared: {why}.")
    if write_measurements(store, out) is not None:
        notes.append("Local privacy measurements (plausible deniability N_w / S_w, token inversion accuracy per eta): [measurements.md](measurements.md).")
    md = comparison_markdown(contents.name, rows, config_rows, names, unfinished_runs(contents.runs, {**contents.summaries, **contents.failed}), notes, drawn, contents.audit_settings)
    (out / "comparison.md").write_text(md, encoding="utf-8")
    return out
