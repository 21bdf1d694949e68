"""Experiment definitions: one planted corpus, a grid of trainings over it.

An experiment file is an experiment config (``[data]``, ``[vocab]``, ``[task]``, ``[canaries]``,
``[audit]``, and defaults in ``[training]``, ``[privacy]``, ``[federated]``) plus ``[[runs]]``::

    [[runs]]
    name = "sgd-{order}"                  # {key} takes the grid value of that key's last part
    kind = "central"                      # or "federated"
    training = { batch_size = 32 }        # merged over the experiment's [training]
    grid = { "training.order" = ["iid", "noniid"] }   # the cross product of the listed values

    [[runs]]
    name = "fedavg-n{n}"
    kind = "federated"
    data = { options = { users = "clients:{n}" } }      # a grid VARIABLE: "{n}" is replaced in every
    federated = { clients_per_round = "{n}" }           # string of the run; a string that is exactly
    grid = { n = [2, 5, 10] }                           # "{n}" becomes the value itself (here an int)

    [[runs]]
    name = "dp-fedavg"
    kind = "federated"
    users = "natural"                     # or "iid": planted records resharded over same-size users
    federated = { strategy = "dp-fedavg", clip_norm = 0.5, target_epsilon = 10.0, delta = 1e-3 }

A grid key with a dot (or a run key such as ``users``) sets that key; a grid key without a dot
that is not a run key is a variable, substituted into the run's strings as above (one grid value
then sets several keys together).

A run can start from an earlier run of the same experiment: ``task.options.pretrained =
"run:NAME"`` (a BERT chain: pretrain, continue pretraining, fine-tune) names the run ``NAME``
of this experiment, which must come earlier in the file; the store resolves it to that run's
directory (:func:`resolve_run_refs`) and composes the privacy of the chain in its report.
``privatize.embeddings = "run:NAME"`` (local privatization with the embeddings of an earlier run)
is resolved the same way.

After the runs, ``[[measure]]`` entries (see :class:`fedpriv.config.MeasureConfig`) measure what
eta means on an embedding space: plausible deniability and token inversion (Qu et al. 2021, sec.
5.3-5.4), computed by ``fedpriv run`` once every run finished (:mod:`fedpriv.report.measure_runs`)::

    [[measure]]
    name = "nwp-words"
    embeddings = "run:nonprivate"         # a run of this file (any position), a run dir, or a GloVe .txt
    etas = [4, 8, 12, 20]

A run may also override ``data``, ``vocab``, ``task`` (e.g. one experiment over two NER
datasets) and ``canaries`` (a ``[canaries]`` table given in one run plants canaries in that run's
data only); runs that share those settings share the prepared data, planted canaries included.

Each run resolves to a full experiment config (validated like any other): a central run has no
``[federated]`` section, a federated run no ``[privacy]`` (DP-SGD) section, and a run's
``[privacy]`` exists only if the experiment or the run gives one. The experiment's ``name`` and
``seed`` are every run's, so every run holds out the same users and plants the same canaries.
"""

from __future__ import annotations

import copy
import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fedpriv.config import RUN_REF, DataConfig, ExperimentConfig, MeasureConfig, name_problem, read_toml, validate_config, validate_measure
from fedpriv.errors import ConfigError

MEASURE_KEY = "measure"
RUN_KEYS = {"name", "kind", "users", "data", "vocab", "task", "training", "privacy", "federated", "canaries", "privatize", "audit", "grid"}
SECTIONS = ("data", "vocab", "task", "training", "privacy", "federated", "canaries", "privatize", "audit")




def run_refs(config: ExperimentConfig) -> dict[str, str]:
    """``task.options`` keys whose value names another run of the experiment (``"run:NAME"``) -> NAME."""
    return {k: v[len(RUN_REF):] for k, v in config.task.options.items() if isinstance(v, str) and v.startswith(RUN_REF)}


def privatize_ref(config: ExperimentConfig) -> str | None:
    """NAME when ``privatize.embeddings = "run:NAME"`` (local privatization with another run's embeddings)."""
    p = config.privatize
    return p.embeddings[len(RUN_REF):] if p is not None and p.embeddings.startswith(RUN_REF) else None


def _all_refs(config: ExperimentConfig) -> dict[str, str]:
    """Every run reference of ``config``: dotted key -> run name."""
    refs = {f"task.options.{k}": v for k, v in run_refs(config).items()}
    emb = privatize_ref(config)
    if emb is not None:
        refs["privatize.embeddings"] = emb
    return refs


@dataclass(frozen=True)
class RunSpec:
    """One training of the grid, resolved."""

    name: str
    kind: str  # "central" | "federated"
    config: ExperimentConfig

    @property
    def raw(self) -> dict[str, Any]:
        return self.config.model_dump()


def _set_path(d: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for p in parts[:-1]:
        d = d.setdefault(p, {})
        if not isinstance(d, dict):
            raise ConfigError(f"grid key {dotted!r}: {p!r} is not a table")
    d[parts[-1]] = value


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _substitute(obj: Any, variables: dict[str, Any]) -> Any:
    """``obj`` with ``{var}`` replaced in every string; a string that is exactly ``{var}`` becomes the value."""
    if isinstance(obj, dict):
        return {k: _substitute(v, variables) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_substitute(v, variables) for v in obj]
    if isinstance(obj, str):
        for var, value in variables.items():
            token = "{" + var + "}"
            if obj == token:
                return copy.deepcopy(value)
            obj = obj.replace(token, str(value))
    return obj


def _expand_run(entry: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The grid's cross product of one ``[[runs]]`` entry, names filled in."""
    unknown = set(entry) - RUN_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r} (a run takes {', '.join(sorted(RUN_KEYS))})")
    grid = entry.get("grid", {})
    if not isinstance(grid, dict) or any(not isinstance(v, list) or not v for v in grid.values()):
        raise ConfigError(f"{where}: grid must map dotted keys to non-empty lists")
    base = {k: v for k, v in entry.items() if k != "grid"}
    out = []
    for values in itertools.product(*grid.values()) if grid else [()]:
        run = copy.deepcopy(base)
        fill: dict[str, Any] = {}
        variables: dict[str, Any] = {}
        for key, value in zip(grid, values):
            if "." in key or key in RUN_KEYS:
                _set_path(run, key, value)
            else:
                variables[key] = value
            fill[key.split(".")[-1]] = value
        name_template = run.pop("name", "")
        unused = [v for v in variables if "{" + v + "}" not in repr(run)]
        if unused:
            raise ConfigError(
                f"{where}: grid key {unused[0]!r} has no dot, so it is a variable, but no string of the run holds "
                f"'{{{unused[0]}}}' (to set a key, write its dotted path, e.g. 'training.{unused[0]}')"
            )
        run = _substitute(run, variables)
        run["name"] = name_template
        name = str(run.get("name", ""))
        try:
            filled = name.format(**fill) if "{" in name else (name + "".join(f"-{v}" for v in values))
            run["name"] = re.sub(r"[^A-Za-z0-9_.=+-]", "", filled) if values else filled  # e.g. "clients:5" -> "clients5"
        except (KeyError, IndexError) as e:
            raise ConfigError(f"{where}: name {name!r} refers to {e}, which is not a grid key") from None
        out.append(run)
    return out


def expand_experiment(raw: dict[str, Any], origin: str = "experiment") -> list[RunSpec]:
    """Every run of a parsed experiment file, validated (see the module docstring); its
    ``[[measure]]`` entries are validated too (:func:`expand_measures` returns them)."""
    specs = _expand_runs(raw, origin)
    expand_measures(raw, specs, origin)
    return specs


def _expand_runs(raw: dict[str, Any], origin: str) -> list[RunSpec]:
    entries = raw.get("runs")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{origin}: an experiment needs at least one [[runs]] entry")
    base = {k: v for k, v in raw.items() if k not in ("runs", MEASURE_KEY)}
    specs: list[RunSpec] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ConfigError(f"{origin}: runs[{i}] must be a table")
        for run in _expand_run(entry, f"{origin}: runs[{i}]"):
            name, kind = run.get("name"), run.get("kind")
            where = f"{origin}: run {name!r}"
            problem = name_problem(name)
            if problem:
                raise ConfigError(f"{origin}: runs[{i}]: {problem}")
            if kind not in ("central", "federated"):
                raise ConfigError(f"{where}: kind must be 'central' or 'federated', got {kind!r}")
            merged = copy.deepcopy(base)
            for section in SECTIONS:
                if section in run:
                    merged[section] = _merge(merged.get(section, {}), run[section])
            if "users" in run:
                merged.setdefault("data", {})["users"] = run["users"]
            if kind == "central":
                merged.pop("federated", None)
            else:
                merged.pop("privacy", None)
                if "federated" not in merged:
                    raise ConfigError(f"{where}: a federated run needs a [federated] section (in the experiment or the run)")
            specs.append(RunSpec(name, kind, validate_config(merged, where)))
    names = [s.name for s in specs]
    for i, s in enumerate(specs):
        for key, ref in _all_refs(s.config).items():
            if ref not in names[:i]:
                later = " (it comes later: move it up)" if ref in names else ""
                raise ConfigError(f"{origin}: run {s.name!r}: {key} = 'run:{ref}' names no earlier run{later}")
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ConfigError(f"{origin}: two runs are named {dup!r}")
    return specs


def measure_ref(m: MeasureConfig) -> str | None:
    """NAME when ``embeddings = "run:NAME"`` (the embedding space of a run of the experiment)."""
    return m.embeddings[len(RUN_REF):] if m.embeddings.startswith(RUN_REF) else None


def expand_measures(raw: dict[str, Any], specs: list[RunSpec], origin: str = "experiment") -> list[MeasureConfig]:
    """The ``[[measure]]`` entries of a parsed experiment file, validated and with their defaults
    resolved: ``seed`` (the experiment's), the inversion corpus (the experiment's ``[data]``
    source, format and options). ``embeddings = "run:NAME"`` must name a run of ``specs``."""
    entries = raw.get(MEASURE_KEY, [])
    if isinstance(entries, dict):
        raise ConfigError(f"{origin}: measure must be an array of tables: write [[measure]], not [measure]")
    if not isinstance(entries, list):
        raise ConfigError(f"{origin}: measure must be an array of tables ([[measure]] entries)")
    names = [s.name for s in specs]
    try:
        data = DataConfig.model_validate(raw.get("data") or {})
    except ValidationError:  # the runs' own validation names the problem; the measures need only a default
        data = DataConfig()
    seed = specs[0].config.seed if specs else 0
    out: list[MeasureConfig] = []
    for i, entry in enumerate(entries):
        label = entry.get("name") if isinstance(entry, dict) and isinstance(entry.get("name"), str) else None
        where = f"{origin}: [[measure]] {label!r}" if label else f"{origin}: measure[{i}]"
        m = validate_measure(entry, where)
        ref = measure_ref(m)
        if ref is not None and ref not in names:
            raise ConfigError(f"{where}: embeddings = 'run:{ref}' names no run of this experiment (runs: {', '.join(names)})")
        update: dict[str, Any] = {}
        if m.seed is None:
            update["seed"] = int(seed)
        if m.inversion_source is None:
            update.update(inversion_source=data.source, inversion_format=data.format, inversion_options=dict(data.options))
        out.append(m.model_copy(update=update))
    dup = next((m.name for m in out if [x.name for x in out].count(m.name) > 1), None)
    if dup is not None:
        raise ConfigError(f"{origin}: two [[measure]] entries are named {dup!r}")
    return out


@dataclass(frozen=True)
class Experiment:
    """A parsed experiment file: its name, runs and measurements."""

    name: str
    runs: list[RunSpec]
    measures: list[MeasureConfig]


def read_experiment(path: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> Experiment:
    """The experiment file at ``path``, runs and ``[[measure]]`` entries validated (see
    :func:`load_experiment` for ``overrides``)."""
    name, raw, origin = _read_raw(path, overrides)
    specs = _expand_runs(raw, origin)
    return Experiment(name, specs, expand_measures(raw, specs, origin))


def _read_raw(path: str | os.PathLike[str], overrides: dict[str, Any] | None) -> tuple[str, dict[str, Any], str]:
    path = Path(path)
    raw = read_toml(path)
    for key, value in (overrides or {}).items():
        _set_path(raw, key, value)
    if "name" not in raw:
        raise ConfigError(f"{path}: an experiment needs a name")
    return str(raw["name"]), raw, str(path)


def load_experiment(path: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> tuple[str, list[RunSpec]]:
    """(experiment name, runs) of an experiment TOML file; ``overrides`` (dotted key -> value, e.g.
    ``{"data.source": "Posts.xml"}``) are applied to the experiment before expansion. The file's
    ``[[measure]]`` entries are validated too; :func:`read_experiment` returns them."""
    e = read_experiment(path, overrides)
    return e.name, e.runs


def resolve_run_refs(spec: RunSpec, store: str | os.PathLike[str]) -> RunSpec:
    """``spec`` with every ``"run:NAME"`` (task options, ``privatize.embeddings``) replaced by the
    absolute path of that run in ``store``."""
    refs = _all_refs(spec.config)
    if not refs:
        return spec
    raw = spec.raw
    for key, ref in refs.items():
        _set_path(raw, key, str((Path(store) / ref).resolve()))
    return RunSpec(spec.name, spec.kind, validate_config(raw, f"run {spec.name!r}"))
