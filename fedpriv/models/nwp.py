"""The next-word-prediction LSTM of the Stack Overflow baseline (Reddi et al. 2021; Thakkar et al. 2021).

word embedding (96) -> one LSTM layer (670 units) -> Dense projection (96) -> logits over the
extended vocabulary (10,004 ids: 10,000 words + pad, oov, bos, eos). With ``tie_embeddings`` the
output layer is the transposed input embedding (plus a bias), which needs projection == embedding.
"""

from __future__ import annotations

from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedpriv.models.layers import LSTM, Dense, Embed


@dataclass(frozen=True)
class NWPConfig:
    vocab_size: int = 10_004
    embed_dim: int = 96
    lstm_units: int = 670
    projection_dim: int = 96
    tie_embeddings: bool = False


PRESETS = {
    "stackoverflow": NWPConfig(),
    "small": NWPConfig(embed_dim=64, lstm_units=256, projection_dim=64),
    "tiny": NWPConfig(embed_dim=16, lstm_units=32, projection_dim=16),
}


class NWPLSTM(nn.Module):
    """ids (B, L) int32 -> logits (B, L, vocab_size). Id 0 is padding."""

    cfg: NWPConfig

    @nn.compact
    def __call__(self, ids: jax.Array) -> jax.Array:
        c = self.cfg
        if c.tie_embeddings and c.projection_dim != c.embed_dim:
            raise ValueError("tie_embeddings needs projection_dim == embed_dim")
        embed = Embed(c.vocab_size, c.embed_dim, embedding_init=nn.initializers.normal(0.05), name="embed")
        lengths = jnp.sum(ids != 0, axis=1)
        # Inputs start with bos, so every real sequence has length >= 1; a padding row has 0.
        h = LSTM(c.lstm_units, name="lstm")(embed(ids), lengths)
        p = Dense(c.projection_dim, name="projection")(h)
        if c.tie_embeddings:
            # The table's second use is outside the Embed layer: DP-SGD uses the reference path.
            bias = self.param("output_bias", nn.initializers.zeros, (c.vocab_size,))
            return p @ embed.variables["params"]["embedding"].T + bias
        return Dense(c.vocab_size, name="output")(p)
