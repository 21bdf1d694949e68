"""BERT (Devlin et al. 2019) built only from the hook-recording layers of :mod:`fedpriv.models.layers`.

Every parameterized op is a :class:`~fedpriv.models.layers.Dense`, :class:`~fedpriv.models.layers.Embed`
or :class:`~fedpriv.models.layers.LayerNorm` called exactly once per forward pass, so fast
per-example clipping (ghost norms) applies to the whole model, as in DP-BERT (Hoory et al. 2021).

Shapes: B examples, L positions, H = ``hidden``. Inputs are ``ids`` (B, L) int32 and ``length``
(B,) int32, the number of real positions of each row (``[CLS] ... [SEP]``); positions at or
after ``length`` are padding, never attended to, and their outputs are meaningless.

* :class:`BertEncoder`: token + position (+ optional token-type) embeddings -> LayerNorm ->
  dropout -> ``layers`` post-LN blocks (self-attention with the padding mask, residual +
  LayerNorm; FFN Dense-gelu-Dense, residual + LayerNorm) -> (B, L, H).
* :class:`BertMLM`: encoder + MLM head (Dense, gelu, LayerNorm, Dense to the vocabulary). The
  output layer is NOT tied to the token embedding (unlike original BERT): a second use of the
  embedding table would defeat the per-layer hooks (the layer would fall back to the slow
  per-example path). It costs H * vocab extra parameters.
* :class:`BertTokenClassifier`: encoder + dropout + Dense to ``num_labels``.

Both heads keep the encoder under the parameter key ``"encoder"``, so MLM-pretrained encoder
parameters fine-tune a classifier (:func:`transfer_encoder`).

Dropout (rate ``cfg.dropout`` on embeddings, attention probabilities, attention output, FFN output
and the classifier input) is active only with ``train=True``. Its masks come either from
``dropout_keys`` ((B,) keys, one per example: row b's masks depend on ``dropout_keys[b]`` and the
dropout site only, so an example's output does not depend on the other rows or on its row index,
and a vmap over single examples gives the same values, which the DP-SGD reference path relies
on) or, when ``dropout_keys`` is None, from the usual flax ``"dropout"`` rng (one batch-wide
draw). The tasks pass ``dropout_keys``. Each key gives one 32-bit seed per example; the masks
are a counter-based hash of (seed, dropout site, element) (:class:`RowDropout`). Gelu is the exact (erf) one;
weights start from a truncated normal with std 0.02, LayerNorm epsilon is 1e-12, as in BERT.
No pooler ([CLS] head) is built: neither task uses it.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedpriv.models.layers import Dense, Embed, LayerNorm

_INIT = nn.initializers.truncated_normal(0.02)
_EPS = 1e-12


@dataclass(frozen=True)
class BertConfig:
    """Model shape. ``max_len`` is the size of the position table (the longest input);
    ``type_vocab`` = 0 builds no token-type (segment) embedding (single-segment inputs)."""

    vocab_size: int = 30_522
    hidden: int = 256
    layers: int = 4
    heads: int = 4
    intermediate: int = 1024
    max_len: int = 128
    dropout: float = 0.1
    type_vocab: int = 0

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if min(self.vocab_size, self.hidden, self.layers, self.heads, self.intermediate, self.max_len) < 1:
            raise ValueError("BertConfig sizes must be positive")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


#: "small" is the shape the brief calls BERT-small (4 x 256, 4 heads, FFN 1024); in Turc et al.
#: (2019)'s naming this is BERT-Mini (their BERT-Small is 4 x 512). ``vocab_size`` is replaced by
#: the tokenizer's vocabulary size when a task builds the model.
PRESETS = {
    "tiny": BertConfig(hidden=64, layers=2, heads=2, intermediate=128),
    "small": BertConfig(hidden=256, layers=4, heads=4, intermediate=1024),
}


def padding_mask(length: jax.Array, size: int) -> jax.Array:
    """(B, size) bool, True at the real positions (index < length)."""
    return jnp.arange(size)[None, :] < length[:, None]


def _mix32(x: jax.Array) -> jax.Array:
    """A 32-bit integer hash (lowbias32, C. Wellons): uint32 -> uint32, well mixed."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def dropout_seeds(
    train: bool, rate: float, batch: int, dropout_keys: jax.Array | None, make_rng
) -> jax.Array | None:
    """(B,) uint32 per-example dropout seeds: from ``dropout_keys`` (B,) when given, else from
    the flax ``"dropout"`` rng; None when dropout is off (eval, or rate 0)."""
    if not train or rate == 0.0:
        return None
    if dropout_keys is not None:
        return jax.vmap(lambda k: jax.random.bits(k, (), jnp.uint32))(dropout_keys)
    return jax.random.bits(make_rng("dropout"), (batch,), jnp.uint32)


class RowDropout(nn.Module):
    """Inverted dropout of x (B, ...); row b's mask is a hash of (``seeds[b]``, this module's
    path, element index) only, so it does not depend on the other rows. ``seeds=None``: identity.

    A counter-based hash instead of ``jax.random`` per site: the same statistics for dropout's
    purpose, and much cheaper to compile than one threefry per dropout site."""

    rate: float

    @nn.compact
    def __call__(self, x: jax.Array, seeds: jax.Array | None) -> jax.Array:
        if seeds is None or self.rate == 0.0:
            return x
        keep_p = 1.0 - self.rate
        site = jnp.uint32(zlib.crc32("/".join(self.path).encode()))
        row = _mix32(seeds.astype(jnp.uint32) ^ _mix32(site))  # (B,)
        idx = jnp.arange(math.prod(x.shape[1:]), dtype=jnp.uint32).reshape(x.shape[1:])
        bits = _mix32(_mix32(idx[None] + row.reshape((-1,) + (1,) * (x.ndim - 1)) * jnp.uint32(0x9E3779B9)))
        keep = (bits >> 8).astype(jnp.int32) < int(round(keep_p * (1 << 24)))
        return jnp.where(keep, x / keep_p, jnp.zeros_like(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention: (B, L, H) -> (B, L, H); keys at padding positions get zero weight."""

    cfg: BertConfig

    @nn.compact
    def __call__(self, x: jax.Array, valid: jax.Array, seeds: jax.Array | None = None) -> jax.Array:
        c = self.cfg
        b_, l_, h = x.shape
        dh = h // c.heads

        def heads(y):
            return y.reshape(b_, l_, c.heads, dh)

        q = heads(Dense(h, kernel_init=_INIT, name="query")(x))
        k = heads(Dense(h, kernel_init=_INIT, name="key")(x))
        v = heads(Dense(h, kernel_init=_INIT, name="value")(x))
        logits = jnp.einsum("bqnd,bknd->bnqk", q, k) / math.sqrt(dh)
        # where (not +bias) so masked keys get exactly zero weight; an all-padding row is uniform.
        logits = jnp.where(valid[:, None, None, :], logits, jnp.finfo(logits.dtype).min)
        weights = jax.nn.softmax(logits, axis=-1)
        weights = RowDropout(c.dropout, name="probs_dropout")(weights, seeds)
        out = jnp.einsum("bnqk,bknd->bqnd", weights, v).reshape(b_, l_, h)
        return Dense(h, kernel_init=_INIT, name="out")(out)


class TransformerBlock(nn.Module):
    """Post-LN block: LN(x + drop(attn(x))), then LN(y + drop(W2 gelu(W1 y)))."""

    cfg: BertConfig

    @nn.compact
    def __call__(self, x: jax.Array, valid: jax.Array, seeds: jax.Array | None = None) -> jax.Array:
        c = self.cfg
        a = SelfAttention(c, name="attention")(x, valid, seeds)
        a = RowDropout(c.dropout, name="attention_dropout")(a, seeds)
        x = LayerNorm(_EPS, name="attention_norm")(x + a)
        f = Dense(c.intermediate, kernel_init=_INIT, name="ffn_in")(x)
        f = Dense(c.hidden, kernel_init=_INIT, name="ffn_out")(jax.nn.gelu(f, approximate=False))
        f = RowDropout(c.dropout, name="ffn_dropout")(f, seeds)
        return LayerNorm(_EPS, name="ffn_norm")(x + f)


class BertEncoder(nn.Module):
    """ids (B, L) int32, length (B,) int32 [, type_ids (B, L)] -> hidden states (B, L, H). L <= max_len.
    ``dropout_keys``: optional (B,) per-example keys (see the module docstring); or ``seeds``
    (B,) uint32 from :func:`dropout_seeds` (a head that also drops out passes the ones it made)."""

    cfg: BertConfig

    @nn.compact
    def __call__(
        self,
        ids: jax.Array,
        length: jax.Array,
        train: bool = False,
        type_ids: jax.Array | None = None,
        dropout_keys: jax.Array | None = None,
        seeds: jax.Array | None = None,
    ) -> jax.Array:
        c = self.cfg
        b_, l_ = ids.shape
        if seeds is None:
            seeds = dropout_seeds(train, c.dropout, b_, dropout_keys, self.make_rng)
        if l_ > c.max_len:
            raise ValueError(f"input length {l_} exceeds the position table ({c.max_len})")
        positions = jnp.broadcast_to(jnp.arange(l_, dtype=jnp.int32), (b_, l_))
        x = Embed(c.vocab_size, c.hidden, embedding_init=_INIT, name="token_embed")(ids)
        x = x + Embed(c.max_len, c.hidden, embedding_init=_INIT, name="position_embed")(positions)
        if c.type_vocab:
            if type_ids is None:
                type_ids = jnp.zeros_like(ids)
            x = x + Embed(c.type_vocab, c.hidden, embedding_init=_INIT, name="type_embed")(type_ids)
        x = LayerNorm(_EPS, name="embed_norm")(x)
        x = RowDropout(c.dropout, name="embed_dropout")(x, seeds)
        valid = padding_mask(length, l_)
        for i in range(c.layers):
            x = TransformerBlock(c, name=f"layer_{i}")(x, valid, seeds)
        return x


class BertMLM(nn.Module):
    """Encoder + MLM head. Returns logits (B, L, vocab), or (B, P, vocab) at ``predict_positions``
    (B, P) int32 when given (the head then runs on the P gathered positions only)."""

    cfg: BertConfig

    @nn.compact
    def __call__(
        self,
        ids: jax.Array,
        length: jax.Array,
        predict_positions: jax.Array | None = None,
        train: bool = False,
        dropout_keys: jax.Array | None = None,
    ) -> jax.Array:
        c = self.cfg
        h = BertEncoder(c, name="encoder")(ids, length, train, dropout_keys=dropout_keys)
        if predict_positions is not None:
            h = jnp.take_along_axis(h, predict_positions[..., None].astype(jnp.int32), axis=1)
        h = jax.nn.gelu(Dense(c.hidden, kernel_init=_INIT, name="mlm_dense")(h), approximate=False)
        h = LayerNorm(_EPS, name="mlm_norm")(h)
        # Untied output layer (see the module docstring).
        return Dense(c.vocab_size, kernel_init=_INIT, name="mlm_output")(h)


class BertTokenClassifier(nn.Module):
    """Encoder + dropout + Dense: ids (B, L), length (B,) -> per-position logits (B, L, num_labels)."""

    cfg: BertConfig
    num_labels: int

    @nn.compact
    def __call__(self, ids: jax.Array, length: jax.Array, train: bool = False, dropout_keys: jax.Array | None = None) -> jax.Array:
        seeds = dropout_seeds(train, self.cfg.dropout, ids.shape[0], dropout_keys, self.make_rng)
        h = BertEncoder(self.cfg, name="encoder")(ids, length, train, seeds=seeds)
        h = RowDropout(self.cfg.dropout, name="classifier_dropout")(h, seeds)
        return Dense(self.num_labels, kernel_init=_INIT, name="classifier")(h)


def _shapes(tree) -> dict:
    return jax.tree_util.tree_map(lambda a: (tuple(a.shape), str(a.dtype)), tree)


def transfer_encoder(mlm_params, classifier_params):
    """``classifier_params`` with its ``"encoder"`` subtree replaced by the one of ``mlm_params``.

    ``mlm_params`` may be a whole :class:`BertMLM` parameter tree or an encoder subtree. The two
    encoders must have the same structure and shapes (same :class:`BertConfig` apart from
    dropout), else ValueError. Other (head) parameters are kept; nothing is mutated.
    """
    src = mlm_params["encoder"] if "encoder" in mlm_params else mlm_params
    dst = classifier_params["encoder"]
    if _shapes(src) != _shapes(dst):
        raise ValueError("the pretrained encoder's parameters do not match the classifier's (different BertConfig?)")
    return {**classifier_params, "encoder": jax.tree_util.tree_map(lambda a: a, src)}


def param_count(params) -> int:
    """Total number of scalars in a parameter tree."""
    return int(sum(x.size for x in jax.tree_util.tree_leaves(params)))
