"""The Flower strategy's round lines never print a Poisson-sampled DP cohort's realized size (the
amplification assumes only the noised sum is released; docs/privacy.md "Logged statistics")."""

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


def lost_round_message(prepared, private_stats: bool = False, **federated) -> str:
    """The error of a round whose 14 client updates all failed, with ``federated`` keys changed."""
    raw = prepared.config.model_dump(mode="json")
    raw["federated"].update(federated)
    raw["training"]["log_private_stats"] = private_stats
    setup = FederatedSetup(dataclasses.replace(prepared, config=ExperimentConfig.model_validate(raw)))
    strategy = FedprivStrategy(setup)
    strategy.bind(setup.core.init_state(setup.initial_params()))
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
