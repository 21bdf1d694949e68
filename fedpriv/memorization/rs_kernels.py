"""Compiled pieces of fast Random Sampling (:mod:`fedpriv.memorization.rs_fast`).

Shapes are fixed per model (callers pad rows to a block size), so each kernel compiles once.
Log-probabilities are computed with the reference's formulas (:mod:`fedpriv.memorization.lm`):
``log P(t | state) = p . w[:, t] + b[t] - lse(p)`` with ``lse(p) = logsumexp(p @ w + b)``.

Bounds on lse at a projection p, from an anchor projection a where lse(a) and its gradient
g(a) = w softmax(a @ w + b) are known, with d = p - a:

* lower: lse(p) >= lse(a) + g(a) . d, since lse is convex in p;
* upper: lse(p) <= lse(a) + g(a) . d + R^2 |d|^2 / 2, since the Hessian of lse in p is the
  covariance of the output columns under the softmax, whose largest eigenvalue is at most R^2
  for columns within distance R of a centre c; and lse(p) <= lse(a) + max_v d . w[:, v]
  <= lse(a) + d . c + R |d|.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.memorization.lstm_tables import LSTMTables, cell


def pad(x: np.ndarray, size: int) -> np.ndarray:
    """``x`` with zero rows appended up to ``size`` rows."""
    if len(x) == size:
        return x
    return np.concatenate([x, np.zeros((size - len(x),) + x.shape[1:], x.dtype)])


def pad_rows(x: jax.Array, size: int) -> jax.Array:
    return jnp.pad(x, [(0, size - x.shape[0])] + [(0, 0)] * (x.ndim - 1))


def blocks(n: int, block: int):
    for lo in range(0, n, block):
        yield lo, min(lo + block, n)


def gathered(fn: Callable, n: int, block: int, *row_args: np.ndarray, fixed: tuple = ()):
    """``fn(*fixed, *rows)`` over row arguments of length n, ``block`` rows per call (padded);
    an array, or a tuple of arrays when ``fn`` returns a tuple."""
    total = -(-n // block) * block
    padded = [pad(a[:n], total) for a in row_args]
    out = []
    for lo in range(0, total, block):
        res = fn(*fixed, *(a[lo : lo + block] for a in padded))
        out.append(res if isinstance(res, tuple) else (res,))
    if not out:
        return np.zeros(0, np.float32)
    cat = tuple(np.concatenate([np.asarray(r) for r in x])[:n] for x in zip(*out))
    return cat if len(cat) > 1 else cat[0]


@jax.jit
def first_states(t: LSTMTables, r0, c0, words):
    """States after each first word from the prefix state (c0, r0 = h0 @ wh), their projections
    and log-normalizers, and the log-probabilities of every next id (B, V)."""
    h, c = cell(t.gates_in[words] + r0, c0)
    p = h @ t.proj_w + t.proj_b
    logits = p @ t.out_w + t.out_b
    lse = jax.nn.logsumexp(logits, axis=-1)
    return h, c, p, lse, logits - lse[:, None]


@jax.jit
def log_prob_of(p, lse, w, b, rows, targets):
    """log P(targets | state rows): the reference's ``next_log_probs`` on gathered rows."""
    return jnp.einsum("bd,db->b", p[rows], jnp.take(w, targets, axis=1)) + jnp.take(b, targets) - lse[rows]


@jax.jit
def logit_rows(w, b, p, targets):
    """p . w[:, targets] + b[targets] per row: the reference's ``next_log_probs`` before lse."""
    return jnp.einsum("bd,db->b", p, jnp.take(w, targets, axis=1)) + jnp.take(b, targets)


@jax.jit
def recurrent(h, wh):
    return h @ wh


@jax.jit
def anchors(t: LSTMTables, r_bar, c_bar, words):
    """Anchor projections for second words (from the mean first-word state), with lse and its
    gradient there."""
    h, _ = cell(t.gates_in[words] + r_bar, c_bar)
    a = h @ t.proj_w + t.proj_b
    logits = a @ t.out_w + t.out_b
    lse = jax.nn.logsumexp(logits, axis=-1)
    return a, lse, jnp.exp(logits - lse[:, None]) @ t.out_w.T


def _second(t: LSTMTables, r1, c1, rows, words):
    h, _ = cell(t.gates_in[words] + r1[rows], c1[rows])
    return h @ t.proj_w + t.proj_b


@jax.jit
def second_projection(t: LSTMTables, r1, c1, rows, words):
    """The projection p after the second word, for (first-word row, second word) pairs."""
    return _second(t, r1, c1, rows, words)


@jax.jit
def second_bounds(t: LSTMTables, r1, c1, anchor, rows, words, targets, arows):
    """For candidates (first-word row, second word, third word, anchor row of the second word):
    the third word's logit z at the projection p after the second word, and lower and upper
    bounds on lse(p) (module docstring)."""
    p = _second(t, r1, c1, rows, words)
    z = jnp.sum(p * t.out_wt[targets], axis=-1) + t.out_b[targets]  # rounding may differ from the reference's
    a, lse_a, g = anchor[0][arows], anchor[1][arows], anchor[2][arows]
    return (z, *lse_bounds(lse_a, g, p - a, t.out_center, t.out_radius))


def lse_bounds(lse_a: jax.Array, g: jax.Array, d: jax.Array, center: jax.Array, radius: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Lower and upper bounds on lse(a + d) from lse(a) and its gradient g (module docstring);
    ``center`` and ``radius``: a ball holding the output columns."""
    tangent = lse_a + jnp.sum(g * d, axis=-1)
    sq = jnp.sum(d * d, axis=-1)
    return tangent, jnp.minimum(tangent + 0.5 * radius * radius * sq, lse_a + d @ center + radius * jnp.sqrt(sq))


@jax.jit
def full_lse(t: LSTMTables, p):
    """lse(p), as the reference computes it."""
    return jax.nn.logsumexp(p @ t.out_w + t.out_b, axis=-1)
