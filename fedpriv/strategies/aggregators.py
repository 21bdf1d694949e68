"""How one round's client deltas become the average the server applies: composed aggregators.

In the style of Optax and TFF aggregators, each piece does one thing and the strategies are
compositions (:func:`fedpriv.strategies.server.make_aggregator`)::

    FedAvg        WeightedMean()                                  sum(n_i d_i) / sum(n_i)
    FedAvg+Clip   ClippedMean(S, m)                               sum(clip_S(d_i)) / m
    DP-FedAvg     GaussianNoise(ClippedMean(S, m), z)             (sum(clip_S(d_i)) + N(0, (zS)^2)) / m
                  AdaptiveClipping(GaussianNoise(...), gamma, eta, sigma_b)
                  CorrelatedNoise(ClippedMean(S, m), z, C^-1)     (sum(clip_S(d_i)) + (C^-1 Z)_r) / m   (banded MF, BLT)
                                                                  S follows the gamma-quantile of the norms

m is public: the fixed round size, or the expected q*N under Poisson sampling, never the realized
count. The weights of the clipped means are uniform, never example counts (a count-weighted
average would break the sensitivity bound S). Deltas arrive in chunks (a vectorized chunk, a
Flower reply) and go into a :class:`DeltaAccumulator`, whose running clipped sum is the shared
:func:`fedpriv.privacy.aggregate.clipped_sum`; the noise is added once, by the shared
:func:`~fedpriv.privacy.aggregate.noise_and_normalize` (DP-SGD's too) or, with adaptive clipping,
:func:`~fedpriv.privacy.adaptive_clip.adaptive_noise_and_update`.

An aggregator's state (``init()``; checkpointed with the model) is the current clip norm S as a
float32 scalar, or the :class:`~fedpriv.privacy.adaptive_clip.AdaptiveClipState`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.privacy.adaptive_clip import AdaptiveClipState, adaptive_noise_and_update, init_adaptive_clip
from fedpriv.privacy.aggregate import clipped_sum, correlated_noise_and_normalize, init_noise_state, noise_and_normalize
from fedpriv.tasks.base import Params


@functools.partial(jax.jit, donate_argnums=0)
def _accumulate(total, deltas, weights, clip):
    """total + sum_i weights_i * clip_S(delta_i), added in order; weight 0 = padding. Also the
    unclipped norms. The running total's buffer is donated (updated in place)."""
    return clipped_sum(deltas, clip, weights, initial=total)


@functools.partial(jax.jit, donate_argnums=0)
def _add_trees(total, partial):
    return jax.tree_util.tree_map(lambda t, p: t + p.astype(t.dtype), total, partial)


@jax.jit
def _noise_and_normalize(total, key, clip, noise_multiplier, denominator):
    return noise_and_normalize(total, key, clip, noise_multiplier, denominator)


@jax.jit
def _adaptive_finish(total, unclipped, num_units, key, state, denominator):
    return adaptive_noise_and_update(total, unclipped, num_units, key, state, denominator)


class DeltaAccumulator:
    """Collects one round's client deltas, a chunk at a time (leaves (k, ...) stacked)."""

    def __init__(self, params: Params, clip_norm: float, weighted: bool):
        self.total = jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, jnp.promote_types(p.dtype, jnp.float32)), params)
        self.clip_norm = float(clip_norm)  # S; inf: no clipping (fedavg)
        self.clip = jnp.asarray(clip_norm, jnp.float32)
        self.weighted = weighted
        self.weight_sum = 0.0
        self.norms: list[np.ndarray] = []

    def add(self, deltas: Params, num_examples: np.ndarray, mask: np.ndarray | None = None) -> None:
        """``deltas`` stacked over k clients; ``num_examples`` (k,); ``mask`` (k,) 0 = padding row."""
        n = np.asarray(num_examples, np.float32)
        real = np.ones_like(n) if mask is None else np.asarray(mask, np.float32)
        weights = n * real if self.weighted else real
        self.total, norms = _accumulate(self.total, deltas, jnp.asarray(weights), self.clip)
        self.weight_sum += float(weights.sum())
        self.norms.append(np.asarray(norms)[real > 0])

    def add_sum(self, partial: Params, num_examples: np.ndarray, norms: np.ndarray | list[float]) -> None:
        """Add a sum that :meth:`add` computed elsewhere (a Flower ClientApp's accumulator started
        from zero over its message's users, with the same clip and weighting): ``partial`` is
        that accumulator's total, ``num_examples`` and ``norms`` its users' counts and unclipped
        norms, one each. Only the order of the float additions differs from adding the deltas."""
        n = np.asarray(num_examples, np.float32)
        self.total = _add_trees(self.total, partial)
        self.weight_sum += float((n if self.weighted else np.ones_like(n)).sum())
        self.norms.append(np.asarray(norms, np.float32))

    @property
    def all_norms(self) -> np.ndarray:
        return np.concatenate(self.norms) if self.norms else np.zeros(0, np.float32)


def _norm_info(acc: DeltaAccumulator) -> dict[str, Any]:
    norms = acc.all_norms
    return {"clients": int(len(norms)), "mean_delta_norm": float(norms.mean()) if len(norms) else 0.0}


class WeightedMean:
    """FedAvg: the deltas' average weighted by example counts, no clipping (state: unused 0)."""

    weighted = True

    def init(self) -> jax.Array:
        return jnp.asarray(0.0, jnp.float32)

    def clip_norm(self, state: Any) -> float:
        return math.inf

    def finish(self, state: Any, acc: DeltaAccumulator, key: jax.Array) -> tuple[Params | None, Any, dict[str, Any]]:
        """(average, state, info); average None when no client took part (the round is skipped)."""
        info = _norm_info(acc)
        if acc.weight_sum == 0:
            return None, state, {**info, "skipped": "no clients this round"}
        return jax.tree_util.tree_map(lambda t: t / acc.weight_sum, acc.total), state, info


class ClippedMean:
    """Each delta clipped to L2 norm S, summed with uniform weights, divided by the public m
    (FedAvg+Clip: no noise). ``noise_multiplier`` z: the noise :class:`GaussianNoise` asks for."""

    weighted = False

    def __init__(self, clip_norm: float, denominator: float):
        self.initial_clip = float(clip_norm)
        self.denominator = float(denominator)

    def init(self) -> Any:
        return jnp.asarray(self.initial_clip, jnp.float32)

    def clip_norm(self, state: Any) -> float:
        return float(state)

    def clip_info(self, acc: DeltaAccumulator, S: float) -> dict[str, Any]:
        norms = acc.all_norms
        return {**_norm_info(acc), "clip_norm": S, "unclipped_fraction": float(np.mean(norms <= S)) if len(norms) else 1.0}

    def finish(self, state: Any, acc: DeltaAccumulator, key: jax.Array, noise_multiplier: float = 0.0) -> tuple[Params, Any, dict[str, Any]]:
        S = self.clip_norm(state)
        info = self.clip_info(acc, S)
        average = _noise_and_normalize(acc.total, key, S, noise_multiplier, self.denominator)
        return average, state, {**info, "noise_stddev": noise_multiplier * S / self.denominator}


class GaussianNoise:
    """DP-FedAvg: ``inner``'s clipped sum plus N(0, (z S)^2) per coordinate, then / m."""

    weighted = False

    def __init__(self, inner: ClippedMean, noise_multiplier: float):
        self.inner = inner
        self.noise_multiplier = float(noise_multiplier)

    def init(self) -> Any:
        return self.inner.init()

    def clip_norm(self, state: Any) -> float:
        return self.inner.clip_norm(state)

    def finish(self, state: Any, acc: DeltaAccumulator, key: jax.Array) -> tuple[Params, Any, dict[str, Any]]:
        return self.inner.finish(state, acc, key, self.noise_multiplier)


class CorrelatedNoise:
    """DP-FedAvg with correlated noise: ``inner``'s clipped sum plus row r of C^-1 Z (Z_r i.i.d.
    N(0, (z S)^2) per coordinate), then / m; C^-1 (``noising_matrix``, a jax-privacy
    ``StreamingMatrix``) keeps its bands or buffers in the server state's ``noise``."""

    weighted = False

    def __init__(self, inner: ClippedMean, noise_multiplier: float, noising_matrix: Any):
        self.inner = inner
        self.noise_multiplier = float(noise_multiplier)
        matrix = noising_matrix
        self._finish = jax.jit(lambda total, key, clip, z, denominator, state: correlated_noise_and_normalize(total, key, clip, z, denominator, matrix, state))
        self._init_noise = lambda params: init_noise_state(matrix, params)

    def init(self) -> Any:
        return self.inner.init()

    def init_noise(self, params: Params) -> Any:
        return self._init_noise(params)

    def clip_norm(self, state: Any) -> float:
        return self.inner.clip_norm(state)

    def finish_correlated(self, state: Any, acc: DeltaAccumulator, key: jax.Array, noise_state: Any) -> tuple[Params, Any, Any, dict[str, Any]]:
        """(average, clip state, next noise state, info)."""
        mean = self.inner
        S = mean.clip_norm(state)
        info = mean.clip_info(acc, S)
        average, noise_state = self._finish(acc.total, key, S, self.noise_multiplier, mean.denominator, noise_state)
        return average, state, noise_state, {**info, "iid_noise_stddev": self.noise_multiplier * S / mean.denominator}


class AdaptiveClipping:
    """``inner`` (a :class:`GaussianNoise`) with S adapted each round toward the
    ``target_quantile`` of the delta norms from a noised unclipped count (Andrew et al. 2021);
    the count's noise is paid for by adding z_delta = (z^-2 - (2 sigma_b)^-2)^(-1/2) > z to the values
    (values and count together cost z)."""

    weighted = False

    def __init__(self, inner: GaussianNoise, target_quantile: float, learning_rate: float, count_noise_stddev: float):
        self.inner = inner
        self.target_quantile, self.learning_rate, self.count_noise_stddev = target_quantile, learning_rate, count_noise_stddev

    def init(self) -> AdaptiveClipState:
        return init_adaptive_clip(self.inner.inner.initial_clip, self.target_quantile, self.learning_rate, self.count_noise_stddev, self.inner.noise_multiplier)

    def clip_norm(self, state: AdaptiveClipState) -> float:
        return float(state.clip_norm)

    def finish(self, state: AdaptiveClipState, acc: DeltaAccumulator, key: jax.Array) -> tuple[Params, AdaptiveClipState, dict[str, Any]]:
        mean = self.inner.inner
        S = self.clip_norm(state)
        info = mean.clip_info(acc, S)
        norms = acc.all_norms
        unclipped = int(np.sum(norms <= np.float32(S)))
        z_delta = float(state.value_noise_multiplier)  # the values get z_delta > z (values and count together cost z)
        average, state, b_tilde = _adaptive_finish(acc.total, unclipped, len(norms), key, state, mean.denominator)
        info["next_clip_norm"] = float(state.clip_norm)
        info["noised_unclipped_fraction"] = float(b_tilde)  # the DP release the clip update uses
        return average, state, {**info, "noise_stddev": z_delta * S / mean.denominator}


Aggregator = WeightedMean | ClippedMean | GaussianNoise | CorrelatedNoise | AdaptiveClipping
