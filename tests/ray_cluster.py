"""One local Ray cluster for a test module's in-process Flower simulations.

A Flower simulation (``flwr.simulation.run_simulation``, the Flower engine of ``train_run``) starts
a local Ray instance when none is reachable and stops it when it ends: about 10 s of a 2-core
machine each time (measured here: 9.3 s to start, 1.4 s to stop). With ``RAY_ADDRESS`` set,
Flower's ``ray.init`` connects to a running cluster instead (0.1 s) and its ``ray.shutdown`` only
disconnects; the simulation's actors belong to its job and end with it. Everything else is the
same: the same apps, an actor pool sized from the node's CPUs (the head has this machine's CPUs,
as a local instance has), workers started with this process's environment (JAX's 8 host devices
and compilation cache). Tests that run the CLI in a subprocess do not use it (their kill takes the
simulation's own Ray processes with it); nor do the ``flwr run`` tests, whose SuperLink-started
simulations were slower on it (116 s -> 143 s for tests/engines/test_flwr_run.py here).

tests/conftest.py registers the fixtures below. The head gets free ports and a temp dir
of its own (two xdist workers, or other users of the machine, may run a cluster at the same time);
on exit its processes, found by that temp dir and its address, and their children are killed
by pid, pass or fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from fedpriv.engines.flower.deploy import free_port

PORTS = ("port", "ray-client-server-port", "dashboard-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
         "runtime-env-agent-port", "metrics-export-port", "node-manager-port", "object-manager-port")


def _cluster_processes(temp: str, port: int) -> list[psutil.Process]:
    """The cluster's processes: those naming its temp dir or its address, and their descendants."""
    roots = []
    for p in psutil.process_iter(["cmdline"]):
        args = p.info["cmdline"] or ()
        if any(temp in a or (a.startswith("--address=") and a.endswith(f":{port}")) for a in args):
            roots.append(p)
    found = {p.pid: p for p in roots}
    for p in roots:
        try:
            found.update({c.pid: c for c in p.children(recursive=True)})
        except psutil.Error:
            pass
    return list(found.values())


@contextmanager
def ray_cluster() -> Iterator[str]:
    """A Ray head on this machine (yields its address); stopped on exit."""
    temp = tempfile.mkdtemp(prefix="fpray", dir="/tmp")  # short: Ray's socket paths are length-limited
    ports: dict[str, int] = {}
    while len(set(ports.values())) < len(PORTS):
        ports = {name: free_port() for name in PORTS}
    cmd = [str(Path(sys.executable).with_name("ray")), "start", "--head", f"--temp-dir={temp}", "--include-dashboard=false", "--disable-usage-stats",
           *(f"--{name}={port}" for name, port in ports.items())]
    try:
        started = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
        assert started.returncode == 0, started.stdout + started.stderr
        yield f"127.0.0.1:{ports['port']}"
    finally:
        deadline = time.monotonic() + 30
        while (procs := _cluster_processes(temp, ports["port"])) and time.monotonic() < deadline:
            for p in procs:  # a test cluster: nothing to save, so SIGKILL (as `ray stop --force`), by pid
                try:
                    p.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(procs, timeout=5)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def shared_ray() -> Iterator[str]:
    """This module's Ray cluster (its address)."""
    with ray_cluster() as address:
        yield address


@pytest.fixture
def flower_on_shared_ray(shared_ray: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """This test's in-process Flower simulations run on the module's Ray cluster."""
    monkeypatch.setenv("RAY_ADDRESS", shared_ray)
    return shared_ray
