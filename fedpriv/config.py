"""Experiment configs: TOML files validated against a schema (pydantic, unknown keys refused).

Every error names the key's path, e.g. ``data.heldout_fraction: Input should be a valid number``.
The schema grows with the features; sections a feature does not use yet are not accepted, so a
typo never passes silently.

Example::

    name = "demo"
    seed = 0

    [data]
    source = "shakespeare"          # a SOURCE spec, see fedpriv.data.sources
    heldout_fraction = 0.1          # users held out by a stable hash of user_id
    min_examples = 1                # drop users with fewer examples
    [data.options]                  # passed to the loader, e.g. users = "sentences:10"

    [vocab]
    size = 10000                    # top-K words (+ pad, oov, bos, eos)
    seq_len = 20
"""

from __future__ import annotations

import json
import os
import re
import stat
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from fedpriv.errors import ConfigError, FedprivError
from fedpriv.privacy.accounting import MAX_NOISE_MULTIPLIER, MIN_NOISE_MULTIPLIER
from fedpriv.privacy.local.mechanisms import check_eta, check_text_mechanism
from fedpriv.vocab.dp_histogram import mechanism_params

#: A string value ``"run:NAME"`` names another run of the same experiment file (resolved by the run store).
RUN_REF = "run:"
#: The evaluation split of the validation users (utility targets, learning-rate choice).
VALIDATION = "validation"

#: Experiment, run and measurement names name directories: letters, digits and _.=+-, not starting with a dot.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]*$")
#: Names a run may not take: what a run store keeps next to its runs (rundir.EXPERIMENT, rundir.MEASURE_DIR, rundir.TUNE_DIR, report.REPORT_DIR).
RESERVED_NAMES = ("experiment.json", "measure", "report", "tune")
#: Loader options that name a file to write (a config read back from a run directory drops them).
WRITE_OPTIONS = ("spill_to",)
#: Seeds are 0 <= seed < 2**32 (numpy and JAX take them as unsigned 32-bit words).
SEED_LIMIT = 2**32


def name_problem(name: Any, reserved: bool = True) -> str | None:
    """Why ``name`` cannot name a directory in a run store (a path, empty, reserved), or None."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        return f"name {name!r} must be letters, digits and _.=+- (it names a directory)"
    if len(name) > 200:
        return f"name {name[:20]!r}... is longer than 200 characters (it names a directory)"
    if reserved and name in RESERVED_NAMES:
        return f"name {name!r} is reserved (a run store keeps its {name} there)"
    return None


#: A config or experiment file is a few kilobytes (the largest shipped one: 10 KB); a larger one is refused unread.
MAX_CONFIG_BYTES = 1 << 20
#: Tables and arrays nest at most this deep in a config, counting the file's own table (the shipped ones: 5).
MAX_CONFIG_DEPTH = 32


def read_config_text(path: Path, what: str = "TOML") -> str:
    """The text of a config file (UTF-8, newlines as universal-newline reading gives them);
    ConfigError naming the file unless it is a regular file of at most MAX_CONFIG_BYTES. A FIFO
    is opened without blocking and refused, like a device (``/dev/zero`` never ends) or a socket."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror or e})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise ConfigError(f"{path}: is a directory, not a {what} file")
        raise ConfigError(f"{path}: not a regular file (a FIFO, a device or a socket); give a {what} file")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(MAX_CONFIG_BYTES + 1)
        except OSError as e:
            raise ConfigError(f"{path}: cannot read ({e.strerror or e})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES:,} bytes, the most a config file may hold")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not valid UTF-8 text (byte {e.start}: {e.reason})") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def check_nesting(raw: Any, origin: str) -> None:
    """ConfigError naming the key path where tables and arrays nest deeper than MAX_CONFIG_DEPTH."""
    stack: list[tuple[Any, str, int]] = [(raw, "", 1)] if isinstance(raw, (dict, list)) else []
    while stack:
        node, where, depth = stack.pop()
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(f"{origin}: {where}: tables and arrays nest more than {MAX_CONFIG_DEPTH} levels deep")
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            if isinstance(v, (dict, list)):
                stack.append((v, f"{where}[{k}]" if isinstance(node, list) else f"{where}.{k}" if where else str(k), depth + 1))


def _too_deep_line(text: str) -> int | None:
    """The line where brackets and braces outside strings and comments first nest deeper than
    MAX_CONFIG_DEPTH (to name it when the TOML parser runs out of recursion)."""
    depth, line, i, n = 0, 1, 0, len(text)
    while i < n:
        c = text[i]
        if c == "#":
            i = text.find("\n", i)
            i = n if i < 0 else i
            continue
        if c in "\"'":
            quote = c * 3 if text.startswith(c * 3, i) else c
            j = i + len(quote)
            while j < n and not text.startswith(quote, j):
                j += 2 if c == '"' and text[j] == "\\" else 1
            line += text.count("\n", i, j)
            i = j + len(quote)
            continue
        if c == "\n":
            line += 1
        elif c in "[{":
            depth += 1
            if depth > MAX_CONFIG_DEPTH:
                return line
        elif c in "]}":
            depth -= 1
        i += 1
    return None


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A TOML file's table; ConfigError naming the file (line and column for syntax errors; the
    file's size, kind and nesting depth bounded: see :func:`read_config_text`, :func:`check_nesting`)."""
    path = Path(path)
    text = read_config_text(path)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: TOML syntax error: {e}") from None
    except RecursionError:
        line = _too_deep_line(text)
        at = f" (at line {line})" if line else ""
        raise ConfigError(f"{path}: arrays and inline tables nest more than {MAX_CONFIG_DEPTH} levels deep{at}") from None
    check_nesting(raw, str(path))
    return raw


def changed_keys(old: Any, new: Any, ignore: tuple[str, ...] = (), prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two JSON-like trees (``ignore``: dotted prefixes)."""
    if prefix and any(prefix == i or prefix.startswith(i + ".") for i in ignore):
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new), key=str):
            key = f"{prefix}.{k}" if prefix else str(k)
            if k not in old or k not in new:
                if not any(key == i or key.startswith(i + ".") for i in ignore):
                    out.append(key)
            else:
                out += changed_keys(old[k], new[k], ignore, key)
        return out
    return [] if old == new else [prefix or "(the whole config)"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class DataConfig(_Strict):
    source: str = Field("shakespeare", min_length=1, description="SOURCE spec: shakespeare, synthetic:..., or a path")
    format: str | None = Field(None, description="override the format guessed from the path")
    options: dict[str, Any] = Field(default_factory=dict, description="loader options")
    heldout_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="fraction of users held out as the test users (0 = none)")
    validation_fraction: float = Field(0.0, ge=0.0, lt=1.0, description="fraction of the remaining users held out as validation users (utility targets, learning-rate choice; never the test users)")
    min_examples: int = Field(1, ge=1, description="drop users with fewer examples")
    max_examples_per_user: int | None = Field(None, ge=1, description="keep each user's first N examples")
    eval_source: str | None = Field(None, min_length=1, description="evaluate on this source instead of held-out users")
    eval_options: dict[str, Any] = Field(default_factory=dict, description="loader options of eval_source")
    users: Literal["natural", "iid"] = Field(
        "natural", description="natural: the source's users; iid: after planting, records shuffled and dealt to users with the same per-user counts (the IID control)"
    )
    public_fraction: float = Field(
        0.0, ge=0.0, lt=1.0,
        description="fraction of the remaining users moved to a public split (by a stable hash of their id, after the test and validation users): "
        "never trained on privately, never given canaries; the vocabulary is learned from it, and data.train_on = 'public' trains on it (a public warm start)",
    )
    public_source: str | None = Field(None, min_length=1, description="a SOURCE of public data (instead of public_fraction): disjoint from the private users by construction")
    public_options: dict[str, Any] = Field(default_factory=dict, description="loader options of public_source")
    train_on: Literal["private", "public"] = Field(
        "private", description="private: the training users; public: the public split (public_fraction or public_source), the non-private pretraining of a warm start"
    )

    @model_validator(mode="after")
    def _public(self) -> "DataConfig":
        if self.public_fraction > 0 and self.public_source is not None:
            raise ValueError("give data.public_fraction or data.public_source, not both")
        if self.train_on == "public" and self.public_fraction == 0 and self.public_source is None:
            raise ValueError("data.train_on = 'public' needs a public split: set data.public_fraction or data.public_source")
        return self

    def has_public(self) -> bool:
        """Whether the experiment has public data (``public_fraction`` or ``public_source``)."""
        return self.public_fraction > 0 or self.public_source is not None


class VocabConfig(_Strict):
    """The vocabulary. NWP: the top-``size`` words of the training users (NER: the top
    ``task.options.vocab_size``), plain or, with ``dp``, of their DP histogram. BERT tasks: a WordPiece
    vocabulary of at most ``size`` tokens, learned from the training users, or from ``source`` (e.g.
    a private corpus's vocabulary for a model pretrained on public text, Hoory et al. 2021), plain
    or from a DP histogram (``dp``; see :func:`fedpriv.vocab.build.build_vocab` for the mechanisms,
    and ``fedpriv vocab build`` for the same thing on its own)."""

    size: int = Field(10_000, ge=1, description="top-K words (nwp) or WordPiece tokens in all (BERT)")
    seq_len: int = Field(20, ge=1, le=1024, description="tokens per encoded example (before bos/eos); at most 1024 (every example is padded to it)")
    source: str | None = Field(None, min_length=1, description="BERT: learn the vocabulary from this SOURCE (all its users) instead of the training users")
    source_format: str | None = Field(None, description="format of source, if not guessed from the path")
    source_options: dict[str, Any] = Field(default_factory=dict, description="loader options of source")
    dp: Literal["gaussian", "laplace", "count"] | None = Field(None, description="learn the words (nwp, ner) or WordPiece vocabulary (BERT) from this DP histogram of the training users (gaussian: Hoory et al. 2021 tuples)")
    epsilon: float | None = Field(None, gt=0.0, description="dp: target epsilon (gaussian, count: < 1)")
    sigma: float | None = Field(None, gt=0.0, description="dp: Gaussian noise std in counts, instead of epsilon")
    delta: float = Field(1e-9, gt=0.0, lt=1.0, description="dp: delta")
    tuple_size: int = Field(256, ge=1, description="dp: N, words per tuple (gaussian) or per example (count, laplace)")
    partition: Literal["stream", "example", "user"] = Field(
        "example",
        description="dp gaussian: tuples cut per example (one example of <= N words is one tuple, the unit DP-SGD protects too), from the stream, "
        "or one tuple per user (its N most frequent distinct words; DP per user added or removed, the unit of DP-FedAvg and user-level DP-SGD)",
    )
    alphabet: Literal["data", "ascii"] = Field("data", description="BERT: ascii puts every printable ASCII character in the vocabulary (public, no privacy cost)")
    public: str | None = Field(
        None, min_length=1, description="BERT: a public corpus; the vocabulary is learned from it and extended by the most frequent words of source's (DP) histogram"
    )
    public_format: str | None = Field(None, description="format of public, if not guessed from the path")
    public_options: dict[str, Any] = Field(default_factory=dict, description="loader options of public")

    @model_validator(mode="after")
    def _check(self) -> "VocabConfig":
        dp_keys = [k for k in ("epsilon", "sigma") if getattr(self, k) is not None]
        if self.dp is None and dp_keys:
            raise ValueError(f"{dp_keys[0]} is given without a DP mechanism; set dp = 'gaussian' (or laplace, count)")
        if self.dp is not None:
            try:  # impossible parameters are refused before any data is read
                mechanism_params(self.dp, sigma=self.sigma, epsilon=self.epsilon, delta=self.delta, tuple_size=self.tuple_size, partition=self.partition)
            except FedprivError as e:
                raise ValueError(str(e)) from None
        return self

    @property
    def custom(self) -> bool:
        """True when a BERT vocabulary is not the plain one learned from the training users."""
        return self.source is not None or self.dp is not None or self.alphabet != "data" or self.public is not None


BUILTIN_TASKS = ("nwp", "ner", "mlm", "bert-ner")
#: [vocab] keys only BERT tasks use (nwp and ner learn their words from the training users).
BERT_VOCAB_KEYS = ("source", "source_format", "source_options", "alphabet", "public", "public_format", "public_options")
#: The entry-point group in which a package names its tasks (``task.kind = "NAME"``).
TASK_ENTRY_POINTS = "fedpriv.tasks"
_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def task_entry_points() -> dict[str, str]:
    """Installed task plug-ins: entry-point name -> ``module:Class``."""
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=TASK_ENTRY_POINTS)}


class TaskConfig(_Strict):
    kind: str = Field(
        "nwp",
        description="nwp (next-word prediction), ner (BiLSTM tagging), mlm (BERT masked-LM pretraining), bert-ner (BERT NER "
        "fine-tuning), or a plug-in: 'package.module:ClassName' or the name of a 'fedpriv.tasks' entry point (docs/custom_tasks.md)",
    )
    model: str = Field("small", min_length=1, description="model preset (nwp: tiny, small, stackoverflow; mlm, bert-ner: tiny, small)")
    options: dict[str, Any] = Field(default_factory=dict, description="task hyperparameters, e.g. head = 'crf' for ner")

    @field_validator("kind")
    @classmethod
    def _kind(cls, kind: str) -> str:
        """A built-in task, an import path, or an installed entry point (the class is imported when the task is built)."""
        if kind in BUILTIN_TASKS or _IMPORT_PATH.match(kind):
            return kind
        installed = task_entry_points()
        if kind in installed:
            return kind
        have = f"installed: {', '.join(sorted(installed))}" if installed else "none installed"
        raise ValueError(
            f"unknown task {kind!r}; expected {', '.join(BUILTIN_TASKS[:-1])} or {BUILTIN_TASKS[-1]}, a plug-in "
            f"'package.module:ClassName', or the name of a {TASK_ENTRY_POINTS!r} entry point ({have})"
        )

    @field_validator("model")
    @classmethod
    def _preset(cls, model: str, info: ValidationInfo) -> str:
        kind = info.data.get("kind")
        if kind == "nwp":
            from fedpriv.models.nwp import PRESETS
        elif kind in ("mlm", "bert-ner"):
            from fedpriv.models.bert import PRESETS
        else:
            return model  # ner and plug-in tasks: the model's sizes are task options
        if model not in PRESETS:
            raise ValueError(f"unknown {kind} preset {model!r}; choose one of {', '.join(PRESETS)}")
        return model


class TrainingConfig(_Strict):
    optimizer: Literal["sgd", "momentum", "adam"] = "adam"
    learning_rate: float = Field(1e-3, gt=0.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="for optimizer = momentum")
    schedule: Literal["constant", "cosine", "warmup_cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    batch_size: int = Field(32, ge=1)
    epochs: float | None = Field(None, gt=0.0, description="train for this many passes (or give steps)")
    steps: int | None = Field(None, ge=1, description="train for this many steps (or give epochs)")
    order: Literal["iid", "noniid"] = Field("iid", description="iid: records shuffled; noniid: users in random order, records contiguous (SGD only: DP-SGD samples its batches)")
    eval_every: int = Field(200, ge=1, description="steps between evaluations")
    checkpoint_every: int = Field(200, ge=1, description="steps between checkpoints")
    eval_batch_size: int = Field(256, ge=1)
    log_private_stats: bool = Field(False, description="DP runs: also log statistics epsilon does not cover (realized batch/cohort size, example counts, delta norms, unnoised loss); the guarantee then says so (--log-private-stats)")

    @model_validator(mode="after")
    def _check(self) -> "TrainingConfig":
        if self.steps is not None and self.epochs is not None:
            raise ValueError("give steps or epochs, not both")
        return self



_MECHANISM_DOC = "gaussian: i.i.d. noise each step (DP-SGD / DP-FedAvg); banded-mf or blt: correlated noise (matrix factorization, docs/correlated_noise.md) on a cyclic schedule, or banded-mf with cyclic Poisson sampling"
_COEFFICIENTS_DOC = "banded-mf / blt: fixed (the default: banded MF's optimal max-error Toeplitz bands, BLT's rational approximation) or optimized (jax-privacy's optimizer for this run's steps and participation, minimizing the mean squared prefix-sum error; computed once before training, stored in the run's strategy.json, reused on resume)"
_GROUPS_DOC = "sampling = cyclic-poisson (amplified banded MF): b, the groups the units are drawn into once (each takes part only in steps t = its group mod b, so at least b steps apart); at least bands (default: bands)"


def amplified_groups(m: Any) -> int:
    """b of cyclic Poisson sampling (``groups``, default ``bands``) of a ``[privacy]`` or ``[federated.dp]`` section."""
    return m.groups if m.groups is not None else m.bands


def _check_sampling_of_mechanism(m: Any, sampling: str, not_cyclic: str) -> None:
    """The sampling a correlated-noise mechanism is accounted for: the cyclic schedule, or (banded MF
    only, ``groups`` >= ``bands``) cyclic Poisson sampling. ``not_cyclic``: the message for any other."""
    if sampling not in ("cyclic", "cyclic-poisson"):
        raise ValueError(not_cyclic)
    if sampling == "cyclic-poisson" and m.mechanism == "blt":
        raise ValueError(
            "sampling = 'cyclic-poisson' amplifies banded MF only: BLT has infinitely many bands, so a unit's participations share rows of C "
            "and amplification by sampling does not apply; use mechanism = 'banded-mf' or sampling = 'cyclic'"
        )
    if sampling == "cyclic" and m.groups is not None:
        raise ValueError("groups applies to sampling = 'cyclic-poisson'; the cyclic schedule's groups are N // (units per step)")
    if sampling == "cyclic-poisson":
        from fedpriv.privacy.amplified import refuse_bands_above_groups

        try:
            refuse_bands_above_groups(m.bands, amplified_groups(m))
        except FedprivError as e:
            raise ValueError(str(e)) from None


def _check_mechanism(m: Any) -> None:
    """The keys of the noise mechanism: banded-mf takes ``bands``, blt ``buffers``; both run the
    cyclic schedule (banded-mf also cyclic Poisson sampling, with ``groups``) and may state the
    participation they must keep."""
    extra = {"bands": m.bands, "buffers": m.buffers, "max_participations": m.max_participations, "min_separation": m.min_separation, "groups": m.groups}
    if m.mechanism == "gaussian":
        given = [k for k, v in extra.items() if v is not None] + (["coefficients"] if m.coefficients != "fixed" else [])
        if given:
            raise ValueError(f"{given[0]} applies to mechanism = 'banded-mf' or 'blt' (correlated noise), not 'gaussian'")
        return
    if m.mechanism == "banded-mf" and m.buffers is not None:
        raise ValueError("buffers applies to mechanism = 'blt'; banded-mf takes bands")
    if m.mechanism == "blt" and m.bands is not None:
        raise ValueError("bands applies to mechanism = 'banded-mf'; blt takes buffers")
    if m.mechanism == "banded-mf" and m.bands is None:
        raise ValueError("mechanism = 'banded-mf' needs bands (the number of bands of the strategy matrix; 1 = DP-SGD's noise)")
    if m.epsilon_budget is not None:
        raise ValueError(f"epsilon_budget is not supported with mechanism = {m.mechanism!r} (its epsilon is that of the planned schedule); use target_epsilon")


#: The largest clip norm accepted: the noise z*C and sums of clipped updates stay finite in float32
#: (about 3.4e38); a clip meant to never bind is far smaller (1e6 does it for these models).
MAX_CLIP_NORM = 1e30


def _clip_norm_in_range(c: float | None) -> float | None:
    if c is not None and not c <= MAX_CLIP_NORM:
        raise ValueError(f"{c:g} is above {MAX_CLIP_NORM:g}: the noise z*C and the sums of clipped updates would overflow float32; "
                         "a clip meant never to bind needs far less (e.g. 1e6)")
    return c


def _noise_multiplier_in_range(z: float | None) -> float | None:
    """A noise multiplier the accountants answer for (0 where a section allows it: no noise):
    refused here, so that the message names the key."""
    if z is not None and z != 0 and not MIN_NOISE_MULTIPLIER <= z <= MAX_NOISE_MULTIPLIER:
        raise ValueError(f"{z:g} is outside [{MIN_NOISE_MULTIPLIER:g}, {MAX_NOISE_MULTIPLIER:g}]: below it epsilon is astronomically "
                         "large and the accountants lose precision; above it epsilon is 0 to float precision")
    return z


#: A noise multiplier z in the accountants' range (or 0 where a section allows no noise), and a clip
#: norm C that float32 arithmetic can carry: refused with the key named.
NoiseMultiplier = Annotated[float, AfterValidator(_noise_multiplier_in_range)]
ClipNorm = Annotated[float, AfterValidator(_clip_norm_in_range)]


class PrivacyConfig(_Strict):
    """DP-SGD for central training (a ``[privacy]`` section turns it on)."""

    clip_norm: ClipNorm = Field(..., gt=0.0, description="C: L2 clip norm of each unit's gradient (an example's, or a user's)")
    unit: Literal["example", "user"] = Field("example", description="the privacy unit: example (each sampled example clipped) or user (users sampled, each user's gradient over examples_per_user of its examples clipped; training.batch_size counts users)")
    examples_per_user: int = Field(8, ge=1, description="unit = user: examples each sampled user contributes to a step (cycled when it has fewer)")
    noise_multiplier: NoiseMultiplier | None = Field(None, ge=0.0, description="sigma per noise draw (or give target_epsilon)")
    target_epsilon: float | None = Field(None, gt=0.0, description="calibrate sigma to reach this epsilon at the end")
    delta: float = Field(..., gt=0.0, lt=1.0)
    sampling: Literal["poisson", "fixed", "cyclic", "cyclic-poisson"] = Field("poisson", description="poisson: q = B/N; fixed: B of N without replacement each step; cyclic: the schedule of mechanism = banded-mf / blt (units in N // B fixed groups, one per step; the default with those mechanisms); cyclic-poisson: amplified banded MF (units drawn once into groups b, group t mod b Poisson-sampled at step t with q = B / (N // b))")
    micro_batch_size: int | None = Field(None, ge=1, description="b: examples per device per micro-step (default: the whole batch)")
    devices: int = Field(1, ge=1, description="P: devices a micro-step is sharded over")
    noise_mode: Literal["once", "per-shard", "per-micro-step"] = Field("once", description="where noise is drawn")
    clipping: Literal["auto", "fast", "reference"] = Field("auto", description="fast (ghost norms) where the model allows")
    epsilon_budget: float | None = Field(None, gt=0.0, description="stop cleanly before a step would exceed this epsilon")
    mechanism: Literal["gaussian", "banded-mf", "blt"] = Field("gaussian", description=_MECHANISM_DOC)
    bands: int | None = Field(None, ge=1, description="mechanism = banded-mf: bands of the strategy matrix C (1 = i.i.d. noise)")
    buffers: int | None = Field(None, ge=1, le=10, description="mechanism = blt: buffers of the BLT strategy (default 4)")
    max_participations: int | None = Field(None, ge=1, description="banded-mf / blt: refuse a schedule in which a unit takes part more than this many times (k)")
    min_separation: int | None = Field(None, ge=1, description="banded-mf / blt: refuse a schedule in which a unit takes part again within fewer steps (b)")
    groups: int | None = Field(None, ge=1, description=_GROUPS_DOC)
    coefficients: Literal["fixed", "optimized"] = Field("fixed", description=_COEFFICIENTS_DOC)
    accountant: Literal["rdp", "pld"] = "rdp"
    private: bool = Field(True, description="false: clipping without noise, a control that claims no privacy (needs noise_multiplier = 0; no epsilon is reported)")
    secure_noise: bool = Field(False, description="draw the DP noise and the sampling from a secret (FEDPRIV_NOISE_SECRET, or the OS CSPRNG) that is never stored, for a model that is released; false: reproducible from the seed (simulation)")

    @model_validator(mode="before")
    @classmethod
    def _default_sampling(cls, data: Any) -> Any:
        """``sampling`` left out: the cyclic schedule under a correlated-noise mechanism (Poisson
        otherwise), written into the config so that a config read back says the same."""
        if isinstance(data, dict) and "sampling" not in data and data.get("mechanism", "gaussian") != "gaussian":
            data = {**data, "sampling": "cyclic"}
        return data

    @model_validator(mode="after")
    def _check(self) -> "PrivacyConfig":
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError("give exactly one of noise_multiplier or target_epsilon")
        if self.unit == "example" and self.examples_per_user != type(self).model_fields["examples_per_user"].default:
            raise ValueError(f"examples_per_user = {self.examples_per_user} applies to unit = 'user' only (with unit = 'example' it would be ignored); "
                             "set unit = 'user' or drop it")
        if not self.private:
            if self.noise_multiplier != 0 or self.epsilon_budget is not None:
                raise ValueError("private = false trains without noise: it takes noise_multiplier = 0 and no target_epsilon or epsilon_budget")
        elif self.noise_multiplier == 0:
            raise ValueError("noise_multiplier = 0 gives no privacy; set private = false for clipping without noise (no epsilon is reported), or drop [privacy]")
        _check_mechanism(self)
        if self.mechanism != "gaussian":
            _check_sampling_of_mechanism(self, self.sampling, (
                f"mechanism = {self.mechanism!r} runs the cyclic schedule it is accounted for (units in fixed groups, one group per step), not {self.sampling!r} "
                "sampling; set sampling = 'cyclic' or drop it (banded-mf: or 'cyclic-poisson')"
            ))
            if self.noise_mode != "once":
                raise ValueError(f"mechanism = {self.mechanism!r} adds its noise once per step; noise_mode must be 'once'")
            if not self.private:
                raise ValueError(f"mechanism = {self.mechanism!r} needs noise; private = false takes mechanism = 'gaussian'")
        elif self.sampling in ("cyclic", "cyclic-poisson"):
            raise ValueError(f"sampling = {self.sampling!r} is the schedule of the correlated-noise mechanisms; set mechanism = 'banded-mf'" + (" or 'blt'" if self.sampling == "cyclic" else ""))
        elif self.accountant == "pld" and self.sampling == "fixed":
            raise ValueError("accountant = 'pld' does not cover sampling = 'fixed' (sampling without replacement is RDP-only); use accountant = 'rdp' or sampling = 'poisson'")
        if self.noise_mode == "per-micro-step" and self.sampling != "fixed":
            raise ValueError("noise_mode = 'per-micro-step' needs sampling = 'fixed' (under Poisson sampling the number of micro-steps depends on the sample)")
        return self


class FederatedDPConfig(_Strict):
    """User-level DP of DP-FedAvg (``[federated.dp]``; strategy = "dp-fedavg" needs it): Gaussian
    noise z*S on the sum of the deltas clipped to ``federated.clip_norm`` S, accounted per round."""

    delta: float = Field(..., gt=0.0, lt=1.0, description="user-level delta (well below 1/N)")
    noise_multiplier: NoiseMultiplier | None = Field(None, ge=0.0, description="z: noise std z*S on the clipped sum (or give target_epsilon)")
    target_epsilon: float | None = Field(None, gt=0.0, description="calibrate z to reach this epsilon after all rounds")
    epsilon_budget: float | None = Field(None, gt=0.0, description="stop cleanly before a round would exceed this epsilon")
    mechanism: Literal["gaussian", "banded-mf", "blt"] = Field("gaussian", description=_MECHANISM_DOC)
    bands: int | None = Field(None, ge=1, description="mechanism = banded-mf: bands of the strategy matrix C (1 = i.i.d. noise)")
    buffers: int | None = Field(None, ge=1, le=10, description="mechanism = blt: buffers of the BLT strategy (default 4)")
    max_participations: int | None = Field(None, ge=1, description="banded-mf / blt: refuse a schedule in which a user takes part more than this many times (k)")
    min_separation: int | None = Field(None, ge=1, description="banded-mf / blt: refuse a schedule in which a user takes part again within fewer rounds (b)")
    groups: int | None = Field(None, ge=1, description=_GROUPS_DOC)
    coefficients: Literal["fixed", "optimized"] = Field("fixed", description=_COEFFICIENTS_DOC)
    accountant: Literal["rdp", "pld"] = "rdp"
    adaptive_clip: bool = Field(False, description="adapt S to a quantile of the delta norms (Andrew et al. 2021)")
    target_unclipped_quantile: float = Field(0.5, ge=0.0, le=1.0)
    clip_learning_rate: float = Field(0.2, gt=0.0)
    clip_count_stddev: float | None = Field(None, ge=0.0, description="sigma_b of the noised count (default m/20)")
    secure_noise: bool = Field(False, description="draw the server noise and the cohort sampling from a secret (FEDPRIV_NOISE_SECRET, or the OS CSPRNG) that is never stored, for a model that is released; false: reproducible from the seed (simulation)")

    @model_validator(mode="after")
    def _check(self) -> "FederatedDPConfig":
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError("give exactly one of noise_multiplier or target_epsilon")
        if self.noise_multiplier == 0:
            raise ValueError("noise_multiplier = 0 gives no privacy; use strategy = 'fedavg-clip' (and no [federated.dp]) for clipping without noise")
        if not self.adaptive_clip:
            fields = type(self).model_fields
            ignored = [k for k in ("target_unclipped_quantile", "clip_learning_rate", "clip_count_stddev") if getattr(self, k) != fields[k].default]
            if ignored:
                raise ValueError(f"{', '.join(ignored)} appl{'ies' if len(ignored) == 1 else 'y'} to adaptive clipping only ({'it' if len(ignored) == 1 else 'they'} would be ignored); "
                                 "set adaptive_clip = true or drop it")
        _check_mechanism(self)
        if self.mechanism != "gaussian" and self.adaptive_clip:
            raise ValueError(f"adaptive_clip is not supported with mechanism = {self.mechanism!r} (its noise state assumes one clip norm)")
        return self


class ClientDPConfig(_Strict):
    """Client-side DP-SGD (``[federated.client_dp]``): each client runs DP-SGD on its own examples
    (record-level DP, Jana and Biemann 2021). A participating client makes exactly
    ``local_steps`` noisy steps per round whatever its number of examples; each step takes each of
    its examples independently with probability ``sampling_rate`` (Poisson; 1 = all of them),
    clips each example's gradient to C, adds N(0, (sigma*C)^2) and divides by the public
    ``federated.local_batch_size`` (see :mod:`fedpriv.clients.privacy`)."""

    clip_norm: ClipNorm = Field(..., gt=0.0, description="C: per-example L2 clip inside each client")
    noise_multiplier: NoiseMultiplier = Field(..., gt=0.0, description="sigma: noise std sigma*C on each local step's clipped sum")
    delta: float = Field(..., gt=0.0, lt=1.0, description="record-level delta")
    local_steps: int = Field(1, ge=1, description="K: noisy local steps per round, the same for every client whatever its number of examples")
    sampling_rate: float = Field(1.0, gt=0.0, le=1.0, description="q: each local step takes each of the client's examples independently with probability q (Poisson; 1 = every example every step)")


class FlowerConfig(_Strict):
    """The Flower engine (``[federated.flower]``): simulation resources and messaging."""

    num_supernodes: int = Field(4, ge=1, description="Flower simulation: virtual SuperNodes that run the client updates")
    users_per_message: int = Field(1, ge=1, description="users a ClientApp trains per message, one after another in one jitted call (fewer messages, less per-message overhead)")
    sum_on_client: bool = Field(False, description="a reply carries the clipped (or count-weighted) sum of its users' deltas, not each delta: 1/users_per_message of the bytes; the server then relies on the ClientApp's clipping")
    client_num_cpus: float = Field(1.0, gt=0.0, description="Flower simulation: CPUs per ClientApp actor")
    client_num_gpus: float = Field(0.0, ge=0.0, description="Flower simulation: GPUs per ClientApp actor")
    round_timeout_s: float = Field(600.0, gt=0.0, description="seconds to wait for a round's replies; missing ones count as failed")


#: Keys of the flat [federated] section before it was split: old key -> where it lives now.
MOVED_FEDERATED_KEYS = {
    **{k: f"federated.dp.{k}" for k in ("noise_multiplier", "target_epsilon", "delta", "epsilon_budget", "accountant", "adaptive_clip",
                                          "target_unclipped_quantile", "clip_learning_rate", "clip_count_stddev")},
    "client_clip_norm": "federated.client_dp.clip_norm",
    "client_noise_multiplier": "federated.client_dp.noise_multiplier",
    "client_delta": "federated.client_dp.delta",
    **{k: f"federated.flower.{k}" for k in ("num_supernodes", "users_per_message", "sum_on_client", "client_num_cpus", "client_num_gpus", "round_timeout_s")},
}


class FederatedConfig(_Strict):
    """Federated training (a ``[federated]`` section; ``fedpriv train federated`` needs it).

    Each round the server samples a cohort of users, each sampled user runs ``local_epochs`` of
    minibatch SGD from the global model and returns its model delta, the strategy aggregates the
    deltas and the server optimizer applies the aggregate as a pseudo-gradient. DP-FedAvg's
    privacy is ``[federated.dp]``, client-side DP-SGD ``[federated.client_dp]``, the Flower
    engine's settings ``[federated.flower]``.
    """

    rounds: int = Field(..., ge=1, description="R: training rounds")
    clients_per_round: int = Field(..., ge=1, description="m: users per round (expected m under Poisson)")
    sampling: Literal["fixed", "poisson", "cyclic", "cyclic-poisson"] = Field("fixed", description="fixed: exactly m of N without replacement; poisson: each user with q = m/N; cyclic: the schedule of dp.mechanism = banded-mf / blt (users in N // m fixed groups, one per round; the default with those mechanisms); cyclic-poisson: amplified banded MF (users drawn once into dp.groups b, group r mod b Poisson-sampled in round r with q = m / (N // b))")
    strategy: Literal["fedavg", "fedavg-clip", "dp-fedavg"] = "fedavg"
    local_epochs: int = Field(1, ge=1, description="E: passes over the user's examples per round")
    local_batch_size: int = Field(16, ge=1, description="B: examples per local step")
    client_learning_rate: float = Field(0.1, gt=0.0, description="eta: local SGD learning rate")
    max_local_steps: int | None = Field(None, ge=1, description="cap on local steps per round (None: E * ceil(n/B))")
    server_optimizer: Literal["sgd", "momentum", "adam"] = "sgd"
    server_learning_rate: float = Field(1.0, gt=0.0)
    server_momentum: float = Field(0.9, ge=0.0, lt=1.0, description="for server_optimizer = momentum")
    clip_norm: ClipNorm | None = Field(None, gt=0.0, description="S: L2 clip of each user's delta (fedavg-clip, dp-fedavg)")
    engine: Literal["vectorized", "flower"] = "vectorized"
    devices: int | None = Field(
        None, ge=1,
        description="devices the vectorized engine splits a chunk of clients over (default: every accelerator; 1 on a CPU, whose forced host devices share the same cores)",
    )
    chunk_size: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(64, description="clients computed together by the vectorized engine (bounds memory); 'auto': the widest power of two whose deltas, local models and inputs fit 1/16 of the device's memory")
    vectorize: Literal["auto", "vmap", "scan"] = Field("auto", description="a group of users in one call: vmap (accelerators) or scan (CPU); auto picks by backend")
    eval_every: int = Field(5, ge=1, description="rounds between evaluations of the global model")
    checkpoint_every: int = Field(1, ge=1, description="rounds between checkpoints")
    dp: FederatedDPConfig | None = Field(None, description="DP-FedAvg's user-level DP")
    client_dp: ClientDPConfig | None = Field(None, description="client-side DP-SGD (record-level)")
    flower: FlowerConfig = Field(default_factory=FlowerConfig)

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            for key, new in MOVED_FEDERATED_KEYS.items():
                if key in raw:
                    raise ValueError(f"federated.{key} is now {new} (the [federated] section has sub-tables dp, client_dp and flower)")
        return raw

    @model_validator(mode="after")
    def _client_dp(self) -> "FederatedConfig":
        """Client-side DP-SGD fixes its local steps (client_dp.local_steps, whatever n_u): local_epochs
        (passes over n_u examples) does not apply, and max_local_steps may only be a cap it respects."""
        cdp = self.client_dp
        if cdp is not None:
            if self.local_epochs != 1:
                raise ValueError("federated.local_epochs does not apply with [federated.client_dp]: every client makes exactly "
                                 "client_dp.local_steps noisy steps per round whatever its number of examples (set client_dp.local_steps)")
            if self.max_local_steps is not None and self.max_local_steps < cdp.local_steps:
                raise ValueError(f"federated.max_local_steps = {self.max_local_steps} is below client_dp.local_steps = {cdp.local_steps}: "
                                 "with [federated.client_dp] every client makes exactly client_dp.local_steps noisy steps per round")
        return self

    @model_validator(mode="before")
    @classmethod
    def _default_sampling(cls, data: Any) -> Any:
        """``sampling`` left out: the cyclic schedule under a correlated-noise ``dp.mechanism``
        (fixed-size cohorts otherwise), written into the config so that a config read back says the same."""
        if isinstance(data, dict) and "sampling" not in data:
            dp = data.get("dp")
            mechanism = dp.get("mechanism", "gaussian") if isinstance(dp, dict) else getattr(dp, "mechanism", "gaussian")
            if mechanism != "gaussian":
                data = {**data, "sampling": "cyclic"}
        return data

    @model_validator(mode="after")
    def _strategy(self) -> "FederatedConfig":
        """Each strategy takes exactly the keys it uses (refused here, before any data is read)."""
        s = self.strategy
        if self.sampling in ("cyclic", "cyclic-poisson") and (self.dp is None or self.dp.mechanism == "gaussian"):
            raise ValueError(
                f"sampling = {self.sampling!r} is the cohort schedule of the correlated-noise mechanisms; set dp.mechanism = 'banded-mf'"
                + (" or 'blt'" if self.sampling == "cyclic" else "") + " (strategy = 'dp-fedavg')"
            )
        if s == "fedavg":
            if self.clip_norm is not None or self.dp is not None:
                given = "clip_norm" if self.clip_norm is not None else "[federated.dp]"
                raise ValueError(f"strategy = 'fedavg' takes no clipping or privacy keys (got {given}); use 'fedavg-clip' or 'dp-fedavg'")
            return self
        if self.clip_norm is None:
            raise ValueError(f"strategy = {s!r} needs clip_norm (S, the L2 bound on each user's delta)")
        if s == "fedavg-clip" and self.dp is not None:
            raise ValueError("strategy = 'fedavg-clip' adds no noise, so [federated.dp] has no meaning; use 'dp-fedavg'")
        if s == "dp-fedavg" and self.dp is None:
            raise ValueError("strategy = 'dp-fedavg' needs a [federated.dp] table: delta, and noise_multiplier or target_epsilon")
        if self.dp is not None and self.dp.mechanism != "gaussian":
            _check_sampling_of_mechanism(self.dp, self.sampling, (
                f"dp.mechanism = {self.dp.mechanism!r} runs the cyclic cohort schedule it is accounted for (users in fixed groups of clients_per_round, one group "
                f"per round), not {self.sampling!r} sampling; set sampling = 'cyclic' or drop it (banded-mf: or 'cyclic-poisson')"
            ))
        elif self.dp is not None and self.dp.accountant == "pld" and self.sampling == "fixed":
            raise ValueError("dp.accountant = 'pld' does not cover sampling = 'fixed' (sampling without replacement is RDP-only); use accountant = 'rdp' or sampling = 'poisson'")
        if self.dp is not None and self.dp.secure_noise and self.client_dp is not None:
            raise ValueError("dp.secure_noise covers the server's noise and sampling; client-side DP-SGD ([federated.client_dp]) draws its noise from the seed: drop one of them")
        return self


class CanariesConfig(_Strict):
    """Canaries planted with the federated secret sharer (Thakkar et al. 2021; a ``[canaries]`` section).

    For each (p_u, p_e) configuration, ``per_config`` canaries; each training user becomes a
    sharer of a canary with probability p_u, and each of a sharer's examples is replaced by the
    canary with probability p_e. See :mod:`fedpriv.memorization.canaries` for the scaling rule.
    """

    words: int = Field(5, ge=3, description="k: words per canary (NWP); the RS test scores the last k - rs_prefix")
    per_config: int = Field(10, ge=1, le=100_000, description="canaries per (p_u, p_e) configuration (at most 100,000: each is drawn, planted and audited)")
    user_probabilities: list[float] = Field([1 / 50_000, 3 / 50_000, 1 / 5_000], min_length=1, description="p_u values")
    example_probabilities: list[float] = Field([0.01, 0.1, 1.0], min_length=1, description="p_e values")
    distribution: Literal["uniform", "unigram"] = Field("uniform", description="canary words drawn uniformly from the vocabulary or by training-word frequency")
    min_expected_sharers: float = Field(1.0, ge=0.0, description="scale every p_u by one factor so the smallest expects at least this many sharers (0: never scale)")
    seed: int | None = Field(None, ge=0, description="seed of the canary draw (words, sharers, insertions); default: the experiment's seed")
    patterns: list[str] = Field(["S", "HS", "HSH", "HHSHH"], min_length=1, description="mlm task: hint/secret patterns (H a hint word, S the secret)")

    @model_validator(mode="after")
    def _check(self) -> "CanariesConfig":
        for name in ("user_probabilities", "example_probabilities"):
            bad = [p for p in getattr(self, name) if not 0.0 < p <= 1.0]
            if bad:
                raise ValueError(f"{name}: every probability must be in (0, 1], got {bad[0]}")
        for pat in self.patterns:
            if set(pat) - {"H", "S"} or pat.count("S") != 1:
                raise ValueError(f"patterns: {pat!r} must be H and S letters with exactly one S (e.g. HSH)")
        return self


#: ``[audit]`` keys that change what is trained (the empirical audit plants its canaries in the
#: training data): part of a run's identity (its secure noise, the resume check); the other audit
#: keys act after training.
TRAINING_AUDIT_KEYS = ("empirical", "empirical_canaries", "empirical_kind", "empirical_words")


class AuditConfig(_Strict):
    """Memorization tests run by ``fedpriv audit`` (an ``[audit]`` section; every key has a default)."""

    rs_prefix: int = Field(2, ge=1, description="Random Sampling: canary words given as the prefix")
    rs_candidates: int = Field(2_000_000, ge=1, description="Random Sampling: N random suffixes per canary")
    rs_batch: int = Field(512, ge=1, description="Random Sampling: candidates scored per compiled call")
    beam_width: int = Field(5, ge=1, description="Beam Search: beams kept per step")
    beam_top: int = Field(5, ge=1, description="Beam Search: a canary is memorized if among this many best continuations")
    extraction_examples: int = Field(500, ge=0, description="extraction: prefixes per category (duplicated, unique, validation); 0 = skip")
    extraction_prefix: int = Field(5, ge=1, description="extraction: words given")
    extraction_suffix: int = Field(5, ge=1, description="extraction: words to reproduce greedily")
    mlm_examples: int = Field(20, ge=1, description="masked-LM secret sharer: planted examples per canary whose secret rank is averaged")
    along: bool = Field(False, description="also audit the parameters saved at every evaluation along training (memorization against utility)")
    empirical: bool = Field(False, description="plant audit canaries (each included with probability 1/2) and bound epsilon from below after training (one-run audit)")
    empirical_canaries: int = Field(1000, ge=2, description="empirical: audit canaries (members and non-members together)")
    empirical_kind: Literal["auto", "example", "user", "client"] = Field(
        "auto", description="empirical: example (one extra example), user (a user holding only the canary) or client (DP-FedAvg: a random update direction); auto: the run's privacy unit"
    )
    empirical_words: int = Field(8, ge=1, description="empirical: words per data canary")

    @model_validator(mode="after")
    def _check(self) -> "AuditConfig":
        if self.beam_top > self.beam_width:
            raise ValueError(f"beam_top ({self.beam_top}) must be <= beam_width ({self.beam_width})")
        return self


class PrivatizeConfig(_Strict):
    """Local d_chi-privacy of the training text (a ``[privatize]`` section): before the task and its
    vocabulary are built, every word of every training user is replaced by M_txt or the Vickrey
    mechanism (:mod:`fedpriv.privacy.local`), so the vocabulary, the model and every engine see
    only privatized text; evaluation data stays the original. eta·d_chi per token (Euclidean
    distance between the embeddings). See docs/local_privacy.md."""

    mechanism: Literal["txt", "vickrey", "rep"] = Field(..., description="txt (M_txt: nearest word to the noised embedding) or vickrey (Xu et al. 2021); rep (vectors) is refused")
    eta: float = Field(..., description="eta > 0 of eta·d_chi, per token; smaller = more noise (mean noise radius dim/eta)")
    t: float | None = Field(None, description="vickrey: tuning parameter in [0, 1] (0 = txt); required for vickrey, refused for txt")
    k: int = Field(2, description="vickrey: candidates (k nearest words); 2 is Xu et al.'s mechanism")
    embeddings: str = Field(..., min_length=1, description="an NWP run directory or a GloVe-style text file (checked before any data is read)")
    max_words: int | None = Field(None, ge=1, description="GloVe file: keep its first N vectors")
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT, description="seed of the mechanism's jax.random key (default: the experiment's seed)")

    @model_validator(mode="after")
    def _check(self) -> "PrivatizeConfig":
        try:  # impossible parameters are refused before any data is read
            check_text_mechanism(self.mechanism, self.eta, self.t, self.k)
        except FedprivError as e:
            raise ValueError(str(e)) from None
        return self


class UtilityConfig(_Strict):
    """A common utility target (a ``[utility]`` section): every run trains until its first
    evaluation on the validation users at or past ``target`` (or until its steps, rounds or
    epsilon budget end), stops there and is audited there, so runs are compared at matched
    utility (Thakkar et al. 2021 compare models within one point of accuracy). ``metric``
    defaults to the task's headline utility (next-token accuracy without OOV and EOS, entity F1,
    masked-token accuracy), a fraction in [0, 1]."""

    target: float | None = Field(None, gt=0.0, le=1.0, description="the utility every run trains to (a fraction); or give above")
    above: str | None = Field(
        None, min_length=1,
        description="'run:NAME' (e.g. the public model of a warm start) or a run directory: the target is that run's final validation utility plus margin, "
        "so a row reaches it only by learning beyond that run",
    )
    margin: float = Field(0.01, gt=0.0, le=1.0, description="with above: how far above that run's final validation utility the target sits (0.01 = 1 point)")
    metric: str | None = Field(None, min_length=1, description="the metric (default: the task's headline utility)")
    split: Literal["validation"] = Field(VALIDATION, description="measured on the validation users (data.validation_fraction), never the test users")

    @model_validator(mode="after")
    def _one_target(self) -> "UtilityConfig":
        if (self.target is None) == (self.above is None):
            raise ValueError("[utility]: give target (a fraction) or above (a run whose final validation utility plus margin is the target), one of them")
        return self


class InitConfig(_Strict):
    """Where a run's parameters start (a warm start): ``from = "run:NAME"`` (a run of the same
    experiment, e.g. central SGD on the public split) or a run directory. The run must have final
    parameters of the same task, model and vocabulary; nothing else about it is used."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False, populate_by_name=True, serialize_by_alias=True)

    from_: str = Field(..., alias="from", min_length=1, description="'run:NAME' (a run of this experiment) or a run directory with final parameters")


class ExperimentConfig(_Strict):
    name: str = Field(..., min_length=1, description="names the default run directory or store: letters, digits and _.=+-")
    seed: int = Field(0, ge=0, lt=SEED_LIMIT)
    data: DataConfig = Field(default_factory=DataConfig)
    vocab: VocabConfig = Field(default_factory=VocabConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    privacy: PrivacyConfig | None = None
    federated: FederatedConfig | None = None
    canaries: CanariesConfig | None = None
    privatize: PrivatizeConfig | None = None
    audit: AuditConfig = Field(default_factory=AuditConfig)
    utility: UtilityConfig | None = None
    init: InitConfig | None = None

    @model_validator(mode="after")
    def _public_runs(self) -> "ExperimentConfig":
        if self.data.train_on == "public" and (self.privacy is not None or self.federated is not None):
            raise ValueError("data.train_on = 'public' is the non-private pretraining on public data: a central run without [privacy] (and without [federated])")
        if self.data.train_on == "public" and self.init is not None:
            raise ValueError("data.train_on = 'public' with [init]: the public pretraining starts from fresh parameters")
        return self

    @model_validator(mode="after")
    def _secure_noise_everywhere(self) -> "ExperimentConfig":
        """A --secure-noise run may release its model: every noisy stage it runs must draw from
        the secret. A DP vocabulary built in the run draws its noise from the seed, so the two are
        refused together (as client-side DP-SGD is, in [federated])."""
        fdp = self.federated.dp if self.federated is not None else None
        secure = (self.privacy is not None and self.privacy.secure_noise) or (fdp is not None and fdp.secure_noise)
        if secure and self.vocab.dp is not None:
            raise ValueError("secure_noise covers the training noise and sampling; vocab.dp draws the DP vocabulary's noise from the seed, "
                             "so the released vocabulary would not be private: drop one of them (or give a vocabulary built elsewhere)")
        return self

    @model_validator(mode="after")
    def _order_of_dp_sgd(self) -> "ExperimentConfig":
        """DP-SGD samples its batches (Poisson, or fixed size without replacement): it never visits
        records in training.order, so a non-IID order would be ignored yet labelled in the report."""
        if self.privacy is not None and self.training.order != "iid":
            raise ValueError(f"training.order = {self.training.order!r} does not apply to DP-SGD ([privacy]): its batches are sampled "
                             f"(privacy.sampling), not read in order; drop training.order")
        return self

    @model_validator(mode="after")
    def _validation_users(self) -> "ExperimentConfig":
        if self.utility is not None and self.data.validation_fraction == 0.0:
            raise ValueError("[utility] measures the target on validation users: set data.validation_fraction (e.g. 0.1)")
        if self.audit.empirical and self.audit.empirical_kind == "client" and (self.federated is None or self.federated.clip_norm is None):
            raise ValueError("audit.empirical_kind = 'client' (random-direction canary clients) needs a federated run that clips: strategy 'dp-fedavg' or 'fedavg-clip'")
        return self

    @model_validator(mode="after")
    def _vocab_for_kind(self) -> "ExperimentConfig":
        """[vocab] keys the task kind cannot use are refused, never silently ignored (issue 30):
        nwp and ner take a DP word histogram (dp and its parameters) but no other source,
        alphabet or public corpus; plug-ins are checked when their class is imported."""
        kind, v = self.task.kind, self.vocab
        if kind in ("nwp", "ner"):  # set to a value other than the default (a stored config lists every key at its default)
            bert_only = [k for k in BERT_VOCAB_KEYS if getattr(v, k) != VocabConfig.model_fields[k].get_default(call_default_factory=True)]
            if bert_only:
                raise ValueError(f"vocab.{bert_only[0]} applies to BERT tasks (mlm, bert-ner), not task.kind = {kind!r}; "
                                 f"{kind} learns its words from the training users, plain or from a DP histogram (vocab.dp)")
        return self

    def audit_canary_kind(self) -> str | None:
        """The unit of the empirical audit's canaries (``audit.empirical_kind``, with ``auto``
        resolved to the run's privacy unit: user for federated and user-level DP-SGD runs,
        example otherwise), or None without an empirical audit."""
        if not self.audit.empirical:
            return None
        if self.audit.empirical_kind != "auto":
            return self.audit.empirical_kind
        if self.federated is not None or (self.privacy is not None and self.privacy.unit == "user"):
            return "user"
        return "example"

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        problem = name_problem(name, reserved=False)
        if problem:
            raise ValueError(problem.removeprefix("name "))
        return name

    @model_validator(mode="after")
    def _audit(self) -> ExperimentConfig:
        """The audit's lengths fit the canaries (NWP and plug-in tasks) and the encoded examples (NWP), known before training."""
        if self.canaries is not None and (self.task.kind == "nwp" or self.task.kind not in BUILTIN_TASKS):
            a = self.audit
            if not 1 <= a.rs_prefix < self.canaries.words:
                raise ValueError(f"audit.rs_prefix ({a.rs_prefix}) must be between 1 and canaries.words - 1 ({self.canaries.words - 1})")
            if self.task.kind == "nwp" and a.extraction_examples > 0 and a.extraction_prefix + a.extraction_suffix > self.vocab.seq_len:
                raise ValueError(f"audit.extraction_prefix + extraction_suffix ({a.extraction_prefix + a.extraction_suffix}) exceeds vocab.seq_len ({self.vocab.seq_len}); lower them or set extraction_examples = 0")
        return self

    def without_write_targets(self) -> "ExperimentConfig":
        """This config with the loader options that write files (WRITE_OPTIONS) dropped: what a
        config read back from a run directory may do (it is data, not instructions)."""
        def drop(options: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in options.items() if k not in WRITE_OPTIONS}

        data = self.data.model_copy(update={"options": drop(self.data.options), "eval_options": drop(self.data.eval_options)})
        vocab = self.vocab.model_copy(update={"source_options": drop(self.vocab.source_options)})
        return self.model_copy(update={"data": data, "vocab": vocab})


def check_kind(cfg: ExperimentConfig, kind: str, origin: str = "config") -> None:
    """Refuse a config that cannot train as ``kind`` (central or federated), before any data is read."""
    if kind == "central":
        t = cfg.training
        if (t.steps is None) == (t.epochs is None):
            raise ConfigError(f"{origin}: training: a central run needs steps or epochs (one of them)")
        f = cfg.federated
        if cfg.privacy is None and f is not None and (f.dp is not None or f.client_dp is not None):
            table = "[federated.dp]" if f.dp is not None else "[federated.client_dp]"
            raise ConfigError(f"{origin}: the config's privacy is {table}, which central training does not read: it would train without DP; "
                              "add [privacy] for central DP-SGD, or train it as a federated run")
    elif kind == "federated":
        if cfg.federated is None:
            raise ConfigError(f"{origin}: no [federated] section (see experiments/fedavg-shakespeare.toml)")
        if cfg.privacy is not None:
            raise ConfigError(f"{origin}: [privacy] (record-level DP-SGD) is for central training; federated runs take their privacy keys in [federated.dp] (strategy = 'dp-fedavg')")
    else:
        raise ConfigError(f"{origin}: unknown run kind {kind!r}; choose central or federated")


def _path_of(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def _config_error(e: ValidationError, origin: str, plain: bool = False) -> ConfigError:
    """The first problem of ``e`` (and how many more) as a ConfigError; ``plain`` drops pydantic's
    "Value error, " prefix of a validator's message."""
    problems = []
    for err in e.errors():
        where = _path_of(err["loc"])
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        problems.append(msg if not err["loc"] else f"{where}: {msg}")
    more = f" (and {len(problems) - 1} more: {'; '.join(problems[1:4])})" if len(problems) > 1 else ""
    return ConfigError(f"{origin}: {problems[0]}{more}")


def normalized_config(raw: Any) -> Any:
    """A stored config re-validated and dumped, so keys a newer schema adds with their defaults
    compare equal (``raw`` itself when it no longer validates)."""
    try:
        return ExperimentConfig.model_validate(raw).model_dump(mode="json")
    except ValidationError:
        return raw


def set_key(raw: dict[str, Any], dotted: str, value: Any, what: str = "--set") -> None:
    """Set the dotted key ``a.b.c`` of a parsed TOML table (tables on the way are made)."""
    parts = dotted.split(".")
    if not all(p.strip() for p in parts):
        raise ConfigError(f"{what} {dotted!r}: expected a dotted key such as training.steps")
    d = raw
    for p in parts[:-1]:
        d = d.setdefault(p, {})
        if not isinstance(d, dict):
            raise ConfigError(f"{what} {dotted!r}: {p!r} is not a table")
    d[parts[-1]] = value


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """``raw`` with each ``KEY=VALUE`` of ``overrides`` (dotted key -> value, ``--set``) set."""
    if overrides and not isinstance(raw, dict):
        raise ConfigError(f"--set {next(iter(overrides))!r}: the config is not a table")
    for key, value in (overrides or {}).items():
        set_key(raw, key, value)
    return raw


def validate_config(raw: dict[str, Any], origin: str = "config") -> ExperimentConfig:
    """A parsed TOML table -> ExperimentConfig, or ConfigError naming the first bad key's path."""
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as e:
        raise _config_error(e, origin) from None


class MeasureConfig(_Strict):
    """One ``[[measure]]`` of an experiment file: the empirical privacy of a local mechanism on an
    embedding space (Qu et al. 2021, sec. 5.3 plausible deniability, sec. 5.4 token inversion),
    computed by ``fedpriv run`` after every run finished (:mod:`fedpriv.report.measure_runs`).

    Impossible parameters are refused here, before any training. ``sample`` and
    ``inversion_tokens`` take ``"all"`` (TOML has no null)."""

    name: str = Field(..., description="names the directory STORE/measure/NAME: letters, digits and _.=+-")
    embeddings: str = Field(..., min_length=1, description="'run:NAME' (a run of this experiment: NWP or BERT), a run directory, or a GloVe-style .txt")
    etas: list[float] = Field(..., min_length=1, description="eta > 0 of eta·d_chi, per token; one measurement each")
    trials: int = Field(1000, ge=1, description="perturbations of each measured token (N_w <= trials)")
    sample: int | Literal["all"] = Field(300, description="tokens measured for plausible deniability (a random sample of the allowed ones), or 'all'")
    mechanism: Literal["txt", "vickrey"] = Field("txt", description="the token mechanism of plausible deniability")
    t: float | None = Field(None, description="vickrey: tuning parameter in [0, 1]; required for vickrey, refused for txt")
    k: int = Field(2, description="vickrey: candidates (k nearest tokens)")
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT, description="seed of the jax.random key (default: the experiment's seed)")
    max_words: int | None = Field(None, ge=1, description="GloVe file: keep its first N vectors")
    inversion_source: str | None = Field(None, min_length=1, description="SOURCE of the inversion's corpus (default: the experiment's [data] source and options)")
    inversion_format: str | None = Field(None, description="format of inversion_source, if not guessed from the path")
    inversion_options: dict[str, Any] = Field(default_factory=dict, description="loader options of inversion_source")
    inversion_tokens: int | Literal["all"] = Field(20_000, description="corpus positions attacked (a random sample), 'all', or 0: no inversion")

    @model_validator(mode="after")
    def _check(self) -> "MeasureConfig":
        problem = name_problem(self.name, reserved=False)
        if problem:
            raise ValueError(problem)
        if isinstance(self.sample, int) and self.sample < 1:
            raise ValueError(f"sample must be >= 1 or 'all', got {self.sample}")
        if isinstance(self.inversion_tokens, int) and self.inversion_tokens < 0:
            raise ValueError(f"inversion_tokens must be >= 0 (0: no inversion) or 'all', got {self.inversion_tokens}")
        if len(set(self.etas)) != len(self.etas):
            raise ValueError(f"etas must be distinct, got {self.etas}")
        try:  # impossible parameters are refused before any training
            for eta in self.etas:
                check_eta(eta)
        except FedprivError as e:
            raise ValueError(f"etas: {e}") from None
        try:
            check_text_mechanism(self.mechanism, self.etas[0], self.t, self.k)
        except FedprivError as e:
            raise ValueError(str(e)) from None
        if self.inversion_source is None and (self.inversion_options or self.inversion_format):
            raise ValueError("inversion_options and inversion_format apply to inversion_source; give it too (default: the experiment's [data])")
        return self


def validate_measure(raw: Any, origin: str = "measure") -> MeasureConfig:
    """A ``[[measure]]`` table -> MeasureConfig, or ConfigError naming ``origin`` and the bad key."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: must be a table")
    unknown = sorted(set(raw) - set(MeasureConfig.model_fields))
    if unknown:
        raise ConfigError(f"{origin}: unknown key {unknown[0]!r} (a [[measure]] takes {', '.join(MeasureConfig.model_fields)})")
    try:
        return MeasureConfig.model_validate(raw)
    except ValidationError as e:
        raise _config_error(e, origin, plain=True) from None


def load_config(path: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """Read and validate an experiment config: TOML, or JSON for a ``.json`` path; ``overrides``
    (dotted key -> value, ``--set``) are set before validation."""
    path = Path(path)
    if path.suffix == ".json":  # a resolved config written by fedpriv (run directories, experiment runs)
        try:
            raw = json.loads(read_config_text(path, "JSON"))
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: JSON syntax error: {e}") from None
        except RecursionError:
            raise ConfigError(f"{path}: arrays and objects nest more than {MAX_CONFIG_DEPTH} levels deep") from None
        check_nesting(raw, str(path))
        return validate_config(apply_overrides(raw, overrides), str(path))
    raw = read_toml(path)
    if "runs" in raw:
        raise ConfigError(f"{path}: an experiment file ([[runs]]), not one config: train its runs with fedpriv run")
    return validate_config(apply_overrides(raw, overrides), str(path))
