"""The one validation that ``fedpriv config check``, ``fedpriv train`` and ``fedpriv run`` share.

Three stages, each before any training step:

1. the config's keys (:func:`fedpriv.config.validate_config`: types, ranges, finite numbers,
   names, meaningless or impossible privacy), and the run's kind (:func:`fedpriv.config.check_kind`);
   before any data is read;
2. once the data is prepared, what depends on it (:func:`check_prepared`): cohorts within the
   training users, batches within the data they draw from, delta against 1/N of the privacy unit;
3. the trainer's own objects, built exactly as training builds them (:func:`build_trainer_parts`):
   the DP budget (a noise multiplier calibrated to a reachable target epsilon, an epsilon budget
   that allows a step, the accountant's bounds), the cohort sampler, the clipping mode.

Training runs stage 3 when its trainer starts; ``config check`` runs it without training. So
``config check`` accepts exactly what training accepts (``--static`` stops after stage 1).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedpriv.config import ExperimentConfig, check_kind, load_config, read_toml, validate_config
from fedpriv.errors import ConfigChanged, ConfigError, FedprivError, RunDirInUse, TrainingDiverged
from fedpriv.privacy.delta import large_delta_note, large_delta_problem
from fedpriv.runner.grid import RunSpec, candidates, with_values
from fedpriv.training.prepared import Prepared


def data_key(c: ExperimentConfig) -> str:
    """What decides a run's prepared data: runs with the same key share one preparation."""
    audit = c.audit
    empirical = [c.audit_canary_kind(), audit.empirical_canaries, audit.empirical_words] if audit.empirical else None
    return json.dumps([c.name, c.seed, c.data.model_dump(), c.vocab.model_dump(), c.task.model_dump(), c.canaries.model_dump() if c.canaries else None,
                       c.privatize.model_dump() if c.privatize else None, empirical], sort_keys=True)


def in_run(where: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, a FedprivError's message prefixed with ``where`` (the run it belongs to)."""
    try:
        return fn(*args)
    except (TrainingDiverged, ConfigChanged, RunDirInUse):
        raise
    except FedprivError as e:
        if where in str(e):
            raise
        raise FedprivError(f"{where}: {e}") from None


def check_prepared(prepared: Prepared, kind: str) -> list[str]:
    """Stage 2: refuse what the prepared data makes impossible (ConfigError naming the key), a
    delta of at least 1/N of the privacy unit included unless ``prepared.allow_large_delta``;
    return warnings (e.g. what such an allowed delta means)."""
    cfg = prepared.config
    prepared.target_metric()  # a [utility] metric the task cannot train to (loss, a typo) is refused here, not at the first evaluation
    records = len(prepared.train_arrays["mask"])
    counts = prepared.train.counts()
    users = len(counts)
    warnings: list[str] = []

    def delta_warning(key: str, delta: float, n: int, unit: str) -> None:
        problem = large_delta_problem(key, delta, n, unit)
        if problem and not prepared.allow_large_delta:
            raise ConfigError(problem)
        if problem:
            warnings.append(large_delta_note(key, delta, n, unit))

    if kind == "central":
        b, p = cfg.training.batch_size, cfg.privacy
        if p is not None and p.unit == "user":
            if b > users:
                raise ConfigError(f"training.batch_size = {b} exceeds the {users} training users (privacy.unit = 'user': a batch counts users); use at most {users}")
        elif b > records:
            raise ConfigError(f"training.batch_size = {b} exceeds the {records} training records; use at most {records}")
        if p is not None and p.private:
            delta_warning("privacy.delta", p.delta, *((users, "user") if p.unit == "user" else (records, "example")))
        return warnings
    f = cfg.federated
    assert f is not None  # check_kind refused it before
    if f.clients_per_round > users:
        raise ConfigError(f"federated.clients_per_round = {f.clients_per_round} exceeds the {users} training users; use at most {users}")
    biggest = int(max(counts))
    if f.local_batch_size > biggest:
        raise ConfigError(f"federated.local_batch_size = {f.local_batch_size} exceeds the {biggest} examples of the largest training user (a local batch holds one user's examples); use at most {biggest}")
    if f.dp is not None:
        delta_warning("federated.dp.delta", f.dp.delta, users, "user")
    if f.client_dp is not None:
        delta_warning("federated.client_dp.delta", f.client_dp.delta, records, "example")
    return warnings


def check_candidates(spec: RunSpec, prepared: Prepared) -> list[str]:
    """Every candidate's config (the run's, with the candidate's values) through the checks on the
    prepared data (a delta of 1/N or more, a batch above N, ...), before any trial trains: a bad
    last candidate is refused up front, not after the others trained. Returns their warnings."""
    warnings: list[str] = []
    for values in candidates(spec.tune or {}):
        cfg = validate_config(with_values(spec.raw, values), f"run {spec.name!r} tune candidate {values}")
        try:
            warnings += check_prepared(dataclasses.replace(prepared, config=cfg), spec.kind)
        except ConfigError as e:
            raise ConfigError(f"tune candidate {values}: {e}") from None
    return warnings


def build_trainer_parts(prepared: Prepared, kind: str, log: Callable[[str], None] | None = None) -> None:
    """Stage 3: build what the trainer builds before its first step (and discard it)."""
    if kind == "central":
        from fedpriv.central.train import central_stepper

        central_stepper(prepared, log)
    else:
        from fedpriv.engines.setup import FederatedSetup

        FederatedSetup(prepared, log)


@dataclass
class CheckedRun:
    """One run as ``config check`` saw it."""

    name: str
    kind: str
    config: ExperimentConfig
    warnings: list[str] = field(default_factory=list)
    skipped: str | None = None  # why the data stages did not run (e.g. it starts from an earlier run)
    record: dict[str, Any] = field(default_factory=dict)  # an experiment's run as experiment.json holds it


@dataclass
class CheckedFile:
    """A config (one run) or an experiment file (``[[runs]]``, ``[[measure]]``) as ``config check`` saw it."""

    name: str
    runs: list[CheckedRun]
    measures: list[Any]
    experiment: bool


def check_file(path: str | Path, static: bool = False, log: Callable[[str], None] | None = None, overrides: dict[str, Any] | None = None,
               allow_large_delta: bool = False) -> CheckedFile:
    """Every check training would make on the config or experiment file at ``path`` (with
    ``overrides``, ``--set``), without training. ``static``: the config's keys, the runs' kinds
    and plug-in tasks' imports only, no data read."""
    from fedpriv.runner.grid import read_experiment, run_refs, privatize_ref
    from fedpriv.runner.prepare import prepare
    from fedpriv.tasks.registry import check_task

    path = Path(path)
    experiment = path.suffix != ".json" and "runs" in read_toml(path)
    if experiment:
        exp = read_experiment(path, overrides)
        name, measures = exp.name, exp.measures
        runs = [CheckedRun(s.name, s.kind, s.config, record=s.record()) for s in exp.runs]
        tuned = {s.name: s for s in exp.runs if s.tune}
    else:
        cfg = load_config(path, overrides)
        name, measures, tuned = cfg.name, [], {}
        runs = [CheckedRun(cfg.name, "federated" if cfg.federated is not None else "central", cfg)]
    where = {r.name: f"{path}: run {r.name!r}" if experiment else str(path) for r in runs}
    for r in runs:
        check_kind(r.config, r.kind, where[r.name])
        in_run(where[r.name], check_task, r.config)
    checked = CheckedFile(name, runs, measures, experiment)
    if static:
        return checked
    prepared_by_key: dict[str, Prepared] = {}
    for r in runs:
        refs = list(run_refs(r.config).values()) + [x for x in [privatize_ref(r.config)] if x]
        if refs:
            r.skipped = f"starts from run {refs[0]!r}: its data is checked when that run has trained"
            continue
        key = data_key(r.config)
        if key not in prepared_by_key:
            prepared_by_key[key] = in_run(where[r.name], prepare, r.config, log)
        prepared = dataclasses.replace(prepared_by_key[key], config=r.config, allow_large_delta=allow_large_delta)
        r.warnings = in_run(where[r.name], check_prepared, prepared, r.kind)
        if r.name in tuned:  # every tune candidate, as `fedpriv run` checks them before the first trial
            r.warnings += [w for w in in_run(where[r.name], check_candidates, tuned[r.name], prepared) if w not in r.warnings]
        in_run(where[r.name], build_trainer_parts, prepared, r.kind, log)
    return checked
