"""The server side of FedAvg, FedAvg+Clip and DP-FedAvg, shared by every engine.

One round, for a cohort of users sampled from the whole population of N training users
(:class:`~fedpriv.strategies.sampling.CohortSampler`): the cohort's deltas are aggregated by the
strategy's composed aggregator (:mod:`fedpriv.strategies.aggregators`; :func:`make_aggregator`
is the one place a strategy's name picks its composition), and the server optimizer applies the
average delta as a pseudo-gradient (g = -average): SGD with the server learning rate by default
(learning rate 1 = plain FedAvg), momentum or Adam.

Privacy (dp-fedavg; McMahan et al. 2018, the fixed-round form of Thakkar et al. 2021, Algorithm 1):
user-level DP. Each round is one Gaussian mechanism on a sampled cohort: fixed sampling (exactly
m of N without replacement) is accounted under the replace-one-user relation (sensitivity 2S),
Poisson sampling (each user with q = m/N) under add-or-remove-one-user (sensitivity S). The
run's :class:`~fedpriv.privacy.budget.DPBudget` (the same as DP-SGD's) resolves z, records one
event per round, stops at the epsilon budget and reports the guarantee.

Correlated noise (``federated.dp.mechanism = "banded-mf"`` or ``"blt"``): the cohort of round r is
the fixed group r mod b of a :class:`~fedpriv.privacy.correlated.CyclicSchedule` (b = N // m
groups of m users), the noise is row r of C^-1 Z (Z_r from the ``correlated_noise`` stream), C^-1's
state is the server state's ``noise`` (checkpointed in a simulation; with ``secure_noise`` left out
of checkpoints and rebuilt on resume by replaying Z_1..Z_r), and the run is accounted as one
Gaussian mechanism.
With ``sampling = "cyclic-poisson"`` (banded MF only) the cohort of round r is Poisson-sampled
from group r mod b of a :class:`~fedpriv.privacy.amplified.CyclicPoissonSchedule` (b =
``dp.groups``, m expected; the denominator stays m) and the run is accounted as amplified banded MF.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax
import optax

from fedpriv.config import FederatedConfig, amplified_groups
from fedpriv.errors import ConfigError
from fedpriv.privacy.accounting import GaussianSteps
from fedpriv.privacy.amplified import AmplifiedBandMF, CyclicPoissonSchedule
from fedpriv.privacy.aggregate import ReplayedNoiseCheckpoints, replay_noise_state
from fedpriv.privacy.budget import DPBudget
from fedpriv.privacy.correlated import CorrelatedSteps, CyclicSchedule
from fedpriv.privacy.optimized import strategy_for
from fedpriv.privacy.streams import CORRELATED_NOISE, DP_FEDAVG, NoiseSeed, stream_key
from fedpriv.strategies.aggregators import AdaptiveClipping, Aggregator, ClippedMean, CorrelatedNoise, DeltaAccumulator, GaussianNoise, WeightedMean
from fedpriv.strategies.sampling import CohortSampler
from fedpriv.tasks.base import Params
from fedpriv.training.optimizers import make_optimizer

NOISE_STREAM = DP_FEDAVG.id
STRATEGY_LABELS = {"fedavg": "FedAvg", "fedavg-clip": "FedAvg+Clip", "dp-fedavg": "DP-FedAvg"}


def make_aggregator(fcfg: FederatedConfig, m: int, noise_multiplier: float, noising_matrix=None) -> Aggregator:  # noqa: ANN001
    """The composition a strategy names (see :mod:`fedpriv.strategies.aggregators`);
    ``noising_matrix``: C^-1 of a correlated-noise mechanism (``federated.dp.mechanism``)."""
    if fcfg.strategy == "fedavg":
        return WeightedMean()
    mean = ClippedMean(fcfg.clip_norm, float(m))
    if fcfg.strategy == "fedavg-clip":
        return mean
    if noising_matrix is not None:
        return CorrelatedNoise(mean, noise_multiplier, noising_matrix)
    noised = GaussianNoise(mean, noise_multiplier)
    dp = fcfg.dp
    if not dp.adaptive_clip:
        return noised
    sigma_b = dp.clip_count_stddev if dp.clip_count_stddev is not None else m / 20.0
    if sigma_b <= noise_multiplier / 2:  # refused here, where config check builds it too, not at round 1
        given = f"{sigma_b:g}" if dp.clip_count_stddev is not None else f"its default m/20 = {m}/20 = {sigma_b:g}"
        raise ConfigError(
            f"federated.dp.clip_count_stddev ({given}) must be > noise_multiplier / 2 = {noise_multiplier / 2:g} for adaptive clipping: "
            f"the value noise multiplier (z^-2 - (2 sigma_b)^-2)^(-1/2) exists only then (Andrew et al. 2021); set it above "
            f"{noise_multiplier / 2:g} (at 10 z the value noise grows by 0.13%) or raise clients_per_round"
        )
    return AdaptiveClipping(noised, dp.target_unclipped_quantile, dp.clip_learning_rate, sigma_b)


class ServerCore(ReplayedNoiseCheckpoints):
    """Sampler, aggregator, server optimizer and DP budget of one experiment.

    The state (a pytree, checkpointed every round) is ``{"params", "opt", "clip"}``; ``clip`` is
    the aggregator's state (the current S; adaptive or fixed; 0 for fedavg).
    """

    def __init__(self, fcfg: FederatedConfig, population: int, seed: int, log: Callable[[str], None] | None = None, noise: NoiseSeed | None = None,
                 strategy_file: str | os.PathLike[str] | None = None, accounting: bool = True):
        # strategy_file: where an optimized correlated-noise strategy is stored (dp.coefficients = "optimized";
        # read back on resume, written when first optimized; None: optimized in this process only).
        # accounting False: a client process (a Flower ClientApp), which adds no noise and keeps no
        # budget: no strategy (optimizing one can take tens of seconds), no calibration, no budget;
        # its accumulator clips exactly as the server's (make_accumulator).
        self.fcfg = fcfg  # each strategy's keys were checked when the config was validated
        self.seed = seed
        # noise: where the cohort sampling and the DP noise come from (default: the seed, a simulation).
        self.noise = noise if noise is not None else NoiseSeed.simulation(seed)
        self.population = population
        self.strategy = fcfg.strategy
        d = fcfg.dp
        self.correlated = d is not None and d.mechanism != "gaussian"
        self.noising_matrix = None
        if self.correlated and fcfg.sampling == "cyclic-poisson":  # amplified banded MF: group r mod b, Poisson-sampled
            self.sampler = CyclicPoissonSchedule(population, fcfg.clients_per_round, amplified_groups(d), fcfg.rounds, self.noise.entropy, "user")
            self.sampler.check("federated.dp", d.bands, d.max_participations, d.min_separation)
        elif self.correlated:  # correlated noise: users in fixed groups of m, group r mod b in round r
            self.sampler = CyclicSchedule(population, fcfg.clients_per_round, fcfg.rounds, self.noise.entropy, "user")
            self.sampler.check("federated.dp", d.max_participations, d.min_separation)
        else:
            self.sampler = CohortSampler(population, fcfg.clients_per_round, fcfg.sampling, self.noise.entropy)
        self.m = self.sampler.m
        self.tx = make_optimizer(fcfg.server_optimizer, fcfg.server_learning_rate, fcfg.server_momentum)
        self.budget: DPBudget | None = None
        self.accounting = accounting
        if d is not None and accounting:
            if self.correlated:
                strategy = strategy_for(d.mechanism, d.coefficients, d.bands, d.buffers, self.sampler, strategy_file, log, "federated.dp")
                self.noising_matrix = strategy.noising_matrix()
                if isinstance(self.sampler, CyclicPoissonSchedule):
                    template = AmplifiedBandMF.of(strategy, 1.0, self.sampler)
                    how = f"{self.m} users expected per round, Poisson-sampled (q = {self.sampler.sampling_probability:.4g}) from group r mod b of {self.sampler.groups}"
                else:
                    template = CorrelatedSteps.of(strategy, 1.0, self.sampler)
                    how = f"{self.sampler.groups} groups of {self.m} users, one per round"
                (log or (lambda _m: None))(
                    f"{strategy.describe()}: {how} (k = {self.sampler.max_participations}, b = {self.sampler.groups}); noise state: {strategy.memory} model-sized buffer(s)"
                )
            else:
                template = GaussianSteps(fcfg.sampling, 1.0, population, float(self.m), fcfg.rounds, "user")
            self.budget = DPBudget(template, d.noise_multiplier, d.target_epsilon, d.delta, d.accountant, d.epsilon_budget, "federated.dp", "round", log, self.noise.note(d.mechanism != "gaussian"))
        self.noise_multiplier = self.budget.noise_multiplier if self.budget is not None else 0.0
        self.aggregator = make_aggregator(fcfg, self.m, self.noise_multiplier, self.noising_matrix)
        self.noise_base = stream_key(self.noise.root, CORRELATED_NOISE if self.correlated else DP_FEDAVG)
        tx = self.tx

        def apply(params, opt_state, average):
            grads = jax.tree_util.tree_map(lambda a, p: (-a).astype(p.dtype), average, params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        self._apply = jax.jit(apply)

    # ---- state ---------------------------------------------------------------------------------
    def init_state(self, params: Params) -> dict:
        """``{"params", "opt", "clip"}``; with correlated noise also ``noise`` (C^-1's bands or buffers)."""
        state = {"params": params, "opt": self.tx.init(params), "clip": self.aggregator.init()}
        if self.correlated:
            state["noise"] = self.aggregator.init_noise(params)
        return state

    def restore_state(self, stored: dict, done: int, log: Callable[[str], None]) -> dict:
        """With :attr:`replays_noise`, ``noise`` rebuilt from the secret key: Z_1..Z_done of rounds
        1..done replayed through C^-1 (``done`` model-sized draws; S is fixed: no adaptive
        clipping with correlated noise), bit for bit the state an unbroken run holds."""
        if not self.replays_noise:
            return stored
        log(f"rebuilding the correlated noise state: replaying {done} draws")
        zero = self.accumulator(stored)  # an empty round: the aggregation's own compiled step, only its noise state kept

        def noise_step(noise, key):
            return self.aggregator.finish_correlated(stored["clip"], zero, key, noise)[2]

        keys = (jax.random.fold_in(self.noise_base, r) for r in range(1, done + 1))
        return {**stored, "noise": replay_noise_state(noise_step, self.aggregator.init_noise(stored["params"]), keys)}

    def current_clip(self, state: dict) -> float:
        """S of this round (inf for FedAvg, which clips nothing)."""
        return self.aggregator.clip_norm(state["clip"])

    def accumulator(self, state: dict) -> DeltaAccumulator:
        """An empty accumulator for a round from ``state``."""
        return self.make_accumulator(state["params"], self.current_clip(state))

    def make_accumulator(self, params: Params, clip_norm: float) -> DeltaAccumulator:
        """fedavg: weighted by example count, no clip (``clip_norm`` ignored); otherwise uniform
        weights, each delta clipped to ``clip_norm``."""
        if self.aggregator.weighted:
            return DeltaAccumulator(params, float("inf"), weighted=True)
        return DeltaAccumulator(params, clip_norm, weighted=False)

    # ---- one round -------------------------------------------------------------------------------
    def finish_round(self, state: dict, round_: int, acc: DeltaAccumulator) -> tuple[dict, dict[str, Any]]:
        """Aggregate the accumulated deltas, apply them; record the round's privacy."""
        if not self.accounting and self.fcfg.dp is not None:  # a client's core holds no noise: it must never aggregate a private round
            raise RuntimeError("a client-side ServerCore (accounting=False) cannot finish a DP-FedAvg round")
        key = jax.random.fold_in(self.noise_base, round_)
        extra = {}
        if self.correlated:
            average, clip_state, noise_state, info = self.aggregator.finish_correlated(state["clip"], acc, key, state["noise"])
            extra = {"noise": noise_state}
        else:
            average, clip_state, info = self.aggregator.finish(state["clip"], acc, key)
        if average is None:
            return state, info
        if self.budget is not None:
            self.budget.record()
        if self.fcfg.dp is not None or self.fcfg.client_dp is not None:  # public: what divergence checks read in a DP run
            info = {**info, "noised_update_norm": float(optax.tree.norm(average))}
        params, opt = self._apply(state["params"], state["opt"], average)
        return {"params": params, "opt": opt, "clip": clip_state, **extra}, info

    # ---- privacy ---------------------------------------------------------------------------------
    def privacy_report(self) -> dict[str, Any]:
        if self.budget is None:
            return {"epsilon": None, "guarantee": "none (no noise)"}
        return self.budget.report()

    def stop_reason(self, done: int) -> str | None:
        return self.budget.stop_reason(done) if self.budget is not None else None
