"""The one DP budget of a run (DP-SGD, DP-FedAvg, client-side DP-SGD): noise from a target, one
ledger event per step, the budget stop, the guarantee, and the resume check. Cross-checked
against dp_accounting directly."""

from __future__ import annotations

import json

import dp_accounting
import pytest

from fedpriv.errors import FedprivError, PrivacyParameterError
from fedpriv.privacy.accounting import RDP_ORDERS, GaussianSteps, epsilon_for
from fedpriv.privacy.budget import DPBudget

N, B, STEPS, DELTA = 10_000, 100, 50, 1e-5


def template(sampling="poisson", unit="example"):
    return GaussianSteps(sampling, 1.0, N, B, STEPS, unit)


def test_each_step_records_one_event_and_epsilon_is_dp_accountings():
    b = DPBudget(template("fixed", "user"), 1.3, None, DELTA, key="federated.dp", step_word="round")
    for _ in range(7):
        b.record()
    acc = dp_accounting.rdp.RdpAccountant(list(RDP_ORDERS), dp_accounting.NeighboringRelation.REPLACE_ONE)
    # replace-one: the clipped sum moves by up to 2C, so the Gaussian is z/2 relative to it
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(N, B, dp_accounting.GaussianDpEvent(1.3 / 2)), 7))
    r = b.report()
    assert r["epsilon"] == pytest.approx(acc.get_epsilon(DELTA), rel=1e-12)
    assert r["delta"] == DELTA and r["basis"] == f"user-level, replace-one, {B} of {N} without replacement"
    assert "7 steps" in r["guarantee"] and "user-level" in r["guarantee"]
    assert b.epsilon_after(7).epsilon == r["epsilon"]


def test_a_target_epsilon_is_met_after_the_planned_steps():
    b = DPBudget(template(), None, 2.0, DELTA)
    assert b.epsilon_after(STEPS).epsilon == pytest.approx(2.0, rel=2e-3)
    assert b.epsilon_after(STEPS).epsilon <= 2.0
    assert b.noise_multiplier == b.event.noise_multiplier and b.event.steps == 1


def test_the_budget_stops_before_the_step_that_would_exceed_it():
    ev = GaussianSteps("poisson", 1.0, N, B, 1)
    budget = epsilon_for(ev.with_steps(20), DELTA).epsilon * 1.0001
    b = DPBudget(template(), 1.0, None, DELTA, epsilon_budget=budget)
    assert b.max_steps == 20
    assert b.stop_reason(19) is None and "budget" in b.stop_reason(20)
    loose = DPBudget(template(), 1.0, None, DELTA, epsilon_budget=1e6)
    assert loose.max_steps == STEPS and loose.stop_reason(STEPS) is None  # a budget that binds nothing stops nothing
    with pytest.raises(PrivacyParameterError, match="even one step"):
        DPBudget(template(), 0.3, None, DELTA, epsilon_budget=1e-3)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(noise_multiplier=1.0, target_epsilon=1.0), "exactly one"),
        (dict(noise_multiplier=None, target_epsilon=None), "exactly one"),
        (dict(noise_multiplier=1.0, target_epsilon=None, delta=1.0), "delta must be in"),
        (dict(noise_multiplier=0.0, target_epsilon=None, epsilon_budget=1.0), "needs a noise multiplier"),
    ],
)
def test_impossible_parameters_are_refused(kw, match):
    kw = {"delta": DELTA, **kw}
    with pytest.raises(PrivacyParameterError, match=match):
        DPBudget(template(), kw.pop("noise_multiplier"), kw.pop("target_epsilon"), **kw)


def test_no_noise_records_nothing_and_says_so():
    b = DPBudget(template(), 0.0, None, DELTA)
    b.record()
    assert b.event is None and not b.ledger.entries
    assert b.report()["epsilon"] is None and "none" in b.report()["guarantee"]


def uninterrupted(steps: int) -> DPBudget:
    b = DPBudget(template(), 1.1, None, DELTA)
    for _ in range(steps):
        b.record()
    return b


def test_resume_restores_the_ledger_and_refuses_one_of_other_parameters(tmp_path):
    path = tmp_path / "ledger.json"
    b = uninterrupted(4)
    b.save(path)
    again = DPBudget(template(), 1.1, None, DELTA)
    again.resume(path, 4)
    assert again.report() == b.report() and again.ledger.to_json() == b.ledger.to_json()
    with pytest.raises(FedprivError, match="other DP parameters"):
        DPBudget(template(), 1.2, None, DELTA).resume(path, 4)


@pytest.mark.parametrize("done", [0, 3, 5])
def test_a_ledger_one_write_off_its_checkpoint_is_the_checkpoints_steps(tmp_path, done):
    """A kill between the checkpoint's write and the ledger's leaves the ledger behind (or, had the
    order been the other, ahead); the resumed run's ledger is an uninterrupted run's at that step."""
    path = tmp_path / "ledger.json"
    uninterrupted(4).save(path)
    resumed = DPBudget(template(), 1.1, None, DELTA)
    resumed.resume(path, done)
    assert resumed.ledger.to_json() == uninterrupted(done).ledger.to_json()
    assert resumed.report() == uninterrupted(done).report()
    assert json.loads(path.read_text()) == uninterrupted(done).ledger.to_json()  # written back (a run resumed at its end saves no more)
    missing = DPBudget(template(), 1.1, None, DELTA)
    missing.resume(tmp_path / "none.json", done)  # killed before the first ledger write
    assert missing.ledger.to_json() == uninterrupted(done).ledger.to_json()


def test_a_stop_on_the_data_promises_every_planned_step_and_reports_the_steps_taken():
    """A run that stops at a utility target stops when the data says: its guarantee is that of all
    the steps it may take (here 50), computed with dp_accounting; the 7 taken are ex-post only."""
    b = DPBudget(template(), 1.0, None, DELTA)
    b.stops_on_data("its utility target")
    for _ in range(7):
        b.record()
    r = b.report()
    acc = dp_accounting.rdp.RdpAccountant(list(RDP_ORDERS))
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(B / N, dp_accounting.GaussianDpEvent(1.0)), STEPS))
    assert r["epsilon"] == pytest.approx(acc.get_epsilon(DELTA), rel=1e-12)
    assert r["epsilon_spent"] == pytest.approx(epsilon_for(GaussianSteps("poisson", 1.0, N, B, 7), DELTA).epsilon, rel=1e-12)
    assert r["epsilon_spent"] < 0.95 * r["epsilon"]  # the two differ by more than rounding
    assert f"{STEPS} steps" in r["guarantee"] and "depends on the data" in r["guarantee"] and "ex-post" in r["guarantee"]


def test_a_stop_on_the_data_within_an_epsilon_budget_promises_the_budgets_steps():
    ev = GaussianSteps("poisson", 1.0, N, B, 1)
    budget = epsilon_for(ev.with_steps(20), DELTA).epsilon * 1.0001
    b = DPBudget(template(), 1.0, None, DELTA, epsilon_budget=budget)
    b.stops_on_data("its utility target")
    b.record()
    promised = b.report()["epsilon"]
    assert promised == pytest.approx(epsilon_for(ev.with_steps(20), DELTA).epsilon, rel=1e-12) and promised <= budget
