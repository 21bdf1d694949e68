"""Benchmark: prepare an NWP experiment's data (load, split, vocabulary, encode) and report the
wall time, the CPU time and the peak resident memory. Not part of the test suite; run it by hand:

    .venv/bin/python benchmarks/prepare_data.py ../shared/data/arxiv-csai/abstracts.jsonl.gz \
        -o user_column=first_author -o text_column=abstract -o unit=sentence
    .venv/bin/python benchmarks/prepare_data.py synthetic:stackoverflow,examples=3424770

Target (issue 32): the arXiv corpus under 60 s and under 4 GB. ``--profile N`` prints the N
functions with the most own time (cProfile), which is how the hot spots were found.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import resource
import sys
import time

from fedpriv.cli.options import parse_options
from fedpriv.config import ExperimentConfig
from fedpriv.runner.prepare import prepare


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="a SOURCE spec (path or synthetic:...)")
    ap.add_argument("-o", "--option", action="append", default=[], help="loader option KEY=VALUE (repeatable)")
    ap.add_argument("--vocab", type=int, default=10_000)
    ap.add_argument("--seq-len", type=int, default=20)
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="print the N functions with the most own time")
    args = ap.parse_args()
    cfg = ExperimentConfig.model_validate({
        "name": "prepare-benchmark",
        "data": {"source": args.source, "options": parse_options(args.option), "heldout_fraction": 0.1, "validation_fraction": 0.1},
        "vocab": {"size": args.vocab, "seq_len": args.seq_len},
        "task": {"kind": "nwp", "model": "tiny"},
    })
    t0, c0 = time.perf_counter(), time.process_time()
    log = lambda m: print(f"[{time.perf_counter() - t0:7.1f}s] {m}", flush=True)  # noqa: E731
    prof = cProfile.Profile(time.process_time) if args.profile else None  # CPU time: robust on a busy machine
    if prof:
        prof.enable()
    p = prepare(cfg, log)
    if prof:
        prof.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 * 1024 if sys.platform == "darwin" else 1024)
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
    print(json.dumps({
        "source": args.source, "train_users": p.train.num_users, "train_examples": p.train.num_examples,
        "encoded_bytes": int(sum(v.nbytes for v in p.train_arrays.values())),
        "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "peak_rss_mb": round(rss),
    }))


if __name__ == "__main__":
    main()
