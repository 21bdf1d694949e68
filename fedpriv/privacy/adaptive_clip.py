"""Adaptive clipping to a target quantile of the unit norms (Andrew et al. 2021, NeurIPS).

Each round every real unit reports b_i = 1 if its L2 norm <= C (the C used this round), else 0.
The server releases the noised unclipped fraction, centered so one unit moves the count by at
most 1/2 (add-or-remove-one; the value sum moves by C, so the ratio is the same 2:1 under
replace-one, 1 vs 2C)::

    b_tilde = (sum_i (b_i - 1/2) + N(0, sigma_b^2)) / m + 1/2

(= (sum_i b_i + N(0, sigma_b^2)) / m when exactly m units take part), with m the public
denominator (fixed count, or expected count q*N under Poisson sampling), and updates
geometrically toward the target quantile gamma with learning rate eta::

    C <- C * exp(-eta * (clamp(b_tilde, 0, 1) - gamma))

(the clamp to [0, 1] is post-processing). The count and the values are two Gaussian mechanisms
on the same units; their composition equals one Gaussian mechanism of noise multiplier z when
the values get

    z_delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)

(Andrew et al. 2021, Theorem 1), so the ledger records z and z_delta is what is added. The value
noise is N(0, (z_delta * C)^2) per coordinate with the C used for clipping this round (before
the update).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedpriv.errors import PrivacyParameterError
from fedpriv.privacy.aggregate import (
    AggregateInfo,
    _as_real,
    aggregate_info,
    check_clip_norm,
    check_noise_multiplier,
    clipped_sum,
    noise_and_normalize,
)

PyTree = Any


class AdaptiveClipState(NamedTuple):
    """Adaptive-clip state: a pytree of float32 scalars (jit-friendly, checkpointable).

    ``clip_norm`` is the current C (L2 norm); the rest are the fixed hyperparameters, kept here so
    a restored checkpoint carries the exact values it ran with. ``value_noise_multiplier`` is
    z_delta, derived from ``noise_multiplier`` (z, the privacy cost) and ``count_noise_stddev``
    (sigma_b, std of the noise on the unclipped count).
    """

    clip_norm: jax.Array
    target_quantile: jax.Array
    learning_rate: jax.Array
    count_noise_stddev: jax.Array
    noise_multiplier: jax.Array
    value_noise_multiplier: jax.Array


class AdaptiveClipInfo(NamedTuple):
    """What one adaptive round did.

    ``aggregate``: the :class:`AggregateInfo` of the value aggregation (its ``clip_norm`` is the C
    used, its ``noise_stddev`` z_delta*C). ``noised_unclipped_fraction``: b_tilde before the clamp
    (a DP release). ``next_clip_norm``: the updated C.
    """

    aggregate: AggregateInfo
    noised_unclipped_fraction: jax.Array
    next_clip_norm: jax.Array


def value_noise_multiplier(noise_multiplier: float, count_noise_stddev: float) -> float:
    """z_delta = (z^-2 - (2 sigma_b)^-2)^(-1/2): value noise multiplier keeping the total cost at z.

    z = 0 (no privacy) gives 0. Raises PrivacyParameterError when sigma_b <= z/2 (the count noise
    alone would cost more than z; the formula is undefined there).
    """
    z = check_noise_multiplier(noise_multiplier)
    sigma_b = _as_real(count_noise_stddev, "count_noise_stddev", ">= 0")
    if sigma_b < 0:
        raise PrivacyParameterError(f"count_noise_stddev must be a finite number >= 0, got {count_noise_stddev!r}")
    if z == 0:
        return 0.0
    if sigma_b <= z / 2:
        raise PrivacyParameterError(
            f"count_noise_stddev must be > noise_multiplier / 2 = {z / 2:g} for the value noise multiplier "
            f"(z^-2 - (2 sigma_b)^-2)^(-1/2) to exist, got {sigma_b:g} (noise_multiplier = {z:g})"
        )
    return (z**-2 - (2 * sigma_b) ** -2) ** -0.5


def init_adaptive_clip(
    initial_clip: float,
    target_quantile: float,
    learning_rate: float,
    count_noise_stddev: float,
    noise_multiplier: float,
) -> AdaptiveClipState:
    """Validated initial state (plain Python, call outside jit before training).

    ``initial_clip`` C_0 > 0 (L2 norm); ``target_quantile`` gamma in [0, 1] (fraction of units
    left unclipped; 0.5 = median); ``learning_rate`` eta > 0 (C changes by at most a factor
    exp(eta) per round); ``count_noise_stddev`` sigma_b >= 0 (std of the noise on the count, in
    units; Andrew et al. suggest m/20); ``noise_multiplier`` z >= 0, the total cost.
    """
    c0 = check_clip_norm(initial_clip, name="initial_clip")
    gamma = _as_real(target_quantile, "target_quantile", "in [0, 1]")
    if not 0.0 <= gamma <= 1.0:
        raise PrivacyParameterError(f"target_quantile must be a number in [0, 1], got {target_quantile!r}")
    eta = _as_real(learning_rate, "learning_rate", "> 0")
    if eta <= 0:
        raise PrivacyParameterError(f"learning_rate must be a finite number > 0, got {learning_rate!r}")
    z = check_noise_multiplier(noise_multiplier)
    z_delta = value_noise_multiplier(z, count_noise_stddev)
    sigma_b = float(count_noise_stddev)
    f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
    return AdaptiveClipState(
        clip_norm=f32(c0),
        target_quantile=f32(gamma),
        learning_rate=f32(eta),
        count_noise_stddev=f32(sigma_b),
        noise_multiplier=f32(z),
        value_noise_multiplier=f32(z_delta),
    )


def noised_unclipped_fraction(unclipped_count, num_units, key: jax.Array, count_noise_stddev, denominator) -> jax.Array:
    """b_tilde = (unclipped_count - num_units/2 + N(0, sigma_b^2)) / denominator + 1/2 (unclamped)."""
    noise = jnp.asarray(count_noise_stddev, jnp.float32) * jax.random.normal(key, (), jnp.float32)
    centered = jnp.asarray(unclipped_count, jnp.float32) - 0.5 * jnp.asarray(num_units, jnp.float32)
    return (centered + noise) / jnp.asarray(denominator, jnp.float32) + 0.5


def update_clip_norm(state: AdaptiveClipState, noised_fraction) -> AdaptiveClipState:
    """C <- C * exp(-eta * (clamp(b_tilde, 0, 1) - gamma))."""
    b = jnp.clip(jnp.asarray(noised_fraction, jnp.float32), 0.0, 1.0)
    new_clip = state.clip_norm * jnp.exp(-state.learning_rate * (b - state.target_quantile))
    return state._replace(clip_norm=new_clip)


def adaptive_noise_and_update(
    clipped_total: PyTree,
    unclipped_count,
    num_units,
    key: jax.Array,
    state: AdaptiveClipState,
    denominator,
) -> tuple[PyTree, AdaptiveClipState, jax.Array]:
    """The noise and the clip update of one adaptive round, given the sum of the units clipped to
    the current C (``clipped_total``) and how many of ``num_units`` real units had norm <= C.

    The key splits into the value noise (z_delta * C per coordinate, then / denominator) and the
    count noise. Returns ``(result_tree, new_state, b_tilde)``. DP-FedAvg's aggregator
    (:mod:`fedpriv.strategies.aggregators`) calls this on a sum accumulated chunk by chunk."""
    value_key, count_key = jax.random.split(key)
    result = noise_and_normalize(clipped_total, value_key, state.clip_norm, state.value_noise_multiplier, denominator)
    b_tilde = noised_unclipped_fraction(unclipped_count, num_units, count_key, state.count_noise_stddev, denominator)
    return result, update_clip_norm(state, b_tilde), b_tilde


def adaptive_clip_and_noise(
    stacked_tree: PyTree,
    key: jax.Array,
    state: AdaptiveClipState,
    denominator,
    mask=None,
) -> tuple[PyTree, AdaptiveClipState, AdaptiveClipInfo]:
    """One adaptive round on stacked units: clip to the current C, sum, then
    :func:`adaptive_noise_and_update` (z_delta on the values, the noised count, the new C).

    ``denominator`` and ``mask`` as in :func:`fedpriv.privacy.aggregate.clip_and_noise` (the same m
    normalizes the count). Returns ``(result_tree, new_state, AdaptiveClipInfo)``.
    """
    summed, norms = clipped_sum(stacked_tree, state.clip_norm, mask)
    agg = aggregate_info(norms, state.clip_norm, state.value_noise_multiplier, mask)
    result, new_state, b_tilde = adaptive_noise_and_update(summed, agg.unclipped_count, agg.num_units, key, state, denominator)
    return result, new_state, AdaptiveClipInfo(agg, b_tilde, new_state.clip_norm)
