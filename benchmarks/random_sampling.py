"""Random Sampling at the papers' scale: the reference against the fast exact path, over a full
90-canary audit of a trained Stack-Overflow-shaped LSTM.

    .venv/bin/python benchmarks/random_sampling.py [--candidates 2000000] [--reference-canaries 4]
        [--check-candidates 20000] [--model stackoverflow|tiny] [--canaries K] [--run-dir DIR]
        [--json] [--json-out PATH]

Model: the Stack Overflow baseline shape (embedding 96, LSTM 670, projection 96, 10,004 ids;
``--model tiny``: the demo's, embedding 16, LSTM 32, projection 16, 2,004 ids), trained centrally (Adam, 1,000 steps of 64 sentences) on a synthetic non-IID corpus (5,000 users,
100,000 sentences; fedpriv.data.synthetic) with Thakkar et al.'s 90 canaries planted by the
federated secret sharer. It is trained into --run-dir on the first run and reused after (a run
directory of this config, .benchmarks-out/rs-lstm[-tiny] by default; the time is printed when it
trains). ``--canaries K`` audits the first K canaries only (the demo audits 18 per run).

Per canary, N random suffixes are drawn exactly as ``fedpriv audit`` draws them, then timed:

* new: what the audit calls (:func:`fedpriv.memorization.rs_audit.audit_random_sampling`: the rank,
  and the full scores of the 100,000 rows the skew-normal fit reads), on all 90 canaries;
* reference: :func:`fedpriv.memorization.random_sampling.random_sampling` (every candidate scored,
  about 2 minutes per canary at 2M), on --reference-canaries of them (half memorized, half not,
  first in canary order), or all 90 with --reference-canaries 90 (hours).

Ranks (and lower counts and the canary's log-perplexity) must be identical: on the timed subset
at N, and on all 90 canaries at --check-candidates (timed too: both algorithms at the smaller N,
what the shipped experiments used before). Memorized = Random Sampling rank 1. The
machine is shared: the load average is printed, and only numbers from one run compare.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fedpriv.central.train import train_prepared_central  # noqa: E402
from fedpriv.config import validate_config  # noqa: E402
from fedpriv.memorization.lm import NWPStepper  # noqa: E402
from fedpriv.memorization.random_sampling import draw_suffixes, random_sampling  # noqa: E402
from fedpriv.memorization.rs_audit import audit_random_sampling, fit_rows  # noqa: E402
from fedpriv.memorization.rs_fast import fast_random_sampling  # noqa: E402
from fedpriv.runner.audit import load_run  # noqa: E402
from fedpriv.runner.prepare import prepare  # noqa: E402

EXPERIMENT = {
    "name": "rs-bench",
    "seed": 0,
    "data": {"source": "synthetic:users=5000,examples=100000", "heldout_fraction": 0.05},
    "vocab": {"size": 10000, "seq_len": 20},
    "task": {"kind": "nwp", "model": "stackoverflow"},
    "training": {"optimizer": "adam", "learning_rate": 0.002, "batch_size": 64, "steps": 1000, "eval_every": 500, "checkpoint_every": 500},
    "canaries": {},  # Thakkar et al.'s grid: 3 x 3 configurations x 10 canaries
}


SHAPES = {"stackoverflow": "Stack-Overflow-shaped", "tiny": "demo-shaped (tiny)"}


def trained_run(run_dir: Path, model: str) -> float | None:
    """Train the benchmark model into ``run_dir`` unless it is there; the seconds it took."""
    if (run_dir / "params.msgpack").is_file():
        return None
    experiment = {**EXPERIMENT, "task": {"kind": "nwp", "model": model}}
    if model == "tiny":
        experiment["vocab"] = {"size": 2000, "seq_len": 20}
    t = time.perf_counter()
    train_prepared_central(prepare(validate_config(experiment)), run_dir)
    return time.perf_counter() - t


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", type=int, default=2_000_000)
    ap.add_argument("--reference-canaries", type=int, default=4, help="canaries the reference is timed on (half memorized)")
    ap.add_argument("--check-candidates", type=int, default=20_000, help="N for the rank check on all canaries (0: skip)")
    ap.add_argument("--model", choices=sorted(SHAPES), default="stackoverflow")
    ap.add_argument("--canaries", type=int, default=0, help="audit the first K canaries only (0: all)")
    ap.add_argument("--run-dir", type=Path, help="default .benchmarks-out/rs-lstm (-tiny for the tiny model)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the summary")
    ap.add_argument("--json-out", type=Path, help="also write the JSON (with every canary's row) here")
    args = ap.parse_args()
    if args.run_dir is None:
        args.run_dir = Path(".benchmarks-out/rs-lstm" + ("-tiny" if args.model == "tiny" else ""))
    load = [os.getloadavg()[0]]

    train_seconds = trained_run(args.run_dir, args.model)
    prepared, params, _ = load_run(args.run_dir)
    cfg, manifest = prepared.config, prepared.canaries
    stepper = NWPStepper(prepared.task, params)
    pool = stepper.encode_words(manifest.pool)
    prefix_words, batch = cfg.audit.rs_prefix, cfg.audit.rs_batch
    canaries = [stepper.encode_words(c.words) for c in manifest.canaries]
    if args.canaries > 0:
        canaries = canaries[: args.canaries]

    def suffixes(i: int, n: int) -> np.ndarray:
        ids = canaries[i]
        return draw_suffixes(pool, manifest.weights, len(ids) - prefix_words, n, ids[prefix_words:], cfg.seed, i)

    # compile every shape once, off the clock
    warm = suffixes(0, 4096)
    audit_random_sampling(stepper, canaries[0], prefix_words, warm, batch, cfg.seed)
    random_sampling(stepper, canaries[0], prefix_words, warm, batch)

    rows, fit_scores = [], []
    for i in range(len(canaries)):
        suf = suffixes(i, args.candidates)
        t = time.perf_counter()  # what audit_random_sampling does, with the work statistics
        res, scores, stats = fast_random_sampling(stepper, canaries[i], prefix_words, suf, batch, score_rows=fit_rows(len(suf), cfg.seed))
        seconds = time.perf_counter() - t
        fit_scores.append(scores)
        print(f"new {i + 1}/{len(canaries)}: rank {res.rank:,}, {seconds:.1f} s", file=sys.stderr, flush=True)
        rows.append({"canary": manifest.canaries[i].id, "insertions": manifest.canaries[i].insertions, "rank": res.rank, "lower": res.lower, "log_perplexity": res.canary_log_perplexity, "new_seconds": seconds, "stats": stats.__dict__})
    load.append(os.getloadavg()[0])

    memorized = [r for r in rows if r["rank"] == 1]
    others = [r for r in rows if r["rank"] > 1]
    k = min(args.reference_canaries, len(rows))
    chosen = memorized[: k // 2] + others[: k - min(k // 2, len(memorized))]
    chosen = (chosen + [r for r in rows if r not in chosen])[:k]
    for r in chosen:
        i = next(j for j, x in enumerate(rows) if x is r)
        suf = suffixes(i, args.candidates)
        t = time.perf_counter()
        ref, ref_scores = random_sampling(stepper, canaries[i], prefix_words, suf, batch)
        r["reference_seconds"] = time.perf_counter() - t
        r["equal"] = (ref.rank, ref.lower, ref.canary_log_perplexity) == (r["rank"], r["lower"], r["log_perplexity"])
        print(f"reference {r['canary']}: rank {ref.rank:,}, {r['reference_seconds']:.1f} s", file=sys.stderr, flush=True)
        r["fit_scores_max_difference"] = float(np.max(np.abs(ref_scores[fit_rows(len(suf), cfg.seed)] - fit_scores[i])))
    load.append(os.getloadavg()[0])

    checked, check_ref, check_new = [], [], []
    if args.check_candidates > 0:
        for i in range(len(canaries)):
            suf = suffixes(i, args.check_candidates)
            t = time.perf_counter()
            want, _ = random_sampling(stepper, canaries[i], prefix_words, suf, batch)
            check_ref.append(time.perf_counter() - t)
            t = time.perf_counter()
            got, _ = audit_random_sampling(stepper, canaries[i], prefix_words, suf, batch, cfg.seed)
            check_new.append(time.perf_counter() - t)
            checked.append(got == want)
    load.append(os.getloadavg()[0])

    timed = [r for r in rows if "reference_seconds" in r]

    def summary(group: list[dict]) -> dict:
        ref = [r for r in group if "reference_seconds" in r]
        return {
            "canaries": len(group),
            "new_median_seconds": median([r["new_seconds"] for r in group]),
            "reference_timed": len(ref),
            "reference_median_seconds": median([r["reference_seconds"] for r in ref]),
            "ratio_on_the_same_canaries": median([r["reference_seconds"] / r["new_seconds"] for r in ref]),
        }

    out = {
        "device": jax.devices()[0].device_kind,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_1min": load,
        "candidates": args.candidates,
        "train_seconds": train_seconds,
        "new_total_seconds": sum(r["new_seconds"] for r in rows),
        "all": summary(rows),
        "memorized": summary(memorized),
        "not_memorized": summary(others),
        "reference_equal": f"{sum(r['equal'] for r in timed)}/{len(timed)}",
        "fit_scores_max_difference": max((r["fit_scores_max_difference"] for r in timed), default=None),
        "check_candidates": args.check_candidates,
        "check_equal": f"{sum(checked)}/{len(checked)}",
        "check_reference_median_seconds": median(check_ref),
        "check_new_median_seconds": median(check_new),
        "check_reference_total_seconds": sum(check_ref),
        "check_new_total_seconds": sum(check_new),
        "canaries": rows,
    }
    if args.json_out:
        args.json_out.write_text(json.dumps(out, indent=2))
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"Random Sampling, {len(rows)}-canary audit of a trained {SHAPES[args.model]} LSTM ({out['device']}, {out['cpus']} cpus), N = {args.candidates:,} per canary")
    if train_seconds is not None:
        print(f"  model trained in this run: {train_seconds:.0f} s")
    print(f"  load average (1 min) at start, after new, after reference, after check: {', '.join(f'{x:.1f}' for x in load)}")
    print(f"  new algorithm: {out['new_total_seconds']:.0f} s for all {len(rows)} canaries ({out['new_total_seconds'] / 60:.1f} min)")
    for name in ("all", "memorized", "not_memorized"):
        s = out[name]
        if not s["canaries"]:
            print(f"    {name.replace('_', '-'):14s}   0 canaries")
            continue
        line = f"    {name.replace('_', '-'):14s} {s['canaries']:3d} canaries, median {s['new_median_seconds']:.2f} s per canary"
        if s["reference_timed"]:
            line += f"; reference on {s['reference_timed']} of them: median {s['reference_median_seconds']:.1f} s, {s['ratio_on_the_same_canaries']:.0f}x slower"
        print(line)
    if k < len(rows):
        print(f"  the reference was timed on {len(timed)} of {len(rows)} canaries only; not all {len(rows)}")
    print(f"  ranks, lower counts and canary log-perplexities equal to the reference: {out['reference_equal']} timed canaries at N = {args.candidates:,}", end="")
    print(f"; {out['check_equal']} canaries at N = {args.check_candidates:,}" if checked else "")
    if timed:
        print(f"  scores of the rows the exposure fit reads: at most {out['fit_scores_max_difference']:.1e} nats from the reference's")
    if checked:
        print(
            f"  at N = {args.check_candidates:,} on all {len(checked)} canaries: reference median {out['check_reference_median_seconds']:.2f} s "
            f"(total {out['check_reference_total_seconds']:.0f} s), new median {out['check_new_median_seconds']:.2f} s (total {out['check_new_total_seconds']:.0f} s)"
        )


if __name__ == "__main__":
    main()
