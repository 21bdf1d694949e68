"""experiments/parallel_grid.sh and experiments/arxiv_device_call.sh, the scripts that run the arXiv
grid on a GPU machine and merge its runs into the committed store: here with a stand-in for
`python -m fedpriv.cli run` (the scripts' control flow is under test, not training) and the real
`fedpriv report` on a small store."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

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


PUBLIC_SUMS = "".join(f"{_sha(f'params of public-s{s}' + chr(10))}  public-s{s}/params.msgpack\n" for s in (0, 1))


def _base(tmp_path: Path, drop: str = "dp-fedavg") -> Path:
    """The committed store, SMALL_STORE without DROP's run folder (its experiment.json still lists it)."""
    base_dir = tmp_path / "base" / "store"
    shutil.copytree(SMALL_STORE, base_dir)
    shutil.rmtree(base_dir / drop)
    return _tar(tmp_path / "base.tar.gz", base_dir, "store")


def _call(tmp_path: Path, runs: dict[str, Path], sums: str | None = PUBLIC_SUMS, experiment: dict | None = None, records: bool = True) -> Path:
    """A call's store.tar.gz as `run` packs it: grid/public-sS/{experiment.json,public-sS},
    grid/RUN/{experiment.json,public-s0,RUN}, grid/store/ (the grid's merged copy of them all) and
    grid/public.sha256 (SUMS; None: left out). RUNS: run name -> the folder it is a copy of.
    RECORDS false: no experiment.json anywhere (a call that kept no record of its configs)."""
    grid = tmp_path / "call" / "grid"
    exp = json.dumps(experiment or json.loads((SMALL_STORE / "experiment.json").read_text()))
    for s in (0, 1):
        (grid / f"public-s{s}" / f"public-s{s}").mkdir(parents=True)
        (grid / f"public-s{s}" / f"public-s{s}" / "summary.json").write_text("{}")
        if records:
            (grid / f"public-s{s}" / "experiment.json").write_text(exp)
    shutil.copytree(grid / "public-s0", grid / "store")
    shutil.copytree(grid / "public-s1" / "public-s1", grid / "store" / "public-s1")
    for name, src in runs.items():
        shutil.copytree(grid / "public-s0", grid / name)
        shutil.copytree(src, grid / name / name)
        shutil.copytree(src, grid / "store" / name)
    if sums is not None:
        (grid / "public.sha256").write_text(sums)
    return _tar(tmp_path / "device.tar.gz", grid, "grid")


def _merge(env: dict, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(DEVICE), "merge"], env={**os.environ, **env}, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def _public_sums(tmp_path: Path) -> Path:
    path = tmp_path / "public_params.sha256"
    path.write_text(PUBLIC_SUMS)
    return path


def test_merge_adds_a_calls_new_runs_to_the_committed_store_and_reports(tmp_path):
    """Paths relative to the caller's directory (not the repository's); each run once (grid/store/RUN,
    the grid's own copy, is not visited again)."""
    base = _base(tmp_path)
    finished = tmp_path / "finished-dp-sgd"
    shutil.copytree(SMALL_STORE / "dp-sgd", finished)
    (finished / "summary.json").write_text("{}")  # already committed: kept as it is
    _call(tmp_path, {"dp-fedavg": SMALL_STORE / "dp-fedavg", "dp-sgd": finished})
    _public_sums(tmp_path)
    dest = tmp_path / "merged"
    env = {"BASE": "base.tar.gz", "DEVICE": "device.tar.gz", "DEST": "merged", "PUBLIC_SHA256": "public_params.sha256"}
    done = _merge(env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("added dp-fedavg") == 1 and "dp-fedavg is in the committed store already" not in done.stdout
    assert done.stdout.count("dp-sgd is in the committed store already") == 1
    assert not (ROOT / "merged").exists()
    assert (dest / "store" / "dp-fedavg" / "summary.json").read_bytes() == (SMALL_STORE / "dp-fedavg" / "summary.json").read_bytes()
    assert (dest / "store" / "dp-sgd" / "summary.json").read_bytes() == (SMALL_STORE / "dp-sgd" / "summary.json").read_bytes()
    report = (dest / "store" / "report" / "comparison.md").read_text()
    assert "| dp-fedavg |" in report and "| dp-sgd |" in report
    with tarfile.open(dest / "store.tar.gz") as t:
        names = t.getnames()
    assert "store/dp-fedavg/summary.json" in names and not any(n.startswith("store/report") for n in names)
    again = _merge(env, cwd=tmp_path)
    assert again.returncode == 2 and "exists" in again.stderr  # never writes over an earlier merge


def test_merge_replaces_a_committed_run_that_did_not_finish(tmp_path):
    base_dir = tmp_path / "base" / "store"
    shutil.copytree(SMALL_STORE, base_dir)
    (base_dir / "dp-fedavg" / "summary.json").unlink()  # failed or cut off in the committed store
    (base_dir / "dp-fedavg" / "stale").write_text("from the unfinished run")
    base = _tar(tmp_path / "base.tar.gz", base_dir, "store")
    device = _call(tmp_path, {"dp-fedavg": SMALL_STORE / "dp-fedavg"})
    dest = tmp_path / "merged"
    done = _merge({"BASE": str(base), "DEVICE": str(device), "DEST": str(dest), "PUBLIC_SHA256": str(_public_sums(tmp_path))})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "replaced dp-fedavg" in done.stdout and "unfinished" in done.stdout
    assert (dest / "store" / "dp-fedavg" / "summary.json").read_bytes() == (SMALL_STORE / "dp-fedavg" / "summary.json").read_bytes()
    assert not (dest / "store" / "dp-fedavg" / "stale").exists()


def _other_config() -> dict:
    exp = json.loads((SMALL_STORE / "experiment.json").read_text())
    (run,) = [r for r in exp["runs"] if r["name"] == "dp-fedavg"]
    run["config"]["seed"] = 1
    return exp


@pytest.mark.parametrize("case, message", [
    ("no hashes", "no grid/public.sha256"),
    ("other public models", "public models (grid/public.sha256) are not those of"),
    ("run not in the experiment", "dp-extra is not a run of BASE's experiment.json"),
    ("other config", "dp-fedavg: its config in the call (dp-fedavg/experiment.json) differs from BASE's"),
    ("no record", "dp-fedavg: the call holds no experiment.json"),
])
def test_merge_refuses_runs_that_would_not_join_the_committed_store(tmp_path, case, message):
    base = _base(tmp_path)
    before = base.read_bytes()
    runs = {"dp-fedavg": SMALL_STORE / "dp-fedavg"}
    sums, experiment = PUBLIC_SUMS, None
    if case == "no hashes":
        sums = None
    elif case == "other public models":
        sums = PUBLIC_SUMS.replace(PUBLIC_SUMS[:64], "0" * 64)
    elif case == "run not in the experiment":
        runs["dp-extra"] = SMALL_STORE / "dp-fedavg"
    elif case == "other config":
        experiment = _other_config()
    device = _call(tmp_path, runs, sums=sums, experiment=experiment, records=case != "no record")
    dest = tmp_path / "merged"
    done = _merge({"BASE": str(base), "DEVICE": str(device), "DEST": str(dest), "PUBLIC_SHA256": str(_public_sums(tmp_path))})
    assert done.returncode == 5, done.stdout + done.stderr
    assert message in done.stderr and done.stderr.count("merge: refused") == 1
    assert "added" not in done.stdout
    assert not dest.exists() and base.read_bytes() == before  # nothing copied; the committed store as it was


# `python3` for `run` and `prepare` in a copy of the scripts: pip does nothing (PIP: its exit status),
# `-m fedpriv.cli` is FAKE_PY.
FAKE_PY3 = FAKE_PY.replace("shift 2;", '[ "$2" = pip ] && exit "${PIP:-0}"\nshift 2;', 1)


def _scripts(tmp_path: Path) -> tuple[Path, dict]:
    """A repository holding only the two scripts, with python3 and nvidia-smi stand-ins on PATH."""
    repo = tmp_path / "repo"
    (repo / "experiments").mkdir(parents=True)
    for script in (DEVICE, GRID):
        shutil.copy(script, repo / "experiments" / script.name)
    (repo / ".whl").mkdir()
    (repo / ".whl" / "x-1-py3-none-any.whl").write_text("")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, text in (("python3", FAKE_PY3), ("nvidia-smi", "#!/usr/bin/env bash\necho fake-gpu\n")):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    return repo, {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}


def test_run_exits_with_the_grids_status_and_packs_the_public_models_hashes(tmp_path):
    repo, env = _scripts(tmp_path)
    sums = _public_sums(tmp_path)
    for sub, want, rc in (("ok", PUBLIC_SUMS, 0), ("other", PUBLIC_SUMS.replace(PUBLIC_SUMS[:64], "0" * 64), 5)):
        (tmp_path / f"{sub}.sha256").write_text(want)
        run_env = {**env, "WORK": str(tmp_path / sub / "work"), "OUT": str(tmp_path / sub / "out"),
                   "JOBS": "dp-x-s0", "GRID": "200", "PUBLIC_SHA256": str(tmp_path / f"{sub}.sha256")}
        done = subprocess.run(["bash", str(repo / "experiments" / DEVICE.name), "run"], env=run_env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == rc, done.stdout + done.stderr
        assert f"grid exit {rc}" in done.stdout
        with tarfile.open(tmp_path / sub / "out" / "store.tar.gz") as t:  # packed even when the grid stopped
            names = t.getnames()
            assert t.extractfile("grid/public.sha256").read().decode() == sums.read_text()
        assert not any(n.endswith(".msgpack") for n in names)
        assert ("grid/dp-x-s0/dp-x-s0/summary.json" in names) == (rc == 0)


@pytest.mark.parametrize("fails, message", [("wheels", "gpu_wheels.sh failed"), ("pip", "pip download jax-privacy failed")])
def test_prepare_fails_when_a_download_fails(tmp_path, fails, message):
    repo, env = _scripts(tmp_path)
    (repo / "benchmarks").mkdir()
    (repo / "benchmarks" / "gpu_wheels.sh").write_text(f"exit {1 if fails == 'wheels' else 0}\n")
    (repo / "constraints.txt").write_text("jax-privacy==2.0.0\n")
    (repo / ".venv" / "bin").mkdir(parents=True)
    (repo / ".venv" / "bin" / "python").symlink_to(sys.executable)  # the corpus step's python
    src = tmp_path / "in.jsonl.gz"
    with gzip.open(src, "wt") as f:
        f.write(json.dumps({"first_author": "a", "abstract": "b", "title": "c"}) + "\n")
    done = subprocess.run(["bash", str(repo / "experiments" / DEVICE.name), "prepare"],
                          env={**env, "SRC": str(src), "PIP": "1" if fails == "pip" else "0"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and message in done.stderr, done.stdout + done.stderr
    assert (repo / ".devdata" / "arxiv.jsonl.gz").is_file()  # the corpus step ran first
