"""Random Sampling for the NWP LSTM with the least work per candidate, and the reference's ranks.

A suffix (s1, s2, s3) after the canary's prefix has log-perplexity t1 + t2 + t3 (nats), with
t_j = -log P(s_j | prefix, s_<j) >= 0. Only the count of candidates scoring at or below the
canary's C matters (:mod:`fedpriv.memorization.random_sampling`: rank = 1 + that count), so:

1. the prefix is run once (the reference's code): t1 of every id;
2. first words: for each distinct s1 the state cell(gates_in[s1] + h0 @ wh, c0) is a row lookup
   (:mod:`fedpriv.memorization.lstm_tables`), then one output layer gives its log-normalizer
   (at most V of them); t2 of a candidate is then a d-dot (d = 96 for Stack Overflow);
3. bound 1: t1 + t2 <= log-perplexity (t3 >= 0). A candidate with t1 + t2 > C + margin cannot
   score below the canary and gets no more work (a memorized canary drops almost all here);
4. each (s1, s2) pair left: its state cell(gates_in[s2] + R1[s1], c1[s1]), with R1 = h1 @ wh once
   per first word, and its projection p; z = p . w[:, s3] + b[s3] per candidate. Bounds on the
   log-normalizer lse(p) (:mod:`fedpriv.memorization.rs_kernels`) from an anchor per second word
   (the state from the mean first-word state, with lse and its gradient computed once) give
   t3 = lse(p) - z within an interval: a candidate whose interval lies above C + margin is dropped, below C - margin is
   counted lower, and only the others get the full log-normalizer (V x d).

Exactness: every value the decisions use is the reference's formula with the same float32
operations, except that a table row replaces a one-row matrix product; the difference from the
reference is float32 rounding (measured: at most a few 1e-6 nats). Bounds hold in exact
arithmetic; every comparison with C keeps a margin of ``MARGIN`` = 1e-3 nats, and a candidate
whose exact value lands within the margin of C is scored again by the reference and compared as
the reference does (at or below: a tie counts against the canary), so the count is the reference's. C itself is the
reference's score of the canary. Guards at run time: the canary's fast score and a spot check of
``SPOT`` candidates must agree with the reference within MARGIN / 8, and the canary's reference
score must not depend on the rows scored with it; otherwise the reference scores everything
(with a warning).

Suffixes of 2 and 3 words take this path; other lengths, and models that are not the NWP LSTM,
use the reference.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.errors import FedprivError
from fedpriv.memorization import rs_kernels as K
from fedpriv.memorization.lm import NWPStepper
from fedpriv.memorization.lstm_tables import is_nwp_lstm, tables_for
from fedpriv.memorization.random_sampling import RandomSamplingResult, random_sampling, suffix_log_probs

MARGIN = 1e-3  # nats: candidates within this of the canary's score are decided by the reference
SPOT = 64  # candidates checked against the reference on every call
FIRST_BLOCK = 256  # first words per compiled call


@dataclass(frozen=True)
class FastStats:
    """How much work the bounds saved for one canary (counts of random suffixes)."""

    candidates: int
    after_bound1: int  # got a second LSTM step (t1 + t2 did not exceed C + margin, or forced)
    scored: int  # got the full log-normalizer of the last word (including forced rows)
    bounded_lower: int  # counted as lower from the upper bound alone
    rechecked: int  # decided by the reference (within the margin of C)
    fallback: bool  # a guard failed and the reference scored every candidate


class _Scorer:
    """Log-probabilities of one prefix's suffixes: approximate ones (float32 rounding apart from
    the reference's) for the bounds, and the reference's own for the rows that need them."""

    def __init__(self, stepper: NWPStepper, prefix: np.ndarray, batch: int):
        self.t = t = tables_for(stepper)
        self.v = t.vocab_size
        h0, self.c0, p0, lse0 = stepper.run(prefix[None, :])
        self.first = np.asarray(stepper.all_log_probs(p0, lse0))[0]  # the reference's t1 (as log-probs)
        self.r0 = K.recurrent(h0, t.wh)
        self.rows = -(-self.v // FIRST_BLOCK) * FIRST_BLOCK  # rows of every per-word table
        self.exact_block = batch  # the reference's shapes for its formulas: the same bits (tested)
        self.pair_block = int(np.clip(2 ** round(np.log2(2**20 / t.wh.shape[1])), 256, 4096))  # ~1M gate floats

    def order(self, rows: np.ndarray) -> np.ndarray:
        """Row order by (block of 256 first words, second word): first words in the same
        compiled call, and table rows reused from cache. Numbers the distinct first words."""
        words = np.flatnonzero(np.bincount(rows[:, 0], minlength=self.v))
        self.row_of = np.full(self.v, -1, np.int64)
        self.row_of[words] = np.arange(len(words))
        self.tile = self.row_of[rows[:, 0]] // FIRST_BLOCK
        return np.argsort(self.tile * self.v + rows[:, 1], kind="stable")

    def first_two(self, rows: np.ndarray, order: np.ndarray) -> np.ndarray:
        """log P(s1) + log P(s2 | s1) per row, from the first words' log-probability tables
        (float64 sum); ``order`` from :meth:`order`. Keeps the states after the first words."""
        t = self.t
        words = np.flatnonzero(self.row_of >= 0)
        bounds = np.searchsorted(self.tile[order], np.arange(-(-len(words) // FIRST_BLOCK) + 1))
        t2, states = np.empty(len(rows), np.float32), []
        for k, (lo, hi) in enumerate(K.blocks(len(words), FIRST_BLOCK)):
            *state, logp = K.first_states(t, self.r0, self.c0, jnp.asarray(K.pad(words[lo:hi], FIRST_BLOCK)))
            states.append(state)
            seg = order[bounds[k] : bounds[k + 1]]
            t2[seg] = np.asarray(logp)[self.row_of[rows[seg, 0]] - lo, rows[seg, 1]]
        self.h1, self.c1, self.p1, self.lse1 = (K.pad_rows(jnp.concatenate(x), self.rows) for x in zip(*states))
        return self.first[rows[:, 0]].astype(np.float64) + t2

    def exact(self, rows: np.ndarray, second: tuple | None = None) -> np.ndarray:
        """The reference's log-probs of ``rows`` (float64 sums of its float32 terms, in its
        order); for three-word suffixes ``second`` = (R1 of :meth:`recurrent_table`, the rows'
        first-word rows)."""
        t, b = self.t, self.exact_block
        lp = self.first[rows[:, 0]].astype(np.float64)
        lp += K.gathered(K.log_prob_of, len(rows), b, self.row_of[rows[:, 0]].astype(np.int32), rows[:, 1], fixed=(self.p1, self.lse1, t.out_w, t.out_b))
        if second is not None:
            r1, prow = second
            p = K.gathered(K.second_projection, len(rows), b, prow, rows[:, 1], fixed=(t, r1, self.c1))
            lse = K.gathered(K.full_lse, len(rows), b, p, fixed=(t,))
            lp += K.gathered(K.logit_rows, len(rows), b, p, rows[:, 2], fixed=(t.out_w, t.out_b)) - lse
        return lp

    def recurrent_table(self, rows: np.ndarray) -> jax.Array:
        """R1 = h1 @ wh for the first words of ``rows`` (the table's other blocks zero)."""
        needed = np.zeros(self.rows, bool)
        needed[self.row_of[rows[:, 0]]] = True
        zero = jnp.zeros((FIRST_BLOCK, self.t.wh.shape[1]), jnp.float32)
        return jnp.concatenate([K.recurrent(self.h1[lo : lo + FIRST_BLOCK], self.t.wh) if needed[lo : lo + FIRST_BLOCK].any() else zero for lo in range(0, self.rows, FIRST_BLOCK)])

    def anchor_table(self, rows: np.ndarray):
        """Anchors of the second words of ``rows`` (the step from the mean state of their first
        words), and each row's anchor row."""
        t = self.t
        need = jnp.asarray(np.flatnonzero(np.bincount(self.row_of[rows[:, 0]], minlength=self.rows)))
        r_bar = K.recurrent(jnp.mean(self.h1[need], axis=0, keepdims=True), t.wh)  # = the mean of R1 over them
        c_bar = jnp.mean(self.c1[need], axis=0, keepdims=True)
        seconds = np.flatnonzero(np.bincount(rows[:, 1], minlength=self.v))
        arow_of = np.full(self.v, -1, np.int64)
        arow_of[seconds] = np.arange(len(seconds))
        parts = [K.anchors(t, r_bar, c_bar, jnp.asarray(K.pad(seconds[lo:hi], FIRST_BLOCK))) for lo, hi in K.blocks(len(seconds), FIRST_BLOCK)]
        return tuple(K.pad_rows(jnp.concatenate(x), self.rows) for x in zip(*parts)), arow_of[rows[:, 1]].astype(np.int32)

    def third_word(self, rows: np.ndarray, partial: np.ndarray, forced: np.ndarray, c_ref: float):
        """For rows (sorted by first word) with approximate log-prob ``partial`` of their first
        two words: (positions given the reference's log-prob, those log-probs, rows counted
        lower from their bounds alone). Rows whose bounds decide them against the canary's
        score ``c_ref`` (with the margin) get no log-normalizer; ``forced`` rows do."""
        drop_below, lower_above = -(c_ref + MARGIN), -(c_ref - MARGIN)  # thresholds on log-probs
        r1, prow = self.recurrent_table(rows), self.row_of[rows[:, 0]].astype(np.int32)
        if forced.all():  # nothing for the bounds to save
            return np.arange(len(rows)), self.exact(rows, (r1, prow)), 0
        anchor, arow = self.anchor_table(rows)
        z, lse_lo, lse_hi = K.gathered(K.second_bounds, len(rows), self.pair_block, prow, rows[:, 1], rows[:, 2], arow, fixed=(self.t, r1, self.c1, anchor))
        hi_lp = partial + (z - lse_lo)  # upper bound on the log-prob
        lo_lp = partial + (z - lse_hi)  # lower bound
        sure = ~forced & (lo_lp > lower_above)
        exact = np.flatnonzero(forced | ((hi_lp >= drop_below) & ~sure))
        return exact, self.exact(rows[exact], (r1, prow[exact])), int(sure.sum())


def _bounded_scores(scorer: _Scorer, rows: np.ndarray, forced: np.ndarray, c_ref: float) -> tuple[np.ndarray, int, int]:
    """The reference's log-probs of the rows the bounds leave undecided (and the forced ones;
    NaN for the others), the rows counted lower by their bounds, and the rows that got a
    second LSTM step."""
    logp = np.full(len(rows), np.nan)
    order = scorer.order(rows)
    partial = scorer.first_two(rows, order)
    if rows.shape[1] == 2:  # partial is the whole log-prob, up to rounding
        sure = ~forced & (partial > -(c_ref - MARGIN))
        exact = np.flatnonzero(forced | (~sure & (partial >= -(c_ref + MARGIN))))
        logp[exact] = scorer.exact(rows[exact])
        return logp, int(sure.sum()), 0
    go = order[(partial[order] >= -(c_ref + MARGIN)) | forced[order]]  # bound 1: t3 >= 0
    kept, lp, bounded = scorer.third_word(rows[go], partial[go], forced[go], c_ref)
    logp[go[kept]] = lp
    return logp, bounded, len(go)


def _reference(stepper, canary_ids, prefix_words, suffixes, batch, score_rows, why: str | None) -> tuple[RandomSamplingResult, np.ndarray, FastStats]:
    if why is not None:
        warnings.warn(f"fast Random Sampling fell back to the reference: {why}", RuntimeWarning, stacklevel=3)
    res, scores = random_sampling(stepper, canary_ids, prefix_words, suffixes, batch)
    n = res.candidates
    return res, scores if score_rows is None else scores[score_rows], FastStats(n, n, n, 0, 0, why is not None)


def fast_random_sampling(
    stepper: NWPStepper,
    canary_ids: np.ndarray,
    prefix_words: int,
    suffixes: np.ndarray,
    batch: int = 512,
    score_rows: np.ndarray | None = None,
) -> tuple[RandomSamplingResult, np.ndarray, FastStats]:
    """The RS test of one canary, the same result as :func:`random_sampling` with the least work
    (see the module docstring). Returns the result, the log-perplexities (nats) of
    ``suffixes[score_rows]`` (all suffixes when None, which disables the bounds), and the work
    statistics. ``batch``: the reference's batch for the candidates it decides."""
    canary_ids = np.asarray(canary_ids, np.int32)
    suffixes = np.asarray(suffixes, np.int32)
    if not 1 <= prefix_words < len(canary_ids):
        raise FedprivError(f"the Random Sampling prefix ({prefix_words} words) must be shorter than the canary ({len(canary_ids)} words)")
    s = len(canary_ids) - prefix_words
    if suffixes.ndim != 2 or suffixes.shape[1] != s or len(suffixes) == 0:
        raise FedprivError(f"suffixes must be a non-empty (N, {s}) array, got shape {suffixes.shape}")
    if s not in (2, 3) or not is_nwp_lstm(stepper.params):
        return _reference(stepper, canary_ids, prefix_words, suffixes, batch, score_rows, None)
    n = len(suffixes)
    prefix = np.concatenate([[stepper.vocab.bos], canary_ids[:prefix_words]]).astype(np.int32)
    rows = np.concatenate([canary_ids[None, prefix_words:], suffixes])  # row 0 is the canary, as in the reference
    spot = np.random.default_rng(0).choice(n, min(SPOT, n), replace=False)  # checked against the reference
    ref_spot = -suffix_log_probs(stepper, prefix, rows[np.r_[0, 1 + spot]], batch)
    c_ref = float(ref_spot[0])  # the canary's score, as the reference computes it

    forced = np.zeros(n + 1, bool)
    forced[np.r_[0, 1 + spot, 1 + (np.arange(n) if score_rows is None else np.asarray(score_rows, np.int64))]] = True
    logp, bounded, stepped = _bounded_scores(_Scorer(stepper, prefix, batch), rows, forced, c_ref)
    ppl = -logp
    cand = ppl[1:]
    worst = max(abs(ppl[0] - c_ref), float(np.max(np.abs(cand[spot] - ref_spot[1:]))))
    if not worst <= MARGIN / 8:
        return _reference(stepper, canary_ids, prefix_words, suffixes, batch, score_rows, f"fast and reference scores differ by {worst:.2e} nats")
    near = np.flatnonzero(np.abs(cand - c_ref) <= MARGIN)  # NaN (not scored) compares False
    at_or_below = bounded + int(np.sum(cand < c_ref - MARGIN))
    if len(near):
        ref = -suffix_log_probs(stepper, prefix, rows[np.r_[0, 1 + near, 1 + spot]], batch)
        if ref[0] != c_ref:
            return _reference(stepper, canary_ids, prefix_words, suffixes, batch, score_rows, "the reference's score of the canary depends on the rows scored with it")
        at_or_below += int(np.sum(ref[1 : 1 + len(near)] <= c_ref))
    result = RandomSamplingResult(at_or_below + 1, n, c_ref, at_or_below)
    scores = cand if score_rows is None else cand[np.asarray(score_rows)]
    scored = int(np.sum(~np.isnan(cand)))
    return result, scores, FastStats(n, max(stepped - 1, 0), scored, bounded, len(near), False)
