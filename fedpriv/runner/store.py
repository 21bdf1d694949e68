"""``fedpriv run EXPERIMENT.toml``: train and audit every run of an experiment into a run store.

Store layout (default ``runs/NAME``)::

    experiment.json        the expanded grid: every run's name, kind and resolved config
    <run>/run-config.json  the run's resolved experiment config
    <run>/config.json, metrics.jsonl, checkpoint*, params.msgpack, privacy ledger, canaries.json
    <run>/audit.json, audit.md
    <run>/empirical.json   the empirical privacy audit ([audit] empirical)
    <run>/summary.json     written last: the run is complete
    tune/GROUP.json, tune/GROUP/<i>/   a run's learning-rate trials (:mod:`fedpriv.runner.tune`)
    measure/<name>/        each [[measure]] of the experiment: measure.json, deniability.png
                           (:mod:`fedpriv.runner.measure`), computed once every run finished

Runs go in file order. A run with ``summary.json`` is skipped; a run with final parameters but no
summary is audited; any other run trains, resuming from its last checkpoint (the trainers resume
exactly, so an interrupted store ends with the same numbers as an uninterrupted one). The data is
prepared once per distinct (data, vocab, task, canaries) setting and shared by the runs that use it.

A run whose training diverges (non-finite loss or parameters) is marked failed (``failed.json``),
the other runs go on, and the report leaves it out; a later ``fedpriv run`` skips it. A store
refuses a run whose config changed since it started, naming the changed keys; ``restart``
(``fedpriv run --restart``) starts such runs, and failed ones, afresh.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedpriv.config import changed_keys, check_kind, normalized_config
from fedpriv.errors import ConfigChanged, ConfigError, FedprivError, RunDirInUse, TrainingDiverged
from fedpriv.jsonio import write_json_atomic
from fedpriv.rundir import CHECKPOINT, EMPIRICAL, EXPERIMENT, RUN_CONFIG, TUNE_DIR, RunDir, hold, read_store_record
from fedpriv.runner.audit import audit_run, auditable, empirical_audit
from fedpriv.runner.checks import data_key, in_run
from fedpriv.runner.dispatch import train_run
from fedpriv.runner.grid import RunSpec, read_experiment, resolve_run_refs, run_refs, select_runs
from fedpriv.runner.measure import check_measures, run_measures
from fedpriv.runner.prepare import prepare
from fedpriv.runner.summary import run_summary
from fedpriv.runner.tune import reset_tuning, tune_run, tuned_spec
from fedpriv.training.prepared import Prepared


def _train(spec: RunSpec, prepared: Prepared, run: RunDir, stop_after: int | None, log: Callable[[str], None]) -> bool:
    """Train (or resume) one run; True when it finished (final parameters written).
    ``stop_after`` counts steps or rounds from where this call starts (the last checkpoint)."""
    meta = run.checkpoint_meta()
    if stop_after is not None and meta is not None:
        stop_after += int(meta["step"])
    train_run(prepared, run.path, spec.kind, stop_after=stop_after, log=log)
    return run.has_params()


def check_store(store: Path, name: str, specs: list[RunSpec], restart: bool = False) -> list[str]:
    """Refuse a store that holds another experiment, or a run whose config changed (naming the
    changed keys); with ``restart``, return the names of the changed runs instead (to start afresh)."""
    path = store / EXPERIMENT
    if not path.is_file():
        return []
    old = read_store_record(store)
    if old["name"] != name:
        raise FedprivError(f"{store} holds experiment {old['name']!r}, not {name!r}; use another --out")
    before = {r["name"]: normalized_config(r["config"]) for r in old["runs"]}
    changed_runs = []
    for s in specs:
        if s.name not in before or not (store / s.name).exists():
            continue
        changed = changed_keys(before[s.name], normalized_config(s.raw))
        if changed and not restart:
            keys = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
            raise ConfigChanged(f"{store / s.name}: the run's config changed since it was started ({keys}); pass --restart to start it afresh, or use another --out")
        if changed:
            changed_runs.append(s.name)
    return changed_runs


def failures(store: str | os.PathLike[str], names: list[str]) -> dict[str, str]:
    """Run name -> why it failed, for the runs of ``names`` marked failed in ``store``."""
    out = {}
    for n in names:
        failed = RunDir(Path(store) / n).failure()
        if failed is not None:
            out[n] = failed["reason"]
    return out


def run_experiment(
    path: str | os.PathLike[str],
    store: str | os.PathLike[str] | None = None,
    overrides: dict[str, Any] | None = None,
    stop_after: int | None = None,
    log: Callable[[str], None] | None = None,
    restart: bool = False,
    only: list[str] | None = None,
    allow_large_delta: bool = False,
    secure_noise: bool = False,
    keep_going: bool = False,
) -> tuple[Path, list[dict[str, Any]], bool]:
    """Train and audit every run, then compute the ``[[measure]]`` entries not yet in the store
    (see the module docstring). ``stop_after``: stop the first run that trains once it has done
    this many more steps or rounds, with a checkpoint (a kill). ``restart``: start runs whose
    config changed, and failed runs, afresh. ``only``: these runs (by name) and no other; a run
    they start from must be among them or finished already. ``allow_large_delta``: a delta >= 1/N
    warns instead of refusing (:func:`fedpriv.runner.checks.check_prepared`). ``secure_noise``: every run that adds
    DP noise draws it from a secret (:func:`fedpriv.training.noise.with_secure_noise`).
    ``keep_going``: a run refused before it trains (its data too small for its batch or cohort, a
    run it starts from refused or failed, ...) is marked failed with the reason (``failed.json``:
    left out of the report, which names it) and the other runs go on; a run that had trained is
    left to resume, not marked (the grid then ends incomplete, as after a kill). An error in reading or preparing the data stops the grid even so
    (every run that reads that data would fail alike).
    Returns (store, summaries of the finished runs, whether every run finished or failed:
    :func:`failures` names the failed ones)."""
    say = log or (lambda _m: None)
    experiment = read_experiment(path, overrides)
    name, specs, measures = experiment.name, experiment.runs, experiment.measures
    if secure_noise:
        from dataclasses import replace

        from fedpriv.training.noise import adds_noise, with_secure_noise

        if not any(adds_noise(s.config) for s in specs):
            raise ConfigError(f"--secure-noise: no run of {path} adds DP noise ([privacy] or [federated.dp])")
        specs = [replace(s, config=with_secure_noise(s.config, f"--secure-noise, run {s.name!r}")) if adds_noise(s.config) else s for s in specs]
        experiment = replace(experiment, runs=specs)
    for spec in specs:
        check_kind(spec.config, spec.kind, f"{path}: run {spec.name!r}")
    store = Path(store) if store is not None else Path("runs") / name
    # (with keep_going, a run it starts from may also have failed: the run is then refused, saying why)
    settled = (lambda ref: RunDir(store / ref).has_summary() or RunDir(store / ref).failure() is not None) if keep_going else (lambda ref: RunDir(store / ref).has_summary())
    chosen = select_runs(specs, only, settled)
    with hold(store, "store"):  # one process per store; a folder that is not a store is refused
        return _run_store(path, store, experiment, chosen, stop_after, say, restart, only, log, overrides, allow_large_delta, keep_going)


#: :func:`_run_one`'s answer for a run stopped with a checkpoint (``--stop-after``).
STOPPED: dict[str, Any] = {}


def _run_one(spec: RunSpec, run: RunDir, store: Path, path: str | os.PathLike[str], prepared_by_key: dict[str, Prepared], stop_after: int | None,
             prefixed: Callable[[str], None], tag: str, say: Callable[[str], None], log: Callable[[str], None] | None,
             allow_large_delta: bool) -> dict[str, Any] | None:
    """Prepare (shared by runs with one data key), tune, train and audit one run: its summary; None
    when its training diverged (marked failed); :data:`STOPPED` when it stopped with a checkpoint."""
    run.create()
    refs = run_refs(spec.config)
    spec = resolve_run_refs(spec, store)  # "run:NAME" -> that run's directory (finished: it came earlier)
    key = data_key(spec.config)
    where = f"{path}: run {spec.name!r}"
    if key not in prepared_by_key:
        try:
            prepared_by_key[key] = dataclasses.replace(in_run(where, prepare, spec.config, prefixed), allow_large_delta=allow_large_delta)
        except FedprivError as e:
            e.shared = True  # type: ignore[attr-defined]  # the data itself: every run that reads it would fail alike
            raise
    tuned = None
    if spec.tune:  # learning rates chosen on the validation users; recorded in STORE/tune/
        tuned = in_run(where, tune_run, spec, dataclasses.replace(prepared_by_key[key], config=spec.config), store, prefixed)
        spec = tuned_spec(spec, tuned)
    run.write_json(RUN_CONFIG, spec.raw)
    prepared = dataclasses.replace(prepared_by_key[key], config=spec.config)
    t0 = time.perf_counter()
    if not run.has_params():
        try:
            done = in_run(where, _train, spec, prepared, run, stop_after, prefixed if log else None)
        except TrainingDiverged as e:
            say(f"{tag} failed: {e}")
            return None
        if not done:
            say(f"{tag} stopped with a checkpoint; run the same command again to resume")
            return STOPPED
    if auditable(spec.config):
        in_run(where, audit_run, run.path, None, prefixed, prepared)
    if spec.config.audit.empirical and spec.config.data.train_on != "public" and not run.has(EMPIRICAL):  # the public model holds no audit canaries
        in_run(where, empirical_audit, run.path, prefixed, prepared)
    summary = run_summary(spec.name, spec.kind, spec.config, run.path, time.perf_counter() - t0, refs, group=spec.group)
    if tuned is not None:
        summary["tuned"] = {"winner": tuned["winner"], "metric": tuned["metric"], "record": f"{TUNE_DIR}/{tuned['group']}.json"}
    return summary


def _run_store(path: str | os.PathLike[str], store: Path, experiment: Any, chosen: list[RunSpec], stop_after: int | None, say: Callable[[str], None], restart: bool,
               only: list[str] | None, log: Callable[[str], None] | None, overrides: dict[str, Any] | None,
               allow_large_delta: bool = False, keep_going: bool = False) -> tuple[Path, list[dict[str, Any]], bool]:
    """:func:`run_experiment`'s body, under the store's lock."""
    name, specs, measures = experiment.name, experiment.runs, experiment.measures
    fresh = check_store(store, name, specs, restart)
    left_out = [n for n in fresh if n not in {s.name for s in chosen}]
    if left_out:  # its record would be replaced while its files stay those of the old config
        raise ConfigChanged(f"{store / left_out[0]}: the run's config changed too; add it to --only (or leave --only out) to start it afresh")
    if restart:
        fresh += list(failures(store, [s.name for s in chosen]))
    check_measures(store, measures)
    by_name = {s.name: s for s in specs}
    for n in fresh:
        say(f"[{n}] starting afresh")
        RunDir(store / n).reset()
        if by_name[n].tune:  # its learning rates are chosen again, for the config it now has
            reset_tuning(store, by_name[n].group or n)
    record = {"name": name, "source": str(path), "overrides": overrides or {}, "runs": [s.record() for s in specs]}
    if measures:
        record["measures"] = [m.model_dump() for m in measures]
    if experiment.contrasts:
        record["contrasts"] = experiment.contrasts
    if experiment.uncounted_choices:
        record["uncounted_choices"] = experiment.uncounted_choices
    write_json_atomic(store / EXPERIMENT, record)
    specs = chosen
    prepared_by_key: dict[str, Prepared] = {}
    summaries: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    trained = 0
    left_to_resume = False  # a run stopped by an error after it trained (--keep-going): not complete
    for i, spec in enumerate(specs):
        run = RunDir(store / spec.name)
        tag = f"[run {i + 1}/{len(specs)} {spec.name}]"

        def prefixed(m: str, tag: str = tag) -> None:
            say(f"{tag} {m}")

        with hold(run.path, "run"):  # a `fedpriv train` or `fedpriv audit` of this run must wait
            if run.has_summary():
                summaries.append(run.summary())
                say(f"{tag} complete, skipped")
                continue
            failed = run.failure()
            if failed is not None:
                say(f"{tag} failed earlier, skipped ({failed['reason']}); pass --restart to train it afresh")
                continue
            try:
                summary = _run_one(spec, run, store, path, prepared_by_key, stop_after, prefixed, tag, say, log, allow_large_delta)
            except (TrainingDiverged, ConfigChanged, RunDirInUse):
                raise
            except FedprivError as e:
                if not keep_going or getattr(e, "shared", False):
                    raise
                if run.has_params() or run.has(CHECKPOINT):  # it trained: keep what it has for a resume, do not mark it
                    say(f"{tag} stopped by an error, left to resume ({e}); --keep-going: the other runs go on")
                    left_to_resume = True
                    continue
                run.write_failure(f"refused before training: {e}", 0, None)
                say(f"{tag} refused before training ({e}); --keep-going: the other runs go on")
                continue
            if summary is None:  # diverged: marked failed
                continue
            if summary is STOPPED:
                return store, summaries, False
            run.write_summary(summary)
            summaries.append(summary)
            trained += 1
            left = len(specs) - i - 1
            if left:
                per_run = (time.perf_counter() - t_all) / trained
                say(f"{tag} done; {left} run(s) left, about {per_run * left / 60:.1f} min at this pace")
    if left_to_resume:
        return store, summaries, False
    if only is not None and not all(RunDir(store / r["name"]).has_summary() for r in record["runs"]):
        if measures:
            say("the [[measure]] entries wait until every run of the experiment is finished")
        return store, summaries, True
    run_measures(store, measures, say)
    return store, summaries, True
