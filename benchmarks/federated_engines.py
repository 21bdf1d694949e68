"""Federated engines side by side: client updates per second and overhead, Flower vs vectorized.

    .venv/bin/python benchmarks/federated_engines.py [--corpus shakespeare|synthetic|both]
        [--clients 100] [--rounds 5] [--model small] [--users-per-message 1,10,10:sum]
        [--supernodes 4] [--client-cpus 1] [--json]

For each corpus, one NWP experiment (FedAvg, ``--clients`` users per round, one local epoch of
batch 16 over at most 32 examples per user: small clients) is run by the vectorized engine and
by the Flower engine (once per ``--users-per-message`` value: ``K`` for K users per message,
``K:sum`` for K users per message with ``federated.sum_on_client``) in this one process, same
seed, same cohorts:

* client updates/s = cohort size / round wall time, over rounds 2.. (round 1 compiles);
* overhead = round wall time / sum of the cohort's isolated client compute times, where a
  client's isolated time is the jitted single-client update timed alone after warm-up, with its
  inputs already on the host;
* the ratio vectorized / Flower of client updates per second.

Flower's per-message cost (its simulation runtime's queues and polling, a Ray actor call each
way, the model serialized both ways) is paid once per message: ``users_per_message`` users in
one message pay it once together; with ``sum_on_client`` the reply carries one summed delta instead
of K (the stacked deltas are most of the bytes moved). Flower's simulation runtime hands each virtual SuperNode at
most one message per 0.1 s, so ``--supernodes`` N caps a round at 10 N messages per second.

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
from fedpriv.engines.setup import FederatedSetup  # noqa: E402
from fedpriv.runner.dispatch import train_run  # noqa: E402
from fedpriv.runner.prepare import prepare  # noqa: E402

SOURCES = {
    "shakespeare": "shakespeare",
    "synthetic": "synthetic:stackoverflow,users=3000,examples=1189700",
}


def experiment(corpus: str, clients: int, rounds: int, model: str, supernodes: int, client_cpus: float, users_per_message: int = 1, sum_on_client: bool = False) -> dict:
    return {
        "name": f"bench-{corpus}",
        "seed": 0,
        "data": {"source": SOURCES[corpus], "heldout_fraction": 0.0, "max_examples_per_user": 32},
        "vocab": {"size": 10000, "seq_len": 20},
        "task": {"kind": "nwp", "model": model},
        "federated": {
            "strategy": "fedavg", "rounds": rounds, "clients_per_round": clients, "local_epochs": 1,
            "local_batch_size": 16, "client_learning_rate": 0.3, "eval_every": 10_000, "chunk_size": 128,
            "flower": {"num_supernodes": supernodes, "client_num_cpus": client_cpus, "users_per_message": users_per_message, "sum_on_client": sum_on_client},
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


def bench(corpus: str, clients: int, rounds: int, model: str, workdir: Path, supernodes: int, client_cpus: float, groups: list[tuple[int, bool]]) -> dict:
    def exp(k: int = 1, summed: bool = False) -> dict:
        return experiment(corpus, clients, rounds, model, supernodes, client_cpus, k, summed)

    prepared = prepare(validate_config(exp()))
    setup = FederatedSetup(prepared)
    isolated = statistics.mean(isolated_client_seconds(setup, r) for r in range(2, rounds + 1))
    train_run(prepared, workdir / f"{corpus}-vec", engine="vectorized")
    vec = statistics.mean(round_seconds(workdir / f"{corpus}-vec")[1:])
    m = setup.core.m
    row = {
        "corpus": corpus,
        "users": setup.data.num_users,
        "clients_per_round": m,
        "model": model,
        "isolated_client_seconds_per_round": isolated,
        "vectorized_round_seconds": vec,
        "vectorized_updates_per_s": m / vec,
        "vectorized_overhead": vec / isolated,
        "flower": [],
    }
    for k, summed in groups:
        name = f"{corpus}-{k}{'-sum' if summed else ''}"
        train_run(prepare(validate_config(exp(k, summed))), workdir / f"{name}-flower", engine="flower")
        flw = statistics.mean(round_seconds(workdir / f"{name}-flower")[1:])
        row["flower"].append({
            "users_per_message": k,
            "sum_on_client": summed,
            "round_seconds": flw,
            "updates_per_s": m / flw,
            "overhead": flw / isolated,
            "vectorized_over_flower": flw / vec,
        })
    return row


def parse_run(value: str, ap: argparse.ArgumentParser) -> tuple[int, bool]:
    """``K`` or ``K:sum`` -> (K, sum_on_client)."""
    k, _, mode = value.strip().partition(":")
    if not k.isdigit() or int(k) < 1 or mode not in ("", "sum"):
        ap.error(f"--users-per-message: {value!r} is not K or K:sum with K >= 1")
    return int(k), mode == "sum"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", choices=["shakespeare", "synthetic", "both"], default="both")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", default="small")
    ap.add_argument("--supernodes", type=int, default=4, help="Flower: virtual SuperNodes (Flower's simulation runtime hands each at most one message per 0.1 s)")
    ap.add_argument("--users-per-message", default="1,10,10:sum", help="Flower runs, comma-separated: K (federated.users_per_message = K) or K:sum (and sum_on_client = true)")
    ap.add_argument("--client-cpus", type=float, default=1.0, help="Flower: CPUs per ClientApp actor")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.rounds < 2:
        ap.error("--rounds must be >= 2 (round 1 compiles and is not timed)")
    groups = [parse_run(v, ap) for v in args.users_per_message.split(",")]
    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    corpora = ["shakespeare", "synthetic"] if args.corpus == "both" else [args.corpus]
    with tempfile.TemporaryDirectory() as tmp:
        rows = [bench(c, args.clients, args.rounds, args.model, Path(tmp), args.supernodes, args.client_cpus, groups) for c in corpora]
    if args.json:
        print(json.dumps({"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "results": rows}, indent=1))
        return
    print(f"NWP {args.model}, FedAvg, {args.clients} clients/round, rounds 2..{args.rounds} timed, {os.cpu_count()} CPUs, "
          f"Flower: {args.supernodes} SuperNodes, {args.client_cpus:g} CPU per ClientApp actor")
    for r in rows:
        print(
            f"{r['corpus']:>11}: {r['users']} users | isolated client compute {r['isolated_client_seconds_per_round']:.2f} s/round | "
            f"vectorized {r['vectorized_updates_per_s']:.1f} updates/s (overhead {r['vectorized_overhead']:.2f}x)"
        )
        for f in r["flower"]:
            print(
                f"{'':>13}flower, {f['users_per_message']:>3} users/message{', summed' if f['sum_on_client'] else '        '}: "
                f"{f['updates_per_s']:.1f} updates/s (overhead {f['overhead']:.2f}x) | "
                f"vectorized/flower {f['vectorized_over_flower']:.1f}x"
            )


if __name__ == "__main__":
    main()
