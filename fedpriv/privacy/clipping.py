"""Per-example clipping for DP-SGD: the clipped gradient sum of a batch, two ways.

* :func:`reference_clipped_sum`: ``vmap`` of the per-example gradient, each clipped to global L2
  norm C, summed (materializes B gradients; works for any task).
* :func:`fast_clipped_sum`: never materializes per-example gradients. One forward pass records
  each layer's input activation a (``ghost_in``) and one backward pass gives its output gradient
  g = d loss_i / d out (through the zero ``ghost_out`` perturbation). For a weight W used as
  ``out_t = a_t W`` at positions t, example i's gradient is sum_t a_t^T g_t, whose squared norm is

      ||sum_t a_t^T g_t||_F^2 = sum_{t,s} (a_t . a_s)(g_t . g_s)        (the "ghost norm")

  (or the materialized sum when that is cheaper, e.g. one position). Embeddings use
  [id_t == id_s] in place of a_t . a_s. With per-example norms n_i and factors
  c_i = min(1, C / n_i), the clipped sum is assembled layer by layer from the same records
  ("book-keeping"): sum_i c_i sum_t a_t^T g_t. No second backward pass.

The fast path covers the layers of :mod:`fedpriv.models.layers` (Dense, Embed, LayerNorm, LSTM)
when every parameter of the model belongs to exactly one such layer, each layer runs once per
forward pass, and the task runs its model once per loss. :func:`supports_fast` tells (at trace
time); otherwise DP-SGD uses the reference. Both return ``(clipped_sum_tree, norms, losses)``,
the sum in the params' structure, masked rows contributing nothing; the noise is added by the shared
:func:`fedpriv.privacy.aggregate.noise_and_normalize`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from fedpriv.models.capture import capturing
from fedpriv.privacy.aggregate import clip_factors, clipped_sum

PyTree = Any


class Task(Protocol):
    """What clipping needs of a task (:class:`fedpriv.tasks.base.Task` has it): (B,) per-example
    losses, example i's depending only on example i's rows."""

    def losses(self, params: PyTree, batch: Mapping[str, jax.Array], rng: jax.Array, train: bool) -> jax.Array: ...


class FastClippingUnsupported(Exception):
    """The model has a parameter or a call pattern the fast path does not cover."""


def per_example_grads(task: Task, params: PyTree, batch: Mapping[str, jax.Array], rng: jax.Array) -> tuple[jax.Array, PyTree]:
    """(B,) per-example losses and their stacked gradients (leading axis B): vmap of value_and_grad."""

    def one(p, ex):
        single = jax.tree.map(lambda a: a[None], ex)
        return task.losses(p, single, rng, True)[0]

    return jax.vmap(jax.value_and_grad(one), in_axes=(None, 0))(params, dict(batch))


def reference_clipped_sum(
    task: Task, params: PyTree, batch: Mapping[str, jax.Array], rng: jax.Array, clip_norm, group: int = 1
) -> tuple[PyTree, jax.Array, jax.Array]:
    """Sum over the batch's units of each unit's gradient clipped to norm C; the unit norms; the
    per-row losses.

    A unit is one row (``group`` = 1: example-level DP-SGD), or ``group`` consecutive rows, one
    user's examples (user-level DP-SGD): its gradient is that of the mean loss over its real
    rows, so however many examples a user has, its whole contribution is clipped to C once. A
    unit with no real row contributes nothing."""
    if group == 1:
        losses, grads = per_example_grads(task, params, batch, rng)
        total, norms = clipped_sum(grads, clip_norm, weights=batch["mask"])
        return total, norms, losses
    units = jax.tree.map(lambda v: v.reshape((-1, group) + v.shape[1:]), dict(batch))

    def one(p, unit):
        losses = task.losses(p, unit, rng, True)
        real = unit["mask"]
        return jnp.sum(losses * real) / jnp.maximum(jnp.sum(real), 1.0), losses

    (_, losses), grads = jax.vmap(jax.value_and_grad(one, has_aux=True), in_axes=(None, 0))(params, units)
    weights = (jnp.sum(units["mask"], axis=1) > 0).astype(jnp.float32)
    total, norms = clipped_sum(grads, clip_norm, weights=weights)
    return total, norms, losses.reshape(-1)


# ---- the fast path -----------------------------------------------------------------------------


def _records(task: Task, params: PyTree, batch: Mapping[str, jax.Array], rng: jax.Array):
    """(intermediates, output gradients) of one forward and one backward pass."""
    calls = []

    def zeros_fn():
        with capturing(None) as cap:
            task.losses(params, batch, rng, True)
        calls.append(cap.calls)
        return cap.perturbation_zeros

    shapes = jax.eval_shape(zeros_fn)
    if calls != [1]:
        raise FastClippingUnsupported(f"the task runs its model {calls[0]} times per loss")
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    mask = batch["mask"]

    def run(pert):
        with capturing(pert) as cap:
            losses = task.losses(params, batch, rng, True)
        return jnp.sum(losses * mask), (cap.intermediates, losses)

    grads, (inter, losses) = jax.grad(run, has_aux=True)(zeros)
    return inter, grads, losses


def _seq(a: jax.Array) -> jax.Array:
    """(B, ..., d) -> (B, T, d) with T the product of the middle axes (1 if none)."""
    return a.reshape(a.shape[0], -1, a.shape[-1])


def _gram(x: jax.Array) -> jax.Array:
    """(B,T,d) -> (B,T,T): per-example inner products between positions."""
    return jnp.einsum("btd,bsd->bts", x, x)


def _weight_sq_norms(a: jax.Array, g: jax.Array, g_gram: jax.Array | None = None) -> jax.Array:
    """Per-example ||sum_t a_t^T g_t||_F^2 for a (B,T,p), g (B,T,q): ghost or materialized, whichever
    is cheaper. ``g_gram`` (the Gram of g) may be passed when several weights share g."""
    t, p, q = a.shape[1], a.shape[2], g.shape[2]
    if t == 1:
        return jnp.sum(a[:, 0] ** 2, axis=1) * jnp.sum(g[:, 0] ** 2, axis=1)
    if g_gram is not None or t * (p + q) <= p * q:
        return jnp.sum(_gram(a) * (_gram(g) if g_gram is None else g_gram), axis=(1, 2))
    return jnp.sum(jnp.einsum("btp,btq->bpq", a, g) ** 2, axis=(1, 2))


def _kept(x: jax.Array, c: jax.Array) -> jax.Array:
    """``x`` with the rows of factor 0 (masked, or a non-finite norm: :func:`clip_factors`) set to
    0: such a row contributes exactly nothing, even when its values are NaN (0 * NaN is NaN)."""
    return jnp.where((c != 0).reshape((-1,) + (1,) * (x.ndim - 1)), x, jnp.zeros((), x.dtype))


def _weight_sum(a: jax.Array, g: jax.Array, c: jax.Array) -> jax.Array:
    return jnp.einsum("btp,btq,b->pq", _kept(a, c), _kept(g, c), c)


def _bias_parts(g: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
    s = jnp.sum(g, axis=1)  # (B, q)
    return jnp.sum(s**2, axis=1), jnp.einsum("bq,b->q", _kept(s, c), c)


def _one(node: Mapping, key: str) -> jax.Array:
    vals = node[key]
    if len(vals) != 1:
        raise FastClippingUnsupported(f"a layer ran {len(vals)} times in one forward pass")
    return vals[0]


class _Layer:
    """One recorded layer: computes its parameters' per-example squared norms, then their clipped sum."""

    def __init__(self, params: Mapping, inter: Mapping, grads: Mapping):
        names = set(params)
        g = _seq(grads["ghost_out"])
        if {"kernel"} <= names <= {"kernel", "bias"}:
            self.kind, self.a, self.g = "dense", _seq(_one(inter, "ghost_in")), g
        elif names == {"embedding"}:
            ids = _one(inter, "ghost_in")
            self.kind, self.ids, self.g = "embed", ids.reshape(ids.shape[0], -1), g
            self.table = params["embedding"]
        elif names == {"scale", "bias"}:
            self.kind, self.a, self.g = "layernorm", _seq(_one(inter, "ghost_in")), g
        elif names == {"wi", "wh", "b"}:
            self.kind, self.a, self.prev, self.g = "lstm", _seq(_one(inter, "ghost_in")), _seq(_one(inter, "ghost_prev")), g
        else:
            raise FastClippingUnsupported(f"no fast rule for a layer with parameters {sorted(names)}")
        self.names = names

    def sq_norms(self) -> jax.Array:
        g = self.g
        if self.kind == "dense":
            out = _weight_sq_norms(self.a, g)
            return out + _bias_parts(g, jnp.zeros(g.shape[0]))[0] if "bias" in self.names else out
        if self.kind == "embed":
            vocab, t = self.table.shape[0], self.ids.shape[1]
            if vocab < t:  # a small table read at many positions (characters): materialize per example
                per_example = jnp.einsum("btv,btq->bvq", jax.nn.one_hot(self.ids, vocab, dtype=g.dtype), g)
                return jnp.sum(per_example**2, axis=(1, 2))
            same = (self.ids[:, :, None] == self.ids[:, None, :]).astype(g.dtype)
            return jnp.sum(same * _gram(g), axis=(1, 2))
        if self.kind == "layernorm":
            return jnp.sum(jnp.sum(self.a * g, axis=1) ** 2, axis=1) + jnp.sum(jnp.sum(g, axis=1) ** 2, axis=1)
        g_gram = _gram(g) if g.shape[1] > 1 else None  # shared by wi and wh
        return _weight_sq_norms(self.a, g, g_gram) + _weight_sq_norms(self.prev, g, g_gram) + _bias_parts(g, jnp.zeros(g.shape[0]))[0]

    def clipped(self, c: jax.Array) -> dict[str, jax.Array]:
        g = self.g
        if self.kind == "dense":
            out = {"kernel": _weight_sum(self.a, g, c)}
            if "bias" in self.names:
                out["bias"] = _bias_parts(g, c)[1]
            return out
        if self.kind == "embed":
            rows = (_kept(g, c) * c[:, None, None]).reshape(-1, g.shape[-1])
            return {"embedding": jnp.zeros_like(self.table).at[self.ids.reshape(-1)].add(rows.astype(self.table.dtype))}
        if self.kind == "layernorm":
            return {"scale": jnp.einsum("btd,btd,b->d", _kept(self.a, c), _kept(g, c), c), "bias": _bias_parts(g, c)[1]}
        return {"wi": _weight_sum(self.a, g, c), "wh": _weight_sum(self.prev, g, c), "b": _bias_parts(g, c)[1]}


def _collect(params: Mapping, inter: Mapping, grads: Mapping, path: tuple = ()) -> dict[tuple, _Layer]:
    """Pair every parameter subtree with its layer's records; refuse anything uncovered."""
    leaves = {k: v for k, v in params.items() if not isinstance(v, Mapping)}
    subs = {k: v for k, v in params.items() if isinstance(v, Mapping)}
    layers: dict[tuple, _Layer] = {}
    if leaves:
        if subs:
            raise FastClippingUnsupported(f"parameters {sorted(leaves)} at {'/'.join(path) or 'top'} sit beside sub-layers")
        if "ghost_out" not in grads or "ghost_in" not in inter:
            raise FastClippingUnsupported(f"parameters at {'/'.join(path) or 'top'} ({sorted(leaves)}) are not in a recorded layer")
        return {path: _Layer(leaves, inter, grads)}
    for k, sub in subs.items():
        if k not in inter or k not in grads:
            raise FastClippingUnsupported(f"layer {'/'.join(path + (k,))} recorded nothing")
        layers.update(_collect(sub, inter[k], grads[k], path + (k,)))
    return layers


def _layers(task: Task, params: PyTree, batch, rng) -> tuple[dict[tuple, _Layer], jax.Array]:
    inter, grads, losses = _records(task, params, batch, rng)
    return _collect(params, inter, grads), losses


def supports_fast(task: Task, params: PyTree, batch: Mapping[str, Any], rng: jax.Array) -> tuple[bool, str]:
    """Whether :func:`fast_clipped_sum` covers this task's model (checked by tracing, no compute).
    A task may decline through a ``fast_clipping_unsupported`` attribute (a reason, or None)."""
    reason = getattr(task, "fast_clipping_unsupported", None)
    if reason:
        return False, reason
    try:
        jax.eval_shape(lambda p, b: {k: l.sq_norms() for k, l in _layers(task, p, b, rng)[0].items()}, params, dict(batch))
    except FastClippingUnsupported as e:
        return False, str(e)
    return True, ""


def fast_clipped_sum(task: Task, params: PyTree, batch: Mapping[str, jax.Array], rng: jax.Array, clip_norm) -> tuple[PyTree, jax.Array, jax.Array]:
    """Same result as :func:`reference_clipped_sum`, from activations and output gradients."""
    layers, losses = _layers(task, params, batch, rng)
    sq = sum(layer.sq_norms() for layer in layers.values())
    norms = jnp.sqrt(jnp.maximum(sq, 0.0))
    c = clip_factors(norms, clip_norm) * batch["mask"]
    out: dict = {}
    for path, layer in layers.items():
        node = out
        for k in path[:-1]:
            node = node.setdefault(k, {})
        if path:
            node[path[-1]] = layer.clipped(c)
        else:
            out = layer.clipped(c)
    return jax.tree.map(lambda ref, v: v.astype(ref.dtype), params, _like(params, out)), norms, losses


def _like(params: Mapping, out: Mapping) -> dict:
    """``out`` re-nested exactly like ``params`` (same key order)."""
    return {k: (_like(v, out[k]) if isinstance(v, Mapping) else out[k]) for k, v in params.items()}
