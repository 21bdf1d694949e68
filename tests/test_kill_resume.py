"""Killed at any write, resumed to the same result: central DP-SGD, DP-FedAvg on both engines, and
the experiment runner.

A kill is simulated in-process at the k-th write under the run's directory (``Path.write_text``,
``Path.write_bytes``, ``os.replace``, a metrics append): the write is skipped, or left torn (half
its bytes, no newline), and :class:`Killed` unwinds the trainer as a ``kill -9`` would leave the
files (no cleanup runs that writes). The points are drawn with a seeded RNG from every write an
uninterrupted run makes: uniform ones, and a torn checkpoint state, the replace that commits a
checkpoint and a torn metrics line (the Flower engine, whose every run is a Flower simulation of
tens of seconds: one of the two checkpoint writes and two uniform points). The same command then
runs again and must end with the uninterrupted run's parameters (bytewise), metrics (wall-clock
columns aside), privacy ledger and, for the runner, summaries and audits.
(tests/central/test_central.py and test_a_killed_flower_cli_run_resumes_to_the_same_result below
kill a real process with SIGKILL.)
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from fedpriv.config import load_config
from fedpriv.engines.flower.deploy import read_metrics
from fedpriv.errors import FedprivError
from fedpriv.rundir import RunDir
from fedpriv.runner.dispatch import train_run
from fedpriv.runner.prepare import prepare
from fedpriv.runner.store import run_experiment

pytestmark = pytest.mark.slow

BASE = """
name = "kill"
seed = 5
[data]
source = "synthetic:users=30,examples=300"
[vocab]
size = 100
seq_len = 8
[task]
kind = "nwp"
model = "tiny"
[training]
optimizer = "adam"
learning_rate = 0.01
batch_size = 8
steps = 6
eval_every = 2
checkpoint_every = 2
"""
DP_SGD = '[privacy]\nclip_norm = 1.0\nnoise_multiplier = 1.0\ndelta = 1e-4\n'
DP_FEDAVG = """[federated]
rounds = 4
clients_per_round = 6
local_batch_size = 4
max_local_steps = 3
eval_every = 2
checkpoint_every = 1
strategy = "dp-fedavg"
clip_norm = 0.5
dp = { noise_multiplier = 1.0, delta = 1e-3 }
[federated.flower]
num_supernodes = 2
client_num_cpus = 2  # one ClientApp actor on 2 cores (each actor imports JAX and prepares the data); the engine tests cover several
"""
EXPERIMENT = BASE + """
[federated]
rounds = 3
clients_per_round = 6
local_batch_size = 4
max_local_steps = 3
[canaries]
per_config = 1
user_probabilities = [0.2]
example_probabilities = [0.5]
min_expected_sharers = 0.0
[audit]
rs_candidates = 50
extraction_examples = 0

[[runs]]
name = "dp-sgd"
kind = "central"
privacy = { clip_norm = 1.0, noise_multiplier = 1.0, delta = 1e-4 }

[[runs]]
name = "fedavg"
kind = "federated"
"""


class Killed(Exception):
    """A simulated kill at an I/O point."""


@contextmanager
def writes(root: Path, kill_at: int | None = None, torn: bool = False):
    """Count the writes under ``root``; with ``kill_at``, die at that one (``torn``: leave half of it)."""
    events: list[tuple[str, str]] = []
    real = {"write_text": Path.write_text, "write_bytes": Path.write_bytes, "replace": os.replace, "append": RunDir.append_metrics}
    root = root.resolve()

    def hit(kind: str, path) -> bool:
        p = Path(path).resolve()
        if root not in p.parents and p != root:
            return False
        events.append((kind, p.name))
        return kill_at is not None and len(events) == kill_at

    def write_text(self, data, *a, **kw):
        if hit("write_text", self):
            if torn:
                real["write_text"](self, data[: len(data) // 2], *a, **kw)
            raise Killed(f"killed writing {self.name}")
        return real["write_text"](self, data, *a, **kw)

    def write_bytes(self, data):
        if hit("write_bytes", self):
            if torn:
                real["write_bytes"](self, data[: len(data) // 2])
            raise Killed(f"killed writing {self.name}")
        return real["write_bytes"](self, data)

    def replace(src, dst):
        if hit("replace", dst):
            raise Killed(f"killed before replacing {Path(dst).name}")
        return real["replace"](src, dst)

    def append(self, row):
        if hit("append", self.path / "metrics.jsonl"):
            if torn:
                with open(self.path / "metrics.jsonl", "a") as f:
                    f.write(json.dumps(row)[:20])
            raise Killed("killed appending a metrics row")
        return real["append"](self, row)

    Path.write_text, Path.write_bytes, os.replace, RunDir.append_metrics = write_text, write_bytes, replace, append
    try:
        yield events
    finally:
        Path.write_text, Path.write_bytes, os.replace, RunDir.append_metrics = real["write_text"], real["write_bytes"], real["replace"], real["append"]


def kill_points(events: list[tuple[str, str]], seed: int, random_points: int, fixed: str = "all") -> list[tuple[int, bool]]:
    """(1-based event, torn) to kill at: after a first checkpoint, a torn checkpoint state, the
    replace committing a checkpoint, a torn metrics line (``fixed="checkpoint"``: one checkpoint
    write only, torn or committing); then ``random_points`` uniform ones over every write."""
    rng = random.Random(seed)
    commit = [i for i, (k, n) in enumerate(events, 1) if k == "replace" and n == "checkpoint.json"]
    after = commit[0]  # points after the first checkpoint: the resume starts from one, not from scratch
    state = [i for i, (k, n) in enumerate(events, 1) if k == "write_bytes" and n.startswith("checkpoint-") and i > after]
    rows = [i for i, (k, _) in enumerate(events, 1) if k == "append" and i > after]
    commit = commit[1:]
    points = [(rng.choice(state), True), (rng.choice(commit), False), (rng.choice(rows), True)]
    if fixed == "checkpoint":
        points = [rng.choice(points[:2])]
    return points + [(rng.randint(1, len(events)), rng.random() < 0.5) for _ in range(random_points)]


def run_files(run: Path) -> dict:
    """What a finished run reports, wall-clock columns aside."""
    out = {"params": (run / "params.msgpack").read_bytes(), "failed": (run / "failed.json").exists()}
    out["metrics"] = [{k: v for k, v in json.loads(line).items() if not k.endswith("seconds")} for line in (run / "metrics.jsonl").read_text().splitlines()]
    for name in ("privacy_ledger.json", "checkpoint.json"):
        if (run / name).exists():  # (the checkpoint's digest of metrics.jsonl covers its wall-clock columns too)
            out[name] = {k: v for k, v in json.loads((run / name).read_text()).items() if k != "metrics_sha256"}
    for name in ("summary.json", "audit.json"):
        if (run / name).exists():
            out[name] = {k: v for k, v in json.loads((run / name).read_text()).items() if k not in ("seconds", "run_dir")}
    return out


def uninterrupted(train, reference: Path) -> list[tuple[str, str]]:
    """``train(reference)`` without a kill: the writes it made."""
    with writes(reference) as events:
        train(reference)
    return events


def killed_and_resumed(train, root: Path, reference: Path, seed: int, random_points: int, fixed: str = "all", events: list[tuple[str, str]] | None = None) -> None:
    """``train(dir)`` uninterrupted into ``reference`` (unless its ``events`` are given: the run is
    there already), then killed at each point and run again."""
    if events is None:
        events = uninterrupted(train, reference)
    for i, (k, torn) in enumerate(kill_points(events, seed, random_points, fixed)):
        run = root / f"killed-{i}"
        with writes(run, kill_at=k, torn=torn), pytest.raises((Killed, FedprivError)):
            train(run)
        train(run)
        assert run_files(run) == run_files(reference), (k, torn, events[k - 1])


def test_central_dp_sgd_killed_anywhere_resumes_to_the_same_result(tmp_path):
    cfg_path = tmp_path / "c.toml"
    cfg_path.write_text(BASE + DP_SGD)
    prepared = prepare(load_config(cfg_path))
    killed_and_resumed(lambda d: train_run(prepared, d, "central"), tmp_path, tmp_path / "full", seed=1, random_points=2)


def test_dp_fedavg_vectorized_killed_anywhere_resumes_to_the_same_result(tmp_path):
    cfg_path = tmp_path / "f.toml"
    cfg_path.write_text(BASE + DP_FEDAVG)
    prepared = prepare(load_config(cfg_path))
    killed_and_resumed(lambda d: train_run(prepared, d, "federated", "vectorized"), tmp_path, tmp_path / "full", seed=2, random_points=2)


@pytest.fixture(scope="module")
def flower_reference(tmp_path_factory, shared_ray):
    """The DP-FedAvg config on Flower (4 rounds, a checkpoint every round), prepared and run once
    uninterrupted for both Flower tests: (config path, prepared, run dir, the writes it made)."""
    root = tmp_path_factory.mktemp("flower")
    cfg_path = root / "f.toml"
    cfg_path.write_text(BASE + DP_FEDAVG)
    prepared = prepare(load_config(cfg_path))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_ADDRESS", shared_ray)
        events = uninterrupted(lambda d: train_run(prepared, d, "federated", "flower"), root / "full")
    return cfg_path, prepared, root / "full", events


def test_dp_fedavg_on_flower_killed_anywhere_resumes_to_the_same_result(tmp_path, flower_reference, flower_on_shared_ray):
    """Three kills (a Flower simulation takes tens of seconds here): a checkpoint write (torn
    state or the committing replace) and two uniform points over every write, drawn by the seed."""
    _, prepared, reference, events = flower_reference
    killed_and_resumed(lambda d: train_run(prepared, d, "federated", "flower"), tmp_path, reference, seed=3, random_points=2, fixed="checkpoint", events=events)


def test_a_killed_flower_cli_run_resumes_to_the_same_result(tmp_path, flower_reference):
    """A real SIGKILL of `fedpriv train federated --engine flower` (its whole process group: the
    ServerApp's process and the simulation's Ray processes) at a seeded moment after a checkpoint,
    then the same command again: the uninterrupted run's parameters, metrics and ledger (the
    in-process run of the same config: the command must give exactly what it gives)."""
    cfg_path, _, reference, _ = flower_reference  # 4 rounds, a checkpoint every round
    cmd = [sys.executable, "-m", "fedpriv.cli", "train", "federated", str(cfg_path), "--engine", "flower"]
    # Kill a seeded moment within about one round after round 1's or 2's checkpoint: two rounds
    # (and their evaluation) are still to come then, so the kill lands before the run ends.
    rounds = [r["round_seconds"] for r in read_metrics(reference) if r["split"] == "train" and r["round"] >= 3]
    rng = random.Random(6)
    after_round, delay = rng.randint(1, 2), rng.uniform(0.0, min(rounds))
    run = tmp_path / "killed"
    proc = subprocess.Popen([*cmd, "--out", str(run)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        meta = run / "checkpoint.json"
        while not (meta.exists() and json.loads(meta.read_text())["step"] >= after_round):
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended (or stalled) before its checkpoint"
            time.sleep(0.02)
        time.sleep(delay)
        assert proc.poll() is None, "the run finished before the kill"
        family = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGKILL)  # start_new_session: the group is the run and what it started
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for p in family:  # a Ray process that left the group dies by its pid
        try:
            p.kill()
            p.wait(timeout=10)
        except psutil.Error:
            pass
    assert not (run / "params.msgpack").exists()
    killed_at = json.loads((run / "checkpoint.json").read_text())["step"]
    assert after_round <= killed_at < 4, (after_round, delay, killed_at)
    again = subprocess.run([*cmd, "--out", str(run)], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from the checkpoint at round {killed_at} of 4" in again.stderr, again.stderr[-3000:]
    assert run_files(run) == run_files(reference), (after_round, delay, killed_at)


def test_the_runner_killed_anywhere_resumes_to_the_same_store(tmp_path):
    exp = tmp_path / "exp.toml"
    exp.write_text(EXPERIMENT)

    def run(store: Path) -> None:
        assert run_experiment(exp, store)[2]

    reference = tmp_path / "full"
    with writes(reference) as events:
        run(reference)
    for i, (k, torn) in enumerate(kill_points(events, seed=4, random_points=3)):
        store = tmp_path / f"killed-{i}"
        with writes(store, kill_at=k, torn=torn), pytest.raises((Killed, FedprivError)):
            run(store)
        run(store)
        for name in ("dp-sgd", "fedavg"):
            assert run_files(store / name) == run_files(reference / name), (k, torn, events[k - 1], name)
    shutil.rmtree(tmp_path / "full")
