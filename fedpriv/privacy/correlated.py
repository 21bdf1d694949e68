"""Correlated noise (matrix factorization, DP-FTRL style): banded MF and BLT, the cyclic
min-separation schedule they assume, and their accounting event.

The mechanism (Denisov et al. 2022; Choquette-Choo et al. 2023; Dvijotham et al. 2024): a
lower-triangular Toeplitz *strategy* C (n x n over the steps) and its inverse C^-1. Step t adds
the noise ``(C^-1 Z)_t`` to the clipped sum instead of ``Z_t``, where Z_t ~ N(0, (sigma*C_clip)^2)
per coordinate are the i.i.d. draws of DP-SGD. C^-1 is applied as a jax-privacy
``StreamingMatrix`` (``jax_privacy.matrix_factorization``): its state is ``bands - 1`` (banded MF)
or ``buffers`` (BLT) arrays shaped like the model, whatever the number of steps.

* ``banded-mf``: C is the ``bands``-banded Toeplitz matrix whose coefficients are the first
  ``bands`` of the optimal max-error Toeplitz factorization (``toeplitz.optimal_max_error_strategy_coefs``,
  Fichtenberger et al. 2023), scaled to L2 norm 1. One band is C = I: exactly DP-SGD's noise.
* ``blt``: C is the buffered linear Toeplitz matrix of the rational approximation to 1/sqrt(1-x)
  with ``buffers`` buffers (``BufferedToeplitz.from_rational_approx_to_sqrt_x``, the RA-BLT of
  Dvijotham et al. 2024), not numerically optimized for n.

These are the fixed strategies (``coefficients = "fixed"``, the default); ``"optimized"`` fits
either to the run's steps and participation with jax-privacy's optimizers
(:mod:`fedpriv.privacy.optimized`), and :attr:`Strategy.fixed` tells the two apart.

Participation (what the accountant assumes): the N units (users, or examples) are split by a
seeded permutation into b = floor(N / m) fixed groups of exactly m (the N - b*m left over are
never sampled); step t trains group t mod b. Each unit takes part at most k = ceil(n / b) times
in n steps, at least b steps apart: (k, b) min-separation. No sampling amplification is claimed.

Accounting: under the zero-out neighbouring relation (one unit's contributions replaced by zero
in its scheduled steps; the schedule is fixed and public), the whole run is ONE Gaussian
mechanism on C x with L2 sensitivity Delta * C_clip, Delta = sqrt(max over (k, b)-participation
patterns of ||C u||^2) from jax-privacy's ``toeplitz.minsep_sensitivity_squared``, and noise
std sigma*C_clip: a Gaussian with noise multiplier sigma / Delta for dp_accounting (PLD or RDP).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING
from dataclasses import dataclass, field, replace

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.errors import PrivacyParameterError
from fedpriv.privacy.accounting import MAX_NOISE_MULTIPLIER, MIN_NOISE_MULTIPLIER

# dp_accounting and jax_privacy (about 1.5 s to import) are imported where used: docs/architecture.md, "Imports".
if TYPE_CHECKING:
    import dp_accounting
    from jax_privacy.matrix_factorization import streaming_matrix

#: The noise mechanisms a ``[privacy]`` or ``[federated.dp]`` section may name.
MECHANISMS = ("gaussian", "banded-mf", "blt")
CORRELATED = ("banded-mf", "blt")
ZERO_OUT = "zero-out-one"
#: numpy entropy of the cyclic schedule's permutation: ``default_rng([seed, CYCLIC_STREAM])``.
CYCLIC_STREAM = 0xC1C1E
_LABEL = {"banded-mf": "banded MF", "blt": "BLT"}


def _fail(message: str) -> None:
    raise PrivacyParameterError(message)


# ---- the schedule ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CyclicSchedule:
    """N units in b = N // m fixed groups of m (a permutation seeded by ``seed``); step t uses
    group t mod b. ``sample(t)``: the sorted unit indices of step t."""

    population: int
    cohort: int
    steps: int
    seed: int
    unit: str = "user"
    sampling: str = field(default="cyclic", init=False)

    def __post_init__(self) -> None:
        if self.cohort > self.population:
            _fail(f"a cyclic schedule of {self.cohort} {self.unit}s per step needs at least that many {self.unit}s; there are {self.population}")

    @property
    def m(self) -> int:
        return self.cohort

    @property
    def groups(self) -> int:
        """b: the minimum separation, in steps, between two participations of a unit."""
        return self.population // self.cohort

    @property
    def max_participations(self) -> int:
        """k: the most steps any unit takes part in over the planned steps (ceil(n / b))."""
        return math.ceil(self.steps / self.groups)

    @functools.cached_property
    def _order(self) -> np.ndarray:
        return np.random.default_rng([self.seed, CYCLIC_STREAM]).permutation(self.population)

    def sample(self, step: int) -> np.ndarray:
        g = int(step) % self.groups
        return np.sort(self._order[g * self.cohort : (g + 1) * self.cohort]).astype(np.int64)

    def check(self, key: str, max_participations: int | None, min_separation: int | None) -> None:
        """Refuse (one line, naming ``key``) a schedule that breaks the participation the config
        states: a unit taking part more than ``max_participations`` times, or groups fewer than
        ``min_separation`` when some unit takes part twice (it would come back within fewer steps). ``key`` "--": the CLI's
        options ``--max-participations`` and ``--min-separation``."""
        b, k = self.groups, self.max_participations
        sep, most = ("--min-separation", "--max-participations") if key == "--" else (f"{key}.min_separation", f"{key}.max_participations")
        if min_separation is not None and b < min_separation and k > 1:  # k = 1: nobody comes back, any separation holds
            _fail(
                f"{sep} = {min_separation}: {self.population} {self.unit}s in cohorts of {self.cohort} make only "
                f"{b} groups, so a {self.unit} would take part again after {b} steps; use a cohort of at most {self.population // min_separation}"
            )
        if max_participations is not None and k > max_participations:
            _fail(
                f"{most} = {max_participations}: {self.steps} steps over {b} groups of {self.cohort} make some {self.unit} "
                f"take part {k} times; use at most {max_participations * b} steps or more {self.unit}s"
            )


# ---- the strategy ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Strategy:
    """The Toeplitz strategy C of a correlated-noise mechanism (float64 parameters, as stored)."""

    mechanism: str
    coefs: tuple[float, ...] = ()  # banded-mf: the bands of C's first column, L2 norm 1
    buf_decay: tuple[float, ...] = ()  # blt
    output_scale: tuple[float, ...] = ()  # blt

    @property
    def memory(self) -> int:
        """Model-sized arrays the streaming C^-1 keeps (bands - 1, or buffers)."""
        return len(self.coefs) - 1 if self.mechanism == "banded-mf" else len(self.buf_decay)

    @property
    def fixed(self) -> bool:
        """Whether this is the fixed strategy :func:`make_strategy` gives (else: numerically optimized)."""
        if self.mechanism == "banded-mf":
            return bool(self.coefs) and self == make_strategy("banded-mf", len(self.coefs))
        return 1 <= len(self.buf_decay) <= 10 and self == make_strategy("blt", buffers=len(self.buf_decay))

    def describe(self) -> str:
        optimized = "numerically optimized by jax-privacy for mean prefix-sum error"
        if self.mechanism == "banded-mf":
            how = "optimal max-error Toeplitz coefficients, norm 1" if self.fixed else f"{optimized}, norm 1"
            return f"banded MF, {len(self.coefs)} band(s) ({how})"
        how = "RA-BLT: rational approximation to 1/sqrt(1-x)" if self.fixed else optimized
        return f"BLT, {len(self.buf_decay)} buffer(s) ({how})"

    def toeplitz_coefs(self, n: int) -> np.ndarray:
        """The first column of C over n steps (float64)."""
        from jax_privacy.matrix_factorization import buffered_toeplitz

        if self.mechanism == "banded-mf":
            c = np.zeros(n)
            c[: min(n, len(self.coefs))] = self.coefs[:n]
            return c
        with jax.enable_x64(True):
            blt = buffered_toeplitz.BufferedToeplitz.build(buf_decay=list(self.buf_decay), output_scale=list(self.output_scale))
            return np.asarray(blt.toeplitz_coefs(n), np.float64)

    def noising_matrix(self) -> streaming_matrix.StreamingMatrix:
        """C^-1 as a streaming matrix in float32 (applied to the model-shaped i.i.d. noise)."""
        from jax_privacy.matrix_factorization import toeplitz

        if self.mechanism == "banded-mf":
            return toeplitz.inverse_as_streaming_matrix(jnp.asarray(self.coefs, jnp.float32))
        return blt_inverse(self.buf_decay, self.output_scale)

    def sensitivity(self, steps: int, min_separation: int) -> float:
        """Delta: the L2 sensitivity of C x in clip norms, over ``steps`` steps, for a unit taking
        part at most ceil(steps / b) times at least b = ``min_separation`` steps apart."""
        return _sensitivity(self, int(steps), int(min_separation))


def blt_inverse(buf_decay, output_scale) -> streaming_matrix.StreamingMatrix:
    """C^-1 of a BLT in float32, streaming: the recurrence of jax-privacy's
    ``StreamingMatrixBuilder.build_inverse`` (Alg. 3 of arXiv:2408.08868), x_t = y_t - sum_i s_i b_i,
    then b_i <- d_i b_i + x_t, with the buffers b (shape (buffers, *leaf)) kept as the state. Written
    elementwise, one buffer at a time: jax-privacy decays the buffers with ``tensordot(diag(d), b)``,
    a dense buffers x buffers product (elementwise, a BLT DP-SGD step on the NWP LSTM went from
    1.06-1.08x to 1.04-1.05x a Gaussian one on an H100), and the same recurrence written as
    broadcasts over the buffers axis (``sum(s[:, None] * b, axis=0)``) compiles on XLA's CPU backend
    to a loop 25-50x slower than this unrolled form (a (4, 1000, 1000) state: 83 ms against 2.1 ms a
    step; BLT DP-SGD on the small NWP LSTM 2.6x a Gaussian step, docs/correlated_noise.md). Equal
    to jax-privacy's to float32 rounding (tests)."""
    from jax_privacy.matrix_factorization import streaming_matrix

    d = jnp.asarray(np.asarray(buf_decay, np.float32))
    s = jnp.asarray(np.asarray(output_scale, np.float32))

    def init(value):
        return jnp.zeros((d.shape[0],) + tuple(jnp.shape(value)), jnp.float32)

    def multiply_next(y, bufs):
        n = bufs.shape[0]
        acc = s[0] * bufs[0]
        for i in range(1, n):  # unrolled over the (at most 10) buffers, in order
            acc = acc + s[i] * bufs[i]
        x = y - acc
        return x, jnp.stack([d[i] * bufs[i] + x for i in range(n)])

    return streaming_matrix.StreamingMatrix.from_array_implementation(init, multiply_next)


@functools.lru_cache(maxsize=256)
def _sensitivity(strategy: Strategy, steps: int, min_separation: int) -> float:
    from jax_privacy.matrix_factorization import toeplitz

    coefs = strategy.toeplitz_coefs(steps)
    with jax.enable_x64(True):
        sq = toeplitz.minsep_sensitivity_squared(jnp.asarray(coefs, jnp.float64), min_separation, None, n=steps)
    return math.sqrt(float(sq))


@functools.lru_cache(maxsize=32)
def make_strategy(mechanism: str, bands: int = 1, buffers: int = 4) -> Strategy:
    """The strategy a config names (deterministic: no optimization, the same on every machine)."""
    from jax_privacy.matrix_factorization import buffered_toeplitz, toeplitz

    if mechanism == "banded-mf":
        if bands < 1:
            _fail(f"bands must be >= 1, got {bands}")
        c = np.asarray(toeplitz.optimal_max_error_strategy_coefs(bands), np.float64)
        return Strategy("banded-mf", coefs=tuple(float(x) for x in c / np.linalg.norm(c)))
    if mechanism == "blt":
        if not 1 <= buffers <= 10:
            _fail(f"buffers must be in [1, 10], got {buffers}")
        with jax.enable_x64(True):
            blt = buffered_toeplitz.BufferedToeplitz.from_rational_approx_to_sqrt_x(buffers)
            decay, scale = np.asarray(blt.buf_decay, np.float64), np.asarray(blt.output_scale, np.float64)
        return Strategy("blt", buf_decay=tuple(float(x) for x in decay), output_scale=tuple(float(x) for x in scale))
    _fail(f"mechanism must be one of {', '.join(CORRELATED)}, got {mechanism!r}")
    raise AssertionError  # unreachable


# ---- the accounting event -----------------------------------------------------------------------


@dataclass(frozen=True)
class CorrelatedSteps:
    """``steps`` steps of a correlated-noise mechanism on a cyclic (k, b) schedule: one Gaussian
    mechanism with noise multiplier ``noise_multiplier / Delta`` (module docstring).

    ``noise_multiplier``: sigma of each i.i.d. draw Z_t, over the clip norm; ``batch``: m units
    per step; ``min_separation``: b groups. Same interface as
    :class:`~fedpriv.privacy.accounting.GaussianSteps` for the ledger, budget and accountant."""

    mechanism: str
    noise_multiplier: float
    population: int
    batch: float
    steps: int
    unit: str
    min_separation: int
    coefs: tuple[float, ...] = ()
    buf_decay: tuple[float, ...] = ()
    output_scale: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.mechanism not in CORRELATED:
            _fail(f"mechanism must be one of {', '.join(CORRELATED)}, got {self.mechanism!r}")
        z = self.noise_multiplier
        if not (isinstance(z, (int, float)) and math.isfinite(z) and MIN_NOISE_MULTIPLIER <= z <= MAX_NOISE_MULTIPLIER):
            _fail(f"noise_multiplier must be in [{MIN_NOISE_MULTIPLIER:g}, {MAX_NOISE_MULTIPLIER:g}], got {z}")
        if not (isinstance(self.steps, int) and self.steps >= 1):
            _fail(f"steps must be an integer >= 1, got {self.steps}")
        if not (isinstance(self.population, int) and float(self.batch).is_integer() and 1 <= self.batch <= self.population):
            _fail(f"a cyclic schedule takes a whole cohort 1 <= m <= N, got m = {self.batch} of N = {self.population}")
        if self.min_separation != self.population // int(self.batch):
            _fail(f"min_separation must be N // m = {self.population // int(self.batch)} (the cyclic schedule's groups), got {self.min_separation}")

    @staticmethod
    def of(strategy: Strategy, noise_multiplier: float, schedule: CyclicSchedule) -> "CorrelatedSteps":
        return CorrelatedSteps(
            strategy.mechanism, float(noise_multiplier), schedule.population, float(schedule.cohort), schedule.steps, schedule.unit,
            schedule.groups, strategy.coefs, strategy.buf_decay, strategy.output_scale,
        )

    # ---- what the ledger, budget and accountant read ----------------------------------------------
    sampling = "cyclic"
    noised_shards = 1
    noised_micro_steps = 1

    @property
    def strategy(self) -> Strategy:
        return Strategy(self.mechanism, self.coefs, self.buf_decay, self.output_scale)

    @property
    def relation(self) -> str:
        return ZERO_OUT

    @property
    def effective_noise_multiplier(self) -> float:
        return self.noise_multiplier

    @property
    def max_participations(self) -> int:
        return math.ceil(self.steps / self.min_separation)

    @property
    def sampling_probability(self) -> float:
        """m / N: the fraction of the units in each step (no sampling: a group)."""
        return self.batch / self.population

    @property
    def sensitivity_in_clip_norms(self) -> float:
        """Delta over the recorded steps (jax-privacy's min-separation sensitivity)."""
        return self.strategy.sensitivity(self.steps, self.min_separation)

    @property
    def gaussian_multiplier(self) -> float:
        """sigma / Delta: the noise multiplier of the one Gaussian mechanism the run is."""
        return self.noise_multiplier / self.sensitivity_in_clip_norms

    def sampling_text(self) -> str:
        m, n, b = int(self.batch), self.population, self.min_separation
        return (
            f"{self.strategy.describe()}; cyclic participation: the {n} {self.unit}s in b = {b} fixed groups of {m} "
            f"(seeded permutation, {n - b * m} never sampled), group t mod b at step t: each {self.unit} at most k = {self.max_participations} "
            f"times, at least b = {b} steps apart; sensitivity {self.sensitivity_in_clip_norms:.6g} C (jax-privacy min-separation); no sampling amplification"
        )

    def basis(self) -> str:
        return f"{self.unit}-level, {ZERO_OUT}, {_LABEL[self.mechanism]} cyclic (k = {self.max_participations}, b = {self.min_separation}, {int(self.batch)} of {self.population})"

    def notes(self) -> tuple[str, ...]:
        return (
            f"{_LABEL[self.mechanism]} correlated noise: the run is one Gaussian mechanism with noise multiplier sigma/Delta = "
            f"{self.noise_multiplier:g}/{self.sensitivity_in_clip_norms:.6g} = {self.gaussian_multiplier:.6g}; zero-out: a {self.unit}'s contributions "
            f"replaced by zero in its scheduled steps (the schedule is public and fixed)",
        )

    def dp_event(self) -> dp_accounting.DpEvent:
        import dp_accounting

        return dp_accounting.GaussianDpEvent(self.gaussian_multiplier)

    def with_steps(self, steps: int) -> "CorrelatedSteps":
        return replace(self, steps=steps)

    def same_mechanism(self, other: object) -> bool:
        return isinstance(other, CorrelatedSteps) and self.with_steps(1) == other.with_steps(1)

    @classmethod
    def from_json(cls, raw: dict) -> "CorrelatedSteps":
        raw = dict(raw)
        for k in ("coefs", "buf_decay", "output_scale"):
            raw[k] = tuple(float(x) for x in raw[k])
        return cls(**raw)
