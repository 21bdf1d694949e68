"""Layers written out by hand so that per-example gradient norms can be computed from activations.

The LSTM keeps its input projection ``x @ wi + b`` outside the time loop and names it with
``self.perturb("preact", ...)``: the gradient with respect to that (zero) perturbation is the
gradient of every gate pre-activation, which is what ghost-norm clipping needs. The weight layout
(``wi``: (d, 4h), ``wh``: (h, 4h), ``b``: (4h,), gates in the order i, f, g, o) is the fused one
of Keras' LSTM.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


class LSTM(nn.Module):
    """One LSTM layer over (B, L, d) inputs -> (B, L, h) hidden states.

    ``lengths`` (B,) marks the real steps; with ``reverse=True`` each sequence is read backwards
    from its own last real step (so padding never reaches a real step). The state is zero at the
    start; the forget-gate bias starts at 1.
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
        self.sow("intermediates", "inputs", x)
        preact = self.perturb("preact", x @ wi + bias)
        valid = (jnp.arange(l_)[None, :] < lengths[:, None]).astype(x.dtype)  # (B, L)

        def step(carry, inp):
            hp, cp = carry
            z, m = inp
            i, f, g, o = jnp.split(z + hp @ wh, 4, axis=-1)
            c = jax.nn.sigmoid(f) * cp + jax.nn.sigmoid(i) * jnp.tanh(g)
            hn = jax.nn.sigmoid(o) * jnp.tanh(c)
            m = m[:, None]
            c = m * c + (1 - m) * cp
            hn = m * hn + (1 - m) * hp
            return (hn, c), hn

        zeros = jnp.zeros((b_, h), x.dtype)
        _, hs = jax.lax.scan(step, (zeros, zeros), (preact.swapaxes(0, 1), valid.swapaxes(0, 1)))
        hs = hs.swapaxes(0, 1)  # (B, L, h)
        self.sow("intermediates", "prev_hidden", jnp.concatenate([zeros[:, None], hs[:, :-1]], axis=1))
        hs = hs * valid[..., None]
        if self.reverse:
            hs = reverse_padded(hs, lengths)
        return hs


def reverse_padded(x: jax.Array, lengths: jax.Array) -> jax.Array:
    """Reverse each sequence's first ``lengths[b]`` steps in place; padding stays at the end."""
    l_ = x.shape[1]
    idx = jnp.arange(l_)[None, :]
    src = jnp.where(idx < lengths[:, None], lengths[:, None] - 1 - idx, idx)
    return jnp.take_along_axis(x, src[..., None], axis=1)
