"""The memorization tests of one trained model, and their report (JSON rows and Markdown).

:mod:`fedpriv.runner.audit` loads a run and calls these (``fedpriv audit RUN_DIR``):

* next-word prediction: per canary Random Sampling (rank among ``audit.rs_candidates`` random
  suffixes, or the whole candidate space when it is that small), Beam Search, and exposure
  (exact or interpolated from the rank, and extrapolated from a skew-normal fit); extraction
  (greedy continuation) on duplicated, unique and validation prefixes;
* masked-LM: the secret sharer's exposure of each pattern canary's secret;
* any other task (plug-ins): Random Sampling scored by the task's own per-example loss, with
  exposure (:mod:`fedpriv.memorization.task_sampling`).

A configuration is labelled by its p_u as planted: when the scaling rule multiplied it (the log
says "p_u scaled x72.4"), the label shows the scaled value and the configured one
(:func:`configuration_label`).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from fedpriv.config import ExperimentConfig
from fedpriv.memorization.beam_search import beam_memorized
from fedpriv.memorization.canaries import Canary, Manifest
from fedpriv.memorization.exposure import at_ceiling, exposure_from_rank, extrapolated_exposure, interpolated_exposure
from fedpriv.memorization.random_sampling import draw_suffixes
from fedpriv.memorization.rs_audit import audit_random_sampling


# ---- the NWP tests --------------------------------------------------------------------------------
def candidate_space(pool_ids: np.ndarray, length: int) -> float:
    return float(len(pool_ids)) ** length


def enumerate_suffixes(pool_ids: np.ndarray, length: int, exclude: np.ndarray) -> np.ndarray:
    """Every suffix of ``length`` pool ids except ``exclude``, in lexicographic order."""
    rows = np.array(list(itertools.product(pool_ids, repeat=length)), np.int32).reshape(-1, length)
    return rows[~np.all(rows == exclude[None, :], axis=1)]


def rs_candidates(pool_ids: np.ndarray, ids: np.ndarray, manifest: Manifest, index: int, cfg: ExperimentConfig, candidates: int) -> tuple[np.ndarray, str, int]:
    """Canary ``index``'s Random Sampling candidates: (suffixes, "exact" or "sampled", size of the
    suffix space). Every other suffix when the space holds at most ``candidates`` more; else
    ``candidates`` drawn from the pool's weights (seeded by the experiment seed and the index)."""
    length = len(ids) - cfg.audit.rs_prefix
    space = candidate_space(pool_ids, length)
    exclude = ids[cfg.audit.rs_prefix :]
    if space - 1 <= candidates:
        return enumerate_suffixes(pool_ids, length, exclude), "exact", space
    return draw_suffixes(pool_ids, manifest.weights, length, candidates, exclude, cfg.seed, index), "sampled", space


def audit_nwp_canary(stepper: Any, manifest: Manifest, index: int, cfg: ExperimentConfig, candidates: int) -> dict[str, Any]:
    a = cfg.audit
    canary = manifest.canaries[index]
    ids = stepper.encode_words(canary.words)
    pool_ids = stepper.encode_words(manifest.pool)
    suffixes, method, space = rs_candidates(pool_ids, ids, manifest, index, cfg, candidates)
    rs, scores = audit_random_sampling(stepper, ids, a.rs_prefix, suffixes, a.rs_batch, cfg.seed)  # scores: the fit's rows
    if method == "exact":
        exposure = exposure_from_rank(rs.rank, rs.candidates + 1)
    else:
        exposure = interpolated_exposure(rs.at_or_below, rs.candidates, space)
    extrapolated = extrapolated_exposure(rs.canary_log_perplexity, scores, space, seed=cfg.seed) if rs.candidates >= 10 else None
    bs, found = beam_memorized(stepper, ids, a.beam_width, a.beam_top)
    return {
        **canary_columns(canary),
        "rs_memorized": rs.memorized,
        "rs_rank": rs.rank,
        "rs_candidates": rs.candidates,
        "canary_log_perplexity": rs.canary_log_perplexity,
        "bs_memorized": bs,
        "bs_best": " ".join(stepper.vocab.words[t - 1] for t in found[0][0]),
        "exposure": exposure,
        "exposure_method": method,
        "exposure_extrapolated": extrapolated,
        "candidate_space_log2": math.log2(space),
    }


def canary_columns(canary: Canary) -> dict[str, Any]:
    return {
        "id": canary.id,
        "canary": canary.text,
        "pattern": canary.pattern,
        "p_u": canary.user_probability,
        "p_e": canary.example_probability,
        "p_u_effective": canary.effective_user_probability,
        "sharers": len(canary.sharers),
        "insertions": canary.insertions,
    }


def configuration_label(row: Any) -> str:
    """A canary configuration's name, e.g. ``p_u=2e-05 p_e=0.01`` (the pattern first for masked-LM
    pattern canaries); when planting scaled p_u (``p_u_effective``), the scaled value with the
    configured one and the factor: ``p_u=0.00145 (2e-05 x72.4) p_e=0.01``."""
    pu, eff = row["p_u"], row.get("p_u_effective")
    if eff is None or f"{eff:.3g}" == f"{pu:.3g}":
        scaled = f"p_u={pu:.3g}"
    else:
        scaled = f"p_u={eff:.3g} ({pu:.3g} x{eff / pu:.3g})" if pu else f"p_u={eff:.3g} ({pu:.3g})"
    return (f"{row['pattern']} " if row.get("pattern") else "") + f"{scaled} p_e={row['p_e']:.3g}"


def summarize(rows: list[dict[str, Any]], task: str) -> dict[str, Any]:
    """Memorized out of total by test, overall and per configuration (and pattern)."""
    tests = [k for k in ("rs_memorized", "bs_memorized") if rows and k in rows[0]]

    def block(rs: list[dict]) -> dict[str, Any]:
        out: dict[str, Any] = {"canaries": len(rs), "inserted": sum(1 for r in rs if r["insertions"] > 0)}
        for k in tests:
            out[k] = sum(r[k] for r in rs)
        exps = [r["exposure"] for r in rs]
        out["exposure_mean"] = float(np.mean(exps)) if exps else None
        out["exposure_max"] = float(np.max(exps)) if exps else None
        out["exposure_at_ceiling"] = sum(map(_capped, rs))  # counted in the mean and max at log2 |R|, the most the estimate gives
        return out

    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(configuration_label(r), []).append(r)
    return {"total": block(rows), "by_configuration": {k: block(v) for k, v in groups.items()}}


def _capped(row: dict[str, Any]) -> bool:
    """Whether a canary's sampled exposure estimate is at its ceiling log2 |R| (:func:`~fedpriv.memorization.exposure.at_ceiling`)."""
    return at_ceiling(row.get("exposure"), row.get("candidate_space_log2"), row.get("exposure_method"))


def fmt_value(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return "" if v is None else str(v)


CANARY_COLUMNS = {
    "nwp": ["id", "p_u", "p_e", "sharers", "insertions", "rs_memorized", "rs_rank", "bs_memorized", "exposure", "exposure_extrapolated"],
    "mlm": ["id", "pattern", "p_u", "p_e", "sharers", "insertions", "rank", "exposure"],
    "task": ["id", "p_u", "p_e", "sharers", "insertions", "rs_memorized", "rs_rank", "canary_loss", "exposure", "exposure_extrapolated"],
}


def canary_table_columns(task: str) -> list[str]:
    """The per-canary columns of a task's audit (plug-ins: the loss-scored test's)."""
    return CANARY_COLUMNS.get(task, CANARY_COLUMNS["task"])


def _scored(report: dict[str, Any]) -> str:
    """What Random Sampling scored each canary against: the random suffixes asked for, or, where the
    candidate space is no larger, every other suffix of it (enumerated)."""
    rows = [r for r in report.get("canaries", []) if "rs_candidates" in r]
    if rows and all(r.get("exposure_method") == "exact" for r in rows):
        counts = sorted({int(r["rs_candidates"]) for r in rows})
        n = f"{counts[0]:,}" if len(counts) == 1 else f"{counts[0]:,} to {counts[-1]:,}"
        return f"every one of the {n} other suffixes of the candidate space, enumerated"
    return f"{report['settings']['rs_candidates']:,} random suffixes"


def markdown(report: dict[str, Any]) -> str:
    """The per-canary table and the summary, as Markdown."""
    task = report["task"]
    cols = canary_table_columns(task)
    s = report["summary"]["total"]
    lines = [f"# Memorization audit: {report['run_dir']}", "", f"Task {task}, {report['parameters']}."]
    if task == "nwp":
        lines.append(
            f"Random Sampling: {s['rs_memorized']} of {s['canaries']} canaries memorized "
            f"({_scored(report)}); Beam Search: {s['bs_memorized']} of {s['canaries']} "
            f"(width {report['settings']['beam_width']}, top {report['settings']['beam_top']})."
        )
    elif "rs_memorized" in s:
        lines.append(
            f"Random Sampling scored by the task's per-example loss: {s['rs_memorized']} of {s['canaries']} canaries memorized "
            f"({_scored(report)})."
        )
    lines += ["", "## Summary by configuration", ""]
    keys = [k for k in s if k not in ("exposure_max",)]
    lines.append("| configuration | " + " | ".join(keys) + " |")
    lines.append("|" + " --- |" * (len(keys) + 1))
    for name, b in [*report["summary"]["by_configuration"].items(), ("all", s)]:
        lines.append(f"| {name} | " + " | ".join(fmt_value(b[k]) for k in keys) + " |")
    lines += ["", "## Canaries", "", "| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for r in report["canaries"]:
        lines.append("| " + " | ".join(fmt_value(r.get(c)) + (" (ceiling)" if c == "exposure" and _capped(r) else "") for c in cols) + " |")
    ex = report.get("extraction")
    if ex:
        lines += ["", "## Extraction (greedy continuation)", "", "| prefixes | examples | exact match | token accuracy | median edit distance |", "| --- | --- | --- | --- | --- |"]
        for name, m in ex.items():
            lines.append(f"| {name} | {fmt_value(m['examples'])} | {fmt_value(m.get('exact_match'))} | {fmt_value(m.get('token_accuracy'))} | {fmt_value(m.get('median_edit_distance'))} |")
    lines += ["", "Exposure in bits: log2 |R| - log2 rank (Carlini et al. 2019); rank 1 = the canary is the most likely candidate."]
    if s.get("exposure_at_ceiling"):
        lines.append(f"{s['exposure_at_ceiling']} exposure(s) marked (ceiling) beat every sampled suffix: the estimate gives log2 |R|, its ceiling, "
                     "not a measurement; exposure_extrapolated (skew-normal) estimates them (docs/memorization.md).")
    lines.append("")
    return "\n".join(lines)
