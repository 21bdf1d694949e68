"""``fedpriv run EXPERIMENT.toml``: train and audit every run of an experiment into a run store.

Store layout (default ``runs/NAME``)::

    experiment.json        the expanded grid: every run's name, kind and resolved config
    <run>/run-config.json  the run's resolved experiment config
    <run>/config.json, metrics.jsonl, checkpoint*, params.msgpack, privacy ledger, canaries.json
    <run>/audit.json, audit.md
    <run>/summary.json     written last: the run is complete
    measure/<name>/        each [[measure]] of the experiment: measure.json, deniability.png
                           (:mod:`fedpriv.runner.measure`), computed once every run finished

Runs go in file order. A run with ``summary.json`` is skipped; a run with final parameters but no
summary is audited; any other run trains, resuming from its last checkpoint (the trainers resume
exactly, so an interrupted store ends with the same numbers as an uninterrupted one). The data is
prepared once per distinct (data, vocab, task, canaries) setting and shared by the runs that use it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedpriv.config import validate_config
from fedpriv.errors import FedprivError
from fedpriv.jsonio import write_json_atomic
from fedpriv.rundir import EMPIRICAL, EXPERIMENT, RUN_CONFIG, TUNE_DIR, RunDir
from fedpriv.runner.audit import audit_run, auditable, empirical_audit
from fedpriv.runner.dispatch import train_run
from fedpriv.runner.grid import RunSpec, read_experiment, resolve_run_refs, run_refs, select_runs
from fedpriv.runner.measure import check_measures, run_measures
from fedpriv.runner.prepare import prepare
from fedpriv.runner.summary import run_summary
from fedpriv.runner.tune import tune_run, tuned_spec
from fedpriv.training.prepared import Prepared


def _data_key(spec: RunSpec) -> str:
    c = spec.config
    audit = c.audit
    empirical = [c.audit_canary_kind(), audit.empirical_canaries, audit.empirical_words] if audit.empirical else None
    return json.dumps([c.name, c.seed, c.data.model_dump(), c.vocab.model_dump(), c.task.model_dump(), c.canaries.model_dump() if c.canaries else None,
                       c.privatize.model_dump() if c.privatize else None, empirical], sort_keys=True)


def _train(spec: RunSpec, prepared: Prepared, run: RunDir, stop_after: int | None, log: Callable[[str], None]) -> bool:
    """Train (or resume) one run; True when it finished (final parameters written).
    ``stop_after`` counts steps or rounds from where this call starts (the last checkpoint)."""
    meta = run.checkpoint_meta()
    if stop_after is not None and meta is not None:
        stop_after += int(meta["step"])
    train_run(prepared, run.path, spec.kind, stop_after=stop_after, log=log)
    return run.has_params()


def _normalized(raw: dict[str, Any]) -> dict[str, Any]:
    """A stored run config re-validated, so keys a newer schema adds with their defaults compare equal."""
    try:
        return validate_config(raw).model_dump()
    except FedprivError:
        return raw


def check_store(store: Path, name: str, specs: list[RunSpec]) -> None:
    """Refuse a store that holds another experiment, or a run whose config changed."""
    path = store / EXPERIMENT
    if not path.is_file():
        return
    old = json.loads(path.read_text())
    if old.get("name") != name:
        raise FedprivError(f"{store} holds experiment {old.get('name')!r}, not {name!r}; use another --out")
    before = {r["name"]: _normalized(r["config"]) for r in old.get("runs", [])}
    for s in specs:
        if s.name in before and before[s.name] != s.raw and (store / s.name).exists():
            raise FedprivError(f"{store / s.name}: the run's config changed since it was started; delete that directory or use another --out")


def run_experiment(
    path: str | os.PathLike[str],
    store: str | os.PathLike[str] | None = None,
    overrides: dict[str, Any] | None = None,
    stop_after: int | None = None,
    log: Callable[[str], None] | None = None,
    only: list[str] | None = None,
) -> tuple[Path, list[dict[str, Any]], bool]:
    """Train and audit every run, then compute the ``[[measure]]`` entries not yet in the store
    (see the module docstring). ``stop_after``: stop the first run that trains once it has done
    this many more steps or rounds, with a checkpoint (a kill). ``only``: these runs (by name)
    and no other; a run they start from must be among them or finished already.
    Returns (store, summaries of the finished runs, whether every run finished)."""
    say = log or (lambda _m: None)
    experiment = read_experiment(path, overrides)
    name, specs, measures = experiment.name, experiment.runs, experiment.measures
    store = Path(store) if store is not None else Path("runs") / name
    chosen = select_runs(specs, only, lambda ref: RunDir(store / ref).has_summary())
    store.mkdir(parents=True, exist_ok=True)
    check_store(store, name, specs)
    check_measures(store, measures)
    record = {"name": name, "source": str(path), "overrides": overrides or {}, "runs": [s.record() for s in specs]}
    if measures:
        record["measures"] = [m.model_dump() for m in measures]
    if experiment.contrasts:
        record["contrasts"] = experiment.contrasts
    write_json_atomic(store / EXPERIMENT, record)
    specs = chosen
    prepared_by_key: dict[str, Prepared] = {}
    summaries: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    trained = 0
    for i, spec in enumerate(specs):
        run = RunDir(store / spec.name)
        tag = f"[run {i + 1}/{len(specs)} {spec.name}]"

        def prefixed(m: str, tag: str = tag) -> None:
            say(f"{tag} {m}")

        if run.has_summary():
            summaries.append(run.summary())
            say(f"{tag} complete, skipped")
            continue
        run.create()
        refs = run_refs(spec.config)
        spec = resolve_run_refs(spec, store)  # "run:NAME" -> that run's directory (finished: it came earlier)
        key = _data_key(spec)
        if key not in prepared_by_key:
            prepared_by_key[key] = prepare(spec.config, prefixed)
        tuned = None
        if spec.tune:  # learning rates chosen on the validation users; recorded in STORE/tune/
            tuned = tune_run(spec, dataclasses.replace(prepared_by_key[key], config=spec.config), store, prefixed)
            spec = tuned_spec(spec, tuned)
        run.write_json(RUN_CONFIG, spec.raw)
        prepared = dataclasses.replace(prepared_by_key[key], config=spec.config)
        t0 = time.perf_counter()
        if not run.has_params():
            done = _train(spec, prepared, run, stop_after, prefixed)
            if not done:
                say(f"{tag} stopped with a checkpoint; run the same command again to resume")
                return store, summaries, False
        if auditable(spec.config):
            audit_run(run.path, log=prefixed, prepared=prepared)
        if spec.config.audit.empirical and not run.has(EMPIRICAL):
            empirical_audit(run.path, log=prefixed, prepared=prepared)
        summary = run_summary(spec.name, spec.kind, spec.config, run.path, time.perf_counter() - t0, refs, group=spec.group)
        if tuned is not None:
            summary["tuned"] = {"winner": tuned["winner"], "metric": tuned["metric"], "record": f"{TUNE_DIR}/{tuned['group']}.json"}
        run.write_summary(summary)
        summaries.append(summary)
        trained += 1
        left = len(specs) - i - 1
        if left:
            per_run = (time.perf_counter() - t_all) / trained
            say(f"{tag} done; {left} run(s) left, about {per_run * left / 60:.1f} min at this pace")
    if only is not None and not all(RunDir(store / r["name"]).has_summary() for r in record["runs"]):
        if measures:
            say("the [[measure]] entries wait until every run of the experiment is finished")
        return store, summaries, True
    run_measures(store, measures, say)
    return store, summaries, True
