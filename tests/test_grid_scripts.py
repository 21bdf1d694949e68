"""experiments/parallel_grid.sh and experiments/arxiv_device_call.sh, the scripts that run the arXiv
grid on a GPU machine and merge its runs into the committed store: here with a stand-in for
`python -m fedpriv.cli run` (the scripts' control flow is under test, not training) and the real
`fedpriv report` on a small store."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "experiments" / "parallel_grid.sh"
DEVICE = ROOT / "experiments" / "arxiv_device_call.sh"
SMALL_STORE = ROOT / "tests" / "reliability" / "store"

# `PY -m fedpriv.cli run EXP --out DIR --only NAME ...` writes DIR/NAME/{summary.json,params.msgpack}
# (its parameters: "params of NAME"); `PY -m fedpriv.cli report S` writes S/report/.
FAKE_PY = """#!/usr/bin/env bash
shift 2; cmd=$1; shift
if [ "$cmd" = run ]; then
  shift; out=; only=
  while [ $# -gt 0 ]; do case $1 in --out) out=$2; shift ;; --only) only=$2; shift ;; esac; shift; done
  mkdir -p "$out/$only"; echo '{}' > "$out/$only/summary.json"; echo "params of $only" > "$out/$only/params.msgpack"
else
  mkdir -p "$1/report"
fi
"""


def _grid(tmp_path: Path, sha_lines: list[str]) -> subprocess.CompletedProcess:
    fake = tmp_path / "fakepy"
    fake.write_text(FAKE_PY)
    fake.chmod(0o755)
    sums = tmp_path / "public.sha256"
    sums.write_text("".join(line + "\n" for line in sha_lines))
    env = {**os.environ, "PY": str(fake), "SEEDS": "0 1", "JOBS": "dp-x-s0", "BUDGET": "200",
           "W": str(tmp_path / "w"), "OUT": str(tmp_path / "out"), "PUBLIC_SHA256": str(sums)}
    return subprocess.run(["bash", str(GRID)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_the_grid_runs_its_rows_only_when_the_public_models_are_the_committed_ones(tmp_path):
    want = [f"{_sha(f'params of public-s{s}' + chr(10))}  public-s{s}/params.msgpack" for s in (0, 1)]
    (tmp_path / "a").mkdir()
    ok = _grid(tmp_path / "a", want)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "public models match" in ok.stdout
    assert (tmp_path / "a" / "w" / "store" / "dp-x-s0" / "summary.json").is_file()

    (tmp_path / "b").mkdir()
    other = [want[0], f"{'0' * 64}  public-s1/params.msgpack"]
    bad = _grid(tmp_path / "b", other)
    assert bad.returncode == 5 and "would not merge" in bad.stdout
    assert not (tmp_path / "b" / "w" / "dp-x-s0").exists()  # no row started


def _tar(path: Path, root: Path, arcname: str) -> Path:
    with tarfile.open(path, "w:gz") as t:
        t.add(root, arcname=arcname)
    return path


def test_merge_adds_a_calls_new_runs_to_the_committed_store_and_reports(tmp_path):
    base_dir = tmp_path / "base" / "store"
    shutil.copytree(SMALL_STORE, base_dir)
    shutil.rmtree(base_dir / "dp-fedavg")  # the committed store lacks this run; the call brings it
    base = _tar(tmp_path / "base.tar.gz", base_dir, "store")
    call = tmp_path / "call" / "grid"
    shutil.copytree(SMALL_STORE / "dp-fedavg", call / "dp-fedavg" / "dp-fedavg")
    shutil.copytree(SMALL_STORE / "dp-sgd", call / "dp-sgd" / "dp-sgd")  # already committed: kept as it is
    (call / "dp-sgd" / "dp-sgd" / "summary.json").write_text("{}")
    device = _tar(tmp_path / "device.tar.gz", call, "grid")
    dest = tmp_path / "merged"
    env = {**os.environ, "BASE": str(base), "DEVICE": str(device), "DEST": str(dest)}
    done = subprocess.run(["bash", str(DEVICE), "merge"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "added dp-fedavg" in done.stdout and "dp-sgd is in the committed store already" in done.stdout
    assert (dest / "store" / "dp-fedavg" / "summary.json").read_bytes() == (SMALL_STORE / "dp-fedavg" / "summary.json").read_bytes()
    assert (dest / "store" / "dp-sgd" / "summary.json").read_bytes() == (SMALL_STORE / "dp-sgd" / "summary.json").read_bytes()
    report = (dest / "store" / "report" / "comparison.md").read_text()
    assert "| dp-fedavg |" in report and "| dp-sgd |" in report
    with tarfile.open(dest / "store.tar.gz") as t:
        names = t.getnames()
    assert "store/dp-fedavg/summary.json" in names and not any(n.startswith("store/report") for n in names)
    again = subprocess.run(["bash", str(DEVICE), "merge"], env=env, cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 2 and "exists" in again.stderr  # never writes over an earlier merge
