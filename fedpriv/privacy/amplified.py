"""Amplified banded MF: banded matrix factorization with cyclic Poisson sampling
(Choquette-Choo et al. 2023, "(Amplified) Banded Matrix Factorization", arXiv:2306.08153,
Algorithm 2 and Theorem 4), and its accounting event.

Participation (jax-privacy's ``batch_selection.CyclicPoissonSampling``, ``cycle_length`` b,
``PartitionType.INDEPENDENT``): each of the N units (users, or examples) is put once, independently
and uniformly at random, into one of b groups; at step t every unit of group t mod b takes part
independently with probability q = m / (N // b) (jax-privacy's rule: m units expected per step),
so a unit takes part at most k = ceil(n / b) times in n steps, at least b steps apart. Because each
unit's group is its own independent draw, adding or removing a unit moves no other unit: the
relation is add-or-remove-one unit, as for Poisson DP-SGD (jax-privacy: INDEPENDENT "is compatible
with the add-remove adjacency notion"; its default EQUAL_SPLIT is not).

Accounting (Theorem 4): C is banded with at most b bands, so the columns of a unit's
participations (b or more steps apart) touch disjoint rows of C: the run is the k-fold composition
of a Poisson-subsampled Gaussian with noise multiplier sigma / c_max, c_max the largest L2 column
norm of C (jax-privacy's ``toeplitz.sensitivity_squared``, its single-participation sensitivity;
1 once n >= bands, as fedpriv scales C's bands to norm 1). The event is jax-privacy's
``experimental.accounting.amplified_bandmf_event`` (``SelfComposedDpEvent(PoissonSampledDpEvent(q,
GaussianDpEvent(sigma / c_max)), ceil(n / b))``), accounted by dp_accounting (PLD or RDP) under
add-or-remove-one. With one band and b = 1 it is exactly Poisson DP-SGD / DP-FedAvg.

BLT is not offered: its strategy has infinitely many bands, so participations b steps apart share
rows of C and the amplification argument does not apply.

>>> s = CyclicPoissonSchedule(population=1000, cohort=10, groups=4, steps=8, seed=0)
>>> (s.sampling_probability, s.max_participations)
(0.04, 2)
>>> ev = AmplifiedBandMF.of(make_strategy("banded-mf", 2), 1.0, s)
>>> e = ev.dp_event()  # SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(sigma / c_max)), k)
>>> (e.count, e.event.sampling_probability, round(e.event.event.noise_multiplier, 9))
(2, 0.04, 1.0)
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING
from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.errors import PrivacyParameterError
from fedpriv.privacy.accounting import ADD_OR_REMOVE, MAX_NOISE_MULTIPLIER, MIN_NOISE_MULTIPLIER
from fedpriv.privacy.correlated import Strategy, make_strategy

# dp_accounting and jax_privacy (about 1.5 s to import) are imported where used: docs/architecture.md, "Imports".
if TYPE_CHECKING:
    import dp_accounting
    from jax_privacy.batch_selection import CyclicPoissonSampling

#: numpy entropy of the cyclic Poisson sampler: ``default_rng([seed, CYCLIC_POISSON_STREAM])``.
CYCLIC_POISSON_STREAM = 0xC1C1E_9015
CYCLIC_POISSON = "cyclic-poisson"


def _fail(message: str) -> None:
    raise PrivacyParameterError(message)


def refuse_bands_above_groups(bands: int, groups: int, unit: str = "unit", bands_key: str = "bands", groups_key: str = "groups") -> None:
    """Refuse more bands than groups: a unit's participations, b steps apart, would share rows of C."""
    if bands > groups:
        _fail(f"{bands_key} = {bands} > {groups_key} = {groups}: amplified banded MF needs at most b bands (one {unit}'s participations, "
              f"b steps apart, must touch disjoint rows of C); use {groups_key} >= {bands} or fewer bands")


class CyclicPoissonSchedule:
    """Cyclic Poisson sampling of N units in b groups, m expected per step (module docstring):
    jax-privacy's ``CyclicPoissonSampling`` with ``PartitionType.INDEPENDENT``, drawn from
    ``default_rng([seed, CYCLIC_POISSON_STREAM])``. ``sample(t)``: the sorted unit indices of step
    t (0 <= t <= steps), a pure function of (seed, t): the sampler's draws are sequential, so the
    last ``KEPT`` batches are kept and an older step is drawn again from the start."""

    KEPT = 64

    sampling = CYCLIC_POISSON

    def __init__(self, population: int, cohort: int, groups: int, steps: int, seed: int, unit: str = "user"):
        self.population, self.cohort, self.groups, self.steps, self.seed, self.unit = int(population), int(cohort), int(groups), int(steps), seed, unit
        if not 1 <= self.groups <= self.population:
            _fail(f"groups must be in [1, N = {self.population}] for cyclic Poisson sampling, got {self.groups}")
        per_group = self.population // self.groups
        if not 1 <= self.cohort <= per_group:
            _fail(f"cyclic Poisson sampling of {self.cohort} {unit}s expected per step from b = {self.groups} groups needs N // b >= {self.cohort}, "
                  f"but {self.population} {unit}s make groups of {per_group}; use at most {self.population // max(self.cohort, 1)} groups or a smaller cohort")
        self._kept: dict[int, np.ndarray] = {}
        self._it = None
        self._next = 0  # the step the iterator yields next

    @property
    def m(self) -> int:
        """The expected (public) number of units per step: the denominator."""
        return self.cohort

    @property
    def sampling_probability(self) -> float:
        """q = m / (N // b): each eligible unit's probability of taking part in a step."""
        return self.cohort / (self.population // self.groups)

    @property
    def max_participations(self) -> int:
        """k = ceil(n / b): the most steps any unit can take part in over the planned steps."""
        return math.ceil(self.steps / self.groups)

    @property
    def selection(self) -> CyclicPoissonSampling:
        """jax-privacy's batch selection of this schedule (steps + 1 batches: steps 0..n)."""
        from jax_privacy.batch_selection import CyclicPoissonSampling, PartitionType

        return CyclicPoissonSampling(
            sampling_prob=self.sampling_probability, iterations=self.steps + 1, cycle_length=self.groups, partition_type=PartitionType.INDEPENDENT
        )

    def sample(self, step: int) -> np.ndarray:
        step = int(step)
        if not 0 <= step <= self.steps:
            _fail(f"step {step} is outside the cyclic Poisson schedule of {self.steps} steps")
        if step in self._kept:
            return self._kept[step]
        if self._it is None or step < self._next:
            self._it = self.selection.batch_iterator(self.population, np.random.default_rng([self.seed, CYCLIC_POISSON_STREAM]))
            self._next, self._kept = 0, {}
        while self._next <= step:
            self._kept[self._next] = np.sort(np.asarray(next(self._it), np.int64))
            self._kept.pop(self._next - self.KEPT, None)
            self._next += 1
        return self._kept[step]

    def check(self, key: str, bands: int, max_participations: int | None, min_separation: int | None) -> None:
        """Refuse (one line, naming ``key``; "--": the CLI's options) a schedule that breaks the
        participation: more bands than groups, fewer groups than ``min_separation``, a unit taking
        part more than ``max_participations`` times."""
        cli = key == "--"
        name = (lambda k: f"--{k.replace('_', '-')}") if cli else (lambda k: f"{key}.{k}")
        refuse_bands_above_groups(bands, self.groups, self.unit, name("bands"), name("groups"))
        if min_separation is not None and self.groups < min_separation and self.max_participations > 1:  # once each: any separation holds
            _fail(f"{name('min_separation')} = {min_separation}: {name('groups')} = {self.groups} lets one {self.unit} take part again after "
                  f"{self.groups} steps; use {name('groups')} >= {min_separation}")
        k = self.max_participations
        if max_participations is not None and k > max_participations:
            _fail(f"{name('max_participations')} = {max_participations}: {self.steps} steps over b = {self.groups} groups let one {self.unit} take part "
                  f"up to {k} times; use at most {max_participations * self.groups} steps or more groups")


@functools.lru_cache(maxsize=256)
def column_norm(coefs: tuple[float, ...], steps: int) -> float:
    """c_max: the largest L2 column norm of the n x n banded Toeplitz C with first-column bands
    ``coefs`` (jax-privacy's single-participation ``toeplitz.sensitivity_squared``, float64)."""
    from jax_privacy.matrix_factorization import toeplitz

    with jax.enable_x64(True):
        return math.sqrt(float(toeplitz.sensitivity_squared(jnp.asarray(coefs, jnp.float64), n=int(steps))))


@dataclass(frozen=True)
class AmplifiedBandMF:
    """``steps`` steps of banded MF (bands ``coefs``) under cyclic Poisson sampling: the k-fold
    Poisson-subsampled Gaussian of the module docstring, add-or-remove-one unit.

    ``noise_multiplier``: sigma of each i.i.d. draw Z_t, over the clip norm; ``batch``: m, the
    expected units per step; ``groups``: b. Same interface as
    :class:`~fedpriv.privacy.accounting.GaussianSteps` for the ledger, budget and accountant."""

    noise_multiplier: float
    population: int
    batch: float
    steps: int
    unit: str
    groups: int
    coefs: tuple[float, ...]
    sampling: str = CYCLIC_POISSON  # a field, so that every ledger entry names its participation schema

    def __post_init__(self) -> None:
        if self.sampling != CYCLIC_POISSON:
            _fail(f"amplified banded MF is accounted for sampling {CYCLIC_POISSON!r}, got {self.sampling!r}")
        z = self.noise_multiplier
        if not (isinstance(z, (int, float)) and math.isfinite(z) and MIN_NOISE_MULTIPLIER <= z <= MAX_NOISE_MULTIPLIER):
            _fail(f"noise_multiplier must be in [{MIN_NOISE_MULTIPLIER:g}, {MAX_NOISE_MULTIPLIER:g}], got {z}")
        if not (isinstance(self.steps, int) and self.steps >= 1):
            _fail(f"steps must be an integer >= 1, got {self.steps}")
        if self.unit not in ("example", "user"):
            _fail(f"unit must be 'example' or 'user', got {self.unit!r}")
        if not (isinstance(self.groups, int) and isinstance(self.population, int) and 1 <= self.groups <= self.population):
            _fail(f"groups must be an integer in [1, N = {self.population}], got {self.groups}")
        if not self.coefs or any(not (math.isfinite(c) and c >= 0) for c in self.coefs):
            _fail(f"coefs must be the non-negative bands of C, got {self.coefs}")
        refuse_bands_above_groups(len(self.coefs), self.groups, self.unit)
        if not 0.0 < self.sampling_probability <= 1.0:
            _fail(f"q = m / (N // b) = {self.batch:g} / {self.population // self.groups} must be in (0, 1]")

    @staticmethod
    def of(strategy: Strategy, noise_multiplier: float, schedule: CyclicPoissonSchedule) -> "AmplifiedBandMF":
        if strategy.mechanism != "banded-mf":
            _fail(f"cyclic Poisson sampling amplifies banded MF only; {strategy.mechanism} has infinitely many bands (use sampling = 'cyclic')")
        return AmplifiedBandMF(float(noise_multiplier), schedule.population, float(schedule.cohort), schedule.steps, schedule.unit, schedule.groups, strategy.coefs)

    # ---- what the ledger, budget and accountant read ----------------------------------------------
    noised_shards = 1
    noised_micro_steps = 1

    @property
    def strategy(self) -> Strategy:
        return Strategy("banded-mf", self.coefs)

    @property
    def relation(self) -> str:
        return ADD_OR_REMOVE

    @property
    def effective_noise_multiplier(self) -> float:
        return self.noise_multiplier

    @property
    def sampling_probability(self) -> float:
        """q = m / (N // b)."""
        return self.batch / (self.population // self.groups)

    @property
    def max_participations(self) -> int:
        return math.ceil(self.steps / self.groups)

    @property
    def sensitivity_in_clip_norms(self) -> float:
        """c_max over the recorded steps: the sensitivity of one participation, in clip norms."""
        return column_norm(self.coefs, self.steps)

    @property
    def amplified_multiplier(self) -> float:
        """sigma / c_max: the noise multiplier of each Poisson-subsampled Gaussian."""
        return self.noise_multiplier / self.sensitivity_in_clip_norms

    def sampling_text(self) -> str:
        n, b, q = self.population, self.groups, self.sampling_probability
        return (
            f"{self.strategy.describe()}; cyclic Poisson participation (amplified banded MF): each of the {n} {self.unit}s in one of b = {b} groups "
            f"drawn independently once (seeded), group t mod b eligible at step t, each eligible {self.unit} taking part with q = {q:.6g} "
            f"({self.batch:g} expected per step): each {self.unit} at most k = {self.max_participations} times, at least b = {b} steps apart; "
            f"{len(self.coefs)} band(s) <= b, so k-fold Poisson-subsampled Gaussian with multiplier sigma / {self.sensitivity_in_clip_norms:.6g} "
            f"(C's largest column norm)"
        )

    def basis(self) -> str:
        """The short form (no k: the budget's event is one step; the guarantee gives k of the steps recorded)."""
        return f"{self.unit}-level, {ADD_OR_REMOVE}, banded MF cyclic Poisson (q = {self.sampling_probability:.4g}, b = {self.groups})"

    def notes(self) -> tuple[str, ...]:
        return (
            f"amplified banded MF (Choquette-Choo et al. 2023, Theorem 4): {self.max_participations} Poisson-subsampled Gaussian(s) with q = "
            f"{self.sampling_probability:.6g} and noise multiplier sigma/c_max = {self.noise_multiplier:g}/{self.sensitivity_in_clip_norms:.6g} = "
            f"{self.amplified_multiplier:.6g} (jax-privacy amplified_bandmf_event)",
        )

    def dp_event(self) -> dp_accounting.DpEvent:
        from jax_privacy.experimental.accounting import amplified_bandmf_event

        return amplified_bandmf_event(self.amplified_multiplier, self.steps, num_bands=self.groups, sampling_prob=self.sampling_probability)

    def with_steps(self, steps: int) -> "AmplifiedBandMF":
        return replace(self, steps=steps)

    def same_mechanism(self, other: object) -> bool:
        return isinstance(other, AmplifiedBandMF) and self.with_steps(1) == other.with_steps(1)

    @classmethod
    def from_json(cls, raw: dict) -> "AmplifiedBandMF":
        raw = dict(raw)
        raw["coefs"] = tuple(float(x) for x in raw["coefs"])
        return cls(**raw)
