"""The privacy ledger a trainer or strategy appends to at every step or round.

Consecutive steps with the same mechanism are merged into one entry (so a 100,000-step run is a
few lines). The ledger is saved as JSON (in a run directory: ``privacy_ledger.json``, see
:mod:`fedpriv.rundir`; written atomically), reloaded on resume, and answers epsilon for a delta (or delta for an epsilon) with
every accountant the recorded events allow, each answer stating its assumptions.
"""

from __future__ import annotations

import os
from dataclasses import asdict, fields
from pathlib import Path

from fedpriv.errors import DataFormatError, FedprivError
from fedpriv.jsonio import read_json, write_json_atomic
from fedpriv.privacy.accounting import (
    AccountantName,
    GaussianSteps,
    PrivacyAnswer,
    available_accountants,
    common_relation,
    delta_for,
    epsilon_for,
)
from fedpriv.privacy.amplified import AmplifiedBandMF
from fedpriv.privacy.correlated import CorrelatedSteps

Event = GaussianSteps | CorrelatedSteps | AmplifiedBandMF

_FORMAT = "fedpriv-privacy-ledger"


class PrivacyLedger:
    """An append-only record of the DP events of one training run."""

    def __init__(self, entries: list[Event] | None = None):
        self.entries: list[Event] = []
        for e in entries or []:
            self.record(e)

    def record(self, event: Event) -> None:
        """Append ``event`` (its ``steps`` steps); merges with the last entry when the mechanism is the same.
        Refuses an event whose neighbouring relation or unit differs from the ledger's."""
        if self.entries:
            common_relation([self.entries[-1], event])
            last = self.entries[-1]
            if last.same_mechanism(event):
                self.entries[-1] = last.with_steps(last.steps + event.steps)
                return
        self.entries.append(event)

    @property
    def steps(self) -> int:
        return sum(e.steps for e in self.entries)

    def accountants(self) -> list[str]:
        return available_accountants(self.entries) if self.entries else []

    def epsilon(self, delta: float, accountant: AccountantName = "rdp") -> PrivacyAnswer:
        return epsilon_for(self.entries, delta, accountant)

    def delta(self, epsilon: float, accountant: AccountantName = "rdp") -> PrivacyAnswer:
        return delta_for(self.entries, epsilon, accountant)

    def answers(self, delta: float) -> list[PrivacyAnswer]:
        """epsilon at ``delta`` from every accountant that covers the recorded events."""
        return [self.epsilon(delta, a) for a in self.accountants()]

    # ---- persistence --------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"format": _FORMAT, "version": 1, "entries": [asdict(e) for e in self.entries]}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write to the file ``path``, atomically."""
        return write_json_atomic(Path(path), self.to_json(), indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "PrivacyLedger":
        path = Path(path)
        obj = read_json(path, "privacy ledger")
        if not isinstance(obj, dict) or obj.get("format") != _FORMAT or not isinstance(obj.get("entries"), list):
            raise DataFormatError(path, None, "not a fedpriv privacy ledger")
        names = {f.name for f in fields(GaussianSteps)}
        correlated = {f.name for f in fields(CorrelatedSteps)}
        amplified = {f.name for f in fields(AmplifiedBandMF)}
        entries = []
        for i, raw in enumerate(obj["entries"]):
            if not isinstance(raw, dict) or set(raw) not in (names, correlated, amplified):
                raise DataFormatError(
                    path, f"entry {i}", f"expected the keys {sorted(names)} (or, correlated noise, {sorted(correlated)}; amplified banded MF, {sorted(amplified)})"
                )
            try:
                if set(raw) == names:
                    entries.append(GaussianSteps(**raw))
                else:
                    entries.append((CorrelatedSteps if set(raw) == correlated else AmplifiedBandMF).from_json(raw))
            except (FedprivError, TypeError, ValueError) as e:
                raise DataFormatError(path, f"entry {i}", f"not a mechanism ({e})") from None
        return cls(entries)
