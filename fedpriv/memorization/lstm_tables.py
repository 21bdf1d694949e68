"""Per-model tables of the NWP LSTM that make one more word a lookup instead of a matrix product.

For the model of :mod:`fedpriv.models.nwp` (weights as in :func:`fedpriv.memorization.lm.advance`):

* ``gates_in`` (V, 4H): ``embedding @ wi + b`` for every id, the input-to-gate pre-activation of
  a word; computed once per model (for the Stack Overflow shape 10,004 x 2,680 float32, 107 MB);
* the output layer as ``w`` (d, V) and ``b`` (V,), exactly the arrays the reference multiplies
  (and ``w`` transposed, for the bounds' fast row gathers), and the ball that holds its columns: centre ``out_center`` (d,), the columns' mean, and radius
  ``out_radius`` = max_v ||w[:, v] - centre|| (rounded up by 1e-5 relative). It bounds how fast the
  log-normalizer of the next word can change with the projection (see :mod:`.rs_kernels`).

A state (h, c) fed word ``t`` with recurrent product ``r = h @ wh`` becomes
``cell(gates_in[t] + r, c)``: the same additions in the same order as
:func:`fedpriv.models.layers.lstm_cell`, so it agrees with the step-by-step model to float32
rounding (tested). Tables are built once per :class:`NWPStepper` and cached with it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from fedpriv.memorization.lm import output_layer

_CACHE: weakref.WeakKeyDictionary[Any, LSTMTables] = weakref.WeakKeyDictionary()


@partial(jax.tree_util.register_dataclass, data_fields=["gates_in", "wh", "proj_w", "proj_b", "out_w", "out_wt", "out_b", "out_center", "out_radius"], meta_fields=[])
@dataclass(frozen=True)
class LSTMTables:
    gates_in: jax.Array  # (V, 4H) embedding @ wi + b
    wh: jax.Array  # (H, 4H) recurrent weights
    proj_w: jax.Array  # (H, d) projection kernel
    proj_b: jax.Array  # (d,)
    out_w: jax.Array  # (d, V) output layer (tied or not), as the reference uses it
    out_wt: jax.Array  # (V, d) its transpose, for gathering one id's column fast
    out_b: jax.Array  # (V,)
    out_center: jax.Array  # (d,) mean of the output columns
    out_radius: jax.Array  # () max distance of an output column from out_center

    @property
    def vocab_size(self) -> int:
        return int(self.out_b.shape[0])


def is_nwp_lstm(params: Any) -> bool:
    """True for parameters laid out like :class:`fedpriv.models.nwp.NWPLSTM` (one LSTM layer)."""
    try:
        lstm = params["lstm"]
        return all(k in lstm for k in ("wi", "wh", "b")) and "embedding" in params["embed"] and "kernel" in params["projection"]
    except (KeyError, TypeError):
        return False


@jax.jit
def _gates_in(params: Any) -> jax.Array:
    lstm = params["lstm"]
    return params["embed"]["embedding"] @ lstm["wi"] + lstm["b"]


@jax.jit
def _ball(w: jax.Array) -> tuple[jax.Array, jax.Array]:
    center = jnp.mean(w, axis=1)
    return center, jnp.max(jnp.linalg.norm(w - center[:, None], axis=0)) * (1 + 1e-5)


def build_tables(params: Any) -> LSTMTables:
    w, b = output_layer(params)
    center, radius = _ball(w)
    return LSTMTables(
        gates_in=_gates_in(params),
        wh=params["lstm"]["wh"],
        proj_w=params["projection"]["kernel"],
        proj_b=params["projection"]["bias"],
        out_w=w,
        out_wt=jnp.asarray(w.T),
        out_b=b,
        out_center=center,
        out_radius=radius,
    )


def tables_for(stepper: Any) -> LSTMTables:
    """The stepper's tables, built on first use and kept as long as the stepper lives."""
    t = _CACHE.get(stepper)
    if t is None:
        t = _CACHE[stepper] = build_tables(stepper.params)
    return t


def cell(pre: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The LSTM gates from pre-activations ``pre`` = x @ wi + b + h @ wh (B, 4H; gates i, f, g, o)
    and the previous cell ``c`` (B, H): the new (h, c), as :func:`~fedpriv.models.layers.lstm_cell`."""
    i, f, g, o = jnp.split(pre, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    return jax.nn.sigmoid(o) * jnp.tanh(c), c
