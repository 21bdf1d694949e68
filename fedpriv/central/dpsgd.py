"""DP-SGD (Abadi et al. 2016) with time-spread large batches (Hoory et al. 2021).

A logical batch of B examples is sampled each step — Poisson with q = B/N (the batch size is
random, the denominator is the expected size B) or exactly B drawn uniformly without replacement,
independently at every step (what the fixed-size accountant assumes; no epoch shuffling). It is
processed in micro-steps of P x b rows (b per device, P devices): each micro-step adds the
per-example-clipped gradient sum to an accumulator; once the logical batch is done, noise
N(0, sigma^2 C^2) is added once to the sum, it is divided by B, and the optimizer is applied.

Noise modes (the ledger accounts each with its effective multiplier, Hoory et al. 2021 eq. 3):

* ``once`` (default): one draw on the logical sum -> sigma;
* ``per-shard``: each of the P shards adds its own draw (as TensorFlow's CrossShardOptimizer did)
  -> sigma * sqrt(P);
* ``per-micro-step``: every shard adds a draw at every one of the T micro-steps -> sigma * sqrt(P T);
  only with fixed-size batches, where T is the same at every step (under Poisson sampling T would
  depend on the sampled count, which the accountant does not cover).

The sum of k independent N(0, s^2) draws is N(0, k s^2); the modes draw it as one Gaussian of
that variance with the shared :func:`fedpriv.privacy.aggregate.noise_and_normalize`.

**User-level DP-SGD** (``privacy.unit = "user"``): the unit sampled, clipped and accounted is a
user. Each step samples B users (Poisson or fixed-size, :mod:`fedpriv.central.users`); each brings
``privacy.examples_per_user`` of its examples; the gradient of the user's mean loss over them is
clipped to C (so the user's whole contribution to a step is bounded by C, whatever its number of
examples); the sum over users gets N(0, sigma^2 C^2) and is divided by B. The ledger accounts
users (population: the training users), so a central run and a DP-FedAvg run can be compared at
the same (epsilon, delta) for the same unit.

**Correlated noise** (``privacy.mechanism = "banded-mf"`` or ``"blt"``,
:mod:`fedpriv.privacy.correlated`): the units (examples, or users) are split into b = N // B
fixed groups and step t takes group t mod b (no sampling); the noise of step t is row t of
C^-1 Z, Z_t drawn from the ``correlated_noise`` stream at step t, C^-1's state kept in the
state (``noise``: checkpointed in a simulation; with ``--secure-noise`` left out of checkpoints and
rebuilt on resume by replaying the draws); the ledger accounts the run as one Gaussian mechanism. With
``privacy.sampling = "cyclic-poisson"`` (banded MF only) the units are drawn once into
``privacy.groups`` b groups and step t Poisson-samples group t mod b (B expected, the denominator
B; :class:`~fedpriv.privacy.amplified.CyclicPoissonSchedule`, for users jax-privacy's
``CyclicPoissonSampling`` under ``UserSelectionStrategy``), accounted as amplified banded MF.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedpriv.central.sgd import CentralStepper
from fedpriv.config import PrivacyConfig, TrainingConfig, amplified_groups
from fedpriv.errors import FedprivError, PrivacyParameterError
from fedpriv.privacy.accounting import GaussianSteps
from fedpriv.privacy.amplified import AmplifiedBandMF, CyclicPoissonSchedule
from fedpriv.privacy.aggregate import add_gaussian_noise, check_clip_norm, correlated_noise_and_normalize, init_noise_state, noise_and_normalize, replay_noise_state, ReplayedNoiseCheckpoints
from fedpriv.privacy.budget import DPBudget
from fedpriv.privacy.clipping import fast_clipped_sum, reference_clipped_sum, supports_fast
from fedpriv.privacy.correlated import CorrelatedSteps, CyclicSchedule
from fedpriv.privacy.optimized import strategy_for
from fedpriv.privacy.streams import CORRELATED_NOISE, STEP, NoiseSeed, stream_key
from fedpriv.rundir import LEDGER, RunDir
from fedpriv.tasks.base import Batch, Task
from fedpriv.training.loop import gather

if TYPE_CHECKING:
    from fedpriv.central.users import UserBatches


class DPSGDStepper(ReplayedNoiseCheckpoints, CentralStepper):
    """One DP-SGD step per logical batch (see the module docstring)."""

    def __init__(
        self,
        task: Task,
        train: Batch,
        cfg: TrainingConfig,
        dp: PrivacyConfig,
        seed: int,
        tx: optax.GradientTransformation,
        total_steps: int,
        log=None,  # noqa: ANN001
        user_counts: np.ndarray | None = None,
        noise: NoiseSeed | None = None,
        strategy_file: str | os.PathLike[str] | None = None,
    ):
        # noise: where the DP noise and the sampling come from (default: the seed, a simulation).
        # strategy_file: where an optimized correlated-noise strategy is stored (coefficients = "optimized";
        # read back on resume, written when first optimized; None: optimized in this process only).
        self.noise = noise if noise is not None else NoiseSeed.simulation(seed)
        b_logical = cfg.batch_size
        self.correlated = dp.mechanism != "gaussian"
        self.sampling = dp.sampling  # (the config holds "cyclic" or "cyclic-poisson" under a correlated-noise mechanism)
        groups = amplified_groups(dp) if dp.sampling == "cyclic-poisson" else None
        self.user_batches: UserBatches | None = None
        if dp.unit == "user":
            if user_counts is None:
                raise FedprivError("user-level DP-SGD needs the training users' example counts")
            from fedpriv.central.users import UserBatches  # with jax_privacy: imported when used (docs/architecture.md, "Imports")

            self.user_batches = UserBatches(user_counts, self.sampling, b_logical, total_steps, dp.examples_per_user, self.noise.entropy, groups)
            n, self.group = self.user_batches.num_users, dp.examples_per_user
            self.batch_unit = "users"
        else:
            n, self.group = len(train["mask"]), 1
        super().__init__(task, cfg, total_steps, max(1, math.ceil(n / b_logical)), tx)
        self.train, self.dp, self.seed = train, dp, seed
        say = log or (lambda _m: None)
        check_clip_norm(dp.clip_norm, "privacy.clip_norm")
        if dp.sampling == "fixed" and b_logical > n:
            raise PrivacyParameterError(f"training.batch_size = {b_logical} > {n} records: a fixed-size batch needs B <= N")
        if dp.devices > jax.device_count():
            raise FedprivError(
                f"privacy.devices = {dp.devices} but JAX sees {jax.device_count()} device(s); on a CPU, set "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={dp.devices} before starting"
            )
        self.P = dp.devices
        if dp.micro_batch_size is not None and dp.micro_batch_size > n:
            raise PrivacyParameterError(f"privacy.micro_batch_size = {dp.micro_batch_size} exceeds the {n} training {self.batch_unit}: a micro-step holds at most all of them "
                                        f"(each is padded to micro_batch_size); use at most {n}, or leave it unset (the whole batch)")
        self.b = dp.micro_batch_size or math.ceil(b_logical / self.P)
        self.rows = self.P * self.b  # units (examples, or users) per micro-step
        self.T = math.ceil(b_logical / self.rows)  # micro-steps per logical batch (fixed-size sampling)
        if dp.noise_mode == "per-micro-step":  # (it needs sampling = "fixed": PrivacyConfig refuses it otherwise)
            if b_logical % self.rows:
                raise PrivacyParameterError(f"privacy.noise_mode = 'per-micro-step': training.batch_size ({b_logical}) must be a multiple of devices x micro_batch_size ({self.rows})")
        shards = self.P if dp.noise_mode in ("per-shard", "per-micro-step") else 1
        micro = self.T if dp.noise_mode == "per-micro-step" else 1
        self.draws = shards * micro
        self.schedule: CyclicSchedule | CyclicPoissonSchedule | None = None
        if self.correlated:  # correlated noise: the cyclic schedule (or cyclic Poisson sampling) and the strategy C it is accounted for
            if self.user_batches is not None:
                self.schedule = self.user_batches.schedule
            elif groups is not None:
                self.schedule = CyclicPoissonSchedule(n, b_logical, groups, total_steps, self.noise.entropy, "example")
            else:
                self.schedule = CyclicSchedule(n, b_logical, total_steps, self.noise.entropy, "example")
            if isinstance(self.schedule, CyclicPoissonSchedule):
                self.schedule.check("privacy", dp.bands, dp.max_participations, dp.min_separation)
            else:
                self.schedule.check("privacy", dp.max_participations, dp.min_separation)
            self.strategy = strategy_for(dp.mechanism, dp.coefficients, dp.bands, dp.buffers, self.schedule, strategy_file, say, "privacy")
            self.noising_matrix = self.strategy.noising_matrix()
            if isinstance(self.schedule, CyclicPoissonSchedule):
                template = AmplifiedBandMF.of(self.strategy, 1.0, self.schedule)
                how = f"{b_logical} {dp.unit}s expected per step, Poisson-sampled (q = {self.schedule.sampling_probability:.4g}) from group t mod b of {groups}"
            else:
                template = CorrelatedSteps.of(self.strategy, 1.0, self.schedule)
                how = f"{self.schedule.groups} groups of {b_logical} {dp.unit}s, one per step"
            say(f"{self.strategy.describe()}: {how} (k = {self.schedule.max_participations}, b = {self.schedule.groups}); noise state: {self.strategy.memory} model-sized buffer(s)")
        else:
            template = GaussianSteps(dp.sampling, 1.0, n, b_logical, total_steps, dp.unit, shards, micro)
        self.budget = DPBudget(template, dp.noise_multiplier, dp.target_epsilon, dp.delta, dp.accountant, dp.epsilon_budget, "privacy", "step", say, self.noise.note(self.correlated))
        self.sigma = self.budget.noise_multiplier
        if self.budget.event is None:
            say("noise multiplier 0: clipping only, no privacy guarantee")
        self.q = b_logical / n
        self.base_key = stream_key(self.noise.root, STEP)  # = step_key_base(seed) for a simulation
        self.correlated_key = stream_key(self.noise.root, CORRELATED_NOISE)  # Z_t of banded MF / BLT: fold_in(., step)
        self._clip = self._choose_clipping(say)
        self._build(say)

    # ---- setup -----------------------------------------------------------------------------------
    def _choose_clipping(self, say):  # noqa: ANN001
        if self.group > 1:
            if self.dp.clipping == "fast":
                raise FedprivError("privacy.clipping = 'fast' covers example-level DP-SGD; user-level DP-SGD clips with the reference (vmap over users)")
            say(f"per-user clipping: reference (vmap over users, {self.group} examples each)")
            self.clipping = "reference"
            return functools.partial(reference_clipped_sum, group=self.group)
        probe = {k: jnp.asarray(v) for k, v in gather(self.train, np.arange(self.b) % len(self.train["mask"]), self.b).items()}
        params = jax.eval_shape(self.task.init_params, jax.random.key(0))
        ok, why = supports_fast(self.task, params, probe, jax.random.key(0))
        mode = self.dp.clipping
        if mode == "fast" and not ok:
            raise FedprivError(f"privacy.clipping = 'fast' is not available for this model: {why}")
        use_fast = ok and mode != "reference"
        say(f"per-example clipping: {'fast (ghost norms, book-keeping)' if use_fast else 'reference (vmap)'}" + ("" if ok or mode == "reference" else f" ({why})"))
        self.clipping = "fast" if use_fast else "reference"
        return fast_clipped_sum if use_fast else reference_clipped_sum

    def _build(self, say) -> None:  # noqa: ANN001
        task, clip, C = self.task, self._clip, self.dp.clip_norm
        per_micro_std = self.sigma * C * math.sqrt(self.P) if self.dp.noise_mode == "per-micro-step" else 0.0
        apply_sigma = 0.0 if self.dp.noise_mode == "per-micro-step" else self.sigma * math.sqrt(self.draws)
        denominator = float(self.cfg.batch_size)  # fixed: exact size; Poisson: expected size q*N = B
        tx = self.tx

        def accumulate(params, acc, batch, key):
            data_key, noise_key = jax.random.split(key)
            s, _norms, losses = clip(task, params, batch, data_key, C)
            if per_micro_std > 0:
                s = add_gaussian_noise(s, noise_key, per_micro_std)
            return jax.tree.map(jnp.add, acc, s), jnp.sum(losses * batch["mask"]), jnp.sum(batch["mask"])

        def apply(state, acc, key):
            grads = noise_and_normalize(acc, key, C, apply_sigma, denominator)
            updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
            return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, optax.tree.norm(grads)

        if self.correlated:
            matrix = self.noising_matrix

            def apply(state, acc, key):  # noqa: F811 (correlated noise: row t of C^-1 Z, the state kept)
                grads, noise_state = correlated_noise_and_normalize(acc, key, C, apply_sigma, denominator, matrix, state["noise"])
                updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
                return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state, "noise": noise_state}, optax.tree.norm(grads)

        self._sharding = None
        if self.P > 1:
            from jax.sharding import Mesh, NamedSharding, PartitionSpec

            mesh = Mesh(np.array(jax.devices()[: self.P]), ("data",))
            self._sharding = (NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec()))
        self._accumulate = jax.jit(accumulate, donate_argnums=(1,))
        self._apply = jax.jit(apply)

    # ---- the Stepper interface ---------------------------------------------------------------------
    def init_state(self, params) -> dict:  # noqa: ANN001
        """Parameters and optimizer state; with correlated noise also C^-1's bands or buffers
        (``noise``: checkpointed with the rest in a simulation, rebuilt on resume under secure noise,
        so a resumed run draws the same noise either way)."""
        state = super().init_state(params)
        if self.correlated:
            state["noise"] = init_noise_state(self.noising_matrix, params)
        return state

    def restore_state(self, stored: dict, done: int, log: Callable[[str], None]) -> dict:
        """With :attr:`replays_noise`, ``noise`` rebuilt from the secret key: Z_0..Z_{done-1} replayed
        through C^-1 (``done`` model-sized draws), bit for bit the state an unbroken run holds."""
        if not self.replays_noise:
            return stored
        log(f"rebuilding the correlated noise state: replaying {done} draws")
        state = {**stored, "noise": init_noise_state(self.noising_matrix, stored["params"])}
        if self._sharding is not None:
            state = jax.device_put(state, self._sharding[1])
        zero = jax.tree.map(jnp.zeros_like, state["params"])  # the accumulator a step starts from

        def noise_step(noise, key):  # the training step's own compiled update; only its noise state is kept
            return self._apply({**state, "noise": noise}, zero, key)[0]["noise"]

        keys = (jax.random.fold_in(self.correlated_key, t) for t in range(done))
        return {**state, "noise": replay_noise_state(noise_step, state["noise"], keys)}

    def sample(self, step: int) -> np.ndarray:
        """Record indices of step ``step``'s logical batch (deterministic by seed and step): (units,)
        for example-level DP-SGD, (users, examples_per_user) for user-level."""
        if self.user_batches is not None:
            return self.user_batches.indices(step)
        if self.schedule is not None:
            return self.schedule.sample(step)
        n = len(self.train["mask"])
        rng = np.random.default_rng([self.noise.entropy, step, 0xD5])
        if self.dp.sampling == "poisson":
            return np.flatnonzero(rng.random(n) < self.q)
        return np.sort(rng.choice(n, size=self.cfg.batch_size, replace=False))

    def step(self, state: dict, step: int) -> tuple[dict, dict[str, Any]]:
        idx = self.sample(step)
        key = jax.random.fold_in(self.base_key, step)
        if self._sharding is not None:
            state = jax.device_put(state, self._sharding[1])
        acc = jax.tree.map(jnp.zeros_like, state["params"])
        loss_sum, count = 0.0, 0.0
        chunks = max(1, math.ceil(len(idx) / self.rows)) if self.sampling in ("poisson", "cyclic-poisson") else self.T
        for k in range(chunks):
            units = idx[k * self.rows : (k + 1) * self.rows]
            batch = gather(self.train, units.reshape(-1), self.rows * self.group)
            if self._sharding is not None:
                batch = jax.device_put(batch, self._sharding[0])
            acc, ls, c = self._accumulate(state["params"], acc, batch, jax.random.fold_in(key, k + 1))
            loss_sum, count = loss_sum + ls, count + c
        noise_key = jax.random.fold_in(self.correlated_key, step) if self.correlated else jax.random.fold_in(key, 0)
        state, noised_norm = self._apply(state, acc, noise_key)
        self.budget.record()
        info = {"noised_update_norm": float(noised_norm)}  # public: the divergence check reads it
        if self.cfg.log_private_stats:  # the batch's unnoised loss and realized size: outside epsilon
            info.update(loss=float(loss_sum / jnp.maximum(count, 1.0)), batch_examples=float(count))
        return state, info

    def train_row(self, done: int, infos: list[dict[str, Any]]) -> dict[str, Any]:
        """The last step's noised update norm (public) and the privacy columns; the mean batch
        loss only with ``training.log_private_stats`` (it is computed without noise)."""
        row: dict[str, Any] = {"noised_update_norm": infos[-1]["noised_update_norm"] if infos else None}
        if self.cfg.log_private_stats:
            row["loss"] = sum(i["loss"] for i in infos) / max(len(infos), 1)
        return {**row, **self.privacy_report()}

    def stop_reason(self, done: int) -> str | None:
        return self.budget.stop_reason(done)

    def stops_on_data(self, why: str) -> None:
        self.budget.stops_on_data(why)

    def privacy_report(self) -> dict[str, Any]:
        return self.budget.report()

    def save(self, run: RunDir, done: int) -> None:
        self.budget.save(run.file(LEDGER))

    def resume(self, run: RunDir, done: int) -> None:
        self.budget.resume(run.file(LEDGER), done)

    def ledger(self) -> Any:
        return self.budget.ledger if self.budget.event is not None else None
