"""The PLD epsilon a run prints after every round: fedpriv's (each leaf's PLD built once per
process, ``accounting.ComposedPld``) against dp_accounting's PLDAccountant composing the same
events from scratch, timed round-robin in one run (ratios are what this reports; absolute times
drift on a shared machine). The answers are checked equal to the bit.

    .venv/bin/python benchmarks/pld_per_round.py [--users 51855] [--cohort 5000] [--sigma 1.10436]
        [--rounds 100-120] [--json]

The defaults are the arXiv grid's DP-FedAvg-Poisson row (experiments/arxiv-dp.toml), whose
rounds are host-bound on a GPU (docs/private_comparison.md, "Wall time").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fedpriv.privacy import accounting  # noqa: E402
from fedpriv.privacy.accounting import GaussianSteps  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=51_855)
    ap.add_argument("--cohort", type=int, default=5_000)
    ap.add_argument("--sigma", type=float, default=1.10436)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--rounds", default="100-120", help="FIRST-LAST: the step counts asked, one per round")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    first, last = (int(x) for x in args.rounds.split("-"))
    run = GaussianSteps("poisson", args.sigma, args.users, args.cohort, first, unit="user")
    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    accounting.ComposedPld([run], relation).get_epsilon(args.delta)  # the leaf, built once, as a run's calibration does
    ours, theirs = [], []
    for steps in range(first, last + 1):
        events = [run.with_steps(steps)]
        t = time.perf_counter()
        a = accounting.ComposedPld(events, relation).get_epsilon(args.delta)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        acc = PLDAccountant(relation, value_discretization_interval=accounting.PLD_DISCRETIZATION)
        acc.compose(events[0].dp_event())
        b = acc.get_epsilon(args.delta)
        theirs.append(time.perf_counter() - t)
        if a != b:
            print(f"pld_per_round: epsilon differs at {steps} steps: {a!r} against {b!r}", file=sys.stderr)
            return 1
    out = {"users": args.users, "cohort": args.cohort, "sigma": args.sigma, "rounds": [first, last], "epsilon_last": a,
           "fedpriv_median_s": statistics.median(ours), "dp_accounting_median_s": statistics.median(theirs),
           "speedup": statistics.median(theirs) / statistics.median(ours)}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"epsilon after {last} rounds {a:.4f} (equal to the bit in every round)")
        print(f"per round: fedpriv {out['fedpriv_median_s']:.3f} s, dp_accounting {out['dp_accounting_median_s']:.3f} s (median), {out['speedup']:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
