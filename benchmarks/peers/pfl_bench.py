"""fedpriv against pfl-research (project venv side of run.py's ``pfl`` section).

The same work on both sides: the NWP task on a ``synthetic:stackoverflow`` population of ``users``
(at most 32 examples each, vocabulary 10,000, sequences of 20), the same cohorts (fedpriv's
fixed-size sampler's, exported to the peer), the same initial weights, one local epoch of SGD at
0.3 over batches of 16, server SGD 1.0; FedAvg weighted by example counts, DP-FedAvg with
uniform weights, clip S and noise multiplier z on the sum, divided by m.

1. ``equivalence``: one round from the same weights on round 1's cohort of 100, fedpriv
   (vectorized engine) and pfl, each user's batches in fedpriv's round-1 order: ``fedavg`` and
   ``fedavg-clip`` (DP-FedAvg without noise) at S and S / 10; ||fedpriv - pfl|| / ||fedpriv's
   update|| of the new weights.
2. ``timing``: for each cohort m and each of FedAvg and DP-FedAvg, fedpriv's programs compiled
   (``federated_scale.warm_compile``: one user per bucket) and, at the first cohort, one untimed pfl
   round (torch's first calls), then ``repeats`` alternating blocks of ``rounds`` rounds
   (fedpriv's, then pfl's, on the same rounds' cohorts): client updates per second = m / median
   round seconds; peak resident memory of each process during its blocks (``VmHWM`` reset
   before each block; the driver's includes everything it holds: the corpus, JAX, this section).
3. ``flower``: fedpriv's Flower engine, one user per message (each user's update one Flower
   message to a ClientApp, as Flower is used), FedAvg, the same cohorts, ``rounds + 1`` rounds,
   round 1 (the actors' data preparation, compilation) left out.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

import jax
import numpy as np

from fedpriv_side import export_nwp  # noqa: E402  (puts the checkout and benchmarks/ on sys.path)
from federated_scale import proc_status, reset_peak, warm_compile  # noqa: E402

from fedpriv.config import validate_config  # noqa: E402
from fedpriv.engines.setup import FederatedSetup  # noqa: E402
from fedpriv.engines.vectorized import VectorizedEngine  # noqa: E402

CLIP, Z = 0.5, 1.0


def experiment(users: int, m: int, strategy: str, model: str, rounds: int = 1000, clip: float = CLIP, z: float = Z, flower: dict | None = None) -> dict:
    fed = {"strategy": strategy, "rounds": rounds, "clients_per_round": m, "local_epochs": 1, "local_batch_size": 16,
           "client_learning_rate": 0.3, "eval_every": 100_000, "chunk_size": 128}
    if strategy != "fedavg":
        fed["clip_norm"] = clip
    if strategy == "dp-fedavg":
        fed["dp"] = {"noise_multiplier": z, "delta": 1e-6}
    if flower:
        fed["flower"] = flower
    return {"name": "bench-pfl", "seed": 0,
            "data": {"source": f"synthetic:stackoverflow,users={users},examples={round(users * 396.6)}", "heldout_fraction": 0.0, "max_examples_per_user": 32},
            "vocab": {"size": 10000, "seq_len": 20}, "task": {"kind": "nwp", "model": model}, "federated": fed}


def with_config(prepared, users: int, m: int, strategy: str, model: str, **kw):
    """``prepared`` (the data depend only on [data]/[vocab]/[task]) under another [federated]."""
    return dataclasses.replace(prepared, config=validate_config(experiment(users, m, strategy, model, **kw)))


def leaves(p) -> np.ndarray:
    """fedpriv's NWP params, flat, in the export order (embed, lstm wi/wh/b, projection, output)."""
    xs = [p["embed"]["embedding"], p["lstm"]["wi"], p["lstm"]["wh"], p["lstm"]["b"], p["projection"]["kernel"], p["projection"]["bias"],
          p["output"]["kernel"], p["output"]["bias"]]
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in xs])


def npz_leaves(d: dict) -> np.ndarray:
    names = ["embed", "lstm_wi", "lstm_wh", "lstm_b", "projection_kernel", "projection_bias", "output_kernel", "output_bias"]
    return np.concatenate([np.ravel(np.asarray(d[k], np.float64)) for k in names])


def cohort_id(m: int, r: int) -> int:
    """The key of round r's cohort of m users in the export (the peer's noise seed too)."""
    return m * 10_000 + r


def export(setup: FederatedSetup, cohorts: dict[int, np.ndarray], path: Path, clip: float, z: float) -> None:
    """Initial weights, every user's rows in fedpriv's round-1 order, the cohorts, the run's constants."""
    data = setup.data
    ids = np.asarray(data.arrays["ids"])
    order = np.empty(int(data.counts.sum()), np.int64)
    offsets = np.asarray(data.offsets[: data.num_users], np.int64)
    for u in range(data.num_users):
        plan = setup.plan(u, 1)
        order[offsets[u] : offsets[u] + data.counts[u]] = offsets[u] + plan[plan >= 0]
    init = setup.initial_params()
    export_nwp(setup.task, init, {"ids": ids[:1]}, path)
    arrays = dict(np.load(path))
    f = setup.fcfg
    np.savez(path, **arrays, rows=ids[order].astype(np.int32), offsets=offsets, counts=np.asarray(data.counts, np.int64),
             **{f"cohort{k}": np.asarray(v, np.int64) for k, v in cohorts.items()}, z=z, clip=clip, batch=f.local_batch_size,
             client_lr=f.client_learning_rate)


def fedpriv_rounds(engine: VectorizedEngine, state: dict, rounds: list[int]) -> tuple[dict, list[float], float | None]:
    ok = reset_peak()
    times = []
    for r in rounds:
        t = time.perf_counter()
        state, _ = engine.round(r, state)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t)
    return state, times, proc_status("VmHWM") if ok else None


def equivalence(prepared, users: int, model: str, peer, work: Path, log) -> list[dict]:
    out = []
    m = 100
    for strategy, clip in (("fedavg", None), ("fedavg-clip", CLIP), ("fedavg-clip", CLIP / 10)):
        kw = {} if clip is None else {"clip": clip}
        setup = FederatedSetup(with_config(prepared, users, m, strategy, model, **kw))
        engine = VectorizedEngine(setup)
        state = setup.core.init_state(setup.initial_params())
        w0 = leaves(state["params"])
        new, info = engine.round(1, state)
        a = leaves(new["params"])
        theirs = work / "pfl-equiv.npz"
        ans = peer.ask(cmd="equiv", strategy=strategy, out=str(theirs), **({"clip": clip} if clip else {}))
        if "error" in ans:
            out.append({"strategy": strategy, "clip": clip, "error": ans["error"]})
            continue
        b = npz_leaves(dict(np.load(theirs)))
        e = {"strategy": strategy, "clip": clip, "users": ans.get("users"), "update_norm": float(np.linalg.norm(a - w0)),
             "peer_update_norm": float(np.linalg.norm(b - w0)), "max_abs_diff": float(np.max(np.abs(a - b))),
             "rel_diff": float(np.linalg.norm(a - b) / max(np.linalg.norm(a - w0), 1e-12)),
             "unclipped_fraction": info.get("unclipped_fraction")}
        log(f"[pfl] equivalence {e}")
        out.append(e)
    return out


def timing(prepared, users: int, model: str, cohorts_m: list[int], rounds: int, repeats: int, peer, log, dp_cohorts: list[int] | None = None,
           rows: list | None = None, save=lambda: None) -> list[dict]:
    """``rows`` (appended to, ``save()`` after each): one per cohort and algorithm; DP-FedAvg only at
    ``dp_cohorts`` (default: every cohort)."""
    rows = [] if rows is None else rows
    for m in cohorts_m:
        for variant in ("fedavg", "dp-fedavg"):
            if variant == "dp-fedavg" and dp_cohorts is not None and m not in dp_cohorts:
                continue
            setup = FederatedSetup(with_config(prepared, users, m, variant, model))
            engine = VectorizedEngine(setup)
            state = setup.core.init_state(setup.initial_params())
            t = time.perf_counter()
            warm_compile(setup, engine, state["params"], m)  # every bucket's program at this cohort's width, one user each
            warm = [time.perf_counter() - t]
            pw = {"times": [None]}
            if m == cohorts_m[0]:  # torch's first calls, once per process
                pw = peer.ask(cmd="rounds", variant=variant, rounds=[cohort_id(m, 1)])
                if "error" in pw:
                    rows.append({"cohort": m, "variant": variant, "error": pw["error"]})
                    continue
            fp, pf, fp_peak, pf_peak = [], [], [], []
            r0 = 2
            for rep in range(repeats):
                rs = list(range(r0, r0 + rounds))
                r0 += rounds
                state, t, pk = fedpriv_rounds(engine, state, rs)
                fp += t
                fp_peak.append(pk)
                ans = peer.ask(cmd="rounds", variant=variant, rounds=[cohort_id(m, r) for r in rs])
                if "error" in ans:
                    rows.append({"cohort": m, "variant": variant, "error": ans["error"]})
                    break
                pf += ans["times"]
                pf_peak.append(ans["peak_mb"])
                log(f"[pfl] m={m} {variant} block {rep + 1}: fedpriv {[round(x, 2) for x in t]} s, pfl {[round(x, 2) for x in ans['times']]} s")
            else:
                f_med, p_med = statistics.median(fp), statistics.median(pf)
                rows.append({"cohort": m, "variant": variant, "fedpriv_round_s": fp, "pfl_round_s": pf, "fedpriv_warmup_s": warm[0],
                             "pfl_warmup_s": pw["times"][0], "fedpriv_median_s": f_med, "pfl_median_s": p_med,
                             "fedpriv_updates_per_s": m / f_med, "pfl_updates_per_s": m / p_med, "fedpriv_over_pfl_speed": p_med / f_med,
                             "fedpriv_peak_mb": max(x for x in fp_peak if x) if any(fp_peak) else None,
                             "pfl_peak_mb": max(x for x in pf_peak if x) if any(pf_peak) else None,
                             "local_steps": int(setup.local_steps_of(setup.core.sampler.sample(2)).sum())})
            save()
            del engine, setup, state
    return rows


def flower(prepared, users: int, model: str, cohorts_m: list[int], rounds: int, work: Path, log, rows: list | None = None, save=lambda: None) -> list[dict]:
    """fedpriv's Flower engine, one user per message, FedAvg; median round seconds over rounds 2..rounds + 1."""
    import flwr

    from fedpriv.runner.dispatch import train_run

    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    rows = [] if rows is None else rows
    for m in cohorts_m:
        fl = {"num_supernodes": 4, "client_num_cpus": 1, "users_per_message": 1}
        p = with_config(prepared, users, m, "fedavg", model, rounds=rounds + 1, flower=fl)
        t = time.perf_counter()
        before = os.environ.get("PYTHONPATH")
        try:
            train_run(p, work / f"flower-{m}", engine="flower")
        finally:  # Flower's Ray backend leaves PYTHONPATH = this process's sys.path behind (run.py's peer_env)
            if before is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = before
        rs = [json.loads(x) for x in (work / f"flower-{m}" / "metrics.jsonl").read_text().splitlines()]
        secs = [r["round_seconds"] for r in rs if r.get("split") == "train"]
        med = statistics.median(secs[1:])
        rows.append({"cohort": m, "round_s": secs, "median_s": med, "updates_per_s": m / med, "wall_s": time.perf_counter() - t,
                     "supernodes": 4, "users_per_message": 1, "flwr": flwr.__version__})
        log(f"[pfl] flower m={m}: rounds {[round(x, 2) for x in secs]} s")
        save()
    return rows


EPS_CONFIGS = [
    {"name": "342,477 users, cohort 100, 1,500 rounds", "population": 342_477, "cohort": 100, "sigma": 1.0, "steps": 1500, "delta": 1e-6},
    {"name": "342,477 users, cohort 1,000, 2,000 rounds", "population": 342_477, "cohort": 1000, "sigma": 1.0, "steps": 2000, "delta": 1e-6},
    {"name": "342,477 users, cohort 5,000, z 2, 2,000 rounds", "population": 342_477, "cohort": 5000, "sigma": 2.0, "steps": 2000, "delta": 1e-6},
    {"name": "3,000 users, cohort 100, z 0.8, 200 rounds", "population": 3000, "cohort": 100, "sigma": 0.8, "steps": 200, "delta": 1e-5},
]


def epsilon(peer) -> list[dict]:
    """pfl's accountants (RDP, PLD, PRV; Poisson sampling, add-or-remove one user) against fedpriv's
    (dp-accounting RDP and PLD, ``GaussianSteps('poisson', ...)``) on the same DP-FedAvg parameters."""
    from fedpriv.privacy.accounting import GaussianSteps, epsilon_for

    rows = []
    for c in EPS_CONFIGS:
        ev = GaussianSteps("poisson", c["sigma"], c["population"], c["cohort"], c["steps"])
        rows.append({**c, "q": c["cohort"] / c["population"], "fedpriv_rdp": epsilon_for(ev, c["delta"], "rdp").epsilon,
                     "fedpriv_pld": epsilon_for(ev, c["delta"], "pld").epsilon})
    ans = peer.ask(cmd="epsilon", configs=[{"q": r["q"], "sigma": r["sigma"], "steps": r["steps"], "delta": r["delta"]} for r in rows])
    if "error" in ans:
        return [{**r, "pfl_error": ans["error"]} for r in rows]
    for r, a in zip(rows, ans["results"]):
        r.update({f"pfl_{k}": v for k, v in a.items()})
    return rows
