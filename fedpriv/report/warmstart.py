"""What a report says about public data and warm starts (``data.public_fraction``/``public_source``,
``data.train_on = "public"``, ``[init] from``): the public data, the public model's utility
alone, and whether the utility target asks the private runs to learn from the private users
(at least :data:`MIN_GAIN` above the public model alone on the validation users)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: How far (a fraction: 0.01 = 1 point) the utility target must sit above the public model's own
#: validation utility, so that a row can reach it only by learning from the private users.
MIN_GAIN = 0.01


def start_label(summary: Mapping[str, Any]) -> str:
    """' (warm start: public model)' / ' (warm start: run NAME)' for a warm-started run, else ''."""
    init = summary.get("init")
    if not init:
        return ""
    return " (warm start: public model)" if init.get("public") else f" (warm start: run {init.get('name')})"


def public_flag(summary: Mapping[str, Any]) -> str | None:
    """The flag of a run trained on the public data only: '' when it stays below the target (as
    it must), a warning when it reaches it; None for any other run."""
    if summary.get("trained_on") != "public":
        return None
    t = summary.get("target") or {}
    if t.get("reached"):
        return "the public model alone reaches the utility target: the target does not need the private users"
    return ""


def public_notes(summaries: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Report notes: the public data, each public run's best validation utility against the
    target, and a warning when the target is less than MIN_GAIN above it."""
    notes: list[str] = []
    data = next((s["public_data"] for s in summaries.values() if s.get("public_data")), None)
    if data:
        where = f"{data['fraction']:.0%} of the users of {data['source']}, by a stable hash of the user id" if data.get("fraction") else f"the source {data['source']}"
        notes.append(
            f"Public data: {data['users']:,} users, {data['examples']:,} examples ({where}); disjoint from the private, validation and test users, "
            "never trained on privately, no canaries. The vocabulary of every run is learned from it, so no non-private statistic of the private users reaches the model through it."
        )
    for name, s in summaries.items():
        if s.get("trained_on") != "public":
            continue
        final = s.get(f"validation_{s.get('utility_metric')}")
        targets = sorted({t["value"] for o in summaries.values() if (t := o.get("target")) and ((t.get("above") or {}).get("run") == name or (o.get("init") or {}).get("name") == name)})
        if final is None or not targets:
            notes.append(f"Run {name} trained on the public data alone (final validation utility {'—' if final is None else f'{100 * final:.2f}%'}); no run is trained to a target against it.")
            continue
        gap = min(targets) - final
        shown = ", ".join(f"{100 * t:.2f}%" for t in targets)
        text = f"Run {name} (the public model alone): final validation utility {100 * final:.2f}%; the target of the runs that start from it is {shown} ({100 * gap:+.2f} points)"
        if gap < MIN_GAIN - 1e-12:
            text += f". WARNING: the target is less than {100 * MIN_GAIN:g} point above the public model alone, so a private row could reach it without learning from the private users"
        notes.append(text + ".")
    started = sorted(n for n, s in summaries.items() if (s.get("init") or {}).get("public"))
    if started:
        notes.append(f"{len(started)} run(s) start from the public model (warm start, `[init] from`); a warm start from public data costs no privacy.")
    other = sorted(n for n, s in summaries.items() if s.get("init") and not s["init"].get("public"))
    if other:
        notes.append(f"Run(s) {', '.join(other)} start from a run trained on the private users: that run's privacy is not composed into their ε.")
    return notes
