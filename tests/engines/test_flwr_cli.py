"""``fedpriv flwr-run`` against a stand-in ``flwr``: the exit code follows the run's status.

(tests/engines/test_flwr_run.py runs the real ``flwr run`` on a run that loses every SuperNode.)
"""

import json
import stat
import sys
from pathlib import Path

import pytest

import fedpriv.engines.flower.flwr_cli as flwr_cli
from fedpriv.cli import main
from fedpriv.errors import FedprivError

FAKE = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["FAKE_FLWR_CALLS"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1] == "run":
    if os.environ.get("FAKE_RUN_RC", "0") != "0":
        print("Error: SuperLink unavailable", file=sys.stderr)
        sys.exit(int(os.environ["FAKE_RUN_RC"]))
    if os.environ.get("FAKE_NO_ID") != "1":
        print("Successfully started run 4242")
    print("INFO : round 1/2 ...")
    sys.exit(0)
if sys.argv[1] == "list":
    if os.environ.get("FAKE_LS") == "garbage":
        print("not json")
        sys.exit(1)
    status = os.environ.get("FAKE_STATUS", "finished:completed")
    print(json.dumps({{"success": True, "runs": [{{"run-id": "4242", "status": status, "status-details": os.environ.get("FAKE_DETAILS", "")}}]}}))
"""


@pytest.fixture
def fake_flwr(tmp_path, monkeypatch):
    script = tmp_path / "flwr"
    script.write_text(FAKE)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setattr(flwr_cli, "_bin", lambda name: str(script))
    monkeypatch.setenv("FAKE_FLWR_CALLS", str(calls))

    def read_calls() -> list[list[str]]:
        return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []

    return read_calls


def test_a_completed_run_exits_0_and_passes_the_options_through(fake_flwr, capsys):
    assert main(["flwr-run", ".", "my-link", "-c", "config='x.toml'", "--run-config", "stop-after=1", "--federation-config", "num-supernodes=3"]) == 0
    captured = capsys.readouterr()
    assert "Successfully started run 4242" in captured.out and "round 1/2" in captured.out
    assert captured.err == ""
    assert fake_flwr() == [
        ["run", ".", "my-link", "--stream", "--run-config", "config='x.toml'", "--run-config", "stop-after=1", "--federation-config", "num-supernodes=3"],
        ["list", "my-link", "--run-id", "4242", "--format", "json"],
    ]


@pytest.mark.parametrize("status", ["finished:failed", "finished:stopped", "running"])
def test_a_run_not_completed_exits_2_with_one_line(fake_flwr, capsys, monkeypatch, status):
    monkeypatch.setenv("FAKE_STATUS", status)
    monkeypatch.setenv("FAKE_DETAILS", "Simulation failed with exception: round 2: every one of the 6 client updates failed\n(x)")
    assert main(["flwr-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"fedpriv: error: Flower run 4242 ended {status}: Simulation failed with exception: round 2: every one"), err
    assert fake_flwr()[0] == ["run", ".", "--stream"]


def test_flwr_run_failing_itself_or_saying_no_run_id_or_an_unreadable_status_is_an_error(fake_flwr, monkeypatch):
    monkeypatch.setenv("FAKE_RUN_RC", "1")
    with pytest.raises(FedprivError, match=r"`flwr run` exited with code 1"):
        flwr_cli.flwr_run()
    monkeypatch.setenv("FAKE_RUN_RC", "0")
    monkeypatch.setenv("FAKE_NO_ID", "1")
    with pytest.raises(FedprivError, match="did not say which run it started"):
        flwr_cli.flwr_run()
    monkeypatch.setenv("FAKE_NO_ID", "0")
    monkeypatch.setenv("FAKE_LS", "garbage")
    with pytest.raises(FedprivError, match=r"could not read the status of Flower run 4242 .*not json"):
        flwr_cli.flwr_run()


def test_the_environment_finds_flower_superlink_and_installs_nothing():
    env = flwr_cli.flwr_env({"PATH": "/usr/bin"})
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    assert env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"
    assert flwr_cli.flwr_env({"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "0"})["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "0"
