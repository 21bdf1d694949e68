"""``fedpriv audit RUN_DIR``: the memorization tests on a trained run, as JSON and Markdown.

The run's ``config.json`` names its experiment; the experiment is prepared again, which replants
exactly the same canaries (checked against the run's ``canaries.json``), and the final parameters
(``params.msgpack``, or the last checkpoint's of an unfinished run) are loaded. Then:

* next-word prediction: per canary Random Sampling (rank among ``audit.rs_candidates`` random
  suffixes, or the whole candidate space when it is that small), Beam Search, and exposure
  (exact or interpolated from the rank, and extrapolated from a skew-normal fit); extraction
  (greedy continuation) on duplicated, unique and validation prefixes;
* masked-LM: the secret sharer's exposure of each pattern canary's secret.

Outputs ``audit.json`` and ``audit.md`` in the run directory.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import serialization

from fedpriv.config import ExperimentConfig, validate_config
from fedpriv.errors import FedprivError
from fedpriv.jsonio import write_json_atomic
from fedpriv.memorization.canaries import MANIFEST_FILE, Canary, Manifest, same_canaries
from fedpriv.pipeline import Prepared, prepare

AUDIT_JSON, AUDIT_MD = "audit.json", "audit.md"


# ---- loading a run --------------------------------------------------------------------------------
def run_config(run_dir: Path) -> ExperimentConfig:
    path = run_dir / "config.json"
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise FedprivError(f"{run_dir}: not a run directory (no config.json); train first with fedpriv train") from None
    except ValueError as e:
        raise FedprivError(f"{path}: unreadable ({e})") from None
    if "experiment" not in meta:
        raise FedprivError(f"{path}: no experiment config recorded; retrain with this version of fedpriv")
    return validate_config(meta["experiment"], str(path))


def load_params(run_dir: Path, template: Any) -> tuple[Any, str]:
    """The run's final parameters, else its last checkpoint's: (params, where from)."""
    final = run_dir / "params.msgpack"
    if final.is_file():
        return serialization.from_bytes(template, final.read_bytes()), "final parameters"
    meta_path = run_dir / "checkpoint.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        raw = serialization.msgpack_restore((run_dir / meta["state_file"]).read_bytes())
        return serialization.from_state_dict(template, raw["params"]), f"checkpoint at step {meta['step']} (the run is unfinished)"
    raise FedprivError(f"{run_dir}: no parameters (neither params.msgpack nor a checkpoint)")


def load_run(run_dir: str | os.PathLike[str], log: Callable[[str], None] | None = None, prepared: Prepared | None = None) -> tuple[Prepared, Any, str]:
    """Prepare the run's experiment again (or take ``prepared``, the same experiment already
    prepared) and load its parameters; check the canaries match."""
    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    if cfg.canaries is None:
        raise FedprivError(f"{run_dir}: the experiment has no [canaries] section, so there is nothing to audit")
    if prepared is None:
        prepared = prepare(cfg, log)
    elif prepared.config != cfg:
        raise FedprivError(f"{run_dir}: the prepared experiment is not the run's")
    if (run_dir / MANIFEST_FILE).is_file() and not same_canaries(Manifest.load(run_dir), prepared.canaries):
        raise FedprivError(f"{run_dir / MANIFEST_FILE} differs from the canaries this fedpriv plants for the run's config")
    template = prepared.task.init_params(jax.random.key(0))
    params, source = load_params(run_dir, template)
    return prepared, params, source


# ---- the NWP tests --------------------------------------------------------------------------------
def candidate_space(pool_ids: np.ndarray, length: int) -> float:
    return float(len(pool_ids)) ** length


def enumerate_suffixes(pool_ids: np.ndarray, length: int, exclude: np.ndarray) -> np.ndarray:
    """Every suffix of ``length`` pool ids except ``exclude``, in lexicographic order."""
    rows = np.array(list(itertools.product(pool_ids, repeat=length)), np.int32).reshape(-1, length)
    return rows[~np.all(rows == exclude[None, :], axis=1)]


def audit_nwp_canary(stepper: Any, manifest: Manifest, index: int, cfg: ExperimentConfig, candidates: int) -> dict[str, Any]:
    from fedpriv.memorization.beam_search import beam_memorized
    from fedpriv.memorization.exposure import exposure_from_rank, extrapolated_exposure, interpolated_exposure
    from fedpriv.memorization.random_sampling import draw_suffixes
    from fedpriv.memorization.rs_audit import audit_random_sampling

    a = cfg.audit
    canary = manifest.canaries[index]
    ids = stepper.encode_words(canary.words)
    pool_ids = stepper.encode_words(manifest.pool)
    length = len(ids) - a.rs_prefix
    space = candidate_space(pool_ids, length)
    exclude = ids[a.rs_prefix :]
    if space - 1 <= candidates:
        suffixes, method = enumerate_suffixes(pool_ids, length, exclude), "exact"
    else:
        suffixes, method = draw_suffixes(pool_ids, manifest.weights, length, candidates, exclude, cfg.seed, index), "sampled"
    rs, scores = audit_random_sampling(stepper, ids, a.rs_prefix, suffixes, a.rs_batch, cfg.seed)  # scores: the fit's rows
    if method == "exact":
        exposure = exposure_from_rank(rs.rank, rs.candidates + 1)
    else:
        exposure = interpolated_exposure(rs.lower, rs.candidates, space)
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


# ---- the audit ------------------------------------------------------------------------------------
def audit_run(
    run_dir: str | os.PathLike[str],
    candidates: int | None = None,
    log: Callable[[str], None] | None = None,
    prepared: Prepared | None = None,
) -> dict[str, Any]:
    """Run every applicable test on ``run_dir`` and write ``audit.json`` and ``audit.md`` there."""
    say = log or (lambda _m: None)
    run_dir = Path(run_dir)
    prepared, params, source = load_run(run_dir, log, prepared)
    cfg, task, manifest = prepared.config, prepared.task, prepared.canaries
    assert manifest is not None
    n_cand = candidates if candidates is not None else cfg.audit.rs_candidates
    say(f"auditing {run_dir} ({task.name}, {source}): {len(manifest.canaries)} canaries")
    report: dict[str, Any] = {"run_dir": str(run_dir), "task": task.name, "parameters": source, "settings": cfg.audit.model_dump()}
    report["settings"]["rs_candidates"] = n_cand
    t0 = time.perf_counter()
    if task.name == "nwp":
        from fedpriv.memorization.extraction import extraction, extraction_sets
        from fedpriv.memorization.lm import NWPStepper

        if not 1 <= cfg.audit.rs_prefix < cfg.canaries.words:
            raise FedprivError(f"audit.rs_prefix ({cfg.audit.rs_prefix}) must be between 1 and canaries.words - 1 ({cfg.canaries.words - 1})")
        stepper = NWPStepper(task, params)
        rows = []
        for i in range(len(manifest.canaries)):
            rows.append(audit_nwp_canary(stepper, manifest, i, cfg, n_cand))
            done = i + 1
            eta = (time.perf_counter() - t0) / done * (len(manifest.canaries) - done)
            r = rows[-1]
            say(f"canary {done}/{len(manifest.canaries)} {r['id']}: RS rank {r['rs_rank']:,}/{r['rs_candidates'] + 1:,}, BS {'yes' if r['bs_memorized'] else 'no'}, exposure {r['exposure']:.1f} bits; ~{eta:.0f} s left")
        report["canaries"] = rows
        a = cfg.audit
        if a.extraction_examples > 0:
            if a.extraction_prefix + a.extraction_suffix > task.seq_len:
                raise FedprivError(f"audit.extraction_prefix + extraction_suffix ({a.extraction_prefix + a.extraction_suffix}) exceeds vocab.seq_len ({task.seq_len})")
            sets = extraction_sets(prepared.train, prepared.eval, manifest, a.extraction_prefix, a.extraction_suffix, a.extraction_examples, cfg.seed)
            report["extraction"] = extraction(stepper, sets, a.extraction_prefix, a.extraction_suffix)
    elif task.name == "mlm":
        from fedpriv.memorization.mlm_secret import mlm_secret_exposure

        by_id = {c.id: c for c in manifest.canaries}
        report["canaries"] = [{**canary_columns(by_id[row["id"]]), **row} for row in mlm_secret_exposure(task, params, manifest.canaries)]
    else:
        raise FedprivError(f"no memorization test for task {task.name!r} (audits cover nwp and mlm)")
    report["summary"] = summarize(report["canaries"], task.name)
    report["seconds"] = time.perf_counter() - t0
    write_json_atomic(run_dir / AUDIT_JSON, report)
    (run_dir / AUDIT_MD).write_text(markdown(report))
    return report


def summarize(rows: list[dict[str, Any]], task: str) -> dict[str, Any]:
    """Memorized out of total by test, overall and per configuration (and pattern)."""

    def block(rs: list[dict]) -> dict[str, Any]:
        out: dict[str, Any] = {"canaries": len(rs), "inserted": sum(1 for r in rs if r["insertions"] > 0)}
        if task == "nwp":
            out["rs_memorized"] = sum(r["rs_memorized"] for r in rs)
            out["bs_memorized"] = sum(r["bs_memorized"] for r in rs)
        exps = [r["exposure"] for r in rs]
        out["exposure_mean"] = float(np.mean(exps)) if exps else None
        out["exposure_max"] = float(np.max(exps)) if exps else None
        return out

    groups: dict[str, list[dict]] = {}
    for r in rows:
        key = (f"{r['pattern']} " if r.get("pattern") else "") + f"p_u={r['p_u']:.3g} p_e={r['p_e']:.3g}"
        groups.setdefault(key, []).append(r)
    return {"total": block(rows), "by_configuration": {k: block(v) for k, v in groups.items()}}


def _fmt(v: Any) -> str:
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
}


def markdown(report: dict[str, Any]) -> str:
    """The per-canary table and the summary, as Markdown."""
    task = report["task"]
    cols = CANARY_COLUMNS[task]
    s = report["summary"]["total"]
    lines = [f"# Memorization audit: {report['run_dir']}", "", f"Task {task}, {report['parameters']}."]
    if task == "nwp":
        lines.append(
            f"Random Sampling: {s['rs_memorized']} of {s['canaries']} canaries memorized "
            f"({report['settings']['rs_candidates']:,} random suffixes); Beam Search: {s['bs_memorized']} of {s['canaries']} "
            f"(width {report['settings']['beam_width']}, top {report['settings']['beam_top']})."
        )
    lines += ["", "## Summary by configuration", ""]
    keys = [k for k in s if k not in ("exposure_max",)]
    lines.append("| configuration | " + " | ".join(keys) + " |")
    lines.append("|" + " --- |" * (len(keys) + 1))
    for name, b in [*report["summary"]["by_configuration"].items(), ("all", s)]:
        lines.append(f"| {name} | " + " | ".join(_fmt(b[k]) for k in keys) + " |")
    lines += ["", "## Canaries", "", "| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for r in report["canaries"]:
        lines.append("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
    ex = report.get("extraction")
    if ex:
        lines += ["", "## Extraction (greedy continuation)", "", "| prefixes | examples | exact match | token accuracy | median edit distance |", "| --- | --- | --- | --- | --- |"]
        for name, m in ex.items():
            lines.append(f"| {name} | {_fmt(m['examples'])} | {_fmt(m.get('exact_match'))} | {_fmt(m.get('token_accuracy'))} | {_fmt(m.get('median_edit_distance'))} |")
    lines += ["", "Exposure in bits: log2 |R| - log2 rank (Carlini et al. 2019); rank 1 = the canary is the most likely candidate.", ""]
    return "\n".join(lines)
