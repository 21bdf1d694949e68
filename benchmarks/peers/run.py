"""Peers benchmark driver (project venv): fedpriv against Opacus, TensorFlow Privacy, TensorFlow
Federated and Flower's built-in DP, on the same work, on this machine, and docs/benchmarks.md.

    .venv/bin/python benchmarks/peers/run.py [--sections epsilon,opacus-nwp,opacus-bert,flower]
        [--repeats 3] [--page-only]

Each peer runs in its own environment (.bench-envs/<peer>, made by benchmarks/peers/envs.sh) as a
subprocess that answers JSON commands on stdin/stdout, so fedpriv's steps and the peer's are
timed in alternating blocks in ONE run (the machine is shared; only ratios measured side by side
mean anything). Each section's results go to .bench-envs/results/<section>.json with the command
and the time it ran; the page is rebuilt from all of them.
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


class PeerProc:
    def __init__(self, argv: list[str]):
        WORK.mkdir(parents=True, exist_ok=True)
        self.err_path = WORK / f"{Path(argv[1]).stem}-{'-'.join(Path(a).stem for a in argv[2:4])}.stderr"
        self.err = open(self.err_path, "w")  # noqa: SIM115  the peer's stderr, quoted if it dies
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True, cwd=ROOT)
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
        r = subprocess.run([str(tf), str(HERE / "tf_peer.py"), "epsilon"], input=json.dumps(cfgs), capture_output=True, text=True, cwd=ROOT)
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
        r = subprocess.run([str(op), str(HERE / "opacus_peer.py"), "--model", "epsilon"], input=json.dumps(cfgs), capture_output=True, text=True, cwd=ROOT)
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

    with tempfile.TemporaryDirectory() as tmp:
        out = flower_dp.bench(args.flower_users, args.flower_rounds, args.flower_model, 1.0, 0.5, Path(tmp), log)
    out["versions"] = {"flwr": flwr.__version__}
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


def page() -> str:
    res = {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}
    L = ["# Benchmarks: fedpriv against its peers", "",
         "Written by `make bench` (`benchmarks/peers/run.py`; the peers' environments by `benchmarks/peers/envs.sh`).",
         "Every ratio is fedpriv / peer of times measured in ONE run, fedpriv's and the peer's steps in alternating blocks",
         "(< 1: fedpriv is faster). The machine is shared with other jobs: absolute times drift between runs; the ratios are what",
         "the page reports. Each section states the command that produced it, when, its wall time, and on what. The runs of "
         "2026-11-23 shared the 2 CPUs with two other fedpriv training jobs (load average about 7), which inflates every absolute time.", "",
         "`make bench-peers` (also the last step of `make bench`) builds the peers' environments if missing and runs sections "
         "`epsilon,opacus-nwp,opacus-bert,flower` with `--repeats 2` (override: `make bench-peers BENCH_PEERS_SECTIONS=... "
         "BENCH_PEERS_ARGS=...`). Section `tf-keras` is left out of the default because TF Privacy's jacobian-based DP step on the "
         "LSTM takes minutes to trace and run here; run it with `--sections tf-keras`. A section not rerun keeps its last result "
         "(and its own command line) on the page.", ""]
    any_meta = next(iter(res.values()), {}).get("meta") if res else None
    if any_meta:
        m = any_meta["machine"]
        L += [f"Machine: `{m['arch']}`, {m['cpus']} CPUs ({m['processor']}), Python {m['python']}; fedpriv side: jax {m['jax']}, numpy {m['numpy']}.", ""]
    L += ["## Environments", "",
          "| peer | environment | status |", "| --- | --- | --- |"]
    for name, what in (("opacus", "torch 2.13.0 (CPU) + opacus 1.6.0"), ("tf", "tensorflow 2.14.1 + tensorflow-privacy 0.9.0"), ("tff", "tensorflow-federated 0.87.0 (+ TF 2.14.1, TF Privacy 0.9.0)")):
        err = env_error(name)
        st = "installed" if peer_python(name) else f"NOT INSTALLED: `{err.strip()}`" if err else "not created"
        L.append(f"| {name} | `.bench-envs/{name}`: {what} | {st.replace(chr(10), ' ')} |")
    L.append("| Flower built-in DP | the project venv (flwr 1.41.0 is part of fedpriv's stack) | installed |")
    L.append("")

    e = res.get("epsilon")
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
                  "fedpriv's single gate bias and gate order).", ""]
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
                  "`flower_dp.py`; only initialization uses it, no timed work).", ""]
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

    L += ["## Not measured", ""]
    if not res.get("flower"):
        L.append("- (c) Flower's built-in DP round time: not run yet (`--sections flower`).")
    if not res.get("opacus-bert"):
        L.append("- (b) Opacus on BERT-small: the torch port and the section are written (`--sections opacus-bert`) but have not run yet.")
    if not res.get("tf-keras"):
        L.append("- (d) TF Privacy's DP Keras optimizer step time on the NWP LSTM: written (`--sections tf-keras`; `tf_peer.py nwp`), "
                 "step times NOT measured. A standalone run of the peer (not through run.py; 2026-11-23 18:33) on the same exported weights "
                 "and batch as section (b): 3 noise-free `DPKerasSGDOptimizer` steps (lr 1, clip 1, one microbatch per example) gave losses "
                 "[9.21095, 9.12889, 9.04254, 8.93854], fedpriv [9.21095, 9.12889, 9.04254, 8.93854], max |difference| 9.5e-07: the same "
                 "computation. Those 3 steps took 515 s including tracing (`tape.jacobian` through the LSTM); one non-private Keras step "
                 "1.35 s. Its one section run (2026-11-23 18:57, in the same process after the Flower section) failed at the start: the "
                 "TF peer exited before answering, and its stderr was discarded then (run.py now quotes it); not rerun for lack of time.")
    if not peer_python("tff"):
        err = env_error("tff")
        L.append("- (e) TensorFlow Federated 0.87 (`DifferentiallyPrivateFactory.gaussian_fixed`): " +
                 (f"cannot be installed on this machine's Python 3.11 (`bash benchmarks/peers/envs.sh tff`): `{' '.join(err.split())}`. TFF 0.87.0 pins jax/jaxlib 0.4.14, and PyPI offers "
                  "no jaxlib 0.4.14 that pip can take here." if err else "its environment was not created."))
    L.append("")
    return "\n".join(L) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="epsilon,opacus-nwp,opacus-bert,flower", help="comma-separated; also tf-keras")
    ap.add_argument("--repeats", type=int, default=3, help="alternating blocks per side")
    ap.add_argument("--block", type=int, default=1, help="steps per block")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--bert-batch", type=int, default=32)
    ap.add_argument("--reference", action="store_true", help="NWP: also time fedpriv's vmap reference clipping")
    ap.add_argument("--flower-users", type=int, default=20)
    ap.add_argument("--flower-rounds", type=int, default=6)
    ap.add_argument("--flower-model", default="small")
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
