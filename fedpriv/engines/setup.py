"""What every federated engine shares: the setup built once per experiment, the small engine
protocol, and the rounds as a stepper of the one training loop.

An engine is anything with a ``name`` and ``round(round_, state) -> (state, info)``: it runs the
cohort's client updates (in-process: :mod:`fedpriv.engines.vectorized`; through Flower:
:mod:`fedpriv.engines.flower`) and finishes the round with the setup's
:class:`~fedpriv.strategies.server.ServerCore`. :func:`train_federated` runs an engine's rounds
under :func:`fedpriv.training.loop.run_loop`: resume, evaluation, metrics, checkpoints (the
state: global model, server optimizer, clip state; the sampler needs none, round r's cohort is a
function of (seed, r)) and the final parameters are the loop's, as for central training.

A round's train row: mean local loss, clients, clip statistics, wall seconds, and epsilon with
its guarantee (user-level for DP-FedAvg; record-level ``client_epsilon`` for client-side DP-SGD).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.clients.data import ClientData
from fedpriv.clients.privacy import RecordLevelPrivacy, dp_plan
from fedpriv.clients.update import ClientDP
from fedpriv.errors import ConfigError
from fedpriv.memorization.empirical import AuditCanaries, client_direction
from fedpriv.rundir import LEDGER, STRATEGY, RunDir
from fedpriv.strategies.aggregators import DeltaAccumulator
from fedpriv.strategies.sampling import Participation
from fedpriv.strategies.server import ServerCore
from fedpriv.tasks.base import Params
from fedpriv.training.coverage import coverage
from fedpriv.training.loop import LoopResult, Stepper, eval_text, run_loop
from fedpriv.training.noise import check_secret_on_resume, noise_meta, noise_seed
from fedpriv.training.prepared import Prepared


class FederatedSetup:
    """What every engine needs, built once from a prepared experiment with a ``[federated]`` section."""

    def __init__(self, prepared: Prepared, log: Callable[[str], None] | None = None, run_dir: str | os.PathLike[str] | None = None, client: bool = False):
        """``run_dir``: the run directory (created by then) an optimized correlated-noise strategy is
        stored in and read back from; None (config checks): optimized in this process only.
        ``client``: a ClientApp's setup (local training and clipping only): no noise strategy, no
        calibration and no budget (``core.budget`` is None)."""
        cfg = prepared.config
        if cfg.federated is None:
            raise ConfigError(f"experiment {cfg.name!r} has no [federated] section")
        if cfg.privacy is not None:
            raise ConfigError("[privacy] (record-level DP-SGD) is for central training; federated runs take their privacy keys in [federated.dp] (strategy = 'dp-fedavg')")
        self.prepared = prepared
        self.config = cfg
        self.fcfg = cfg.federated
        self.seed = cfg.seed
        self.task = prepared.task
        self.data = ClientData(prepared.train_arrays, prepared.train.counts())
        ac = prepared.audit_canaries
        self.canary_clients = CanaryClients(ac, self.data.num_users) if ac is not None and ac.kind == "client" else None
        extra = self.canary_clients.count if self.canary_clients is not None else 0
        self.noise = noise_seed(cfg, run_dir)
        self.core = ServerCore(self.fcfg, self.data.num_users + extra, cfg.seed, log, self.noise, RunDir(run_dir).file(STRATEGY) if run_dir is not None else None,
                               accounting=not client)
        self.client_dp: ClientDP | None = None
        self.record_level: RecordLevelPrivacy | None = None
        self.participation: Participation | None = None
        private_stats = cfg.training.log_private_stats
        if self.core.budget is not None:
            self.core.budget.coverage = coverage(cfg, self.task, "user", private_stats)
        cdp = self.fcfg.client_dp
        if cdp is not None:
            self.client_dp = ClientDP(cdp.clip_norm, cdp.noise_multiplier, self.fcfg.local_batch_size)
            self.record_level = RecordLevelPrivacy(cdp, coverage(cfg, self.task, "example", private_stats))
            self.participation = Participation(self.core.sampler)
        self.data_stop: str | None = None

    def stops_on_data(self, why: str) -> None:
        """The run may stop before its last round for ``why`` (a utility target): both
        guarantees then count every round it may take (:meth:`DPBudget.stops_on_data`)."""
        self.data_stop = why
        if self.core.budget is not None:
            self.core.budget.stops_on_data(why)

    def privacy_report(self, rounds: int) -> dict[str, Any]:
        """User-level epsilon of the strategy, and record-level epsilon of client-side DP-SGD if on
        (after ``rounds``, or after all rounds when the stop depends on the data)."""
        out = self.core.privacy_report()
        if self.record_level is not None:
            upto = self.fcfg.rounds if self.data_stop is not None else rounds
            out.update(self.record_level.report(self.participation.max_after(upto), self.data_stop))
        return out

    @property
    def client_dp_sampling_rate(self) -> float:
        """q of client-side DP-SGD (1 without it)."""
        return self.fcfg.client_dp.sampling_rate if self.fcfg.client_dp is not None else 1.0

    @property
    def private(self) -> bool:
        """A DP run (DP-FedAvg or client-side DP-SGD): the server learns no example counts, and
        the train rows hold no statistic epsilon does not cover unless ``training.log_private_stats``."""
        return self.fcfg.dp is not None or self.fcfg.client_dp is not None

    def plan(self, user: int, round_: int) -> np.ndarray:
        """(steps, width) row positions of ``user`` in round ``round_`` (-1 = padding): local SGD's
        shuffled batches, or client-side DP-SGD's fixed K Poisson-sampled steps (:func:`dp_plan`)."""
        f, cdp = self.fcfg, self.fcfg.client_dp
        if cdp is not None:
            return dp_plan(int(self.data.counts[user]), cdp.local_steps, cdp.sampling_rate, self.seed, round_, user, f.local_batch_size)
        return self.data.plan(user, round_, self.seed, f.local_epochs, f.local_batch_size, f.max_local_steps)

    def local_steps(self, user: int) -> int:
        """Local steps of ``user`` in a round (client-side DP-SGD: K for every user)."""
        f = self.fcfg
        if f.client_dp is not None:
            return f.client_dp.local_steps
        return self.data.local_steps(user, f.local_epochs, f.local_batch_size, f.max_local_steps)

    def local_steps_of(self, users: np.ndarray) -> np.ndarray:
        """:meth:`local_steps` of many users at once (int64)."""
        f = self.fcfg
        users = np.asarray(users, np.int64)
        if f.client_dp is not None:
            return np.full(len(users), f.client_dp.local_steps, np.int64)
        return self.data.local_steps_of(users, f.local_epochs, f.local_batch_size, f.max_local_steps)

    def weights(self, users: np.ndarray) -> np.ndarray:
        """The aggregation weights of ``users``: their example counts (FedAvg), or 1 each in a DP
        run, where the server must not learn n_u (DP-FedAvg's sum is uniform anyway; client-side
        DP-SGD's record-level guarantee does not cover n_u)."""
        users = np.asarray(users, np.int64)
        if self.private:
            return np.ones(len(users), np.int64)
        return self.data.counts[users]

    def round_info(self, loss_sum: float, steps: int, examples: int, info: dict[str, Any]) -> dict[str, Any]:
        """A round's train-row statistics: the clients' (:func:`client_loss_info`) and the
        aggregator's. In a DP run the statistics computed from the cohort's data without noise
        (:data:`PRIVATE_ROUND_KEYS`) are left out and ``clients`` is the public expected cohort
        size m (the realized size is private under Poisson sampling), unless
        ``training.log_private_stats`` asks for them (the guarantee then says so)."""
        row = {**client_loss_info(loss_sum, steps, examples), **info}
        if self.private and not self.config.training.log_private_stats:
            for k in PRIVATE_ROUND_KEYS:
                row.pop(k, None)
            if "clients" in row:
                row["clients"] = self.core.m
        return row

    def initial_params(self) -> Params:
        return self.prepared.initial_params(self.seed)


class CanaryClients:
    """The member canary clients of an empirical audit with random-direction canaries (Andrew et
    al. 2024): they join the population as users ``first .. first + count - 1``, hold no data,
    and when sampled add their fixed direction, scaled to the round's clip norm S, to the round's
    clipped sum like any client's delta (:func:`fedpriv.memorization.empirical.client_direction`)."""

    def __init__(self, canaries: AuditCanaries, first: int):
        self.seed = canaries.seed
        self.canary_index = np.flatnonzero(canaries.included)  # population user first + j is canary canary_index[j]
        self.first = first

    @property
    def count(self) -> int:
        return int(len(self.canary_index))

    def split(self, cohort: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the cohort's real users, its canary clients as population indices)."""
        cohort = np.asarray(cohort)
        return cohort[cohort < self.first], cohort[cohort >= self.first]

    def add(self, acc: DeltaAccumulator, template: Params, canaries: np.ndarray) -> None:
        """Add the sampled canary clients' directions (norm S) to the round's accumulator."""
        if len(canaries) == 0:
            return
        norm = acc.clip_norm if np.isfinite(acc.clip_norm) else 1.0
        dirs = [client_direction(self.seed, int(self.canary_index[u - self.first]), template, norm) for u in canaries]
        # stacked on the host (the same floats): jnp.stack would compile one program per cohort's canary count
        acc.add(jax.tree_util.tree_map(lambda *x: np.stack([np.asarray(v) for v in x]), *dirs), np.ones(len(dirs)))


class Engine(Protocol):
    """Runs one round: the cohort's client updates and the server's aggregation."""

    name: str

    def round(self, round_: int, state: dict) -> tuple[dict, dict[str, Any]]: ...


#: Train-row keys of a round computed from the cohort's data without noise: a DP run logs them
#: only with ``training.log_private_stats`` (``clients`` is replaced by the expected m).
PRIVATE_ROUND_KEYS = ("loss", "local_steps", "examples", "mean_delta_norm", "unclipped_fraction")


def client_loss_info(loss_sum: float, steps: int, examples: int) -> dict[str, Any]:
    """The train row's client statistics: mean local step loss, local steps and examples."""
    return {"loss": loss_sum / steps if steps else None, "local_steps": steps, "examples": examples}


class RoundStepper(Stepper):
    """Federated rounds under the one loop: step i is round i + 1 of ``engine``."""

    kind = "federated"
    unit = "round"

    def __init__(self, setup: FederatedSetup, engine: Engine):
        self.setup, self.engine = setup, engine
        f = setup.fcfg
        self.total, self.row_every, self.eval_every, self.checkpoint_every = f.rounds, 1, f.eval_every, f.checkpoint_every
        self.title = f"federated {f.strategy} ({engine.name})"

    def init_state(self, params: Params) -> dict:
        return self.setup.core.init_state(params)

    def checkpoint_state(self, state: dict) -> dict:
        return self.setup.core.checkpoint_state(state)

    def restore_state(self, stored: dict, done: int, log: Callable[[str], None]) -> dict:
        return self.setup.core.restore_state(stored, done, log)

    def step(self, state: dict, index: int) -> tuple[dict, dict[str, Any]]:
        t0 = time.perf_counter()
        state, info = self.engine.round(index + 1, state)
        return state, {**info, "round_seconds": time.perf_counter() - t0}

    def position(self, done: int) -> dict[str, Any]:
        return {"round": done}

    def train_row(self, done: int, infos: list[dict[str, Any]]) -> dict[str, Any]:
        return {**infos[-1], **self.setup.privacy_report(done)}

    def stop_reason(self, done: int) -> str | None:
        return self.setup.core.stop_reason(done)

    def stops_on_data(self, why: str) -> None:
        self.setup.stops_on_data(why)

    def describe(self, done: int, row: dict[str, Any], eval_rows: list[dict[str, Any]], seconds: float, since: int) -> str:
        parts = [f"round {done}/{self.total}", f"clients {row.get('clients', 0)}"]
        if row.get("loss") is not None:
            parts.append(f"local loss {row['loss']:.4f}")
        if row.get("client_epsilon") is not None:
            q = self.setup.fcfg.client_dp.sampling_rate
            sampling = "every example in every local step, no sampling amplification" if q == 1.0 else f"Poisson q = {q:g} per local step"
            parts.append(f"record-level client epsilon {row['client_epsilon']:.3g} (delta {row['client_delta']:g}, add-or-remove-one example; {sampling})")
        if row.get("clip_norm") is not None:
            frac = row.get("unclipped_fraction", row.get("noised_unclipped_fraction"))  # exact only with log_private_stats in a DP run
            parts.append(f"clip {row['clip_norm']:.3g}" + (f" (unclipped {frac:.0%})" if frac is not None else ""))
        if row.get("epsilon") is not None:
            parts.append(f"epsilon {row['epsilon']:.3g} (delta {row['delta']:g}; {row['basis']})")
        parts += eval_text(eval_rows)
        parts.append(f"{seconds:.0f}s")
        return ", ".join(parts)

    def save(self, run: RunDir, done: int) -> None:
        if self.setup.core.budget is not None:
            self.setup.core.budget.save(run.file(LEDGER))

    def resume(self, run: RunDir, done: int) -> None:
        if self.setup.core.budget is not None:
            self.setup.core.budget.resume(run.file(LEDGER), done)

    def ledger(self) -> Any:
        budget = self.setup.core.budget
        return budget.ledger if budget is not None and budget.event is not None else None


def train_federated(
    setup: FederatedSetup,
    engine: Engine,
    run_dir: str | os.PathLike[str],
    stop_after: int | None = None,
    log: Callable[[str], None] | None = None,
) -> LoopResult:
    """Run (or resume) the experiment's rounds with ``engine`` (see the module docstring).
    ``stop_after``: stop with a checkpoint once this many rounds are done (a kill, for tests)."""
    check_secret_on_resume(run_dir, setup.noise)
    run = RunDir(run_dir).create()
    setup.prepared.save_assets(run.path)
    meta = {"kind": "federated", "engine": engine.name, "experiment": setup.config.model_dump(), "utility": list(setup.task.utility), **noise_meta(setup.noise)}
    stepper = RoundStepper(setup, engine)
    return run_loop(
        stepper, setup.task, run, setup.seed, meta, setup.prepared.eval_arrays, setup.config.training.eval_batch_size, stop_after, log,
        setup.prepared.target(), setup.config.audit.along, setup.initial_params(),
    )
