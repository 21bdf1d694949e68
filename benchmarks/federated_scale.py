"""Scaling curves of the vectorized engine: time per round and peak memory against cohort size
and population size.

    .venv/bin/python benchmarks/federated_scale.py [--populations 1000,10000,arxiv,stackoverflow]
        [--cohorts 10,100,1000,5000] [--rounds 3] [--model tiny] [--strategy fedavg|dp-fedavg]
        [--max-examples 32] [--chunk-size 64] [--plot docs/federated_scale.png] [--json]

A population is the encoded rows of N users held as flat arrays (``ClientData``: one int32 row of
``seq_len + 1`` token ids per example, ``counts`` and ``offsets`` per user), with user sizes of a
real shape and random token ids (the engine's cost does not depend on which ids):

* ``N`` (a number): the ``synthetic:stackoverflow`` preset's lognormal example counts for N users
  (examples scaled to keep its 396.6 examples per user), each capped at ``--max-examples``;
* ``stackoverflow``: the same for the preset's 342,477 users;
* ``arxiv``: 56,229 users, one per first author of ``../shared/data/arxiv-csai/abstracts.jsonl.gz``,
  each with the sentences of its abstracts (split at ``. ``, ``? ``, ``! ``), capped likewise.
  The corpus's own loader is not used (the shape is read from the file); see docs/benchmarks.md.

The experiment is NWP (``--model`` LSTM, sequences of 20, vocabulary 10,000), one local epoch of
batch 16, FedAvg or DP-FedAvg (fixed sampling). Each population runs in its own process, so its
memory is its own. In it, for each cohort size: ``--warmup`` untimed rounds (compiling each
bucket's program), then ``--rounds`` timed rounds of :meth:`VectorizedEngine.round`:

* ``round_s``: the median wall time of a round; ``steps``: the cohort's real local steps per round
  (its work); ``ms_per_step``: round_s / steps;
* ``rss_data_mb``: resident memory once the population is built (the data, JAX, Python);
  ``data_mb``: the population's arrays themselves; ``rss_before_rounds_mb``: resident memory once
  the cohort's programs are compiled; ``peak_rounds_mb``: the peak resident memory during the
  timed rounds (the kernel's high-water mark, reset before them).

The machine is shared: compare ratios from one run, not absolute times across runs. Not part of
the test suite.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ARXIV = ROOT.parent / "shared" / "data" / "arxiv-csai" / "abstracts.jsonl.gz"
SO_USERS, SO_EXAMPLES = 342_477, 135_818_730
SEQ_LEN, VOCAB = 20, 10_000


def arxiv_counts(path: Path) -> np.ndarray:
    """Sentences per first author of the arXiv corpus (users in first-appearance order)."""
    per: dict[str, int] = {}
    split = re.compile(r"(?<=[.!?])\s+")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            text = " ".join(rec["abstract"].split())
            per[rec["first_author"]] = per.get(rec["first_author"], 0) + sum(1 for s in split.split(text) if s)
    return np.array(list(per.values()), np.int64)


def population_counts(name: str) -> tuple[np.ndarray, str]:
    """(examples per user before the cap, what the population is)."""
    from fedpriv.data.synthetic import parse_synthetic_spec, user_counts

    if name == "arxiv":
        if not ARXIV.exists():
            raise SystemExit(f"federated_scale: {ARXIV} not found (the arXiv population reads its shape from it)")
        return arxiv_counts(ARXIV), "arXiv cs.AI first authors (sentences per user from the corpus file)"
    users = SO_USERS if name == "stackoverflow" else int(name)
    examples = max(users, round(SO_EXAMPLES * users / SO_USERS))
    cfg = parse_synthetic_spec(f"synthetic:stackoverflow,users={users},examples={examples}")
    return user_counts(cfg), f"synthetic:stackoverflow shape, {users:,} users"


def build_population(name: str, max_examples: int, seed: int = 0) -> tuple[np.ndarray, dict, dict]:
    """(examples per user, the encoded rows, facts) of the population ``name`` (module docstring)."""
    raw, what = population_counts(name)
    counts = np.minimum(raw, max_examples)
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, VOCAB + 4, size=(int(counts.sum()), SEQ_LEN + 1), dtype=np.int32)
    arrays = {"ids": ids, "mask": np.ones(len(ids), np.float32)}
    info = {"population": name, "what": what, "users": int(len(counts)), "examples": int(counts.sum()),
            "examples_before_cap": int(raw.sum()), "data_mb": sum(v.nbytes for v in arrays.values()) / 2**20}
    return counts, arrays, info


def make_setup(counts: np.ndarray, arrays: dict, model: str, strategy: str, cohort: int, chunk: int | str, seed: int = 0, devices: int | None = None):
    """A FederatedSetup of the NWP experiment over a built population."""
    from fedpriv.config import validate_config
    from fedpriv.engines.setup import FederatedSetup
    from fedpriv.tasks.nwp import NWPTask
    from fedpriv.training.prepared import Prepared
    from fedpriv.vocab.word import WordVocab

    fed = {"rounds": 1000, "clients_per_round": cohort, "local_epochs": 1, "local_batch_size": 16, "client_learning_rate": 0.3,
           "chunk_size": chunk, "strategy": strategy, "eval_every": 1000, "devices": devices}
    if strategy == "dp-fedavg":
        fed.update(clip_norm=1.0, dp={"noise_multiplier": 1.0, "delta": 1e-6})
    cfg = validate_config({"name": "scale", "seed": seed, "data": {"source": "synthetic:small"}, "vocab": {"size": VOCAB, "seq_len": SEQ_LEN},
                           "task": {"kind": "nwp", "model": model}, "federated": fed})
    task = NWPTask(WordVocab([f"w{i}" for i in range(VOCAB)]), SEQ_LEN, model)

    class Users:  # what FederatedSetup reads of a corpus: the example count of each user
        def counts(self) -> np.ndarray:
            return counts

    return FederatedSetup(Prepared(cfg, Users(), {}, task, arrays, {}))  # type: ignore[arg-type]


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def proc_status(key: str) -> float:
    """VmRSS / VmHWM of this process in MiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak() -> bool:
    """Reset the kernel's resident high-water mark (Linux >= 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def warm_compile(setup, engine, params, m: int) -> None:
    """Compile every bucket's program before timing, at the widths a round of ``m`` users uses
    (scan: the round's one width; vmap: every power of two up to the chunk), by running one user
    of each bucket padded to that width, and the server's step (round 0; thrown away)."""
    import jax

    from fedpriv.clients.data import next_power_of_two

    f = setup.fcfg
    steps = setup.data.local_steps_of(np.arange(setup.data.num_users), f.local_epochs, f.local_batch_size, f.max_local_steps)
    buckets = np.array([next_power_of_two(int(x)) for x in np.maximum(steps, 1)])
    firsts = [int(np.flatnonzero(buckets == b)[0]) for b in np.unique(buckets)]
    if engine.mode == "scan":
        widths = [min(engine.chunk, m)]
    else:
        widths = [1 << i for i in range(engine.chunk.bit_length()) if 1 << i <= engine.chunk]
    state = setup.core.init_state(params)
    acc = setup.core.accumulator(state)
    for u in firsts:
        for w in widths:
            deltas, mask, _, _ = engine.cohort.deltas(params, np.array([u]), 0, w)
            acc.add(deltas, np.concatenate([setup.data.counts[[u]], np.zeros(w - 1, np.int64)]), mask)
    jax.block_until_ready(setup.core.finish_round(state, 0, acc))  # the server's aggregation and optimizer


def one_population(args: argparse.Namespace, name: str) -> dict:
    import jax

    from fedpriv.engines.vectorized import VectorizedEngine

    from fedpriv.clients.data import next_power_of_two

    t0 = time.perf_counter()
    counts, arrays, info = build_population(name, args.max_examples)
    out: dict = {"info": {**info, "build_s": time.perf_counter() - t0, "rss_data_mb": proc_status("VmRSS")}, "cohorts": []}
    chunk = args.chunk_size if args.chunk_size == "auto" else int(args.chunk_size)
    for m in (int(c) for c in args.cohorts.split(",")):
        if m > len(counts):
            continue
        setup = make_setup(counts, arrays, args.model, args.strategy, m, chunk, devices=args.devices)
        engine = VectorizedEngine(setup)
        state = setup.core.init_state(setup.initial_params())
        f = setup.fcfg
        warm_compile(setup, engine, state["params"], m)
        for r in range(1, args.warmup + 1):
            state, _ = engine.round(r, state)
        jax.block_until_ready(state)
        rss_before = proc_status("VmRSS")  # after compiling: the programs' memory is here
        reset_ok = reset_peak()
        times, steps, padded = [], [], []
        for r in range(args.warmup + 1, args.warmup + args.rounds + 1):
            cohort = setup.core.sampler.sample(r)
            # slots: client-steps computed or skipped, padding included (width x bucket per chunk)
            padded.append(sum(width * next_power_of_two(int(setup.data.local_steps_of(u, f.local_epochs, f.local_batch_size, f.max_local_steps).max()))
                              for u, width in engine.chunks(cohort)))
            t = time.perf_counter()
            state, info = engine.round(r, state)
            jax.block_until_ready(state)
            times.append(time.perf_counter() - t)
            steps.append(int(info["local_steps"]))
        round_s = statistics.median(times)
        out["cohorts"].append({
            "cohort": m, "chunk": engine.chunk, "rounds": args.rounds, "round_s": round_s, "round_s_all": times,
            "steps": statistics.mean(steps), "slots": statistics.mean(padded), "ms_per_step": 1e3 * round_s / statistics.mean(steps),
            "updates_per_s": m / round_s, "rss_before_rounds_mb": rss_before,
            "peak_rounds_mb": proc_status("VmHWM") if reset_ok else rss_mb(), "peak_reset": reset_ok,
        })
        del engine, setup, state
    out["backend"] = jax.default_backend()
    return out


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.2))
    for res in results:
        i = res["info"]
        rows = res["cohorts"]
        label = f"{i['population']} ({i['users']:,} users)"
        a.plot([r["cohort"] for r in rows], [r["round_s"] for r in rows], "o-", label=label)
        b.plot([r["steps"] for r in rows], [r["round_s"] for r in rows], "o-", label=label)
    a.set(xscale="log", yscale="log", xlabel="clients per round", ylabel="seconds per round", title="time per round vs cohort")
    b.set(xscale="log", yscale="log", xlabel="real local steps per round (the cohort's work)", ylabel="seconds per round", title="time per round vs work")
    users = [r["info"]["users"] for r in results]
    c.plot(users, [r["info"]["data_mb"] for r in results], "s--", label="the population's arrays")
    c.plot(users, [r["info"]["rss_data_mb"] for r in results], "o-", label="resident, population built")
    c.plot(users, [max(x["peak_rounds_mb"] for x in r["cohorts"]) for r in results], "^-", label="peak during rounds (largest cohort)")
    c.set(xscale="log", xlabel="training users (population)", ylabel="MiB", title="memory vs population")
    for ax in (a, b, c):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def table(results: list[dict]) -> str:
    """The results as a Markdown table. ``peak / data``: the peak during the rounds over the
    population's arrays; ``growth / data``: that peak less the same cohort's peak at the smallest
    population of the run (what the process costs whatever the population: Python, JAX, the
    compiled programs, one chunk's buffers), over the arrays added since (the population's own
    cost; 1 = memory grows by exactly the data)."""
    base = min(results, key=lambda r: r["info"]["users"]) if results else None
    base_peak = {r["cohort"]: r["peak_rounds_mb"] for r in base["cohorts"]} if base else {}
    lines = ["| population | users | examples | data MiB | resident MiB (built) | cohort | chunk | local steps/round | s/round | ms/step | updates/s | peak MiB (rounds) | peak / data | growth / data |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for res in results:
        i = res["info"]
        for r in res["cohorts"]:
            extra = i["data_mb"] - base["info"]["data_mb"]
            growth = (r["peak_rounds_mb"] - base_peak[r["cohort"]]) / extra if r["cohort"] in base_peak and extra > 1 else None
            lines.append(f"| {i['population']} | {i['users']:,} | {i['examples']:,} | {i['data_mb']:,.0f} | {i['rss_data_mb']:,.0f} | {r['cohort']:,} | {r['chunk']} | "
                         f"{r['steps']:,.0f} | {r['round_s']:.2f} | {r['ms_per_step']:.2f} | {r['updates_per_s']:.0f} | {r['peak_rounds_mb']:,.0f} | "
                         f"{r['peak_rounds_mb'] / i['data_mb']:.3g} | {'-' if growth is None else f'{growth:.2f}'} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--populations", default="1000,10000,arxiv,stackoverflow", help="comma-separated: a user count (Stack Overflow shape), arxiv, stackoverflow")
    ap.add_argument("--cohorts", default="10,100,1000,5000")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per cohort (the median is reported)")
    ap.add_argument("--warmup", type=int, default=0, help="untimed rounds before the timed ones (every bucket's program is compiled first anyway)")
    ap.add_argument("--model", default="tiny", help="NWP LSTM: tiny, small or stackoverflow")
    ap.add_argument("--strategy", choices=["fedavg", "dp-fedavg"], default="fedavg")
    ap.add_argument("--max-examples", type=int, default=32, help="cap on examples per user")
    ap.add_argument("--chunk-size", default="64", help="federated.chunk_size: a count or auto")
    ap.add_argument("--devices", type=int, default=None, help="federated.devices (default: every accelerator, one CPU)")
    ap.add_argument("--plot", default=None, help="write the plot here (PNG)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one population in this process
    ap.add_argument("--table-from", default=None, help="print the table of a JSON written by --json, and run nothing")
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one_population(args, args.one)))
        return
    if args.table_from:
        d = json.loads(Path(args.table_from).read_text())
        if args.plot:
            plot(d["results"], Path(args.plot))
        print(table(d["results"]))
        return
    results = []
    t0 = time.perf_counter()
    for name in args.populations.split(","):
        cmd = [sys.executable, __file__, "--one", name] + [a for a in sys.argv[1:] if a != "--json"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        if proc.returncode != 0:
            raise SystemExit(f"federated_scale: population {name} failed:\n{proc.stderr[-3000:]}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"[{time.perf_counter() - t0:.0f}s] {name} done", file=sys.stderr)
    meta = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "backend": results[0]["backend"] if results else None,
            "load_average": os.getloadavg(), "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "wall_s": time.perf_counter() - t0}
    if args.plot:
        plot(results, Path(args.plot))
    if args.json:
        print(json.dumps({"meta": meta, "results": results}, indent=1))
        return
    print(f"vectorized engine, NWP {args.model}, {args.strategy}, batch 16, 1 local epoch, <= {args.max_examples} examples/user; "
          f"backend {meta['backend']}, {meta['cpus']} CPUs, load average {meta['load_average'][0]:.1f}")
    print(table(results))


if __name__ == "__main__":
    main()
