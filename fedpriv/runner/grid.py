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
``privatize.embeddings = "run:NAME"`` (local privatization with the embeddings of an earlier run),
``init.from = "run:NAME"`` (a warm start from an earlier run's final parameters) and
``utility.above = "run:NAME"`` (a target set above an earlier run's final validation utility) are
resolved the same way.

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

**Seeds.** ``seeds = [0, 1, 2]`` (instead of ``seed``) repeats every run once per seed, named
``NAME-s<seed>`` (its *group* is ``NAME``): the replicate of seed s trains with ``seed = s`` and
draws its canaries with ``canaries.seed = s`` unless the file fixes ``canaries.seed``; both seeds
are recorded in the run's summary. The runs of one seed share one planted corpus, as above; a
``"run:NAME"`` reference names the run of the same seed. The report gives means and intervals
over the seeds and canaries of each group.
"""

from __future__ import annotations

import copy
import itertools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fedpriv.config import RUN_REF, DataConfig, ExperimentConfig, MeasureConfig, apply_overrides, name_problem, read_toml, set_key, validate_config, validate_measure
from fedpriv.errors import ConfigError

MEASURE_KEY = "measure"
SEEDS_KEY = "seeds"
#: Top-level keys of an experiment file that are not part of a run's config.
UNCOUNTED_KEY = "uncounted_choices"
EXPERIMENT_KEYS = ("runs", MEASURE_KEY, SEEDS_KEY, "contrasts", UNCOUNTED_KEY)
RUN_KEYS = {"name", "kind", "users", "data", "vocab", "task", "training", "privacy", "federated", "canaries", "privatize", "audit", "init", "grid", "tune", "tune_fraction"}
#: The share of a run's steps (or rounds) each learning-rate trial trains for, by default.
TUNE_FRACTION = 0.25
#: What a tune grid may vary: training settings, never the data (trials share the run's prepared data).
TUNABLE = ("training.", "federated.", "privacy.")
SECTIONS = ("data", "vocab", "task", "training", "privacy", "federated", "canaries", "privatize", "audit", "init")




def run_refs(config: ExperimentConfig) -> dict[str, str]:
    """``task.options`` keys whose value names another run of the experiment (``"run:NAME"``) -> NAME."""
    return {k: v[len(RUN_REF):] for k, v in config.task.options.items() if isinstance(v, str) and v.startswith(RUN_REF)}


def privatize_ref(config: ExperimentConfig) -> str | None:
    """NAME when ``privatize.embeddings = "run:NAME"`` (local privatization with another run's embeddings)."""
    p = config.privatize
    return p.embeddings[len(RUN_REF):] if p is not None and p.embeddings.startswith(RUN_REF) else None


def init_ref(config: ExperimentConfig) -> str | None:
    """NAME when ``init.from = "run:NAME"`` (a warm start from another run's final parameters)."""
    i = config.init
    return i.from_[len(RUN_REF):] if i is not None and i.from_.startswith(RUN_REF) else None


def _all_refs(config: ExperimentConfig) -> dict[str, str]:
    """Every run reference of ``config``: dotted key -> run name."""
    refs = {f"task.options.{k}": v for k, v in run_refs(config).items()}
    emb = privatize_ref(config)
    if emb is not None:
        refs["privatize.embeddings"] = emb
    start = init_ref(config)
    if start is not None:
        refs["init.from"] = start
    u = config.utility
    if u is not None and u.above is not None and u.above.startswith(RUN_REF) and config.data.train_on != "public":
        refs["utility.above"] = u.above[len(RUN_REF):]  # the public model itself is the reference, not a row trained to it
    return refs


@dataclass(frozen=True)
class RunSpec:
    """One training of the grid, resolved. ``group``: the run's name without its seed suffix
    (the same as ``name`` without ``seeds``); ``seed``: the replicate's seed, or None."""

    name: str
    kind: str  # "central" | "federated"
    config: ExperimentConfig
    group: str = ""
    seed: int | None = None
    tune: dict[str, list[Any]] | None = None
    tune_fraction: float = TUNE_FRACTION

    def record(self) -> dict[str, Any]:
        """What experiment.json holds of the run."""
        out = {"name": self.name, "kind": self.kind, "group": self.group or self.name, "seed": self.seed, "config": self.raw}
        if self.tune:
            out.update(tune=self.tune, tune_fraction=self.tune_fraction)
        return out

    @property
    def raw(self) -> dict[str, Any]:
        return self.config.model_dump()


def set_path(d: dict[str, Any], dotted: str, value: Any) -> None:
    set_key(d, dotted, value, "grid key")


def candidates(tune: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The grid's candidates in order: dotted key -> value."""
    return [dict(zip(tune, values)) for values in itertools.product(*tune.values())]


def with_values(raw: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    for key, value in values.items():
        set_path(out, key, value)
    return out


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
                set_path(run, key, value)
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
    base = {k: v for k, v in raw.items() if k not in EXPERIMENT_KEYS}
    seeds = _seeds(raw, origin)
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
            # a kind fixed by the entry: its table of the other kind would be ignored (a kind set by the
            # grid reads each table in one of its expansions, as documented)
            fixed_kind = "kind" not in (entry.get("grid") or {}) and "{" not in str(entry.get("kind", ""))
            if fixed_kind and kind == "central" and "federated" in run:
                raise ConfigError(f"{where}: a central run takes no federated table (central training would ignore it); "
                                  "make it kind = 'federated', or give central DP-SGD its keys in privacy")
            if fixed_kind and kind == "federated" and "privacy" in run:
                raise ConfigError(f"{where}: a federated run takes no privacy table (federated training would ignore it and train "
                                  "without DP); DP-FedAvg's keys go in federated.dp with strategy = 'dp-fedavg'")
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
            tune, fraction = _tune(run, merged, where)
            if seeds is None:
                specs.append(RunSpec(name, kind, validate_config(merged, where), name, None, tune, fraction))
                continue
            for seed in seeds:
                replicate = _with_seed(merged, seed)
                specs.append(RunSpec(f"{name}-s{seed}", kind, validate_config(replicate, f"{where} (seed {seed})"), name, seed, tune, fraction))
    names = [s.name for s in specs]
    for i, s in enumerate(specs):
        for key, ref in _all_refs(s.config).items():
            if ref not in names[:i]:
                later = " (it comes later: move it up)" if ref in names else ""
                raise ConfigError(f"{origin}: run {s.name!r}: {key} = 'run:{ref}' names no earlier run{later}")
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ConfigError(f"{origin}: two runs are named {dup!r}")
    clash = next((s for s in specs if s.group != s.name and s.group in names), None)  # --only NAME would pick both
    if clash is not None:
        raise ConfigError(f"{origin}: run {clash.group!r} (seeds {clash.group}-sK) and a seed of another run are both named {clash.group!r}; rename one")
    return specs


def _tune(run: dict[str, Any], merged: dict[str, Any], where: str) -> tuple[dict[str, list[Any]] | None, float]:
    """A run's ``tune`` grid (dotted key -> candidate values; every candidate must give a valid
    config) and ``tune_fraction``; see :mod:`fedpriv.runner.tune`."""
    tune = run.get("tune")
    fraction = run.get("tune_fraction", TUNE_FRACTION)
    if tune is None:
        return None, fraction
    if not isinstance(tune, dict) or not tune or any(not k.startswith(TUNABLE) or not isinstance(v, list) or not v for k, v in tune.items()):
        raise ConfigError(f"{where}: tune must map dotted keys of {', '.join(TUNABLE)} (e.g. 'federated.server_learning_rate') to non-empty lists of values")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ConfigError(f"{where}: tune_fraction must be in (0, 1], got {fraction!r}")
    if not float((merged.get("data") or {}).get("validation_fraction", 0.0) or 0.0) > 0:
        raise ConfigError(f"{where}: tune chooses on validation users: set data.validation_fraction (e.g. 0.1)")
    for values in candidates(tune):
        validate_config(with_values(merged, values), f"{where}: tune candidate {values}")
    return tune, float(fraction)


def _seeds(raw: dict[str, Any], origin: str) -> list[int] | None:
    """The file's ``seeds`` (distinct integers >= 0), or None without them."""
    if SEEDS_KEY not in raw:
        return None
    seeds = raw[SEEDS_KEY]
    if "seed" in raw:
        raise ConfigError(f"{origin}: give seed or seeds, not both (seeds = [...] repeats every run once per seed)")
    if not isinstance(seeds, list) or not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise ConfigError(f"{origin}: seeds must be a non-empty list of integers >= 0, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{origin}: seeds must be distinct, got {seeds}")
    return seeds


def _with_seed(merged: dict[str, Any], seed: int) -> dict[str, Any]:
    """A run's raw config for the replicate of ``seed``: training seed, canary seed (unless the
    file fixes it) and run references to the same seed's runs."""
    out = copy.deepcopy(merged)
    out["seed"] = seed
    if isinstance(out.get("canaries"), dict) and out["canaries"].get("seed") is None:
        out["canaries"]["seed"] = seed
    for section, key in (("task", "options"), ("privatize", None), ("init", None), ("utility", None)):
        table = out.get(section)
        if not isinstance(table, dict):
            continue
        table = table.get(key) if key else table
        if not isinstance(table, dict):
            continue
        for k, v in list(table.items()):
            if isinstance(v, str) and v.startswith(RUN_REF):
                table[k] = f"{v}-s{seed}"
    return out


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
        first_seed = next((s for s in specs if s.group == ref and s.seed is not None), None)
        if ref is not None and ref not in names and first_seed is not None:  # with seeds: the first seed's run
            m = m.model_copy(update={"embeddings": f"{RUN_REF}{first_seed.name}"})
            ref = first_seed.name
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


def expand_contrasts(raw: dict[str, Any], specs: list[RunSpec], origin: str = "experiment") -> list[dict[str, str]]:
    """The file's ``[[contrasts]]``: ``{name, a, b}`` with ``a`` and ``b`` run names (groups, with
    seeds); the report gives each difference a - b with its interval."""
    entries = raw.get("contrasts", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{origin}: contrasts must be an array of tables ([[contrasts]] with name, a, b)")
    groups = list(dict.fromkeys(s.group or s.name for s in specs))
    out = []
    for i, c in enumerate(entries):
        if not isinstance(c, dict) or set(c) != {"name", "a", "b"} or not all(isinstance(v, str) for v in c.values()):
            raise ConfigError(f"{origin}: contrasts[{i}] must be a table of exactly name, a and b (strings)")
        for side in ("a", "b"):
            if c[side] not in groups:
                raise ConfigError(f"{origin}: contrast {c['name']!r}: {side} = {c[side]!r} names no run (runs: {', '.join(groups)})")
        out.append(dict(c))
    return out


def expand_uncounted(raw: dict[str, Any], origin: str = "experiment") -> list[str]:
    """The file's ``uncounted_choices``: what the experiment's author chose by looking at private
    data outside any run (a learning rate probed on the validation users, a model size, a cohort
    size), one sentence each; the report lists them under what ε does not count."""
    entries = raw.get(UNCOUNTED_KEY, [])
    if not isinstance(entries, list) or not all(isinstance(e, str) and e.strip() for e in entries):
        raise ConfigError(f"{origin}: {UNCOUNTED_KEY} must be a list of non-empty strings (one choice each)")
    return [" ".join(e.split()) for e in entries]


@dataclass(frozen=True)
class Experiment:
    """A parsed experiment file: its name, runs, measurements, contrasts and the choices it
    declares that no ε counts."""

    name: str
    runs: list[RunSpec]
    measures: list[MeasureConfig]
    contrasts: list[dict[str, str]] = field(default_factory=list)
    uncounted_choices: list[str] = field(default_factory=list)


def read_experiment(path: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> Experiment:
    """The experiment file at ``path``, runs and ``[[measure]]`` entries validated (see
    :func:`load_experiment` for ``overrides``)."""
    name, raw, origin = _read_raw(path, overrides)
    specs = _expand_runs(raw, origin)
    return Experiment(name, specs, expand_measures(raw, specs, origin), expand_contrasts(raw, specs, origin), expand_uncounted(raw, origin))


def _read_raw(path: str | os.PathLike[str], overrides: dict[str, Any] | None) -> tuple[str, dict[str, Any], str]:
    path = Path(path)
    raw = read_toml(path)
    apply_overrides(raw, overrides)
    if "name" not in raw:
        raise ConfigError(f"{path}: an experiment needs a name")
    return str(raw["name"]), raw, str(path)


def load_experiment(path: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> tuple[str, list[RunSpec]]:
    """(experiment name, runs) of an experiment TOML file; ``overrides`` (dotted key -> value, e.g.
    ``{"data.source": "Posts.xml"}``) are applied to the experiment before expansion. The file's
    ``[[measure]]`` entries are validated too; :func:`read_experiment` returns them."""
    e = read_experiment(path, overrides)
    return e.name, e.runs


def select_runs(specs: list[RunSpec], only: list[str] | None, finished: Callable[[str], bool] = lambda _n: False) -> list[RunSpec]:
    """The runs named in ``only`` (``fedpriv run --only``; a run's name, or its group: every seed
    of it), in experiment order (all when None); a run they start from (``run:NAME``) must be
    among them or ``finished``."""
    if only is None:
        return specs
    names = list(dict.fromkeys(x for s in specs for x in (s.group or s.name, s.name)))
    unknown = [n for n in only if n not in names]
    if unknown or not only:
        groups = list(dict.fromkeys(s.group or s.name for s in specs))
        raise ConfigError(f"--only {','.join(only)}: no run named {', '.join(map(repr, unknown)) or 'given'}; the runs are {', '.join(groups)}")
    chosen = [s for s in specs if s.name in only or (s.group or s.name) in only]
    picked = {s.name for s in chosen}
    for s in chosen:
        for key, ref in _all_refs(s.config).items():
            if ref not in picked and not finished(ref):
                raise ConfigError(f"--only: run {s.name!r} starts from run {ref!r} ({key}), which is neither in --only nor finished; add it")
    return chosen


def resolve_run_refs(spec: RunSpec, store: str | os.PathLike[str]) -> RunSpec:
    """``spec`` with every ``"run:NAME"`` (task options, ``privatize.embeddings``) replaced by the
    absolute path of that run in ``store``."""
    refs = _all_refs(spec.config)
    if not refs:
        return spec
    raw = spec.raw
    for key, ref in refs.items():
        set_path(raw, key, str((Path(store) / ref).resolve()))
    return RunSpec(spec.name, spec.kind, validate_config(raw, f"run {spec.name!r}"), spec.group, spec.seed, spec.tune, spec.tune_fraction)
