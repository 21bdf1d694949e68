"""Differentially private word histograms, the input of DP vocabularies.

Three mechanisms over a *stream* of word sequences (one list of words per example, never the
whole corpus in memory); each returns a :class:`DPHistogram` (noisy kept counts + the guarantee):

``gaussian`` (Hoory et al. 2021, Theorem 1 / Corollary 1, Appendix B)
    The text is cut into consecutive ``N``-word tuples (``partition="stream"``: the records
    concatenated in corpus order, as BERT packs its 256-token training examples, which is what the
    paper does; ``partition="example"``: each example cut on its own, so a tuple never mixes two
    examples; ``partition="user"``: each user is one tuple, and the sequences are then one word
    list per *user*, all its examples' words: its N most frequent distinct words, ties broken by
    first occurrence, each counted once). A tuple adds 1 to each *distinct* word it holds;
    N(0, sigma^2) is added to every nonzero count; counts below C are dropped. The protected unit
    is one tuple (added or removed); with ``partition="user"`` one user, the L2 sensitivity being
    sqrt(N) as for any tuple (at most N counts change by 1).
    Corollary 1: ``epsilon = sqrt(N)/sigma * sqrt(2 ln(1.25/delta))`` for ``0 < delta < 1.25 e^-1.5``.
    Theorem 1 (L2 bound k, L-inf bound m): ``epsilon = k/sigma * sqrt(2 ln(2.5/delta))``.

``laplace`` (Hoory et al. 2021 workshop version, section 3.2; Korolova et al. 2009; Bun et al. 2019)
    Each example counts each distinct word once (at most ``N`` distinct words per example, the
    rest ignored); Lap(2/eps') is added to every positive count; counts below
    ``1 + 2 ln(2/delta')/eps'`` are dropped. (eps', delta')-DP per word; (N eps', N delta')-DP per
    example by basic composition.

``count`` (Ponomareva et al. 2022, Algorithm 1, DP-SentencePiece)
    Each example adds its word *counts* (not capped at 1), truncated to its first ``N`` words so
    that its histogram has L2 and L-inf norm at most N (their Appendix B: k = m = N); Gaussian noise
    and threshold from Theorem 1 with k = m = N. Protects one example (added or removed).

The threshold. The papers print ``C = m + sigma * erfinv(1 - delta/N)`` (Corollary 1; Theorem 1
with ``delta/2N``) and use it: the paper's ``C = 982.5`` for ``N = 256, delta = 1e-9, sigma = 200``
is exactly that. But the proof needs ``P[N(0, sigma^2) > C - m] <= delta/N``, which holds for the
Gaussian quantile ``C = m + sigma * Phi^-1(1 - delta/N) = m + sigma * sqrt(2) * erfinv(1 - 2 delta/N)``
(1369.4 in that example), not for the printed erfinv form (whose tail is 4.6e-7, not 3.9e-12, per
word). ``threshold_rule="quantile"`` (the default) uses the quantile, so the stated delta holds;
``threshold_rule="paper"`` reproduces the printed formula and reports the delta it actually gives,
``delta + N * P[Z > erfinv(1 - delta/N)]`` (Corollary 1; ``delta/2 + N * tail`` for Theorem 1).

Parameters are refused before any work (:class:`~fedpriv.errors.PrivacyParameterError`). The Gaussian
forms also require ``epsilon < 1``: the Gaussian-mechanism bound both proofs use (Dwork & Roth 2014,
Theorem A.1) is proved only there.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, islice
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from fedpriv.errors import PrivacyParameterError

# scipy.special (about 0.4 s to import) is imported where used: docs/architecture.md, "Imports".

Mechanism = Literal["gaussian", "laplace", "count"]
MECHANISMS: tuple[str, ...] = ("gaussian", "laplace", "count")
THRESHOLD_RULES: tuple[str, ...] = ("quantile", "paper")
PARTITIONS: tuple[str, ...] = ("stream", "example", "user")

#: Corollary 1 holds for 0 < delta < 1.25 e^(-3/2) (Hoory et al. 2021, Appendix B).
COROLLARY1_DELTA_MAX = 1.25 * math.exp(-1.5)
DEFAULT_TUPLE_SIZE = 256


# ---- validation ----------------------------------------------------------------------------------
def _finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise PrivacyParameterError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise PrivacyParameterError(f"{name} must be finite, got {v}")
    return v


def _check_positive(name: str, value: object) -> float:
    v = _finite(name, value)
    if v <= 0:
        raise PrivacyParameterError(f"{name} must be > 0, got {v:g}")
    return v


def _check_delta(value: object, upper: float = 1.0, why: str = "") -> float:
    d = _finite("delta", value)
    if not 0.0 < d < upper:
        rng = "(0, 1)" if upper == 1.0 else f"(0, {upper:.6g})"
        raise PrivacyParameterError(f"delta must be in {rng}{why}, got {d:g}")
    return d


def _check_tuple_size(value: object, name: str = "tuple_size") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PrivacyParameterError(f"{name} (N) must be an integer >= 1, got {value!r}")
    if value < 1:
        raise PrivacyParameterError(f"{name} (N) must be an integer >= 1, got {value}")
    return int(value)


def _check_rule(rule: str) -> str:
    if rule not in THRESHOLD_RULES:
        raise PrivacyParameterError(f"threshold_rule must be one of {', '.join(THRESHOLD_RULES)}, got {rule!r}")
    return rule


def _check_epsilon_lt1(eps: float, what: str, sigma_min: float | None = None) -> None:
    if eps >= 1.0:
        hint = f" (sigma > {sigma_min:.6g} gives epsilon < 1)" if sigma_min is not None else ""
        raise PrivacyParameterError(
            f"epsilon must be in (0, 1) for {what}: the Gaussian-mechanism bound it rests on "
            f"(Dwork & Roth 2014, Theorem A.1) holds only there; got epsilon = {eps:.6g}{hint}"
        )


# ---- closed forms --------------------------------------------------------------------------------
def gaussian_tail_quantile(p: float) -> float:
    """z with P[N(0,1) > z] = p, i.e. Phi^-1(1 - p) = sqrt(2) erfinv(1 - 2p), computed without cancellation."""
    from scipy.special import ndtri

    return float(-ndtri(p))


def paper_erfinv(p: float) -> float:
    """erfinv(1 - p) as the papers print it (computed as erfcinv(p), exact for tiny p)."""
    from scipy.special import erfcinv

    return float(erfcinv(p))


def gaussian_tail(z: float) -> float:
    """P[N(0,1) > z]."""
    from scipy.special import erfc

    return float(0.5 * erfc(z / math.sqrt(2.0)))


def corollary1_epsilon(sigma: float, delta: float, tuple_size: int = DEFAULT_TUPLE_SIZE) -> float:
    """Corollary 1: ``epsilon = sqrt(N)/sigma * sqrt(2 ln(1.25/delta))`` (unitless; N words per tuple)."""
    return math.sqrt(tuple_size) / sigma * math.sqrt(2.0 * math.log(1.25 / delta))


def corollary1_sigma(epsilon: float, delta: float, tuple_size: int = DEFAULT_TUPLE_SIZE) -> float:
    """The inverse of :func:`corollary1_epsilon`: ``sigma = sqrt(N) * sqrt(2 ln(1.25/delta)) / epsilon``."""
    return math.sqrt(tuple_size) * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def corollary1_threshold(sigma: float, delta: float, tuple_size: int = DEFAULT_TUPLE_SIZE, rule: str = "quantile") -> float:
    """Corollary 1's C with m = 1 and per-new-word tail delta/N: ``1 + sigma * Phi^-1(1 - delta/N)``
    (``rule="quantile"``) or the printed ``1 + sigma * erfinv(1 - delta/N)`` (``rule="paper"``)."""
    p = delta / tuple_size
    z = gaussian_tail_quantile(p) if _check_rule(rule) == "quantile" else paper_erfinv(p)
    return 1.0 + sigma * z


def theorem1_epsilon(sigma: float, delta: float, k: float) -> float:
    """Theorem 1: ``epsilon = k/sigma * sqrt(2 ln(2.5/delta))`` (k: the L2 bound of one unit's histogram)."""
    return k / sigma * math.sqrt(2.0 * math.log(2.5 / delta))


def theorem1_sigma(epsilon: float, delta: float, k: float) -> float:
    """The inverse of :func:`theorem1_epsilon`: ``sigma = k * sqrt(2 ln(2.5/delta)) / epsilon``."""
    return k * math.sqrt(2.0 * math.log(2.5 / delta)) / epsilon


def theorem1_threshold(sigma: float, delta: float, m: float, tuple_size: int, rule: str = "quantile") -> float:
    """Theorem 1's C with per-new-word tail delta/(2N): ``m + sigma * Phi^-1(1 - delta/2N)``
    (``rule="quantile"``) or the printed ``m + sigma * erfinv(1 - delta/2N)`` (``rule="paper"``)."""
    p = delta / (2.0 * tuple_size)
    z = gaussian_tail_quantile(p) if _check_rule(rule) == "quantile" else paper_erfinv(p)
    return m + sigma * z


def laplace_scale(epsilon: float) -> float:
    """The Laplace scale b = 2/epsilon (replace-one neighbours change two counts by 1)."""
    return 2.0 / epsilon


def laplace_threshold(epsilon: float, delta: float) -> float:
    """The Laplace cut: ``1 + 2 ln(2/delta)/epsilon`` (counts below are dropped)."""
    return 1.0 + 2.0 * math.log(2.0 / delta) / epsilon


# ---- resolved parameters -------------------------------------------------------------------------
@dataclass(frozen=True)
class HistogramParams:
    """A mechanism's parameters, all resolved and checked before any work.

    ``epsilon``/``delta`` are the guarantee for the protected unit (a tuple for ``gaussian``, an
    example for ``laplace`` and ``count``); ``delta`` is the one actually guaranteed (for the Gaussian
    forms it exceeds ``delta_requested``, the caller's delta, only under ``threshold_rule="paper"``;
    for ``laplace`` the caller's delta is per word and ``delta`` is N times it). ``noise`` is sigma (Gaussian std,
    in counts) or the Laplace scale b (counts); ``threshold`` C is in counts.
    """

    mechanism: str
    epsilon: float
    delta: float
    delta_requested: float
    noise: float
    threshold: float
    tuple_size: int
    partition: str = "example"
    threshold_rule: str = "quantile"
    epsilon_per_word: float | None = None
    delta_per_word: float | None = None

    @property
    def noise_name(self) -> str:
        return "laplace_scale" if self.mechanism == "laplace" else "sigma"

    @property
    def unit(self) -> str:
        if self.mechanism != "gaussian":
            return "example"
        return "user" if self.partition == "user" else f"{self.tuple_size}-word tuple"

    def guarantee(self) -> str:
        """The guarantee in words: the neighbouring relation, the unit and every parameter."""
        N, e, d, C, s = self.tuple_size, self.epsilon, self.delta, self.threshold, self.noise
        if self.mechanism == "gaussian" and self.partition == "user":
            text = (
                f"(epsilon={e:.6g}, delta={d:.3g})-DP histogram against adding or removing one user (Hoory et al. 2021, "
                f"Corollary 1 with N={N}, the tuple being one user): each user adds 1 to each of its at most N={N} most "
                f"frequent distinct words (ties broken by first occurrence; the rest ignored), so one user changes at most "
                f"{N} counts by 1 (L2 sensitivity sqrt({N})); Gaussian noise sigma={s:.6g} on every nonzero count; "
                f"counts below C={C:.6g} dropped."
            )
        elif self.mechanism == "gaussian":
            how = (
                "the records, concatenated in corpus order, are cut into consecutive tuples (one tuple may span two "
                "examples or users; an example or user spread over t tuples gets the t-fold group guarantee)"
                if self.partition == "stream"
                else "each example is cut into its own consecutive tuples (an example of at most N words is one tuple; "
                "a longer one, or a user's many examples, gets the group guarantee over its tuples)"
            )
            text = (
                f"(epsilon={e:.6g}, delta={d:.3g})-DP histogram against adding or removing one {N}-word tuple "
                f"(Hoory et al. 2021, Corollary 1 with N={N}): {how}; each tuple adds 1 to each distinct word it holds; "
                f"Gaussian noise sigma={s:.6g} on every nonzero count; counts below C={C:.6g} dropped."
            )
        elif self.mechanism == "laplace":
            text = (
                f"(epsilon={self.epsilon_per_word:.6g}, delta={self.delta_per_word:.3g})-DP per word occurrence, i.e. against "
                f"replacing one word in the histogram of per-example distinct words (Hoory et al. 2021 v1 section 3.2, after "
                f"Korolova et al. 2009 and Bun et al. 2019); per example of at most N={N} distinct words (the first N distinct "
                f"words of an example are counted, the rest ignored): (epsilon={e:.6g}, delta={d:.3g})-DP by basic composition "
                f"(N*epsilon, N*delta). Laplace noise of scale 2/epsilon={s:.6g} on every positive count; counts below "
                f"1 + 2 ln(2/delta)/epsilon = {C:.6g} dropped."
            )
        else:
            text = (
                f"(epsilon={e:.6g}, delta={d:.3g})-DP histogram against adding or removing one example (Ponomareva et al. 2022, "
                f"Algorithm 1, with the bounds of Hoory et al. 2021 Theorem 1 at k = m = N = {N}): each example adds the counts "
                f"of its first {N} words (not capped at 1; longer examples truncated), so its histogram has L2 and L-infinity "
                f"norm at most {N}; Gaussian noise sigma={s:.6g} on every nonzero count; counts below C={C:.6g} dropped."
            )
        if self.mechanism != "laplace":
            if self.threshold_rule == "paper":
                text += (
                    f" Threshold by the papers' printed erfinv formula, whose tail exceeds what the proof assumes: the "
                    f"guaranteed delta is {d:.3g}, not the requested {self.delta_requested:.3g}."
                )
            else:
                text += " Threshold by the Gaussian quantile Phi^-1 (the sound reading of the papers' erfinv)."
        return text

    def to_dict(self) -> dict:
        d = {
            "mechanism": self.mechanism,
            "unit": self.unit,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "delta_requested": self.delta_requested,
            self.noise_name: self.noise,
            "threshold": self.threshold,
            "tuple_size": self.tuple_size,
        }
        if self.mechanism == "gaussian":
            d["partition"] = self.partition
        if self.mechanism != "laplace":
            d["threshold_rule"] = self.threshold_rule
        else:
            d["epsilon_per_word"] = self.epsilon_per_word
            d["delta_per_word"] = self.delta_per_word
        d["guarantee"] = self.guarantee()
        return d


def _sigma_or_epsilon(sigma: float | None, epsilon: float | None) -> tuple[float | None, float | None]:
    if (sigma is None) == (epsilon is None):
        raise PrivacyParameterError("give exactly one of sigma (the noise) or epsilon (the target); got "
                                    + ("both" if sigma is not None else "neither"))
    if sigma is not None:
        return _check_positive("sigma", sigma), None
    return None, _check_positive("epsilon", epsilon)


def gaussian_params(
    *,
    sigma: float | None = None,
    epsilon: float | None = None,
    delta: float,
    tuple_size: int = DEFAULT_TUPLE_SIZE,
    partition: str = "stream",
    threshold_rule: str = "quantile",
) -> HistogramParams:
    """Corollary 1 parameters from sigma or a target epsilon (in (0, 1)); ``0 < delta < 1.25 e^-1.5``."""
    N = _check_tuple_size(tuple_size)
    sigma, epsilon = _sigma_or_epsilon(sigma, epsilon)
    d = _check_delta(delta, COROLLARY1_DELTA_MAX, " (Corollary 1 needs delta < 1.25 e^-1.5)")
    if partition not in PARTITIONS:
        raise PrivacyParameterError(f"partition must be one of {', '.join(PARTITIONS)}, got {partition!r}")
    rule = _check_rule(threshold_rule)
    if sigma is None:
        _check_epsilon_lt1(epsilon, "the Gaussian tuple histogram")
        sigma = corollary1_sigma(epsilon, d, N)
    eps = corollary1_epsilon(sigma, d, N)
    _check_epsilon_lt1(eps, "the Gaussian tuple histogram", corollary1_sigma(1.0, d, N) * (1 + 1e-12))
    C = corollary1_threshold(sigma, d, N, rule)
    d_eff = d if rule == "quantile" else d + N * gaussian_tail(paper_erfinv(d / N))
    return HistogramParams("gaussian", eps, min(d_eff, 1.0), d, sigma, C, N, partition, rule)


def laplace_params(*, epsilon: float, delta: float, tuple_size: int = DEFAULT_TUPLE_SIZE) -> HistogramParams:
    """Laplace parameters: ``epsilon``/``delta`` are per word (the mechanism's own); per example x N.

    ``N * delta < 1`` is required so that the per-example guarantee says something."""
    N = _check_tuple_size(tuple_size)
    eps = _check_positive("epsilon", epsilon)
    d = _check_delta(delta)
    if N * d >= 1.0:
        raise PrivacyParameterError(
            f"delta must be in (0, 1/N) = (0, {1.0 / N:.6g}) so that the per-example delta N*delta is below 1 (N={N}), got {d:g}"
        )
    return HistogramParams(
        "laplace", N * eps, N * d, d, laplace_scale(eps), laplace_threshold(eps, d), N, "example", "quantile", eps, d
    )


def count_params(
    *,
    sigma: float | None = None,
    epsilon: float | None = None,
    delta: float,
    tuple_size: int = DEFAULT_TUPLE_SIZE,
    threshold_rule: str = "quantile",
) -> HistogramParams:
    """Ponomareva et al. Algorithm 1 with Theorem 1 at k = m = N (N: words per example, the cap)."""
    N = _check_tuple_size(tuple_size)
    sigma, epsilon = _sigma_or_epsilon(sigma, epsilon)
    d = _check_delta(delta)
    rule = _check_rule(threshold_rule)
    if sigma is None:
        _check_epsilon_lt1(epsilon, "the per-example count histogram")
        sigma = theorem1_sigma(epsilon, d, N)
    eps = theorem1_epsilon(sigma, d, N)
    _check_epsilon_lt1(eps, "the per-example count histogram", theorem1_sigma(1.0, d, N) * (1 + 1e-12))
    C = theorem1_threshold(sigma, d, N, N, rule)
    d_eff = d if rule == "quantile" else d / 2.0 + N * gaussian_tail(paper_erfinv(d / (2.0 * N)))
    return HistogramParams("count", eps, min(d_eff, 1.0), d, sigma, C, N, "example", rule)


def mechanism_params(mechanism: str, **kwargs) -> HistogramParams:
    """Dispatch to :func:`gaussian_params`, :func:`laplace_params` or :func:`count_params`."""
    if mechanism == "gaussian":
        return gaussian_params(**kwargs)
    if mechanism == "laplace":
        if kwargs.get("sigma") is not None:
            raise PrivacyParameterError("sigma does not apply to the Laplace histogram; give epsilon (per word)")
        if kwargs.get("epsilon") is None:
            raise PrivacyParameterError("epsilon (per word, > 0) is required for the Laplace histogram")
        kwargs = {k: v for k, v in kwargs.items() if k in ("epsilon", "delta", "tuple_size")}
        return laplace_params(**kwargs)
    if mechanism == "count":
        kwargs.pop("partition", None)
        return count_params(**kwargs)
    raise PrivacyParameterError(f"dp mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")


# ---- counting (streamed) -------------------------------------------------------------------------
class WordCounter:
    """Plain word counts: every occurrence counts (the non-private histogram)."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.units = 0  # examples seen
        self.words = 0  # word occurrences seen

    def add(self, words: Sequence[str]) -> None:
        self.units += 1
        self.words += len(words)
        self.counts.update(words)

    def add_many(self, batch: Sequence[Sequence[str]]) -> None:
        """Many sequences at once (one C-level count: much faster than ``add`` per short example)."""
        self.units += len(batch)
        self.words += sum(map(len, batch))
        self.counts.update(chain.from_iterable(batch))

    def finish(self) -> Counter:
        return self.counts


class TupleCounter:
    """Hoory et al.: N-word tuples, each adding 1 to each distinct word it holds.

    ``partition="stream"`` cuts the concatenation of all sequences (a final short tuple counts);
    ``partition="example"`` cuts each sequence on its own. ``units`` counts tuples."""

    def __init__(self, tuple_size: int, partition: str = "stream"):
        self.N = tuple_size
        self.partition = partition
        self.counts: Counter = Counter()
        self.units = 0
        self._buf: list[str] = []

    def add(self, words: Sequence[str]) -> None:
        N, upd = self.N, self.counts.update
        if self.partition == "example":
            for i in range(0, len(words), N):
                upd(set(words[i : i + N]))
                self.units += 1
            return
        buf = self._buf
        buf.extend(words)
        if len(buf) >= N:
            end = len(buf) - len(buf) % N
            for i in range(0, end, N):
                upd(set(buf[i : i + N]))
            self.units += end // N
            del buf[:end]

    def add_many(self, batch: Sequence[Sequence[str]]) -> None:
        if self.partition == "example":
            N = self.N
            self.counts.update(chain.from_iterable(
                (set(w) if len(w) <= N else chain.from_iterable(set(w[i : i + N]) for i in range(0, len(w), N))) for w in batch
            ))
            self.units += sum(max(1, -(-len(w) // N)) if w else 0 for w in batch)
            return
        self.add(list(chain.from_iterable(batch)))

    def finish(self) -> Counter:
        if self._buf:
            self.counts.update(set(self._buf))
            self.units += 1
            self._buf = []
        return self.counts


class DistinctCounter:
    """Each example counts each of its first N distinct words once (the Laplace histogram's input)."""

    def __init__(self, tuple_size: int):
        self.N = tuple_size
        self.counts: Counter = Counter()
        self.units = 0

    def add(self, words: Sequence[str]) -> None:
        self.units += 1
        distinct = list(dict.fromkeys(words))  # first-occurrence order
        self.counts.update(distinct[: self.N] if len(distinct) > self.N else distinct)

    def add_many(self, batch: Sequence[Sequence[str]]) -> None:
        N = self.N
        self.units += len(batch)
        self.counts.update(chain.from_iterable(
            (d if len(d) <= N else list(d)[:N]) for d in map(dict.fromkeys, batch)
        ))

    def finish(self) -> Counter:
        return self.counts


class UserCounter(DistinctCounter):
    """One tuple per user: ``add(words)`` takes ALL of one user's words (its examples concatenated)
    and adds 1 to each of its at most N most frequent distinct words, ties broken by first
    occurrence (deterministic). ``units`` counts users (one with no words included)."""

    def add(self, words: Sequence[str]) -> None:
        self.units += 1
        freq = Counter(words)  # insertion order = first occurrence; most_common's sort is stable
        self.counts.update(list(freq) if len(freq) <= self.N else [w for w, _ in freq.most_common(self.N)])

    def add_many(self, batch: Sequence[Sequence[str]]) -> None:
        """Many users, one word list each."""
        for words in batch:
            self.add(words)

    def add_user(self, examples: Sequence[Sequence[str]]) -> None:
        """One user given as the word lists of its examples."""
        self.add(list(chain.from_iterable(examples)))


class CappedCounter:
    """Each example adds the counts of its first N words (Ponomareva et al.; not capped at 1)."""

    def __init__(self, tuple_size: int):
        self.N = tuple_size
        self.counts: Counter = Counter()
        self.units = 0

    def add(self, words: Sequence[str]) -> None:
        self.units += 1
        self.counts.update(words[: self.N] if len(words) > self.N else words)

    def add_many(self, batch: Sequence[Sequence[str]]) -> None:
        N = self.N
        self.units += len(batch)
        self.counts.update(chain.from_iterable((w if len(w) <= N else w[:N]) for w in batch))

    def finish(self) -> Counter:
        return self.counts


def counter_for(params: HistogramParams) -> TupleCounter | UserCounter | DistinctCounter | CappedCounter:
    """The streaming counter a mechanism's sensitivity analysis assumes."""
    if params.mechanism == "gaussian" and params.partition == "user":
        return UserCounter(params.tuple_size)
    if params.mechanism == "gaussian":
        return TupleCounter(params.tuple_size, params.partition)
    if params.mechanism == "laplace":
        return DistinctCounter(params.tuple_size)
    return CappedCounter(params.tuple_size)


# ---- release -------------------------------------------------------------------------------------
@dataclass
class DPHistogram:
    """A released histogram: ``counts`` maps each kept word to its noisy count (float, >= threshold).

    ``words_before`` is the number of distinct words with a nonzero true count in the mechanism's
    histogram (words past an example's cap of N are not in it); ``units`` the number of tuples
    (gaussian; users with ``partition="user"``) or examples (laplace, count) counted. Only ``counts`` and the
    parameters are covered by the guarantee; ``words_before``/``words_dropped``/``units`` are
    computed from the raw data (for the data owner's eyes)."""

    params: HistogramParams
    counts: dict[str, float]
    words_before: int
    units: int
    extra: dict = field(default_factory=dict)

    mechanism = property(lambda self: self.params.mechanism)
    epsilon = property(lambda self: self.params.epsilon)
    delta = property(lambda self: self.params.delta)
    threshold = property(lambda self: self.params.threshold)
    noise = property(lambda self: self.params.noise)
    guarantee = property(lambda self: self.params.guarantee())

    @property
    def sigma(self) -> float | None:
        return None if self.params.mechanism == "laplace" else self.params.noise

    @property
    def scale(self) -> float | None:
        return self.params.noise if self.params.mechanism == "laplace" else None

    @property
    def words_kept(self) -> int:
        return len(self.counts)

    @property
    def words_dropped(self) -> int:
        return self.words_before - len(self.counts)

    def to_dict(self) -> dict:
        """Everything but the counts (JSON-ready)."""
        return {**self.params.to_dict(), "words_before": self.words_before, "words_kept": self.words_kept,
                "words_dropped": self.words_dropped, "units": self.units, **self.extra}


def release(counts: Counter | dict[str, int], params: HistogramParams, seed: int | np.random.Generator = 0, units: int = 0) -> DPHistogram:
    """Noise every nonzero true count and keep those >= the threshold.

    Words are sorted before the noise is drawn, so the result depends only on the histogram and
    the seed (not on the order the stream arrived in)."""
    words = sorted(w for w, c in counts.items() if c > 0)
    n = len(words)
    if params.mechanism == "laplace":
        # Hoory et al. v1 assume 0 < eps < ln(n) and 0 < delta < 1/n, n = the number of distinct words.
        e1, d1 = params.epsilon_per_word, params.delta_per_word
        if n > 0 and d1 >= 1.0 / n:
            raise PrivacyParameterError(f"delta (per word) must be < 1/n = {1.0 / n:.6g} for n = {n} distinct words (Hoory et al. v1 assume 0 < delta < 1/n), got {d1:g}")
        if n > 1 and e1 >= math.log(n):
            raise PrivacyParameterError(f"epsilon (per word) must be < ln(n) = {math.log(n):.6g} for n = {n} distinct words (Hoory et al. v1 assume 0 < epsilon < ln n), got {e1:g}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    true = np.fromiter((counts[w] for w in words), dtype=np.float64, count=n)
    if params.mechanism == "laplace":
        noisy = true + rng.laplace(0.0, params.noise, size=n)
    else:
        noisy = true + rng.normal(0.0, params.noise, size=n)
    keep = np.flatnonzero(noisy >= params.threshold)
    kept = {words[i]: float(noisy[i]) for i in keep.tolist()}
    return DPHistogram(params, kept, n, units)


def batched(sequences: Iterable[Sequence[str]], size: int = 4096) -> Iterator[list[Sequence[str]]]:
    """Consecutive lists of ``size`` sequences (the last may be shorter), for the counters' ``add_many``."""
    it = iter(sequences)
    while batch := list(islice(it, size)):
        yield batch


def _run(sequences: Iterable[Sequence[str]], params: HistogramParams, seed) -> DPHistogram:
    counter = counter_for(params)
    for batch in batched(sequences):
        counter.add_many(batch)
    counts = counter.finish()
    return release(counts, params, seed, counter.units)


def gaussian_histogram(
    sequences: Iterable[Sequence[str]],
    *,
    sigma: float | None = None,
    epsilon: float | None = None,
    delta: float,
    tuple_size: int = DEFAULT_TUPLE_SIZE,
    partition: str = "stream",
    threshold_rule: str = "quantile",
    seed: int | np.random.Generator = 0,
) -> DPHistogram:
    """Hoory et al. Corollary 1 over streamed word sequences (give sigma, or a target epsilon < 1).
    With ``partition="user"`` each sequence is one user's words (see :func:`corpus_user_words`)."""
    params = gaussian_params(sigma=sigma, epsilon=epsilon, delta=delta, tuple_size=tuple_size, partition=partition, threshold_rule=threshold_rule)
    return _run(sequences, params, seed)


def laplace_histogram(
    sequences: Iterable[Sequence[str]],
    *,
    epsilon: float,
    delta: float,
    tuple_size: int = DEFAULT_TUPLE_SIZE,
    seed: int | np.random.Generator = 0,
) -> DPHistogram:
    """The Laplace histogram; ``epsilon``/``delta`` per word, at most ``tuple_size`` distinct words per example."""
    return _run(sequences, laplace_params(epsilon=epsilon, delta=delta, tuple_size=tuple_size), seed)


def count_histogram(
    sequences: Iterable[Sequence[str]],
    *,
    sigma: float | None = None,
    epsilon: float | None = None,
    delta: float,
    tuple_size: int = DEFAULT_TUPLE_SIZE,
    threshold_rule: str = "quantile",
    seed: int | np.random.Generator = 0,
) -> DPHistogram:
    """DP-SentencePiece's histogram (Ponomareva et al. Algorithm 1); examples capped at ``tuple_size`` words."""
    params = count_params(sigma=sigma, epsilon=epsilon, delta=delta, tuple_size=tuple_size, threshold_rule=threshold_rule)
    return _run(sequences, params, seed)


def dp_histogram(sequences: Iterable[Sequence[str]], mechanism: str, *, seed: int | np.random.Generator = 0, **kwargs) -> DPHistogram:
    """Any of the three mechanisms by name (``gaussian``, ``laplace``, ``count``); ``sequences`` are
    one word list per example, or per user for ``gaussian`` with ``partition="user"``."""
    return _run(sequences, mechanism_params(mechanism, **kwargs), seed)


def corpus_word_sequences(corpus) -> Iterator[list[str]]:
    """The words of every example of a FederatedCorpus, users in order (streamed, one user at a time)."""
    for _, exs in corpus.users():
        for ex in exs:
            yield ex.words()


def corpus_word_batches(corpus) -> Iterator[list[list[str]]]:
    """Per user, the word lists of its examples (the batches the counters' ``add_many`` takes)."""
    for _, exs in corpus.users():
        if exs:
            yield [ex.words() for ex in exs]


def corpus_user_words(corpus, transform=None) -> Iterator[list[str]]:
    """Per user with examples, all its words (its examples' words concatenated, in source order),
    each passed through ``transform`` if given: the sequences of ``partition="user"``."""
    for _, exs in corpus.users():
        if exs:
            words = [w for ex in exs for w in ex.words()]
            yield [transform(w) for w in words] if transform is not None else words
