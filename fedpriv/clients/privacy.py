"""Record-level accounting of client-side DP-SGD (each client runs DP-SGD on its own examples).

Within a round, a participating client makes E passes over a shuffled partition of its examples,
so each example is in at most E local steps, each a Gaussian mechanism with sensitivity C
(add-or-remove-one example: the denominator is the public local batch size B) and noise sigma*C.
Shuffled batches give no subsampling amplification that the accountants cover, so none is
claimed: after rounds 1..r an example of a user who took part in k of them has been through at
most k*E such mechanisms. The report is the worst case over the training users, with k the
largest participation count so far. This bound is loose; it is what the tool can state honestly.
"""

from __future__ import annotations

from typing import Any

from fedpriv.config import ClientDPConfig
from fedpriv.privacy.accounting import GaussianSteps
from fedpriv.privacy.budget import DPBudget


class RecordLevelPrivacy:
    """The record-level guarantee of client-side DP-SGD (see the module docstring)."""

    def __init__(self, cdp: ClientDPConfig, local_epochs: int):
        self.cdp = cdp
        self.local_epochs = local_epochs
        one_step = GaussianSteps("none", 1.0, 1, 1, 1, "example")
        self.budget = DPBudget(one_step, cdp.noise_multiplier, None, cdp.delta, "rdp", key="federated.client_dp")

    def report(self, max_participation: int) -> dict[str, Any]:
        """``client_epsilon`` at ``client_delta`` and its guarantee when the most frequent user
        took part in ``max_participation`` rounds."""
        k = max_participation * self.local_epochs
        if k == 0:
            return {"client_epsilon": 0.0, "client_delta": self.cdp.delta, "client_guarantee": "no local steps yet"}
        ans = self.budget.epsilon_after(k)
        return {
            "client_epsilon": ans.epsilon,
            "client_delta": self.cdp.delta,
            "client_guarantee": f"record-level, add-or-remove-one example: {k} Gaussian steps (noise multiplier {self.cdp.noise_multiplier}, no amplification from shuffled local batches); epsilon = {ans.epsilon:.4g} at delta = {self.cdp.delta:g}",
        }
