"""Whether one config and seed give the same parameters twice, on JAX's default backend, with
fedpriv's deterministic GPU flag (the default: ``--xla_gpu_deterministic_ops=true``, set when
fedpriv is imported) and without it (``FEDPRIV_GPU_NONDETERMINISTIC=1``).

    .venv/bin/python benchmarks/determinism.py [--experiment experiments/demo.toml]
        [--only sgd-iid-s0] [--set training.steps=100 ...] [--repeats 2] [--json]

Each mode trains the same run ``--repeats`` times at once, each in its own ``fedpriv run``
process and store, and compares the SHA-256 of the final ``params.msgpack``. On a CPU both modes
give identical parameters; on a GPU without the flag an embedding's scatter-add sums with atomics
and the runs drift apart (docs/architecture.md, "Determinism on a GPU"). Not a test: it needs an
accelerator to say anything, and CI has none.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = {"deterministic": {}, "default": {"FEDPRIV_GPU_NONDETERMINISTIC": "1"}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", default=str(ROOT / "experiments" / "demo.toml"))
    ap.add_argument("--only", default="sgd-iid-s0", help="the run to train (one name)")
    ap.add_argument("--set", action="append", default=None, help="KEY=VALUE overrides (as fedpriv run --set; default training.steps=100)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.repeats < 2:
        ap.error("--repeats must be at least 2")
    base = {k: v for k, v in os.environ.items() if k != "FEDPRIV_GPU_NONDETERMINISTIC"}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [base.get("PYTHONPATH")])])
    args.set = args.set or ["training.steps=100"]
    sets = [x for s in args.set for x in ("--set", s)]
    out = {"experiment": args.experiment, "run": args.only, "set": args.set, "modes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        procs = {}
        for mode, extra in MODES.items():
            for i in range(args.repeats):
                store = Path(tmp) / f"{mode}-{i}"
                cmd = [sys.executable, "-m", "fedpriv.cli", "run", args.experiment, "--only", args.only, "--out", str(store), "--no-report", *sets]
                procs[mode, i] = (store, subprocess.Popen(cmd, env={**base, **extra}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        for (mode, i), (store, p) in procs.items():
            err = p.communicate()[1]
            if p.returncode != 0:
                print(f"determinism: {mode} run {i} failed:\n{err[-2000:]}", file=sys.stderr)
                return 1
            params = next(store.rglob("params.msgpack"))
            out["modes"].setdefault(mode, []).append(hashlib.sha256(params.read_bytes()).hexdigest()[:16])
    import jax

    out["backend"], out["devices"] = jax.default_backend(), [str(d) for d in jax.devices()]
    for mode, hashes in out["modes"].items():
        out[f"{mode}_identical"] = len(set(hashes)) == 1
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for mode, hashes in out["modes"].items():
            print(f"{mode:13s} {'identical' if out[f'{mode}_identical'] else 'DIFFERENT'}  {' '.join(hashes)}")
        print(f"backend {out['backend']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
