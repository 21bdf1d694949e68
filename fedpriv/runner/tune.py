"""Choosing a run's learning rates (or any keys) on validation users, reproducibly.

A ``[[runs]]`` entry with ``tune = { "federated.server_learning_rate" = [0.003, 0.01, 0.03] }``
(several keys: their cross product) trains one short trial per candidate, for ``tune_fraction``
of the run's steps or rounds (default 1/4; no utility target, no audit), on the run's own
prepared data, and keeps the candidate with the best headline utility (next-token accuracy without
OOV and EOS, entity F1, masked-token accuracy) on the VALIDATION users at the end of its trial;
ties go to the first candidate in grid order. The run then trains with the winner.

Everything is recorded in the run store: the trials' run directories under
``STORE/tune/GROUP/<i>/`` and ``STORE/tune/GROUP.json`` (keys, every candidate with its
validation utility, the winner, the metric, the fraction), and the run's ``run-config.json``
holds the config it trained with. With ``seeds``, a group is tuned once, on its first seed's
data, and every seed trains with that winner. A finished trial is not trained again, so an
interrupted tuning resumes. A trial whose training diverges (non-finite loss or parameters) is
marked failed in its directory and loses (validation utility -inf). A tuning record read back is
checked: its winner must be a candidate of the run's own grid (a store is data, not instructions).
"""

from __future__ import annotations

import json
import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedpriv.config import VALIDATION, validate_config
from fedpriv.errors import ConfigError, DataFormatError, TrainingDiverged
from fedpriv.jsonio import read_json, write_json_atomic
from fedpriv.rundir import TUNE_DIR, TUNING_SHAPE, RunDir, expect_shape
from fedpriv.runner.checks import check_candidates
from fedpriv.runner.dispatch import train_run
from fedpriv.runner.grid import RunSpec, candidates, with_values
from fedpriv.training.prepared import Prepared


def trial_config(raw: dict[str, Any], values: dict[str, Any], fraction: float, kind: str) -> dict[str, Any]:
    """A candidate's trial: the run's config with the candidate's values, ``fraction`` of its
    steps (or epochs) or rounds, no utility target (a trial trains its whole short budget)."""
    out = with_values(raw, values)
    out["utility"] = None
    out["audit"] = {**out.get("audit", {}), "along": False}
    if kind == "central":
        t = out["training"]
        if t.get("steps") is not None:
            t["steps"] = max(1, math.ceil(t["steps"] * fraction))
        else:
            t["epochs"] = t["epochs"] * fraction
    else:
        out["federated"]["rounds"] = max(1, math.ceil(out["federated"]["rounds"] * fraction))
    return out


def tune_run(spec: RunSpec, prepared: Prepared, store: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """The tuning record of ``spec``'s group (trained now, or read back from the store)."""
    group = spec.group or spec.name
    path = store / TUNE_DIR / f"{group}.json"
    if path.is_file():
        return read_tuning(path, spec)
    check_candidates(spec, prepared)
    trials = []
    metric = None
    for i, values in enumerate(candidates(spec.tune or {})):
        cfg = validate_config(trial_config(spec.raw, values, spec.tune_fraction, spec.kind), f"run {spec.name!r} tune candidate {values}")
        run = RunDir(store / TUNE_DIR / group / str(i))
        if not run.has_params() and run.failure() is None:
            log(f"tuning {group}: candidate {i + 1} {values}")
            try:
                train_run(dataclasses.replace(prepared, config=cfg), run.path, spec.kind, log=log)
            except TrainingDiverged as e:
                log(f"tuning {group}: candidate {i + 1} {values} diverged ({e})")
        utility = float("-inf") if run.failure() is not None else final_validation_utility(run)
        metric = metric or (None if run.failure() is not None else utility_metric(run))
        log(f"tuning {group}: candidate {i + 1} {values}: validation utility {utility:.4g}")
        trials.append({"values": values, "validation_utility": utility, "run_dir": str(run.path.relative_to(store))})
    best = max(range(len(trials)), key=lambda i: (trials[i]["validation_utility"], -i))
    record = {"group": group, "keys": list(spec.tune or {}), "fraction": spec.tune_fraction, "split": VALIDATION, "metric": metric,
              "candidates": trials, "winner": trials[best]["values"]}
    write_json_atomic(path, record, indent=1)
    log(f"tuning {group}: winner {record['winner']} (validation {record['metric']} {trials[best]['validation_utility']:.4g})")
    return record


def reset_tuning(store: Path, group: str) -> None:
    """Forget ``group``'s tuning (``--restart`` of a changed run): its record and its trials' run files."""
    (store / TUNE_DIR / f"{group}.json").unlink(missing_ok=True)
    trials = store / TUNE_DIR / group
    if trials.is_dir():
        for d in trials.iterdir():
            if d.is_dir() and d.name.isdigit():
                RunDir(d).reset()


def read_tuning(path: Path, spec: RunSpec) -> dict[str, Any]:
    """A tuning record read back, checked for shape; its winner must be a candidate of ``spec``'s grid."""
    record = expect_shape(read_json(path, "tuning record"), path, "tuning record", TUNING_SHAPE)
    if record["winner"] not in candidates(spec.tune or {}):
        raise DataFormatError(path, None, f"the winner {json.dumps(record['winner'])[:80]} is not a candidate of run {spec.name!r}'s tune grid; delete the file (or pass --restart) to tune again")
    return record


def utility_metric(run: RunDir) -> str:
    """The headline utility metric the trial recorded (``config.json``'s ``utility``)."""
    return run.utility()[0]


def final_validation_utility(run: RunDir) -> float:
    """The headline utility of a finished trial on the validation users, at its end."""
    metric = utility_metric(run)
    rows = [r for r in run.metrics() if r.get("split") == VALIDATION]
    return float(rows[-1][metric]) if rows else float("-inf")


def tuned_spec(spec: RunSpec, record: dict[str, Any]) -> RunSpec:
    """``spec`` with the tuning winner's values (re-validated)."""
    raw = with_values(spec.raw, record["winner"])
    return dataclasses.replace(spec, config=validate_config(raw, f"run {spec.name!r} (tuned)"))
