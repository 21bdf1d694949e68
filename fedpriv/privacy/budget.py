"""One DP budget for a training run: the noise, the ledger, the stop, the guarantee, the resume check.

DP-SGD (a step = one logical batch of examples), DP-FedAvg (a step = one round of users) and
client-side DP-SGD all hold one :class:`DPBudget`:

* the noise multiplier is the one given, or calibrated on the run's planned steps to a target
  epsilon (:func:`fedpriv.privacy.accounting.resolve_noise_multiplier`);
* every step records one event (the sampled Gaussian mechanism of ``template``, with that noise)
  in the :class:`~fedpriv.privacy.ledger.PrivacyLedger`;
* with an epsilon budget, the run stops cleanly before a step would take epsilon above it;
* :meth:`report` states epsilon at delta with its unit, neighbouring relation and sampling, and
  :meth:`resume` refuses a ledger that does not match the checkpoint or these parameters;
* a run that may stop early on a test of what it trained (a utility target on the validation
  users, :meth:`stops_on_data`) promises the epsilon of the most steps it may take
  (``max_steps``): when it stops depends on the data, and a guarantee of the steps actually taken
  would be an ex-post figure, not differential privacy (Ligett et al. 2017; a release that stops
  at round 1 and one that runs to the end are told apart by their length, and only the whole
  schedule's epsilon bounds both). The steps taken are still reported, as ``epsilon_spent``.

Every guarantee ends with where the noise came from (``note``,
:data:`fedpriv.privacy.streams.SIMULATION_NOTE` unless the run has ``--secure-noise``).

A noise multiplier of 0 is kept as "no noise" (:attr:`event` None): nothing is recorded and the
guarantee reads "none".
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from fedpriv.errors import FedprivError, PrivacyParameterError
from fedpriv.privacy.accounting import AccountantName, GaussianSteps, PLDTooCostly, PrivacyAnswer, check_delta, check_pld_cost, epsilon_for, resolve_noise_multiplier, steps_within_budget
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.privacy.streams import SIMULATION_NOTE


class DPBudget:
    """The DP accounting of one run (see the module docstring).

    ``template``: the mechanism of one step with noise multiplier 1 and ``steps`` = the planned
    number of steps (what a target epsilon is calibrated on). ``key``: the config section, for
    messages (e.g. ``privacy``, ``federated.dp``); ``step_word``: "step" or "round"."""

    def __init__(
        self,
        template: GaussianSteps,
        noise_multiplier: float | None,
        target_epsilon: float | None,
        delta: float,
        accountant: AccountantName = "rdp",
        epsilon_budget: float | None = None,
        key: str = "privacy",
        step_word: str = "step",
        log: Callable[[str], None] | None = None,
        note: str = SIMULATION_NOTE,
    ):
        say = log or (lambda _m: None)
        self.note = note
        if (noise_multiplier is None) == (target_epsilon is None):
            raise PrivacyParameterError(f"{key}: give exactly one of noise_multiplier or target_epsilon")
        check_delta(delta)
        self.delta, self.accountant, self.key, self.step_word = delta, accountant, key, step_word
        self.epsilon_budget = epsilon_budget
        self.planned = template.steps
        self.noise_multiplier = resolve_noise_multiplier(template, noise_multiplier, target_epsilon, delta, accountant, say)
        self.event: GaussianSteps | None = replace(template, noise_multiplier=self.noise_multiplier, steps=1) if self.noise_multiplier > 0 else None
        if accountant == "pld" and self.event is not None:  # every train row asks the accountant: refuse now what it cannot answer
            try:
                check_pld_cost([self.event.with_steps(self.planned)])
            except PLDTooCostly as e:
                raise PLDTooCostly(f"{key}.accountant = 'pld': {e}") from None
        self.max_steps = self.planned
        if epsilon_budget is not None:
            if self.event is None:
                raise PrivacyParameterError(f"{key}.epsilon_budget needs a noise multiplier > 0")
            self.max_steps = steps_within_budget(self.event, epsilon_budget, delta, accountant, self.planned, f"{key}.epsilon_budget", step_word, say)
        self.ledger = PrivacyLedger()
        #: Why the run may stop before ``max_steps`` on what it trained (``stops_on_data``), or None.
        self.data_stop: str | None = None
        self._promised: PrivacyAnswer | None = None
        #: What the guarantee must add (a non-private vocabulary, filters, logged statistics): an
        #: object with ``statement(epsilon, delta) -> str`` (:class:`fedpriv.training.coverage.Coverage`), or None.
        self.coverage: Any = None

    def _guarantee(self, text: str, epsilon: float | None, delta: float | None) -> str:
        extra = self.coverage.statement(epsilon, delta) if self.coverage is not None else ""
        return f"{text}; {extra}" if extra else text

    def stops_on_data(self, why: str) -> None:
        """The run may stop before ``max_steps`` for ``why`` (e.g. "a utility target on the
        validation users"), a test of its own parameters: from now on :meth:`report` promises
        the epsilon of ``max_steps`` steps and reports the steps taken as ``epsilon_spent``."""
        self.data_stop = why

    def promised(self) -> PrivacyAnswer | None:
        """epsilon at delta of everything the run may release: ``max_steps`` steps when the stop
        depends on the data (:meth:`stops_on_data`), else the steps recorded (None before any, or
        without noise)."""
        if self.event is None:
            return None
        if self.data_stop is None:
            return self.answer()
        if self._promised is None:
            self._promised = self.epsilon_after(self.max_steps)
        return self._promised

    def record(self) -> None:
        """Record one step's event (nothing without noise)."""
        if self.event is not None:
            self.ledger.record(self.event)

    def stop_reason(self, done: int) -> str | None:
        """Why to stop after ``done`` steps (the next one would exceed the budget), or None."""
        if self.max_steps < self.planned and done >= self.max_steps:
            w = self.step_word
            return f"stopping after {w} {done}: one more {w} would take epsilon above the budget {self.epsilon_budget} ({self.report()['guarantee']})"
        return None

    def answer(self) -> PrivacyAnswer | None:
        """epsilon at delta of the recorded steps (None before any, or without noise)."""
        if self.event is None or not self.ledger.entries:
            return None
        return self.ledger.epsilon(self.delta, self.accountant)

    def report(self) -> dict[str, Any]:
        """The train row's privacy columns: epsilon, delta, guarantee (every assumption), basis
        (unit, neighbouring relation, sampling)."""
        if self.event is None:
            return {"epsilon": None, "delta": self.delta, "guarantee": "none (noise multiplier 0)", "basis": "no noise"}
        a = self.answer()
        if self.data_stop is not None:
            p = self.promised()
            w, taken = self.step_word, self.ledger.steps
            spent = a.epsilon if a is not None else 0.0
            text = (f"{self._guarantee(p.describe(), p.epsilon, p.delta)}; the run may stop before {w} {self.max_steps} at {self.data_stop}, "
                    f"a stop that depends on the data, so the guarantee is that of all {self.max_steps} {w}s; the {taken} {w}s taken alone "
                    f"give epsilon {spent:.4g}, an ex-post figure that is not a guarantee; {self.note}")
            return {"epsilon": p.epsilon, "delta": p.delta, "epsilon_spent": spent, "promised_steps": self.max_steps, "guarantee": text, "basis": self.event.basis()}
        if a is None:
            return {"epsilon": 0.0, "delta": self.delta, "guarantee": f"no {self.step_word}s yet; {self.note}", "basis": self.event.basis()}
        return {"epsilon": a.epsilon, "delta": a.delta, "guarantee": f"{self._guarantee(a.describe(), a.epsilon, a.delta)}; {self.note}", "basis": self.event.basis()}

    def epsilon_after(self, steps: int) -> PrivacyAnswer:
        """epsilon at delta after ``steps`` of this step's mechanism (no ledger involved)."""
        if self.event is None:
            raise PrivacyParameterError(f"{self.key}: no noise, so no epsilon")
        return epsilon_for(self.event.with_steps(steps), self.delta, self.accountant)

    def save(self, path: str | os.PathLike[str]) -> None:
        if self.event is not None:
            self.ledger.save(path)

    def resume(self, path: str | os.PathLike[str], done: int) -> None:
        """Restore the ledger of a run resumed after ``done`` steps; refuse one recorded with other
        DP parameters. A ledger of this mechanism that holds another step count (a kill between
        the checkpoint's write and the ledger's, or no ledger yet) is rebuilt as ``done`` steps of
        it, and written back: the resumed run replays the steps after the checkpoint exactly, so those
        are the steps released, and an uninterrupted run's ledger is the same."""
        if self.event is None:
            return
        ledger = PrivacyLedger.load(path) if Path(path).is_file() else PrivacyLedger()
        if any(not e.same_mechanism(self.event) for e in ledger.entries):
            raise FedprivError(f"{path}: the privacy ledger was recorded with other DP parameters; use a new run directory")
        if ledger.steps != done:  # written back now: a run resumed at its last step writes no more checkpoints
            ledger = PrivacyLedger([self.event.with_steps(done)] if done else [])
            ledger.save(path)
        self.ledger = ledger
