"""Issue #31, part A: a run directory is owned (a marker and an exclusive lock), outputs never
overwrite what is not theirs, run state is tamper-evident, delta >= 1/N is refused, and the
audits refuse non-finite parameters. Each numbered case of the issue has a test here that fails
on the code before the fix (the comment names the case)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedpriv.cli import main
from fedpriv.errors import DataFormatError, FedprivError, RunDirInUse
from fedpriv.jsonio import sha256_file, write_json_atomic
from fedpriv.privacy.accounting import GaussianSteps
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.rundir import CHECKPOINT, CONFIG, LEDGER, LOCK, MARKER, METRICS, PARAMS, WORD_VOCAB, RunDir, claim, hold, ledger_record, to_msgpack

ROOT = Path(__file__).resolve().parents[1]
STORE = Path(__file__).parent / "reliability" / "store"

#: A tiny DP-SGD config (synthetic users: no data files); RUN_STEPS steps.
DP_CONFIG = """name = "owned"
seed = 0
[data]
source = "synthetic:users=20,examples=200"
[vocab]
size = 100
seq_len = 8
[task]
kind = "nwp"
model = "tiny"
[training]
optimizer = "sgd"
learning_rate = 0.1
batch_size = 8
steps = STEPS
eval_every = 2
checkpoint_every = 1
[privacy]
clip_norm = 1.0
noise_multiplier = 1.0
delta = 1e-4
"""


def _config(tmp_path: Path, steps: int = 4, extra: str = "") -> Path:
    path = tmp_path / "owned.toml"
    path.write_text(DP_CONFIG.replace("STEPS", str(steps)) + extra)
    return path


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fedpriv: error: ") and "internal error" not in err, err
    return err.strip()


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---- 1. a run directory is owned: the lock -------------------------------------------------------
HOLDER = """
import fcntl, json, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, json.dumps({"pid": os.getpid(), "command": "fedpriv train central x.toml"}).encode())
print("held", flush=True)
time.sleep(60)
"""


def test_a_locked_run_directory_is_refused_naming_the_holder_and_freed_by_kill_9(tmp_path):
    """Case 1: another process holds the folder; the second writer refuses in one line naming its
    pid and command, and a SIGKILL of the holder frees the folder (the OS drops the lock)."""
    run = claim(tmp_path / "run", "run")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run / LOCK)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirInUse, match=rf"run: in use by pid {holder.pid} \(fedpriv train central x.toml\); wait until it ends"):
            with hold(run):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with hold(run) as held:  # free again; this process's pid is written
        assert json.loads((held / LOCK).read_text())["pid"] == os.getpid()
        with hold(run):  # a process may take its own lock again (the store, then its run)
            pass


#: The second trainer: the `fedpriv` entry point in a process that has imported it already and
#: waits for a line on stdin, so that it reaches the run directory while the first still trains.
SECOND = "import sys; from fedpriv.cli import main; sys.stdin.readline(); sys.exit(main(sys.argv[1:]))"


@pytest.mark.slow
def test_two_trainers_on_one_run_directory_the_second_refuses_and_the_first_ends_as_alone(tmp_path, capsys):
    """Case 1 end to end: `fedpriv train` twice on one --out (the second with another seed and noise,
    as in the issue): the second exits 2 in one line naming the first; the first ends with the
    same files as a run alone (the same command run in this process afterwards: a third
    interpreter importing JAX would cost seconds; the files must not depend on the process)."""
    config = _config(tmp_path, steps=60)
    args = ["train", "central", str(config), "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    shared, alone = tmp_path / "shared", tmp_path / "alone"
    second = subprocess.Popen([sys.executable, "-c", SECOND, *args, "--out", str(shared), "--set", "seed=1", "--set", "privacy.noise_multiplier=0.5"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    first = subprocess.Popen([sys.executable, "-m", "fedpriv.cli", *args, "--out", str(shared)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 300
    while not (shared / CHECKPOINT).exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    # The first run is paused (SIGSTOP: it keeps its lock) while the second tries the folder, so
    # the second meets it however fast the first would finish (with every program in the
    # compilation cache it once did before the second got there); then it goes on.
    assert first.poll() is None, "the first run ended before its first checkpoint was seen; give it more steps"
    os.kill(first.pid, signal.SIGSTOP)
    try:
        assert first.poll() is None, "the first run ended before it was paused; give it more steps"
        _, err = second.communicate("go\n", timeout=300)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert second.returncode == 2 and err.count("\n") == 1, err
    assert err.startswith(f"fedpriv: error: {shared}: in use by pid {first.pid} (fedpriv train central {config} --json --out {shared})"), err
    assert first.wait(timeout=300) == 0, first.stderr.read()
    assert main([*args, "--out", str(alone)]) == 0, capsys.readouterr().err
    ours = {k: v for k, v in _files(shared).items() if k != LOCK}
    assert ours == {k: v for k, v in _files(alone).items() if k != LOCK}
    rows = RunDir(shared).metrics()
    assert len(rows) == len({(r["step"], r["split"]) for r in rows})


# ---- 2. --out into a folder that is not a run; --restart clears only a run -----------------------
@pytest.mark.parametrize("restart", [False, True])
def test_train_into_a_folder_that_is_not_a_run_is_refused_and_its_files_kept(tmp_path, capsys, restart):
    """Case 2: the user's config.json and metrics.jsonl stay; `--out ''` is refused too."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "config.json").write_text('{"x":1}')
    (proj / "metrics.jsonl").write_text("{}\n")
    before = _files(proj)
    code = main(["train", "central", str(_config(tmp_path)), "--out", str(proj), *(["--restart"] if restart else [])])
    line = _one_line_error(capsys)
    assert code == 2 and f"{proj}: not empty and not a fedpriv run directory (no .fedpriv marker)" in line, line
    assert _files(proj) == before
    assert main(["train", "central", str(_config(tmp_path)), "--out", ""]) == 2
    assert "--out '': an empty path names no folder" in _one_line_error(capsys)


def test_a_store_is_not_a_run_and_a_run_is_not_a_store(tmp_path):
    store, run = claim(tmp_path / "s", "store"), claim(tmp_path / "r", "run")
    with pytest.raises(FedprivError, match="is a fedpriv run store, not a run directory"):
        RunDir(store).create()
    with pytest.raises(FedprivError, match="is a fedpriv run directory, not a run store"):
        claim(run, "store")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(FedprivError, match="not empty and not a fedpriv run directory"):
        RunDir(tmp_path / "mine").reset()  # --restart clears only a fedpriv folder
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


# ---- 3. privatize; 4. vocab build ----------------------------------------------------------------
def test_privatize_refuses_a_run_directory_and_a_file_it_did_not_write(tmp_path, capsys):
    """Case 3: `privatize --out RUN/metrics.jsonl` (it used to replace the run's metrics) and over a
    user's .jsonl are refused before any work; --force replaces the user's file."""
    run = claim(tmp_path / "run", "run")
    (run / METRICS).write_text('{"step": 1, "split": "train"}\n')
    args = ["privatize", "shakespeare", "--embeddings", str(tmp_path / "none.txt"), "--mechanism", "txt", "--eta", "10"]
    assert main([*args, "--out", str(run / METRICS)]) == 2
    assert f"{run} is a fedpriv run directory; privatize never writes into one" in _one_line_error(capsys)
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"user_id": "a", "text": "mine"}\n')
    assert main([*args, "--out", str(mine)]) == 2
    assert f"{mine} exists and was not written by fedpriv privatize" in _one_line_error(capsys)
    assert main([*args, "--out", str(mine), "--force"]) == 2  # past the target check: the embeddings file is missing
    assert "none.txt" in _one_line_error(capsys)
    assert (run / METRICS).read_text() == '{"step": 1, "split": "train"}\n' and mine.read_text() == '{"user_id": "a", "text": "mine"}\n'


def test_vocab_build_refuses_a_run_directory_and_a_folder_it_did_not_write(tmp_path, capsys):
    """Case 4: `vocab build --out RUN_DIR` used to replace a trained run's vocab.json."""
    run = claim(tmp_path / "run", "run")
    (run / WORD_VOCAB).write_text("{}")
    args = ["vocab", "build", "shakespeare", "--kind", "word", "--size", "50"]
    assert main([*args, "--out", str(run)]) == 2
    assert f"{run}: is a fedpriv run directory, not a vocabulary folder" in _one_line_error(capsys)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert main([*args, "--out", str(mine)]) == 2
    assert "not empty and not a fedpriv vocabulary folder" in _one_line_error(capsys)
    assert (run / WORD_VOCAB).read_text() == "{}" and [p.name for p in mine.iterdir()] == ["notes.txt"]
    out = tmp_path / "vocab"
    assert main([*args, "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    assert main([*args, "--out", str(out), "--json"]) == 0  # its own folder: replaced
    assert json.loads((out / MARKER).read_text())["fedpriv"] == "vocab"


# ---- 5. doubled metrics rows ---------------------------------------------------------------------
def test_doubled_metrics_rows_are_refused_by_resume_and_by_report(tmp_path, capsys):
    """Case 5: two runs' rows in one metrics.jsonl (the issue's doubled rows) are refused, naming
    the line, by resume (which cuts the rows back to the checkpoint) and by `fedpriv report`."""
    run = RunDir(tmp_path / "run").create()
    for row in ({"step": 1, "split": "train"}, {"step": 1, "split": "validation"}, {"step": 1, "split": "train"}):
        run.append_metrics(row)
    with pytest.raises(DataFormatError, match=r"metrics.jsonl:3: a second row of step 1, split 'train' \(the first is line 1\)"):
        run.truncate_metrics(1)
    store = tmp_path / "store"
    shutil.copytree(STORE, store, ignore=shutil.ignore_patterns("privacy_ledger.json"))
    metrics = store / "dp-sgd" / METRICS
    metrics.write_text(metrics.read_text() * 2)
    assert main(["report", str(store)]) == 2
    assert f"{metrics}:" in _one_line_error(capsys)


# ---- 6. a replaced vocabulary --------------------------------------------------------------------
def _trained_like(tmp_path: Path) -> RunDir:
    """A run directory as the loop leaves it: vocabulary, config with its digest, a DP checkpoint,
    ledger and final parameters."""
    run = RunDir(tmp_path / "run").create()
    (run.path / WORD_VOCAB).write_text(json.dumps({"words": ["a", "b", "c"]}))
    run.write_config({"experiment": {}, "assets": run.asset_digests()})
    event = GaussianSteps("poisson", 1.0, 100, 8, 1, "example")
    ledger = PrivacyLedger([event.with_steps(2)])
    state = {"params": {"w": np.ones(3, np.float32)}}
    run.save_checkpoint(state, {"step": 2, "kind": "central", "pending": [], "ledger": ledger_record(ledger)})
    ledger.save(run.file(LEDGER))
    run.write_params(state["params"])
    run.verify(private=True)
    return run


def test_a_replaced_vocabulary_is_refused_by_audit_and_resume(tmp_path):
    """Case 6: a vocab.json with words removed or duplicated no longer matches the digest
    config.json recorded at training."""
    run = _trained_like(tmp_path)
    (run.path / WORD_VOCAB).write_text(json.dumps({"words": ["a", "a"]}))
    with pytest.raises(FedprivError, match="vocab.json: is not the one the run was trained with"):
        run.verify(private=True)  # what audit checks
    with pytest.raises(FedprivError, match="vocab.json: is not the one the run was trained with"):
        run.check_assets()  # what a resumed run checks before it writes its vocabulary again


# ---- 7. an edited checkpoint step ----------------------------------------------------------------
def test_an_edited_checkpoint_step_state_ledger_or_parameters_are_refused(tmp_path):
    """Case 7: the step must name its state file, the state file and parameters must have the
    recorded digests, the ledger record must count the step and the ledger must be the recorded
    one (or fewer steps: a kill between the checkpoint's write and the ledger's)."""
    run = _trained_like(tmp_path)
    path = run.file(CHECKPOINT)
    meta = json.loads(path.read_text())

    def edited(**changes) -> None:
        write_json_atomic(path, {**meta, **changes}, indent=1)

    edited(step=0)  # the edit: step 0, still pointing at checkpoint-2.msgpack
    with pytest.raises(DataFormatError, match="step 0 but state file 'checkpoint-2.msgpack': the checkpoint record was edited"):
        run.checkpoint_meta()
    os.replace(run.file("checkpoint-2.msgpack"), run.file("checkpoint-0.msgpack"))
    edited(step=0, state_file="checkpoint-0.msgpack")  # the file renamed with it
    with pytest.raises(DataFormatError, match="step 0 but its privacy ledger record counts 2 steps"):
        run.verify_ledger(run.checkpoint_meta(), private=True)
    edited(step=0, state_file="checkpoint-0.msgpack", ledger={"steps": 0, "sha256": meta["ledger"]["sha256"]})
    with pytest.raises(DataFormatError, match="holds 2 steps but is not the ledger checkpoint.json records for step 0"):
        run.verify_ledger(run.checkpoint_meta(), private=True)
    os.replace(run.file("checkpoint-0.msgpack"), run.file("checkpoint-2.msgpack"))
    edited(state_sha256="0" * 64)
    with pytest.raises(DataFormatError, match="SHA-256 is not the one checkpoint.json records for step 2"):
        run.load_checkpoint({"params": {"w": np.zeros(3, np.float32)}})
    edited(ledger=None)
    with pytest.raises(DataFormatError, match="records no privacy ledger for a DP run"):
        run.verify_ledger(run.checkpoint_meta(), private=True)
    edited()
    run.file(PARAMS).write_bytes(to_msgpack({"w": np.full(3, 2.0, np.float32)}))
    with pytest.raises(DataFormatError, match="params.msgpack: its SHA-256 is not the one checkpoint.json records"):
        run.verify(private=True)
    edited()
    PrivacyLedger([GaussianSteps("poisson", 1.0, 100, 8, 1, "example")]).save(run.file(LEDGER))  # one write behind: accepted on resume
    run.verify_ledger(run.checkpoint_meta(), private=True)
    with pytest.raises(DataFormatError, match="run the training command again to repair it"):
        run.verify(private=True)  # an audit wants the ledger the checkpoint records


def test_a_checkpoint_without_digests_is_refused_as_an_old_run(tmp_path):
    """Run directories written before the digests: refused, with the advice to train again."""
    run = RunDir(tmp_path / "run").create()
    run.save_checkpoint({"w": np.ones(2)}, {"step": 1})
    meta = json.loads(run.file(CHECKPOINT).read_text())
    del meta["state_sha256"]
    run.file(CHECKPOINT).write_text(json.dumps(meta))
    with pytest.raises(DataFormatError, match="records no digest of its state file; written before fedpriv recorded digests"):
        run.load_checkpoint({"w": np.zeros(2)})


@pytest.mark.slow
def test_a_resumed_dp_run_whose_checkpoint_step_was_edited_is_refused_before_training(tmp_path, capsys):
    """Case 7 end to end: the issue's edit of checkpoint.json ("step": 0, still naming the step-2
    state), then the same command: exit 2 in one line, nothing trained or rewritten."""
    config, out = _config(tmp_path), tmp_path / "run"
    assert main(["train", "central", str(config), "--out", str(out), "--stop-after", "2", "--json"]) == 0
    capsys.readouterr()
    meta = json.loads((out / CHECKPOINT).read_text())
    assert meta["step"] == 2 and meta["ledger"]["steps"] == 2 and meta["state_sha256"] == sha256_file(out / "checkpoint-2.msgpack")
    (out / CHECKPOINT).write_text((out / CHECKPOINT).read_text().replace('"step": 2', '"step": 0'))
    before = _files(out)
    assert main(["train", "central", str(config), "--out", str(out), "--json"]) == 2
    assert "step 0 but state file 'checkpoint-2.msgpack': the checkpoint record was edited" in _one_line_error(capsys)
    assert {k: v for k, v in _files(out).items() if k != LOCK} == {k: v for k, v in before.items() if k != LOCK}


# ---- 8. delta >= 1/N -----------------------------------------------------------------------------
def test_privacy_commands_refuse_delta_at_or_above_one_over_n_unless_allowed(capsys):
    """Case 8 (the config side is in the bad-input corpus: dp-delta-large.toml, fed-dp-delta-large.toml)."""
    args = ["privacy", "epsilon", "-e", "dpsgd-poisson", "-z", "1", "-N", "100", "-B", "5", "--steps", "5", "--json"]
    assert main([*args, "--delta", "0.01"]) == 2  # delta = 1/N exactly
    assert "--delta = 0.01 is at least 1/N = 0.01 for N = 100 examples" in _one_line_error(capsys)
    assert main([*args, "--delta", "0.5", "--allow-large-delta"]) == 0
    note = json.loads(capsys.readouterr().out)["note"]
    assert note == ("--delta = 0.5 >= 1/N = 0.01 (N = 100 examples), allowed by --allow-large-delta: this guarantee does not rule out "
                    "publishing one example's data in the clear; it is no privacy guarantee for any one example")
    assert main([*args, "--delta", "0.009"]) == 0
    for event in ("dpfedavg-fixed", "dpfedavg-poisson", "blt-fedavg"):  # N counts users for DP-FedAvg, whatever --unit says
        fed = ["privacy", "epsilon", "-e", event, "-z", "1", "-N", "100", "-B", "5", "--steps", "5", "--delta", "0.01"]
        assert main(fed) == 2
        assert "for N = 100 users: publishing one user's data" in _one_line_error(capsys)


# ---- 9. non-finite parameters --------------------------------------------------------------------
AUDITED = """
[canaries]
per_config = 1
user_probabilities = [0.1]
example_probabilities = [0.5]
[audit]
extraction_examples = 0
rs_candidates = 10
empirical = true
empirical_canaries = 10
"""


@pytest.mark.slow
def test_audits_refuse_non_finite_parameters_in_one_line(tmp_path, capsys):
    """Case 9: parameters holding NaN (their digest recorded, as a run that wrote them would):
    `audit --empirical` used to write "empirical epsilon >= 0" with AUROC nan, plain `audit` to end
    in an internal error; both now refuse in one line."""
    config, out = _config(tmp_path, steps=2, extra=AUDITED), tmp_path / "run"
    assert main(["train", "central", str(config), "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    tree = RunDir(out).read_params_tree()
    data = to_msgpack(_nan_tree(tree))
    (out / PARAMS).write_bytes(data)
    meta = json.loads((out / CHECKPOINT).read_text())
    (out / CHECKPOINT).write_text(json.dumps({**meta, "params_sha256": hashlib.sha256(data).hexdigest()}))
    for extra in (["--empirical"], []):
        assert main(["audit", str(out), "--json", *extra]) == 2
        assert "the final parameters hold non-finite values (NaN or infinity)" in _one_line_error(capsys)
    assert not (out / "empirical.json").exists() and not (out / "audit.json").exists()


def _nan_tree(tree):
    if isinstance(tree, dict):
        return {k: _nan_tree(v) for k, v in tree.items()}
    return np.full_like(np.asarray(tree), np.nan)


# ---- small: report through a planted link; no .partial outlives a failed write ------------------
def test_report_refuses_a_planted_report_link_and_writes_nothing_outside_the_store(tmp_path, capsys):
    store, outside = tmp_path / "store", tmp_path / "outside"
    shutil.copytree(STORE, store, ignore=shutil.ignore_patterns("privacy_ledger.json"))
    outside.mkdir()
    (store / "report").symlink_to(outside)
    assert main(["report", str(store)]) == 2
    assert f"{store / 'report'}: is a symbolic link" in _one_line_error(capsys)
    assert list(outside.iterdir()) == []
    (store / "report").unlink()
    (store / "report").mkdir()
    (store / "report" / "comparison.md").symlink_to(outside / "comparison.md")
    (store / "report" / MARKER).write_text('{"fedpriv": "report"}')
    assert main(["report", str(store)]) == 2
    assert "a symbolic link in the report folder" in _one_line_error(capsys)
    assert list(outside.iterdir()) == []


def test_an_atomic_write_onto_a_directory_leaves_no_partial_file(tmp_path):
    (tmp_path / LEDGER).mkdir()
    with pytest.raises(OSError):
        write_json_atomic(tmp_path / LEDGER, {"x": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == [LEDGER]
    (tmp_path / "target.json.partial").symlink_to(tmp_path / "elsewhere.json")  # a planted link under the partial's name
    write_json_atomic(tmp_path / "target.json", {"x": 1})
    assert not (tmp_path / "elsewhere.json").exists() and json.loads((tmp_path / "target.json").read_text()) == {"x": 1}
    assert not (tmp_path / "target.json.partial").exists()


@pytest.mark.slow
def test_a_resume_with_another_vocabulary_keeps_the_runs_vocabulary(tmp_path, capsys):
    """A resume whose config changed is refused before the run's vocab.json is written again (it
    used to be replaced first, so the refused run no longer matched its own vocabulary)."""
    config, out = _config(tmp_path), tmp_path / "run"
    assert main(["train", "central", str(config), "--out", str(out), "--stop-after", "1", "--json"]) == 0
    capsys.readouterr()
    before = (out / WORD_VOCAB).read_bytes()
    assert main(["train", "central", str(config), "--out", str(out), "--set", "vocab.size=50", "--json"]) == 2
    assert "the config changed since this run started (vocab.size)" in _one_line_error(capsys)
    assert (out / WORD_VOCAB).read_bytes() == before
    RunDir(out).check_assets()
