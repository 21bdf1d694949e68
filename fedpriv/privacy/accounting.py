"""Privacy accounting on dp-accounting 0.6.0: events, answers, calibration.

A :class:`GaussianSteps` is a run of identical steps (DP-SGD) or rounds (DP-FedAvg) of the
sampled Gaussian mechanism over *units* (examples, or users), each unit's contribution clipped to
L2 norm C and N(0, (sigma*C)^2) noise added per coordinate. What an epsilon means depends on
three things, which every :class:`PrivacyAnswer` states:

* the **neighbouring relation**: add-or-remove-one unit (Poisson sampling, no sampling) or
  replace-one unit (fixed-size samples without replacement). Under replace-one the clipped sum
  changes by up to 2C, so the Gaussian event is accounted with noise multiplier sigma/2;
* the **sampling**: Poisson with probability q = B/N (the batch's size is random; the trainer
  divides by the expected size B), fixed-size samples of exactly B of N without replacement, or
  none (every unit in every step);
* the **accountant**: RDP (with its optimal order) or PLD. dp-accounting has no PLD that bounds sampling
  without replacement under replace-one composed over steps (its REPLACE_SPECIAL is Poisson
  add/remove, its sampled REPLACE_ONE is Poisson substitution; docs/privacy.md), so fixed-size
  events are RDP only. PLD's work grows with 1/sigma^2 and
  with epsilon (its grid spans the privacy loss), so it is refused, with a pointer to RDP, where
  it would not answer in seconds: a sampled event with a noise multiplier per unit of
  sensitivity below ``PLD_MIN_NOISE`` or an RDP epsilon above ``PLD_MAX_EPSILON`` (a guarantee
  that weak says nothing; RDP states it), or an unsampled one (a single Gaussian) whose
  multiplier is below ``PLD_MIN_NOISE_UNSAMPLED``.

Noise drawn independently on P shards and/or on each of T accumulation micro-steps and then
summed/averaged into one logical step is N(0, P*T*(sigma*C)^2) on the logical clipped sum: the
logical step's noise multiplier is sigma*sqrt(P*T) (Hoory et al. 2021, eq. 3). Fields
``noised_shards`` and ``noised_micro_steps`` say how many independent draws a step sums;
the default 1 is "noise added once to the logical batch".
"""

from __future__ import annotations

from collections.abc import Callable

import functools
import math
import numbers
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Literal

import numpy as np

from fedpriv.errors import PrivacyParameterError

# dp_accounting (with scipy.signal and scipy.stats: about 1.5 s) is imported where an epsilon is
# computed, not here: every CLI command, ClientApp process and Ray actor imports this module,
# most of them never account (docs/architecture.md, "Imports").
if TYPE_CHECKING:
    import dp_accounting

Sampling = Literal["poisson", "fixed", "none"]
Unit = Literal["example", "user"]
AccountantName = Literal["rdp", "pld"]

ADD_OR_REMOVE = "add-or-remove-one"
REPLACE_ONE = "replace-one"
#: dp_accounting's DEFAULT_RDP_ORDERS (written out the same way; tests/privacy/test_accounting.py
#: checks they are equal) and two higher orders for small epsilons over many steps.
RDP_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024]) + (2048, 4096)
PLD_DISCRETIZATION = 1e-4
MIN_NOISE_MULTIPLIER = 1e-3
#: Above it epsilon is 0 to float precision, and the RDP accountant's sigma**2 overflows near 1e154.
MAX_NOISE_MULTIPLIER = 1e6
#: PLD's bounds (see the module docstring). Measured on a 2-core CPU: inside them at most about
#: 10 s and 1.4 GB; sigma 0.1, q = 0.1 over 100 steps (RDP epsilon 3,100) took 39 s and 1.6 GB,
#: sigma 0.01 did not finish.
PLD_MIN_NOISE = 0.3
PLD_MAX_EPSILON = 100.0
PLD_MIN_NOISE_UNSAMPLED = 0.04

_SAMPLING_TEXT = {
    "poisson": "Poisson sampling, each {unit} independently with q = {q:.6g} (expected batch {batch:g} of {population})",
    "fixed": "fixed-size batches of exactly {batch:g} {unit}s of {population}, sampled without replacement (q = {q:.6g})",
    "none": "no sampling amplification: every one of the {population} {unit}s in every step",
}


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise PrivacyParameterError(message)


def _whole(x: object) -> bool:
    """``x`` is a whole number (an integer, or a real such as 4.0; not inf or nan, which int() cannot take)."""
    return isinstance(x, numbers.Integral) or (isinstance(x, numbers.Real) and math.isfinite(x) and int(x) == x)


@dataclass(frozen=True)
class GaussianSteps:
    """``steps`` identical steps/rounds of the (sampled) Gaussian mechanism.

    ``noise_multiplier`` is sigma of each independent noise draw, relative to the clip norm C;
    ``batch`` is B (expected size under Poisson, exact size under fixed); ``population`` is N.
    """

    sampling: Sampling
    noise_multiplier: float
    population: int
    batch: float
    steps: int
    unit: Unit = "example"
    noised_shards: int = 1
    noised_micro_steps: int = 1

    def __post_init__(self) -> None:
        _check(self.sampling in ("poisson", "fixed", "none"), f"sampling must be 'poisson', 'fixed' or 'none', got {self.sampling!r}")
        _check(self.unit in ("example", "user"), f"unit must be 'example' or 'user', got {self.unit!r}")
        _check(
            isinstance(self.noise_multiplier, (int, float)) and math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0,
            f"noise_multiplier must be > 0 (finite) where noise is required, got {self.noise_multiplier}",
        )
        _check(
            self.noise_multiplier >= MIN_NOISE_MULTIPLIER,
            f"noise_multiplier must be >= {MIN_NOISE_MULTIPLIER:g} (below it epsilon is astronomically large and the accountants lose precision), got {self.noise_multiplier:g}",
        )
        _check(
            self.noise_multiplier <= MAX_NOISE_MULTIPLIER,
            f"noise_multiplier must be <= {MAX_NOISE_MULTIPLIER:g} (above it epsilon is 0 to float precision), got {self.noise_multiplier:g}",
        )
        _check(isinstance(self.population, int) and self.population >= 1, f"population (N) must be an integer >= 1, got {self.population}")
        _check(isinstance(self.steps, int) and self.steps >= 1, f"steps must be an integer >= 1, got {self.steps}")
        _check(_whole(self.noised_shards) and self.noised_shards >= 1, f"noised_shards (P) must be an integer >= 1, got {self.noised_shards}")
        _check(_whole(self.noised_micro_steps) and self.noised_micro_steps >= 1, f"noised_micro_steps (T) must be an integer >= 1, got {self.noised_micro_steps}")
        if self.sampling == "none":
            _check(self.batch == self.population, f"with no sampling the batch is the whole population: batch must be {self.population}, got {self.batch}")
        _check(self.batch > 0, f"batch must be > 0, got {self.batch}")
        if self.sampling == "fixed":
            _check(float(self.batch).is_integer(), f"a fixed-size batch must be a whole number of {self.unit}s, got {self.batch}")
            _check(self.batch <= self.population, f"cannot sample m = {self.batch:g} {self.unit}s without replacement from N = {self.population}: need m <= N")
        q = self.batch / self.population
        _check(0.0 < q <= 1.0, f"sampling probability q = batch/population must be in (0, 1], got {self.batch:g}/{self.population} = {q:.6g}")

    # ---- derived ---------------------------------------------------------------------------
    @property
    def sampling_probability(self) -> float:
        return self.batch / self.population

    @property
    def relation(self) -> str:
        return REPLACE_ONE if self.sampling == "fixed" else ADD_OR_REMOVE

    @property
    def effective_noise_multiplier(self) -> float:
        """Noise std of one logical step's clipped sum, over C: sigma*sqrt(P*T)."""
        return self.noise_multiplier * math.sqrt(self.noised_shards * self.noised_micro_steps)

    @property
    def sensitivity_in_clip_norms(self) -> int:
        """L2 sensitivity of the clipped sum, in units of C: 1 (add/remove), 2 (replace-one)."""
        return 2 if self.relation == REPLACE_ONE else 1

    def sampling_text(self) -> str:
        return _SAMPLING_TEXT[self.sampling].format(
            unit=self.unit, q=self.sampling_probability, batch=self.batch, population=self.population
        )

    def basis(self) -> str:
        """The short form of the assumptions behind an epsilon, printed next to it:
        e.g. ``user-level, replace-one, 40 of 262 without replacement``."""
        if self.sampling == "fixed":
            how = f"{self.batch:g} of {self.population} without replacement"
        elif self.sampling == "poisson":
            how = f"Poisson q = {self.sampling_probability:.4g}"
        else:
            how = "no sampling"
        return f"{self.unit}-level, {self.relation}, {how}"

    def dp_event(self) -> dp_accounting.DpEvent:
        """The dp-accounting event of all ``steps`` (Gaussian std relative to the sensitivity)."""
        import dp_accounting

        gaussian = dp_accounting.GaussianDpEvent(self.effective_noise_multiplier / self.sensitivity_in_clip_norms)
        if self.sampling == "poisson":
            one = dp_accounting.PoissonSampledDpEvent(self.sampling_probability, gaussian)
        elif self.sampling == "fixed":
            one = dp_accounting.SampledWithoutReplacementDpEvent(self.population, int(self.batch), gaussian)
        else:
            # T unsampled Gaussian steps are exactly one Gaussian with multiplier z/sqrt(T); saying so
            # keeps the PLD accountant fast (composing the PLD T times is slow and only approximate).
            return dp_accounting.GaussianDpEvent(gaussian.noise_multiplier / math.sqrt(self.steps))
        return dp_accounting.SelfComposedDpEvent(one, self.steps)

    def with_steps(self, steps: int) -> "GaussianSteps":
        return replace(self, steps=steps)

    def same_mechanism(self, other: "GaussianSteps") -> bool:
        return self.with_steps(1) == other.with_steps(1)


@dataclass(frozen=True)
class PrivacyAnswer:
    """An (epsilon, delta) guarantee with everything it assumes."""

    epsilon: float
    delta: float
    accountant: str  # "RDP" or "PLD"
    relation: str
    unit: str
    sampling: str
    steps: int
    noise_multiplier: float
    effective_noise_multiplier: float
    rdp_order: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def describe(self) -> str:
        order = f", optimal order {self.rdp_order:g}" if self.rdp_order is not None else ""
        return (
            f"epsilon = {self.epsilon:.4g} at delta = {self.delta:.3g} ({self.accountant}{order}); "
            f"{self.unit}-level, {self.relation} {self.unit}; {self.sampling}; {self.steps} steps; "
            f"noise multiplier {self.noise_multiplier:g} (effective {self.effective_noise_multiplier:g})"
        )

    def to_json(self) -> dict:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["guarantee"] = self.describe()
        return d


def check_delta(delta: float) -> None:
    _check(isinstance(delta, (int, float)) and 0.0 < delta < 1.0, f"delta must be in (0, 1), got {delta}")


def check_epsilon(epsilon: float) -> None:
    _check(isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0, f"epsilon must be > 0 (finite), got {epsilon}")


def _relation_enum(relation: str) -> dp_accounting.NeighboringRelation:
    import dp_accounting

    return dp_accounting.NeighboringRelation.REPLACE_ONE if relation == REPLACE_ONE else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


def _events(events) -> list:
    """A list of events from one event (a :class:`GaussianSteps`, or a correlated-noise event of
    :mod:`fedpriv.privacy.correlated`, which has the same interface) or a list of them."""
    return list(events) if isinstance(events, (list, tuple)) else [events]


def common_relation(events: list[GaussianSteps]) -> str:
    """The one neighbouring relation of a composition (mixing relations is refused)."""
    _check(len(events) > 0, "nothing to account: no steps recorded")
    relations = {e.relation for e in events}
    units = {e.unit for e in events}
    _check(len(relations) == 1, f"cannot compose events under different neighbouring relations {sorted(relations)}")
    _check(len(units) == 1, f"cannot compose events over different units {sorted(units)}")
    return relations.pop()


def supports_pld(events: list[GaussianSteps]) -> bool:
    """dp-accounting has PLD for Poisson-sampled and unsampled Gaussians, not for sampling without replacement."""
    return all(e.sampling != "fixed" for e in events)


@functools.lru_cache(maxsize=4096)
def _rdp_of_event(event: dp_accounting.DpEvent, relation: dp_accounting.NeighboringRelation) -> np.ndarray:
    """The RDP vector (at :data:`RDP_ORDERS`) of one event, from dp_accounting's RdpAccountant
    (remembered: read-only). A Gaussian sampled without replacement (replace-one) or by Poisson
    sampling (add-or-remove-one), a fraction of a second of CPU per event even so, goes through
    :func:`rdp_sample_wor_gaussian` or :func:`rdp_poisson_gaussian`: dp_accounting's formulas and
    operations, the same floats, several times faster."""
    import dp_accounting

    from fedpriv.privacy.rdp_poisson import rdp_poisson_gaussian
    from fedpriv.privacy.rdp_wor import rdp_sample_wor_gaussian

    effective = dp_accounting.rdp.rdp_privacy_accountant._effective_gaussian_noise_multiplier
    wor = isinstance(event, dp_accounting.SampledWithoutReplacementDpEvent) and relation is dp_accounting.NeighboringRelation.REPLACE_ONE
    poisson = isinstance(event, dp_accounting.PoissonSampledDpEvent) and relation is dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    sigma = effective(event.event) if wor or poisson else None
    if isinstance(sigma, float):  # what RdpAccountant.compose does for this event, step by step
        orders = np.array(RDP_ORDERS)
        rdp = np.zeros_like(RDP_ORDERS, dtype=np.float64)
        if wor:
            rdp += 1 * rdp_sample_wor_gaussian(q=event.sample_size / event.source_dataset_size, sigma=sigma, orders=orders)
        else:
            rdp += 1 * rdp_poisson_gaussian(q=event.sampling_probability, sigma=sigma, orders=orders)
    else:
        acc = dp_accounting.rdp.RdpAccountant(RDP_ORDERS, relation)
        acc.compose(event)
        rdp = acc.rdp.copy()
    rdp.flags.writeable = False
    return rdp


class ComposedRdp:
    """The RDP accountant's answer for a composition, with each leaf event's RDP vector computed
    once per process (:func:`_rdp_of_event`). It composes as dp_accounting's RdpAccountant does
    (a self-composed event's RDP is its count times its event's, a composed event's the sum of its
    parts', in the same order), so its epsilon and delta are dp_accounting's to the bit (tested);
    an epsilon curve over step counts then costs one dp_accounting call per mechanism."""

    def __init__(self, events: list[GaussianSteps], relation: dp_accounting.NeighboringRelation):
        self.orders = np.array(RDP_ORDERS)
        self.rdp = np.zeros_like(self.orders, dtype=np.float64)
        for e in events:
            self._add(e.dp_event(), 1, relation)

    def _add(self, event: dp_accounting.DpEvent, count: int, relation: dp_accounting.NeighboringRelation) -> None:
        import dp_accounting

        if isinstance(event, dp_accounting.SelfComposedDpEvent):
            self._add(event.event, event.count * count, relation)
        elif isinstance(event, dp_accounting.ComposedDpEvent):
            for part in event.events:
                self._add(part, count, relation)
        else:
            try:
                rdp = _rdp_of_event(event, relation)
            except TypeError:  # an event with a list field is unhashable: computed, not remembered
                rdp = _rdp_of_event.__wrapped__(event, relation)
            self.rdp += count * rdp

    def get_epsilon_and_optimal_order(self, delta: float) -> tuple[float, float]:
        from dp_accounting.rdp import rdp_privacy_accountant

        return rdp_privacy_accountant.compute_epsilon(self.orders, self.rdp, delta)

    def get_delta_and_optimal_order(self, epsilon: float) -> tuple[float, float]:
        from dp_accounting.rdp import rdp_privacy_accountant

        return rdp_privacy_accountant.compute_delta(self.orders, self.rdp, epsilon)


@functools.lru_cache(maxsize=16)  # a run asks for one or two leaves; a calibration's bisection for ~40 it never asks again
def _leaf_pld(sigma: float, q: float | None, count: int, relation: dp_accounting.NeighboringRelation):
    """One leaf's PLD as dp_accounting's PLDAccountant builds it (:class:`ComposedPld`): a
    Poisson-sampled Gaussian (``q``) before its self-composition, or an unsampled Gaussian of
    ``count`` steps (one Gaussian of noise sigma / sqrt(count)). Remembered: building a sampled
    Gaussian's PLD is most of an epsilon's cost (0.3-0.5 s at the arXiv grid's q = 0.097 and
    sigma = 1.1) and a run asks for it after every step with the same sigma and q. PLD objects
    are not changed by composing them."""
    from dp_accounting.pld import privacy_loss_distribution

    if q is not None:
        return privacy_loss_distribution.from_gaussian_mechanism(standard_deviation=sigma, value_discretization_interval=PLD_DISCRETIZATION,
                                                                 sampling_prob=q, neighboring_relation=relation)
    return privacy_loss_distribution.from_gaussian_mechanism(standard_deviation=sigma / math.sqrt(count), value_discretization_interval=PLD_DISCRETIZATION,
                                                             neighboring_relation=relation)


class ComposedPld:
    """dp_accounting's PLDAccountant for the events fedpriv composes (self-composed and composed
    events of Gaussians, Poisson-sampled or not), with each leaf's PLD built once per process
    (:func:`_leaf_pld`). It composes in dp_accounting's order and with its operations (identity,
    then each leaf's PLD, self-composed ``count`` times for a sampled one), so its epsilon and delta
    are dp_accounting's to the bit (tests/privacy/test_accounting.py). Any other event is composed
    by dp_accounting's accountant itself."""

    def __init__(self, events: list[GaussianSteps], relation: dp_accounting.NeighboringRelation):
        from dp_accounting.pld import PLDAccountant, privacy_loss_distribution

        self.relation, self.non_private, self.fallback = relation, False, None
        self.pld = privacy_loss_distribution.identity(value_discretization_interval=PLD_DISCRETIZATION)
        try:
            for e in events:
                self._add(e.dp_event(), 1)
        except _NotALeaf:
            self.fallback = PLDAccountant(relation, value_discretization_interval=PLD_DISCRETIZATION)
            for e in events:
                self.fallback.compose(e.dp_event())

    def _add(self, event: dp_accounting.DpEvent, count: int) -> None:
        import dp_accounting

        if isinstance(event, dp_accounting.SelfComposedDpEvent):
            self._add(event.event, event.count * count)
        elif isinstance(event, dp_accounting.ComposedDpEvent):
            for part in event.events:
                self._add(part, count)
        elif isinstance(event, dp_accounting.GaussianDpEvent):
            if event.noise_multiplier == 0:
                self.non_private = True
            else:
                self.pld = self.pld.compose(_leaf_pld(float(event.noise_multiplier), None, count, self.relation))
        elif isinstance(event, dp_accounting.PoissonSampledDpEvent) and isinstance(event.event, dp_accounting.GaussianDpEvent):
            if event.sampling_probability == 0:
                return
            if event.event.noise_multiplier == 0:
                self.non_private = True
            else:
                leaf = _leaf_pld(float(event.event.noise_multiplier), float(event.sampling_probability), 1, self.relation)
                self.pld = self.pld.compose(leaf.self_compose(count))
        else:
            raise _NotALeaf

    def get_epsilon(self, delta: float) -> float:
        if self.fallback is not None:
            return self.fallback.get_epsilon(delta)
        return math.inf if self.non_private else self.pld.get_epsilon_for_delta(delta)

    def get_delta(self, epsilon: float) -> float:
        if self.fallback is not None:
            return self.fallback.get_delta(epsilon)
        return 1.0 if self.non_private else self.pld.get_delta_for_epsilon(epsilon)


class _NotALeaf(Exception):
    """An event :class:`ComposedPld` does not compose itself."""


def _accountant(events: list[GaussianSteps], which: AccountantName):
    relation = _relation_enum(common_relation(events))
    if which == "rdp":
        return ComposedRdp(events, relation)
    elif which == "pld":
        _check(supports_pld(events), "the PLD accountant does not cover sampling without replacement (fixed-size batches; docs/privacy.md says why); use RDP")
        check_pld_cost(events)
        return ComposedPld(events, relation)
    raise PrivacyParameterError(f"accountant must be 'rdp' or 'pld', got {which!r}")


class PLDTooCostly(PrivacyParameterError):
    """The PLD accountant would not answer in bounded time and memory; RDP would."""


def check_pld_cost(events: list[GaussianSteps]) -> None:
    """Refuse (PLDTooCostly) a PLD computation outside PLD_MIN_NOISE and PLD_MAX_EPSILON."""
    for e in events:
        single = getattr(e, "gaussian_multiplier", None)  # a correlated-noise run: one unsampled Gaussian
        if single is not None:
            z, least = single, PLD_MIN_NOISE_UNSAMPLED
        else:
            z = e.effective_noise_multiplier / e.sensitivity_in_clip_norms / (math.sqrt(e.steps) if e.sampling == "none" else 1.0)
            least = PLD_MIN_NOISE_UNSAMPLED if e.sampling == "none" else PLD_MIN_NOISE
        if z < least:
            raise PLDTooCostly(f"the PLD accountant is bounded to noise multipliers >= {least} per unit of sensitivity here (got {z:.3g}: its grid would take minutes and gigabytes); use the RDP accountant")
    sampled = [e for e in events if e.sampling not in ("none", "cyclic")]
    rdp = epsilon_for(sampled, 1e-5, "rdp").epsilon if sampled else 0.0
    if rdp > PLD_MAX_EPSILON:
        raise PLDTooCostly(f"the PLD accountant is bounded to guarantees with RDP epsilon <= {PLD_MAX_EPSILON:g} at delta 1e-5 (got {rdp:.4g}: its grid would take minutes and gigabytes); use the RDP accountant")


def _summary(events: list[GaussianSteps]) -> dict:
    last = events[-1]
    steps = sum(e.steps for e in events)
    sampling = "; ".join(dict.fromkeys(e.sampling_text() for e in events))
    notes = []
    if last.relation == REPLACE_ONE:
        notes.append("replace-one: the clipped sum's sensitivity is 2C, accounted as noise multiplier sigma/2")
    if any(e.noised_shards * e.noised_micro_steps > 1 for e in events):
        notes.append("noise drawn on P shards x T micro-steps: effective multiplier sigma*sqrt(P*T) (Hoory et al. 2021, eq. 3)")
    for e in events:
        notes.extend(n for n in (e.notes() if hasattr(e, "notes") else ()) if n not in notes)
    if len({e.with_steps(1) for e in events}) > 1:
        notes.append(f"composition of {len(events)} runs with different parameters")
    return dict(
        relation=last.relation,
        unit=last.unit,
        sampling=sampling,
        steps=steps,
        noise_multiplier=last.noise_multiplier,
        effective_noise_multiplier=last.effective_noise_multiplier,
        notes=tuple(notes),
    )


#: epsilon_for's answers by the exact question (``repr`` of the events, delta and accountant: 1 and
#: 1.0 are different keys, so an answer echoes its question's own numbers). The accountants are
#: pure functions of these; a calibration's bisection, a config check and the runs of one process
#: (``fedpriv run``, the tests) ask the same questions again, and an RDP answer for sampling
#: without replacement costs about a second of CPU.
_EPSILON_ANSWERS: dict[str, PrivacyAnswer] = {}
_EPSILON_ANSWERS_MAX = 4096


def epsilon_for(events: list[GaussianSteps] | GaussianSteps, delta: float, accountant: AccountantName = "rdp") -> PrivacyAnswer:
    """epsilon at ``delta`` for the composition of ``events`` (remembered per process, see ``_EPSILON_ANSWERS``)."""
    events = _events(events)
    check_delta(delta)
    key = repr((events, delta, accountant))
    if key not in _EPSILON_ANSWERS:
        if len(_EPSILON_ANSWERS) >= _EPSILON_ANSWERS_MAX:
            _EPSILON_ANSWERS.clear()
        _EPSILON_ANSWERS[key] = _epsilon_for(events, delta, accountant)
    return _EPSILON_ANSWERS[key]


def _epsilon_for(events: list[GaussianSteps], delta: float, accountant: AccountantName) -> PrivacyAnswer:
    acc = _accountant(events, accountant)
    if accountant == "rdp":
        eps, order = acc.get_epsilon_and_optimal_order(delta)
        return PrivacyAnswer(float(eps), delta, "RDP", rdp_order=float(order), **_summary(events))
    return PrivacyAnswer(float(acc.get_epsilon(delta)), delta, "PLD", **_summary(events))


def delta_for(events: list[GaussianSteps] | GaussianSteps, epsilon: float, accountant: AccountantName = "rdp") -> PrivacyAnswer:
    """delta at ``epsilon`` for the composition of ``events``."""
    events = _events(events)
    check_epsilon(epsilon)
    acc = _accountant(events, accountant)
    if accountant == "rdp":
        delta, order = acc.get_delta_and_optimal_order(epsilon)
        return PrivacyAnswer(epsilon, float(delta), "RDP", rdp_order=float(order), **_summary(events))
    return PrivacyAnswer(epsilon, float(acc.get_delta(epsilon)), "PLD", **_summary(events))


def available_accountants(events: list[GaussianSteps] | GaussianSteps) -> list[str]:
    events = _events(events)
    return ["rdp", "pld"] if supports_pld(events) else ["rdp"]


def calibrate_noise_multiplier(
    template: GaussianSteps,
    target_epsilon: float,
    delta: float,
    accountant: AccountantName = "rdp",
    rel_tol: float = 1e-4,
) -> tuple[float, PrivacyAnswer]:
    """The smallest noise multiplier sigma (per draw, as ``template.noise_multiplier`` means it)
    whose epsilon at ``delta`` is <= ``target_epsilon``, by bisection over the accountant, to
    relative tolerance ``rel_tol``. Returns sigma and the answer at sigma, whose epsilon is checked
    to be <= ``target_epsilon`` with the accountant asked for (refused otherwise: the bisection
    assumes epsilon decreasing in sigma and, for PLD, PLD never above RDP)."""
    check_epsilon(target_epsilon)
    check_delta(delta)

    def eps(sigma: float) -> float:
        try:
            return epsilon_for(replace(template, noise_multiplier=sigma), delta, accountant).epsilon
        except PLDTooCostly:  # PLD's bounds: sigma this small is treated as missing the target (safe: sigma only grows)
            return math.inf

    if accountant == "pld":  # PLD is never above RDP (tests/privacy), so RDP's sigma reaches the target
        hi, _ = calibrate_noise_multiplier(template, target_epsilon, delta, "rdp", rel_tol)
        try:
            at_rdp = epsilon_for(replace(template, noise_multiplier=hi), delta, "pld").epsilon
        except PLDTooCostly as e:  # the PLD's cost bound, not its epsilon, refuses RDP's sigma
            raise PrivacyParameterError(f"calibrating with PLD starts from the RDP-calibrated noise multiplier {hi:.6g}: {e}") from None
        _check(at_rdp <= target_epsilon, f"the PLD epsilon {at_rdp:.6g} at the RDP-calibrated noise multiplier {hi:.6g} is above the target {target_epsilon}; use accountant = 'rdp'")
        lo = hi / 2
        while eps(lo) <= target_epsilon:
            lo, hi = lo / 2, lo
            _check(lo > 1e-3, f"epsilon {target_epsilon} is reached with noise multiplier below 1e-3; the target is too loose to calibrate")
    else:
        lo, hi = 1e-3, 1.0
        while eps(hi) > target_epsilon:
            lo, hi = hi, hi * 2
            _check(hi < 1e6, f"no noise multiplier below 1e6 reaches epsilon {target_epsilon} at delta {delta}")
        if eps(lo) <= target_epsilon:
            raise PrivacyParameterError(f"epsilon {target_epsilon} is reached with noise multiplier below {lo}; the target is too loose to calibrate")
    while hi - lo > rel_tol * hi:
        mid = math.sqrt(lo * hi) if hi / lo > 4 else (lo + hi) / 2
        if eps(mid) > target_epsilon:
            lo = mid
        else:
            hi = mid
    answer = epsilon_for(replace(template, noise_multiplier=hi), delta, accountant)
    _check(answer.epsilon <= target_epsilon, f"calibration: epsilon {answer.epsilon:.6g} ({accountant.upper()}) at the chosen noise multiplier {hi:.6g} is above the target {target_epsilon}")
    return hi, answer


def max_steps_within(event: GaussianSteps, budget: float, delta: float, accountant: str, upper: int) -> int:
    """The largest number of steps (<= upper) whose epsilon at ``delta`` is <= ``budget``."""
    def eps(k: int) -> float:
        return epsilon_for(event.with_steps(k), delta, accountant).epsilon  # type: ignore[arg-type]

    if eps(1) > budget:
        return 0
    if eps(upper) <= budget:
        return upper
    lo, hi = 1, upper  # eps(lo) <= budget < eps(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if eps(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def resolve_noise_multiplier(
    template: GaussianSteps,
    noise_multiplier: float | None,
    target_epsilon: float | None,
    delta: float,
    accountant: AccountantName,
    say: Callable[[str], None],
) -> float:
    """sigma as given, or calibrated on ``template`` (all planned steps) to ``target_epsilon``."""
    if target_epsilon is None:
        return float(noise_multiplier)
    sigma, ans = calibrate_noise_multiplier(template, target_epsilon, delta, accountant)
    say(f"calibrated noise multiplier {sigma:.4f} per draw for {ans.describe()}")
    return sigma


def steps_within_budget(
    event: GaussianSteps, budget: float, delta: float, accountant: AccountantName, planned: int, key: str, step_word: str, say: Callable[[str], None]
) -> int:
    """How many of the ``planned`` steps (rounds) fit in the epsilon ``budget``; refuses a budget
    that not even one fits (PrivacyParameterError naming the config ``key``)."""
    allowed = max_steps_within(event, budget, delta, accountant, planned)
    if allowed == 0:
        raise PrivacyParameterError(f"{key} = {budget}: even one {step_word} exceeds it at delta {delta}")
    if allowed < planned:
        say(f"the epsilon budget {budget} allows {allowed} of the {planned} {step_word}s")
    return allowed


def batch_size_sweep(
    template: GaussianSteps,
    batches: list[float],
    delta: float,
    epochs: float | None = None,
    accountant: AccountantName = "rdp",
) -> list[dict]:
    """For choosing B under a budget: scale sigma with sqrt(B) from the template,
    sigma_B = sigma_0 * sqrt(B / B_0), and report epsilon for each B. With ``epochs`` the number of
    steps follows B as a central run counts them (steps = ceil(epochs * ceil(N / B)),
    :func:`fedpriv.central.sgd.total_steps`); otherwise it stays the template's."""
    check_delta(delta)
    _check(epochs is None or (isinstance(epochs, (int, float)) and math.isfinite(epochs) and epochs > 0), f"epochs must be > 0 (finite), got {epochs}")
    rows = []
    for b in batches:
        _check(isinstance(b, (int, float)) and math.isfinite(b) and b > 0, f"batch must be > 0 (finite), got {b}")
        sigma = template.noise_multiplier * math.sqrt(b / template.batch)
        if epochs is not None:
            _check(math.isfinite(epochs * template.population / b), f"epochs * N / B = {epochs:g} * {template.population} / {b:g} steps overflows")
        steps = template.steps if epochs is None else max(1, math.ceil(epochs * math.ceil(template.population / b)))
        ev = replace(template, batch=b, noise_multiplier=sigma, steps=steps)
        ans = epsilon_for(ev, delta, accountant)
        rows.append({"batch": b, "noise_multiplier": sigma, "steps": steps, "epsilon": ans.epsilon, "answer": ans.to_json()})
    return rows
