"""The ServerApp's wait for SuperNodes (``wait_for_nodes``): it returns as soon as the configured
number is connected; a federation with fewer nodes goes on with them after the wait, having said
once what it waits for; none at all is an error. The grid is a stand-in that answers
``get_node_ids`` (the only call the wait makes) from a schedule of node counts; the real Flower
grid is exercised by tests/engines/test_flwr_run.py and test_flower_deployment.py."""

import pytest

import fedpriv.engines.flower.apps as apps
from fedpriv.errors import ConfigError


class Nodes:
    """``get_node_ids`` answers ``counts[i]`` node ids on its i-th call (the last count after)."""

    def __init__(self, *counts: int):
        self.counts, self.calls = counts, 0

    def get_node_ids(self):
        n = self.counts[min(self.calls, len(self.counts) - 1)]
        self.calls += 1
        return list(range(1, n + 1))


def test_returns_as_soon_as_the_configured_nodes_are_connected():
    said, nodes = [], Nodes(1, 2, 3)
    assert apps.wait_for_nodes(nodes, 3, timeout_s=30.0, log=said.append) == 3
    assert nodes.calls == 3 and said == []  # returned at the third poll, not at the timeout


def test_fewer_nodes_than_configured_run_after_the_wait_and_the_wait_is_said_once(monkeypatch):
    monkeypatch.setattr(apps, "NODE_WAIT_NOTE_S", 0.0)  # the note at the first poll, the return after 2 s
    said, nodes = [], Nodes(2)
    assert apps.wait_for_nodes(nodes, 3, timeout_s=2.0, log=said.append) == 2
    assert nodes.calls > 1  # polled until the timeout
    assert said == ["waiting up to 2 s for 3 SuperNodes (federated.flower.num_supernodes), 2 connected so far; a federation with fewer nodes "
                    "runs with those it has once the wait ends (set num_supernodes to its size to skip the wait)"]


def test_no_node_at_all_is_an_error():
    with pytest.raises(ConfigError, match="no SuperNode connected within 4 s"):
        apps.wait_for_nodes(Nodes(0), 2, timeout_s=0.25, log=lambda _: None)
