"""Central trainer: batch orders, optimizers, evaluation, and exact resume from a checkpoint."""

import json
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from fedpriv.central.order import BatchSchedule, epoch_order
from fedpriv.central.train import train_central
from fedpriv.config import TrainingConfig
from fedpriv.data.shakespeare import load_shakespeare
from fedpriv.errors import FedprivError
from fedpriv.runner.prepare import encode_corpus
from fedpriv.tasks.nwp import NWPTask
from fedpriv.training.loop import evaluate
from fedpriv.vocab.word import WordVocab


def test_iid_order_is_a_permutation_and_noniid_keeps_users_contiguous():
    counts = np.array([3, 1, 4, 2])
    iid = epoch_order(counts, "iid", seed=0, epoch=0)
    assert sorted(iid.tolist()) == list(range(10))
    non = epoch_order(counts, "noniid", seed=0, epoch=0)
    assert sorted(non.tolist()) == list(range(10))
    offsets = np.concatenate([[0], np.cumsum(counts)])
    owner = np.searchsorted(offsets, non, side="right") - 1
    runs = [owner[0]] + [b for a, b in zip(owner, owner[1:]) if a != b]
    assert sorted(runs) == [0, 1, 2, 3]  # each user appears in exactly one contiguous run
    for u in range(4):
        pos = np.flatnonzero(owner == u)
        assert non[pos].tolist() == list(range(offsets[u], offsets[u + 1]))  # in source order
    assert epoch_order(counts, "iid", 0, 1).tolist() != iid.tolist()
    assert epoch_order(counts, "iid", 0, 0).tolist() == iid.tolist()


def test_schedule_covers_each_epoch_once():
    s = BatchSchedule(np.array([5, 5, 3]), "iid", seed=1, batch_size=4)
    assert s.steps_per_epoch == 4
    epoch0 = np.concatenate([s.indices(k) for k in range(4)])
    assert sorted(epoch0.tolist()) == list(range(13)) and len(s.indices(3)) == 1
    epoch1 = np.concatenate([s.indices(k) for k in range(4, 8)])
    assert sorted(epoch1.tolist()) == list(range(13)) and epoch1.tolist() != epoch0.tolist()


@pytest.fixture(scope="module")
def small_setup():
    corpus = load_shakespeare().with_min_examples(30)
    train, held = corpus.split_heldout_users(0.2)
    vocab = WordVocab.build((e.text for e in train.records()), 300)
    task = NWPTask(vocab, seq_len=10, model="tiny")
    return task, encode_corpus(task, train), train.counts(), {"heldout": encode_corpus(task, held)}


def cfg(**kw):
    base = dict(optimizer="adam", learning_rate=3e-3, batch_size=16, steps=24, eval_every=8, checkpoint_every=5, order="noniid")
    base.update(kw)
    return TrainingConfig(**base)


def test_training_lowers_heldout_loss(small_setup, tmp_path):
    task, arrays, counts, evals = small_setup
    before = evaluate(task, task.init_params(jax.random.split(jax.random.key(0))[0]), evals["heldout"], 256)
    res = train_central(task, arrays, counts, cfg(steps=120, eval_every=60), 0, tmp_path, eval_sets=evals)
    assert res.final_eval["loss"] < before["loss"] - 0.5
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["split"]) for r in rows] == [(60, "train"), (60, "heldout"), (120, "train"), (120, "heldout")]
    assert (tmp_path / "params.msgpack").is_file() and (tmp_path / "config.json").is_file()


@pytest.mark.parametrize("optimizer, order", [("sgd", "iid"), ("momentum", "noniid"), ("adam", "iid")])
def test_resume_after_a_stop_equals_an_uninterrupted_run(small_setup, tmp_path, optimizer, order):
    task, arrays, counts, evals = small_setup
    c = cfg(optimizer=optimizer, order=order, learning_rate=0.05 if optimizer != "adam" else 3e-3, schedule="cosine")
    full = train_central(task, arrays, counts, c, 7, tmp_path / "full", eval_sets=evals)
    part = train_central(task, arrays, counts, c, 7, tmp_path / "resumed", eval_sets=evals, stop_after=13)
    assert part.done == 13
    meta = json.loads((tmp_path / "resumed" / "checkpoint.json").read_text())
    assert meta["step"] == 13
    rest = train_central(task, arrays, counts, c, 7, tmp_path / "resumed", eval_sets=evals)
    assert rest.done == 24
    for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(rest.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert (tmp_path / "full" / "metrics.jsonl").read_text() == (tmp_path / "resumed" / "metrics.jsonl").read_text()


def test_different_seeds_differ_same_seed_repeats(small_setup, tmp_path):
    task, arrays, counts, _ = small_setup
    a = train_central(task, arrays, counts, cfg(steps=6), 1, tmp_path / "a")
    b = train_central(task, arrays, counts, cfg(steps=6), 1, tmp_path / "b")
    c = train_central(task, arrays, counts, cfg(steps=6), 2, tmp_path / "c")
    la, lb, lc = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(r.params)]) for r in (a, b, c))
    np.testing.assert_array_equal(la, lb)
    assert not np.array_equal(la, lc)


def test_steps_or_epochs_must_be_given_once(small_setup, tmp_path):
    task, arrays, counts, _ = small_setup
    with pytest.raises(FedprivError, match="exactly one of steps or epochs"):
        train_central(task, arrays, counts, cfg(steps=None), 0, tmp_path)
    with pytest.raises(FedprivError, match="user_counts"):
        train_central(task, arrays, counts[:-1], cfg(), 0, tmp_path)


@pytest.mark.slow
def test_killed_cli_run_resumes_to_the_same_result(tmp_path, capsys):
    """A real SIGKILL in the middle of `fedpriv train central`, then the same command again; the
    uninterrupted reference is the same command run in this process (a third interpreter
    importing JAX would cost seconds; the command's files must not depend on the process)."""
    config = tmp_path / "exp.toml"
    config.write_text(
        'name = "resume"\nseed = 3\n[data]\nsource = "shakespeare"\nmin_examples = 40\n'
        '[vocab]\nsize = 500\nseq_len = 12\n[task]\nkind = "nwp"\nmodel = "tiny"\n'
        '[training]\nbatch_size = 16\nsteps = 400\neval_every = 100\ncheckpoint_every = 25\n'
    )
    cmd = [sys.executable, "-m", "fedpriv.cli", "train", "central", str(config), "--json"]
    from fedpriv.cli import main

    assert main([*cmd[3:], "--out", str(tmp_path / "full")]) == 0
    full = capsys.readouterr().out
    run = tmp_path / "killed"
    proc = subprocess.Popen([*cmd, "--out", str(run)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline:
        meta = run / "checkpoint.json"
        if meta.exists() and json.loads(meta.read_text())["step"] >= 100:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = json.loads((run / "checkpoint.json").read_text())["step"]
    assert 100 <= killed_at < 400, killed_at
    again = subprocess.run([*cmd, "--out", str(run)], capture_output=True, text=True, check=True)
    assert json.loads(again.stdout)["final_perplexity"] == json.loads(full)["final_perplexity"]
    assert [k for k in json.loads(full) if k.endswith("unigram_perplexity")]  # the baseline, printed for a run without DP
    assert (run / "metrics.jsonl").read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()
    assert (run / "params.msgpack").read_bytes() == (tmp_path / "full" / "params.msgpack").read_bytes()


def test_a_stopped_run_summary_counts_the_steps_trained(tmp_path, capsys):
    """`--stop-after 3` with train rows logged at evaluations every 10 steps: the summary says 3 (it said 0, from
    the last train row), and the resumed run's says all of them."""
    from fedpriv.cli import main

    config = tmp_path / "exp.toml"
    config.write_text(
        'name = "stopped"\nseed = 3\n[data]\nsource = "shakespeare"\nmin_examples = 40\n'
        '[vocab]\nsize = 200\nseq_len = 8\n[task]\nkind = "nwp"\nmodel = "tiny"\n'
        '[training]\nbatch_size = 8\nsteps = 5\neval_every = 10\ncheckpoint_every = 1\n'
    )
    out = ["--out", str(tmp_path / "run"), "--json"]
    assert main(["train", "central", str(config), "--stop-after", "3", *out]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["steps"] == 3
    assert main(["train", "central", str(config), *out]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 5
