"""Benchmark and measurements of the local d_chi-privacy mechanisms (fedpriv.privacy.local).

Speed: tokens privatized per second by M_txt and the Vickrey mechanism (and the M_rep noise
alone) over a random 10,000-word table of dimension 96 and 300, at several batch sizes. The first
call of each shape compiles and is not timed (one warm-up call); each measurement is the best of
``--repeats`` calls. Not part of the test suite:

    .venv/bin/python benchmarks/local_privacy.py                       # speed, 10,000 x 96 and x 300
    .venv/bin/python benchmarks/local_privacy.py --dims 96 --batches 1024,16384

Measurements (--measure): plausible deniability statistics (Qu et al. 2021, sec. 5.3) and the
token embedding inversion accuracy (sec. 5.4) on an embedding space, as JSON, plus the N_w / S_w
plot:

    .venv/bin/python benchmarks/local_privacy.py --measure --embeddings RUN_DIR_or_GLOVE.txt \\
        --etas 5,10,20,40,80 --sample 300 --trials 1000 --plot pd.png
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

from fedpriv.privacy.local.mechanisms import TokenIndex, privatize_tokens, sample_noise, vickrey_tokens


def _best(fn, repeats: int) -> float:
    fn()  # compile and warm up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def speed(vocab: int, dims: list[int], batches: list[int], eta: float, t: float, repeats: int) -> list[dict]:
    rows = []
    rng = np.random.default_rng(0)
    key = jax.random.key(0)
    for dim in dims:
        table = rng.normal(size=(vocab, dim)).astype(np.float32)
        index = TokenIndex(table)
        for batch in batches:
            ids = rng.integers(0, vocab, batch)
            for name, fn in (
                ("noise (M_rep)", lambda: sample_noise(key, batch, dim, eta)),
                ("txt", lambda: privatize_tokens(key, ids, index, eta)),
                ("vickrey", lambda: vickrey_tokens(key, ids, index, eta, t)),
            ):
                sec = _best(fn, repeats)
                row = {"vocab": vocab, "dim": dim, "batch": batch, "mechanism": name, "seconds": sec, "tokens_per_second": batch / sec}
                rows.append(row)
                print(f"{vocab:>6} x {dim:<4} batch {batch:>6}  {name:<14} {batch / sec:>12,.0f} tokens/s  ({sec * 1e3:.1f} ms)", flush=True)
    return rows


def measure(args: argparse.Namespace) -> dict:
    from fedpriv.data.sources import open_corpus
    from fedpriv.privacy.local.measure import corpus_words, plausible_deniability, plot_deniability, token_inversion
    from fedpriv.runner.embeddings import load_embeddings

    space = load_embeddings(args.embeddings, args.max_words, lambda m: print(m, file=sys.stderr), pieces=True)
    etas = [float(e) for e in args.etas.split(",")]
    key = jax.random.key(args.seed)
    out: dict = {"embeddings": space.describe(), "etas": etas}
    t0 = time.perf_counter()
    pd = plausible_deniability(key, space, etas, trials=args.trials, sample=args.sample, log=lambda m: print(m, file=sys.stderr))
    out["plausible_deniability"] = pd.to_json()
    out["plausible_deniability_seconds"] = time.perf_counter() - t0
    if args.vickrey_t is not None:
        pdv = plausible_deniability(key, space, etas, trials=args.trials, mechanism="vickrey", t=args.vickrey_t, sample=args.sample)
        out["plausible_deniability_vickrey"] = pdv.to_json()
    if args.plot:
        plot_deniability(pd, args.plot)
    words = corpus_words(open_corpus(args.corpus))
    inv = token_inversion(key, space, words, etas, max_tokens=args.inversion_tokens)
    out["inversion"] = inv.to_json()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--vocab", type=int, default=10_000)
    ap.add_argument("--dims", default="96,300")
    ap.add_argument("--batches", default="256,4096,65536")
    ap.add_argument("--eta", type=float, default=10.0)
    ap.add_argument("--t", type=float, default=0.5, help="Vickrey t")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="Also write the results to this JSON file.")
    ap.add_argument("--measure", action="store_true", help="Plausible deniability and inversion instead of speed.")
    ap.add_argument("--embeddings", help="--measure: an NWP or BERT run directory, or a GloVe-style text file.")
    ap.add_argument("--max-words", type=int, default=None)
    ap.add_argument("--etas", default="5,10,20,40,80")
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--sample", type=int, default=300, help="Tokens measured (a random sample of the regular words).")
    ap.add_argument("--vickrey-t", type=float, default=None, help="Also measure the Vickrey mechanism at this t.")
    ap.add_argument("--corpus", default="shakespeare", help="Corpus of the inversion attack.")
    ap.add_argument("--inversion-tokens", type=int, default=20_000)
    ap.add_argument("--plot", help="Write the N_w / S_w plot here (PNG).")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPU cores", file=sys.stderr)
    if args.measure:
        if not args.embeddings:
            ap.error("--measure needs --embeddings")
        result = measure(args)
        print(json.dumps(result, indent=1))
    else:
        result = {"speed": speed(args.vocab, [int(d) for d in args.dims.split(",")], [int(b) for b in args.batches.split(",")], args.eta, args.t, args.repeats)}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
