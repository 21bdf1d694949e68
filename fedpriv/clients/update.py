"""The client update: E local epochs of minibatch SGD from the global model; returns the delta.

``client_update(params, batches, step_mask, key)`` runs ``lax.scan`` over the plan's steps
(``batches`` leaves have shape (S, B, ...)); a step with ``step_mask`` 0 (padding) leaves the
parameters untouched. Each step descends the task's mean loss over the step's real examples with
learning rate eta. Randomness (dropout, masking) for step i is ``fold_in(key, i)``, with ``key``
derived from (seed, round, user) by :func:`client_key`, so every engine gives a client the same
update. Returns ``(delta, loss_sum)``: delta = local params - global params, and the sum over
real steps of the step's mean loss (the host divides by the number of real steps).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from fedpriv.tasks.base import Params, Task

CLIENT_STREAM = 0xC11E


def client_key(seed: int, round_: int, user: int) -> jax.Array:
    base = jax.random.fold_in(jax.random.key(seed), CLIENT_STREAM)
    return jax.random.fold_in(jax.random.fold_in(base, round_), user)


def make_client_update(task: Task, learning_rate: float) -> Callable:
    """The (unjitted) update of one client; jit it, or vmap it over a cohort (params shared)."""
    lr = float(learning_rate)

    def update(params: Params, batches, step_mask, key):
        steps = step_mask.shape[0]

        def body(carry, xs):
            p, loss_sum = carry
            batch, live, i = xs
            loss, grads = jax.value_and_grad(task.mean_loss)(p, batch, jax.random.fold_in(key, i), True)
            keep = live > 0
            p = jax.tree_util.tree_map(lambda a, g: jnp.where(keep, a - jnp.asarray(lr, a.dtype) * g.astype(a.dtype), a), p, grads)
            return (p, loss_sum + jnp.where(keep, loss, 0.0)), None

        (local, loss_sum), _ = jax.lax.scan(body, (params, jnp.zeros((), jnp.float32)), (batches, step_mask, jnp.arange(steps)))
        delta = jax.tree_util.tree_map(lambda a, b: a - b, local, params)
        return delta, loss_sum

    return update


def make_cohort_update(task: Task, learning_rate: float) -> Callable:
    """jit(vmap(update)) over a chunk of clients: batches (K, S, B, ...), step_mask (K, S), keys (K,)."""
    return jax.jit(jax.vmap(make_client_update(task, learning_rate), in_axes=(None, 0, 0, 0)))
