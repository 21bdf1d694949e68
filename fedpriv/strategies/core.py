"""The server math of FedAvg, FedAvg+Clip and DP-FedAvg, shared by every engine.

One round, for a cohort of users sampled from the whole population of N training users:

* **fedavg**: the average of the deltas weighted by each user's example count, sum(n_i d_i) / sum(n_i).
* **fedavg-clip**: each delta clipped to L2 norm S, uniform average (1/m) sum clip(d_i): DP-FedAvg
  without noise, the clipping-only ablation.
* **dp-fedavg** (McMahan et al. 2018; the fixed-round form of Thakkar et al. 2021, Algorithm 1):
  each delta clipped to S, summed, Gaussian noise N(0, (zS)^2) per coordinate added to the sum,
  divided by m: noise std zS/m per coordinate of the average. The weights are uniform, never
  example counts (a count-weighted average would break the sensitivity bound). With adaptive
  clipping S follows a quantile of the delta norms (Andrew et al. 2021).

m is public: ``clients_per_round`` (exact under fixed sampling, expected q*N under Poisson).
Clip-and-noise is the shared code of :mod:`fedpriv.privacy.aggregate` (the same as DP-SGD's);
deltas arrive in chunks, so the clipped sum is accumulated chunk by chunk and noised once.

The server applies the average delta as a pseudo-gradient (g = -average) with its optimizer:
SGD with the server learning rate by default (learning rate 1 = plain FedAvg), momentum or Adam.

Privacy (dp-fedavg): user-level DP. Each round is one Gaussian mechanism on a sampled cohort;
fixed sampling (exactly m of N without replacement) is accounted under the replace-one-user
relation (sensitivity 2S), Poisson sampling (each user with q = m/N) under add-or-remove-one-user
(sensitivity S). The ledger records one event per round.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedpriv.config import FederatedConfig
from fedpriv.errors import PrivacyParameterError
from fedpriv.privacy.accounting import GaussianSteps, check_delta, resolve_noise_multiplier, steps_within_budget
from fedpriv.privacy.adaptive_clip import AdaptiveClipState, init_adaptive_clip, noised_unclipped_fraction, update_clip_norm
from fedpriv.privacy.aggregate import clipped_sum, noise_and_normalize
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.tasks.base import Params

SAMPLER_STREAM = 0x5A3B1E
NOISE_STREAM = 0x401_5E


class CohortSampler:
    """The users of round r, a pure function of (seed, r), so a resumed run samples the same.

    fixed: exactly m distinct users, uniform over all N-choose-m subsets.
    poisson: each user independently with probability q = m/N (the cohort size varies).
    Returns sorted user indices (positions in the training corpus).
    """

    def __init__(self, population: int, clients_per_round: int, sampling: str, seed: int):
        if sampling == "fixed" and clients_per_round > population:
            raise PrivacyParameterError(f"federated.clients_per_round = {clients_per_round} but there are only {population} training users")
        self.population = population
        self.m = min(clients_per_round, population)
        self.sampling = sampling
        self.seed = seed

    def sample(self, round_: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, SAMPLER_STREAM, round_])
        if self.sampling == "fixed":
            return np.sort(rng.choice(self.population, size=self.m, replace=False))
        return np.flatnonzero(rng.random(self.population) < self.m / self.population)


def make_server_optimizer(fcfg: FederatedConfig) -> optax.GradientTransformation:
    if fcfg.server_optimizer == "sgd":
        return optax.sgd(fcfg.server_learning_rate)
    if fcfg.server_optimizer == "momentum":
        return optax.sgd(fcfg.server_learning_rate, momentum=fcfg.server_momentum)
    return optax.adam(fcfg.server_learning_rate)


@jax.jit
def _accumulate(total, deltas, weights, clip):
    """total + sum_i weights_i * clip_S(delta_i), added in order; weight 0 = padding. Also the
    unclipped norms."""
    return clipped_sum(deltas, clip, weights, initial=total)


@jax.jit
def _add_trees(total, partial):
    return jax.tree_util.tree_map(lambda t, p: t + p.astype(t.dtype), total, partial)


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


@jax.jit
def _dp_finish(total, key, clip, value_z, denominator):
    return noise_and_normalize(total, key, clip, value_z, denominator)


class ServerCore:
    """Strategy state and math for one experiment: sampler, aggregation, server optimizer, ledger.

    The state (a pytree, checkpointed every round) is ``{"params", "opt", "clip"}``; ``clip`` is
    the current S (adaptive or fixed; 0 for fedavg).
    """

    def __init__(self, fcfg: FederatedConfig, population: int, seed: int, log: Callable[[str], None] | None = None):
        say = log or (lambda _m: None)
        self.fcfg = fcfg
        self.seed = seed
        self.population = population
        self.strategy = fcfg.strategy
        check_strategy_parameters(fcfg)
        self.sampler = CohortSampler(population, fcfg.clients_per_round, fcfg.sampling, seed)
        self.m = self.sampler.m
        self.tx = make_server_optimizer(fcfg)
        self.noise_multiplier = 0.0
        self.event: GaussianSteps | None = None
        self.max_rounds = fcfg.rounds
        self.adaptive: AdaptiveClipState | None = None
        if self.strategy == "dp-fedavg":
            template = GaussianSteps(fcfg.sampling, 1.0, population, float(self.m), fcfg.rounds, "user")
            z = resolve_noise_multiplier(template, fcfg.noise_multiplier, fcfg.target_epsilon, fcfg.delta, fcfg.accountant, say)
            self.noise_multiplier = z
            self.event = GaussianSteps(fcfg.sampling, z, population, float(self.m), 1, "user")
            if fcfg.epsilon_budget is not None:
                self.max_rounds = steps_within_budget(self.event, fcfg.epsilon_budget, fcfg.delta, fcfg.accountant, fcfg.rounds, "federated.epsilon_budget", "round", say)
            if fcfg.adaptive_clip:
                sigma_b = fcfg.clip_count_stddev if fcfg.clip_count_stddev is not None else self.m / 20.0
                self.adaptive = init_adaptive_clip(fcfg.clip_norm, fcfg.target_unclipped_quantile, fcfg.clip_learning_rate, sigma_b, z)
        self.ledger = PrivacyLedger()
        self.noise_base = jax.random.fold_in(jax.random.key(seed), NOISE_STREAM)
        tx = self.tx

        def apply(params, opt_state, average):
            grads = jax.tree_util.tree_map(lambda a, p: (-a).astype(p.dtype), average, params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        self._apply = jax.jit(apply)

    # ---- state ---------------------------------------------------------------------------------
    def init_state(self, params: Params) -> dict:
        clip = self.adaptive if self.adaptive is not None else jnp.asarray(self.fcfg.clip_norm or 0.0, jnp.float32)
        return {"params": params, "opt": self.tx.init(params), "clip": clip}

    def current_clip(self, state: dict) -> float:
        c = state["clip"]
        return float(c.clip_norm) if isinstance(c, AdaptiveClipState) else float(c)

    def accumulator(self, state: dict) -> DeltaAccumulator:
        """An empty accumulator for a round from ``state``."""
        return self.make_accumulator(state["params"], self.current_clip(state))

    def make_accumulator(self, params: Params, clip_norm: float) -> DeltaAccumulator:
        """fedavg: weighted by example count, no clip (``clip_norm`` ignored); otherwise uniform
        weights, each delta clipped to ``clip_norm``."""
        if self.strategy == "fedavg":
            return DeltaAccumulator(params, math.inf, weighted=True)
        return DeltaAccumulator(params, clip_norm, weighted=False)

    # ---- one round -------------------------------------------------------------------------------
    def finish_round(self, state: dict, round_: int, acc: DeltaAccumulator) -> tuple[dict, dict[str, Any]]:
        """Average (clip, noise) the accumulated deltas and apply them; record the round's privacy."""
        norms = acc.all_norms
        info: dict[str, Any] = {"clients": int(len(norms)), "mean_delta_norm": float(norms.mean()) if len(norms) else 0.0}
        clip_state = state["clip"]
        if self.strategy == "fedavg":
            if acc.weight_sum == 0:
                return state, {**info, "skipped": "no clients this round"}
            average = jax.tree_util.tree_map(lambda t: t / acc.weight_sum, acc.total)
        else:
            S = self.current_clip(state)
            info["clip_norm"] = S
            info["unclipped_fraction"] = float(np.mean(norms <= S)) if len(norms) else 1.0
            key = jax.random.fold_in(self.noise_base, round_)
            if isinstance(clip_state, AdaptiveClipState):
                # Same key split and order as privacy.adaptive_clip.adaptive_clip_and_noise.
                value_key, count_key = jax.random.split(key)
                average = _dp_finish(acc.total, value_key, clip_state.clip_norm, clip_state.value_noise_multiplier, float(self.m))
                unclipped = int(np.sum(norms <= np.float32(S)))
                b_tilde = noised_unclipped_fraction(unclipped, len(norms), count_key, clip_state.count_noise_stddev, float(self.m))
                clip_state = update_clip_norm(clip_state, b_tilde)
                info["next_clip_norm"] = float(clip_state.clip_norm)
            else:
                average = _dp_finish(acc.total, key, S, self.noise_multiplier, float(self.m))
            info["noise_stddev"] = self.noise_multiplier * S / self.m
            if self.event is not None:
                self.ledger.record(self.event)
        params, opt = self._apply(state["params"], state["opt"], average)
        return {"params": params, "opt": opt, "clip": clip_state}, info

    # ---- privacy ---------------------------------------------------------------------------------
    def privacy_report(self) -> dict[str, Any]:
        if self.strategy != "dp-fedavg":
            return {"epsilon": None, "guarantee": "none (no noise)"}
        if not self.ledger.entries:
            return {"epsilon": 0.0, "delta": self.fcfg.delta, "guarantee": "no rounds yet", "basis": self.event.basis()}
        a = self.ledger.epsilon(self.fcfg.delta, self.fcfg.accountant).to_json()
        return {"epsilon": a["epsilon"], "delta": a["delta"], "guarantee": a["guarantee"], "basis": self.event.basis()}


    def budget_stop(self, done: int) -> str | None:
        if self.max_rounds < self.fcfg.rounds and done >= self.max_rounds:
            return f"stopping after round {done}: one more round would take epsilon above the budget {self.fcfg.epsilon_budget} ({self.privacy_report()['guarantee']})"
        return None


def check_strategy_parameters(fcfg: FederatedConfig) -> None:
    """Refuse impossible or meaningless combinations before any training (PrivacyParameterError)."""
    s = fcfg.strategy
    dp_keys = {"noise_multiplier": fcfg.noise_multiplier, "target_epsilon": fcfg.target_epsilon, "delta": fcfg.delta, "epsilon_budget": fcfg.epsilon_budget}
    if s == "fedavg":
        given = [k for k, v in {"clip_norm": fcfg.clip_norm, **dp_keys}.items() if v is not None]
        if given or fcfg.adaptive_clip:
            raise PrivacyParameterError(f"federated.strategy = 'fedavg' takes no clipping or privacy keys (got {', '.join(given) or 'adaptive_clip'}); use 'fedavg-clip' or 'dp-fedavg'")
        return
    if fcfg.clip_norm is None:
        raise PrivacyParameterError(f"federated.strategy = {s!r} needs clip_norm (S, the L2 bound on each user's delta)")
    if s == "fedavg-clip":
        given = [k for k, v in dp_keys.items() if v is not None]
        if given or fcfg.adaptive_clip:
            raise PrivacyParameterError(f"federated.strategy = 'fedavg-clip' adds no noise, so {', '.join(given) or 'adaptive_clip'} has no meaning; use 'dp-fedavg'")
        return
    if fcfg.delta is None:
        raise PrivacyParameterError("federated.strategy = 'dp-fedavg' needs delta (user-level; well below 1/N)")
    check_delta(fcfg.delta)
    if (fcfg.noise_multiplier is None) == (fcfg.target_epsilon is None):
        raise PrivacyParameterError("federated: give exactly one of noise_multiplier or target_epsilon for 'dp-fedavg'")
    if fcfg.noise_multiplier is not None and fcfg.noise_multiplier <= 0:
        raise PrivacyParameterError("federated.noise_multiplier = 0 gives no privacy; use strategy = 'fedavg-clip' for clipping without noise")
