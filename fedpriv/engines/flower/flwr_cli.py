"""``fedpriv flwr-run``: ``flwr run APP [CONNECTION] --stream`` whose exit code is the run's outcome.

Flower 1.41's and 1.42's ``flwr run --stream`` exits 0 whenever it could submit the run and stream its log
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
exit code 2. The streamed log goes to the terminal without Python tracebacks (a failed
ServerApp's, printed by Flower after fedpriv's one-line error): :class:`RunLog` keeps the whole
stream, tracebacks included, in ``runs/flwr-run-RUN_ID.log`` under the working directory
(``--log-dir``) and names that file where a traceback was left out. It also puts this
environment's ``bin`` on ``PATH`` (``flwr`` starts ``flower-superlink`` by name) and sets ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`` unless
it is set.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TextIO

from fedpriv.engines.flower.deploy import _bin
from fedpriv.errors import FedprivError

STARTED = re.compile(r"Successfully started run (\d+)")
COMPLETED = "finished:completed"


TRACEBACK = "Traceback (most recent call last):"
#: Lines that join two tracebacks of one chained exception.
CHAINED = ("During handling of the above exception, another exception occurred:", "The above exception was the direct cause of the following exception:")


class RunLog:
    """The streamed log of a ``flwr run``: every line to ``runs/flwr-run-RUN_ID.log`` (under
    ``root``), every line but Python tracebacks to ``out``. A traceback runs from its ``Traceback
    (most recent call last):`` line through its indented frames to the exception's line (chained
    ones included); ``out`` gets one line naming the log file in its place. Lines before the run
    id is known are held, then written."""

    def __init__(self, out: TextIO, root: Path):
        self.out, self.root = out, root
        root.mkdir(parents=True, exist_ok=True)  # (a folder that cannot be made: refused before Flower starts)
        self.path: Path | None = None
        self.run_id: int | None = None  # once a line said it
        self._held: list[str] = []
        self._file: TextIO | None = None
        self._state = "text"  # text | frames (inside a traceback) | after (its exception line seen)
        self._hidden = 0
        self.tracebacks = 0

    def start(self, run_id: int | str) -> None:
        """Open ``flwr-run-RUN_ID.log`` and write the lines held so far."""
        if self._file is None:
            self.path = self.root / f"flwr-run-{run_id}.log"
            self._file = open(self.path, "w", encoding="utf-8")
            self._file.writelines(self._held)
            self._held.clear()

    def write(self, line: str) -> None:
        if self._file is not None:
            self._file.write(line)
            self._file.flush()
        else:
            self._held.append(line)
        text = line.rstrip("\n")
        if self._state == "text":
            if text.startswith(TRACEBACK):
                self._state, self._hidden = "frames", 0
        elif self._state == "frames":
            if text and not text[0].isspace():
                self._state = "after"  # the exception's line: the last of the traceback
        elif text.startswith(TRACEBACK):
            self._state = "frames"  # a chained exception's next traceback
        elif text.strip() and text.strip() not in CHAINED:
            self._state = "text"
            self._say_hidden()
        if self._state == "text":
            self.out.write(line)
            self.out.flush()
        else:
            self._hidden += 1

    def _say_hidden(self) -> None:
        self.tracebacks += 1
        where = self.path if self.path is not None else self.root / "flwr-run-RUN_ID.log"
        self.out.write(f"(a Python traceback of {self._hidden} lines, kept in {where})\n")
        self.out.flush()

    def close(self) -> None:
        if self._file is None and (self.tracebacks or self._state != "text"):  # no run id: still keep what was left out
            self.start(time.strftime("unknown-%Y%m%dT%H%M%S"))
        if self._state != "text":
            self._state = "text"
            self._say_hidden()
        if self._file is not None:
            self._file.close()


def relay(lines: Iterable[str], log: RunLog) -> int | None:
    """Each line of ``flwr run``'s output into ``log`` (its file named by the run id once a line
    says it); the run id, or None."""
    run_id = None
    try:
        for line in lines:
            if run_id is None and (m := STARTED.search(line)):
                run_id = log.run_id = int(m.group(1))
                log.start(run_id)
            log.write(line)
    finally:
        log.close()
    return run_id


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


def stop_run(run_id: int, connection: str | None, env: dict[str, str], cwd: str | os.PathLike[str] | None = None, err: TextIO | None = None) -> bool:
    """Ask the SuperLink to stop run ``run_id`` (``flwr stop N [CONNECTION]``); say on ``err``
    (default stderr) whether it did. An interrupted ``fedpriv flwr-run`` calls it: ending ``flwr
    run`` ends only the log stream, not the run. Never raises (it runs while an interrupt unwinds)."""
    err = err or sys.stderr
    argv = [_bin("flwr"), "stop", str(run_id), *([connection] if connection else [])]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=60)
        ok, said = proc.returncode == 0, (proc.stderr.strip() or proc.stdout.strip()).splitlines()
    except (OSError, subprocess.SubprocessError) as e:
        ok, said = False, [str(e)]
    if ok:
        err.write(f"fedpriv: stopped Flower run {run_id} on the SuperLink\n")
    else:
        why = said[-1] if said else "no reason given"
        err.write(f"fedpriv: could not stop Flower run {run_id} on the SuperLink ({why}); it may still be running: `flwr stop {run_id}{' ' + connection if connection else ''}`\n")
    err.flush()
    return ok


def flwr_run(
    app: str = ".",
    connection: str | None = None,
    run_config: Sequence[str] = (),
    federation_config: Sequence[str] = (),
    federation: str | None = None,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    out: TextIO | None = None,
    log_dir: str | os.PathLike[str] = "runs",
) -> int:
    """``flwr run APP [CONNECTION] --stream ...`` (stdout passed through to ``out`` without
    tracebacks, all of it kept in ``LOG_DIR/flwr-run-RUN_ID.log``, LOG_DIR relative to ``cwd``;
    stderr inherited); the run's id once it completed. Raises :class:`FedprivError` when ``flwr run``
    fails, or when the run ended other than ``finished:completed`` (naming the status and
    Flower's details, which hold the ServerApp's error)."""
    out = out or sys.stdout
    env = flwr_env(env)
    log = RunLog(out, Path(cwd or ".") / log_dir)
    with subprocess.Popen(flwr_run_argv(app, connection, run_config, federation_config, federation), stdout=subprocess.PIPE, text=True, errors="replace", env=env, cwd=cwd) as proc:
        assert proc.stdout is not None
        try:
            run_id = relay(proc.stdout, log)
        except BaseException:  # interrupted (a SIGTERM reaches only this process): `flwr run` stops too,
            proc.terminate()  # and so does the run it started, which the SuperLink would go on with
            if log.run_id is not None:
                stop_run(log.run_id, connection, env, cwd)
            raise
    if proc.returncode != 0:
        raise FedprivError(f"`flwr run` exited with code {proc.returncode} (its message is above)")
    if run_id is None:
        raise FedprivError("`flwr run` did not say which run it started (no 'Successfully started run N' line)")
    status, details = run_status(run_id, connection, env, cwd)
    if status != COMPLETED:
        why = details.replace("\r", " ").replace("\n", " ").strip()
        kept = f"; the whole log, Flower's traceback included: {log.path}" if log.tracebacks else ""
        raise FedprivError(f"Flower run {run_id} ended {status or 'without a status'}" + (f": {why}" if why else "") + f" (the log above has the details{kept}; `flwr list --run-id {run_id}`)")
    return run_id
