"""Flower's built-in DP (``DifferentialPrivacyServerSideFixedClipping`` over ``FedAvg``) against
fedpriv's DP-FedAvg on the vectorized and the Flower engines. Runs in the project venv: flwr 1.41.0
is part of fedpriv's own stack, so Flower's strategy needs no environment of its own.

Same work on both sides: the same NWP task and corpus (N users, the whole population every round:
cohort m = N, so both sides train the same users; Flower's FedAvg samples nodes itself and could
not be made to pick fedpriv's cohort otherwise), the same client update (fedpriv's jitted local SGD,
called from a plain Flower ClientApp that returns the updated weights, as Flower's strategy
expects), the same clip S and noise multiplier z. Flower's simulation has one virtual SuperNode per
user (node ``partition-id`` = user), as Flower's own examples do.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import jax
import numpy as np

from fedpriv_side import ROOT  # noqa: F401  (puts the checkout on sys.path)

from fedpriv.engines.flower.simulation import single_threaded_scipy_blas  # noqa: E402

ROUND_TIMEOUT_S = 900.0


def experiment(users: int, rounds: int, model: str, z: float, S: float, strategy: str = "dp-fedavg") -> dict:
    fed = {
        "strategy": strategy, "rounds": rounds, "clients_per_round": users, "local_epochs": 1, "local_batch_size": 16,
        "client_learning_rate": 0.3, "eval_every": 10_000, "chunk_size": 128, "clip_norm": S, "flower": {"num_supernodes": 4},
    }
    if strategy == "dp-fedavg":
        fed["dp"] = {"noise_multiplier": z, "delta": 1e-5}
    return {
        "name": "bench-flower-dp", "seed": 0,
        "data": {"source": f"synthetic:stackoverflow,users={users},examples={users * 400}", "heldout_fraction": 0.0, "max_examples_per_user": 32},
        "vocab": {"size": 10000, "seq_len": 20},
        "task": {"kind": "nwp", "model": model},
        "federated": fed,
    }


def round_seconds(run_dir: Path) -> list[float]:
    import json

    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["round_seconds"] for r in rows if r.get("split") == "train"]


def run_builtin(cfg, users: int, rounds: int, z: float, S: float, initial_params) -> dict:
    """Flower's FedAvg + DifferentialPrivacyServerSideFixedClipping; per-round wall seconds and the final weights."""
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg
    from flwr.simulation import run_simulation

    from fedpriv.engines.flower.apps import ClientRuntime
    from fedpriv.engines.flower.strategy import params_to_record, record_to_params
    from fedpriv.runner.prepare import prepare

    runtimes: list = []

    client = ClientApp()

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        if not runtimes:  # fedpriv's client runtime, built once per actor: data, jitted update
            runtimes.append(ClientRuntime(cfg, prepare))
        rt = runtimes[0]
        s = rt.setup
        user = int(context.node_config["partition-id"])
        round_ = int(msg.content["config"]["server-round"])
        params = record_to_params(msg.content["arrays"], rt.template)
        deltas, _mask, _loss, _steps = rt.cohort.deltas(params, np.array([user]), round_, 1)
        new = jax.tree_util.tree_map(lambda p, d: p + d[0], params, deltas)
        return Message(RecordDict({"arrays": params_to_record(new), "metrics": MetricRecord({"num-examples": int(s.data.counts[user]), "dp-weight": 1.0})}), reply_to=msg)

    box: dict = {}

    class Timed(DifferentialPrivacyServerSideFixedClipping):
        def configure_train(self, server_round, arrays, config, grid):
            box.setdefault("start", {})[server_round] = time.perf_counter()
            return super().configure_train(server_round, arrays, config, grid)

        def aggregate_train(self, server_round, replies):
            out = super().aggregate_train(server_round, replies)
            box.setdefault("end", {})[server_round] = time.perf_counter()
            return out

    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        # The initial weights come from the main thread: no LAPACK work in this thread (see single_threaded_scipy_blas).
        init = params_to_record(initial_params)
        # Uniform weights (each reply's "dp-weight" is 1): the user-level sensitivity bound of the noise needs them (Flower's
        # own accountant interface insists on equal weights too); FedAvg's default "num-examples" weighting would not hold it.
        strategy = Timed(FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=users, min_available_nodes=users, weighted_by_key="dp-weight"), z, S, users)
        # A bounded wait: a ClientApp that never answers fails the round instead of waiting Flower's default hour.
        result = strategy.start(grid, init, num_rounds=rounds, timeout=ROUND_TIMEOUT_S)
        box["arrays"] = [a for a in result.arrays.to_numpy_ndarrays()]

    run_simulation(server_app=server, client_app=client, num_supernodes=users, backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0}})
    secs = [box["end"][r] - box["start"][r] for r in sorted(box["end"])]
    return {"round_seconds": secs, "arrays": box["arrays"]}


def bench(users: int, rounds: int, model: str, z: float, S: float, workdir: Path, log=print) -> dict:
    import json

    from fedpriv.config import validate_config
    from fedpriv.engines.setup import FederatedSetup
    from fedpriv.runner.dispatch import train_run
    from fedpriv.runner.prepare import prepare

    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    out: dict = {"flower_weighting": "uniform", "users": users, "clients_per_round": users, "rounds": rounds, "model": model, "noise_multiplier": z, "clip_norm": S}
    # 1. the same thing: one noise-free round (clip S, z = 0) by fedpriv (fedavg-clip, vectorized) and by Flower.
    d0 = experiment(users, 1, model, 0.0, S, strategy="fedavg-clip")
    prepared = prepare(validate_config(d0))
    counts = np.asarray(FederatedSetup(prepared).data.counts)
    out["example_counts"] = sorted(set(int(c) for c in counts))
    t = time.perf_counter()
    vec0 = train_run(prepared, workdir / "equiv-vec", engine="vectorized")
    log(f"[flower] fedpriv noise-free round: {time.perf_counter() - t:.1f} s")
    init_params = FederatedSetup(prepared).initial_params()
    t = time.perf_counter()
    with single_threaded_scipy_blas():
        b0 = run_builtin(prepared.config, users, 1, 0.0, S, init_params)
    log(f"[flower] Flower noise-free round: {time.perf_counter() - t:.1f} s")
    a = np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(vec0.params)])
    b = np.concatenate([np.ravel(x) for x in b0["arrays"]])
    init = np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree_util.tree_leaves(init_params)])
    out["equiv_update_norm"] = float(np.linalg.norm(a - init))
    out["equiv_max_abs_diff"] = float(np.max(np.abs(a - b)))
    out["equiv_rel_diff"] = float(np.linalg.norm(a - b) / max(np.linalg.norm(a - init), 1e-12))
    # 2. round times with noise: vectorized, fedpriv's Flower engine, Flower's built-in.
    d = experiment(users, rounds, model, z, S)
    prepared = prepare(validate_config(d))
    t = time.perf_counter()
    res = train_run(prepared, workdir / "dp-vec", engine="vectorized")
    out["vectorized_round_seconds"] = round_seconds(workdir / "dp-vec")
    out["fedpriv_epsilon"] = next((r["epsilon"] for r in reversed(res.history) if r.get("split") == "train"), None)
    log(f"[flower] fedpriv vectorized: {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    train_run(prepared, workdir / "dp-flower", engine="flower")  # runs scipy's OpenBLAS on one thread itself
    out["fedpriv_flower_round_seconds"] = round_seconds(workdir / "dp-flower")
    log(f"[flower] fedpriv flower engine: {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    with single_threaded_scipy_blas():
        out["builtin_round_seconds"] = run_builtin(prepared.config, users, rounds, z, S, FederatedSetup(prepared).initial_params())["round_seconds"]
    log(f"[flower] Flower built-in DP: {time.perf_counter() - t:.1f} s")
    try:
        out["fedpriv_ledger"] = json.loads((workdir / "dp-vec" / "privacy_ledger.json").read_text())
    except Exception:  # noqa: BLE001
        pass
    try:
        out["fedpriv_summary"] = json.loads(json.dumps(res.summary, default=str))
    except Exception:  # noqa: BLE001
        pass
    return out
