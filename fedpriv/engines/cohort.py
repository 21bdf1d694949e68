"""The deltas of a group of users in one jitted call: what the vectorized engine runs per chunk
and a Flower ClientApp runs per message.

Each user's plan (:meth:`~fedpriv.engines.setup.FederatedSetup.plan`) is padded to the group's
longest plan rounded up to a power of two; the group is padded with empty plans to ``width``
users (weight 0), so a run compiles a handful of shapes. The update is
:func:`fedpriv.clients.update.make_cohort_update`: ``scan`` (one user after another, padding
skipped: CPUs) or ``vmap`` (all at once: accelerators); ``auto`` picks by backend. Every user's
key is ``client_key(seed, round, user)``, so a user's delta does not depend on which group, or
which engine, computed it.

Devices: over ``federated.devices`` devices of JAX's default backend (default: every accelerator,
and one device on a CPU, where forced host devices share the same cores), a group of ``width`` users is split over
a 1-D mesh of ``gcd(width, devices)`` of them (``jax.sharding``, axis ``clients``): each device
runs the same update (scan or vmap) on its slice of the users, the parameters replicated. The
deltas come back to the first device, where the strategy's accumulator adds them in user order,
so the result equals the single-device one (each user's delta is computed by the same program).
One device (a CPU, one GPU): no mesh, the update is the plain jitted call.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from fedpriv.clients.data import next_power_of_two
from fedpriv.clients.update import make_cohort_update
from fedpriv.privacy.streams import CLIENT, stream_key
from fedpriv.engines.setup import FederatedSetup
from fedpriv.errors import ConfigError
from fedpriv.tasks.base import Params


def client_keys(seed: int, round_: int, users: np.ndarray) -> jax.Array:
    """``client_key(seed, round_, u)`` for every u of ``users``, as one batched key array."""
    base = jax.random.fold_in(stream_key(seed, CLIENT), round_)
    return jax.vmap(lambda u: jax.random.fold_in(base, u))(jnp.asarray(users, jnp.uint32))


def vectorize_mode(setting: str) -> str:
    """``auto``: scan on CPU (batching clients gains nothing there and padding costs in full),
    vmap on accelerators."""
    if setting != "auto":
        return setting
    return "scan" if jax.default_backend() == "cpu" else "vmap"


class ShardedUpdate:
    """A cohort update (batches (K, S, B, ...), step_mask (K, S), keys (K,)) split over the
    clients axis of 1-D device meshes: one compiled program per mesh size (see the module
    docstring). ``devices``: the devices to use (default: all of the default backend)."""

    def __init__(self, update: Callable, devices: list | None = None):
        self.update = update  # unjitted (K, ...) -> (deltas (K, ...), loss sums (K,))
        self.devices = list(devices) if devices is not None else jax.devices()
        self.single = jax.jit(update)
        self.sharded: dict[int, tuple[Callable, NamedSharding, NamedSharding]] = {}

    def mesh_size(self, width: int) -> int:
        """Devices a group of ``width`` users is split over: the largest count that divides it."""
        return math.gcd(width, len(self.devices))

    def __call__(self, params, batches, step_mask, keys):
        d = self.mesh_size(int(step_mask.shape[0]))
        if d == 1:
            return self.single(params, batches, step_mask, keys)
        if d not in self.sharded:
            mesh = Mesh(np.array(self.devices[:d]), ("clients",))
            fn = jax.jit(jax.shard_map(self.update, mesh=mesh, in_specs=(P(), P("clients"), P("clients"), P("clients")), out_specs=(P("clients"), P("clients")), check_vma=False))
            self.sharded[d] = (fn, NamedSharding(mesh, P()), NamedSharding(mesh, P("clients")))
        fn, replicated, split = self.sharded[d]
        params = jax.device_put(params, replicated)
        batches, step_mask, keys = jax.device_put((batches, step_mask, keys), split)
        deltas, loss_sums = fn(params, batches, step_mask, keys)
        return jax.device_put((deltas, loss_sums), self.devices[0])


def cohort_devices(wanted: int | None) -> list:
    """The devices a cohort is split over: ``federated.devices`` of JAX's default backend, or by
    default every accelerator, and one device on a CPU (forced host devices share its cores, so a
    split adds compiles and no speed)."""
    have = jax.devices()
    n = wanted if wanted is not None else (len(have) if jax.default_backend() != "cpu" else 1)
    if n > len(have):
        raise ConfigError(f"federated.devices = {n}, but JAX's {jax.default_backend()} backend has {len(have)} device(s)")
    return have[:n]


class CohortUpdate:
    """The jitted update of a group of users of one experiment (split over the default backend's
    devices when there are several; ``devices`` overrides which, ``mode`` the config's
    ``federated.vectorize``)."""

    def __init__(self, setup: FederatedSetup, devices: list | None = None, mode: str | None = None):
        self.setup = setup
        self.mode = vectorize_mode(mode or setup.fcfg.vectorize)
        self.update = ShardedUpdate(make_cohort_update(setup.task, setup.fcfg.client_learning_rate, setup.client_dp, self.mode, jit=False),
                                    devices if devices is not None else cohort_devices(setup.fcfg.devices))

    def deltas(self, params: Params, users: np.ndarray, round_: int, width: int) -> tuple[Params, np.ndarray, float, int]:
        """Deltas of ``users`` (at most ``width``), padded to ``width`` users.
        Returns (stacked deltas, (width,) real-user mask, sum of the users' loss sums, real local steps)."""
        s = self.setup
        users = np.asarray(users, np.int64)
        if not 0 < len(users) <= width:
            raise ValueError(f"a group of {len(users)} users does not fit in width {width}")
        plans = [s.plan(int(u), round_) for u in users]
        steps = next_power_of_two(max(len(p) for p in plans))
        pad = width - len(users)
        if s.client_dp is not None:  # client-side DP-SGD's steps vary in size (Poisson: rounded up to a power of two); every planned step is live
            cols = max(p.shape[1] for p in plans)
            cols = next_power_of_two(cols) if s.client_dp_sampling_rate < 1.0 else cols
            plans = [np.pad(p, ((0, 0), (0, cols - p.shape[1])), constant_values=-1) for p in plans]
        batches, step_mask = s.data.group_batches(users, plans, steps, width)
        if s.client_dp is not None:  # a step that took no example still adds its noise
            step_mask = np.zeros_like(step_mask)
            for i, p in enumerate(plans):
                step_mask[i, : len(p)] = 1.0
        keys = client_keys(s.seed, round_, np.concatenate([users, np.zeros(pad, np.int64)]))
        deltas, loss_sums = self.update(params, batches, step_mask, keys)
        mask = np.concatenate([np.ones(len(users), np.float32), np.zeros(pad, np.float32)])
        return deltas, mask, float(np.sum(np.asarray(loss_sums)[: len(users)])), int(sum(len(p) for p in plans))
