"""Benchmark: build a synthetic corpus, sample users uniformly, materialize their examples.

Target (stackoverflow preset, 5,000 users): under 60 s in total and under 2 GB peak RSS on a
2-core machine. Not part of the test suite; run it by hand:

    .venv/bin/python benchmarks/synthetic_corpus.py --preset stackoverflow --users-to-sample 5000 --seed 0
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

from fedpriv.data.corpus import FederatedCorpus
from fedpriv.data.synthetic import PRESETS, SyntheticStore, parse_synthetic_spec

TARGET_SECONDS = 60.0
TARGET_RSS_MB = 2048.0


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MB (ru_maxrss is KB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024.0 * 1024.0) if sys.platform == "darwin" else rss / 1024.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="stackoverflow", help=f"a preset ({', '.join(PRESETS)}) or a full synthetic spec")
    ap.add_argument("--users-to-sample", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0, help="seed of the user sample (the corpus seed is in the spec)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args(argv)

    spec = args.preset if ":" in args.preset else f"synthetic:{args.preset}"
    t0 = time.perf_counter()
    cfg = parse_synthetic_spec(spec)
    corpus = FederatedCorpus(SyntheticStore(cfg), cfg.spec())
    counts = corpus.counts()
    t_build = time.perf_counter() - t0

    t1 = time.perf_counter()
    sample = corpus.sample_users(args.users_to_sample, args.seed)
    users = examples = tokens = 0
    for _, exs in sample.users():
        users += 1
        examples += len(exs)
        tokens += sum(ex.text.count(" ") + 1 for ex in exs)
    t_sample = time.perf_counter() - t1

    total_s = t_build + t_sample
    rss = peak_rss_mb()
    result = {
        "spec": cfg.spec(),
        "corpus_users": int(len(counts)),
        "corpus_examples": int(counts.sum()),
        "build_s": round(t_build, 3),
        "sample_materialize_s": round(t_sample, 3),
        "total_s": round(total_s, 3),
        "users": users,
        "examples": examples,
        "tokens": tokens,
        "examples_per_s": round(examples / t_sample, 1) if t_sample > 0 else None,
        "peak_rss_mb": round(rss, 1),
        "cpus": os.cpu_count(),
        "time_target_met": total_s < TARGET_SECONDS,
        "rss_target_met": rss < TARGET_RSS_MB,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"corpus            {result['spec']}: {result['corpus_users']:,} users, {result['corpus_examples']:,} examples")
        print(f"build (counts)    {t_build:8.2f} s")
        print(f"sample+materialize{t_sample:8.2f} s  ({users:,} users, {examples:,} examples, {tokens:,} tokens)")
        print(f"total             {total_s:8.2f} s  (target < {TARGET_SECONDS:.0f} s: {'met' if result['time_target_met'] else 'NOT met'})")
        print(f"peak RSS          {rss:8.1f} MB (target < {TARGET_RSS_MB:.0f} MB: {'met' if result['rss_target_met'] else 'NOT met'})")
    return 0 if result["time_target_met"] and result["rss_target_met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
