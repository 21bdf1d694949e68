"""FedAvg, FedAvg+Clip and DP-FedAvg as one Flower strategy (``flwr.serverapp.strategy.Strategy``)
over the shared server core; the engine that runs rounds through a Flower grid.

Nodes are workers, users are clients: ``configure_train`` samples the round's cohort of USERS
from the whole population with :class:`~fedpriv.strategies.sampling.CohortSampler`, cuts it (sorted)
into consecutive groups of ``federated.flower.users_per_message`` users and sends one message per group
(``config["users"]``, ``config["round"]``) to the connected SuperNodes in turn; any node can train
any user (in simulation every ClientApp loads the same corpus). Each user is still trained alone
from the global model and returns its own delta: a group only shares a message (the reply holds
the group's deltas stacked, with per-user aggregation weights: example counts, or 1 each in a DP
run, whose replies carry no example count). ``aggregate_train`` checks every reply
(:func:`check_reply_users`), then feeds the replies, in user order, into the same
:class:`~fedpriv.strategies.server.ServerCore` the vectorized engine uses, applies the server
optimizer and returns the new global model.

With ``federated.flower.sum_on_client`` (``config["sum"]``, with the round's S in ``config["clip"]``) a
ClientApp replies with the sum its group adds to the server's accumulator (each delta clipped to
S, or weighted by example count for fedavg) and the users' unclipped delta norms: 1/K of the
bytes for K users per message. The result differs from the per-delta sum only in the order of
float additions. The server checks the sum's length (at most K * S, :func:`check_reply_sum`) but
cannot check each delta: the guarantee then rests on the ClientApp's clipping, as with Flower's
client-side clipping mods.

Failed replies, and replies missing after ``federated.flower.round_timeout_s`` (a SuperNode that died
mid-round), are dropped and their users counted (``failed`` in the train row); the round
completes with the remaining users. For DP-FedAvg this keeps the guarantee: the denominator
stays the public m and a missing user only removes a clipped term.
A round in which every reply failed raises :class:`~fedpriv.errors.FedprivError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedpriv.engines.setup import FederatedSetup
from fedpriv.errors import FedprivError
from fedpriv.privacy.aggregate import global_norms
from fedpriv.strategies.server import STRATEGY_LABELS

ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"


def params_to_record(params: Any) -> ArrayRecord:
    """A parameter pytree as an ArrayRecord (leaves in ``tree_flatten`` order)."""
    return ArrayRecord(numpy_ndarrays=[np.asarray(x) for x in jax.tree_util.tree_leaves(params)])


def record_to_arrays(record: ArrayRecord, template: Any, stacked: int | None = None) -> Any:
    """Inverse of :func:`params_to_record` for a pytree shaped like ``template`` (or like
    ``stacked`` copies of it stacked on a leading axis), as NumPy arrays; shapes are checked."""
    leaves, treedef = jax.tree_util.tree_flatten(template)
    arrays = record.to_numpy_ndarrays()
    if len(arrays) != len(leaves):
        raise FedprivError(f"received {len(arrays)} arrays, the model has {len(leaves)}")
    lead = () if stacked is None else (stacked,)
    for a, t in zip(arrays, leaves):
        if a.shape != lead + tuple(t.shape):
            raise FedprivError(f"received an array of shape {a.shape} where {lead + tuple(t.shape)} was expected")
    return jax.tree_util.tree_unflatten(treedef, arrays)


def record_to_params(record: ArrayRecord, template: Any) -> Any:
    """:func:`record_to_arrays` as JAX arrays."""
    return jax.tree_util.tree_map(jnp.asarray, record_to_arrays(record, template))


def check_reply_users(server_round: int, users: list[int], deltas: int, cohort: set[int], seen: set[int]) -> None:
    """Refuse a reply that does not hold exactly one delta for each of its users, or names a user
    not sampled this round or already answered for: each sampled user must add at most one
    clipped delta, which the sensitivity of DP-FedAvg's sum rests on. Adds the users to ``seen``."""
    bad = [u for u in users if u not in cohort]
    if not users or deltas != len(users) or len(set(users)) != len(users):
        raise FedprivError(f"round {server_round}: a reply holds {deltas} weights for users {users}; one per distinct user expected")
    if bad:
        raise FedprivError(f"round {server_round}: a reply names users {bad} that were not sampled this round")
    again = seen.intersection(users)
    if again:
        raise FedprivError(f"round {server_round}: users {sorted(again)} were answered for twice")
    seen.update(users)


def check_reply_sum(server_round: int, users: list[int], norms: list[float], sum_norm: float, clip_norm: float) -> None:
    """Refuse a summed reply (``federated.sum_on_client``) without one delta norm per user, or
    whose sum is longer than its users' deltas clipped to S can make it: at most len(users) * S
    (relative float slack 1e-5). ``clip_norm`` inf (fedavg) skips the length check. This catches a
    ClientApp that did not clip; the server cannot check each delta it never sees."""
    if len(norms) != len(users):
        raise FedprivError(f"round {server_round}: a summed reply for users {users} holds {len(norms)} delta norms; one per user expected")
    bound = len(users) * clip_norm
    if math.isfinite(clip_norm) and not sum_norm <= bound * (1 + 1e-5):
        raise FedprivError(
            f"round {server_round}: the sum of the deltas of users {users} has norm {sum_norm:.6g}, more than "
            f"{len(users)} deltas clipped to S = {clip_norm:g} can have ({bound:.6g}); the ClientApp did not clip"
        )


#: Said instead of how many of a round's client updates failed where that would tell the realized
#: size of a Poisson-sampled DP cohort, which is private.
HIDDEN_SIZE = "how many is not printed: under Poisson sampling the cohort's size is private"


class FedprivStrategy(Strategy):
    """The Flower strategy of every fedpriv strategy: the setup's server core does the math."""

    def __init__(self, setup: FederatedSetup, log: Callable[[str], None] | None = None):
        self.setup = setup
        self.core = setup.core
        self.log = log or (lambda _m: None)
        self.state: dict | None = None
        self.last_info: dict[str, Any] = {}
        self._sent = 0
        self._cohort: set[int] = set()
        self._canaries = np.zeros(0, np.int64)

    # ---- Strategy API ------------------------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        nodes = sorted(grid.get_node_ids())
        if not nodes:
            raise FedprivError("no SuperNode is connected")
        cohort = self.core.sampler.sample(server_round)
        self._canaries = np.zeros(0, np.int64)
        if self.setup.canary_clients is not None:  # audit canaries are simulated here, not sent
            cohort, self._canaries = self.setup.canary_clients.split(cohort)
        k = self.setup.fcfg.flower.users_per_message
        summed = {"sum": self.setup.fcfg.flower.sum_on_client, "clip": self.core.current_clip(self.state)}
        messages = []
        for i, start in enumerate(range(0, len(cohort), k)):
            users = [int(u) for u in cohort[start : start + k]]
            cfg = ConfigRecord({**dict(config), **summed, "users": users, "round": int(server_round)})
            content = RecordDict({ARRAYS: arrays, CONFIG: cfg})
            messages.append(Message(content=content, message_type=MessageType.TRAIN, dst_node_id=nodes[i % len(nodes)]))
        self._sent = len(cohort)
        self._cohort = {int(u) for u in cohort}
        return messages

    def _sizes_public(self) -> bool:
        """Whether a round's realized cohort size may be printed: not in a DP run whose cohorts are
        Poisson-sampled (the amplification assumes only the noised sum is released), unless
        ``training.log_private_stats`` asks for it (the guarantee then says so)."""
        fcfg, private = self.setup.fcfg, self.setup.private
        return not private or fcfg.sampling in ("fixed", "cyclic") or self.setup.config.training.log_private_stats

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        if self.state is None:
            raise FedprivError("the strategy has no global state; call bind(state) first")
        replies = list(replies)
        good = [m for m in replies if not m.has_error()]
        received = sum(len(m.content[METRICS]["users"]) for m in good)
        sent = max(self._sent, received)
        failed = sent - received
        if sent and not good:
            why = replies[0].error.reason if replies else "no reply before federated.flower.round_timeout_s"
            many = f"every one of the {sent} client updates" if self._sizes_public() else "every client update"
            raise FedprivError(f"round {server_round}: {many} failed ({why}); resume the run once the SuperNodes are back")
        if failed:
            many = f"{failed} of {sent} client updates" if self._sizes_public() else f"some client updates ({HIDDEN_SIZE})"
            self.log(f"round {server_round}: {many} failed or timed out and are left out")
        seen: set[int] = set()
        for m in good:  # every reply's users checked before any is added (a summed reply's length when decoded; a refusal ends the round before anything is applied)
            check_reply_users(server_round, list(m.content[METRICS]["users"]), len(m.content[METRICS]["weights"]), self._cohort, seen)
        good.sort(key=lambda m: int(m.content[METRICS]["users"][0]))
        acc = self.core.accumulator(self.state)
        template = self.state["params"]
        if self.setup.canary_clients is not None:
            self.setup.canary_clients.add(acc, template, self._canaries)
        loss_sum, steps, examples = 0.0, 0, 0
        for m in good:  # in user order; each reply's deltas arrive stacked (users, ...), or summed
            metrics = m.content[METRICS]
            counts = np.asarray(metrics["weights"], np.int64)
            if self.setup.fcfg.flower.sum_on_client:
                partial = record_to_arrays(m.content[ARRAYS], template)
                norms = list(metrics.get("delta-norms", []))
                sum_norm = float(global_norms(jax.tree_util.tree_map(lambda x: x[None], partial))[0])
                check_reply_sum(server_round, list(metrics["users"]), norms, sum_norm, acc.clip_norm)
                acc.add_sum(partial, counts, norms)
            else:
                acc.add(record_to_arrays(m.content[ARRAYS], template, len(counts)), counts)
            loss_sum += float(metrics.get("loss-sum", 0.0))  # absent from a DP run's replies (round_info drops them)
            steps += int(metrics.get("local-steps", 0))
            examples += int(self.setup.data.counts[np.asarray(metrics["users"], np.int64)].sum())
        self.state, info = self.core.finish_round(self.state, server_round, acc)
        # how many updates were lost tells the realized size of a Poisson DP cohort: left out there (as in the round's line)
        self.last_info = {**self.setup.round_info(loss_sum, steps, examples, info), **({"failed": failed} if self._sizes_public() else {})}
        metrics = {k: float(v) for k, v in self.last_info.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return params_to_record(self.state["params"]), MetricRecord(metrics)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        return []  # the global model is evaluated on the server, on held-out users

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None

    def summary(self) -> None:
        f = self.setup.fcfg
        self.log(f"{STRATEGY_LABELS[f.strategy]} on Flower: {f.rounds} rounds of {self.core.m} of {self.core.population} users ({f.sampling} sampling)")

    # ---- fedpriv -------------------------------------------------------------------------------
    def bind(self, state: dict) -> None:
        """Set the global state (params, server optimizer, clip) the next aggregation starts from."""
        self.state = state

    def run_round(self, server_round: int, state: dict, grid: Grid, timeout: float) -> tuple[dict, dict[str, Any]]:
        """One round through the grid: configure, send and receive, aggregate."""
        self.bind(state)
        messages = self.configure_train(server_round, params_to_record(state["params"]), ConfigRecord(), grid)
        replies = grid.send_and_receive(messages, timeout=timeout)
        self.aggregate_train(server_round, replies)
        return self.state, self.last_info


class FlowerEngine:
    """Rounds through a Flower grid (the engine protocol of :mod:`fedpriv.engines.setup`)."""

    name = "flower"

    def __init__(self, strategy: FedprivStrategy, grid: Grid, timeout_s: float):
        self.strategy, self.grid, self.timeout_s = strategy, grid, timeout_s

    def round(self, round_: int, state: dict) -> tuple[dict, dict[str, Any]]:
        return self.strategy.run_round(round_, state, self.grid, self.timeout_s)
