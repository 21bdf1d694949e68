"""Layers that expose what fast per-example gradient clipping needs.

Each layer records, in the ``intermediates`` collection, the activation its weights multiply
(``ghost_in``; for the LSTM also ``ghost_prev``), and names its output with
``self.perturb("ghost_out", ...)``: the gradient of the per-example losses with respect to that
zero perturbation is the output gradient of every position. From the two, per-example gradient
norms ("ghost norms") and the clipped gradient sum ("book-keeping") follow without ever
materializing per-example gradients (see :mod:`fedpriv.central.clipping`).

Outside DP-SGD the extra collections are simply not requested and cost nothing. A layer must be
called once per forward pass (a layer applied twice, or a parameter used outside its layer, e.g.
tied input/output embeddings, is detected and handled by the reference per-example path).
A layer's kind is told by its parameter names: ``kernel`` (Dense), ``embedding`` (Embed),
``scale`` (LayerNorm), ``wi``/``wh``/``b`` (LSTM).
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

class Dense(nn.Module):
    """y = x @ kernel + bias over the last axis of x (any leading axes: batch, positions)."""

    features: int
    use_bias: bool = True
    kernel_init: Callable = nn.initializers.lecun_normal()

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features))
        y = x @ kernel
        if self.use_bias:
            y = y + self.param("bias", nn.initializers.zeros, (self.features,))
        self.sow("intermediates", "ghost_in", x)
        return self.perturb("ghost_out", y)


class Embed(nn.Module):
    """ids (any shape, int) -> embeddings (..., features). ``attend`` is NOT provided: tie weights
    with care (a second use of the table makes the layer fall back to the reference path)."""

    num_embeddings: int
    features: int
    embedding_init: Callable = nn.initializers.normal(stddev=1.0)

    @nn.compact
    def __call__(self, ids: jax.Array) -> jax.Array:
        table = self.param("embedding", self.embedding_init, (self.num_embeddings, self.features))
        self.sow("intermediates", "ghost_in", ids)
        return self.perturb("ghost_out", jnp.take(table, ids, axis=0))


class LayerNorm(nn.Module):
    """Layer normalization over the last axis, with scale and bias."""

    epsilon: float = 1e-6

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        d = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones, (d,))
        bias = self.param("bias", nn.initializers.zeros, (d,))
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        xhat = (x - mean) * jax.lax.rsqrt(var + self.epsilon)
        self.sow("intermediates", "ghost_in", xhat)
        return self.perturb("ghost_out", xhat * scale + bias)


class LSTM(nn.Module):
    """One LSTM layer over (B, L, d) inputs -> (B, L, h) hidden states.

    Fused weights as in Keras: ``wi`` (d, 4h), ``wh`` (h, 4h), ``b`` (4h,), gates i, f, g, o.
    ``lengths`` (B,) marks the real steps; with ``reverse=True`` each sequence is read backwards
    from its own last real step, so padding never reaches a real step. The state starts at zero;
    the forget-gate bias starts at 1. The gate pre-activations ``x @ wi + h_prev @ wh + b`` are the
    perturbed output; ``ghost_in`` is x and ``ghost_prev`` is h_prev at every step.
    """

    features: int
    reverse: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, lengths: jax.Array | None = None) -> jax.Array:
        b_, l_, d = x.shape
        h = self.features
        wi = self.param("wi", nn.initializers.glorot_uniform(), (d, 4 * h))
        wh = self.param("wh", nn.initializers.orthogonal(), (h, 4 * h))
        bias = self.param("b", lambda _k, s: jnp.zeros(s).at[h : 2 * h].set(1.0), (4 * h,))
        if lengths is None:
            lengths = jnp.full((b_,), l_, dtype=jnp.int32)
        if self.reverse:
            x = reverse_padded(x, lengths)
        valid = (jnp.arange(l_)[None, :] < lengths[:, None]).astype(x.dtype)  # (B, L)
        # The recurrent term's gradient flows through the same pre-activation as the input term,
        # so one perturbation of (x @ wi + b) carries the output gradient of every step.
        preact = self.perturb("ghost_out", x @ wi + bias)

        def step(carry, inp):
            hp, cp = carry
            z, m = inp
            hn, c = lstm_cell(z, hp, cp, wh)
            m = m[:, None]
            c = m * c + (1 - m) * cp
            hn = m * hn + (1 - m) * hp
            return (hn, c), hn

        zeros = jnp.zeros((b_, h), x.dtype)
        _, hs = jax.lax.scan(step, (zeros, zeros), (preact.swapaxes(0, 1), valid.swapaxes(0, 1)))
        hs = hs.swapaxes(0, 1)  # (B, L, h), state carried unchanged through padding
        self.sow("intermediates", "ghost_in", x)
        self.sow("intermediates", "ghost_prev", jnp.concatenate([zeros[:, None], hs[:, :-1]], axis=1))
        hs = hs * valid[..., None]
        if self.reverse:
            hs = reverse_padded(hs, lengths)
        return hs


def lstm_cell(z: jax.Array, h: jax.Array, c: jax.Array, wh: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One LSTM step: ``z`` = x @ wi + b (gates i, f, g, o), previous state (h, c) -> new (h, c)."""
    i, f, g, o = jnp.split(z + h @ wh, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    return jax.nn.sigmoid(o) * jnp.tanh(c), c


def reverse_padded(x: jax.Array, lengths: jax.Array) -> jax.Array:
    """Reverse each sequence's first ``lengths[b]`` steps in place; padding stays at the end."""
    l_ = x.shape[1]
    idx = jnp.arange(l_)[None, :]
    src = jnp.where(idx < lengths[:, None], lengths[:, None] - 1 - idx, idx)
    return jnp.take_along_axis(x, src[..., None], axis=1)
