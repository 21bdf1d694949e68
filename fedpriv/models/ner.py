"""BiLSTM tagger for NER: word (+ casing) embeddings -> BiLSTM -> per-token emission scores.

Inputs are per example and padded to a fixed length L: ``tokens`` (B, L) int32 word ids (0 =
pad), ``case`` (B, L) int32 casing classes (see :func:`case_class`), ``length`` (B,) int32 real
tokens. Output: emissions (B, L, num_tags) (unnormalized scores; positions >= length are
meaningless). Parameters: ``embed``, ``case_embed``, ``lstm_forward``, ``lstm_backward``,
``emissions``; with ``head = "crf"`` the module also owns ``transitions`` (T, T), ``start`` (T,)
and ``end`` (T,) parameters, read by the task's CRF loss and Viterbi decoding
(:mod:`fedpriv.models.crf`); the forward pass itself is the same for both heads.

No batch statistics: example b's outputs depend only on row b (the backward LSTM reads each row
from its own last real token, so padding never reaches a real position). The layers are those of
:mod:`fedpriv.models.layers`, so DP-SGD clips the softmax tagger with ghost norms; the CRF's
transition parameters are outside those layers, and the CRF tagger uses the vmap reference.
Dropout (embeddings and BiLSTM outputs) is active only with ``train=True`` and draws from the
``"dropout"`` rng.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedpriv.models.layers import LSTM, Dense, Embed

# Casing / shape classes of a token (0 is padding).
CASE_PAD, CASE_LOWER, CASE_TITLE, CASE_UPPER, CASE_MIXED, CASE_NUMERIC, CASE_OTHER, CASE_MENTION, CASE_HASHTAG, CASE_URL = range(10)
NUM_CASES = 10


def case_class(token: str) -> int:
    """The casing class of a raw (not lowercased) token.

    url (http://, https://, www.), @mention, #hashtag, then by its letters: lower (all lowercase),
    Title (first character uppercase, no other uppercase letter), UPPER (all of >= 2 letters
    uppercase), mIxed; without letters: numeric (has a digit) or other (punctuation, symbols).
    """
    low = token.lower()
    if low.startswith(("http://", "https://", "www.")):
        return CASE_URL
    if len(token) > 1 and token[0] == "@":
        return CASE_MENTION
    if len(token) > 1 and token[0] == "#":
        return CASE_HASHTAG
    letters = [c for c in token if c.isalpha()]
    if not letters:
        return CASE_NUMERIC if any(c.isdigit() for c in token) else CASE_OTHER
    if all(c.islower() for c in letters):
        return CASE_LOWER
    if token[0].isupper() and not any(c.isupper() for c in token[1:]):
        return CASE_TITLE
    if len(letters) >= 2 and all(c.isupper() for c in letters):
        return CASE_UPPER
    return CASE_MIXED


class BiLSTMTagger(nn.Module):
    """(tokens, case, length) -> emissions (B, L, num_tags); see the module docstring."""

    vocab_size: int
    num_tags: int
    embed_dim: int = 100
    hidden: int = 100
    case_dim: int = 16  # 0: no casing feature
    dropout: float = 0.5
    head: str = "softmax"  # "softmax" or "crf"
    char_dim: int = 0  # 0: no character features
    char_filters: int = 50

    @nn.compact
    def __call__(self, tokens: jax.Array, case: jax.Array, length: jax.Array, train: bool = False, chars: jax.Array | None = None) -> jax.Array:
        if self.head not in ("softmax", "crf"):
            raise ValueError(f"head must be 'softmax' or 'crf', got {self.head!r}")
        x = Embed(self.vocab_size, self.embed_dim, name="embed")(tokens)
        if self.case_dim > 0:
            x = jnp.concatenate([x, Embed(NUM_CASES, self.case_dim, name="case_embed")(case)], axis=-1)
        if self.char_dim > 0:
            x = jnp.concatenate([x, self._char_features(chars)], axis=-1)
        x = nn.Dropout(self.dropout, deterministic=not train)(x)
        length = length.astype(jnp.int32)
        h = jnp.concatenate(
            [LSTM(self.hidden, name="lstm_forward")(x, length), LSTM(self.hidden, reverse=True, name="lstm_backward")(x, length)], axis=-1
        )
        h = nn.Dropout(self.dropout, deterministic=not train)(h)
        emissions = Dense(self.num_tags, name="emissions")(h)
        if self.head == "crf":
            T = self.num_tags
            self.param("transitions", nn.initializers.zeros, (T, T))
            self.param("start", nn.initializers.zeros, (T,))
            self.param("end", nn.initializers.zeros, (T,))
        return emissions

    def _char_features(self, chars: jax.Array) -> jax.Array:
        """(B, L, W) character ids (0 = pad) -> (B, L, char_filters): a width-3 convolution over each
        token's characters (a Dense over concatenated neighbour embeddings), tanh, max over the
        token's characters (Ma and Hovy 2016); 0 for padding tokens."""
        c = Embed(CHAR_BUCKETS, self.char_dim, name="char_embed")(chars)
        p = jnp.pad(c, ((0, 0), (0, 0), (1, 1), (0, 0)))
        windows = jnp.concatenate([p[:, :, :-2], p[:, :, 1:-1], p[:, :, 2:]], axis=-1)
        h = jnp.tanh(Dense(self.char_filters, name="char_conv")(windows))
        real = (chars > 0)[..., None]
        h = jnp.max(jnp.where(real, h, -1.0), axis=2)
        return h * jnp.any(real, axis=2)


CHAR_BUCKETS = 256


def char_ids(token: str, width: int) -> list[int]:
    """A token's first ``width`` characters as ids 1..255 (code point mod 255, plus 1; 0 is padding)."""
    return [1 + ord(ch) % 255 for ch in token[:width]]
