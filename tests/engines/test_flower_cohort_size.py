"""The Flower strategy never writes a Poisson-sampled DP cohort's realized size, in its round lines
or in the train row's ``failed`` count (the amplification assumes only the noised sum is released;
docs/privacy.md "Logged statistics")."""

import dataclasses

import pytest
from federated_helpers import DP, write_config

from fedpriv.config import ExperimentConfig, load_config
from fedpriv.engines.flower.strategy import FedprivStrategy
from fedpriv.engines.setup import FederatedSetup
from fedpriv.errors import FedprivError
from fedpriv.runner.prepare import prepare


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepare(load_config(write_config(tmp_path_factory.mktemp("fed"), extra=DP)))


def strategy_for(prepared, private_stats: bool = False, log=None, **federated) -> FedprivStrategy:
    """The Flower strategy of the tiny experiment with ``federated`` keys changed, bound to its initial state."""
    raw = prepared.config.model_dump(mode="json")
    raw["federated"].update(federated)
    raw["training"]["log_private_stats"] = private_stats
    setup = FederatedSetup(dataclasses.replace(prepared, config=ExperimentConfig.model_validate(raw)))
    strategy = FedprivStrategy(setup, log)
    strategy.bind(setup.core.init_state(setup.initial_params()))
    return strategy


def lost_round_message(prepared, private_stats: bool = False, **federated) -> str:
    """The error of a round whose 14 client updates all failed, with ``federated`` keys changed."""
    strategy = strategy_for(prepared, private_stats, **federated)
    strategy._sent = 14  # what configure_train sent: a Poisson cohort's realized size
    with pytest.raises(FedprivError) as e:
        strategy.aggregate_train(1, [])
    return str(e.value)


def test_a_lost_poisson_dp_round_does_not_say_how_many_users_it_sampled(prepared):
    hidden = lost_round_message(prepared, sampling="poisson")
    assert hidden.startswith("round 1: every client update failed (") and "14" not in hidden, hidden
    assert lost_round_message(prepared, sampling="fixed").startswith("round 1: every one of the 14 client updates failed (")  # m: public


def test_the_size_is_printed_when_private_stats_are_asked_for_or_the_run_adds_no_noise(prepared):
    assert lost_round_message(prepared, private_stats=True, sampling="poisson").startswith("round 1: every one of the 14 client updates failed (")
    no_dp = lost_round_message(prepared, sampling="poisson", strategy="fedavg", dp=None, clip_norm=None)
    assert no_dp.startswith("round 1: every one of the 14 client updates failed ("), no_dp


@pytest.mark.parametrize("sampling, private_stats, shown", [("poisson", False, False), ("fixed", False, True), ("poisson", True, True)])
def test_a_round_that_lost_some_updates_says_how_many_only_where_the_cohort_size_is_public(prepared, monkeypatch, sampling, private_stats, shown):
    """One message of the round's answers (a real ClientApp reply), the others are lost: the round
    line and the train row's ``failed`` count the lost updates only where the cohort's size is public."""
    from flwr.app import ConfigRecord
    from flwr.supercore.task_identity import TaskIdentity

    from fedpriv.engines.flower.apps import ClientRuntime
    from fedpriv.engines.flower.strategy import params_to_record

    class Grid:
        def get_node_ids(self):
            return [1, 2]

    for k in ("_run_id", "_node_id", "_task_id"):  # the identity a Flower process has (messages need it), as in a ClientApp
        monkeypatch.setattr(TaskIdentity, k, 1)
    said: list[str] = []
    strategy = strategy_for(prepared, private_stats, said.append, sampling=sampling)
    messages = list(strategy.configure_train(1, params_to_record(strategy.state["params"]), ConfigRecord(), Grid()))
    assert len(messages) >= 2
    runtime = ClientRuntime(strategy.setup.config, lambda _cfg, _log: strategy.setup.prepared)
    _, metrics = strategy.aggregate_train(1, [runtime.train(messages[0])])
    lost = strategy._sent - 1
    if shown:
        assert said == [f"round 1: {lost} of {strategy._sent} client updates failed or timed out and are left out"]
        assert strategy.last_info["failed"] == lost and dict(metrics)["failed"] == lost
    else:
        assert said == ["round 1: some client updates (how many is not printed: under Poisson sampling the cohort's size is private) failed or timed out and are left out"]
        assert "failed" not in strategy.last_info and "failed" not in dict(metrics)
