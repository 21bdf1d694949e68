"""``fedpriv audit RUN_DIR``: the memorization tests on a trained run, written as ``audit.json``
and ``audit.md`` in the run directory.

The run's ``config.json`` names its experiment; the experiment is prepared again, which replants
exactly the same canaries (checked against the run's ``canaries.json``), and the final parameters
(``params.msgpack``, or the last checkpoint's of an unfinished run) are loaded. Then the tests of
:mod:`fedpriv.memorization` run:

* next-word prediction: per canary Random Sampling, Beam Search and exposure; extraction (greedy
  continuation) on duplicated, unique and validation prefixes;
* masked-LM: the secret sharer's exposure of each pattern canary's secret;
* a plug-in task: Random Sampling scored by the task's per-example loss, with exposure
  (:mod:`fedpriv.memorization.task_sampling`).

Built-in NER tasks (ner, bert-ner) have no canary test.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import jax

from fedpriv.config import BUILTIN_TASKS, ExperimentConfig, apply_overrides, validate_config
from fedpriv.errors import ConfigError, FedprivError
from fedpriv.memorization.audit import audit_nwp_canary, canary_columns, markdown, summarize
from fedpriv.memorization.canaries import Manifest, same_canaries
from fedpriv.memorization.empirical import AuditCanaries, audit_relations, canary_scores, direction_scores, empirical_bounds
from fedpriv.memorization.extraction import extraction, extraction_sets
from fedpriv.memorization.lm import NWPStepper
from fedpriv.memorization.mlm_secret import mlm_secret_exposure
from fedpriv.memorization.task_sampling import LossScorer, audit_task_canary
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.rundir import AUDIT_JSON, AUDIT_MD, CANARIES, EMPIRICAL, EMPIRICAL_CANARIES, LEDGER, RunDir, along_audit
from fedpriv.runner.prepare import prepare
from fedpriv.training.loop import all_finite
from fedpriv.training.prepared import Prepared


def auditable(cfg: ExperimentConfig) -> bool:
    """Whether the run's task has a canary test (nwp, mlm and plug-in tasks) and it trained on the
    users that hold the canaries (a run on the public data, ``data.train_on = "public"``, has none)."""
    return cfg.canaries is not None and cfg.data.train_on != "public" and (cfg.task.kind in ("nwp", "mlm") or cfg.task.kind not in BUILTIN_TASKS)


def load_run(run_dir: str | os.PathLike[str], log: Callable[[str], None] | None = None, prepared: Prepared | None = None) -> tuple[Prepared, Any, str]:
    """Prepare the run's experiment again (or take ``prepared``, the same experiment already
    prepared) and load its parameters; check the canaries match."""
    run = RunDir(run_dir)
    cfg = run.experiment_config()
    if cfg.canaries is None:
        raise FedprivError(f"{run.path}: the experiment has no [canaries] section, so there is nothing to audit")
    verify_run(run, cfg)
    if prepared is None:
        prepared = prepare(cfg, log)
    elif prepared.config != cfg:
        raise FedprivError(f"{run.path}: the prepared experiment is not the run's")
    if run.has(CANARIES) and not same_canaries(Manifest.load(run.path), prepared.canaries):
        raise FedprivError(f"{run.file(CANARIES)} differs from the canaries this fedpriv plants for the run's config")
    template = prepared.task.init_params(jax.random.key(0))
    params, source = run.load_params(template)
    check_finite_params(run, params, source)
    return prepared, params, source


def check_writable(run: RunDir, names: list[str], command: str) -> None:
    """Refuse a run directory that ``command`` could not write its files ``names`` into, before
    any of its work: a probe file is created and removed there, and each existing target is
    opened for appending (nothing written), so the answer is the filesystem's, root's included."""
    probe = run.path / f".fedpriv-write-probe-{os.getpid()}"
    what = run.path
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
        for name in names:
            what = run.file(name)
            if what.exists():
                with open(what, "ab"):
                    pass
    except OSError as e:
        raise FedprivError(f"{what}: cannot write there ({e.strerror or e}); {command} writes {' and '.join(names)} into the run directory: make it writable first") from None
def private_run(cfg: ExperimentConfig) -> bool:
    """Whether the run records a privacy ledger (DP-SGD or DP-FedAvg with noise)."""
    return (cfg.privacy is not None and cfg.privacy.private) or (cfg.federated is not None and cfg.federated.dp is not None)


def verify_run(run: RunDir, cfg: ExperimentConfig) -> None:
    """Refuse a run whose checkpoint, state file, privacy ledger, parameters or vocabulary
    disagree with the digests recorded at training (:meth:`fedpriv.rundir.RunDir.verify`), or
    whose final parameters are not finite; before any data is prepared."""
    run.verify(private_run(cfg))
    if run.has_params():
        check_finite_params(run, run.read_params_tree(), "final parameters")


def check_finite_params(run: RunDir, params: Any, source: str) -> None:
    """Refuse parameters holding NaN or infinity (a diverged run): no audit number means anything for them."""
    if not bool(all_finite(params)):
        raise FedprivError(f"{run.path}: the {source} hold non-finite values (NaN or infinity): the run diverged, so there is nothing to audit; train it again with a lower learning rate (--restart)")


def audit_run(
    run_dir: str | os.PathLike[str],
    candidates: int | None = None,
    log: Callable[[str], None] | None = None,
    prepared: Prepared | None = None,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run every applicable test on ``run_dir`` and write ``audit.json`` and ``audit.md`` there.
    With ``audit.along``, the parameters saved at each evaluation along training are audited too
    (Random Sampling, Beam Search and exposure; no extraction), into ``audit-<step>.json``.
    ``overrides``: ``audit.*`` keys set over the run's config (``fedpriv audit --set``)."""
    say = log or (lambda _m: None)
    run = RunDir(run_dir)
    other = [k for k in overrides or {} if not k.startswith("audit.")]
    if other:
        raise ConfigError(f"--set {other[0]}: fedpriv audit takes audit.* keys only (the data, task and canaries are those the run was trained with)")
    run.experiment_config()  # a run directory, else one line saying so
    check_writable(run, [AUDIT_JSON, AUDIT_MD], "fedpriv audit")
    settings = None
    if overrides:  # checked before the data is prepared
        settings = validate_config(apply_overrides(run.experiment_config().model_dump(), overrides), f"{run.path} with --set").audit
    prepared, params, source = load_run(run.path, log, prepared)
    cfg = prepared.config if settings is None else prepared.config.model_copy(update={"audit": settings})
    n_cand = candidates if candidates is not None else cfg.audit.rs_candidates
    report = audit_model(prepared, cfg, params, source, str(run.path), n_cand, say)
    run.write_json(AUDIT_JSON, report)
    run.file(AUDIT_MD).write_text(markdown(report))
    if cfg.audit.along:
        template = prepared.task.init_params(jax.random.key(0))
        for step in run.snapshot_steps():
            name = along_audit(step)
            if run.has(name):
                continue
            say(f"auditing the parameters of step {step} (audit.along)")
            along = audit_model(prepared, cfg, run.load_snapshot(step, template), f"parameters at step {step}", str(run.path), n_cand, say, with_extraction=False)
            run.write_json(name, {**along, "step": step})
    return report


def audit_model(
    prepared: Prepared, cfg: ExperimentConfig, params: Any, source: str, where: str, candidates: int, say: Callable[[str], None], with_extraction: bool = True
) -> dict[str, Any]:
    """The audit report of ``params`` (a model of ``prepared``'s task) under ``cfg``'s audit
    settings: per-canary rows and their summary; for next-word prediction also extraction
    (unless ``with_extraction`` is False)."""
    task, manifest = prepared.task, prepared.canaries
    assert manifest is not None
    say(f"auditing {where} ({task.name}, {source}): {len(manifest.canaries)} canaries")
    report: dict[str, Any] = {"run_dir": where, "task": task.name, "parameters": source, "settings": cfg.audit.model_dump()}
    report["settings"]["rs_candidates"] = candidates
    t0 = time.perf_counter()
    if task.name == "nwp":  # (the audit's lengths were checked with the config: ExperimentConfig._audit)
        stepper = NWPStepper(task, params)
        rows = []
        for i in range(len(manifest.canaries)):
            rows.append(audit_nwp_canary(stepper, manifest, i, cfg, candidates))
            done = i + 1
            eta = (time.perf_counter() - t0) / done * (len(manifest.canaries) - done)
            r = rows[-1]
            say(f"canary {done}/{len(manifest.canaries)} {r['id']}: RS rank {r['rs_rank']:,}/{r['rs_candidates'] + 1:,}, BS {'yes' if r['bs_memorized'] else 'no'}, exposure {r['exposure']:.1f} bits; ~{eta:.0f} s left")
        report["canaries"] = rows
        a = cfg.audit
        if with_extraction and a.extraction_examples > 0:
            sets = extraction_sets(prepared.train, prepared.eval, manifest, a.extraction_prefix, a.extraction_suffix, a.extraction_examples, cfg.seed)
            report["extraction"] = extraction(stepper, sets, a.extraction_prefix, a.extraction_suffix)
    elif task.name == "mlm":
        by_id = {c.id: c for c in manifest.canaries}
        report["canaries"] = [{**canary_columns(by_id[row["id"]]), **row} for row in mlm_secret_exposure(task, params, manifest.canaries)]
    elif cfg.task.kind not in BUILTIN_TASKS:
        if not 1 <= cfg.audit.rs_prefix < cfg.canaries.words:
            raise FedprivError(f"audit.rs_prefix ({cfg.audit.rs_prefix}) must be between 1 and canaries.words - 1 ({cfg.canaries.words - 1})")
        scorer = LossScorer(task, params, prepared.train.kind, cfg.audit.rs_batch)
        rows = []
        for i in range(len(manifest.canaries)):
            r = audit_task_canary(scorer, manifest, i, cfg, candidates)
            rows.append(r)
            say(f"canary {i + 1}/{len(manifest.canaries)} {r['id']}: rank {r['rs_rank']:,}/{r['rs_candidates'] + 1:,} by the task's loss, exposure {r['exposure']:.1f} bits")
        report["canaries"] = rows
    else:
        raise FedprivError(f"no memorization test for task {task.name!r} (audits cover nwp, mlm and plug-in tasks)")
    report["summary"] = summarize(report["canaries"], task.name)
    report["seconds"] = time.perf_counter() - t0
    return report


#: delta of a non-private run's empirical bound (it has no delta of its own)
NON_PRIVATE_DELTA = 1e-5


def run_delta(cfg: ExperimentConfig) -> float | None:
    """The delta of the run's DP guarantee (DP-SGD's, or DP-FedAvg's user-level one), or None."""
    if cfg.privacy is not None:
        return cfg.privacy.delta
    if cfg.federated is not None and cfg.federated.dp is not None:
        return cfg.federated.dp.delta
    return None


def run_accountant(cfg: ExperimentConfig) -> str:
    """The accountant of the run's DP guarantee ("rdp" or "pld"): the one its summary's epsilon used."""
    if cfg.privacy is not None:
        return cfg.privacy.accountant
    if cfg.federated is not None and cfg.federated.dp is not None:
        return cfg.federated.dp.accountant
    return "rdp"


def run_sampling(cfg: ExperimentConfig) -> str | None:
    """The sampling of the run's DP mechanism (DP-SGD's, or DP-FedAvg's cohorts; "cyclic" or
    "cyclic-poisson" for correlated noise, as the config enforces), or None."""
    if cfg.privacy is not None:
        return cfg.privacy.sampling
    if cfg.federated is not None and cfg.federated.dp is not None:
        return cfg.federated.sampling
    return None


def empirical_audit(run_dir: str | os.PathLike[str], log: Callable[[str], None] | None = None, prepared: Prepared | None = None) -> dict[str, Any]:
    """The empirical privacy of a run trained with ``[audit] empirical``: its audit canaries
    scored under the final parameters, the one-run lower bounds on epsilon at the run's delta (of
    the canaries' unit) beside the accountant's epsilon at that delta; written to
    ``empirical.json`` (:mod:`fedpriv.memorization.empirical`)."""
    say = log or (lambda _m: None)
    run = RunDir(run_dir)
    cfg = run.experiment_config()
    if not cfg.audit.empirical:
        raise FedprivError(f"{run.path}: trained without audit canaries; set [audit] empirical = true and train again")
    check_writable(run, [EMPIRICAL], "fedpriv audit --empirical")
    verify_run(run, cfg)
    canaries = AuditCanaries.load(run.path)
    if prepared is None:
        prepared = prepare(cfg, log)
    elif prepared.config != cfg:
        raise FedprivError(f"{run.path}: the prepared experiment is not the run's")
    if prepared.audit_canaries is None or prepared.audit_canaries.to_json() != canaries.to_json():
        raise FedprivError(f"{run.file(EMPIRICAL_CANARIES)} differs from the audit canaries this fedpriv plants for the run's config")
    task = prepared.task
    t0 = time.perf_counter()
    params, source = run.load_params(task.init_params(jax.random.key(0)))
    check_finite_params(run, params, source)
    say(f"empirical audit of {run.path} ({source}): {canaries.count} {canaries.kind} canaries, {int(canaries.included.sum())} members")
    if canaries.kind == "client":
        scores = direction_scores(canaries.seed, canaries.count, prepared.initial_params(cfg.seed), params)
        score = "cosine of the final model delta with the canary client's direction"
    else:
        scores = canary_scores(task, params, canaries)
        score = "minus the canary's loss (log-perplexity per token) under the final parameters"
    delta = run_delta(cfg)
    bounds = empirical_bounds(scores, canaries.included, delta if delta is not None else NON_PRIVATE_DELTA)
    accountant = None
    if delta is not None and run.has(LEDGER):
        accountant = PrivacyLedger.load(run.file(LEDGER)).epsilon(delta, run_accountant(cfg)).epsilon
    unit = "example" if canaries.kind == "example" else "user"
    relations = audit_relations(unit, run_sampling(cfg))
    report = {"kind": canaries.kind, "unit": unit, "canaries": canaries.count, "score": score, "parameters": source, **bounds, **relations,
              "accountant_epsilon": accountant, "seconds": time.perf_counter() - t0,
              "member_score_mean": float(scores[canaries.included].mean()), "non_member_score_mean": float(scores[~canaries.included].mean())}
    run.write_json(EMPIRICAL, report, indent=1)
    say(f"empirical epsilon >= {bounds['epsilon_lower_bound']:.3g} ({int(100 * bounds['confidence'])}% confidence, delta {bounds['delta']:g}, per {unit})"
        + (f"; the accountant's epsilon of the steps taken {accountant:.3g}" if accountant is not None else "; not private")
        + (f" ({relations['relation_note']})" if accountant is not None and not relations["accountant_bounds_audit"] else ""))
    return report
