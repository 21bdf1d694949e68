"""Federated engines side by side: client updates per second and overhead, Flower vs vectorized.

    .venv/bin/python benchmarks/federated_engines.py [--corpus shakespeare|synthetic|both]
        [--clients 100] [--rounds 3] [--model small] [--json]

For each corpus, one NWP experiment (FedAvg, ``--clients`` users per round, one local epoch of
batch 16 over at most 32 examples per user: small clients) is run by BOTH engines in this one
process, same seed, same cohorts:

* client updates/s = cohort size / round wall time, over rounds 2.. (round 1 compiles);
* overhead = round wall time / sum of the cohort's isolated client compute times, where a
  client's isolated time is the jitted single-client update (as the ClientApp runs it) timed
  alone after warm-up, with its inputs already on the host;
* the ratio vectorized / Flower of client updates per second.

The synthetic corpus is Stack-Overflow-shaped (the preset's lognormal user sizes and vocabulary
statistics) with 3,000 users. The machine is shared; compare ratios from one run, not absolute
times across runs. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fedpriv.clients.data import next_power_of_two  # noqa: E402
from fedpriv.clients.update import client_key, make_client_update  # noqa: E402
from fedpriv.config import validate_config  # noqa: E402
from fedpriv.engines.rounds import FederatedSetup  # noqa: E402
from fedpriv.pipeline import prepare  # noqa: E402

SOURCES = {
    "shakespeare": "shakespeare",
    "synthetic": "synthetic:stackoverflow,users=3000,examples=1189700",
}


def experiment(corpus: str, clients: int, rounds: int, model: str, supernodes: int, client_cpus: float) -> dict:
    return {
        "name": f"bench-{corpus}",
        "seed": 0,
        "data": {"source": SOURCES[corpus], "heldout_fraction": 0.0, "max_examples_per_user": 32},
        "vocab": {"size": 10000, "seq_len": 20},
        "task": {"kind": "nwp", "model": model},
        "federated": {
            "strategy": "fedavg", "rounds": rounds, "clients_per_round": clients, "local_epochs": 1,
            "local_batch_size": 16, "client_learning_rate": 0.3, "eval_every": 10_000, "num_supernodes": supernodes,
            "client_num_cpus": client_cpus, "chunk_size": 128,
        },
    }


def isolated_client_seconds(setup: FederatedSetup, round_: int) -> float:
    """Sum over round ``round_``'s cohort of one jitted client update each, timed alone."""
    update = jax.jit(make_client_update(setup.task, setup.fcfg.client_learning_rate))
    params = setup.initial_params()
    total = 0.0
    for u in setup.core.sampler.sample(round_):
        u = int(u)
        plan = setup.plan(u, round_)
        batches, mask = setup.data.batches(u, plan, next_power_of_two(len(plan)))
        key = client_key(setup.seed, round_, u)
        jax.block_until_ready(update(params, batches, mask, key))  # compile / warm
        t0 = time.perf_counter()
        jax.block_until_ready(update(params, batches, mask, key))
        total += time.perf_counter() - t0
    return total


def round_seconds(run_dir: Path) -> list[float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["round_seconds"] for r in rows if r.get("split") == "train"]


def bench(corpus: str, clients: int, rounds: int, model: str, workdir: Path, supernodes: int, client_cpus: float) -> dict:
    from fedpriv.engines.flower_sim import run_flower_simulation
    from fedpriv.engines.vectorized import run_vectorized

    cfg = validate_config(experiment(corpus, clients, rounds, model, supernodes, client_cpus))
    cfg_path = workdir / f"{corpus}.toml"
    cfg_path.write_text(_toml(experiment(corpus, clients, rounds, model, supernodes, client_cpus)))
    prepared = prepare(cfg)
    setup = FederatedSetup(prepared)
    isolated = statistics.mean(isolated_client_seconds(setup, r) for r in range(2, rounds + 1))
    run_vectorized(prepared, workdir / f"{corpus}-vec")
    vec = statistics.mean(round_seconds(workdir / f"{corpus}-vec")[1:])
    run_flower_simulation(cfg_path, workdir / f"{corpus}-flower")
    flw = statistics.mean(round_seconds(workdir / f"{corpus}-flower")[1:])
    m = setup.core.m
    return {
        "corpus": corpus,
        "users": setup.data.num_users,
        "clients_per_round": m,
        "model": model,
        "isolated_client_seconds_per_round": isolated,
        "vectorized_round_seconds": vec,
        "flower_round_seconds": flw,
        "vectorized_updates_per_s": m / vec,
        "flower_updates_per_s": m / flw,
        "vectorized_over_flower": flw / vec,
        "flower_overhead": flw / isolated,
        "vectorized_overhead": vec / isolated,
    }


def _toml(d: dict, prefix: str = "") -> str:
    """A tiny TOML writer for the benchmark's nested dict of scalars."""
    scalars = [f"{k} = {json.dumps(v)}" for k, v in d.items() if not isinstance(v, dict)]
    tables = [_toml(v, f"{prefix}{k}.") for k, v in d.items() if isinstance(v, dict)]
    head = f"[{prefix[:-1]}]\n" if prefix else ""
    return head + "\n".join(scalars) + "\n\n" + "".join(tables)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", choices=["shakespeare", "synthetic", "both"], default="both")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default="small")
    ap.add_argument("--supernodes", type=int, default=0, help="Flower: virtual SuperNodes (default: --clients)")
    ap.add_argument("--client-cpus", type=float, default=1.0, help="Flower: CPUs per ClientApp actor")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.rounds < 2:
        ap.error("--rounds must be >= 2 (round 1 compiles and is not timed)")
    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    corpora = ["shakespeare", "synthetic"] if args.corpus == "both" else [args.corpus]
    with tempfile.TemporaryDirectory() as tmp:
        rows = [bench(c, args.clients, args.rounds, args.model, Path(tmp), args.supernodes or args.clients, args.client_cpus) for c in corpora]
    if args.json:
        print(json.dumps({"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "results": rows}, indent=1))
        return
    print(f"NWP {args.model}, FedAvg, {args.clients} clients/round, rounds 2..{args.rounds} timed, {os.cpu_count()} CPUs")
    for r in rows:
        print(
            f"{r['corpus']:>11}: {r['users']} users | isolated client compute {r['isolated_client_seconds_per_round']:.2f} s/round | "
            f"vectorized {r['vectorized_updates_per_s']:.1f} updates/s (overhead {r['vectorized_overhead']:.2f}x) | "
            f"flower {r['flower_updates_per_s']:.1f} updates/s (overhead {r['flower_overhead']:.2f}x) | "
            f"vectorized/flower {r['vectorized_over_flower']:.1f}x"
        )


if __name__ == "__main__":
    main()
