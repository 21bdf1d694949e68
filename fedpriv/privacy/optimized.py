"""Numerically optimized correlated-noise strategies (``coefficients = "optimized"``), computed once
per run and stored with it.

What is optimized, and for which loss: the **mean** over the n steps of the expected squared
error of the noisy prefix sums (jax-privacy's ``toeplitz.per_query_error``, averaged), times the
sensitivity squared of the participation the run is accounted for. At a fixed epsilon the noise
std is proportional to the sensitivity, so this is the mean squared error of the running sum of
the noisy gradients, the quantity SGD-like optimizers feel (Denisov et al. 2022; jax-privacy
calls it ``reduction_fn=jnp.mean`` / ``error="mean"``):

* ``blt`` (cyclic (k, b) min-separation): ``buffered_toeplitz.optimize(n, min_sep=b,
  max_participations=k, error="mean", min_buffers=1, max_buffers=buffers)``: mean error times
  jax-privacy's min-separation sensitivity squared; jax-privacy picks the number of buffers, at
  most ``buffers`` (one more only if it lowers the loss by more than 1%).
* ``banded-mf`` (cyclic, and cyclic Poisson): ``toeplitz.optimize_banded_toeplitz(n, bands,
  reduction_fn=jnp.mean)``: mean error times the largest column norm squared, coefficients scaled
  to norm 1. That is the run's exact loss under both participations, provided bands <= b: one unit's
  participations (at least b steps apart) then touch disjoint rows of C, so the min-separation
  sensitivity squared is k times the largest column norm squared (cyclic), and amplified banded MF
  is accounted on the column norm alone (Theorem 4 of arXiv:2306.08153). The cyclic schedule with
  bands > b is refused with ``"optimized"``. jax-privacy's ``optimize_coefs_for_amplifications``
  (which also picks the bands, among the divisors of N) is not used: ``bands`` and ``groups`` stay
  the config's, so the schedule is the one the config states.

The optimizers are deterministic on one machine (L-BFGS in float64), but not promised across
machines or jax versions; so the result is stored in the run directory (``strategy.json``, with
what it was optimized for) and a resumed run reads it back instead of optimizing again. The
ledger's events carry the coefficients, so accounting uses exactly the strategy that runs.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.errors import DataFormatError, FedprivError, PrivacyParameterError
from fedpriv.jsonio import read_json, write_json_atomic
from fedpriv.privacy.correlated import Strategy, make_strategy

# dp_accounting and jax_privacy (about 1.5 s to import) are imported where used: docs/architecture.md, "Imports".

#: What ``coefficients`` in ``[privacy]`` / ``[federated.dp]`` may say.
COEFFICIENTS = ("fixed", "optimized")
LOSS = "mean"  # mean squared prefix-sum error (module docstring)
_FORMAT = "fedpriv-optimized-strategy-1"


def _fail(message: str) -> None:
    raise PrivacyParameterError(message)


@dataclass(frozen=True)
class OptimizationSpec:
    """What a strategy is optimized for: ``mechanism`` over ``steps`` n, a unit taking part at most
    ``max_participations`` k times at least ``min_separation`` b steps apart, with ``size`` bands
    (banded MF) or at most ``size`` buffers (BLT); ``participation``: "cyclic" or "cyclic-poisson"."""

    mechanism: str
    steps: int
    min_separation: int
    max_participations: int
    size: int
    participation: str = "cyclic"
    loss: str = LOSS

    def __post_init__(self) -> None:
        if self.mechanism not in ("banded-mf", "blt"):
            _fail(f"optimized coefficients are for mechanism = 'banded-mf' or 'blt', got {self.mechanism!r}")
        if self.participation not in ("cyclic", "cyclic-poisson"):
            _fail(f"participation must be 'cyclic' or 'cyclic-poisson', got {self.participation!r}")
        if self.mechanism == "blt" and self.participation != "cyclic":
            _fail("BLT runs the cyclic schedule only")
        for name in ("steps", "min_separation", "max_participations", "size"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                _fail(f"{name} must be an integer >= 1, got {v!r}")
        if self.mechanism == "banded-mf" and self.size > self.min_separation:
            key = "groups" if self.participation == "cyclic-poisson" else "the cyclic schedule's groups N // m"
            _fail(
                f"coefficients = 'optimized' with bands = {self.size} > {key} = {self.min_separation}: jax-privacy's banded optimizer "
                f"assumes one unit's participations touch disjoint rows of C (bands <= b); use at most {self.min_separation} bands"
            )
        if self.mechanism == "blt" and self.size > 10:
            _fail(f"buffers must be in [1, 10], got {self.size}")


def _float_tuple(x) -> tuple[float, ...]:  # noqa: ANN001
    return tuple(float(v) for v in np.asarray(x, np.float64))


@functools.lru_cache(maxsize=8)
def optimize_strategy(spec: OptimizationSpec) -> Strategy:
    """The strategy jax-privacy's optimizer returns for ``spec`` (float64; remembered per process)."""
    from jax_privacy.matrix_factorization import buffered_toeplitz, toeplitz

    if spec.mechanism == "banded-mf":
        with jax.enable_x64(True):
            c = toeplitz.optimize_banded_toeplitz(spec.steps, spec.size, reduction_fn=jnp.mean)
        coefs = _float_tuple(c)
        if not all(math.isfinite(v) and v >= 0 for v in coefs):
            _fail(f"jax-privacy's banded optimizer returned coefficients outside [0, inf): {coefs}")
        return Strategy("banded-mf", coefs=coefs)
    try:
        blt = buffered_toeplitz.optimize(
            n=spec.steps, min_sep=spec.min_separation, max_participations=spec.max_participations, error=LOSS, min_buffers=1, max_buffers=spec.size
        )
    except RuntimeError as e:
        raise PrivacyParameterError(f"jax-privacy's BLT optimizer failed for {spec}: {str(e).splitlines()[0]}") from None
    if blt is None:
        _fail(f"jax-privacy's BLT optimizer found no valid BLT for {spec}")
    return Strategy("blt", buf_decay=_float_tuple(blt.buf_decay), output_scale=_float_tuple(blt.output_scale))


def mean_error_times_sensitivity(strategy: Strategy, spec: OptimizationSpec) -> float:
    """The loss optimized (module docstring): mean per-step squared prefix-sum error of C times the
    sensitivity squared of the spec's participation, both from jax-privacy (float64). Its square root
    times sigma/Delta-scaled noise is the RMS prefix-sum noise in clip norms at a fixed epsilon."""
    from jax_privacy.matrix_factorization import toeplitz

    n = spec.steps
    coefs = strategy.toeplitz_coefs(n)
    with jax.enable_x64(True):
        error = float(jnp.mean(toeplitz.per_query_error(strategy_coef=jnp.asarray(coefs, jnp.float64), n=n)))
    if spec.participation == "cyclic-poisson":  # amplified banded MF: one participation's sensitivity, the largest column norm
        with jax.enable_x64(True):
            sens_sq = float(toeplitz.sensitivity_squared(jnp.asarray(coefs, jnp.float64), n=n))
    else:
        sens_sq = strategy.sensitivity(n, spec.min_separation) ** 2
    return error * sens_sq


def check_accountable(strategy: Strategy, spec: OptimizationSpec) -> None:
    """Refuse a strategy the accounting does not cover: Toeplitz coefficients over n steps that are
    not finite, not non-negative, or (cyclic schedule: jax-privacy's min-separation sensitivity
    assumes it) not non-increasing; BLT decays outside [0, 1]."""
    c = strategy.toeplitz_coefs(spec.steps)
    what = f"the {spec.mechanism} strategy optimized for {spec}"
    if not np.all(np.isfinite(c)) or np.any(c < 0) or c[0] <= 0:
        _fail(f"{what} has Toeplitz coefficients that are not finite and non-negative: {c[:8]}")
    if spec.participation == "cyclic" and np.any(np.diff(c) > 0):
        _fail(f"{what} has increasing Toeplitz coefficients, which jax-privacy's min-separation sensitivity does not cover: {c[:8]}")
    if strategy.mechanism == "blt" and not all(0.0 <= d <= 1.0 for d in strategy.buf_decay):
        _fail(f"{what} has buffer decays outside [0, 1]: {strategy.buf_decay}")


# ---- stored with the run -----------------------------------------------------------------------


def _to_json(spec: OptimizationSpec, strategy: Strategy, seconds: float) -> dict:
    return {
        "format": _FORMAT,
        "spec": asdict(spec),
        "strategy": {"mechanism": strategy.mechanism, "coefs": list(strategy.coefs), "buf_decay": list(strategy.buf_decay), "output_scale": list(strategy.output_scale)},
        "optimizer": "jax-privacy " + ("toeplitz.optimize_banded_toeplitz" if strategy.mechanism == "banded-mf" else "buffered_toeplitz.optimize"),
        "seconds": round(seconds, 3),
    }


def load_strategy(path: str | os.PathLike[str]) -> tuple[OptimizationSpec, Strategy]:
    """The spec and strategy a run stored (``strategy.json``); a malformed file is refused in one line."""
    path = Path(path)
    obj = read_json(path, "optimized strategy")
    try:
        if obj.get("format") != _FORMAT:
            raise ValueError("not a fedpriv optimized strategy")
        spec = OptimizationSpec(**obj["spec"])
        s = obj["strategy"]
        strategy = Strategy(s["mechanism"], _float_tuple(s["coefs"]), _float_tuple(s["buf_decay"]), _float_tuple(s["output_scale"]))
        if strategy.mechanism != spec.mechanism or not (strategy.coefs or strategy.buf_decay) or len(strategy.buf_decay) != len(strategy.output_scale):
            raise ValueError("the strategy does not match its spec")
        if (len(strategy.coefs) if spec.mechanism == "banded-mf" else len(strategy.buf_decay)) > spec.size:
            raise ValueError(f"more bands or buffers than the {spec.size} of its spec")
        check_accountable(strategy, spec)
    except (AttributeError, KeyError, TypeError, ValueError, PrivacyParameterError) as e:
        raise DataFormatError(path, None, f"not a valid optimized strategy ({e})") from None
    return spec, strategy


def resolve_strategy(spec: OptimizationSpec, path: str | os.PathLike[str] | None, log: Callable[[str], None] | None = None) -> Strategy:
    """The optimized strategy of a run: read from ``path`` when the run stored one (a resume: never
    optimized again), else optimized now (logging how long it took) and written to ``path``.
    A stored strategy optimized for another spec is refused. ``path`` None: optimized in this
    process only (config checks, and processes that do not own the run directory)."""
    say = log or (lambda _m: None)
    if path is not None and Path(path).is_file():
        stored_spec, strategy = load_strategy(path)
        if stored_spec != spec:
            raise FedprivError(f"{path}: the stored strategy was optimized for {stored_spec}, this run needs {spec}; use a new run directory")
        say(f"optimized strategy read from {path} (not optimized again)")
        return strategy
    what = f"{spec.size} band(s)" if spec.mechanism == "banded-mf" else f"at most {spec.size} buffer(s)"
    say(f"optimizing the {spec.mechanism} strategy ({what}) for n = {spec.steps}, b = {spec.min_separation}, k = {spec.max_participations} (jax-privacy, mean prefix-sum error)...")
    start = time.perf_counter()
    strategy = optimize_strategy(spec)
    seconds = time.perf_counter() - start
    check_accountable(strategy, spec)
    say(f"optimized strategy in {seconds:.1f}s: {strategy.describe()}")
    if path is not None:
        write_json_atomic(Path(path), _to_json(spec, strategy, seconds), indent=1)
    return strategy


def strategy_for(mechanism: str, coefficients: str, bands: int | None, buffers: int | None, schedule, path=None, log=None, key: str = "") -> Strategy:  # noqa: ANN001
    """The strategy a ``[privacy]`` / ``[federated.dp]`` section runs on ``schedule`` (a
    :class:`~fedpriv.privacy.correlated.CyclicSchedule` or cyclic Poisson schedule): the fixed one
    of :func:`make_strategy`, or the optimized one of :func:`resolve_strategy`. ``key``: the
    config section named in a refusal ("--": the CLI's options)."""
    name = (lambda k: f"--{k}") if key == "--" else (lambda k: f"{key}.{k}" if key else k)
    if coefficients not in COEFFICIENTS:
        _fail(f"{name('coefficients')} must be one of {', '.join(COEFFICIENTS)}, got {coefficients!r}")
    size = (bands or 1) if mechanism == "banded-mf" else (buffers or 4)
    if coefficients == "optimized" and mechanism == "banded-mf" and schedule.sampling == "cyclic" and size > schedule.groups:
        _fail(
            f"{name('coefficients')} = 'optimized' with {name('bands')} = {size} > the cyclic schedule's groups N // m = {schedule.groups}: "
            f"jax-privacy's banded optimizer assumes one unit's participations touch disjoint rows of C (bands <= b); use at most {schedule.groups} bands"
        )
    if mechanism == "banded-mf" and size > schedule.steps:
        _fail(f"{name('bands')} = {size} > the run's {schedule.steps} steps: bands past the last step change no noise, but each holds a model-sized "
              f"buffer of noise state; use at most {schedule.steps}")
    if coefficients == "fixed":
        return make_strategy(mechanism, bands or 1, buffers or 4)
    spec = OptimizationSpec(mechanism, int(schedule.steps), int(schedule.groups), int(schedule.max_participations), int(size), schedule.sampling)
    return resolve_strategy(spec, path, log)
