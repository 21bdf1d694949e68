"""``fedpriv flwr-run``'s relay of ``flwr run --stream``: the terminal gets the stream without
Python tracebacks, the run log ``flwr-run-RUN_ID.log`` gets all of it (issue 31: a missing
config printed Flower's full traceback before fedpriv's one-line error).

STREAM is what ``fedpriv flwr-run . --run-config "config='nosuch.toml'"`` streamed from Flower
1.41 (a local simulation; paths shortened). The end-to-end run is in test_flwr_run.py (slow).
"""

import io

from fedpriv.engines.flower.flwr_cli import RunLog, relay

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
