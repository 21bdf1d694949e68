"""Peers benchmark driver (project venv): fedpriv against Opacus, TensorFlow Privacy, TensorFlow
Federated and Flower's built-in DP, on the same work, on this machine, and docs/benchmarks.md.

    .venv/bin/python benchmarks/peers/run.py [--sections epsilon,opacus-nwp,opacus-bert,flower,tff,tf-keras]
        [--repeats 3] [--page-only]

Each peer runs in its own environment (.bench-envs/<peer>, made by benchmarks/peers/envs.sh) as a
subprocess that answers JSON commands on stdin/stdout, so fedpriv's steps and the peer's are
timed in alternating blocks in ONE run (the machine is shared; only ratios measured side by side
mean anything). Each section's results go to .bench-envs/results/<section>.json with the command
and the time it ran; the page is rebuilt from all of them, and a section with no result there
keeps its block from the current page (the results are not committed: a fresh checkout must not
wipe figures measured before).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ENVS = ROOT / ".bench-envs"
RESULTS = ENVS / "results"
WORK = ENVS / "work"
PAGE = ROOT / "docs" / "benchmarks.md"
sys.path.insert(0, str(HERE))

EQUIV_K, EQUIV_TOL = 3, 2e-3  # noise-free steps compared; max |loss difference| allowed (nats)
EPS_TOL = 0.02  # relative epsilon difference allowed


def peer_python(name: str) -> Path | None:
    p = ENVS / name / "bin" / "python"
    return p if (ENVS / name / ".installed").exists() and p.exists() else None


def env_error(name: str) -> str | None:
    e = ENVS / f"{name}.error"
    if not e.exists():
        return None
    lines = [x for x in e.read_text().splitlines() if x.startswith("ERROR")]
    return "\n".join(lines[-2:]) or e.read_text()[-600:]


def peer_env() -> dict:
    """The environment for a peer process: this one's, less PYTHONPATH/PYTHONHOME.

    Why: Flower 1.41's Ray backend (``RayBackend.init_ray``) sets ``os.environ["PYTHONPATH"]`` to this
    driver's whole ``sys.path`` (the project venv's site-packages included) and never restores it.
    A peer started after the ``flower`` section then imported the project's numpy 2.4 instead of its
    own env's, and TensorFlow 2.14 died at import (``pywrap_ml_dtypes.bfloat16()``: "TypeError:
    Unable to convert function return value to a Python type!"): the tf-keras section's "TF peer
    exited before answering"."""
    env = dict(os.environ)
    for k in ("PYTHONPATH", "PYTHONHOME"):
        env.pop(k, None)
    return env


class PeerProc:
    def __init__(self, argv: list[str]):
        WORK.mkdir(parents=True, exist_ok=True)
        self.err_path = WORK / f"{Path(argv[1]).stem}-{'-'.join(Path(a).stem for a in argv[2:4])}.stderr"
        self.err = open(self.err_path, "w")  # noqa: SIM115  the peer's stderr, quoted if it dies
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True, cwd=ROOT, env=peer_env())
        self.hello = self._read()

    def _read(self) -> dict:
        """The peer's next JSON line (other stdout lines skipped); if it died, its stderr's last lines."""
        while True:
            line = self.p.stdout.readline()
            if not line:
                self.err.flush()
                tail = [x for x in self.err_path.read_text(errors="replace").splitlines() if x.strip()][-6:]
                raise RuntimeError(f"peer exited (rc {self.p.poll()}): " + " | ".join(tail))
            if line.lstrip().startswith("{"):
                return json.loads(line)

    def ask(self, **cmd) -> dict:
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        return self._read()

    def close(self) -> None:
        try:
            self.p.stdin.write('{"cmd": "quit"}\n')
            self.p.stdin.flush()
            self.p.wait(30)
        except Exception:  # noqa: BLE001
            self.p.kill()


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- (a) epsilon --------------------------------------------------------------------------------
EPS_CONFIGS = [
    {"name": "MNIST DP-SGD (Abadi et al.)", "n": 60_000, "batch": 256, "sigma": 1.1, "epochs": 60, "delta": 1e-5},
    {"name": "NWP DP-SGD, 1M examples", "n": 1_000_000, "batch": 1024, "sigma": 0.8, "epochs": 5, "delta": 1e-6},
    {"name": "user-level, 342,477 users, 100/round, 1,500 rounds", "n": 342_477, "batch": 100, "sigma": 1.0, "epochs": 1500 * 100 / 342_477, "delta": 1e-6},
    {"name": "low noise", "n": 50_000, "batch": 500, "sigma": 0.6, "epochs": 20, "delta": 1e-5},
]


def rdp_check(q: float, sigma: float, alpha: float, steps: int) -> tuple[float, float]:
    """steps x RDP of order alpha of the Poisson-subsampled Gaussian: dp-accounting's value and
    log(A_alpha) / (alpha - 1) with A_alpha = E_{z ~ N(0, s^2)} [((1 - q) + q exp((2z - 1) / (2 s^2)))^alpha]
    integrated numerically (mpmath, 40 digits)."""
    import mpmath as mp
    from dp_accounting.rdp import rdp_privacy_accountant as r

    dpa = steps * float(r._compute_rdp_poisson_subsampled_gaussian(q, sigma, [alpha])[0])
    mp.mp.dps = 40
    qq, s, a = mp.mpf(q), mp.mpf(sigma), mp.mpf(alpha)
    f = lambda z: mp.npdf(z, 0, s) * ((1 - qq) + qq * mp.e ** ((2 * z - 1) / (2 * s * s))) ** a  # noqa: E731
    A = mp.quad(f, [-mp.inf, -5, 0, 0.5, 1, 2, 3, 5, 10, 20, mp.inf])
    return dpa, float(steps * mp.log(A) / (a - 1))


def section_epsilon(args) -> dict:
    import math

    from fedpriv.privacy.accounting import GaussianSteps, epsilon_for

    rows = []
    for c in EPS_CONFIGS:
        steps = int(math.ceil(c["epochs"] * c["n"] / c["batch"]))
        ev = GaussianSteps("poisson", c["sigma"], c["n"], c["batch"], steps)
        rdp = epsilon_for(ev, c["delta"], "rdp")
        rows.append({**c, "steps": steps, "q": c["batch"] / c["n"], "fedpriv_rdp": rdp.epsilon, "fedpriv_order": rdp.rdp_order,
                     "fedpriv_pld": epsilon_for(ev, c["delta"], "pld").epsilon})
    from importlib.metadata import version

    from fedpriv.privacy.accounting import RDP_ORDERS

    for row in rows:  # the RDP at fedpriv's optimal order: dp-accounting's value and a direct numerical integral
        row["rdp_dpa"], row["rdp_exact"] = rdp_check(row["q"], row["sigma"], row["fedpriv_order"], row["steps"])
    out: dict = {"rows": rows, "peers": {}, "fedpriv_orders": [float(o) for o in RDP_ORDERS], "dp_accounting": version("dp-accounting")}
    tf = peer_python("tf")
    if tf:
        cfgs = [{**c, "orders": out["fedpriv_orders"]} for c in EPS_CONFIGS]
        r = subprocess.run([str(tf), str(HERE / "tf_peer.py"), "epsilon"], input=json.dumps(cfgs), capture_output=True, text=True, cwd=ROOT, env=peer_env())
        ans = json.loads(r.stdout.strip().splitlines()[-1])
        out["peers"]["tf"] = {"versions": {k: v for k, v in ans.items() if k != "results"}}
        for row, a in zip(rows, ans["results"]):
            row["tf_privacy"], row["tf_order"] = a["epsilon"], a.get("order")
            row["old_dpa_on_fedpriv_orders"], row["old_dpa_order"] = a.get("epsilon_on_orders"), a.get("order_on_orders")
    else:
        out["peers"]["tf"] = {"error": env_error("tf") or "env missing"}
    op = peer_python("opacus")
    if op:
        cfgs = [{"q": r["q"], "sigma": r["sigma"], "steps": r["steps"], "delta": r["delta"]} for r in rows]
        r = subprocess.run([str(op), str(HERE / "opacus_peer.py"), "--model", "epsilon"], input=json.dumps(cfgs), capture_output=True, text=True, cwd=ROOT, env=peer_env())
        ans = json.loads(r.stdout.strip().splitlines()[-1])
        out["peers"]["opacus"] = {"versions": {"opacus": ans["opacus"]}}
        for row, a in zip(rows, ans["results"]):
            row["opacus_rdp"], row["opacus_order"] = a["epsilon"], a.get("order")
    return out


def interleaved_times(timed, peer, peer_name: str, peer_variants: list[str], args, tag: str) -> dict:
    """Step times of fedpriv's variants and the peer's, in alternating blocks (fedpriv's, then the
    peer's, ``args.repeats`` times): {median_s, samples, peer_errors}. A peer variant that errors
    is dropped from later blocks and its error kept."""
    times: dict = {f"fedpriv {k}": [] for k in timed.fns} | {f"{peer_name} {k}": [] for k in peer_variants}
    errors: dict = {}
    for r in range(args.repeats):
        for k in timed.fns:
            times[f"fedpriv {k}"] += timed.time(k, args.block, seed=r)
        for k in peer_variants:
            if k in errors:
                continue
            a = peer.ask(cmd="time", variant=k, n=args.block)
            if "error" in a:
                errors[k] = a["error"]
            else:
                times[f"{peer_name} {k}"] += a["times"]
        log(f"[{tag}] repeat {r + 1}/{args.repeats}: " + ", ".join(f"{k} {statistics.median(v):.3f}s" for k, v in times.items() if v))
    return {"median_s": {k: statistics.median(v) for k, v in times.items() if v}, "samples": {k: len(v) for k, v in times.items() if v}, "peer_errors": errors}


# ---- (b) Opacus DP-SGD steps --------------------------------------------------------------------
def section_opacus(model: str, args) -> dict:
    import jax

    import fedpriv_side as fs

    op = peer_python("opacus")
    if not op:
        return {"error": env_error("opacus") or "env missing"}
    WORK.mkdir(parents=True, exist_ok=True)
    data = WORK / f"{model}.npz"
    t0 = time.perf_counter()
    if model == "nwp":
        task, batch, desc = fs.nwp(args.batch)
        params = task.init_params(jax.random.key(0))
        fs.export_nwp(task, params, batch, data)
        eq_task, eq_batch = task, batch
    else:
        eq_task, eq_batch, _ = fs.bert(args.bert_batch, dropout=0.0)
        params = eq_task.init_params(jax.random.key(0))
        fs.export_bert(eq_task, params, eq_batch, data)
        task, batch, desc = fs.bert(args.bert_batch)
    out: dict = {"model": desc, "batch": int(len(batch["mask"])), "clip": fs.C, "sigma": fs.SIGMA, "optimizer": "Adam 1e-3"}
    peer = PeerProc([str(op), str(HERE / "opacus_peer.py"), "--model", model, "--data", str(data)])
    out["versions"] = {"torch": peer.hello["torch"], "opacus": peer.hello["opacus"], "torch_threads": peer.hello["threads"]}
    try:
        # The same thing: k noise-free DP-SGD steps (clip C, sigma 0, SGD) from the same weights and batch.
        lr = 1.0 if model == "nwp" else 0.1
        mine = fs.equivalence_losses(eq_task, params, eq_batch, EQUIV_K, lr)
        theirs = peer.ask(cmd="equiv", k=EQUIV_K, lr=lr)
        out["equiv"] = {"k": EQUIV_K, "lr": lr, "fedpriv": mine, "opacus": theirs.get("losses"), "error": theirs.get("error")}
        if theirs.get("losses"):
            out["equiv"]["max_abs_diff"] = max(abs(a - b) for a, b in zip(mine, theirs["losses"]))
        log(f"[opacus-{model}] equivalence {out['equiv']}  ({time.perf_counter() - t0:.0f} s)")
        mine_v = ["non-private", "dp-fast", "dp-reference (vmap)"] if model == "bert" or args.reference else ["non-private", "dp-fast"]
        timed = fs.Timed(task, batch, mine_v)
        out["fedpriv_fast_unavailable"] = timed.fast_why
        out.update(interleaved_times(timed, peer, "opacus", ["non-private", "dp-hooks", "dp-ghost"], args, f"opacus-{model}"))
    finally:
        peer.close()
    return out


# ---- (d) TF Privacy's DP Keras optimizer --------------------------------------------------------
def section_tf_keras(args) -> dict:
    import jax

    import fedpriv_side as fs

    tfp = peer_python("tf")
    if not tfp:
        return {"error": env_error("tf") or "env missing"}
    WORK.mkdir(parents=True, exist_ok=True)
    data = WORK / "nwp-tf.npz"
    t0 = time.perf_counter()
    task, batch, desc = fs.nwp(args.batch)
    params = task.init_params(jax.random.key(0))
    fs.export_nwp(task, params, batch, data)
    out: dict = {"model": desc, "batch": int(len(batch["mask"])), "clip": fs.C, "sigma": fs.SIGMA, "optimizer": "Adam 1e-3", "peer": "tf-privacy"}
    peer = PeerProc([str(tfp), str(HERE / "tf_peer.py"), "nwp", str(data)])
    out["versions"] = {k: peer.hello[k] for k in ("tensorflow", "tensorflow_privacy", "threads")}
    try:
        mine = fs.equivalence_losses(task, params, batch, EQUIV_K, 1.0)
        theirs = peer.ask(cmd="equiv", k=EQUIV_K, lr=1.0)
        out["equiv"] = {"k": EQUIV_K, "lr": 1.0, "fedpriv": mine, "opacus": theirs.get("losses"), "error": theirs.get("error")}
        if theirs.get("losses"):
            out["equiv"]["max_abs_diff"] = max(abs(a - b) for a, b in zip(mine, theirs["losses"]))
        log(f"[tf-keras] equivalence {out['equiv']}  ({time.perf_counter() - t0:.0f} s)")
        timed = fs.Timed(task, batch, ["non-private", "dp-fast"])
        out["fedpriv_fast_unavailable"] = timed.fast_why
        out.update(interleaved_times(timed, peer, "tf-privacy", ["non-private", "dp-keras"], args, "tf-keras"))
    finally:
        peer.close()
    return out


# ---- (c) Flower's built-in DP -------------------------------------------------------------------
def section_flower(args) -> dict:
    import tempfile

    import flwr

    import flower_dp

    before = os.environ.get("PYTHONPATH")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = flower_dp.bench(args.flower_users, args.flower_rounds, args.flower_model, 1.0, 0.5, Path(tmp), log)
    finally:  # Flower's Ray backend leaves PYTHONPATH = this process's sys.path behind (see peer_env)
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before
    out["versions"] = {"flwr": flwr.__version__}
    return out


# ---- (e) TensorFlow Federated's DP-FedAvg -------------------------------------------------------
TFF_CLIP, TFF_Z = 0.5, 1.0  # as the flower section
TFF_NAMES = ["embed", "lstm_wi", "lstm_wh", "lstm_b", "projection_kernel", "projection_bias", "output_kernel", "output_bias"]


def _nwp_leaves(p) -> list:
    """fedpriv's NWP params in the export order (TFF_NAMES; Keras' trainable weights' order)."""
    return [p["embed"]["embedding"], p["lstm"]["wi"], p["lstm"]["wh"], p["lstm"]["b"], p["projection"]["kernel"], p["projection"]["bias"],
            p["output"]["kernel"], p["output"]["bias"]]


def section_tff(args) -> dict:
    """DP-FedAvg on the flower section's NWP task and cohort: fedpriv (vectorized engine) against
    ``tff.learning.algorithms.build_unweighted_fed_avg`` with ``DifferentiallyPrivateFactory.gaussian_fixed``.

    1. The same thing: one noise-free round (clip S, z = 0) from the same initial weights on the same
       users' round-1 batches; relative difference of the new weights, as the flower section.
    2. Round times: ``args.repeats`` blocks, each a fedpriv vectorized run of R rounds, then R TFF
       rounds from a fresh state in the peer (one process, so TFF's tracing is in its first block's
       first round only); the median over every block's rounds 2..R."""
    import tempfile

    import jax
    import numpy as np

    import fedpriv_side as fs
    import flower_dp
    from fedpriv.config import validate_config
    from fedpriv.engines.setup import FederatedSetup
    from fedpriv.runner.dispatch import train_run
    from fedpriv.runner.prepare import prepare

    tp = peer_python("tff")
    if not tp:
        return {"error": env_error("tff") or "env missing"}
    users, rounds, model, S, z = args.flower_users, args.flower_rounds, args.flower_model, TFF_CLIP, TFF_Z
    out: dict = {"users": users, "clients_per_round": users, "rounds": rounds, "model": model, "noise_multiplier": z, "clip_norm": S}
    WORK.mkdir(parents=True, exist_ok=True)
    data = WORK / "tff.npz"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        d0 = flower_dp.experiment(users, 1, model, 0.0, S, strategy="fedavg-clip")
        prepared = prepare(validate_config(d0))
        setup = FederatedSetup(prepared)
        f = setup.fcfg
        init = setup.initial_params()
        ids = np.asarray(setup.data.arrays["ids"])
        per_user = {}
        for u in range(setup.data.num_users):
            plan = setup.plan(u, 1)
            per_user[f"user{u}"] = ids[setup.data.offsets[u] + plan[plan >= 0]]  # round 1's batches, in order
        out["example_counts"] = sorted(set(int(c) for c in setup.data.counts))
        out["local"] = {"epochs": f.local_epochs, "batch": f.local_batch_size, "client_lr": f.client_learning_rate,
                        "server": f"{f.server_optimizer} {f.server_learning_rate}", "max_local_steps": f.max_local_steps}
        fs.export_nwp(setup.task, init, {"ids": ids[:1]}, data)
        arrays = dict(np.load(data))
        np.savez(data, **arrays, **per_user, z=z, clip=S, batch=f.local_batch_size, client_lr=f.client_learning_rate)
        out["params"] = int(sum(np.size(x) for x in jax.tree_util.tree_leaves(init)))
        peer = PeerProc([str(tp), str(HERE / "tff_peer.py"), str(data)])
        out["versions"] = {k: peer.hello[k] for k in ("tensorflow_federated", "tensorflow", "tensorflow_privacy", "jax", "jaxlib")}
        try:
            # 1. the same thing: one noise-free round at the run's clip S and at S / 10 (where clipping binds for more clients).
            out["equiv"] = []
            w0 = np.concatenate([np.ravel(np.asarray(arrays[k], np.float64)) for k in TFF_NAMES])
            for clip in (S, S / 10):
                t = time.perf_counter()
                vec0 = train_run(prepare(validate_config(flower_dp.experiment(users, 1, model, 0.0, clip, strategy="fedavg-clip"))), tmp / f"equiv-vec-{clip}", engine="vectorized")
                row0 = next(r for r in vec0.history if r.get("split") == "train")
                theirs_path = WORK / "tff-equiv.npz"
                ans = peer.ask(cmd="equiv", k=1, lr=0.0, out=str(theirs_path), clip=clip)
                log(f"[tff] noise-free round at clip {clip}: {time.perf_counter() - t:.1f} s  {ans}")
                if "error" in ans:
                    out["equiv_error"] = ans["error"]
                    break
                a = np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in _nwp_leaves(vec0.params)])
                theirs = dict(np.load(theirs_path))
                b = np.concatenate([np.ravel(np.asarray(theirs[k], np.float64)) for k in TFF_NAMES])
                e = {"clip": clip, "update_norm": float(np.linalg.norm(a - w0)), "peer_update_norm": float(np.linalg.norm(b - w0)),
                     "max_abs_diff": float(np.max(np.abs(a - b))), "rel_diff": float(np.linalg.norm(a - b) / max(np.linalg.norm(a - w0), 1e-12)),
                     "tff_client_loss": ans["losses"][0], "fedpriv_client_loss": row0.get("loss"),
                     "unclipped_fraction": row0.get("unclipped_fraction"), "mean_delta_norm": row0.get("mean_norm", row0.get("mean_delta_norm"))}
                out["equiv"].append(e)
                log(f"[tff] equivalence: {e}")
                if clip == S:
                    a_free, b_free = a, b
            if "equiv_error" not in out:
                # The noise: one round with z from the same weights on each side, minus the noise-free round (the client
                # updates are deterministic, so the difference is the noise on the average): its std per coordinate
                # against z S / m.
                noisy_path = WORK / "tff-noisy.npz"
                ans = peer.ask(cmd="equiv", k=1, lr=0.0, out=str(noisy_path), z=z)
                if "error" not in ans:
                    nz = dict(np.load(noisy_path))
                    tff_noise = np.concatenate([np.ravel(np.asarray(nz[k], np.float64)) for k in TFF_NAMES]) - b_free
                    vec1 = train_run(prepare(validate_config(flower_dp.experiment(users, 1, model, z, S))), tmp / "noisy-vec", engine="vectorized")
                    fp_noise = np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in _nwp_leaves(vec1.params)]) - a_free
                    out["noise_check"] = {"expected_std": z * S / users, "tff_std": float(np.std(tff_noise)), "tff_mean": float(np.mean(tff_noise)),
                                          "fedpriv_std": float(np.std(fp_noise)), "fedpriv_mean": float(np.mean(fp_noise)), "coordinates": int(fp_noise.size)}
                    log(f"[tff] noise check: {out['noise_check']}")
                else:
                    out["noise_check"] = {"error": ans["error"]}
            # 2. round times with noise.
            d = flower_dp.experiment(users, rounds, model, z, S)
            prepared = prepare(validate_config(d))
            vec, tff_ = [], []
            for r in range(args.repeats):
                t = time.perf_counter()
                res = train_run(prepared, tmp / f"dp-vec-{r}", engine="vectorized")
                vec.append(flower_dp.round_seconds(tmp / f"dp-vec-{r}"))
                log(f"[tff] block {r + 1}: fedpriv vectorized {time.perf_counter() - t:.1f} s {[round(x, 2) for x in vec[-1]]}")
                if r == 0:
                    try:
                        out["fedpriv_ledger"] = json.loads((tmp / "dp-vec-0" / "privacy_ledger.json").read_text())
                    except Exception:  # noqa: BLE001
                        pass
                t = time.perf_counter()
                ans = peer.ask(cmd="time", variant="dp-fedavg", n=rounds)
                if "error" in ans:
                    out["error"] = "TFF round: " + ans["error"]
                    break
                tff_.append(ans["times"])
                log(f"[tff] block {r + 1}: TFF {time.perf_counter() - t:.1f} s {[round(x, 2) for x in tff_[-1]]}")
            out["vectorized_round_seconds"], out["tff_round_seconds"] = vec, tff_
        finally:
            peer.close()
    return out


# ---- (h) pfl-research ---------------------------------------------------------------------------
def section_pfl(args) -> dict:
    """FedAvg and DP-FedAvg against pfl-research 0.6 (PyTorch backend): the same computation first,
    then client updates/s and peak memory at each cohort in one run, Flower's beside them, and the
    accountants (benchmarks/peers/pfl_bench.py)."""
    import tempfile

    import jax
    import numpy as np

    import pfl_bench as pb
    from fedpriv.config import validate_config
    from fedpriv.engines.setup import FederatedSetup
    from fedpriv.runner.prepare import prepare

    pp = peer_python("pfl")
    if not pp:
        return {"error": env_error("pfl") or "env missing"}
    users, model = args.pfl_users, args.pfl_model
    cohorts = [int(x) for x in args.pfl_cohorts.split(",")]
    out: dict = {"users": users, "model": model, "cohorts": cohorts, "rounds": args.pfl_rounds, "repeats": args.repeats, "clip_norm": pb.CLIP,
                 "noise_multiplier": pb.Z}
    t0 = time.perf_counter()
    prepared = prepare(validate_config(pb.experiment(users, 100, "fedavg", model)))
    out["prepare_s"] = time.perf_counter() - t0
    ids = {}
    for m in sorted(set(cohorts) | {100}):
        sampler = FederatedSetup(pb.with_config(prepared, users, m, "fedavg", model)).core.sampler
        for r in range(1, 2 + args.repeats * args.pfl_rounds):
            ids[pb.cohort_id(m, r)] = sampler.sample(r)
    WORK.mkdir(parents=True, exist_ok=True)
    data = WORK / "pfl.npz"
    setup = FederatedSetup(pb.with_config(prepared, users, 100, "fedavg", model))
    pb.export(setup, ids | {1: ids[pb.cohort_id(100, 1)]}, data, pb.CLIP, pb.Z)
    f = setup.fcfg
    out["population"] = {"users": setup.data.num_users, "examples": int(setup.data.counts.sum()), "counts_max": int(setup.data.counts.max()),
                         "params": int(sum(np.size(x) for x in jax.tree_util.tree_leaves(setup.initial_params())))}
    out["local"] = {"epochs": f.local_epochs, "batch": f.local_batch_size, "client_lr": f.client_learning_rate, "server": f"{f.server_optimizer} {f.server_learning_rate}"}
    del setup
    peer = PeerProc([str(pp), str(HERE / "pfl_peer.py"), str(data)] + (["--threads", str(args.pfl_threads)] if args.pfl_threads else []))
    out["versions"] = {k: peer.hello[k] for k in ("pfl", "torch", "dp_accounting", "prv_accountant", "threads")}
    cmd = ".venv/bin/python benchmarks/peers/run.py " + " ".join(sys.argv[1:])

    def save() -> None:  # what is measured so far, on the page if the run is cut short
        (RESULTS / "pfl.json").write_text(json.dumps({**out, "partial": True, "command": cmd, "when": dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
                                                      "wall_s": round(time.perf_counter() - t0, 1)}, indent=1, default=str))

    dp_cohorts = [int(x) for x in args.pfl_dp_cohorts.split(",")] if args.pfl_dp_cohorts else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out["equiv"] = pb.equivalence(prepared, users, model, peer, WORK, log)
            out["epsilon"] = pb.epsilon(peer)
            log(f"[pfl] epsilon {out['epsilon']}")
            save()
            out["timing"] = []
            pb.timing(prepared, users, model, cohorts, args.pfl_rounds, args.repeats, peer, log, dp_cohorts, out["timing"], save)
            if not args.pfl_no_flower:
                peer.close()  # its memory is not needed while Flower's actors run
                peer = None
                out["flower"] = []
                pb.flower(prepared, users, model, cohorts, args.pfl_rounds, Path(tmp), log, out["flower"], save)
    finally:
        if peer is not None:
            peer.close()
    return out


# ---- page ---------------------------------------------------------------------------------------
def machine() -> dict:
    import jax
    import numpy

    return {"arch": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(), "jax": jax.__version__, "numpy": numpy.__version__,
            "processor": _cpu_model()}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def fmt(x, d=3):
    return "n/a" if x is None else f"{x:.{d}g}" if isinstance(x, float) else str(x)


# Each section's heading on the page. A section with no result in .bench-envs/results/ (never run
# in this checkout: the results are not committed) keeps its block from the current page, so
# regenerating the page never wipes figures measured earlier.
TITLES = {"epsilon": "## (a) Epsilon", "opacus-nwp": "## (b) DP-SGD step against Opacus: NWP LSTM",
          "opacus-bert": "## (b) DP-SGD step against Opacus: BERT-small", "flower": "## (c) DP-FedAvg against Flower",
          "tf-keras": "## (d) ", "tff": "## (e) ", "pfl": "## (h) "}


def old_page() -> dict:
    """The current page cut into blocks: {'## heading line': block lines (heading included, trailing
    blank lines dropped)}, plus 'machine' (its Machine: line) and 'envs' ({env name: status cell})."""
    out: dict = {"blocks": {}, "machine": None, "envs": {}}
    if not PAGE.exists():
        return out
    cur = None
    for line in PAGE.read_text().splitlines():
        if line.startswith("## "):
            cur = line
            out["blocks"][cur] = [line]
        elif cur is not None:
            out["blocks"][cur].append(line)
        if line.startswith("Machine: ") and out["machine"] is None:
            out["machine"] = line
        if cur and cur.startswith("## Environments") and line.startswith("| ") and "`.bench-envs/" in line:
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            out["envs"][cells[0]] = cells[-1]
    for k, v in out["blocks"].items():
        while v and not v[-1].strip():
            v.pop()
    return out


def kept(old: dict, key: str) -> list[str]:
    """The page's previous block for section ``key`` (its own command line and date included), or []."""
    for head, block in old["blocks"].items():
        if head.startswith(TITLES[key]):
            return block + [""]
    return []


def tff_block(t: dict) -> list[str]:
    L = ["## (e) DP-FedAvg against TensorFlow Federated", "", f"Command: `{t['command']}` ({t['when']}); wall {t.get('wall_s')} s.", ""]
    if "error" in t and not t.get("tff_round_seconds"):
        return L + [f"Not measured: {t['error']}", ""]
    v = t["versions"]
    loc = t["local"]
    L += [f"Versions: tensorflow-federated {v['tensorflow_federated']}, tensorflow {v['tensorflow']}, tensorflow-privacy {v['tensorflow_privacy']}, "
          f"jax/jaxlib {v['jax']}/{v['jaxlib']} in `.bench-envs/tff`. TFF 0.87.0 pins jax/jaxlib 0.4.14, of which PyPI has no wheel for "
          "Python 3.11 (it offers 0.4.13, then 0.4.18), so `pip install tensorflow-federated==0.87.0` fails; `benchmarks/peers/envs.sh tff` "
          "installs TFF with `--no-deps` and then every other `Requires-Dist` of its METADATA as pinned there, with jax/jaxlib 0.4.13 in "
          "place of 0.4.14 (`pip check` reports exactly that mismatch). TFF's JAX backend is not used: this is its TensorFlow simulation "
          "(the default local C++ execution context, all clients in one process).", "",
          f"The task and cohort of section (c): NWP `{t['model']}` model ({t['params']:,} parameters), {t['users']} users, all "
          f"{t['clients_per_round']} in every round, {loc['epochs']} local epoch of batch {loc['batch']} (at most 32 examples/user; counts "
          f"{t['example_counts']}), client SGD {loc['client_lr']}, server {loc['server']}, clip S = {t['clip_norm']}, noise multiplier "
          f"{t['noise_multiplier']}; {t['rounds']} rounds per block. TFF side: `tff.learning.algorithms.build_unweighted_fed_avg` on the Keras "
          "port of the NWP LSTM (as section (d); `tff.learning.models.from_keras_model`, loss per example the mean cross-entropy over its "
          "non-pad targets, mean over the batch), `build_sgdm` client and server optimizers, `model_aggregator = "
          "DifferentiallyPrivateFactory.gaussian_fixed(noise_multiplier=z, clients_per_round=m, clip=S)`; each client's tf.data "
          "dataset holds its examples in fedpriv's round-1 order, cut into batches of 16 in order. A TFF round = one `process.next` "
          "(wall seconds); a fedpriv round = `round_seconds` of `metrics.jsonl` (vectorized engine, `dp-fedavg`). The run alternates "
          "blocks: a fedpriv run of all rounds, then as many TFF rounds from a fresh state in the same TFF process (whose iterative process "
          "for these z and S was already built and traced by the noise check below); the first round of each block (fedpriv: "
          "compilation) is left out of both medians.", ""]
    vec = [x for blk in t["vectorized_round_seconds"] for x in blk[1:]]
    tf_ = [x for blk in t["tff_round_seconds"] for x in blk[1:]]
    mv, mt = statistics.median(vec), statistics.median(tf_)
    r2 = lambda blocks: "; ".join(", ".join(f"{x:.2f}" for x in b) for b in blocks)  # noqa: E731
    L += ["| run | median s/round (rounds 2.. of each block) | all rounds, per block (s) | ratio fedpriv / TFF |", "| --- | --- | --- | --- |",
          f"| fedpriv DP-FedAvg, vectorized engine | {mv:.3f} | {r2(t['vectorized_round_seconds'])} | **{mv / mt:.3f}** |",
          f"| TFF build_unweighted_fed_avg + DifferentiallyPrivateFactory.gaussian_fixed | {mt:.3f} | {r2(t['tff_round_seconds'])} | 1 |", ""]
    L.append("fedpriv is faster." if mv < mt else f"**fedpriv is NOT ahead of TFF here ({mv / mt:.2f}x its round time).**")
    L.append("")
    if t.get("equiv"):
        ok = all(e["rel_diff"] <= 1e-4 for e in t["equiv"])
        L += ["Same computation: one noise-free round (z = 0; fedpriv `fedavg-clip`, TFF `gaussian_fixed` with noise_multiplier 0) from the "
              "same initial weights on the same batches, at the run's clip S and at S / 10 (where clipping binds for every client), "
              f"tolerance 1e-4 on ||fedpriv - TFF|| / ||fedpriv's update||: **{'same' if ok else 'NOT the same'}**.", "",
              "| clip | clients unclipped (fedpriv) | mean delta norm | ||update|| fedpriv | ||update|| TFF | relative difference | max abs diff | "
              "mean client loss fedpriv | TFF |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for e in t["equiv"]:
            L.append(f"| {e['clip']:g} | {fmt(e.get('unclipped_fraction'))} | {fmt(e.get('mean_delta_norm'), 4)} | {e['update_norm']:.5f} | "
                     f"{e['peer_update_norm']:.5f} | {e['rel_diff']:.2e} | {e['max_abs_diff']:.2e} | {fmt(e.get('fedpriv_client_loss'), 6)} | "
                     f"{fmt(e.get('tff_client_loss'), 6)} |")
        L += ["", "(Client loss: fedpriv's is the mean over clients of their mean local step loss, TFF's its own `client_work/train/loss` "
              "aggregation; they are reported, not compared.)", ""]
    elif t.get("equiv_error"):
        L += [f"Same computation: not checked, the TFF round failed: `{t['equiv_error']}`", ""]
    nc = t.get("noise_check") or {}
    if nc.get("expected_std"):
        L += [f"Noise: one round with z = {t['noise_multiplier']} from the same weights on each side minus the noise-free round (the clients' "
              f"updates are deterministic, so the difference is the noise on the average), over {nc['coordinates']:,} coordinates: "
              f"std fedpriv {nc['fedpriv_std']:.5f}, TFF {nc['tff_std']:.5f}, expected z S / m = {nc['expected_std']:.5f} "
              f"(means {nc['fedpriv_mean']:.1e} and {nc['tff_mean']:.1e}).", ""]
    L += ["Noise and clipping semantics (the same mechanism):", "",
          "- TFF 0.87 `DifferentiallyPrivateFactory.gaussian_fixed(z, m, S)` = TF Privacy's `NormalizedQuery(GaussianSumQuery("
          "l2_norm_clip=S, stddev=S z), denominator=m)`: each client's model delta is clipped to global L2 norm S (`tf.clip_by_global_norm`: "
          "factor S / max(norm, S)), the clipped deltas are summed, N(0, (z S)^2) is added to each coordinate of the sum, and the sum is "
          "divided by the fixed `clients_per_round` m (not the number of clients that reported): std z S / m on the average; no weighting "
          "by example count (an unweighted factory). The server optimizer then applies the average.",
          "- fedpriv `dp-fedavg`: each delta clipped to L2 norm S (factor min(1, S / norm)), summed, N(0, (z S)^2) per coordinate added, "
          "divided by the fixed cohort size m: the same uniform 1/m average of clipped deltas + N(0, (z S / m)^2), then the server optimizer "
          "(SGD 1.0 here, on both sides).",
          "- Accounting: TFF's factory releases the noised average and computes no epsilon (its docstring points to McMahan et al. 2017 for the "
          "(epsilon, delta) guarantee; the user runs an accountant such as dp-accounting separately). fedpriv records every round's "
          "sampling and noise in the run's privacy ledger and reports user-level (epsilon, delta) from it"
          + (f" (this run: `{json.dumps(t['fedpriv_ledger'].get('entries'))}`)." if t.get("fedpriv_ledger") else "."), ""]
    return L


def page() -> str:
    res = {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}
    old = old_page()
    L = ["# Benchmarks: fedpriv against its peers", "",
         "Written by `make bench` (`benchmarks/peers/run.py`; the peers' environments by `benchmarks/peers/envs.sh`).",
         "Every ratio is fedpriv / peer of times measured in ONE run, fedpriv's and the peer's steps in alternating blocks",
         "(< 1: fedpriv is faster). The machine is shared with other jobs: absolute times drift between runs; the ratios are what",
         "the page reports. Each section states the command that produced it, when, its wall time, and on what. The runs of "
         "2026-11-23 up to 19:00 shared the 2 CPUs with two other fedpriv training jobs (load average about 7), those from 23:45 on "
         "with one (load average 2 to 4), which inflates every absolute time.", "",
         "`make bench-peers` (also the last step of `make bench`) builds the peers' environments if missing and runs every section, "
         "`epsilon,opacus-nwp,opacus-bert,flower,tff,tf-keras,pfl`, with `--repeats 2` (override: `make bench-peers BENCH_PEERS_SECTIONS=... "
         "BENCH_PEERS_ARGS=...`; the slowest are `pfl`, 8 minutes with the defaults here when the machine has no other load (about an hour under a load average of 8-12), "
         "`opacus-bert`, 4 to 16 minutes here depending on the load, and `tf-keras`, about 6). "
         "A section not rerun keeps its last result (and its own command line) on the page: from `.bench-envs/results/` where "
         "it is, else the block already on this page (the results are not committed).", ""]
    any_meta = next(iter(res.values()), {}).get("meta") if res else None
    if old["machine"] and set(res) <= {"pfl"}:  # the older sections' machine; the pfl section states its own
        L += [old["machine"], ""]
    elif any_meta:
        m = any_meta["machine"]
        L += [f"Machine: `{m['arch']}`, {m['cpus']} CPUs ({m['processor']}), Python {m['python']}; fedpriv side: jax {m['jax']}, numpy {m['numpy']}.", ""]
    elif old["machine"]:
        L += [old["machine"], ""]
    L += ["## Environments", "",
          "| peer | environment | status |", "| --- | --- | --- |"]
    for name, what in (("opacus", "torch 2.13.0 (CPU) + opacus 1.6.0"), ("pfl", "pfl 0.6.0 (pfl-research, PyTorch backend) + torch 2.13.0 (CPU)"), ("tf", "tensorflow 2.14.1 + tensorflow-privacy 0.9.0"), ("tff", "tensorflow-federated 0.87.0 (`--no-deps`) + its pinned requirements with jax/jaxlib 0.4.13 for 0.4.14 (TF 2.14.1, TF Privacy 0.9.0)")):
        err = env_error(name)
        st = "installed" if peer_python(name) else f"NOT INSTALLED: `{err.strip()}`" if err else None
        if st is None:  # not in this checkout: keep what the page said when its sections ran
            prev = old["envs"].get(name)
            st = prev if prev and not prev.startswith("NOT INSTALLED") else "not created"
        L.append(f"| {name} | `.bench-envs/{name}`: {what} | {st.replace(chr(10), ' ')} |")
    L.append("| Flower built-in DP | the project venv (flwr 1.41.0 is part of fedpriv's stack) | installed |")
    L.append("")

    e = res.get("epsilon")
    if not e:
        L += kept(old, "epsilon")
    if e:
        tfv = e["peers"].get("tf", {}).get("versions", {})
        L += ["## (a) Epsilon: the same (q, sigma, steps, delta)", "", f"Command: `{e['command']}` ({e['when']}); wall {e.get('wall_s')} s.", "",
              "Poisson sampling with q = B/N, ceil(epochs N / B) steps, add-or-remove-one example, RDP, delta as given. TF Privacy "
              f"{tfv.get('tensorflow_privacy', '?')}: `compute_dp_sgd_privacy_lib.compute_dp_sgd_privacy` (on dp-accounting {tfv.get('dp_accounting', '?')}); "
              "Opacus: `RDPAccountant` (its own RDP code); fedpriv: `GaussianSteps('poisson', ...)` with `epsilon_for(..., 'rdp')` on "
              f"dp-accounting {e.get('dp_accounting', '0.6.0')}, and 'pld' for reference. (order) is the RDP order at which each "
              f"minimum was found. Check ('same?'): |fedpriv RDP / Opacus RDP - 1| <= {EPS_TOL:.0%}.", "",
              "| setting | q | sigma | steps | delta | fedpriv RDP (order) | TF Privacy (order) | ratio | Opacus RDP (order) | ratio | dp-accounting "
              f"{tfv.get('dp_accounting', 'old')} on fedpriv's orders | fedpriv PLD | same? |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        o = lambda x: "" if x is None else f" ({x:g})"  # noqa: E731
        for r in e["rows"]:
            tfp, opr = r.get("tf_privacy"), r.get("opacus_rdp")
            rt = r["fedpriv_rdp"] / tfp if tfp else None
            ro = r["fedpriv_rdp"] / opr if opr else None
            same = ro is not None and abs(ro - 1) <= EPS_TOL
            L.append(f"| {r['name']} | {r['q']:.4g} | {r['sigma']} | {r['steps']} | {r['delta']:g} | {r['fedpriv_rdp']:.4f}{o(r.get('fedpriv_order'))} | "
                     f"{fmt(tfp, 5)}{o(r.get('tf_order'))} | {fmt(rt, 4)} | {fmt(opr, 5)}{o(r.get('opacus_order'))} | {fmt(ro, 4)} | "
                     f"{fmt(r.get('old_dpa_on_fedpriv_orders'), 5)}{o(r.get('old_dpa_order'))} | {r['fedpriv_pld']:.4f} | {'yes' if same else 'NO'} |")
        for k, v in e["peers"].items():
            L.append(f"- {k}: {v.get('versions') or 'not run: ' + str(v.get('error'))}")
        fo = e.get("fedpriv_orders") or []
        L += ["", "Where the epsilons differ, and why:", "",
              "- Order grids. fedpriv (`fedpriv/privacy/accounting.py`: dp-accounting's `DEFAULT_RDP_ORDERS` + 2048, 4096): "
              + (f"{len(fo)} orders, 1.1 to 10.9 in steps of 0.1, then integers 11 to 63, then 128 ... {fo[-1]:g}. " if fo else "")
              + "TF Privacy 0.9.0's `compute_dp_sgd_privacy`: 1.25, 1.5, 1.75, 2, 2.25, 2.5, 3, 3.5, 4, 4.5, integers 5 to 63, 128, 256, 512. "
              "Opacus 1.6.0's `RDPAccountant`: 1.1 to 10.9 in steps of 0.1, integers 12 to 63. fedpriv's grid holds every Opacus order "
              "but lacks TF Privacy's 1.25, 1.75 and 2.25 (it has no order between 1.2 and 1.3, 1.7 and 1.8, 2.2 and 2.3). None of this table's "
              "optima is at one of those three orders, so the missing orders cost nothing here; a setting whose optimum lies "
              "there would get a slightly larger epsilon from fedpriv. TF Privacy's grid is coarser between 2.5 and 5 and has no "
              "fractional orders above 4.5: where the optimum falls there (the NWP row) its epsilon is larger, a looser bound on the same mechanism.",
              "- The RDP of the subsampled Gaussian at fractional orders. The gap in the 'low noise' row (fedpriv above both peers) is not the grid: "
              "all three minimize at order 2.5, and the dp-accounting of TF Privacy's environment on fedpriv's own grid gives the peers' value (column "
              "'dp-accounting ... on fedpriv's orders'). dp-accounting 0.6.0 (fedpriv's) computes the RDP at a fractional order alpha from the "
              "series of Mironov et al. (2019, Sec. 3.3) summing the absolute values of the terms (|binom(alpha, i)|), an upper bound; "
              "dp-accounting 0.4.3 and Opacus add the terms with their signs. At integer orders the two agree (the series is finite, "
              "no negative terms); at fractional orders the negative terms only matter when q is large enough (here: q = 0.01 at order 2.5, "
              "not q = 0.004 at order 8.1 or q = 0.001 at 8.3). This is not something fedpriv's own code does: it comes with dp-accounting 0.6.0.",
              ]
        chk = [r for r in e["rows"] if r.get("rdp_exact") is not None]
        if chk:
            L.append("- Direct check (numerical integration of A_alpha = E_{z~N(0, s^2)}[((1-q) + q exp((2z-1)/(2 s^2)))^alpha], mpmath, 40 digits), "
                     "steps x RDP at fedpriv's optimal order: " + "; ".join(
                         f"{r['name']}: dp-accounting {e.get('dp_accounting', '0.6.0')} {r['rdp_dpa']:.6f}, integral {r['rdp_exact']:.6f}" for r in chk)
                     + ". Where they differ, the integral is the peers' value: the peers' RDP is the exact one, fedpriv's a valid but looser "
                     "upper bound (its epsilon is never smaller than the true RDP epsilon).")
        L.append("")

    for key, model, pname, pk in (("opacus-nwp", "nwp", "Opacus", "opacus"), ("opacus-bert", "bert", "Opacus", "opacus"), ("tf-keras", "tf", "TF Privacy", "tf-privacy")):
        o = res.get(key)
        if not o:
            L += kept(old, key)
            continue
        title = {"nwp": "(b) DP-SGD step against Opacus: NWP LSTM", "bert": "(b) DP-SGD step against Opacus: BERT-small",
                 "tf": "(d) DP-SGD step against TF Privacy's DP Keras optimizer: NWP LSTM"}[model]
        L += [f"## {title}", "", f"Command: `{o['command']}` ({o['when']}); wall {o.get('wall_s')} s.", ""]
        if "error" in o and "median_s" not in o:
            L += [f"Not measured: {o['error']}", ""]
            continue
        L += [f"Model: {o['model']}; batch {o['batch']}; clip C = {o['clip']}, noise multiplier {o['sigma']}, {o['optimizer']}; versions {o['versions']}."]
        if model == "tf":
            L += ["One step = forward, backward, clipping, noise, optimizer update. fedpriv: `dp-fast` (ghost norms + book-keeping); "
                  "TF Privacy: `DPKerasAdamOptimizer` with one microbatch per example (per-example clipping, as fedpriv), its gradients from "
                  "`_compute_gradients` (the jacobian of the per-example losses, what `model.fit` runs) in one `tf.function`; non-private: "
                  "Keras Adam. The Keras model is Embedding -> LSTM -> Dense -> Dense with fedpriv's exported weights (Keras' LSTM has "
                  "fedpriv's single gate bias and gate order). Each TF variant is traced and warmed up by one untimed call (for `dp-keras`: "
                  "tracing `tape.jacobian` through the LSTM plus one step, 49 s in the run of 2026-11-23 23:55), then timed; the "
                  "equivalence check (its own optimizer, so its own trace, and 3 steps) comes first.", ""]
            if o.get("when", "") > "2026-11-23 23:00":
                L += ["Why this section failed when run after the `flower` section (2026-11-23 18:57 and again 23:45, \"the TF peer exited "
                      "before answering\"): Flower 1.41's Ray backend (`RayBackend.init_ray`) sets `os.environ[\"PYTHONPATH\"]` to the "
                      "driver's whole `sys.path`, the project venv's site-packages included, and leaves it set; the TF peer started after "
                      "it imported the project's numpy 2.4 instead of its own env's numpy 1.26, and TensorFlow 2.14 died at import "
                      "(`pywrap_ml_dtypes.bfloat16()`: `TypeError: Unable to convert function return value to a Python type!`). Run alone, "
                      "the section worked. Fix: run.py starts every peer without PYTHONPATH/PYTHONHOME (`peer_env`) and the `flower` "
                      "section restores PYTHONPATH when it ends.", ""]
        else:
            L += ["One step = forward, backward, clipping, noise, optimizer update. fedpriv: `dp-fast` (ghost norms + book-keeping, its default "
              "where the model allows) and `dp-reference` (vmap of per-example gradients); Opacus: `dp-hooks` (GradSampleModule, "
              "its default) and `dp-ghost` (fast gradient clipping). " + ("The NWP model is Opacus' DPLSTM on the Opacus side (Opacus cannot "
              "compute per-sample gradients of nn.LSTM); its non-private baseline is nn.LSTM." if model == "nwp" else
              "BERT-small is a torch port of fedpriv's BertMLM (post-LN, exact gelu, LayerNorm eps 1e-12, untied output layer), "
              "dropout 0.1 in the timed steps on both sides."), ""]
        eq = o.get("equiv", {})
        if eq:
            ok = eq.get("max_abs_diff") is not None and eq["max_abs_diff"] <= EQUIV_TOL
            L += [f"Same computation: {eq['k']} noise-free DP-SGD steps (clip C, sigma 0, SGD lr {eq['lr']}) from the same exported weights "
                  f"and batch{' (one fixed masking, dropout 0)' if model == 'bert' else ''}; mean loss before each step and after the last:",
                  f"fedpriv {[round(x, 5) for x in eq['fedpriv']]}, {pname} {[round(x, 5) for x in eq['opacus']] if eq.get('opacus') else eq.get('error')}; "
                  f"max |difference| {fmt(eq.get('max_abs_diff'))} (tolerance {EQUIV_TOL}): **{'same' if ok else 'NOT the same'}**"
                  + (" (checked with Opacus' `dp-hooks` path; `dp-ghost` reaches the same clipped sum by another route and was not checked separately)." if pk == "opacus" else "."), ""]
            if model == "nwp":
                L += ["What had to match: torch's LSTM has two gate biases (`bias_ih`, `bias_hh`), fedpriv's (like Keras') one. The port loads "
                      "fedpriv's bias into `bias_ih` and holds `bias_hh` at 0, frozen; with both trainable, each receives the full bias "
                      "gradient (the bias moves twice as far per step, and the per-example norm counts it twice), which is what an earlier "
                      "run's 0.098-nat gap after 3 steps was. Gate order (i, f, g, o), the loss (per example: mean over its non-pad targets; "
                      "batch: mean over examples), clipping (to C = 1 per example; Opacus divides by norm + 1e-6) and the normalization "
                      "(clipped sum / batch size) already matched: per-example losses agreed to 1e-6 and per-example gradient norms to 5 "
                      "digits before the first step.", ""]
        med = o["median_s"]
        L += ["| variant | median s/step | examples/s | samples |", "| --- | --- | --- | --- |"]
        for k, v in med.items():
            L.append(f"| {k} | {v:.3f} | {o['batch'] / v:.1f} | {o['samples'][k]} |")
        L.append("")
        pairs = [("fedpriv non-private", f"{pk} non-private")]
        best_f = min((k for k in med if k.startswith("fedpriv dp")), key=lambda k: med[k], default=None)
        best_o = min((k for k in med if k.startswith(f"{pk} dp")), key=lambda k: med[k], default=None)
        for f in [k for k in med if k.startswith("fedpriv dp")]:
            for p in [k for k in med if k.startswith(f"{pk} dp")]:
                pairs.append((f, p))
        L += ["| fedpriv | peer | ratio fedpriv / peer |", "| --- | --- | --- |"]
        for f, p in pairs:
            if f in med and p in med:
                L.append(f"| {f} | {p} | **{med[f] / med[p]:.3f}** |")
        L.append("")
        for f, p in pairs:
            if f in med and p in med and med[f] >= med[p]:
                L.append(f"**fedpriv is NOT ahead on this pair: {f} takes {med[f] / med[p]:.2f}x the time of {p}.**")
        if best_f and best_o:
            r = med[best_f] / med[best_o]
            L.append(f"Best DP step of each: {best_f} / {best_o} = {r:.3f}: " + ("fedpriv is faster." if r < 1 else f"**fedpriv is NOT ahead here: {pname} is faster.**"))
            for side in ("fedpriv", pk):
                base = med.get(f"{side} non-private")
                bd = min((v for k, v in med.items() if k.startswith(f"{side} dp")), default=None)
                if base and bd:
                    L.append(f"- {side}: best DP step / its own non-private step = {bd / base:.2f}x")
        if o.get("peer_errors"):
            for k, v in o["peer_errors"].items():
                L.append(f"- {pname} `{k}` failed on this model: `{v}`" + (
                    " Cause: Opacus 1.6.0's ghost norm for `nn.Embedding` (`embedding_norm_sample.py`) calls `input_ids.view(-1, 1)`, "
                    "which fails on a non-contiguous id tensor, and this run's harness passed one (NWP: the sliced `ids[:, :-1]`; BERT: "
                    "the expanded position ids). `opacus_peer.py` now makes them contiguous; this section has not been rerun since, so "
                    "Opacus' ghost-clipping step time is missing here: rerun the section for it." if "view size is not compatible" in v and
                    o.get("when", "") < "2026-11-23 18:52" else ""))
        if o.get("fedpriv_fast_unavailable"):
            L.append(f"- fedpriv fast clipping unavailable: {o['fedpriv_fast_unavailable']}")
        L.append("")

    f = res.get("flower")
    if not f:
        L += kept(old, "flower")
    if f:
        L += ["## (c) DP-FedAvg against Flower's built-in DP", "", f"Command: `{f['command']}` ({f['when']}); wall {f.get('wall_s')} s.", ""]
        if "error" in f and "builtin_round_seconds" not in f:
            L += [f"Not measured: {f['error']}", ""]
        else:
            L += [f"NWP `{f['model']}` model, {f['users']} users, all {f['clients_per_round']} in every round (cohort = population, so both sides "
                  f"train the same users), one local epoch of batch 16 (at most 32 examples/user), clip S = {f['clip_norm']}, noise multiplier "
                  f"{f['noise_multiplier']}; {f['rounds']} rounds, round 1 (data preparation in the actors, compilation) left out of the median; flwr {f['versions']['flwr']}. Flower side: "
                  "`DifferentialPrivacyServerSideFixedClipping(FedAvg(...), z, S, m)` in `flwr.simulation.run_simulation` with one SuperNode per "
                  "user and a ClientApp running fedpriv's own jitted client update (so the difference is the server/runtime, not the client math). "
                  "The three runs are sequential in one process (a Ray simulation cannot be interleaved round by round with another), so "
                  "these ratios carry more of the shared machine's drift than the interleaved ones above. Both Flower runs use Ray actors of "
                  "1 CPU (2 actors on this machine); fedpriv's Flower engine sends each of its 4 SuperNodes one user per message, Flower's "
                  "strategy needs one SuperNode per user.", "",
                  "The first attempt hung: Flower's simulation starts Ray (forking subprocesses) while its ServerApp thread runs, and the "
                  "ServerApp built the initial weights there; the orthogonal initializer's QR (jaxlib's LAPACK = scipy's OpenBLAS, "
                  "multi-threaded at this size) spun forever in `exec_blas_async_wait` with no OpenBLAS worker thread left in the process "
                  "(OpenBLAS stops its workers around a fork), the ClientApp actors idle. The benchmark now builds the initial weights in "
                  "the main thread and runs the Flower simulations with scipy's OpenBLAS on one thread (`single_threaded_scipy_blas` in "
                  "`fedpriv/engines/flower_sim.py`, which fedpriv's Flower engine now uses too; only initialization uses it, no timed work).", ""]
            vec = statistics.median(f["vectorized_round_seconds"][1:])
            fl = statistics.median(f["fedpriv_flower_round_seconds"][1:])
            bi = statistics.median(f["builtin_round_seconds"][1:])
            r3 = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
            L += ["| run | median s/round (rounds 2..) | all rounds (s) | ratio fedpriv / Flower built-in |", "| --- | --- | --- | --- |",
                  f"| fedpriv DP-FedAvg, vectorized engine | {vec:.3f} | {r3(f['vectorized_round_seconds'])} | **{vec / bi:.3f}** |",
                  f"| fedpriv DP-FedAvg, Flower engine | {fl:.3f} | {r3(f['fedpriv_flower_round_seconds'])} | **{fl / bi:.3f}** |",
                  f"| Flower DifferentialPrivacyServerSideFixedClipping + FedAvg | {bi:.3f} | {r3(f['builtin_round_seconds'])} | 1 |", ""]
            if fl / bi >= 1:
                L.append(f"**fedpriv's Flower engine is not ahead of Flower's built-in DP here ({fl / bi:.2f}x its round time).**")
            if vec / bi >= 1:
                L.append(f"**fedpriv's vectorized engine is not ahead of Flower's built-in DP here ({vec / bi:.2f}x its round time).**")
            ok = f["equiv_rel_diff"] <= 1e-4
            uniform = f.get("flower_weighting") == "uniform"
            L += ["", f"Same computation: one noise-free round (clip S, z = 0) by fedpriv (`fedavg-clip`, vectorized) and by Flower's wrapper "
                  f"(noise 0) from the same initial weights: ||fedpriv - Flower|| / ||fedpriv's update|| = {f['equiv_rel_diff']:.2e} "
                  f"(max |diff| {f['equiv_max_abs_diff']:.2e}; tolerance 1e-4): **{'same' if ok else 'NOT the same'}**. The users' example counts "
                  f"were {f['example_counts']}; " + ("Flower's FedAvg was given uniform weights (`weighted_by_key` = a reply metric that is 1 for every "
                  "user), as user-level DP-FedAvg needs, so it averages the clipped updates as fedpriv does. With its default `num-examples` "
                  "weighting the two differ by design (an earlier run: relative difference 5.2e-02)." if uniform else
                  "Flower's FedAvg weighted the clipped updates by example count, fedpriv uniformly, so they differ by design."), ""]
            if f.get("fedpriv_ledger"):
                L += [f"fedpriv's privacy ledger for the timed run: `{json.dumps(f['fedpriv_ledger'].get('entries'))}`.", ""]
            L += [
                  "What each accounts:", "",
                  "- fedpriv: user-level (epsilon, delta) with dp-accounting RDP (or PLD), fixed-size cohorts accounted as sampling without replacement "
                  "under replace-one-user (sensitivity 2S) or Poisson under add-or-remove-one; a uniform 1/m average, so the sensitivity bound holds "
                  "whatever the example counts; every round's sampling and noise go into the run's privacy ledger, from which (epsilon, delta) is reported.",
                  "- Flower 1.41: the wrapper clips each update to S and adds N(0, (z S / m)^2) to the average; with no `accountant` (as here) "
                  "it computes no epsilon at all. Flower 1.41 does ship an RDP accountant (`flwr.supercore.privacy_accounting.rdp_accountant."
                  "RdpAccountant`, a wrapper over dp-accounting, behind the `PrivacyAccountant` protocol exported from `flwr.serverapp`), but "
                  "`DifferentialPrivacyServerSideFixedClipping` accepts one only with `sampling_method='no-amplification'` (no credit for "
                  "sampling a cohort from the population), only over an unmodified `FedAvg.aggregate_train`, and then requires equal client weights "
                  "under `weighted_by_key` (default `num-examples`, so with unequal counts an accounted run stops with an error rather than "
                  "releasing an average whose sensitivity is not S/m). The accounting unit is a client's whole update, i.e. user level, as in fedpriv.", ""]

    t = res.get("tff")
    if not t:
        L += kept(old, "tff")
    if t:
        L += tff_block(t)

    p = res.get("pfl")
    if not p:
        L += kept(old, "pfl")
    if p:
        L += pfl_block(p)

    # Sections written by hand (no result of this driver owns them: (f) scaling, (g) the device check) stay as they are.
    owned = tuple(TITLES.values()) + ("## Environments", "## Not measured")
    for head, block in old["blocks"].items():
        if not head.startswith(owned):
            L += block + [""]

    L += ["## Not measured", ""]
    if not res.get("flower") and not kept(old, "flower"):
        L.append("- (c) Flower's built-in DP round time: not run yet (`--sections flower`).")
    if not res.get("opacus-bert") and not kept(old, "opacus-bert"):
        L.append("- (b) Opacus on BERT-small: the torch port and the section are written (`--sections opacus-bert`) but have not run yet.")
    if not res.get("tf-keras") and not kept(old, "tf-keras"):
        L.append("- (d) TF Privacy's DP Keras optimizer step time on the NWP LSTM: not run yet "
                 "(`.venv/bin/python benchmarks/peers/run.py --sections tf-keras --repeats 2`, about 10 minutes).")
    if not peer_python("tff") and not res.get("tff") and not kept(old, "tff"):
        err = env_error("tff")
        L.append("- (e) TensorFlow Federated 0.87 (`DifferentiallyPrivateFactory.gaussian_fixed`): " +
                 (f"cannot be installed on this machine's Python 3.11 (`bash benchmarks/peers/envs.sh tff`): `{' '.join(err.split())}`. TFF 0.87.0 pins jax/jaxlib 0.4.14, and PyPI offers "
                  "no jaxlib 0.4.14 that pip can take here." if err else "its environment was not created."))
    if L[-1] == "":  # nothing left unmeasured: no such heading
        L = L[:-2]
    L.append("")
    return order_sections("\n".join(L) + "\n")


def pfl_reading(t: list[dict], fl: dict) -> list[str]:
    """What the timing rows say about where the time goes, with the per-step arithmetic from them."""
    L = ["Reading these numbers: on a CPU the engines compute the same local steps, one client after another (fedpriv's "
         "`scan` removes the per-client overhead; XLA's CPU runtime and torch each spread a step's matrix products over the "
         "cores); a step's arithmetic, dominated by the 10,004-word output layer, is the same in every engine."]
    m_big = max((m for m in fl), default=None)
    mine = next((r for r in t if r.get("cohort") == m_big and r.get("variant") == "fedavg" and "error" not in r), None)
    if mine and mine.get("local_steps"):
        f = fl[m_big]
        ms_fp = 1000 * mine["fedpriv_median_s"] / mine["local_steps"]
        ms_fl = 1000 * f["median_s"] / mine["local_steps"]
        L[0] += (f" At m = {m_big:,}: fedpriv {ms_fp:.1f} ms of wall time per local step, pfl "
                 f"{1000 * mine['pfl_median_s'] / mine['local_steps']:.1f} ms, Flower {ms_fl:.1f} ms (its actors in parallel)"
                 + (f"; 10x Flower would need {ms_fl / 10:.1f} ms per step, {ms_fp / (ms_fl / 10):.1f}x below what fedpriv's compiled step "
                    "costs here." if ms_fp > ms_fl / 10 else ".")
                 + " An accelerator computes a chunk's clients at once (`vectorize = \"vmap\"`), which a CPU cannot; "
                 "`benchmarks/gpu_check.sh` measures that.")
        cap = 10 * f.get("supernodes", 4) * f.get("users_per_message", 1)
        if f["updates_per_s"] >= 0.9 * cap:
            L[0] += (f" Flower's {f['updates_per_s']:.1f} updates/s is at its simulation runtime's cap: each virtual SuperNode is "
                     f"handed at most one message every 0.1 s, so {f.get('supernodes', 4)} SuperNodes with {f.get('users_per_message', 1)} "
                     f"user(s) per message pass at most {cap} a second (docs/federated.md); more SuperNodes or users per message "
                     "lift the cap, not the arithmetic of a step.")
    return L + [""]


def pfl_block(p: dict) -> list[str]:
    L = ["## (h) FedAvg and DP-FedAvg against pfl-research", "", f"Command: `{p['command']}` ({p['when']}); wall {p.get('wall_s')} s.", ""]
    if "error" in p and not p.get("timing"):
        return L + [f"Not measured: {p['error']}", ""]
    if p.get("partial"):
        L += ["**This run was cut short: the tables below hold what it had measured by then.**", ""]
    v, loc, pop = p["versions"], p["local"], p["population"]
    mm = (p.get("meta") or {}).get("machine")
    if mm:
        L += [f"Machine of this section: `{mm['arch']}`, {mm['cpus']} CPUs ({mm['processor']}), Python {mm['python']}, jax {mm['jax']}.", ""]
    L += [f"Versions: pfl {v['pfl']} (PyTorch backend), torch {v['torch']} ({v['threads']} threads), dp-accounting {v['dp_accounting']}, "
          f"prv-accountant {v['prv_accountant']} in `.bench-envs/pfl`. The task: NWP `{p['model']}` LSTM ({pop['params']:,} parameters; "
          f"vocabulary 10,004, sequences of 20) on `synthetic:stackoverflow` with {pop['users']:,} users ({pop['examples']:,} examples, at "
          f"most {pop['counts_max']} per user), {loc['epochs']} local epoch of SGD {loc['client_lr']} over batches of {loc['batch']}, server "
          f"{loc['server']}; FedAvg weighted by example counts; DP-FedAvg with uniform weights, clip S = {p['clip_norm']}, noise multiplier "
          f"{p['noise_multiplier']} on the sum, divided by the cohort size m. Both sides train the same users: each round's cohort is "
          "fedpriv's fixed-size sampler's, exported to the peer. pfl side (`benchmarks/peers/pfl_peer.py`): its own simulator, "
          "`FederatedAveraging` + `PyTorchModel` (local `torch.optim.SGD`, central `torch.optim.SGD(lr=1)`) run round by round through "
          "`SimulatedBackend.gather_results` and `process_aggregated_statistics` (what `FederatedAlgorithm.run` does each central iteration, "
          "without evaluation or callbacks), postprocessors `WeightByDatapoints` (FedAvg) or `WeightByUser` + "
          "`CentrallyAppliedPrivacyMechanism(GaussianMechanism(S, z))` (DP-FedAvg); the LSTM ported to torch as for Opacus (section (b): "
          "one gate bias, torch's `bias_hh` frozen at 0). fedpriv side: `VectorizedEngine.round` (scan over chunks of 128 clients on the "
          "CPU), `benchmarks/peers/pfl_bench.py`.", ""]
    L += ["Same computation: one round from the same initial weights on round 1's cohort of 100 users, each user's batches in "
          "fedpriv's round-1 order; relative difference ||fedpriv - pfl|| / ||fedpriv's update|| of the new weights (tolerance 1e-4):", "",
          "| strategy | clip S | users | ||update|| fedpriv | ||update|| pfl | max abs diff | relative diff | same? |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for e in p.get("equiv", []):
        if "error" in e:
            L.append(f"| {e['strategy']} | {e['clip']} | | | | | `{e['error']}` | **no answer** |")
            continue
        ok = e["rel_diff"] <= 1e-4
        L.append(f"| {e['strategy']} | {e['clip'] if e['clip'] is not None else '-'} | {e['users']} | {e['update_norm']:.4g} | {e['peer_update_norm']:.4g} | "
                 f"{e['max_abs_diff']:.2e} | {e['rel_diff']:.2e} | **{'same' if ok else 'NOT the same'}** |")
    L += ["", "`fedavg-clip` is DP-FedAvg without noise (each delta clipped to S, uniform weights, divided by m); at S / 10 clipping binds "
          "for every user.", ""]
    t = p.get("timing", [])
    fl = {r["cohort"]: r for r in p.get("flower", [])}
    L += [f"Speed and memory, measured in one run: for each cohort m and algorithm, fedpriv's programs compiled first (one user per "
          "bucket at the round's width) and, before the first cohort, one untimed pfl round (torch's first calls); then "
          f"{p['repeats']} alternating block(s) of {p['rounds']} round(s) (fedpriv's, then pfl's, on the same rounds' cohorts). Client updates per second = m / median round seconds. Peak memory: each process's resident high-water mark "
          "(`VmHWM`, reset before each block), the largest over its blocks; fedpriv's is the driver process's, which also holds JAX and "
          "the prepared corpus, pfl's the peer's (torch, the exported rows).", "",
          "| cohort m | algorithm | local steps/round | fedpriv s/round | pfl s/round | fedpriv updates/s | pfl updates/s | fedpriv speed / pfl's | fedpriv peak MiB | pfl peak MiB |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in t:
        if "error" in r:
            L.append(f"| {r['cohort']:,} | {r['variant']} | | | | | | `{r['error']}` | | |")
            continue
        L.append(f"| {r['cohort']:,} | {r['variant']} | {r['local_steps']:,} | {r['fedpriv_median_s']:.2f} | {r['pfl_median_s']:.2f} | {r['fedpriv_updates_per_s']:.1f} | "
                 f"{r['pfl_updates_per_s']:.1f} | **{r['fedpriv_over_pfl_speed']:.2f}x** | {fmt(r.get('fedpriv_peak_mb'), 4)} | {fmt(r.get('pfl_peak_mb'), 4)} |")
    L.append("")
    if fl:
        L += [f"Flower (fedpriv's Flower engine, flwr {next(iter(fl.values()))['flwr']}; one user per message, as a Flower ClientApp trains a "
              "client; 4 SuperNodes, Ray actors of 1 CPU; FedAvg, the same cohorts; run after the blocks above, in the same process, so NOT interleaved with them: "
              f"its ratios carry the machine's drift between the two; round 1 left out of the median, {p['rounds']} round(s) timed):", "",
              "| cohort m | Flower s/round | Flower updates/s | fedpriv FedAvg updates/s | fedpriv / Flower | pfl FedAvg updates/s | pfl / Flower |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
        for m, f in sorted(fl.items()):
            mine = next((r for r in t if r.get("cohort") == m and r.get("variant") == "fedavg" and "error" not in r), None)
            L.append(f"| {m:,} | {f['median_s']:.2f} | {f['updates_per_s']:.1f} | {fmt(mine['fedpriv_updates_per_s'] if mine else None, 3)} | "
                     f"**{(mine['fedpriv_updates_per_s'] / f['updates_per_s']) if mine else float('nan'):.1f}x** | "
                     f"{fmt(mine['pfl_updates_per_s'] if mine else None, 3)} | {(mine['pfl_updates_per_s'] / f['updates_per_s']) if mine else float('nan'):.1f}x |")
        L.append("")
    goals = []
    for r in t:
        if "error" in r:
            continue
        if r["fedpriv_over_pfl_speed"] < 1:
            goals.append(f"**fedpriv is NOT as fast as pfl at m = {r['cohort']:,} ({r['variant']}): {r['fedpriv_over_pfl_speed']:.2f}x pfl's updates/s.**")
    for m, f in fl.items():
        mine = next((r for r in t if r.get("cohort") == m and r.get("variant") == "fedavg" and "error" not in r), None)
        if m >= 1000 and mine and mine["fedpriv_updates_per_s"] < 10 * f["updates_per_s"]:
            goals.append(f"**fedpriv is NOT 10x Flower at m = {m:,}: {mine['fedpriv_updates_per_s'] / f['updates_per_s']:.1f}x.**")
    L += goals + ([""] if goals else [])
    L += pfl_reading(t, fl)
    eps = p.get("epsilon", [])
    if eps:
        L += ["Accountants on the same DP-FedAvg parameters (Poisson sampling of users with q = m / N, add-or-remove one user, T rounds, "
              "noise multiplier z): fedpriv's `epsilon_for(GaussianSteps('poisson', z, N, m, T), delta)` (dp-accounting, RDP and PLD) "
              "against pfl's `RDPPrivacyAccountant`, `PLDPrivacyAccountant` (both on dp-accounting) and `PRVPrivacyAccountant` "
              "(prv-accountant), each given `noise_parameter = z` and delta:", "",
              "| setting | q | z | T | delta | fedpriv RDP | pfl RDP | fedpriv PLD | pfl PLD | pfl PRV |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for e in eps:
            L.append(f"| {e['name']} | {e['q']:.3g} | {e['sigma']} | {e['steps']:,} | {e['delta']:g} | {e['fedpriv_rdp']:.4f} | {fmt(e.get('pfl_rdp'), 5)} | "
                     f"{e['fedpriv_pld']:.4f} | {fmt(e.get('pfl_pld'), 5)} | {fmt(e.get('pfl_prv'), 5)} |")
        L.append("")
    return L


def order_sections(text: str) -> str:
    """The page's '## (x) ...' sections in the order of their letters (a) to (e), whatever order they were written in."""
    parts = text.split("\n## ")
    head, rest = parts[0], ["## " + x for x in parts[1:]]
    lettered = sorted((x for x in rest if x.startswith("## (")), key=lambda x: x[3:6])
    before = [x for x in rest if not x.startswith("## (") and not x.startswith("## Not measured")]
    after = [x for x in rest if x.startswith("## Not measured")]
    return "\n".join([head] + before + lettered + after).rstrip("\n") + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="epsilon,opacus-nwp,opacus-bert,flower,tff,tf-keras,pfl", help="comma-separated")
    ap.add_argument("--repeats", type=int, default=3, help="alternating blocks per side")
    ap.add_argument("--block", type=int, default=1, help="steps per block")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--bert-batch", type=int, default=32)
    ap.add_argument("--reference", action="store_true", help="NWP: also time fedpriv's vmap reference clipping")
    ap.add_argument("--flower-users", type=int, default=20)
    ap.add_argument("--flower-rounds", type=int, default=6)
    ap.add_argument("--flower-model", default="small")
    ap.add_argument("--pfl-users", type=int, default=3000, help="pfl: synthetic:stackoverflow users (the population)")
    ap.add_argument("--pfl-cohorts", default="100,1000", help="pfl: cohort sizes timed")
    ap.add_argument("--pfl-rounds", type=int, default=2, help="pfl: rounds per timed block")
    ap.add_argument("--pfl-model", default="tiny", help="pfl: NWP LSTM size")
    ap.add_argument("--pfl-no-flower", action="store_true", help="pfl: leave Flower's engine out")
    ap.add_argument("--pfl-dp-cohorts", default=None, help="pfl: cohorts at which DP-FedAvg is timed too (default: every cohort)")
    ap.add_argument("--pfl-threads", type=int, default=0, help="pfl: torch intra-op threads (0, the default: torch's own, one per core, as fedpriv's XLA uses every core)")
    ap.add_argument("--page-only", action="store_true")
    args = ap.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    if not args.page_only:
        cmd = ".venv/bin/python benchmarks/peers/run.py " + " ".join(sys.argv[1:])
        meta = {"machine": machine()}
        for s in [x.strip() for x in args.sections.split(",") if x.strip()]:
            t0 = time.perf_counter()
            log(f"[run] section {s}")
            try:
                if s == "epsilon":
                    out = section_epsilon(args)
                elif s.startswith("opacus-"):
                    out = section_opacus(s.split("-", 1)[1], args)
                elif s == "flower":
                    out = section_flower(args)
                elif s == "tf-keras":
                    out = section_tf_keras(args)
                elif s == "tff":
                    out = section_tff(args)
                elif s == "pfl":
                    out = section_pfl(args)
                else:
                    raise SystemExit(f"unknown section {s}")
            except Exception as e:  # noqa: BLE001  the page says what failed
                import traceback

                traceback.print_exc()
                out = {"error": f"{type(e).__name__}: {e}"}
            out.update(command=cmd, when=dt.datetime.now().strftime("%Y-%m-%d %H:%M"), wall_s=round(time.perf_counter() - t0, 1), meta=meta)
            (RESULTS / f"{s}.json").write_text(json.dumps(out, indent=1, default=str))
            log(f"[run] section {s}: {out['wall_s']} s")
    PAGE.write_text(page())
    log(f"[run] wrote {PAGE}")


if __name__ == "__main__":
    main()
