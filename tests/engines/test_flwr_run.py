"""``flwr run .`` from the repository root: a local simulation of the quick Shakespeare config.

Runs the real CLI as a subprocess, offline (FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1),
with a private FLWR_HOME and free ports for the local SuperLink that ``flwr run`` starts in the
background, and kills that SuperLink (by its pid) afterwards. About 2 minutes on 2 cores.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from fedpriv.engines.flower.deploy import free_port, read_metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FLWR = Path(sys.executable).with_name("flwr")


def _local_superlinks(flwr_home: Path) -> list[psutil.Process]:
    """The SuperLink(s) `flwr run` started for this FLWR_HOME (it logs under FLWR_HOME)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "flower-superlink" in cmd and str(flwr_home) in cmd:
            found.append(p)
    return found


@pytest.mark.skipif(not FLWR.exists(), reason="flwr CLI not installed next to this python")
def test_flwr_run_quick_config(tmp_path):
    home = tmp_path / "flwr-home"
    run_dir = tmp_path / "run"
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
        "PATH": f"{FLWR.parent}{os.pathsep}{os.environ.get('PATH', '')}",  # flwr starts `flower-superlink` by name
    }
    overrides = f"config='experiments/fedavg-shakespeare-quick.toml' run-dir={json.dumps(str(run_dir))}"
    cmd = [str(FLWR), "run", ".", "--stream", "--run-config", overrides, "--federation-config", "num-supernodes=2 client-resources-num-cpus=1"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=480)
    finally:
        for p in _local_superlinks(home):
            try:
                os.killpg(p.pid, signal.SIGTERM)  # flwr starts it in a session of its own
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 20  # a loaded machine may take a while to reap them
        while _local_superlinks(home) and time.monotonic() < deadline:
            for p in _local_superlinks(home):
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    p.kill()
                except psutil.Error:
                    pass
            time.sleep(0.5)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Successfully started run" in out, out
    # The ServerApp's stderr reaches the stream: per-round lines and the resolved experiment.
    assert "round 3/3" in out, out
    assert "fedavg-shakespeare-quick.toml" in out and str(home / "apps") in out, out
    rows = read_metrics(run_dir)
    train = [r for r in rows if r["split"] == "train"]
    assert [r["round"] for r in train] == [1, 2, 3], rows
    assert all(r["failed"] == 0 and r["clients"] == 6 for r in train), train
    assert any(r["split"] == "heldout" and r["round"] == 3 for r in rows), rows
    assert not _local_superlinks(home)
