"""What no printed epsilon counts: the report's section on the data and choices outside the ledger.

Each epsilon bounds what a run releases about one of its training units, for the run as it was
configured. Around the runs, an experiment reads private data in ways no ledger records:

* the **validation users** decide when a run with a utility target stops, and which candidate a
  ``tune`` grid keeps; they are never trained on, and no epsilon covers them;
* a ``tune`` grid trains one trial per candidate on the private training users and keeps the
  best: the chosen run's epsilon does not count the choice (releasing the best of several DP runs
  can reveal more than one run's epsilon; Papernot & Steinke 2022 bound the cost);
* the **test users**' utility is printed without noise, and so is the validation users' wherever
  a run evaluates them (with no target or tuning too);
* what the runs **write beside their models** (data facts, round times, the memorization audit's
  files: canary sharers and the examples replaced, scores on chosen training examples) holds exact
  statistics of the training data (:data:`fedpriv.training.coverage.DATA_FACTS_NOTE`, which every
  DP guarantee carries; runs stored before it was added do not, so the section says it for all);
* choices the experiment's author made by looking at private data outside any run (a learning
  rate probed on the validation users, a model size, a cohort size), declared in the experiment
  file's ``uncounted_choices`` and printed as given.

It also lists, for runs that stopped at their target, the ex-post epsilon of the steps they took
beside the promise of every step they could take (:mod:`fedpriv.report.stopping`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _private(s: Mapping[str, Any]) -> bool:
    return s.get("epsilon") is not None or s.get("client_epsilon") is not None


def _values(values: Mapping[str, Any]) -> str:
    return ", ".join(f"`{k}` = {v!r}" for k, v in values.items())


def uncounted_lines(summaries: Mapping[str, Mapping[str, Any]], tunings: Mapping[str, Mapping[str, Any]], declared: Sequence[str]) -> list[str]:
    """The Markdown lines of the section (none when no run is private): ``summaries`` by run,
    ``tunings`` the ``tune/GROUP.json`` records by group, ``declared`` the experiment's
    ``uncounted_choices``."""
    if not any(_private(s) for s in summaries.values()):
        return []
    items: list[str] = []
    targeted = [n for n, s in summaries.items() if s.get("target")]
    if targeted or tunings:
        uses = []
        if targeted:
            uses.append(f"when each of the {len(targeted)} run(s) with a utility target stops")
            if any((s.get("target") or {}).get("above") for s in summaries.values()):
                uses.append("the target itself (set above a run's validation utility)")
        if tunings:
            uses.append("which candidate each tuning grid keeps")
        said = uses[0] if len(uses) == 1 else f"{', '.join(uses[:-1])} and {uses[-1]}"
        items.append(f"**The validation users.** Their data decides {said}. They are never trained on, and no ε covers them.")
    elif any(k.startswith("validation_") for s in summaries.values() for k in s):
        items.append("**The validation users.** Their utility and perplexity are printed without noise. They are never trained on, and no ε covers them.")
    stopped = [(n, s) for n, s in summaries.items() if s.get("epsilon_spent") is not None and s.get("promised_steps") and s["epsilon_spent"] < s["epsilon"]]
    if stopped:
        taken = "; ".join(f"{n}: {s['epsilon_spent']:.3g} of {s['epsilon']:.3g}" for n, s in stopped)
        items.append("**Where a run stopped.** A stop at a utility target depends on the data, so each such DP run's ε is that of every step "
                     "or round it could take, not of those it took. The steps taken alone give (ex-post figures, not guarantees): " + taken + ".")
    for group, t in tunings.items():
        tried = len(t.get("candidates", []))
        items.append(f"**Tuning of {group}.** {_values(t['winner'])} was chosen among {tried} candidates by validation "
                     f"{t.get('metric') or 'utility'}, each a trial on the private training users (record `tune/{group}.json`). "
                     "The run's ε does not count the choice: the best of several DP runs can reveal more than one run's ε.")
    items.append("**The test users.** Their utility and perplexity are printed without noise.")
    audited = any(s.get("audit") for s in summaries.values() if _private(s))
    items.append("**What the runs write beside their models.** The data notes and counts (`data.json`, the summaries' data notes and vocabulary "
                 "counts) and each round's wall time" + (", and the memorization audit's files (`canaries.json` names each canary's sharers "
                 "and how many of their examples it replaced, all of them when p_e = 1; `audit.json` scores the model on chosen training "
                 "examples)" if audited else "") + ", are exact statistics of the training data. A model released under DP is released without them.")
    items += [f"**Declared by the experiment.** {d}" for d in declared]
    return ["", "## What ε does not count", "",
            "Each ε bounds what one run releases about one of its training units, for the run as configured. Not counted:", "",
            *(f"- {i}" for i in items)]
