"""A Flower deployment on loopback: one ``flower-superlink``, N ``flower-supernode`` processes
(insecure mode), the app submitted with ``flwr run APP_DIR CONNECTION``.

This is the deployment recipe of docs/federated.md as code, for the test
``tests/engines/test_flower_deployment.py`` and for trying it by hand::

    python -m fedpriv.engines.flower.deploy experiments/fedavg-shakespeare-quick.toml \\
        --supernodes 3 --run-dir runs/quick-deploy --kill-node-after-round 1

Every process gets its own ``FLWR_HOME`` under the work directory (the SuperLink's and each
SuperNode's installed FABs, the CLI's ``config.toml`` with the connection), free loopback ports,
its own process group (so a SuperNode is killed together with the ClientApp processes it
spawned) and a log file. :meth:`LocalDeployment.stop` ends them all; the class is a context
manager so they end on errors too.

Flower 1.41 and 1.42 run the SuperLink's Fleet, Control and runtime APIs on one HTTP port (``--port``);
each SuperNode has a runtime API port of its own (``--port``), where its ClientApp processes
connect. A SuperNode pulls one message at a time and starts one ``flwr-clientapp`` process for
it, so every message pays for importing JAX and loading the corpus (seconds); the processes share
a persistent JAX compilation cache so that only the first one compiles the client update.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fedpriv.errors import FedprivError

CONNECTION = "local-deployment"
REPO_ROOT = Path(__file__).resolve().parents[3]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bin(name: str) -> str:
    """A console script of this environment (next to the running python), else from PATH."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise FedprivError(f"`{name}` not found next to {sys.executable} or on PATH; install flwr")
    return found


def read_metrics(run_dir: str | os.PathLike[str]) -> list[dict]:
    """The rows of ``run_dir/metrics.jsonl`` written so far (a partial last line is skipped)."""
    path = Path(run_dir) / "metrics.jsonl"
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


def train_rounds(run_dir: str | os.PathLike[str]) -> list[int]:
    return [int(r["round"]) for r in read_metrics(run_dir) if r.get("split") == "train"]


@dataclass
class RunOutcome:
    """What one ``flwr run ... --stream`` submission ended with."""

    returncode: int
    log_path: Path
    train_rounds: list[int]
    killed_node: int | None = None

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class LocalDeployment:
    """SuperLink + SuperNodes on loopback; see the module docstring."""

    def __init__(self, workdir: str | os.PathLike[str], num_supernodes: int = 3, app_dir: str | os.PathLike[str] = REPO_ROOT, log: Callable[[str], None] | None = None):
        self.workdir = Path(workdir).resolve()
        self.app_dir = Path(app_dir).resolve()
        self.num_supernodes = num_supernodes
        self.log = log or (lambda m: print(m, file=sys.stderr, flush=True))
        self.port = 0
        self.superlink: subprocess.Popen | None = None
        self.supernodes: list[subprocess.Popen | None] = []
        self._files: list = []
        self.cli_home = self.workdir / "cli-home"

    # ---- processes -------------------------------------------------------------------------------
    def _env(self, home: Path) -> dict[str, str]:
        env = dict(os.environ)
        env["FLWR_HOME"] = str(home)
        env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"  # the apps run from this environment
        env["FLWR_DISABLE_UPDATE_CHECK"] = "1"  # offline
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        # Every ClientApp process compiles the client update again; a shared persistent
        # compilation cache turns all but the first compile into a cache read.
        env.setdefault("JAX_COMPILATION_CACHE_DIR", str(self.workdir / "jax-cache"))
        env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        env.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
        return env

    def _spawn(self, name: str, argv: list[str], home: Path) -> subprocess.Popen:
        home.mkdir(parents=True, exist_ok=True)
        out = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        self._files.append(out)
        # cwd: the app directory, so a relative run-dir means the same as for `flwr run .`.
        # start_new_session: a process group per component, killed as one.
        return subprocess.Popen(argv, cwd=self.app_dir, env=self._env(home), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=0.5) as r:
                return 200 <= r.status < 300
        except OSError:
            return False

    def start(self, timeout_s: float = 60.0) -> LocalDeployment:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.superlink = self._spawn(
            "superlink",
            [_bin("flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(self.port), "--disable-runtime-dependency-installation"],
            self.workdir / "superlink-home",
        )
        deadline = time.monotonic() + timeout_s
        while not self._healthy():
            if self.superlink.poll() is not None:
                raise FedprivError(f"flower-superlink exited with code {self.superlink.returncode}; see {self.workdir / 'superlink.log'}")
            if time.monotonic() > deadline:
                raise FedprivError(f"flower-superlink did not answer on 127.0.0.1:{self.port} within {timeout_s:.0f} s; see {self.workdir / 'superlink.log'}")
            time.sleep(0.2)
        for i in range(self.num_supernodes):
            self.supernodes.append(self.start_supernode(i))
        # The CLI's connection: $FLWR_HOME/config.toml (Flower 1.41 and 1.42 keep connections there).
        self.cli_home.mkdir(parents=True, exist_ok=True)
        (self.cli_home / "config.toml").write_text(f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n')
        self.log(f"SuperLink on 127.0.0.1:{self.port}, {self.num_supernodes} SuperNodes; logs in {self.workdir}")
        return self

    def start_supernode(self, i: int) -> subprocess.Popen:
        argv = [_bin("flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{self.port}", "--port", str(free_port()), "--node-config", f"node-index={i}"]
        return self._spawn(f"supernode-{i}", argv, self.workdir / f"supernode-{i}-home")

    def kill_supernode(self, i: int) -> None:
        """SIGKILL SuperNode ``i`` and the ClientApp processes it started (its process group)."""
        proc = self.supernodes[i]
        if proc is not None and proc.poll() is None:
            _kill_group(proc, signal.SIGKILL)
            proc.wait(timeout=10)
        self.log(f"killed SuperNode {i}")

    def stop(self) -> None:
        """End every process this deployment started (SIGTERM, then SIGKILL after 10 s)."""
        procs = [p for p in [*self.supernodes, self.superlink] if p is not None]
        for p in procs:
            if p.poll() is None:
                _kill_group(p, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _kill_group(p, signal.SIGKILL)  # whatever is left of the group (ClientApps, SuperExec)
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for f in self._files:
            f.close()
        self._files.clear()

    def __enter__(self) -> LocalDeployment:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- runs ------------------------------------------------------------------------------------
    def flwr(self, *args: str, **kwargs) -> subprocess.Popen:
        """Start ``flwr ARGS`` with the deployment's CLI home (the connection)."""
        return subprocess.Popen([_bin("flwr"), *args], cwd=self.app_dir, env=self._env(self.cli_home), start_new_session=True, **kwargs)

    def run(self, run_config: dict[str, object], run_dir: str | os.PathLike[str], kill_node_after_round: int | None = None, kill_node: int = 0, timeout_s: float = 900.0, name: str = "flwr-run") -> RunOutcome:
        """Submit the app (``flwr run APP_DIR CONNECTION --stream``) and wait for the stream to end.

        With ``kill_node_after_round``, SuperNode ``kill_node`` is killed as soon as
        ``run_dir/metrics.jsonl`` holds that round's train row."""
        overrides = " ".join(f"{k}={json.dumps(v)}" for k, v in {**run_config, "run-dir": str(run_dir)}.items())
        log_path = self.workdir / f"{name}.log"
        killed = None
        with open(log_path, "wb") as out:
            proc = self.flwr("run", str(self.app_dir), CONNECTION, "--stream", "--run-config", overrides, stdout=out, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + timeout_s
            try:
                while proc.poll() is None:
                    if time.monotonic() > deadline:
                        raise FedprivError(f"`flwr run` did not finish within {timeout_s:.0f} s; see {log_path}")
                    if kill_node_after_round is not None and killed is None and kill_node_after_round in train_rounds(run_dir):
                        self.kill_supernode(kill_node)
                        killed = kill_node
                    time.sleep(0.2)
            finally:
                if proc.poll() is None:
                    _kill_group(proc, signal.SIGKILL)
                    proc.wait()
        return RunOutcome(proc.returncode, log_path, train_rounds(run_dir), killed)


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the process was started with start_new_session: pgid == pid
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="experiment TOML (relative: to the app directory)")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--supernodes", type=int, default=3)
    p.add_argument("--workdir", default=None, help="logs and FLWR_HOMEs (default: RUN_DIR-deploy)")
    p.add_argument("--kill-node-after-round", type=int, default=None, help="kill SuperNode 0 once this round's train row is written")
    p.add_argument("--resume", action="store_true", help="if the run does not reach its last round, submit it again with the same run dir")
    a = p.parse_args(argv)
    from fedpriv.config import load_config

    rounds = load_config(REPO_ROOT / a.config if not os.path.isabs(a.config) else a.config).federated.rounds
    run_dir = os.path.abspath(a.run_dir)
    with LocalDeployment(a.workdir or run_dir + "-deploy", a.supernodes) as dep:
        out = dep.run({"config": a.config}, run_dir, a.kill_node_after_round)
        print(out.log)
        if a.resume and rounds not in out.train_rounds:
            print(f"the run stopped after rounds {out.train_rounds}; resuming with the same run dir", file=sys.stderr)
            out = dep.run({"config": a.config}, run_dir, name="flwr-run-resume")
            print(out.log)
    done = train_rounds(run_dir)
    print(f"train rounds in {run_dir}/metrics.jsonl: {done}", file=sys.stderr)
    return 0 if rounds in done else 1


if __name__ == "__main__":
    sys.exit(main())
