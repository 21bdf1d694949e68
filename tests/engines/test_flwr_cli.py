"""``fedpriv flwr-run`` against a stand-in ``flwr``: the exit code follows the run's status; the
terminal gets the stream without Python tracebacks, the run log ``runs/flwr-run-RUN_ID.log`` all
of it (issue 31).

(tests/engines/test_flwr_run.py runs the real ``flwr run`` on a run that loses every SuperNode.)
"""

import io
import json
import stat
import sys
from pathlib import Path

import pytest

import fedpriv.engines.flower.flwr_cli as flwr_cli
from fedpriv.engines.flower.flwr_cli import RunLog, relay
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
    if os.environ.get("FAKE_STREAM"):
        print(open(os.environ["FAKE_STREAM"]).read(), end="")
    if os.environ.get("FAKE_SLEEP"):
        import time
        time.sleep(float(os.environ["FAKE_SLEEP"]))
    sys.exit(0)
if sys.argv[1] == "stop" and os.environ.get("FAKE_STOP_RC", "0") != "0":
    print("Run ID 4242 not found", file=sys.stderr)
    sys.exit(int(os.environ["FAKE_STOP_RC"]))
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
    monkeypatch.chdir(tmp_path)  # the run log goes to runs/ under the working directory
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


@pytest.mark.parametrize("stop_rc", [0, 1])
def test_an_interrupted_flwr_run_stops_the_flwr_process_and_the_run_it_started(fake_flwr, capsys, monkeypatch, stop_rc):
    """A SIGTERM reaches only fedpriv (not its process group, as Ctrl-C does): the `flwr run` it
    started used to keep streaming after fedpriv said it was interrupted; and ending `flwr run`
    ends only the stream, so the SuperLink went on with the run: fedpriv asks it to stop the run
    (`flwr stop`) and says whether it did. (tests/engines/test_flwr_run.py: the real SuperLink.)"""
    import signal
    import subprocess

    started: list[subprocess.Popen] = []
    real_popen, real_relay = subprocess.Popen, flwr_cli.relay

    def popen(*a, **k):
        started.append(real_popen(*a, **k))
        return started[-1]

    def interrupted(stream, log):
        def lines():
            yield stream.readline()  # "Successfully started run 4242": `flwr run` is running
            raise KeyboardInterrupt

        return real_relay(lines(), log)

    monkeypatch.setenv("FAKE_SLEEP", "60")
    monkeypatch.setenv("FAKE_STOP_RC", str(stop_rc))
    monkeypatch.setattr(flwr_cli.subprocess, "Popen", popen)
    monkeypatch.setattr(flwr_cli, "relay", interrupted)
    assert main(["flwr-run", ".", "my-link"]) == 130
    assert started[0].wait(timeout=10) == -signal.SIGTERM
    assert fake_flwr()[-1] == ["stop", "4242", "my-link"]
    err = capsys.readouterr().err
    if stop_rc == 0:
        assert "fedpriv: stopped Flower run 4242 on the SuperLink" in err
    else:
        assert "could not stop Flower run 4242 on the SuperLink (Run ID 4242 not found); it may still be running: `flwr stop 4242 my-link`" in err


def test_a_run_interrupted_before_flower_named_it_stops_nothing_on_the_superlink(fake_flwr, monkeypatch):
    def interrupted(stream, log):
        raise KeyboardInterrupt

    monkeypatch.setattr(flwr_cli, "relay", interrupted)
    assert main(["flwr-run", ".", "my-link"]) == 130
    assert not any(call[0] == "stop" for call in fake_flwr())


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


# ---- issue 31: Flower's traceback in the run log, not on the terminal ----------------------------
# What `fedpriv flwr-run . --run-config "config='nosuch.toml'"` streamed from Flower 1.41 (a local
# simulation; paths shortened): the ServerApp's one line, then Flower's traceback.
STREAM = """\
Starting local SuperLink on 127.0.0.1:43811...
Using SuperLink: local (127.0.0.1:43811)
Successfully started run 14299986606999702064
\x1b[92mINFO \x1b[0m:      Starting Flower Simulation
\x1b[92mINFO \x1b[0m:      Federation `@none/default` (2 simulated SuperNodes)
fedpriv: error: experiment config 'nosuch.toml' (run config key 'config') not found; tried /home/u/.flwr/apps/fedpriv/nosuch.toml, /home/u/fedpriv/nosuch.toml
ERROR :     Simulation raised an exception
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/flwr/simulation/app.py", line 337, in run_simulation_process
    simulation_result = _run_simulation(
                        ^^^^^^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/flwr/serverapp/server_app.py", line 176, in __call__
    self._main(grid, context)
  File "/home/u/fedpriv/fedpriv/engines/flower/apps.py", line 94, in resolve_config_path
    raise ConfigError(f"experiment config {path!r} (run config key 'config') not found; tried " + ", ".join(str(t) for t in tried))
fedpriv.errors.ConfigError: experiment config 'nosuch.toml' (run config key 'config') not found; tried /home/u/.flwr/apps/fedpriv/nosuch.toml, /home/u/fedpriv/nosuch.toml
ERROR :     Exit Code: 700

An unhandled exception occurred when running the simulation.
"""


def test_a_failed_serverapps_traceback_goes_to_the_run_log_not_the_terminal(tmp_path):
    out = io.StringIO()
    log = RunLog(out, tmp_path / "runs")
    assert relay(io.StringIO(STREAM), log) == 14299986606999702064
    kept = tmp_path / "runs" / "flwr-run-14299986606999702064.log"
    assert log.path == kept and kept.read_text() == STREAM and log.tracebacks == 1
    shown = out.getvalue()
    assert "Traceback" not in shown and "  File " not in shown and "fedpriv.errors.ConfigError" not in shown
    lines = STREAM.splitlines(keepends=True)
    start, end = lines.index("Traceback (most recent call last):\n"), lines.index("ERROR :     Exit Code: 700\n")
    assert shown == "".join(lines[:start]) + f"(a Python traceback of {end - start} lines, kept in {kept})\n" + "".join(lines[end:])
    assert shown.count("fedpriv: error: ") == 1  # the ServerApp's own line stays


def test_chained_tracebacks_are_one_block_and_a_stream_without_a_run_id_is_still_kept(tmp_path):
    chained = ("Traceback (most recent call last):\n  File \"a.py\", line 1, in f\nKeyError: 'x'\n\n"
               "During handling of the above exception, another exception occurred:\n\n"
               "Traceback (most recent call last):\n  File \"b.py\", line 2, in g\nValueError: y\n")
    out = io.StringIO()
    log = RunLog(out, tmp_path)
    assert relay(io.StringIO("before\n" + chained), log) is None  # the stream ends inside the block
    assert out.getvalue() == f"before\n(a Python traceback of 9 lines, kept in {log.path})\n"
    assert log.path.parent == tmp_path and log.path.name.startswith("flwr-run-unknown-") and log.path.read_text() == "before\n" + chained
    plain = io.StringIO()
    relay(io.StringIO("Successfully started run 7\nall fine\n"), RunLog(plain, tmp_path))
    assert plain.getvalue() == "Successfully started run 7\nall fine\n" and (tmp_path / "flwr-run-7.log").read_text() == plain.getvalue()


def test_fedpriv_flwr_run_shows_no_traceback_and_names_the_log_that_keeps_it(fake_flwr, capsys, monkeypatch, tmp_path):
    (tmp_path / "stream.txt").write_text(STREAM.split("Successfully started run 14299986606999702064\n")[1])
    monkeypatch.setenv("FAKE_STREAM", str(tmp_path / "stream.txt"))
    monkeypatch.setenv("FAKE_STATUS", "finished:failed")
    monkeypatch.setenv("FAKE_DETAILS", "Simulation failed with exception: experiment config 'nosuch.toml' (run config key 'config') not found")
    assert main(["flwr-run"]) == 2
    captured = capsys.readouterr()
    kept = Path("runs") / "flwr-run-4242.log"
    assert "Traceback" not in captured.out + captured.err and f"(a Python traceback of 9 lines, kept in {kept})\n" in captured.out
    assert captured.err.count("\n") == 1 and f"the whole log, Flower's traceback included: {kept};" in captured.err, captured.err
    assert "Traceback (most recent call last):" in kept.read_text() and kept.read_text().startswith("Successfully started run 4242\n")
