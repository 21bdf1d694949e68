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

Units: exposure in bits (log2 |R| - log2 rank, Carlini et al. 2019); a sampled estimate at log2 |R|
(the canary beat every sampled suffix) is the estimate's ceiling, not a measurement, and is counted
(``exposure_at_ceiling``) and marked wherever a mean or max includes it; accuracy as a fraction in the
rows and CSV files, as a percentage in the Markdown; epsilon is unitless: the CSV files carry what it
protects (``epsilon_unit``: the privacy unit, example, user, example (client-side) or example, encoder only), its neighbouring relation (``neighbouring``, from the
run's privacy ledger) and ``delta`` beside it, and the guarantee string adds the sampling and accountant.
"""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fedpriv.errors import FedprivError
from fedpriv.memorization.audit import configuration_label
from fedpriv.memorization.exposure import at_ceiling, beat_every_draw_bound
from fedpriv.privacy.accounting import GaussianSteps, PLDTooCostly, common_relation, epsilon_for
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.report import plots
from fedpriv.report.chain import ENCODER_UNIT, chain_privacy, chains_markdown, source_key
from fedpriv.report.intervals import Estimate, interval, paired_difference
from fedpriv.report.measurements import write_measurements
from fedpriv.report.stopping import client_promise, promised_summary
from fedpriv.report.warmstart import public_flag, public_notes, start_label
from fedpriv.training.coverage import PUBLIC_VOCAB_USERS
from fedpriv.config import name_problem
from fedpriv.jsonio import read_json
from fedpriv.report.uncounted import uncounted_lines
from fedpriv.rundir import AUDIT_JSON, EXPERIMENT, LEDGER, TUNE_DIR, TUNING_SHAPE, RunDir, claim, expect_shape, hold, read_store_record

REPORT_DIR = "report"
MAX_CURVES = 12  # DP runs drawn in epsilon_vs_parameters.png (one row of panels each)
NOT_PRIVATE = "not private"
PLOT_FILES = {
    "memorized_by_configuration.png": "RS-memorized canaries by configuration",
    "exposure_vs_insertions.png": "exposure against insertions",
    "epsilon_vs_parameters.png": "epsilon against the DP parameters",
    "utility_vs_epsilon.png": "test utility against epsilon",
    "memorization_vs_utility.png": "memorization against validation utility along training",
    "empirical_vs_theoretical.png": "empirical lower bound against the accountant's epsilon",
}

# runs.csv columns, in order (one row per finished run; raw values, see comparison_rows)
RUN_COLUMNS = [
    "run", "group", "seed", "canary_seed", "training", "algorithm", "data", "batch", "batch_unit", "privacy_unit", "canaries",
    "rs_memorized", "bs_memorized", "exposure_mean_bits", "exposure_max_bits", "exposure_at_ceiling", "exposure_max_at_ceiling", "exposure_max_extrapolated_bits",
    "utility_metric", "test_utility", "test_accuracy",
    "test_perplexity", "test_f1", "target_metric", "target_value", "target_reached", "target_at", "target_when", "target_value_reached",
    "epsilon", "epsilon_unit", "neighbouring", "delta", "population", "sampling_rate", "empirical_epsilon", "empirical_unit", "empirical_canaries",
    "assumptions", "flag", "not_covered",
]
# comparison.csv columns (one row per run group: a run's seeds together; means and 95% intervals;
# epsilon is the largest of its seeds' (what every run of the group spent at most), epsilon_min the smallest,
# delta the largest; epsilon_unit (the privacy unit: example, user, example (client-side), example, encoder only) and neighbouring (add-or-remove-one, replace-one,
# zero-out-one) say what it protects: two epsilons are one scale only where both agree, and delta too.
# exposure_at_ceiling: canaries (every seed's) whose exposure is the ceiling log2|R| of a sampled estimate;
# exposure_max_at_ceiling: exposure_max_bits is such a ceiling; exposure_max_extrapolated_bits: the largest
# skew-normal extrapolation)
COMPARISON_COLUMNS = [
    "run", "seeds", "training", "algorithm", "data", "batch", "batch_unit", "privacy_unit", "canaries",
    "rs_memorized", "rs_memorized_low", "rs_memorized_high", "bs_memorized", "bs_memorized_low", "bs_memorized_high",
    "exposure_mean_bits", "exposure_mean_low", "exposure_mean_high", "exposure_max_bits", "exposure_at_ceiling", "exposure_max_at_ceiling",
    "exposure_max_extrapolated_bits",
    "utility_metric", "test_utility", "test_utility_low", "test_utility_high", "test_accuracy", "test_perplexity",
    "target", "epsilon", "epsilon_min", "epsilon_unit", "neighbouring", "delta", "empirical_epsilon", "assumptions", "flag", "not_covered",
]
# exposure_at_ceiling (exposure rows): 'k/n − j/m', the canaries of each side at the sampled ceiling log2|R|, which the means count at it
CONTRAST_COLUMNS = ["contrast", "a", "b", "quantity", "difference", "low", "high", "seeds", "comparable", "exposure_at_ceiling"]
CONFIGURATION_COLUMNS = ["configuration", "pattern", "p_u", "p_e", "run", "canaries", "rs_memorized", "bs_memorized", "exposure_mean_bits", "exposure_max_bits",
                         "exposure_at_ceiling"]


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
    contrasts: list[dict[str, str]] = field(default_factory=list)
    uncounted_choices: list[str] = field(default_factory=list)  # the experiment file's, as given
    tunings: dict[str, dict[str, Any]] = field(default_factory=dict)  # group -> its tune/GROUP.json record
    started: dict[str, str] = field(default_factory=dict)  # run name -> where it stopped (a run folder with metrics, no summary)


def read_store(store: Path) -> StoreContents:
    """Read ``experiment.json`` and every finished run's summary, audit rows and privacy ledger
    (its ``metrics.jsonl`` checked: a second row of one step and split is refused).
    FedprivError when ``store`` is not a run store (no ``experiment.json``)."""
    exp_path = store / EXPERIMENT
    if not exp_path.is_file():
        raise FedprivError(f"{store}: not a run store (no {EXPERIMENT}); make one with fedpriv run EXPERIMENT.toml --out {store}")
    exp = read_store_record(store)
    out = StoreContents(exp["name"], exp["runs"], contrasts=list(exp.get("contrasts", [])), uncounted_choices=list(exp.get("uncounted_choices", [])))
    for run in out.runs:
        rd = RunDir(store / run["name"])
        failed = rd.failure()
        if failed is not None:
            out.failed[run["name"]] = failed["reason"]
            continue
        if not rd.has_summary():
            where = stopped_at(rd)
            if where:
                out.started[run["name"]] = where
            continue
        out.summaries[run["name"]] = rd.summary()
        group = out.summaries[run["name"]].get("group") or run["name"]
        tuned = store / TUNE_DIR / f"{group}.json"
        if out.summaries[run["name"]].get("tuned") and group not in out.tunings and not name_problem(group) and tuned.is_file():
            out.tunings[group] = expect_shape(read_json(tuned, "tuning record"), tuned, "tuning record", TUNING_SHAPE)
        rd.metrics()  # the rows the summary came from: a damaged or doubled metrics.jsonl is refused, naming the line
        if rd.has(AUDIT_JSON):
            audit = rd.audit()
            out.canaries[run["name"]] = list(audit.get("canaries", []))
            out.audit_settings = out.audit_settings or dict(audit.get("settings", {}))
        if rd.has(LEDGER):
            out.ledgers[run["name"]] = PrivacyLedger.load(rd.file(LEDGER)).entries
            out.summaries[run["name"]] = promised_summary(out.summaries[run["name"]], out.ledgers[run["name"]], run.get("config") or {})
        out.summaries[run["name"]] = client_promise(out.summaries[run["name"]], run.get("config") or {})
    return out


def stopped_at(rd: RunDir) -> str:
    """Where a run without a summary stopped, from its metrics: its last step or round and its
    last validation value of the headline metric ('' when it wrote no metrics; a torn last line,
    as a killed run leaves, is skipped)."""
    try:
        rows = rd.metrics_so_far()
        metric, label = rd.utility()
    except FedprivError:
        return "metrics unreadable"
    if not rows:
        return ""
    unit = "round" if (rd.config_meta() or {}).get("kind") == "federated" else "step"
    where = f"{unit} {max(int(r.get('step', 0)) for r in rows)}"
    val = [r for r in rows if r.get("split") == "validation" and r.get(metric) is not None]
    if val:
        where += f", validation {label} {100 * float(val[-1][metric]):.2f}% at {unit} {val[-1]['step']}"
    return where


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
    Poisson sampling), users per step (user-level DP-SGD) or users per round (federated)."""
    if summary.get("kind") == "central":
        return summary.get("batch_size"), "users" if summary.get("privacy_unit") == "user" else "records"
    return summary.get("clients_per_round"), "users"


UNIT_ORDER = {None: 0, ENCODER_UNIT: 1, "example": 2, "example (client-side)": 3, "user": 4}
UNIT_TITLES = {None: "not private", ENCODER_UNIT: "example-level DP of the encoder only (own training not private)", "example": "example-level DP",
               "example (client-side)": "record-level DP inside each client", "user": "user-level DP"}


def run_flag(summary: Mapping[str, Any]) -> str:
    """Why a run's row cannot be compared as it stands: its model did not learn, or it missed the
    experiment's utility target ('' when neither)."""
    flags = []
    if summary.get("degenerate"):
        flags.append(f"did not learn: {summary['degenerate']}")
    public = public_flag(summary)
    if public is not None:  # the public model alone must stay below the target
        return "; ".join(flags + ([public] if public else []))
    t = summary.get("target")
    if t and not t.get("reached"):
        best = t.get("reached_value")
        flags.append(f"missed the utility target ({'best ' + f'{100 * best:.2f}%' if best is not None else 'no validation evaluation'} < {100 * t['value']:.2f}% on validation): not comparable")
    return "; ".join(flags)


def not_covered(summary: Mapping[str, Any], public_vocabulary: bool = False) -> str:
    """What a DP run released or logged that its epsilon does not cover ('' for a run without DP,
    which covers nothing): a vocabulary learned from its training data without DP, filters that are
    not 1-stable under an example-level guarantee (epsilon is about the filtered data), private
    statistics logged on request (issue 30), a warm start from a run trained on the private users
    (``[init] from`` a run that is not the public model: its privacy is not composed). ``public_vocabulary``: the run's config has a public
    split (``data.public_fraction``), from which alone the vocabulary is learned (runs from before
    their vocabulary record said so name the training users)."""
    if not is_private(summary):
        return ""
    out = []
    vocab = summary.get("vocabulary")
    vocab = vocab if isinstance(vocab, Mapping) else None
    if public_vocabulary or (vocab and vocab.get("users") == PUBLIC_VOCAB_USERS):
        pass  # learned from the public users only: nothing of the private users to cover
    elif vocab is None and summary.get("task") in ("nwp", "ner"):  # a run from before vocabulary records: learned from its training users
        out.append("vocabulary not private (learned from the training users without DP)")
    elif vocab and not vocab.get("dp") and source_key(str(vocab.get("source"))) == source_key(str(summary.get("data_source"))):
        out.append(f"vocabulary not private ({vocab.get('vocab_size')} entries learned from {vocab.get('users') or 'the training data'} without DP)")
    if summary.get("privacy_unit") in ("example", "example (client-side)"):
        filters = [f"data.{k} = {summary[k]}" for k in ("max_examples_per_user", "min_examples") if summary.get(k) is not None]
        if filters:
            said = "says why it gives no raw-data figure" if "no raw-data figure" in str(summary.get("guarantee") or "") else "gives the raw-data figure"
            out.append(f"ε is about the filtered data ({', '.join(filters)} is not 1-stable per example; the guarantee {said})")
    if summary.get("private_stats_logged"):
        out.append("private statistics logged (--log-private-stats)")
    if summary.get("epsilon_ex_post"):  # report/stopping.py could not recompute a stored run's promise
        out.append("ε is that of the steps taken before the run stopped at its target (ex-post, not a guarantee)")
    if summary.get("client_epsilon_ex_post"):
        out.append("the record-level client ε is that of the rounds taken before the run stopped at its target (ex-post, not a guarantee)")
    if summary.get("privacy_unit") == "user" and summary.get("users") == "iid":  # data.users = "iid": records resharded over synthetic users
        out.append("its users are synthetic (records resharded over same-size users): ε protects one synthetic user, not one real user's data")
    init = summary.get("init")
    if isinstance(init, Mapping) and init and not init.get("public"):  # a warm start from a run on the private users
        out.append(f"starts from run {init.get('name') or init.get('from')}, trained on the private users: that run's privacy is not composed into this ε")
    return "; ".join(out)


#: What a run's population N counts, by privacy unit: examples (a record inside a client, an
#: encoder's pretraining example: examples too) or users.
POPULATION_UNITS = {"example": "example", "example (client-side)": "example", ENCODER_UNIT: "example", "user": "user"}


def named_relation(text: str | None) -> str | None:
    """The first neighbouring relation a guarantee names (the ε's own: a client-side guarantee
    appended after it names its own), None where it names none."""
    text = text or ""
    named = [(text.find(r), r) for r in RELATIONS if r in text]
    return min(named)[1] if named else None


def ledger_facts(events: Sequence[Any] | None) -> dict[str, Any]:
    """What a run's privacy ledger records about its ε: ``neighbouring`` (the relation of its
    events), ``population`` (N, the units sampled from) and ``sampling_rate`` (q), each None when
    the ledger has no single value (no ledger, or events that differ)."""
    events = list(events or [])
    out: dict[str, Any] = {"neighbouring": None, "population": None, "sampling_rate": None}
    if not events:
        return out
    try:
        out["neighbouring"] = common_relation(events)
    except FedprivError:
        pass
    pops, rates = {e.population for e in events}, {e.sampling_probability for e in events}
    out["population"] = pops.pop() if len(pops) == 1 else None
    out["sampling_rate"] = rates.pop() if len(rates) == 1 else None
    return out


def exposure_ceiling(by_run: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """The exposure estimates at their ceiling among the audit rows of ``by_run`` (run -> canaries;
    a group's seeds together): ``exposure_at_ceiling`` (how many canaries beat every sampled suffix,
    so that their exposure is log2 |R|, the most a sampled estimate gives, not a measurement),
    ``exposure_scored`` (canaries with an exposure), ``exposure_max_at_ceiling`` (the largest
    exposure is such a ceiling), ``exposure_max_extrapolated_bits`` (the largest skew-normal
    extrapolation, which resolves those canaries) and ``exposure_ceiling`` (per ceiling canary: run,
    id, ceiling bits, the 95% lower bound of :func:`fedpriv.memorization.exposure.beat_every_draw_bound`,
    its extrapolation). Counts and flags are None when no canary has an exposure."""
    scored = [(run, c) for run, rows in by_run.items() for c in rows if c.get("exposure") is not None]
    if not scored:
        return {"exposure_at_ceiling": None, "exposure_scored": 0, "exposure_max_at_ceiling": None, "exposure_max_extrapolated_bits": None, "exposure_ceiling": []}
    hit = [(run, c) for run, c in scored if at_ceiling(c["exposure"], c.get("candidate_space_log2"), c.get("exposure_method"))]
    top = max(float(c["exposure"]) for _, c in scored)
    extrapolated = [float(c["exposure_extrapolated"]) for _, c in scored if c.get("exposure_extrapolated") is not None]
    ceiling = []
    for run, c in hit:
        n = c.get("rs_candidates")
        bound = beat_every_draw_bound(int(n), 2.0 ** float(c["candidate_space_log2"])) if n else None
        ceiling.append({"run": run, "id": c.get("id"), "ceiling_bits": float(c["candidate_space_log2"]), "sampled": n, "lower_bits": bound,
                        "extrapolated_bits": c.get("exposure_extrapolated")})
    return {"exposure_at_ceiling": len(hit), "exposure_scored": len(scored), "exposure_max_at_ceiling": any(float(c["exposure"]) == top for _, c in hit),
            "exposure_max_extrapolated_bits": max(extrapolated) if extrapolated else None, "exposure_ceiling": ceiling}


def comparison_rows(runs: Sequence[Mapping[str, Any]], summaries: Mapping[str, Mapping[str, Any]], canaries: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
                    ledgers: Mapping[str, Sequence[Any]] | None = None) -> list[dict[str, Any]]:
    """One row per finished run, in ``runs`` (experiment.json) order, with RUN_COLUMNS:
    memorized counts out of ``canaries``; exposure in bits, with the ceiling estimates among the
    run's audit rows (``canaries``: run -> its audit.json canaries; :func:`exposure_ceiling`); the
    headline utility (``test_utility``: next-token accuracy without OOV and EOS, entity F1,
    masked-token accuracy), accuracy and perplexity as fractions on the test users; the utility
    target record; epsilon/delta None and assumptions 'not private' for a non-DP run; what the
    epsilon protects (``epsilon_unit``: the privacy unit) under which ``neighbouring`` relation (the
    run's privacy ledger, ``ledgers``: run -> its events, else the relation its guarantee names),
    and the ledger's population N and sampling rate q; a flag for rows that cannot be compared."""
    canaries, ledgers = canaries or {}, ledgers or {}
    rows = []
    for run in runs:
        s = summaries.get(run["name"])
        if s is None:
            continue
        total = (s.get("audit") or {}).get("total", {})
        batch, unit = batch_of(s)
        epsilon, delta, assumptions = privacy_columns(s)
        if has_public_split(run) and assumptions:
            assumptions = PRE_PUBLIC_VOCAB_NOTE.sub(PUBLIC_VOCAB_NOTE, assumptions)
        assumptions = DATA_FACTS_CLAUSE.sub("", assumptions)  # said once for every private run, in "What ε does not count"
        privacy_unit = s.get("privacy_unit")
        inherited = chain_privacy(run["name"], summaries)  # a run that starts from earlier runs carries their privacy
        if inherited is not None:
            epsilon, delta, privacy_unit, assumptions = inherited["epsilon"], inherited["delta"], inherited["unit"], inherited["assumptions"]
            local = s.get("privatize")
            if local:  # the training text was privatized on the client too
                assumptions += f"; training text locally privatized: {local.get('guarantee', local.get('mechanism'))}"
        t = s.get("target") or {}
        # the ledger is the server-side mechanism's: it speaks for the row's epsilon only when that is the run's own DP-SGD / DP-FedAvg one
        facts = ledger_facts(ledgers.get(run["name"]) if inherited is None and s.get("epsilon") is not None else None)
        relation = (facts["neighbouring"] or named_relation(assumptions)) if epsilon is not None else None
        rows.append({
            "run": run["name"],
            "group": s.get("group") or run.get("group") or run["name"],
            "seed": s.get("seed"),
            "canary_seed": s.get("canary_seed"),
            "training": s.get("kind", run.get("kind")),
            "algorithm": (s.get("algorithm") or "") + start_label(s) if s.get("algorithm") else s.get("algorithm"),
            "data": data_label(s),
            "batch": batch,
            "batch_unit": unit,
            "privacy_unit": privacy_unit,
            "canaries": total.get("canaries"),
            "rs_memorized": total.get("rs_memorized"),
            "bs_memorized": total.get("bs_memorized"),
            "exposure_mean_bits": total.get("exposure_mean"),
            "exposure_max_bits": total.get("exposure_max"),
            **exposure_ceiling({run["name"]: canaries.get(run["name"], [])}),
            "utility_metric": s.get("utility_metric"),
            "utility_label": s.get("utility_label"),
            "test_utility": s.get("utility"),
            "test_accuracy": s.get("eval_accuracy"),
            "test_perplexity": s.get("eval_perplexity"),
            "test_f1": s.get("eval_f1"),  # entity-level F1 of NER tasks
            "target_metric": t.get("metric"),
            "target_value": t.get("value"),
            "target_reached": t.get("reached"),
            "target_at": t.get("at"),
            "target_when": t.get("when"),
            "target_value_reached": t.get("reached_value"),
            "epsilon": epsilon,
            "epsilon_unit": privacy_unit if epsilon is not None else None,  # the privacy unit itself: a client-side ε is not a central one
            "neighbouring": relation,
            "delta": delta,
            "population": facts["population"],
            "sampling_rate": facts["sampling_rate"],
            "empirical_epsilon": (s.get("empirical") or {}).get("epsilon_lower_bound"),
            "empirical_unit": (s.get("empirical") or {}).get("unit"),
            "empirical_canaries": (s.get("empirical") or {}).get("canaries"),
            "assumptions": assumptions,
            "flag": run_flag(s),
            "not_covered": not_covered(s, public_vocabulary=has_public_split(run)),
        })
    return rows


def _per_canary(canaries: Sequence[Mapping[str, Any]], key: str) -> list[float] | None:
    vals = [float(c[key]) for c in canaries if c.get(key) is not None]
    return vals if len(vals) == len(canaries) and vals else None


def _seeded(rows: Sequence[Mapping[str, Any]], canaries: Mapping[str, Sequence[Mapping[str, Any]]], key: str) -> list[list[float]] | None:
    """Per seed (row) of a group, the per-canary values of ``key`` (None if any seed lacks them)."""
    out = []
    for r in rows:
        vals = _per_canary(canaries.get(r["run"], []), key)
        if vals is None:
            return None
        out.append(vals)
    return out


def _target_text(rows: Sequence[Mapping[str, Any]]) -> str:
    if rows[0].get("target_metric") is None:
        return ""
    reached = [r for r in rows if r.get("target_reached")]
    at = rows[0].get("target_at") or "step"
    parts = [f"{len(reached)}/{len(rows)} reached"] if len(rows) > 1 else (["reached"] if reached else ["missed"])
    if reached:
        whens = [r["target_when"] for r in reached]
        parts.append(f"at {at} {whens[0]}" if len(whens) == 1 else f"at {at}s {min(whens)}–{max(whens)}")
    return ", ".join(parts)


def group_rows(run_rows: Sequence[Mapping[str, Any]], canaries: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One row per run group (a run's seeds together), ordered by privacy unit (not private,
    example, client-side, user) then experiment order, with COMPARISON_COLUMNS: RS/BS memorized
    as counts out of ``canaries`` and exposure in bits, each the mean over seeds and canaries with
    its 95% hierarchical bootstrap interval, with the ceiling estimates of every seed's canaries
    (:func:`exposure_ceiling`); the headline utility's mean over seeds with its interval (none with
    one seed); the secondary metrics' means; epsilon the largest of the seeds' and epsilon_min the
    smallest, delta the largest (every seed promises (epsilon, delta)); epsilon_unit and neighbouring
    the seeds' (``mixed (...)`` when they differ, and flagged); the assumptions of the first seed,
    named as such with each seed's N and q when the seeds' guarantees differ (each seed draws its
    own held-out users, so its training population differs); flags of any seed."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in run_rows:
        groups.setdefault(r["group"], []).append(r)
    out = []
    for name, rows in groups.items():
        first = rows[0]
        n = first.get("canaries")
        row: dict[str, Any] = {k: first.get(k) for k in ("training", "algorithm", "data", "batch", "batch_unit", "privacy_unit", "canaries", "utility_metric", "utility_label", "epsilon", "delta", "assumptions", "not_covered")}
        row.update(run=name, seeds=len(rows), runs=[r["run"] for r in rows])
        row["assumptions"] = seeds_assumptions(rows)
        deltas = [r.get("delta") for r in rows]
        row["delta"] = max(deltas) if None not in deltas else first.get("delta")  # every seed is also (ε, δ)-DP at the largest δ
        for key in ("epsilon_unit", "neighbouring"):
            values = list(dict.fromkeys(r.get(key) for r in rows))
            row[key] = values[0] if len(values) == 1 else f"mixed ({', '.join(str(v) for v in values)})"
        for key, col in (("rs_memorized", "rs_memorized"), ("bs_memorized", "bs_memorized"), ("exposure", "exposure_mean")):
            by_seed = _seeded(rows, canaries, key)
            est = interval(by_seed) if by_seed else None
            if est is not None and key != "exposure":
                est = est.scaled(float(n or 0))
            row[col if key == "exposure" else key] = est
        row["exposure_max_bits"] = _extreme(max, [r.get("exposure_max_bits") for r in rows])  # the largest of every seed's canaries
        row.update(exposure_ceiling({r["run"]: canaries.get(r["run"], []) for r in rows}))
        utilities = [r.get("test_utility") for r in rows]
        row["test_utility"] = interval([[u] for u in utilities]) if all(u is not None for u in utilities) else None
        row["test_accuracy"] = _mean([r.get("test_accuracy") for r in rows])
        row["test_perplexity"] = _mean([r.get("test_perplexity") for r in rows])
        row["test_f1"] = _mean([r.get("test_f1") for r in rows])
        # a guarantee is per run: the group's epsilon is the largest (every run promises at most that),
        # never a mean, which would print less than a run promises (seeds differ: their populations do)
        spent = [r.get("epsilon") for r in rows]
        row["epsilon"], row["epsilon_min"] = (max(spent), min(spent)) if None not in spent else (None, None)
        kinds = {guarantee_kind(r) for r in rows}
        # each seed's figure is a 95% lower bound; the smallest still is one (a mean or the largest of several is not)
        row["empirical_epsilon"] = _extreme(min, [r.get("empirical_epsilon") for r in rows])
        row["empirical_unit"] = first.get("empirical_unit")
        row["target"] = _target_text(rows)
        flags = [f"{r['run']}: {r['flag']}" if len(rows) > 1 else r["flag"] for r in rows if r.get("flag")]
        if len(kinds) > 1:  # one ε column cannot hold two promises: say so rather than print the first seed's
            flags.append("its seeds' guarantees differ in unit, δ or neighbouring relation (" + "; ".join(
                f"{r['run']}: {' '.join(str(k) for k in guarantee_kind(r) if k)}" for r in rows) + "): the ε shown is not one promise")
        row["flag"] = "; ".join(flags)
        out.append(row)
    order = {name: i for i, name in enumerate(groups)}
    return sorted(out, key=lambda r: (UNIT_ORDER.get(r.get("privacy_unit"), 9), order[r["run"]]))


RELATIONS = ("add-or-remove-one", "replace-one", "zero-out-one")


def guarantee_kind(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """What must agree for two runs' epsilons to be one promise: the privacy unit, δ and the
    neighbouring relation: the row's ``neighbouring`` (its ledger's), else the first its guarantee
    names (the ε's own; a client-side DP-SGD guarantee appended after it names its own), None where
    it names none."""
    relation = row.get("neighbouring") or named_relation(row.get("assumptions"))
    return (row.get("privacy_unit"), row.get("delta"), relation)


def seeds_assumptions(rows: Sequence[Mapping[str, Any]]) -> str:
    """A group's assumptions: its seeds' guarantee when they all state the same one; else the first
    seed's, named as such, with each seed's population N and sampling rate q when those differ (each
    seed draws its own held-out users, so each trains on another population). Every seed's own
    guarantee is in runs.csv."""
    first = rows[0]
    text = first.get("assumptions") or ""
    if len({r.get("assumptions") or "" for r in rows}) == 1:
        return text
    out = f"{first['run']} (each seed's own guarantee is in runs.csv): {text}"
    pops = [(r.get("population"), r.get("sampling_rate")) for r in rows]
    if len(set(pops)) > 1 and all(n is not None for n, _ in pops):
        unit = POPULATION_UNITS.get(first.get("epsilon_unit"), first.get("epsilon_unit"))
        per = f" {unit}s" if unit else ""
        out += ("; N and q differ by seed (each seed draws its own held-out users): "
                + "; ".join(f"{r['run']} N = {n:,}{per} and q = {'varies' if q is None else format(q, '.6g')}" for r, (n, q) in zip(rows, pops)))
    return out


def _mean(values: Sequence[Any]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals and len(vals) == len(values) else None


def _extreme(pick: Any, values: Sequence[Any]) -> float | None:
    """``pick`` (min or max) of the seeds' values; None unless every seed has one."""
    vals = [float(v) for v in values if v is not None]
    return pick(vals) if vals and len(vals) == len(values) else None


def group_csv_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """group_rows flattened for comparison.csv (each estimate as mean, low, high)."""
    out = []
    for r in rows:
        flat = {k: v for k, v in r.items() if not isinstance(v, Estimate)}
        for key, low, high in (("rs_memorized", "rs_memorized_low", "rs_memorized_high"), ("bs_memorized", "bs_memorized_low", "bs_memorized_high"),
                               ("exposure_mean", "exposure_mean_low", "exposure_mean_high"), ("test_utility", "test_utility_low", "test_utility_high")):
            est = r.get(key)
            col = "exposure_mean_bits" if key == "exposure_mean" else key
            flat[col], flat[low], flat[high] = (est.mean, est.low, est.high) if est is not None else (None, None, None)
        out.append(flat)
    return out


#: A contrast's "at matched utility" when its runs had no ``[utility]`` target (their utilities are whatever they reached).
NO_TARGET = "not checked: no utility target"


def contrast_rows(contrasts: Sequence[Mapping[str, str]], run_rows: Sequence[Mapping[str, Any]], canaries: Mapping[str, Sequence[Mapping[str, Any]]], notes: list[str]) -> list[dict[str, Any]]:
    """Each declared contrast a - b: RS memorized (canaries), exposure (bits) and the headline
    utility (a fraction), paired by seed, with 95% bootstrap intervals. A contrast whose sides do
    not share their seeds (or canary counts) is left out with a note. ``comparable`` is "yes" (every
    run of both sides stopped at its utility target), names the flagged runs (missed the target,
    did not learn) that make the difference not a comparison at matched utility, or is
    :data:`NO_TARGET` when a side's runs had no target to stop at."""
    by_group: dict[str, list[Mapping[str, Any]]] = {}
    for r in run_rows:
        by_group.setdefault(r["group"], []).append(r)
    out = []
    for c in contrasts:
        a, b = by_group.get(c["a"]), by_group.get(c["b"])
        if not a or not b:
            notes.append(f"contrast {c['name']!r}: {c['a'] if not a else c['b']} has no finished run")
            continue
        seeds_a, seeds_b = {r.get("seed"): r for r in a}, {r.get("seed"): r for r in b}
        common = [s for s in seeds_a if s in seeds_b]
        if not common:
            notes.append(f"contrast {c['name']!r}: {c['a']} and {c['b']} share no seed")
            continue
        ra, rb = [seeds_a[s] for s in common], [seeds_b[s] for s in common]
        flagged = [r["run"] for r in ra + rb if r.get("flag")]
        untargeted = [r["run"] for r in ra + rb if r.get("target_metric") is None]
        if flagged:
            comparable = f"no: {', '.join(flagged)} flagged"
        elif untargeted:  # nothing stopped the runs at one utility: their utilities may differ
            comparable = NO_TARGET
        else:
            comparable = "yes"
        n = ra[0].get("canaries") or 0
        quantities = [("RS memorized (canaries)", "rs_memorized", float(n)), ("exposure mean (bits)", "exposure", 1.0)]
        for label, key, scale in quantities:
            va, vb = _seeded(ra, canaries, key), _seeded(rb, canaries, key)
            if va is None or vb is None or [len(x) for x in va] != [len(x) for x in vb]:
                continue
            est = paired_difference(va, vb).scaled(scale)
            row = {"contrast": c["name"], "a": c["a"], "b": c["b"], "quantity": label, "difference": est.mean, "low": est.low, "high": est.high, "seeds": len(common),
                   "comparable": comparable}
            if key == "exposure":  # canaries at the sampled ceiling enter the means at log2 |R|: the difference is partly how many hit it
                capped = [exposure_ceiling({r["run"]: canaries.get(r["run"], []) for r in side}) for side in (ra, rb)]
                if any(x["exposure_at_ceiling"] for x in capped):
                    row["exposure_at_ceiling"] = " − ".join(f"{x['exposure_at_ceiling'] or 0}/{x['exposure_scored']}" for x in capped)
            out.append(row)
        ua, ub = [r.get("test_utility") for r in ra], [r.get("test_utility") for r in rb]
        if all(u is not None for u in ua + ub):
            est = paired_difference([[u] for u in ua], [[u] for u in ub]).scaled(100.0)
            out.append({"contrast": c["name"], "a": c["a"], "b": c["b"], "quantity": f"{ra[0].get('utility_label') or 'utility'} (points)", "difference": est.mean, "low": est.low, "high": est.high, "seeds": len(common),
                        "comparable": comparable})
    return out


def unfinished_runs(runs: Sequence[Mapping[str, Any]], summaries: Mapping[str, Any]) -> list[str]:
    """Names of the runs without a summary, in experiment order."""
    return [r["name"] for r in runs if r["name"] not in summaries]


def configuration_key(canary: Mapping[str, Any]) -> str:
    """The audit's name of a canary's configuration (:func:`fedpriv.memorization.audit.configuration_label`)."""
    return configuration_label(canary)


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
                "exposure_at_ceiling": exposure_ceiling({run: rs})["exposure_at_ceiling"],
            }
        planted = next(c for rs in by_run.values() for c in rs)
        rows.append({"configuration": configuration_key(planted), "pattern": pattern or None, "p_u": p_u, "p_e": p_e, "cells": cells})
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
    run's. A point the run's accountant refuses as too costly (PLD far from the run's own noise:
    :class:`~fedpriv.privacy.accounting.PLDTooCostly`) is NaN, listed in the panel's ``skipped``,
    and left out of the plot; it is never answered by another accountant. The run's own point is
    always computed. A ledger of more than one entry (a mechanism changed mid-run) is refused."""
    if len(events) != 1:
        raise FedprivError(f"epsilon curves need a ledger of one mechanism, got {len(events)} entries")
    ev = events[0]

    def eps(e: GaussianSteps) -> float:
        return epsilon_for(e, delta, accountant).epsilon  # type: ignore[arg-type]

    def point(e: GaussianSteps) -> float:
        try:
            return eps(e)
        except PLDTooCostly:
            return math.nan

    q = ev.sampling_probability
    epochs = ev.steps * q
    panels = []
    sigmas = _geometric(ev.noise_multiplier, 4.0, points)
    panels.append({"parameter": "noise_multiplier", "label": "noise multiplier σ (per draw)", "x": sigmas,
                   "epsilon": [point(replace(ev, noise_multiplier=s)) for s in sigmas], "own": ev.noise_multiplier, "log_x": True})
    steps = _integers(_geometric(ev.steps, 10.0, points), 1, 10**9, ev.steps)
    step_x = [float(s) for s in steps] if kind == "federated" else [s * q for s in steps]
    panels.append({"parameter": "rounds" if kind == "federated" else "epochs",
                   "label": "rounds" if kind == "federated" else "epochs (steps × B/N)", "x": step_x,
                   "epsilon": [point(ev.with_steps(s)) for s in steps], "own": float(ev.steps) if kind == "federated" else epochs, "log_x": True})
    if ev.sampling not in ("none", "cyclic", "cyclic-poisson"):  # (a correlated-noise run's groups follow its batch: no batch panel)
        batches = _integers(_geometric(ev.batch, 8.0, points), 1, ev.population, round(ev.batch))
        if float(ev.batch) not in batches:  # a fractional expected batch: keep the run's own exactly
            batches = sorted(set(batches) | {ev.batch})
        values = [point(replace(ev, batch=float(b), steps=ev.steps if b == ev.batch else max(1, round(epochs * ev.population / b)))) for b in batches]
        unit = "users per round" if kind == "federated" else "batch size (records)"
        panels.append({"parameter": "batch", "label": f"{unit}, {epochs:.3g} epochs held", "x": [float(b) for b in batches],
                       "epsilon": values, "own": float(ev.batch), "log_x": True})
    for p in panels:
        p["skipped"] = [x for x, e in zip(p["x"], p["epsilon"]) if math.isnan(e)]
    return {"epsilon": eps(ev), "delta": delta, "accountant": accountant, "event": ev, "panels": panels}


#: The vocabulary sentence a run with a public split carried in its guarantee before its vocabulary
#: record named the public users (the vocabulary was learned from the public split all along).
PRE_PUBLIC_VOCAB_NOTE = re.compile(r"the vocabulary of the \d+ most frequent training words is not private \(raw counts of the training users; vocab\.dp makes it a DP stage\)")
PUBLIC_VOCAB_NOTE = "the vocabulary is learned from the public split only (no private user's counts)"
#: The guarantee's data-facts clause (``training.coverage.DATA_FACTS_NOTE``, and its shorter form in runs stored before
#: 2026-11-29): the report's "What ε does not count" says it once for every private run, so rows stored before and after it read alike.
DATA_FACTS_CLAUSE = re.compile(r"; not covered either: .*?; release the model without them")


def has_public_split(run: Mapping[str, Any]) -> bool:
    """The run's config moves users to a public split (``data.public_fraction > 0``), from which
    its vocabulary is learned (``fedpriv.runner.prepare``)."""
    data = (run.get("config") or {}).get("data") or {}
    return float(data.get("public_fraction") or 0.0) > 0.0


def run_accountant(run: Mapping[str, Any]) -> str:
    """The accountant a run's config names ('rdp' unless its ``[privacy]`` (central) or
    ``[federated.dp]`` section says 'pld'): the one its summary's epsilon used."""
    cfg = run.get("config") or {}
    section = cfg.get("privacy") if run.get("kind") == "central" else (cfg.get("federated") or {}).get("dp")
    return str((section or {}).get("accountant") or "rdp")


# ---- formatting ------------------------------------------------------------------------------------
def _num(v: Any, fmt: str = ".3g") -> str:
    return "—" if v is None else format(v, fmt)


def _of(k: Any, n: Any) -> str:
    return "—" if k is None else f"{k}/{n}"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def epsilon_text(epsilon: float | None, delta: float | None, unit: str | None = None, low: float | None = None, relation: str | None = None) -> str:
    """'0.578 per user (δ = 0.0001)', or '∞' for a non-private run: an epsilon never appears
    without the unit it protects. ``low``: the smallest of a group's seeds when they differ
    ('6.78–8 per user (δ = 1e-05)'; ``epsilon`` is then the largest). ``relation``: the
    neighbouring relation, named when it is not add-or-remove-one ('8 per user, replace-one
    (δ = 1e-05)'), so that two relations never look like one promise."""
    if epsilon is None:
        return "∞"
    per = f" per {unit}" if unit else ""
    if relation and relation != RELATIONS[0]:
        per += f", {relation}"
    high = f"{round_up(epsilon):.3g}"
    spread = f"{low:.3g}–" if low is not None and low < epsilon and f"{low:.3g}" != high else ""
    return f"{spread}{high}{per} (δ = {delta:.3g})"


def round_up(value: float, digits: int = 3) -> float:
    """``value`` rounded up to ``digits`` significant figures: an upper bound printed short must
    not print less than it is (7.8944 -> 7.9, 7.999 -> 8)."""
    if value <= 0 or not math.isfinite(value):
        return value
    scale = 10.0 ** (math.floor(math.log10(value)) - digits + 1)
    return math.ceil(round(value / scale, 9)) * scale


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table's lines; ``|`` in cells escaped."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return lines + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]


def estimate_text(est: Estimate | None, fmt: str = ".3g", scale: float = 1.0, of: Any = None) -> str:
    """'7.9 [5.1–10.8]' (mean and 95% interval), '2.5/18 [1–4]' with ``of``; the mean alone when
    there is no interval; '—' for no data."""
    if est is None:
        return "—"
    m = format(est.mean * scale, fmt)
    head = f"{m}/{of}" if of is not None else m
    if est.low is None:
        return head
    return f"{head} [{format(est.low * scale, fmt)}–{format(est.high * scale, fmt)}]"


def rows_by_utility(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Rows grouped by their headline utility's label, in order of first appearance ('utility'
    for rows without one); never empty."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        out.setdefault(r.get("utility_label") or "utility", []).append(r)
    return out or {"utility": []}


def comparison_table_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The comparison table (one row per run group) as Markdown lines: the headline utility in %
    first among the utilities, then accuracy and perplexity; memorization with intervals."""
    label = next((r.get("utility_label") for r in rows if r.get("utility_label")), "utility")
    header = ["run", "seeds", "training", "algorithm", "data", "batch", "RS memorized", "BS memorized", "exposure mean (bits)", "exposure max (bits)",
              f"test {label} (%)", "test accuracy (%)", "test perplexity", "utility target", "privacy unit", "ε (δ)", "flags", "assumptions"]
    empirical = any(r.get("empirical_epsilon") is not None for r in rows)
    if empirical:  # the attack's lower bound beside the accountant's upper bound, same δ and unit
        header.insert(16, "empirical ε (95% lower bound; with seeds, the smallest)")
    body = []
    for r in rows:
        n = r.get("canaries")
        body.append([
            r["run"], r.get("seeds", 1), r["training"], r["algorithm"], r["data"], "—" if r["batch"] is None else f"{r['batch']:g} {r['batch_unit']}",
            estimate_text(r.get("rs_memorized"), ".3g", of=n), estimate_text(r.get("bs_memorized"), ".3g", of=n),
            estimate_text(r.get("exposure_mean"), ".3g") + ceiling_count_text(r), exposure_max_text(r),
            estimate_text(r.get("test_utility"), ".2f", 100.0), "—" if r.get("test_accuracy") is None else f"{100 * r['test_accuracy']:.2f}",
            _num(r.get("test_perplexity"), ".1f"), r.get("target") or "—", UNIT_TITLES.get(r.get("privacy_unit"), str(r.get("privacy_unit"))),
            epsilon_text(r.get("epsilon"), r.get("delta"), r.get("privacy_unit"), r.get("epsilon_min"), guarantee_kind(r)[2]), "; ".join(f for f in (r.get("flag"), _uncovered_flag(r)) if f),
            r.get("assumptions") or "",
        ])
        if empirical:
            e = r.get("empirical_epsilon")
            body[-1].insert(16, "—" if e is None else f"{e:.3g} per {r.get('empirical_unit')}")
    return markdown_table(header, body)


def ceiling_count_text(row: Mapping[str, Any]) -> str:
    """' (3/36 at ceiling)' after a mean that counts canaries at the ceiling of their estimate ('' when none)."""
    k = row.get("exposure_at_ceiling")
    return f" ({k}/{row.get('exposure_scored')} at ceiling)" if k else ""


def exposure_max_text(row: Mapping[str, Any]) -> str:
    """The exposure max cell: the largest exposure, or, when that is the ceiling log2 |R| of a
    sampled estimate (not a measurement), '36.9 at ceiling' with the largest skew-normal
    extrapolation beside it ('36.9 at ceiling, extrapolated 34.8'); the note under the table says more."""
    top = row.get("exposure_max_bits")
    if top is None or not row.get("exposure_max_at_ceiling"):
        return _num(top)
    x = row.get("exposure_max_extrapolated_bits")
    return f"{top:.3g} at ceiling" + (f", extrapolated {x:.3g}" if x is not None else "")


def ceiling_note_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The note under a comparison table on exposure estimates at their ceiling: per row with such
    canaries, how many, what the sample shows of them (a 95% lower bound) and their skew-normal
    extrapolations ([] when no row has one)."""
    hit = [r for r in rows if r.get("exposure_at_ceiling")]
    if not hit:
        return []
    lines = ["", "**Exposure at the ceiling.** A canary that scores below every one of its N sampled suffixes gets the interpolated rank 1, "
             "so its exposure estimate is log2 |R|, the most the estimate can give (with one sampled suffix at or below it, it gets about log2 N): a ceiling, "
             "not a measurement. The sample shows only that its exposure is at least the bound below (95% confidence); the skew-normal "
             "extrapolation (Carlini et al. 2019, section 4.3) estimates it. The means above count these canaries at log2 |R|, the most "
             "they can have. Cells marked 'at ceiling':", ""]
    for r in hit:
        cs = r.get("exposure_ceiling") or []
        ceilings = sorted({f"{c['ceiling_bits']:.3g}" for c in cs})
        bounds = [c["lower_bits"] for c in cs if c.get("lower_bits") is not None]
        samples = sorted({int(c["sampled"]) for c in cs if c.get("sampled")})
        by_run: dict[str, list[str]] = {}
        for c in cs:
            x = c.get("extrapolated_bits")
            by_run.setdefault(c["run"], []).append("none" if x is None else f"{x:.3g}")
        n = r["exposure_at_ceiling"]
        text = (f"- {r['run']}: {n} of {r.get('exposure_scored')} canaries at the ceiling log2 |R| = {' / '.join(ceilings)} bits"
                + (f"; each beat all {' / '.join(f'{k:,}' for k in samples)} sampled suffixes, so its exposure is at least {min(bounds):.3g} bits (95% confidence)" if bounds else "")
                + "; extrapolated (bits): " + "; ".join(f"{run} {', '.join(v)}" for run, v in by_run.items()) + ".")
        lines.append(text)
    return lines


def _uncovered_flag(row: Mapping[str, Any]) -> str:
    return f"not covered by ε: {row['not_covered']}" if row.get("not_covered") else ""


def contrast_table_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The contrasts (a − b, mean and 95% interval, paired by seed) as Markdown lines."""
    body = [[r["contrast"], f"{r['a']} − {r['b']}", r["quantity"] + (f" (at ceiling: {r['exposure_at_ceiling']})" if r.get("exposure_at_ceiling") else ""), estimate_text(Estimate(r["difference"], r["low"], r["high"], r["seeds"], 0), "+.3g"), r["seeds"],
             r.get("comparable", "yes")] for r in rows]
    return markdown_table(["contrast", "runs", "quantity", "difference [95% interval]", "seeds", "at matched utility"], body)


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


def introduction(name: str, settings: Mapping[str, Any], label: str = "utility") -> list[str]:
    """The heading and the paragraph on how to read the tables."""
    cand = settings.get("rs_candidates")
    prefix, width, top = settings.get("rs_prefix", 2), settings.get("beam_width", 5), settings.get("beam_top", 5)
    return [
        f"# Memorization and privacy report: experiment {name}",
        "",
        "Each row is one training run (with `seeds`, the runs of every seed together) over the same planted corpus (the same held-out users and the same canaries within a seed), "
        "laid out like Thakkar et al. (2021), Tables 1-2. "
        f"**RS memorized** k/n: of the n canaries, k have a lower log-perplexity after their {prefix}-word prefix than every one of "
        f"{f'{cand:,}' if cand is not None else 'the audit'} random suffixes (Random Sampling). "
        f"**BS memorized**: canaries whose suffix is among the top {top} beam-search (width {width}) continuations of their first word (Beam Search). "
        "**Exposure**, in bits, is log2 |R| − log2 rank of the canary among all possible suffixes R (Carlini et al. 2019; the rank is "
        "estimated from the sampled suffixes when R is large): a typical random suffix has about 1 bit, the maximum is log2 |R|. "
        "A canary that beats every sampled suffix gets that maximum from the estimate: a ceiling, not a measurement; a mean that counts such "
        "canaries says how many (\"3/36 at ceiling\"), a max at it says \"at ceiling\" with the skew-normal extrapolation, and a note "
        "under the table gives what the sample shows. "
        "Memorization and exposure are means over seeds and canaries with a 95% bootstrap interval [low–high] (seeds, then canaries "
        "within a seed, drawn with replacement); with one seed the interval covers the canaries only. **Exposure max** is the largest "
        "over every seed's canaries. "
        f"**Test {label}** is the headline utility, on the test users (never the validation users), mean over seeds with its interval "
        "(none with one seed); accuracy and perplexity follow. With two seeds a bootstrap over seeds can only draw the two seeds' "
        "values, so an interval over seeds (the utility's, and a contrast's utility difference) is their range, not a 95% interval: "
        "it excludes 0 only when both seeds differ in the same direction. "
        "**Utility target**: with a `[utility]` target, each run stops at its first validation evaluation at or past it and is audited there; "
        "a row that missed it (or whose model predicts one class, or only <oov>/<eos>) is flagged and is not comparable. "
        "**Data**: for central runs IID means records shuffled and non-IID users in random order with their records contiguous; "
        "for federated runs IID means records resharded over synthetic same-size users and non-IID the natural users. "
        "**Batch** is records (or users, for user-level DP-SGD) per step (central; the expected size under Poisson sampling) or users per round (federated). "
        "Rows are grouped by **privacy unit**: an example-level ε protects one example, a user-level ε one user's whole data, "
        "and the two are different promises; a run that starts from a pretrained encoder carries its chain's ε (vocabulary and "
        "pretraining composed, per example of its data), and when its own training is not private its unit says so (encoder only). **ε** is at the δ shown, what each run promises (with seeds, the range over them, the largest rounded up): a run that may stop at its utility target promises the ε of every step it could take, since when it stops depends on the data; the neighbouring relation (named in the cell when it is not add-or-remove-one), "
        "the sampling and the accountant are stated in the assumptions column. ∞ / not private: no noise was added.",
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
    contrasts: Sequence[Mapping[str, Any]] = (),
    started: Mapping[str, str] | None = None,
    uncounted: Sequence[str] = (),
) -> str:
    """The whole comparison.md: introduction, comparison table (one row per run group),
    contrasts, what no ε counts (``uncounted``), unfinished runs (with where they stopped, ``started``), the by-configuration table,
    notes, and the plots as image links."""
    started = started or {}
    by_label = rows_by_utility(rows)
    lines = introduction(name, settings or {}, next(iter(by_label)))
    if len(by_label) == 1:
        lines += comparison_table_lines(rows) + ceiling_note_lines(rows)
    else:  # one table per headline metric: a masked-token accuracy and an entity F1 never share a column
        lines += [f"The runs are scored by {len(by_label)} headline metrics, one table each; metrics of different tables are not comparable."]
        for label, group in by_label.items():
            lines += ["", f"### Runs scored by test {label}", ""]
            if "masked" in label:
                lines += ["Masked-token accuracy is over each run's own vocabulary and evaluation data: compare it only between runs "
                          "that share both (chains.md puts them in blocks).", ""]
            lines += comparison_table_lines(group) + ceiling_note_lines(group)
    if contrasts:
        lines += ["", "## Contrasts", "", "Differences a − b between run groups, paired by seed (and canary), with 95% bootstrap intervals; "
                  "an interval that contains 0 does not show a difference. A contrast with a flagged run on either side "
                  "(it missed the utility target, or did not learn) is not at matched utility: its memorization difference may only say "
                  "that one side trained less. Without a utility target the runs are not matched at all (\"" + NO_TARGET + "\"): compare "
                  "their utilities before their memorization. An exposure difference whose sides have canaries at the sampled ceiling "
                  "(\"at ceiling: k/n − j/m\") counts them at log2 |R|: it is as much a difference in how many canaries hit the ceiling "
                  "as in measured exposure.", ""]
        lines += contrast_table_lines(contrasts)
    lines += list(uncounted)  # what no ε counts (fedpriv.report.uncounted)
    if unfinished:
        lines += ["", "Not finished (no summary.json): " + ", ".join(f"{name} ({started[name]})" if name in started else name for name in unfinished) + "."]
    lines += ["", "## Memorized canaries by configuration", "",
              "Rows are canary configurations (p_u: probability a user shares the canary; p_e: probability each of a sharer's "
              "examples is replaced by it); cells are RS-memorized / BS-memorized of the canaries in that configuration (masked-LM canaries, which have no RS/BS test: mean and max exposure of the secret, in bits); "
              "with seeds, one column per run of each seed.", ""]
    lines += configuration_table_lines(config_rows, run_names) if config_rows else ["No audited run."]
    if notes:
        lines += ["", "## Notes", "", *(f"- {n}" for n in notes)]
    if plots:
        lines += ["", "## Plots", ""]
        for p in plots:
            title = PLOT_FILES.get(p) or (f"test utility against epsilon ({p.removeprefix('utility_vs_epsilon_').removesuffix('.png')})" if p.startswith("utility_vs_epsilon_") else p)
            lines += [f"![{title}]({p})", ""]
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
    """Per audited run: label, private flag, epsilon, and per-canary insertions, exposure (bits) and
    whether that exposure is the ceiling of a sampled estimate (``ceiling``)."""
    out = []
    for run in run_names:
        rows = [c for c in canaries.get(run, []) if c.get("exposure") is not None]
        if not rows:
            continue
        s = summaries[run]
        out.append({"run": run, "private": is_private(s), "epsilon": s.get("epsilon"),
                    "insertions": [int(c["insertions"]) for c in rows], "exposure": [float(c["exposure"]) for c in rows],
                    "ceiling": [at_ceiling(c["exposure"], c.get("candidate_space_log2"), c.get("exposure_method")) for c in rows]})
    return out


def utility_points(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """(run, its group, what its epsilon protects, its neighbouring relation and δ, epsilon or None,
    utility as a fraction, metric name) per run row: the headline utility (next-token accuracy
    without OOV and EOS, entity F1, masked-token accuracy). Epsilons of different (unit, relation,
    δ) are different promises: the plot draws each combination in its own panel."""
    label = next((r.get("utility_label") for r in rows if r.get("utility_label")), "utility")
    return [{"run": r["run"], "group": r.get("group") or r["run"], "unit": UNIT_TITLES.get(r["privacy_unit"], r["privacy_unit"]) if r.get("privacy_unit") else None,
             "relation": guarantee_kind(r)[2] if r.get("epsilon") is not None else None, "delta": r.get("delta") if r.get("epsilon") is not None else None,
             "epsilon": r["epsilon"], "accuracy": r["test_utility"], "metric": f"test {label}"} for r in rows if r.get("test_utility") is not None]


def empirical_points(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """(run, accountant epsilon or None, empirical lower bound, unit) per run with an empirical audit."""
    return [{"run": r["run"], "epsilon": r["epsilon"], "empirical": r["empirical_epsilon"], "unit": r.get("empirical_unit")}
            for r in rows if r.get("empirical_epsilon") is not None]


def along_series(run_names: Sequence[str], summaries: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per run audited along training: validation utility (fractions), exposure mean (bits) and
    RS-memorized counts at each audited step."""
    out = []
    for run in run_names:
        pts = [p for p in summaries[run].get("along", []) if p.get("validation_utility") is not None]
        if pts:
            out.append({"run": run, "utility": [p["validation_utility"] for p in pts], "exposure": [p.get("exposure_mean") for p in pts],
                        "rs_memorized": [p.get("rs_memorized") for p in pts], "label": summaries[run].get("utility_label") or "utility"})
    return out


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
        if s.get("promised_steps"):  # a stop on the data: the curves are those of the promise, every step it could take
            events = [events[0].with_steps(int(s["promised_steps"]))]
        c = epsilon_curves(events, float(s["delta"]), run_accountant(run), s.get("kind", run["kind"]))
        c["run"] = run["name"]
        for p in c["panels"]:
            if p["skipped"]:
                notes.append(f"{run['name']}: epsilon_vs_parameters.png leaves out {p['label']} = {', '.join(f'{x:.4g}' for x in p['skipped'])}, "
                             f"where the {c['accountant'].upper()} accountant would take minutes and gigabytes (not answered by another accountant).")
        if not math.isclose(c["epsilon"], float(s["epsilon"]), rel_tol=1e-6):
            notes.append(f"{run['name']}: the ledger gives epsilon {c['epsilon']:.6g}, the summary {s['epsilon']:.6g}.")
        out.append(c)
    return out


# ---- the report ------------------------------------------------------------------------------------------
def write_report(store: str | os.PathLike[str], force: bool = False) -> Path:
    """Write STORE/report/ (the files in the module docstring) and return that directory.
    FedprivError when STORE has no experiment.json, is not a fedpriv store, or is being written by
    another process; when STORE/report is a symbolic link, holds one, or holds files fedpriv's
    report did not write (unless ``force``): the report never writes outside its folder."""
    store = Path(store)
    contents = read_store(store)
    with hold(store, "store", create=False):
        return _write_report(store, contents, report_folder(store, force))


def report_folder(store: Path, force: bool = False) -> Path:
    """``STORE/report``, made or taken as the report's own folder (:func:`fedpriv.rundir.claim`):
    a symbolic link, or a folder holding one, is refused (a write would follow it out of the store)."""
    out = store / REPORT_DIR
    if out.is_symlink():
        raise FedprivError(f"{out}: is a symbolic link; the report is written only into a real folder inside the store (remove the link)")
    claim(out, "report", force)
    for p in out.iterdir():
        if p.is_symlink():
            raise FedprivError(f"{p}: a symbolic link in the report folder; the report never writes through one (remove it)")
    return out


def _write_report(store: Path, contents: "StoreContents", out: Path) -> Path:
    """:func:`write_report`'s body: build every table and plot from ``contents`` into ``out``."""
    names = [r["name"] for r in contents.runs if r["name"] in contents.summaries]
    run_rows = comparison_rows(contents.runs, contents.summaries, contents.canaries, contents.ledgers)
    rows = group_rows(run_rows, contents.canaries)
    config_rows = configuration_rows(names, contents.canaries)
    notes: list[str] = []
    contrasts = contrast_rows(contents.contrasts, run_rows, contents.canaries, notes)
    write_csv(out / "runs.csv", RUN_COLUMNS, run_rows)
    write_csv(out / "comparison.csv", COMPARISON_COLUMNS, group_csv_rows(rows))
    (out / "contrasts.csv").unlink(missing_ok=True)
    if contrasts:
        write_csv(out / "contrasts.csv", CONTRAST_COLUMNS, contrasts)
    write_csv(out / "memorized_by_configuration.csv", CONFIGURATION_COLUMNS, configuration_csv_rows(config_rows))

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
    for stale in out.glob("utility_vs_epsilon_*.png"):
        stale.unlink()
    by_metric = rows_by_utility(run_rows)
    for label, metric_rows in by_metric.items():  # one plot per headline metric
        points = utility_points(metric_rows)
        if points:
            png = "utility_vs_epsilon.png" if len(by_metric) == 1 else f"utility_vs_epsilon_{metric_rows[0].get('utility_metric') or 'utility'}.png"
            plots.plot_utility_vs_epsilon(points, out / png)
            drawn.append(png)
    empirical = empirical_points(run_rows)
    if empirical:
        plots.plot_empirical_vs_theoretical(empirical, out / "empirical_vs_theoretical.png")
        drawn.append("empirical_vs_theoretical.png")
        above = [p["run"] for p in empirical if p["epsilon"] is not None and p["empirical"] > p["epsilon"] * (1 + 1e-9)]
        # the audit's canaries are added or removed; an epsilon for replace-one (fixed-size sampling) or
        # zero-out (correlated noise) does not bound that relation, so exceeding it is a sign, not a proof
        bounds = {r: (contents.summaries.get(r, {}).get("empirical") or {}).get("accountant_bounds_audit", True) for r in above}
        proven = [r for r in above if bounds[r]]
        other = [r for r in above if not bounds[r]]
        if proven:
            notes.append(f"PRIVACY BUG: the empirical lower bound exceeds the accountant's epsilon for {', '.join(proven)}.")
        if other:
            notes.append(f"The empirical lower bound exceeds the accountant's epsilon for {', '.join(other)}, whose epsilon is for another "
                         "neighbouring relation than the audit's added-or-removed canaries: a strong sign of a privacy bug, not a proof.")
    along = along_series(names, contents.summaries)
    if along:
        plots.plot_memorization_vs_utility(along, out / "memorization_vs_utility.png")
        drawn.append("memorization_vs_utility.png")

    chains = chains_markdown(contents.summaries)
    (out / "chains.md").unlink(missing_ok=True)
    if chains:
        (out / "chains.md").write_text(chains, encoding="utf-8")
        notes.append("Runs start from earlier runs: chains.md has each pretrained encoder's stages, composed epsilon and fine-tuned F1.")

    notes += public_notes(contents.summaries)
    for name, why in contents.failed.items():
        notes.append(f"Run {name} failed and is not compared: {why}.")
    if write_measurements(store, out) is not None:
        notes.append("Local privacy measurements (plausible deniability N_w / S_w, token inversion accuracy per eta): [measurements.md](measurements.md).")
    md = comparison_markdown(contents.name, rows, config_rows, names, unfinished_runs(contents.runs, {**contents.summaries, **contents.failed}), notes, drawn, contents.audit_settings, contrasts, contents.started,
                             uncounted_lines(contents.summaries, contents.tunings, contents.uncounted_choices))
    (out / "comparison.md").write_text(md, encoding="utf-8")
    return out
