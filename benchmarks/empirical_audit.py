"""How long the empirical privacy audit of one run takes, with 1,000 audit canaries.

    .venv/bin/python benchmarks/empirical_audit.py [--canaries 1000] [--model tiny] [--json]

Two runs of a small experiment on the bundled Shakespeare (a few steps or rounds each: what is
timed is the audit, not the training): central DP-SGD with example canaries (score: the
canary's loss under the model, one batched forward pass per 256 canaries) and DP-FedAvg with
random-direction canary clients (score: the cosine of the model's total update with each
canary's direction, one jitted map over the canaries). Each audit is
:func:`fedpriv.runner.audit.empirical_audit`: preparing the experiment again to check the
canaries, scoring, and jax-privacy's bounds (one-run, f-DP, GDP, TPR at FPR 1%, AUROC). The
report prints seconds per audit from one process; the machine is shared, so only numbers from
one run compare.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fedpriv.config import validate_config  # noqa: E402
from fedpriv.runner.audit import empirical_audit  # noqa: E402
from fedpriv.runner.dispatch import train_run  # noqa: E402
from fedpriv.runner.prepare import prepare  # noqa: E402


def experiment(kind: str, canaries: int, model: str) -> dict:
    base = {
        "name": f"bench-empirical-{kind}", "seed": 0,
        "data": {"source": "shakespeare", "heldout_fraction": 0.1, "max_examples_per_user": 16},
        "vocab": {"size": 2000, "seq_len": 20}, "task": {"kind": "nwp", "model": model},
        "audit": {"empirical": True, "empirical_canaries": canaries},
    }
    if kind == "example":
        base["training"] = {"optimizer": "adam", "learning_rate": 0.01, "batch_size": 64, "steps": 20, "eval_every": 20}
        base["privacy"] = {"clip_norm": 1.0, "noise_multiplier": 1.0, "delta": 1e-5}
    else:
        base["federated"] = {"strategy": "dp-fedavg", "rounds": 5, "clients_per_round": 50, "clip_norm": 0.5, "local_batch_size": 16,
                             "max_local_steps": 4, "client_learning_rate": 0.5, "eval_every": 5, "dp": {"noise_multiplier": 1.0, "delta": 1e-5}}
        base["audit"]["empirical_kind"] = "client"
    return base


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--canaries", type=int, default=1000)
    ap.add_argument("--model", default="tiny", help="NWP preset: tiny, small, stackoverflow")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("example", "client"):
            prepared = prepare(validate_config(experiment(kind, args.canaries, args.model)))
            run = Path(tmp) / kind
            train_run(prepared, run)
            t0 = time.perf_counter()
            report = empirical_audit(run)  # as `fedpriv audit RUN --empirical` runs it: prepares again
            whole = time.perf_counter() - t0
            rows.append({"kind": kind, "canaries": args.canaries, "model": args.model, "audit_seconds": whole,
                         "scoring_and_bounds_seconds": report["seconds"], "epsilon_lower_bound": report["epsilon_lower_bound"]})
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        print(f"{r['kind']:>7} canaries x{r['canaries']}, {r['model']} model: audit {r['audit_seconds']:.1f} s "
              f"(scoring and bounds {r['scoring_and_bounds_seconds']:.1f} s; the rest prepares the data again)")


if __name__ == "__main__":
    main()
