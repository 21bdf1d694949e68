"""fedpriv's accounting against dp_accounting's on the same questions, timed round-robin in one
run (ratios are what this reports; absolute times drift on a shared machine), every answer
checked equal to the bit:

* **PLD per round**: the epsilon a run prints after every round, fedpriv's (each leaf's PLD
  built once per process, ``accounting.ComposedPld``) against PLDAccountant composing the same
  events from scratch;
* **RDP per sigma**: the Poisson-subsampled Gaussian's RDP vector at a new sigma (what each step
  of a calibration's bisection asks), fedpriv's ``rdp_poisson_gaussian`` against
  ``_compute_rdp_poisson_subsampled_gaussian``.

    .venv/bin/python benchmarks/accounting_speed.py [--users 51855] [--cohort 5000] [--sigma 1.10436]
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
            print(f"accounting_speed: the PLD epsilon differs at {steps} steps: {a!r} against {b!r}", file=sys.stderr)
            return 1
    pld = {"rounds": [first, last], "epsilon_last": a, "fedpriv_median_s": statistics.median(ours),
           "dp_accounting_median_s": statistics.median(theirs), "speedup": statistics.median(theirs) / statistics.median(ours)}
    rdp = rdp_per_sigma(run.batch / run.population, args.sigma)
    if rdp is None:
        return 1
    out = {"users": args.users, "cohort": args.cohort, "sigma": args.sigma, "pld_per_round": pld, "rdp_per_sigma": rdp}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"PLD epsilon after {last} rounds {a:.4f} (equal to the bit in every round)")
        print(f"PLD per round: fedpriv {pld['fedpriv_median_s']:.3f} s, dp_accounting {pld['dp_accounting_median_s']:.3f} s (median), {pld['speedup']:.1f}x")
        print(f"RDP per sigma ({len(rdp['sigmas'])} sigmas around {args.sigma}, equal to the bit): fedpriv {rdp['fedpriv_median_s']:.3f} s, "
              f"dp_accounting {rdp['dp_accounting_median_s']:.3f} s (median), {rdp['speedup']:.1f}x")
    return 0


def rdp_per_sigma(q: float, sigma: float) -> dict | None:
    """Both RDP vectors at 12 sigmas around ``sigma`` (each new, as in a bisection), round-robin."""
    import numpy as np
    from dp_accounting.rdp import rdp_privacy_accountant

    from fedpriv.privacy.accounting import RDP_ORDERS
    from fedpriv.privacy.rdp_poisson import rdp_poisson_gaussian

    orders = np.array(RDP_ORDERS)
    sigmas = [sigma * (1 + k / 97) for k in range(-6, 6)]
    rdp_poisson_gaussian(q, sigmas[0] * 0.5, orders)  # the integer orders' coefficients, remembered per q (as after a calibration's first step)
    ours, theirs = [], []
    for s in sigmas:
        t = time.perf_counter()
        a = rdp_poisson_gaussian(q, s, orders)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        b = rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian(q, s, orders)
        theirs.append(time.perf_counter() - t)
        if a.tobytes() != b.tobytes():
            print(f"accounting_speed: the RDP differs at sigma {s!r}", file=sys.stderr)
            return None
    return {"q": q, "sigmas": sigmas, "fedpriv_median_s": statistics.median(ours), "dp_accounting_median_s": statistics.median(theirs),
            "speedup": statistics.median(theirs) / statistics.median(ours)}


if __name__ == "__main__":
    raise SystemExit(main())
