"""Client-side DP-SGD: the local step schedule and its record-level accounting.

The schedule (:func:`dp_plan`). A participating client makes exactly K = ``client_dp.local_steps``
noisy steps per round, whatever its number of examples n_u. In each step every one of its
examples is taken independently with probability q = ``client_dp.sampling_rate`` (Poisson
sampling within the client; q = 1: every example in every step); each taken example's gradient
is clipped to C, the clipped sum gets N(0, (sigma*C)^2) per coordinate and is divided by the
public local batch size B. A step that takes no example still adds its noise. So the number of
noise draws never depends on the data, and adding or removing one example of a user changes each
step's clipped sum by at most C: each step is the Poisson-sampled Gaussian mechanism over the
user's examples, add-or-remove-one example (dp_accounting's ``PoissonSampledDpEvent(q,
GaussianDpEvent(sigma))``; for q = 1, ``GaussianDpEvent(sigma)``).

The server must not learn n_u either: with client-side DP-SGD every engine weights the clients'
deltas uniformly and a Flower reply carries weights of 1, never example counts
(:meth:`fedpriv.engines.setup.FederatedSetup.weights`).

The accounting (:class:`RecordLevelPrivacy`): after rounds 1..r, an example of a user who took
part in k of them has been through k*K such steps, composed. The report is the worst case over
the training users, with k the largest participation count so far (no amplification from the
server's sampling of users is claimed). Example-level only: a user's examples together get the
group guarantee.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedpriv.clients.data import PLAN_STREAM
from fedpriv.config import ClientDPConfig
from fedpriv.privacy.accounting import GaussianSteps
from fedpriv.privacy.budget import DPBudget
from fedpriv.privacy.streams import SIMULATION_NOTE

#: Separates the within-client sampling of client-side DP-SGD from every other stream of a seed.
DP_PLAN_STREAM = 0x5EED_D95D
#: Population of the Poisson template: q = batch / population exactly enough (q is read from it).
_POPULATION = 1 << 30


def dp_plan(n: int, steps: int, sampling_rate: float, seed: int, round_: int, user: int, batch_size: int) -> np.ndarray:
    """(steps, width) row positions within a user of ``n`` examples (-1 = padding): step s holds
    each row independently with probability ``sampling_rate``; width is the largest step's size
    (at least 1). With ``sampling_rate`` 1 every step holds every row, in a fresh order, and the
    width is max(n, ``batch_size``): for n <= B and one step, exactly local SGD's one-epoch plan
    (:meth:`fedpriv.clients.data.ClientData.plan`, same stream). The draws come from
    ``default_rng([seed, stream, round_, user])``: the same in every engine and process."""
    if sampling_rate >= 1.0:
        rng = np.random.default_rng([seed, PLAN_STREAM, round_, user])
        plan = np.full((steps, max(n, batch_size)), -1, dtype=np.int64)
        for s in range(steps):
            plan[s, :n] = rng.permutation(n)
        return plan
    rng = np.random.default_rng([seed, DP_PLAN_STREAM, round_, user])
    taken = rng.random((steps, n)) < sampling_rate
    width = max(1, int(taken.sum(axis=1).max(initial=0)))
    plan = np.full((steps, width), -1, dtype=np.int64)
    for s in range(steps):
        rows = np.flatnonzero(taken[s])
        plan[s, : len(rows)] = rows
    return plan


def step_template(cdp: ClientDPConfig) -> GaussianSteps:
    """One local step's mechanism with noise multiplier 1 (see the module docstring)."""
    if cdp.sampling_rate >= 1.0:
        return GaussianSteps("none", 1.0, 1, 1, 1, "example")
    return GaussianSteps("poisson", 1.0, _POPULATION, cdp.sampling_rate * _POPULATION, 1, "example")


#: What the record-level guarantee of a run that may stop on its data says (its ε counts every planned round).
EVERY_ROUND = "counted over every round the run may take"


class RecordLevelPrivacy:
    """The record-level guarantee of client-side DP-SGD (see the module docstring). ``coverage``:
    what the guarantee must add (:class:`fedpriv.training.coverage.Coverage`), or None."""

    def __init__(self, cdp: ClientDPConfig, coverage: Any = None):
        self.cdp = cdp
        self.coverage = coverage
        self.budget = DPBudget(step_template(cdp), cdp.noise_multiplier, None, cdp.delta, "rdp", key="federated.client_dp")

    def report(self, max_participation: int, data_stop: str | None = None) -> dict[str, Any]:
        """``client_epsilon`` at ``client_delta`` and its guarantee when the most frequent user
        took part in ``max_participation`` rounds (with ``data_stop``, the reason the run may stop
        early on its data: the participation of all its rounds, and the guarantee says so)."""
        K, q = self.cdp.local_steps, self.cdp.sampling_rate
        k = max_participation * K
        if k == 0:
            return {"client_epsilon": 0.0, "client_delta": self.cdp.delta, "client_guarantee": "no local steps yet"}
        ans = self.budget.epsilon_after(k)
        sampling = "every example in every step" if q >= 1.0 else f"Poisson sampling of each example with q = {q:g} in every step"
        text = (f"record-level, add-or-remove-one example: {k} Gaussian steps ({max_participation} rounds x {K} local steps, the same for "
                f"every client; {sampling}; noise multiplier {self.cdp.noise_multiplier}; no amplification from the server's sampling of "
                f"users); epsilon = {ans.epsilon:.4g} at delta = {self.cdp.delta:g}")
        if data_stop is not None:
            text += f"; {EVERY_ROUND}: it may stop earlier at {data_stop}, a stop that depends on the data"
        text += f"; {SIMULATION_NOTE}"  # client-side noise always comes from the seed (--secure-noise refuses client_dp)
        extra = self.coverage.statement(ans.epsilon, self.cdp.delta) if self.coverage is not None else ""
        return {"client_epsilon": ans.epsilon, "client_delta": self.cdp.delta, "client_guarantee": f"{text}; {extra}" if extra else text}
