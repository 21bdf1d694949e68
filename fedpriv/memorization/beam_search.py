"""Beam Search (Thakkar et al. 2021): can the canary be completed from its first word?

From ``[bos, w_1]`` a beam search over in-vocabulary words (pad, oov, bos and eos are never
proposed, since canary words never are) keeps the ``width`` most likely partial continuations by
total log-probability, for as many steps as the canary has words left. The canary is memorized
when its continuation is among the ``top`` best final beams.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.errors import FedprivError
from fedpriv.memorization.lm import NWPStepper, advance, all_log_probs


@jax.jit
def _expand(params, h, c, p, lse, scores, allowed):
    """One beam step: the ``width`` best (beam, id) extensions and the advanced states."""
    width = scores.shape[0]
    logp = jnp.where(allowed[None, :], all_log_probs(params, p, lse), -jnp.inf)
    total = (scores[:, None] + logp).reshape(-1)
    best, flat = jax.lax.top_k(total, width)
    parent, token = flat // logp.shape[1], flat % logp.shape[1]
    h, c, p, lse = advance(params, h[parent], c[parent], token)
    return h, c, p, lse, best, parent, token


def beam_search(stepper: NWPStepper, prefix: np.ndarray, length: int, width: int = 5, top: int = 5) -> list[tuple[tuple[int, ...], float]]:
    """The ``top`` best continuations of ``length`` word ids after ``prefix`` (ids, normally
    [bos, w_1]), best first, each with its total log-probability (nats)."""
    if length < 1 or not 1 <= top <= width:
        raise FedprivError(f"beam search needs length >= 1 and 1 <= top ({top}) <= width ({width})")
    allowed = np.zeros(stepper.vocab_size, bool)
    allowed[stepper.word_ids()] = True
    if int(allowed.sum()) ** length < top:
        raise FedprivError(f"only {int(allowed.sum())}^{length} continuations exist; cannot return the top {top}")
    h, c, p, lse = stepper.run(np.tile(np.asarray(prefix, np.int32), (width, 1)))
    scores = jnp.asarray(np.r_[0.0, np.full(width - 1, -np.inf)].astype(np.float32))  # one live beam
    seqs = np.zeros((width, 0), np.int32)
    allowed_j = jnp.asarray(allowed)
    for _ in range(length):
        h, c, p, lse, scores, parent, token = _expand(stepper.params, h, c, p, lse, scores, allowed_j)
        seqs = np.concatenate([seqs[np.asarray(parent)], np.asarray(token)[:, None]], axis=1)
    best = np.asarray(scores)
    return [(tuple(int(t) for t in seqs[i]), float(best[i])) for i in range(top)]


def beam_memorized(stepper: NWPStepper, canary_ids: np.ndarray, width: int = 5, top: int = 5) -> tuple[bool, list[tuple[tuple[int, ...], float]]]:
    """The BS test of one canary (word ids): memorized?, and the best continuations found."""
    canary_ids = np.asarray(canary_ids, np.int32)
    prefix = np.array([stepper.vocab.bos, canary_ids[0]], np.int32)
    found = beam_search(stepper, prefix, len(canary_ids) - 1, width, top)
    target = tuple(int(t) for t in canary_ids[1:])
    return any(seq == target for seq, _ in found), found
