"""``fedpriv flwr-run``: ``flwr run APP [CONNECTION] --stream`` whose exit code is the run's outcome.

Flower 1.41's ``flwr run --stream`` exits 0 whenever it could submit the run and stream its log
to the end, whatever the run ended with: ``_run_with_control_api`` (``flwr/cli/run/run.py``)
returns after ``start_stream``, which treats the end of the stream as success
(``flwr/cli/log.py``: ``AllLogsRetrieved`` is swallowed), and the SuperLink ends the stream as
soon as the run's status is ``finished``, ``finished:completed`` and ``finished:failed`` alike
(``flwr/superlink/servicer/control/control_handlers.py``, ``_stream_logs``). A ServerApp that
raises (here: every reply of a round lost, a config that cannot be found) leaves the run
``finished:failed`` with the exception in its status details (``flwr/simulation/app.py`` for the
local simulation, ``flwr/superlink/runtime/run_serverapp.py`` in a deployment), but ``flwr run``
still exits 0.

:func:`flwr_run` runs the same ``flwr run`` (its output passed through), then asks the SuperLink
for the run's status (``flwr list CONNECTION --run-id N --format json``) and raises
:class:`~fedpriv.errors.FedprivError` unless it is ``finished:completed``, so that ``fedpriv
flwr-run`` ends with one line ``fedpriv: error: Flower run N ended finished:failed: ...`` and
exit code 2. It also puts this environment's ``bin`` on ``PATH`` (``flwr`` starts
``flower-superlink`` by name) and sets ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`` unless
it is set.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from fedpriv.engines.flower.deploy import _bin
from fedpriv.errors import FedprivError

STARTED = re.compile(r"Successfully started run (\d+)")
COMPLETED = "finished:completed"


def flwr_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with this environment's ``bin`` first on ``PATH`` and
    runtime dependency installation off unless the caller set it."""
    out = dict(os.environ if env is None else env)
    out["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{out.get('PATH', '')}"
    out.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    return out


def flwr_run_argv(app: str, connection: str | None, run_config: Sequence[str], federation_config: Sequence[str], federation: str | None) -> list[str]:
    argv = [_bin("flwr"), "run", app, *([connection] if connection else []), "--stream"]
    for c in run_config:
        argv += ["--run-config", c]
    for c in federation_config:
        argv += ["--federation-config", c]
    if federation:
        argv += ["--federation", federation]
    return argv


def run_status(run_id: int, connection: str | None, env: dict[str, str], cwd: str | os.PathLike[str] | None = None) -> tuple[str, str]:
    """(status, status details) of run ``run_id`` as the SuperLink of ``connection`` reports it
    (``flwr list --run-id N --format json``), e.g. ``("finished:failed", "Simulation failed with
    exception: ...")``."""
    argv = [_bin("flwr"), "list", *([connection] if connection else []), "--run-id", str(run_id), "--format", "json"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=120)
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict) or not doc.get("success") or not doc.get("runs"):
        said = doc.get("error-message") if isinstance(doc, dict) else None
        if not said:
            lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
            said = lines[-1] if lines else f"exit code {proc.returncode}"
        raise FedprivError(f"could not read the status of Flower run {run_id} (`flwr list --run-id {run_id}`): {said}")
    run = doc["runs"][0]
    return str(run.get("status", "")), str(run.get("status-details", ""))


def flwr_run(
    app: str = ".",
    connection: str | None = None,
    run_config: Sequence[str] = (),
    federation_config: Sequence[str] = (),
    federation: str | None = None,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    out: TextIO | None = None,
) -> int:
    """``flwr run APP [CONNECTION] --stream ...`` (stdout passed through to ``out``, stderr
    inherited); the run's id once it completed. Raises :class:`FedprivError` when ``flwr run``
    fails, or when the run ended other than ``finished:completed`` (naming the status and
    Flower's details, which hold the ServerApp's error)."""
    out = out or sys.stdout
    env = flwr_env(env)
    run_id = None
    with subprocess.Popen(flwr_run_argv(app, connection, run_config, federation_config, federation), stdout=subprocess.PIPE, text=True, errors="replace", env=env, cwd=cwd) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            out.flush()
            if run_id is None and (m := STARTED.search(line)):
                run_id = int(m.group(1))
    if proc.returncode != 0:
        raise FedprivError(f"`flwr run` exited with code {proc.returncode} (its message is above)")
    if run_id is None:
        raise FedprivError("`flwr run` did not say which run it started (no 'Successfully started run N' line)")
    status, details = run_status(run_id, connection, env, cwd)
    if status != COMPLETED:
        why = details.replace("\r", " ").replace("\n", " ").strip()
        raise FedprivError(f"Flower run {run_id} ended {status or 'without a status'}" + (f": {why}" if why else "") + f" (the log above has the details; `flwr list --run-id {run_id}`)")
    return run_id
