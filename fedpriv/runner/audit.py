"""``fedpriv audit RUN_DIR``: the memorization tests on a trained run, written as ``audit.json``
and ``audit.md`` in the run directory.

The run's ``config.json`` names its experiment; the experiment is prepared again, which replants
exactly the same canaries (checked against the run's ``canaries.json``), and the final parameters
(``params.msgpack``, or the last checkpoint's of an unfinished run) are loaded. Then the tests of
:mod:`fedpriv.memorization` run:

* next-word prediction: per canary Random Sampling, Beam Search and exposure; extraction (greedy
  continuation) on duplicated, unique and validation prefixes;
* masked-LM: the secret sharer's exposure of each pattern canary's secret.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from fedpriv.errors import FedprivError
from fedpriv.memorization.audit import audit_nwp_canary, canary_columns, markdown, summarize
from fedpriv.memorization.canaries import Manifest, same_canaries
from fedpriv.memorization.extraction import extraction, extraction_sets
from fedpriv.memorization.lm import NWPStepper
from fedpriv.memorization.mlm_secret import mlm_secret_exposure
from fedpriv.rundir import AUDIT_JSON, AUDIT_MD, CANARIES, RunDir
from fedpriv.runner.prepare import prepare
from fedpriv.training.prepared import Prepared


def load_run(run_dir: str | os.PathLike[str], log: Callable[[str], None] | None = None, prepared: Prepared | None = None) -> tuple[Prepared, Any, str]:
    """Prepare the run's experiment again (or take ``prepared``, the same experiment already
    prepared) and load its parameters; check the canaries match."""
    run = RunDir(run_dir)
    cfg = run.experiment_config()
    if cfg.canaries is None:
        raise FedprivError(f"{run.path}: the experiment has no [canaries] section, so there is nothing to audit")
    if prepared is None:
        prepared = prepare(cfg, log)
    elif prepared.config != cfg:
        raise FedprivError(f"{run.path}: the prepared experiment is not the run's")
    if run.has(CANARIES) and not same_canaries(Manifest.load(run.path), prepared.canaries):
        raise FedprivError(f"{run.file(CANARIES)} differs from the canaries this fedpriv plants for the run's config")
    template = prepared.task.init_params(jax.random.key(0))
    params, source = run.load_params(template)
    return prepared, params, source


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
    if task.name == "nwp":  # (the audit's lengths were checked with the config: ExperimentConfig._audit)
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
            sets = extraction_sets(prepared.train, prepared.eval, manifest, a.extraction_prefix, a.extraction_suffix, a.extraction_examples, cfg.seed)
            report["extraction"] = extraction(stepper, sets, a.extraction_prefix, a.extraction_suffix)
    elif task.name == "mlm":
        by_id = {c.id: c for c in manifest.canaries}
        report["canaries"] = [{**canary_columns(by_id[row["id"]]), **row} for row in mlm_secret_exposure(task, params, manifest.canaries)]
    else:
        raise FedprivError(f"no memorization test for task {task.name!r} (audits cover nwp and mlm)")
    report["summary"] = summarize(report["canaries"], task.name)
    report["seconds"] = time.perf_counter() - t0
    RunDir(run_dir).write_json(AUDIT_JSON, report)
    (run_dir / AUDIT_MD).write_text(markdown(report))
    return report


