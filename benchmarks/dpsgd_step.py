"""DP-SGD step time against the non-private step, for the vmap reference and for fast clipping.

    .venv/bin/python benchmarks/dpsgd_step.py [--model nwp|ner|ner-crf|bert|all] [--batch 64] [--repeats 20]
        [--nwp-model stackoverflow|small|tiny] [--mechanism gaussian|blt|banded-mf|all] [--buffers 4]
        [--bands 4] [--json]

One step = gradient (non-private: of the mean loss; DP: per-example clipped sum + Gaussian noise
/ B) + an Adam update, each jitted as one function. The three variants are timed round-robin in
one run (the machine is shared: ratios measured side by side are what this reports; absolute
times drift); each timed call follows an untimed call of the same step, the steady state of a
training loop (the vmap reference frees about a gigabyte per BERT or NWP step, and a step timed
right after it would be charged for the page faults that follow). Prints examples per second
(the training throughput of each model, private and not) and the ratio DP / non-private for
each clipping. The CRF tagger has no fast path (its
transition parameters sit outside the recorded layers) and reports the reference only.

``--mechanism blt`` (or ``banded-mf``, ``all``) adds the DP step with correlated noise: the same
clipping (fast where the model has it, else the reference) and the same Z_t, turned into row t of
C^-1 Z by the streaming noising matrix of ``privacy/correlated.py`` with its state (BLT buffers
or bands - 1) carried from step to step, as ``central/dpsgd.py`` does. It prints the ratio of that
step to the Gaussian DP step with the same clipping, measured in the same round-robin, and the
noise state's memory: its arrays' bytes (buffers x the parameters' float32 bytes).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fedpriv.privacy.aggregate import correlated_noise_and_normalize, init_noise_state, noise_and_normalize  # noqa: E402
from fedpriv.privacy.clipping import fast_clipped_sum, reference_clipped_sum, supports_fast  # noqa: E402


def nwp_setup(batch: int, model: str = "stackoverflow"):
    from fedpriv.data.synthetic import load_synthetic
    from fedpriv.tasks.nwp import NWPTask
    from fedpriv.vocab.word import WordVocab

    corpus = load_synthetic("synthetic:small")
    texts = [e.text for _, exs in zip(range(60), corpus.users()) for e in exs[1]][: batch * 4]
    vocab = WordVocab.build(texts, 10_000)
    vocab = WordVocab(list(vocab.words) + [f"pad{i}" for i in range(10_000 - len(vocab.words))])
    task = NWPTask(vocab, 20, model)
    shape = "Stack Overflow shape: 96/670/96" if model == "stackoverflow" else f"{model} model"
    return task, task.encode([type("E", (), {"text": t})() for t in texts[:batch]]), f"NWP LSTM ({shape}, 10,004 ids), length 20"


def bert_setup(batch: int, max_len: int = 128):
    from collections import Counter

    from fedpriv.data.conll import iter_sentences
    from fedpriv.data.examples import TextExample
    from fedpriv.tasks.mlm import MLMTask
    from fedpriv.vocab.wordpiece import learn_wordpiece

    root = Path(__file__).resolve().parent.parent
    sents = [s for _, s in iter_sentences(root / "tests/data/ncbi-disease/train.tsv")]
    tok = learn_wordpiece(Counter(w.lower() for s in sents for w in s.tokens), 8000)
    task = MLMTask(tok, max_len=max_len, model="small", lowercase=True)
    texts, buf = [], []
    for s in sents:  # pack sentences into examples of about max_len pieces
        buf.extend(s.tokens)
        if len(buf) > max_len * 0.6:
            texts.append(TextExample(" ".join(buf)))
            buf = []
    return task, task.encode(texts[:batch]), f"BERT-small (4 layers, hidden 256, 4 heads) MLM, WordPiece 8,000, length {max_len}"


def ner_setup(batch: int, head: str = "softmax"):
    from fedpriv.data.conll import iter_sentences
    from fedpriv.tasks.ner import NERTask

    root = Path(__file__).resolve().parent.parent
    sents = [s for _, s in iter_sentences(root / "tests/data/wnut17/wnut17train.conll")]
    task = NERTask.from_examples(sents, head=head, dropout=0.0, max_len=48)
    return task, task.encode(sents[:batch]), f"BiLSTM tagger ({head} head; embedding 100 + case 16, BiLSTM 2x100), WNUT-17, length 48"


def make_steps(task, params, batch, mechanisms=()):
    """Jitted step functions ``(state, batch, key) -> (state, loss)``, state = (params, opt, noise),
    and the initial noise state of each (None for the steps without correlated noise)."""
    tx = optax.adam(1e-3)
    C, sigma, B = 1.0, 1.0, float(len(batch["mask"]))

    def sgd(state, batch, key):
        params, opt, noise = state
        loss, g = jax.value_and_grad(task.mean_loss)(params, batch, key, True)
        upd, opt = tx.update(g, opt, params)
        return (optax.apply_updates(params, upd), opt, noise), loss

    def dp(clip, matrix=None):
        def step(state, batch, key):
            params, opt, noise = state
            s, _, losses = clip(task, params, batch, key, C)
            if matrix is None:
                g = noise_and_normalize(s, jax.random.fold_in(key, 1), C, sigma, B)
            else:
                g, noise = correlated_noise_and_normalize(s, jax.random.fold_in(key, 1), C, sigma, B, matrix, noise)
            upd, opt = tx.update(g, opt, params)
            return (optax.apply_updates(params, upd), opt, noise), jnp.mean(losses)

        return step

    steps = {"non-private": sgd, "dp-reference (vmap)": dp(reference_clipped_sum)}
    ok, why = supports_fast(task, params, batch, jax.random.key(0))
    clip, gaussian = (fast_clipped_sum, "dp-fast (ghost + book-keeping)") if ok else (reference_clipped_sum, "dp-reference (vmap)")
    if ok:
        steps[gaussian] = dp(fast_clipped_sum)
    else:
        print(f"fast clipping not available: {why}", file=sys.stderr)
    noise0: dict = {k: None for k in steps}
    correlated = {}
    for mech, strategy in mechanisms:
        name = f"{gaussian.split(' ')[0]} + {strategy.describe().split(' (')[0]}"
        matrix = strategy.noising_matrix()
        if mech == "blt-jax-privacy":  # C^-1 as jax-privacy builds it (tensordot with diag(decay)), for comparison
            from jax_privacy.matrix_factorization import buffered_toeplitz

            name += ", jax-privacy's build_inverse"
            matrix = buffered_toeplitz.StreamingMatrixBuilder(buf_decay=np.asarray(strategy.buf_decay, np.float32), output_scale=np.asarray(strategy.output_scale, np.float32)).build_inverse()
        steps[name] = dp(clip, matrix)
        noise0[name] = init_noise_state(matrix, params)
        correlated[name] = {"mechanism": mech, "memory_arrays": strategy.memory, "gaussian_step": gaussian}
    return {k: jax.jit(v) for k, v in steps.items()}, tx, noise0, correlated


def tree_bytes(tree) -> int:
    return int(sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(tree)))


def bench(name: str, task, batch, repeats: int, mechanisms=()) -> dict:
    params = task.init_params(jax.random.key(0))
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    steps, tx, noise0, correlated = make_steps(task, params, batch, mechanisms)
    opt = tx.init(params)
    states = {k: (params, opt, noise0[k]) for k in steps}
    times: dict[str, list[float]] = {k: [] for k in steps}
    for k, fn in steps.items():  # compile and warm up; the noise state advances as in training
        for _ in range(2):
            states[k] = jax.block_until_ready(fn(states[k], batch, jax.random.key(1)))[0]
    compiles = {k: fn._cache_size() for k, fn in steps.items()}
    for r in range(repeats):
        for k, fn in steps.items():
            # Untimed call first: training repeats one step function, so time it in that steady
            # state. Without this, the step timed right after the vmap reference pays for the
            # reference's gigabyte of freed buffers (page faults), which the training loop never does.
            states[k] = jax.block_until_ready(fn(states[k], batch, jax.random.key(r)))[0]
            t = time.perf_counter()
            states[k] = jax.block_until_ready(fn(states[k], batch, jax.random.key(r)))[0]
            times[k].append(time.perf_counter() - t)
    for k, fn in steps.items():  # one compilation per step function: no retracing as the state advances
        if fn._cache_size() != 1:
            print(f"{k}: compiled {fn._cache_size()} times (after warm-up: {compiles[k]}): the timings include retracing", file=sys.stderr)
    b = len(batch["mask"])
    base = statistics.median(times["non-private"])
    rows = {}
    for k, ts in times.items():
        med = statistics.median(ts)
        rows[k] = {"median_s": med, "examples_per_s": b / med, "ratio_to_non_private": med / base, "compilations": steps[k]._cache_size()}
        if k in correlated:
            c = correlated[k]
            ratio = [t / g for t, g in zip(ts, times[c["gaussian_step"]])]  # paired: the same repeat
            rows[k].update(c, ratio_to_gaussian=med / statistics.median(times[c["gaussian_step"]]), paired_ratio_median=statistics.median(ratio),
                           noise_state_bytes=tree_bytes(states[k][2]), parameter_bytes=tree_bytes(params))
    return {"model": name, "batch": b, "repeats": repeats, "steps": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["nwp", "ner", "ner-crf", "bert", "all"], default="nwp")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--bert-batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--nwp-model", default="stackoverflow", help="the NWP LSTM's size: stackoverflow (default), small or tiny (CI)")
    ap.add_argument("--mechanism", choices=["gaussian", "blt", "banded-mf", "all"], default="gaussian",
                    help="add the DP step with correlated noise (privacy/correlated.py) and its ratio to the Gaussian DP step; "
                    "all: BLT, banded MF and BLT with jax-privacy's own C^-1")
    ap.add_argument("--buffers", type=int, default=4, help="BLT buffers (as [privacy] buffers)")
    ap.add_argument("--bands", type=int, default=4, help="banded-MF bands (as [privacy] bands)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    chosen = {"gaussian": [], "blt": ["blt"], "banded-mf": ["banded-mf"], "all": ["blt", "banded-mf", "blt-jax-privacy"]}[args.mechanism]
    if chosen:  # jax-privacy is imported only here: the Gaussian-only benchmark runs without it
        from fedpriv.privacy.correlated import make_strategy
    mechanisms = [(m, make_strategy(m.removesuffix("-jax-privacy"), bands=args.bands, buffers=args.buffers)) for m in chosen]
    results = []
    setups = {"nwp": lambda b: nwp_setup(b, args.nwp_model), "ner": ner_setup, "ner-crf": lambda b: ner_setup(b, "crf"), "bert": bert_setup}
    for m in (list(setups) if args.model == "all" else [args.model]):
        task, batch, name = setups[m](args.batch if m == "nwp" else args.bert_batch)
        results.append(bench(name, task, batch, args.repeats, mechanisms))
    meta = {"machine": platform.processor() or platform.machine(), "jax": jax.__version__, "backend": jax.default_backend(), "devices": jax.device_count()}
    if args.json:
        print(json.dumps({"meta": meta, "results": results}, indent=2))
        return
    print(f"backend {meta['backend']}, jax {meta['jax']}")
    for res in results:
        print(f"\n{res['model']}, batch {res['batch']}, median of {res['repeats']} round-robin repeats")
        for k, r in res["steps"].items():
            print(f"  {k:34s} {r['median_s'] * 1e3:8.1f} ms  {r['examples_per_s']:8.0f} examples/s  ratio {r['ratio_to_non_private']:.2f}")
        for k, r in res["steps"].items():
            if "ratio_to_gaussian" in r:
                print(f"  {k}: {r['ratio_to_gaussian']:.3f}x the Gaussian DP step (paired median {r['paired_ratio_median']:.3f}); noise state "
                      f"{r['noise_state_bytes'] / 2**20:.2f} MiB = {r['memory_arrays']} x {r['parameter_bytes'] / 2**20:.2f} MiB of parameters")


if __name__ == "__main__":
    main()
