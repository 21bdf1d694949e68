"""Linear-chain CRF in JAX, one example at a time (``jax.vmap`` these for batches).

Shapes: ``emissions`` (L, T) float scores, ``tags`` (L,) int, ``transitions`` (T, T) with
``transitions[i, j]`` the score of tag i followed by tag j, ``start`` / ``end`` (T,) the scores of
the first / last tag. ``length`` is the number of real steps, a scalar int (0..L); a (L,) 0/1
prefix mask is accepted too and summed. Steps at or after ``length`` are ignored.

The score of a path y_0..y_{n-1} (n = length) is
``start[y_0] + sum_i emissions[i, y_i] + sum_{i>=1} transitions[y_{i-1}, y_i] + end[y_{n-1}]``;
``log p(y | x) = score(y) - logsumexp over all paths``, in nats. An empty example (n = 0) has
log-likelihood 0 and an all-zero decoded path.

Transition constraints (e.g. BIO: ``I-X`` only after ``B-X`` / ``I-X``) are a boolean mask turned
into a large negative score (:data:`NEG`, finite so gradients stay finite) by :func:`constrain`.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

NEG = -1e4  # score of a forbidden transition: exp(NEG) underflows to 0 in float32


def _length(length: jax.Array | int) -> jax.Array:
    length = jnp.asarray(length)
    if length.ndim == 1:  # a (L,) prefix mask
        length = jnp.sum(length > 0)
    return length.astype(jnp.int32)


def crf_score(emissions, tags, length, transitions, start, end) -> jax.Array:
    """Unnormalized score (scalar) of the path ``tags[:length]``."""
    n = _length(length)
    L = emissions.shape[0]
    valid = jnp.arange(L) < n
    tags = jnp.asarray(tags, jnp.int32)
    emit = jnp.take_along_axis(emissions, tags[:, None], axis=1)[:, 0]
    trans = transitions[tags[:-1], tags[1:]]
    last = tags[jnp.maximum(n - 1, 0)]
    s = (
        start[tags[0]]
        + jnp.sum(jnp.where(valid, emit, 0.0))
        + jnp.sum(jnp.where(valid[1:], trans, 0.0))
        + end[last]
    )
    return jnp.where(n > 0, s, 0.0)


def crf_log_partition(emissions, length, transitions, start, end) -> jax.Array:
    """log of the sum of exp(score) over all T^length paths (forward algorithm, log space)."""
    n = _length(length)
    L = emissions.shape[0]
    valid = jnp.arange(L) < n

    def step(alpha, inp):
        e, v = inp
        nxt = logsumexp(alpha[:, None] + transitions, axis=0) + e
        return jnp.where(v, nxt, alpha), None

    alpha, _ = jax.lax.scan(step, start + emissions[0], (emissions[1:], valid[1:]))
    return jnp.where(n > 0, logsumexp(alpha + end), 0.0)


def crf_log_likelihood(emissions, tags, length, transitions, start, end) -> jax.Array:
    """log p(tags[:length] | emissions) in nats (scalar, <= 0)."""
    return crf_score(emissions, tags, length, transitions, start, end) - crf_log_partition(
        emissions, length, transitions, start, end
    )


def viterbi_decode(emissions, length, transitions, start, end) -> tuple[jax.Array, jax.Array]:
    """Best path and its score: ((L,) int32 tags, 0 at steps >= length; scalar score). Jittable."""
    n = _length(length)
    L, T = emissions.shape
    valid = jnp.arange(L) < n
    ident = jnp.arange(T, dtype=jnp.int32)

    def step(delta, inp):
        e, v = inp
        scores = delta[:, None] + transitions  # (prev, cur)
        best_prev = jnp.argmax(scores, axis=0).astype(jnp.int32)
        nxt = jnp.max(scores, axis=0) + e
        # Past the end, keep delta and point each tag to itself so the backtrace passes through.
        return jnp.where(v, nxt, delta), jnp.where(v, best_prev, ident)

    delta, back = jax.lax.scan(step, start + emissions[0], (emissions[1:], valid[1:]))
    final = delta + end
    last = jnp.argmax(final).astype(jnp.int32)

    def trace(tag, bp):
        prev = bp[tag]
        return prev, prev

    _, earlier = jax.lax.scan(trace, last, back, reverse=True)  # earlier[i] = tag at step i
    path = jnp.concatenate([earlier, last[None]])
    return jnp.where(valid, path, 0), jnp.where(n > 0, jnp.max(final), 0.0)


def allowed_transitions(tags: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Boolean (T, T) allowed[i, j], (T,) allowed starts and (T,) allowed ends for a tag set.

    BIO (no E/S/L/U prefix anywhere): ``I-X`` may only follow ``B-X`` or ``I-X`` and may not
    start. IOBES / BILOU (L = E, U = S): inside a chunk (after B-X / I-X) only I-X or E-X may
    follow; outside (start, O, E-*, S-*) only O, B-* or S-* may follow; the last tag is O, E or S.
    """
    parsed = [_split(t) for t in tags]
    iobes = any(p in "ES" for p, _ in parsed)
    T = len(tags)
    allowed = np.ones((T, T), bool)
    start_ok = np.ones(T, bool)
    end_ok = np.ones(T, bool)
    for j, (pj, tj) in enumerate(parsed):
        if iobes:
            start_ok[j] = pj in "OBS"
            end_ok[j] = pj in "OES"
        elif pj == "I":
            start_ok[j] = False
        for i, (pi, ti) in enumerate(parsed):
            if iobes:
                inside = pi in "BI"
                allowed[i, j] = (pj in "IE" and ti == tj) if inside else pj in "OBS"
            elif pj == "I":
                allowed[i, j] = pi in "BI" and ti == tj
    return allowed, start_ok, end_ok


def _split(tag: str) -> tuple[str, str]:
    if tag == "O" or "-" not in tag:
        return "O", ""
    p, t = tag.split("-", 1)
    return {"L": "E", "U": "S"}.get(p, p), t


def constrain(transitions, start, end, allowed, start_ok, end_ok):
    """``(transitions, start, end)`` with forbidden entries replaced by :data:`NEG`."""
    return (
        jnp.where(allowed, transitions, NEG),
        jnp.where(start_ok, start, NEG),
        jnp.where(end_ok, end, NEG),
    )
