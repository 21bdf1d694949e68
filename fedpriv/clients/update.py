"""The client update: E local epochs of minibatch SGD from the global model; returns the delta.

``client_update(params, batches, step_mask, key)`` runs ``lax.scan`` over the plan's steps
(``batches`` leaves have shape (S, B, ...)); a step with ``step_mask`` 0 (padding) leaves the
parameters untouched. Each step descends the task's mean loss over the step's real examples with
learning rate eta. Randomness (dropout, masking) for step i is ``fold_in(key, i)``, with ``key``
derived from (seed, round, user) by :func:`client_key`, so every engine gives a client the same
update. Returns ``(delta, loss_sum)``: delta = local params - global params, and the sum over
real steps of the step's mean loss (the host divides by the number of real steps).

Client-side DP-SGD (record-level DP inside each client, as in Jana and Biemann 2021): with a
:class:`ClientDP`, a step's gradient is the central DP-SGD one: each example's gradient clipped
to L2 norm C (:func:`fedpriv.privacy.clipping.reference_clipped_sum`), summed, N(0, (sigma*C)^2)
noise added per coordinate and divided by the public local batch size B
(:func:`fedpriv.privacy.aggregate.noise_and_normalize`). Its accounting is in
:mod:`fedpriv.clients.privacy`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedpriv.privacy.aggregate import noise_and_normalize
from fedpriv.privacy.clipping import reference_clipped_sum
from fedpriv.privacy.streams import CLIENT, stream_key
from fedpriv.tasks.base import Params, Task

CLIENT_STREAM = CLIENT.id


def client_key(seed: int, round_: int, user: int) -> jax.Array:
    base = stream_key(seed, CLIENT)
    return jax.random.fold_in(jax.random.fold_in(base, round_), user)


class ClientDP(NamedTuple):
    """Client-side DP-SGD: per-example clip C, noise multiplier sigma, public batch size B."""

    clip_norm: float
    noise_multiplier: float
    batch_size: int


def make_client_update(task: Task, learning_rate: float, dp: ClientDP | None = None) -> Callable:
    """The (unjitted) update of one client; jit it, or vmap it over a cohort (params shared)."""
    lr = float(learning_rate)

    def gradient(p, batch, step_key):
        if dp is None:
            return jax.value_and_grad(task.mean_loss)(p, batch, step_key, True)
        data_key, noise_key = jax.random.split(step_key)
        summed, _norms, losses = reference_clipped_sum(task, p, batch, data_key, dp.clip_norm)
        grads = noise_and_normalize(summed, noise_key, dp.clip_norm, dp.noise_multiplier, float(dp.batch_size))
        loss = jnp.sum(losses * batch["mask"]) / jnp.maximum(jnp.sum(batch["mask"]), 1.0)
        return loss, jax.tree_util.tree_map(lambda g, a: g.astype(a.dtype), grads, p)

    def update(params: Params, batches, step_mask, key):
        steps = step_mask.shape[0]

        def step(p, batch, i):
            loss, grads = gradient(p, batch, jax.random.fold_in(key, i))
            return jax.tree_util.tree_map(lambda a, g: a - jnp.asarray(lr, a.dtype) * g.astype(a.dtype), p, grads), loss.astype(jnp.float32)

        def skip(p, batch, i):
            return p, jnp.zeros((), jnp.float32)

        def body(carry, xs):
            p, loss_sum = carry
            batch, live, i = xs
            # A padded step is skipped: at run time when unbatched (lax.cond), as a select under vmap.
            p, loss = jax.lax.cond(live > 0, step, skip, p, batch, i)
            return (p, loss_sum + loss), None

        (local, loss_sum), _ = jax.lax.scan(body, (params, jnp.zeros((), jnp.float32)), (batches, step_mask, jnp.arange(steps)))
        delta = jax.tree_util.tree_map(lambda a, b: a - b, local, params)
        return delta, loss_sum

    return update


def make_cohort_update(task: Task, learning_rate: float, dp: ClientDP | None = None, mode: str = "vmap", jit: bool = True) -> Callable:
    """The updates of a chunk of clients in one jitted call: batches (K, S, B, ...), step_mask
    (K, S), keys (K,) -> (deltas stacked (K, ...), loss sums (K,)).

    ``vmap``: all K clients at once (every padded step and client computed and discarded: for
    accelerators). ``scan``: one client after another inside the compiled program, padded steps
    and clients skipped (for CPUs, where batching gains nothing and padding costs in full).
    ``jit=False``: the traceable function, for a caller that jits it itself (e.g. under
    ``shard_map``)."""
    one = make_client_update(task, learning_rate, dp)
    if mode == "vmap":
        batched = jax.vmap(one, in_axes=(None, 0, 0, 0))
        return jax.jit(batched) if jit else batched
    if mode != "scan":
        raise ValueError(f"mode must be 'vmap' or 'scan', got {mode!r}")

    def run(params, batches, step_mask, keys):
        def body(_, xs):
            b, m, k = xs
            return None, one(params, b, m, k)

        return jax.lax.scan(body, None, (batches, step_mask, keys))[1]

    return jax.jit(run) if jit else run
