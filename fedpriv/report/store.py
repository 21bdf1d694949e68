"""``fedpriv run EXPERIMENT.toml``: train and audit every run of an experiment into a run store.

Store layout (default ``runs/NAME``)::

    experiment.json        the expanded grid: every run's name, kind and resolved config
    <run>/run-config.json  the run's resolved experiment config (what the Flower apps read too)
    <run>/config.json, metrics.jsonl, checkpoint*, params.msgpack, privacy ledger, canaries.json
    <run>/audit.json, audit.md
    <run>/summary.json     written last: the run is complete
    measure/<name>/        each [[measure]] of the experiment: measure.json, deniability.png
                           (:mod:`fedpriv.report.measure_runs`), computed once every run finished

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

from fedpriv.errors import FedprivError
from fedpriv.jsonio import write_json_atomic
from fedpriv.pipeline import Prepared, prepare
from fedpriv.report.grid import RunSpec, read_experiment, resolve_run_refs, run_refs

EXPERIMENT_FILE, RUN_CONFIG, SUMMARY_FILE = "experiment.json", "run-config.json", "summary.json"


def _data_key(spec: RunSpec) -> str:
    c = spec.config
    return json.dumps([c.name, c.seed, c.data.model_dump(), c.vocab.model_dump(), c.task.model_dump(), c.canaries.model_dump() if c.canaries else None,
                       c.privatize.model_dump() if c.privatize else None], sort_keys=True)


def run_summary(spec: RunSpec, run_dir: Path, seconds: float | None, starts_from: dict[str, str] | None = None) -> dict[str, Any]:
    """What the report needs about a finished run, read back from its files: the last evaluation,
    the last epsilon with its guarantee, the audit summary; for BERT runs the vocabulary's record
    (its source and DP guarantee, from ``tokenizer.json``) and the runs it starts from
    (``starts_from``: task option -> run name), which the chain report composes."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if r.get("split") == "train"]
    evals = [r for r in rows if r.get("split") not in (None, "train")]
    c = spec.config
    out: dict[str, Any] = {"name": spec.name, "kind": spec.kind, "users": c.data.users, "task": c.task.kind, "data_source": c.data.source}
    if c.data.eval_source:
        out["eval_source"] = c.data.eval_source
    if starts_from:
        out["starts_from"] = dict(starts_from)
    if (run_dir / "privatize.json").is_file():  # local privatization of the training text, with its guarantee
        out["privatize"] = json.loads((run_dir / "privatize.json").read_text())
    vocabulary, tokenizer = run_dir / "vocabulary.json", run_dir / "tokenizer.json"
    if vocabulary.is_file():  # the run learned its vocabulary: the full record (raw-data figures included)
        out["vocabulary"] = json.loads(vocabulary.read_text())
    elif tokenizer.is_file():  # inherited with the tokenizer: what a released tokenizer carries
        out["vocabulary"] = json.loads(tokenizer.read_text()).get("vocabulary")
    if spec.kind == "central":
        out.update(algorithm="DP-SGD" if c.privacy else "SGD", order=c.training.order, batch_size=c.training.batch_size, steps=train[-1]["step"] if train else 0)
        if c.privacy:
            out.update(noise_multiplier_config=c.privacy.noise_multiplier, clip_norm=c.privacy.clip_norm, sampling=c.privacy.sampling)
    else:
        f = c.federated
        label = {"fedavg": "FedAvg", "fedavg-clip": "FedAvg+Clip", "dp-fedavg": "DP-FedAvg"}[f.strategy]
        out.update(algorithm=label, clients_per_round=f.clients_per_round, rounds=train[-1]["round"] if train else 0, engine=f.engine)
        if f.clip_norm is not None:
            out["clip_norm"] = f.clip_norm
    if train and train[-1].get("epsilon") is not None:  # DP runs only; the ledger has the rest
        out.update({k: train[-1][k] for k in ("epsilon", "delta", "guarantee")})
    if train and train[-1].get("client_epsilon") is not None:  # client-side DP-SGD (record-level)
        out.update({k: train[-1][k] for k in ("client_epsilon", "client_delta", "client_guarantee")})
    if evals:
        last_eval = evals[-1]
        out["eval_split"] = last_eval["split"]
        out.update({f"eval_{k}": v for k, v in last_eval.items() if k not in ("split", "step", "round", "epoch")})
    audit_path = run_dir / "audit.json"
    if audit_path.is_file():
        out["audit"] = json.loads(audit_path.read_text())["summary"]
    if seconds is not None:
        out["seconds"] = seconds
    return out


def _train(spec: RunSpec, prepared: Prepared, run_dir: Path, stop_after: int | None, log: Callable[[str], None]) -> bool:
    """Train (or resume) one run; True when it finished (final parameters written).
    ``stop_after`` counts steps or rounds from where this call starts (the last checkpoint)."""
    if stop_after is not None and (run_dir / "checkpoint.json").is_file():
        stop_after += int(json.loads((run_dir / "checkpoint.json").read_text())["step"])
    if spec.kind == "central":
        from fedpriv.central.run import run_central

        run_central(prepared, run_dir, stop_after=stop_after, log=log)
    elif spec.config.federated.engine == "flower":
        from fedpriv.engines.flower_sim import run_flower_simulation

        run_flower_simulation(run_dir / RUN_CONFIG, run_dir, stop_after, log)
    else:
        from fedpriv.engines.vectorized import run_vectorized

        run_vectorized(prepared, run_dir, stop_after, log)
    return (run_dir / "params.msgpack").is_file()


def _normalized(raw: dict[str, Any]) -> dict[str, Any]:
    """A stored run config re-validated, so keys a newer schema adds with their defaults compare equal."""
    from fedpriv.config import validate_config

    try:
        return validate_config(raw).model_dump()
    except FedprivError:
        return raw


def check_store(store: Path, name: str, specs: list[RunSpec]) -> None:
    """Refuse a store that holds another experiment, or a run whose config changed."""
    path = store / EXPERIMENT_FILE
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
) -> tuple[Path, list[dict[str, Any]], bool]:
    """Train and audit every run, then compute the ``[[measure]]`` entries not yet in the store
    (see the module docstring). ``stop_after``: stop the first run that trains once it has done
    this many more steps or rounds, with a checkpoint (a kill).
    Returns (store, summaries of the finished runs, whether every run finished)."""
    from fedpriv.memorization.audit import audit_run
    from fedpriv.report.measure_runs import check_measures, run_measures

    say = log or (lambda _m: None)
    experiment = read_experiment(path, overrides)
    name, specs, measures = experiment.name, experiment.runs, experiment.measures
    store = Path(store) if store is not None else Path("runs") / name
    store.mkdir(parents=True, exist_ok=True)
    check_store(store, name, specs)
    check_measures(store, measures)
    record = {"name": name, "source": str(path), "overrides": overrides or {}, "runs": [{"name": s.name, "kind": s.kind, "config": s.raw} for s in specs]}
    if measures:
        record["measures"] = [m.model_dump() for m in measures]
    write_json_atomic(store / EXPERIMENT_FILE, record)
    prepared_by_key: dict[str, Prepared] = {}
    summaries: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    trained = 0
    for i, spec in enumerate(specs):
        run_dir = store / spec.name
        tag = f"[run {i + 1}/{len(specs)} {spec.name}]"

        def prefixed(m: str, tag: str = tag) -> None:
            say(f"{tag} {m}")

        if (run_dir / SUMMARY_FILE).is_file():
            summaries.append(json.loads((run_dir / SUMMARY_FILE).read_text()))
            say(f"{tag} complete, skipped")
            continue
        run_dir.mkdir(parents=True, exist_ok=True)
        refs = run_refs(spec.config)
        spec = resolve_run_refs(spec, store)  # "run:NAME" -> that run's directory (finished: it came earlier)
        write_json_atomic(run_dir / RUN_CONFIG, spec.raw)
        key = _data_key(spec)
        if key not in prepared_by_key:
            prepared_by_key[key] = prepare(spec.config, prefixed)
        prepared = dataclasses.replace(prepared_by_key[key], config=spec.config)
        t0 = time.perf_counter()
        if not (run_dir / "params.msgpack").is_file():
            done = _train(spec, prepared, run_dir, stop_after, prefixed)
            if not done:
                say(f"{tag} stopped with a checkpoint; run the same command again to resume")
                return store, summaries, False
        if spec.config.canaries is not None and prepared.task.name in ("nwp", "mlm"):
            audit_run(run_dir, log=prefixed, prepared=prepared)
        summary = run_summary(spec, run_dir, time.perf_counter() - t0, refs)
        write_json_atomic(run_dir / SUMMARY_FILE, summary)
        summaries.append(summary)
        trained += 1
        left = len(specs) - i - 1
        if left:
            per_run = (time.perf_counter() - t_all) / trained
            say(f"{tag} done; {left} run(s) left, about {per_run * left / 60:.1f} min at this pace")
    run_measures(store, measures, say)
    return store, summaries, True
