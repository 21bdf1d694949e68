"""``fedpriv privacy ...``: epsilon, delta, calibration and batch-size sweeps for the DP events fedpriv runs."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from enum import Enum
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from fedpriv.errors import PrivacyParameterError
from fedpriv.privacy.amplified import AmplifiedBandMF
from fedpriv.privacy.correlated import CorrelatedSteps
from fedpriv.privacy.accounting import (
    MAX_NOISE_MULTIPLIER,
    MIN_NOISE_MULTIPLIER,
    GaussianSteps,
    available_accountants,
    PLDTooCostly,
    batch_size_sweep,
    calibrate_noise_multiplier,
    check_pld_cost,
    delta_for,
    epsilon_for,
)

privacy_app = typer.Typer(help="Privacy accounting: epsilon, delta, calibration (dp-accounting RDP and PLD).", no_args_is_help=True)
_out = Console()


class Event(str, Enum):
    dpsgd_poisson = "dpsgd-poisson"
    dpsgd_fixed = "dpsgd-fixed"
    dpfedavg_fixed = "dpfedavg-fixed"
    dpfedavg_poisson = "dpfedavg-poisson"
    no_sampling = "no-sampling"
    banded_mf_dpsgd = "banded-mf-dpsgd"
    banded_mf_fedavg = "banded-mf-fedavg"
    blt_dpsgd = "blt-dpsgd"
    blt_fedavg = "blt-fedavg"


class Accountant(str, Enum):
    rdp = "rdp"
    pld = "pld"
    all = "all"


_EVENTS = {
    Event.dpsgd_poisson: ("poisson", "example"),
    Event.dpsgd_fixed: ("fixed", "example"),
    Event.dpfedavg_fixed: ("fixed", "user"),
    Event.dpfedavg_poisson: ("poisson", "user"),
}

#: Correlated-noise events: (mechanism, unit); the schedule is cyclic (docs/correlated_noise.md).
_CORRELATED_EVENTS = {
    Event.banded_mf_dpsgd: ("banded-mf", "example"),
    Event.banded_mf_fedavg: ("banded-mf", "user"),
    Event.blt_dpsgd: ("blt", "example"),
    Event.blt_fedavg: ("blt", "user"),
}

def _given_unit(event: Event, unit: str | None) -> str:
    """``--unit`` checked against ``event``: a DP-FedAvg event is per user, so ``--unit example``
    with it is refused (it was silently read as user); None: the event's default."""
    fixed = _EVENTS.get(event) or _CORRELATED_EVENTS.get(event)
    per_user = fixed is not None and fixed[1] == "user"
    if unit is None:
        return "user" if per_user else "example"
    if unit not in ("example", "user"):
        raise PrivacyParameterError(f"--unit: example or user, got {unit!r}")
    if per_user and unit == "example":
        raise PrivacyParameterError(f"--unit example: {event.value} is DP-FedAvg, whose unit is the user; drop --unit (or pick a DP-SGD event)")
    return unit


def _population_unit(event: Event, unit: str) -> str:
    """What N counts for ``event``: users for a DP-FedAvg event (any mechanism), else ``--unit``
    (examples, or users for user-level DP-SGD)."""
    fixed = _EVENTS.get(event) or _CORRELATED_EVENTS.get(event)
    return "user" if fixed is not None and fixed[1] == "user" else unit


EVENT_HELP = (
    "dpsgd-poisson: DP-SGD, Poisson sampling q=B/N, add-or-remove-one example; "
    "dpsgd-fixed: DP-SGD, fixed batches of B without replacement, replace-one example (RDP only); "
    "dpfedavg-fixed: DP-FedAvg, exactly m=B users of N per round without replacement, replace-one user (RDP only); "
    "dpfedavg-poisson: DP-FedAvg, Poisson user sampling; "
    "no-sampling: every unit in every step; "
    "banded-mf-dpsgd, banded-mf-fedavg, blt-dpsgd, blt-fedavg: correlated noise (--bands, --buffers) on the cyclic schedule: "
    "the N units in b = N // B groups of B, one group per step, so each unit at most k = ceil(steps / b) times, b steps apart "
    "(--max-participations k and --min-separation b refuse a schedule that breaks them); zero-out-one unit. "
    "banded-mf-* with --sampling cyclic-poisson: amplified banded MF, the N units drawn once into b = --groups groups (default --bands), "
    "group t mod b Poisson-sampled at step t with q = B / (N // b); k = ceil(steps / b) Poisson-subsampled Gaussians; add-or-remove-one unit. "
    "--coefficients optimized: the strategy fitted to these steps and participation by jax-privacy's optimizer (mean prefix-sum error)."
)


@dataclass(frozen=True)
class _Range:
    """The values an option takes: a finite number (an integer when ``integer``) from ``low`` to
    ``high``, each end included unless it is open."""

    low: float
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    why: str = ""

    def text(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        if self.high == math.inf:
            return f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
        return f"{kind} in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"

    def holds(self, value: float) -> bool:
        if isinstance(value, float) and not (math.isfinite(value) and (value.is_integer() or not self.integer)):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below


MAX_STEPS = 10**12
#: Every numeric option of ``fedpriv privacy``: the one table :func:`check_options` checks.
OPTION_RANGES: dict[str, _Range] = {
    "--noise-multiplier": _Range(
        MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER, why="below it epsilon is astronomically large; above it epsilon is 0 to float precision"
    ),
    "--population": _Range(1, 10**15, integer=True),
    "--batch": _Range(0, low_open=True),
    "--batches": _Range(0, low_open=True),
    "--steps": _Range(1, MAX_STEPS, integer=True),
    "--shards": _Range(1, 10**6, integer=True),
    "--micro-steps": _Range(1, 10**6, integer=True),
    "--delta": _Range(0, 1, low_open=True, high_open=True),
    "--epsilon": _Range(0, low_open=True),
    "--target-epsilon": _Range(0, low_open=True),
    "--epochs": _Range(0, low_open=True, why="steps = ceil(epochs * ceil(N / B))"),
    "--bands": _Range(1, 10**6, integer=True),
    "--buffers": _Range(1, 10, integer=True),
    "--max-participations": _Range(1, MAX_STEPS, integer=True),
    "--min-separation": _Range(1, MAX_STEPS, integer=True),
    "--groups": _Range(1, 10**15, integer=True),
}


def check_options(values: dict[str, float | None]) -> None:
    """Refuse, naming the option, a value outside its range in :data:`OPTION_RANGES` (``None``:
    not given). Called first by every command, before any accounting."""
    for option, value in values.items():
        if value is None:
            continue
        r = OPTION_RANGES[option]
        if not r.holds(value):
            why = f" ({r.why})" if r.why else ""
            raise PrivacyParameterError(f"{option} must be {r.text()}{why}, got {_shown(value)}")


def _shown(value: float) -> str:
    if isinstance(value, int):
        text = str(value)
        return text if len(text) <= 20 else f"{text[:6]}... ({len(text)} digits)"
    return f"{value:g}"


@dataclass(frozen=True)
class _MF:
    """The correlated-noise options of a command (ignored by the Gaussian events)."""

    bands: Optional[int] = None
    buffers: Optional[int] = None
    max_participations: Optional[int] = None
    min_separation: Optional[int] = None
    sampling: str = "cyclic"
    groups: Optional[int] = None
    coefficients: str = "fixed"

    def options(self) -> dict[str, Optional[int]]:
        return {"--bands": self.bands, "--buffers": self.buffers, "--max-participations": self.max_participations, "--min-separation": self.min_separation,
                "--groups": self.groups}


def _correlated_event(event: Event, z: float, population: int, batch: Optional[float], steps: int, shards: int, micro_steps: int, mf: _MF,
                      unit: str = "example") -> CorrelatedSteps | AmplifiedBandMF:
    """The event of ``event``: DP-FedAvg's unit is the user; DP-SGD's is ``--unit`` (example, or user for user-level DP-SGD);
    ``--sampling cyclic-poisson``: amplified banded MF over ``--groups`` groups."""
    from fedpriv.privacy.amplified import CyclicPoissonSchedule
    from fedpriv.privacy.correlated import CyclicSchedule
    from fedpriv.privacy.optimized import COEFFICIENTS, strategy_for

    mechanism, default_unit = _CORRELATED_EVENTS[event]
    if mf.coefficients not in COEFFICIENTS:
        raise PrivacyParameterError(f"--coefficients: {' or '.join(COEFFICIENTS)}, got {mf.coefficients!r}")
    say = lambda m: typer.echo(m, err=True)  # noqa: E731 (an optimization takes seconds: say so on stderr)
    if unit not in ("example", "user"):
        raise PrivacyParameterError(f"--unit: example or user, got {unit!r}")
    unit = unit if default_unit == "example" else "user"
    if batch is None or not float(batch).is_integer():
        raise PrivacyParameterError(f"--batch: {event.value} takes a whole cohort B (the cyclic schedule's group size), got {batch}")
    if shards != 1 or micro_steps != 1:
        raise PrivacyParameterError(f"--shards / --micro-steps: {event.value} adds its noise once per step")
    if mechanism == "banded-mf" and (mf.bands is None or mf.buffers is not None):
        raise PrivacyParameterError(f"{event.value} needs --bands (and takes no --buffers)")
    if mechanism == "blt" and mf.bands is not None:
        raise PrivacyParameterError(f"{event.value} takes --buffers (default 4), not --bands")
    if mf.sampling not in ("cyclic", "cyclic-poisson"):
        raise PrivacyParameterError(f"--sampling: cyclic or cyclic-poisson, got {mf.sampling!r}")
    if mf.sampling == "cyclic-poisson":
        if mechanism == "blt":
            raise PrivacyParameterError(f"--sampling cyclic-poisson amplifies banded MF only: BLT has infinitely many bands, so amplification by sampling does not apply; use banded-mf-{event.value.split('-', 1)[1]} or --sampling cyclic")
        amplified = CyclicPoissonSchedule(population, int(batch), mf.groups or mf.bands, steps, 0, unit)
        amplified.check("--", mf.bands, mf.max_participations, mf.min_separation)
        return AmplifiedBandMF.of(strategy_for(mechanism, mf.coefficients, mf.bands, None, amplified, None, say, "--"), z, amplified)
    if mf.groups is not None:
        raise PrivacyParameterError("--groups applies to --sampling cyclic-poisson (the cyclic schedule's groups are N // B)")
    schedule = CyclicSchedule(population, int(batch), steps, 0, unit)
    schedule.check("--", mf.max_participations, mf.min_separation)
    return CorrelatedSteps.of(strategy_for(mechanism, mf.coefficients, mf.bands, mf.buffers, schedule, None, say, "--"), z, schedule)


def _strategy_extra(ev: GaussianSteps | CorrelatedSteps | AmplifiedBandMF, mf: _MF) -> dict:
    """An optimized strategy's coefficients, for the answer (a fixed one is named by its options)."""
    if mf.coefficients != "optimized":
        return {}
    s = ev.strategy  # type: ignore[union-attr]
    return {"strategy": {k: list(v) for k, v in (("coefs", s.coefs), ("buf_decay", s.buf_decay), ("output_scale", s.output_scale)) if v}}


def _event(event: Event, z: float, population: int, batch: Optional[float], steps: int, shards: int, micro_steps: int, unit: str, mf: _MF = _MF()) -> GaussianSteps | CorrelatedSteps | AmplifiedBandMF:
    if unit not in ("example", "user"):
        raise PrivacyParameterError(f"--unit: example or user, got {unit!r}")
    if event in _CORRELATED_EVENTS:
        return _correlated_event(event, z, population, batch, steps, shards, micro_steps, mf, unit)
    if any(v is not None for v in mf.options().values()) or mf.sampling != "cyclic" or mf.coefficients != "fixed":
        raise PrivacyParameterError(f"--bands, --buffers, --max-participations, --min-separation, --sampling, --groups and --coefficients apply to the correlated-noise events, not {event.value}")
    if event is Event.no_sampling:
        if batch is not None and batch != population:
            raise PrivacyParameterError(f"--batch: with no sampling every unit is in every step, so batch must equal --population ({population}) or be omitted")
        return GaussianSteps("none", z, population, population, steps, unit, shards, micro_steps)  # type: ignore[arg-type]
    if batch is None:
        raise PrivacyParameterError("--batch is required for a sampled event (B examples, or m users per round)")
    sampling, event_unit = _EVENTS[event]
    unit = unit if event_unit == "example" else "user"  # DP-SGD: --unit (user: user-level DP-SGD); DP-FedAvg: always the user
    return GaussianSteps(sampling, z, population, batch, steps, unit, shards, micro_steps)  # type: ignore[arg-type]


def _accountants(ev: GaussianSteps | CorrelatedSteps | AmplifiedBandMF, which: Accountant) -> list[str]:
    have = available_accountants(ev)
    if which is Accountant.all:
        try:
            check_pld_cost([ev])
        except PLDTooCostly:  # "all" answers with the accountants that answer in bounded time
            return [a for a in have if a != "pld"]
        return have
    if which.value not in have:
        raise PrivacyParameterError(f"--accountant {which.value}: not available for {ev.sampling_text()} (use {', '.join(have)})")
    return [which.value]


def _print_answers(answers: list[dict], as_json: bool, extra: dict | None = None) -> None:
    if as_json:
        print(json.dumps({**(extra or {}), "answers": answers}, indent=2))
        return
    t = Table(title="privacy guarantee")
    for col in ("accountant", "epsilon", "delta", "RDP order"):
        t.add_column(col, justify="right")
    for a in answers:
        t.add_row(a["accountant"], f"{a['epsilon']:.4g}", f"{a['delta']:.3g}", "" if a["rdp_order"] is None else f"{a['rdp_order']:g}")
    _out.print(t)
    a = answers[0]
    _out.print(f"{a['unit']}-level, {a['relation']} {a['unit']}; {a['sampling']}; {a['steps']} steps", markup=False, soft_wrap=True)
    _out.print(f"noise multiplier {a['noise_multiplier']:g} per draw, effective {a['effective_noise_multiplier']:g} per logical step", markup=False)
    for n in a["notes"]:
        _out.print(f"note: {n}", markup=False, soft_wrap=True)
    if extra:
        for k, v in extra.items():
            _out.print(f"{k}: {v}", markup=False)


_Z = typer.Option(..., "--noise-multiplier", "-z", help="sigma: noise std per draw over the clip norm C.")
_N = typer.Option(..., "--population", "-N", help="N: examples in the dataset, or users in the population.")
_B = typer.Option(None, "--batch", "-B", help="B: batch size (expected, under Poisson), or users per round m.")
_T = typer.Option(..., "--steps", help="Steps (DP-SGD) or rounds (DP-FedAvg).")
_P = typer.Option(1, "--shards", min=1, help="P: shards that each add their own noise (Hoory et al. 2021, eq. 3).")
_MT = typer.Option(1, "--micro-steps", min=1, help="T: accumulation micro-steps that each add their own noise.")
_U = typer.Option(None, "--unit", help="example or user: the unit of a DP-SGD or no-sampling event (default example; user: user-level DP-SGD); DP-FedAvg events are per user (the default; example is refused).")
_EV = typer.Option(..., "--event", "-e", help=EVENT_HELP)
_ACC = typer.Option(Accountant.all, "--accountant", help="rdp, pld, or all available.")
_JSON = typer.Option(False, "--json", help="Print JSON.")
_BANDS = typer.Option(None, "--bands", help="banded-mf-*: bands of the strategy matrix C (1 = DP-SGD's noise).")
_BUFFERS = typer.Option(None, "--buffers", help="blt-*: buffers of the BLT (default 4).")
_MAXP = typer.Option(None, "--max-participations", help="correlated noise: refuse a schedule in which a unit takes part more than k times.")
_MINSEP = typer.Option(None, "--min-separation", help="correlated noise: refuse a schedule in which a unit takes part again within fewer than b steps.")
_SAMPLING = typer.Option("cyclic", "--sampling", help="correlated noise: cyclic (fixed groups of B, one per step) or cyclic-poisson (banded-mf-*: amplified banded MF, --groups b).")
_GROUPS = typer.Option(None, "--groups", help="--sampling cyclic-poisson: b, the groups the units are drawn into (default --bands; at least --bands).")
_COEFS = typer.Option("fixed", "--coefficients", help="correlated noise: fixed (banded MF's optimal max-error bands, BLT's rational approximation) or optimized (jax-privacy's optimizer for these steps and this participation, mean prefix-sum error; seconds to tens of seconds), as coefficients = ... in a config.")
_ALLOW = typer.Option(False, "--allow-large-delta", help="Answer even when delta >= 1/N (refused otherwise: publishing one record in the clear meets it); the answer then says what it means.")


def _delta_vs_population(delta: Optional[float], population: int, unit: str, allow: bool) -> dict:
    """Refuse a delta >= 1/N unless ``allow``; then the note saying what it means (for the answer's extras)."""
    from fedpriv.privacy.delta import large_delta_note, large_delta_problem

    if delta is None or not 0.0 < delta < 1.0:  # (a delta outside (0, 1) is refused by the accountant, naming its range)
        return {}
    problem = large_delta_problem("--delta", delta, population, unit)
    if problem and not allow:
        raise PrivacyParameterError(problem)
    return {"note": large_delta_note("--delta", delta, population, unit)} if problem else {}


@privacy_app.command("epsilon")
def epsilon_cmd(
    event: Event = _EV,
    noise_multiplier: float = _Z,
    population: int = _N,
    batch: Optional[float] = _B,
    steps: int = _T,
    delta: Optional[float] = typer.Option(None, "--delta", help="Answer epsilon at this delta."),
    epsilon: Optional[float] = typer.Option(None, "--epsilon", help="Answer delta at this epsilon instead."),
    shards: int = _P,
    micro_steps: int = _MT,
    unit: Optional[str] = _U,
    accountant: Accountant = _ACC,
    as_json: bool = _JSON,
    allow_large_delta: bool = _ALLOW,
    bands: Optional[int] = _BANDS,
    buffers: Optional[int] = _BUFFERS,
    max_participations: Optional[int] = _MAXP,
    min_separation: Optional[int] = _MINSEP,
    sampling: str = _SAMPLING,
    groups: Optional[int] = _GROUPS,
    coefficients: str = _COEFS,
) -> None:
    """epsilon for a delta (or delta for an epsilon) of a DP-SGD or DP-FedAvg run (Gaussian or correlated noise)."""
    mf = _MF(bands, buffers, max_participations, min_separation, sampling, groups, coefficients)
    check_options({"--noise-multiplier": noise_multiplier, "--population": population, "--batch": batch, "--steps": steps, "--delta": delta,
                   "--epsilon": epsilon, "--shards": shards, "--micro-steps": micro_steps, **mf.options()})
    if (delta is None) == (epsilon is None):
        raise PrivacyParameterError("give exactly one of --delta (to get epsilon) or --epsilon (to get delta)")
    unit = _given_unit(event, unit)
    note = _delta_vs_population(delta, population, _population_unit(event, unit), allow_large_delta)
    ev = _event(event, noise_multiplier, population, batch, steps, shards, micro_steps, unit, mf)
    answers = []
    for acc in _accountants(ev, accountant):
        ans = epsilon_for(ev, delta, acc) if delta is not None else delta_for(ev, epsilon, acc)  # type: ignore[arg-type]
        answers.append(ans.to_json())
    if epsilon is not None:  # the delta answered: at least 1/N promises nothing, said as for an asked delta
        from fedpriv.privacy.delta import answered_delta_note

        said = answered_delta_note(min(a["delta"] for a in answers), population, _population_unit(event, unit), epsilon)
        note = {"note": said} if said else {}
    _print_answers(answers, as_json, {"event": event.value, **_strategy_extra(ev, mf), **note})


@privacy_app.command("calibrate")
def calibrate_cmd(
    event: Event = _EV,
    target_epsilon: float = typer.Option(..., "--target-epsilon", help="The epsilon to reach."),
    delta: float = typer.Option(..., "--delta", help="At this delta."),
    population: int = _N,
    batch: Optional[float] = _B,
    steps: int = _T,
    shards: int = _P,
    micro_steps: int = _MT,
    unit: Optional[str] = _U,
    accountant: Accountant = typer.Option(Accountant.rdp, "--accountant", help="rdp or pld."),
    as_json: bool = _JSON,
    allow_large_delta: bool = _ALLOW,
    bands: Optional[int] = _BANDS,
    buffers: Optional[int] = _BUFFERS,
    max_participations: Optional[int] = _MAXP,
    min_separation: Optional[int] = _MINSEP,
    sampling: str = _SAMPLING,
    groups: Optional[int] = _GROUPS,
    coefficients: str = _COEFS,
) -> None:
    """The smallest noise multiplier (per draw) that reaches --target-epsilon at --delta (bisection)."""
    mf = _MF(bands, buffers, max_participations, min_separation, sampling, groups, coefficients)
    check_options({"--target-epsilon": target_epsilon, "--delta": delta, "--population": population, "--batch": batch, "--steps": steps,
                   "--shards": shards, "--micro-steps": micro_steps, **mf.options()})
    unit = _given_unit(event, unit)
    note = _delta_vs_population(delta, population, _population_unit(event, unit), allow_large_delta)
    if accountant is Accountant.all:
        raise PrivacyParameterError("--accountant: calibrate against one accountant, rdp or pld")
    template = _event(event, 1.0, population, batch, steps, shards, micro_steps, unit, mf)
    _accountants(template, accountant)
    sigma, ans = calibrate_noise_multiplier(template, target_epsilon, delta, accountant.value)  # type: ignore[arg-type]
    _print_answers([ans.to_json()], as_json, {"event": event.value, "calibrated_noise_multiplier": sigma, **_strategy_extra(template, mf), **note})


@privacy_app.command("batch-sweep")
def batch_sweep_cmd(
    event: Event = _EV,
    noise_multiplier: float = _Z,
    population: int = _N,
    batch: float = typer.Option(..., "--batch", "-B", help="B0: the batch the noise multiplier is given for."),
    steps: int = _T,
    batches: str = typer.Option(..., "--batches", help="Comma-separated batch sizes to compare."),
    delta: float = typer.Option(..., "--delta", help="Answer epsilon at this delta."),
    epochs: Optional[float] = typer.Option(None, "--epochs", help="Keep epochs fixed (steps = ceil(epochs * ceil(N/B)), as a central run with training.epochs counts them) instead of steps."),
    accountant: Accountant = typer.Option(Accountant.rdp, "--accountant", help="rdp or pld."),
    as_json: bool = _JSON,
    allow_large_delta: bool = _ALLOW,
) -> None:
    """Scale sigma with sqrt(B) from (B0, sigma0) and show the epsilon of each batch size."""
    if event is Event.no_sampling or event in _CORRELATED_EVENTS or accountant is Accountant.all:
        raise PrivacyParameterError("batch-sweep needs a sampled Gaussian --event and one --accountant (rdp or pld)")
    try:
        sizes = [float(b) for b in batches.split(",") if b.strip()]
    except ValueError:
        raise PrivacyParameterError(f"--batches: expected comma-separated numbers, got {batches!r}") from None
    if not sizes:
        raise PrivacyParameterError(f"--batches: expected at least one batch size, got {batches!r}")
    check_options({"--noise-multiplier": noise_multiplier, "--population": population, "--batch": batch, "--steps": steps, "--delta": delta, "--epochs": epochs})
    for size in sizes:
        check_options({"--batches": size})
    note = _delta_vs_population(delta, population, "example", allow_large_delta)
    template = _event(event, noise_multiplier, population, batch, steps, 1, 1, "example")
    rows = batch_size_sweep(template, sizes, delta, epochs, accountant.value)  # type: ignore[arg-type]
    if as_json:
        print(json.dumps({"event": event.value, "rows": rows, **note}, indent=2))
        return
    t = Table(title=f"sigma scaled with sqrt(B) from sigma={noise_multiplier:g} at B={batch:g}")
    for col in ("batch", "noise multiplier", "steps", "epsilon"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(f"{r['batch']:g}", f"{r['noise_multiplier']:.4g}", str(r["steps"]), f"{r['epsilon']:.4g}")
    _out.print(t)
    a = rows[0]["answer"]
    _out.print(f"delta = {delta:g}; {a['accountant']}; {a['unit']}-level, {a['relation']} {a['unit']}; sampling at B = {rows[0]['batch']:g}: "
               f"{a['sampling']} (each row the same scheme at its own B)", markup=False, soft_wrap=True)
    if note:
        _out.print(f"note: {note['note']}", markup=False, soft_wrap=True)
