"""Random Sampling throughput for the Stack-Overflow-shaped NWP LSTM, against the FLOP bound.

    .venv/bin/python benchmarks/random_sampling.py [--candidates 2000000] [--batch 512] [--json]

The model is the Stack Overflow baseline shape (embedding 96, LSTM 670, projection 96, 10,004
ids) with random parameters: the cost of scoring does not depend on what was learned. One canary
(5 words, 2-word prefix, 3-word suffixes) is scored against N random suffixes drawn uniformly from
the 10,000 words, exactly as ``fedpriv audit`` does.

FLOP bound: with shared prefixes, the candidates cost about one LSTM step, one projection and one
output layer each (their last word), plus the same for every distinct first word (at most V):
``F = (N + min(N, V)) * 2 * ((d_e + h) * 4h + h * d_p + d_p * V)``. The bound is F divided by the
rate of a large fp32 matmul measured in the same run (``--matmul-size`` square, jitted). The
report prints candidates per second, the time for the canary, the bound, and their ratio (the
issue's target: within 2x). The machine is shared: only numbers from one run compare.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fedpriv.memorization.lm import NWPStepper  # noqa: E402
from fedpriv.memorization.random_sampling import draw_suffixes, random_sampling  # noqa: E402
from fedpriv.tasks.nwp import NWPTask  # noqa: E402
from fedpriv.vocab.word import WordVocab  # noqa: E402


def matmul_rate(n: int, repeats: int = 5) -> float:
    """FLOP/s of an n x n fp32 matmul (best of ``repeats``), jitted."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    f = jax.jit(lambda x, y: x @ y)
    f(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2.0 * n**3 / best


def candidate_flops(embed: int, hidden: int, proj: int, vocab: int) -> float:
    return 2.0 * ((embed + hidden) * 4 * hidden + hidden * proj + proj * vocab)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", type=int, default=2_000_000)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--matmul-size", type=int, default=2048)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    words = [f"w{i}" for i in range(10_000)]
    task = NWPTask(WordVocab(words), seq_len=20, model="stackoverflow")
    stepper = NWPStepper(task, task.init_params(jax.random.key(0)))
    cfg = task.cfg
    pool = stepper.word_ids()
    canary = pool[np.random.default_rng(0).choice(len(pool), 5)]
    suffixes = draw_suffixes(pool, None, 3, args.candidates, canary[2:], seed=0, canary_index=0)
    # compile every shape once (a small run with the same batch size), then time the real one
    random_sampling(stepper, canary, 2, suffixes[: args.batch + 1], args.batch)
    rate_before = matmul_rate(args.matmul_size)
    t = time.perf_counter()
    result, _ = random_sampling(stepper, canary, 2, suffixes, args.batch)
    seconds = time.perf_counter() - t
    rate_after = matmul_rate(args.matmul_size)
    rate = max(rate_before, rate_after)
    n = args.candidates + 1
    flops = (n + min(n, len(pool))) * candidate_flops(cfg.embed_dim, cfg.lstm_units, cfg.projection_dim, cfg.vocab_size)
    bound = flops / rate
    out = {
        "device": jax.devices()[0].device_kind,
        "platform": platform.platform(),
        "candidates": args.candidates,
        "batch": args.batch,
        "seconds_per_canary": seconds,
        "candidates_per_second": n / seconds,
        "mflop_per_candidate": candidate_flops(cfg.embed_dim, cfg.lstm_units, cfg.projection_dim, cfg.vocab_size) / 1e6,
        "tflop_per_canary": flops / 1e12,
        "matmul_gflops": rate / 1e9,
        "flop_bound_seconds": bound,
        "ratio_to_bound": seconds / bound,
        "rank": result.rank,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"Random Sampling, Stack-Overflow NWP LSTM ({out['device']}), one canary against {args.candidates:,} suffixes")
    print(f"  {out['candidates_per_second']:,.0f} candidates/s; {seconds:.1f} s per canary")
    print(f"  {out['mflop_per_candidate']:.2f} MFLOP per candidate, {out['tflop_per_canary']:.2f} TFLOP per canary")
    print(f"  fp32 matmul {args.matmul_size}^2 in this run: {out['matmul_gflops']:.0f} GFLOP/s -> FLOP bound {bound:.1f} s")
    print(f"  ratio to the FLOP bound: {out['ratio_to_bound']:.2f}x (target <= 2x)")


if __name__ == "__main__":
    main()
