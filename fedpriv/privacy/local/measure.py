"""Empirical privacy of the local mechanisms: what eta means on a given embedding space.

* :func:`plausible_deniability` (Qu et al. 2021, sec. 5.3, after Feyisetan et al. 2020): each
  regular token w is perturbed ``trials`` times (1,000 by default) by M_txt (or Vickrey);
  N_w = how many outputs equal w, S_w = how many distinct outputs. Good privacy: small N_w, large
  S_w. Per eta, per token arrays, and quantile summaries; :func:`plot_deniability` draws their
  distributions over a grid of eta.
* :func:`token_inversion` (Qu et al. sec. 5.4): the nearest-neighbour attack on M_rep-perturbed
  embeddings of the tokens of a real corpus (so frequent words weigh as they occur): accuracy =
  the fraction of positions whose perturbed embedding's nearest allowed token is the original.

Both are deterministic given the ``jax.random`` key: eta number j of the grid uses
``fold_in(key, j)``; a token sample uses ``fold_in(key, 2**31 - 1)``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedpriv.errors import FedprivError, PrivacyParameterError
from fedpriv.privacy.local.mechanisms import (
    as_index,
    check_eta,
    check_t,
    nearest_tokens,
    privatize_representations,
    privatize_tokens,
    vickrey_tokens,
)

QUANTILES = (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0)
_SAMPLE_SALT = 2**31 - 1


def _sample(key: Any, n: int, m: int | None) -> np.ndarray:
    """Sorted positions of ``m`` of ``n`` items without replacement (all when m is None or >= n)."""
    if m is None or m >= n:
        return np.arange(n)
    if m < 1:
        raise FedprivError(f"sample size must be >= 1, got {m}")
    pick = jax.random.choice(jax.random.fold_in(key, _SAMPLE_SALT), n, (m,), replace=False)
    return np.sort(np.asarray(pick))


def _quantiles(x: np.ndarray) -> dict[str, float]:
    out = {("min" if q == 0 else "max" if q == 1 else f"p{round(q * 100)}"): float(np.quantile(x, q)) for q in QUANTILES}
    out["mean"] = float(np.mean(x))
    return out


@dataclass
class DeniabilityStats:
    """N_w (``same``) and S_w (``distinct``), each (len(etas), len(token_ids)), per eta and token."""

    etas: list[float]
    token_ids: np.ndarray
    trials: int
    mechanism: str
    t: float | None
    same: np.ndarray
    distinct: np.ndarray
    words: list[str] = field(default_factory=list)

    def summary(self) -> list[dict[str, Any]]:
        """Per eta: quantiles (min, p5, p25, median, p75, p95, max) and mean of N_w and S_w over tokens."""
        return [
            {"eta": e, "tokens": int(self.token_ids.size), "trials": self.trials, "N_w": _quantiles(self.same[j]), "S_w": _quantiles(self.distinct[j])}
            for j, e in enumerate(self.etas)
        ]

    def to_json(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "t": self.t, "trials": self.trials, "tokens": int(self.token_ids.size), "summary": self.summary()}


def plausible_deniability(
    key: Any,
    space: Any,
    etas: Sequence[float],
    trials: int = 1000,
    mechanism: str = "txt",
    t: float | None = None,
    k: int = 2,
    tokens: Sequence[int] | None = None,
    sample: int | None = None,
    log: Callable[[str], None] | None = None,
) -> DeniabilityStats:
    """Qu et al. sec. 5.3: perturb each token ``trials`` times at each eta; count outputs equal to
    the input (N_w) and distinct outputs (S_w).

    ``space``: an EmbeddingSpace (its regular words are both the tokens and the outputs), a
    TokenIndex, or a (V, d) array (every row). ``tokens``: the input ids (default: the allowed
    ids); ``sample``: measure a random subset of that many of them. ``mechanism``: ``txt`` or
    ``vickrey`` (with ``t`` and ``k``). Cost: len(etas) x tokens x trials nearest-neighbour
    searches over the allowed tokens."""
    idx = as_index(space)
    if mechanism not in ("txt", "vickrey"):
        raise PrivacyParameterError(f"plausible deniability measures a token mechanism (txt or vickrey), got {mechanism!r}")
    if mechanism == "vickrey":
        if t is None:
            raise PrivacyParameterError("the vickrey mechanism needs t in [0, 1]")
        t = check_t(t)
    elif t is not None:
        raise PrivacyParameterError("t applies to the vickrey mechanism only")
    if trials < 1:
        raise FedprivError(f"trials must be >= 1, got {trials}")
    etas = [check_eta(e) for e in etas]
    if not etas:
        raise FedprivError("give at least one eta")
    ids = np.asarray(idx.allowed if tokens is None else tokens, dtype=np.int64)
    ids = ids[_sample(key, ids.size, sample)]
    say = log or (lambda _m: None)
    same = np.empty((len(etas), ids.size), np.int64)
    distinct = np.empty((len(etas), ids.size), np.int64)
    rep = np.repeat(ids, trials)
    for j, eta in enumerate(etas):
        kj = jax.random.fold_in(key, j)
        if mechanism == "txt":
            out = privatize_tokens(kj, rep, idx, eta)
        else:
            out = vickrey_tokens(kj, rep, idx, eta, t, k)  # type: ignore[arg-type]
        out = out.reshape(ids.size, trials)
        same[j] = np.sum(out == ids[:, None], axis=1)
        srt = np.sort(out, axis=1)
        distinct[j] = 1 + np.sum(srt[:, 1:] != srt[:, :-1], axis=1)
        say(f"eta {eta:g}: median N_w {np.median(same[j]):g}, median S_w {np.median(distinct[j]):g} over {ids.size} tokens")
    words = [space.word(int(i)) for i in ids] if hasattr(space, "word") else []
    return DeniabilityStats(etas, ids, trials, mechanism, t, same, distinct, words)


def plot_deniability(stats: DeniabilityStats, path: str | os.PathLike[str]) -> Path:
    """PNG: the distribution over tokens of N_w (left) and S_w (right), one box per eta (whiskers
    at the minimum and maximum, the box from the 25th to the 75th percentile, the median line).
    Matplotlib's Agg canvas: no display, no pyplot state."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    labels = [f"{e:g}" for e in stats.etas]
    mech = stats.mechanism if stats.t is None else f"{stats.mechanism}, t = {stats.t:g}"
    for i, (data, name, what) in enumerate(
        ((stats.same, "N_w", "outputs equal to the input"), (stats.distinct, "S_w", "distinct outputs"))
    ):
        ax = fig.add_subplot(1, 2, i + 1)
        ax.boxplot([row for row in data], whis=(0, 100), tick_labels=labels)
        ax.set_xlabel("eta")
        ax.set_ylabel(f"{name}: {what} (of {stats.trials})")
        ax.set_ylim(0, stats.trials * 1.03)
        ax.set_title(f"{name} over {stats.token_ids.size} tokens ({mech})", fontsize=10)
    fig.tight_layout()
    p = Path(path)
    fig.savefig(p, format="png", metadata={"Software": None})
    return p


@dataclass
class InversionResult:
    """Accuracy of nearest-neighbour inversion of M_rep per eta, over ``tokens`` corpus positions."""

    etas: list[float]
    accuracy: list[float]
    tokens: int
    skipped_oov: int
    distinct: int

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "distinct_tokens": self.distinct,
            "skipped_out_of_vocabulary": self.skipped_oov,
            "accuracy": {f"{e:g}": a for e, a in zip(self.etas, self.accuracy)},
        }


def corpus_words(corpus: Any, max_examples: int | None = None) -> list[str]:
    """The words of a FederatedCorpus's examples (users in order), of its first ``max_examples`` examples."""
    words: list[str] = []
    for n, ex in enumerate(corpus.records()):
        if max_examples is not None and n >= max_examples:
            break
        words.extend(ex.words())
    return words


def token_inversion(
    key: Any,
    space: Any,
    words: Iterable[str],
    etas: Sequence[float],
    max_tokens: int | None = 20_000,
) -> InversionResult:
    """Qu et al. sec. 5.4: for each corpus position whose token is an allowed (regular) token of
    ``space`` (an EmbeddingSpace), perturb its embedding with M_rep and guess the original as the
    nearest allowed token; accuracy per eta. The positions are those of the space's unit
    (:meth:`EmbeddingSpace.corpus_ids`): words, or the WordPiece pieces of the words for a BERT
    run's space. Positions of out-of-vocabulary tokens are skipped (the attacker cannot name them)
    and counted. ``max_tokens``: a random sample of that many positions (None: all)."""
    if not hasattr(space, "ids"):
        raise FedprivError("token_inversion needs an EmbeddingSpace (to look words up)")
    idx = space.index()
    etas = [check_eta(e) for e in etas]
    ids = space.corpus_ids(list(words)) if hasattr(space, "corpus_ids") else space.ids(list(words))
    regular = np.isin(ids, idx.allowed)
    skipped = int(np.sum(~regular))
    ids = ids[regular]
    if ids.size == 0:
        raise FedprivError("no word of the corpus is in the embedding vocabulary")
    ids = ids[_sample(key, ids.size, max_tokens)]
    acc = []
    for j, eta in enumerate(etas):
        pts = privatize_representations(jax.random.fold_in(key, j), idx.table[ids], eta)
        guess = nearest_tokens(pts, idx, k=1)[0][:, 0]
        acc.append(float(np.mean(guess == ids)))
    return InversionResult(etas, acc, int(ids.size), skipped, int(np.unique(ids).size))
