"""The epsilon a run that stops at its utility target promises, for runs stored before it was recorded.

A run with a ``[utility]`` target stops at its first validation evaluation at or past it. When it
stops depends on the data, so what it releases is covered by the epsilon of every step it may
take, not by that of the steps it took (an ex-post figure; :class:`fedpriv.privacy.budget.DPBudget`,
``stops_on_data``). Runs train with that rule and record both (``epsilon`` the promise of
``promised_steps`` steps, ``epsilon_spent`` the steps taken). A run stored before has only the steps taken as its
``epsilon``: :func:`promised_summary` recomputes its promise from its privacy ledger's mechanism
and its config (``training.steps`` or ``federated.rounds``, within ``epsilon_budget`` if set), with
the run's accountant, and says so in its guarantee.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fedpriv.clients.privacy import EVERY_ROUND
from fedpriv.privacy.accounting import GaussianSteps, epsilon_for, max_steps_within

#: What a recomputed guarantee adds to the stored one.
RECOMPUTED = ("the run stopped at its utility target, a stop that depends on the data, so its guarantee is that of all {planned} {word}s "
              "it could take: epsilon {promised:.4g} (recomputed by the report; the {taken} {word}s taken alone give {spent:.4g}, an ex-post figure "
              "that is not a guarantee)")


def planned_steps(config: Mapping[str, Any], kind: str, event: GaussianSteps) -> int | None:
    """The steps (central) or rounds (federated) the run's config plans, or None when the config
    does not say (e.g. a central run planned in epochs of a population the ledger does not give)."""
    if kind == "federated":
        rounds = (config.get("federated") or {}).get("rounds")
        return int(rounds) if isinstance(rounds, int) else None
    t = config.get("training") or {}
    if isinstance(t.get("steps"), int):
        return t["steps"]
    # epochs count training records (central/sgd.py total_steps): the ledger's population is the
    # number of records only for example-level DP (user-level: users), so only there can it be recomputed
    if event.unit == "example" and isinstance(t.get("epochs"), (int, float)) and isinstance(t.get("batch_size"), int) and t["batch_size"] > 0:
        return max(1, math.ceil(t["epochs"] * math.ceil(event.population / t["batch_size"])))
    return None


def promised_summary(summary: Mapping[str, Any], entries: Sequence[GaussianSteps], config: Mapping[str, Any]) -> dict[str, Any]:
    """``summary`` with ``epsilon`` the promise of every step the run could take, when it is a DP
    run with a utility target stored before fedpriv recorded that (no ``epsilon_spent``) and it
    took fewer steps than planned; ``epsilon_ex_post`` set (and said in the guarantee) when it
    reached its target but its planned steps cannot be told; else ``summary`` unchanged."""
    out = dict(summary)
    if summary.get("epsilon") is None or "epsilon_spent" in summary or not summary.get("target") or len(entries) != 1:
        return out
    kind = summary.get("kind", "central")
    dp = ((config.get("federated") or {}).get("dp") if kind == "federated" else config.get("privacy")) or {}
    event = entries[0]
    planned = planned_steps(config, kind, event)
    if planned is None:
        if (summary.get("target") or {}).get("reached"):  # it stopped early, by how much the report cannot tell
            out["epsilon_ex_post"] = True
            out["guarantee"] = (f"{summary.get('guarantee') or 'DP'}; the run stopped at its utility target, a stop that depends on the data, and "
                                "the report cannot recompute the epsilon of every step it could take (its config plans them in epochs of records "
                                "the store does not give): this epsilon is that of the steps taken, an ex-post figure, not a guarantee")
        return out
    if event.steps >= planned:
        return out
    accountant = dp.get("accountant", "rdp")
    delta = float(summary.get("delta") or dp.get("delta"))
    if dp.get("epsilon_budget") is not None:  # the steps the budget allows, as the run computed them
        planned = max(event.steps, max_steps_within(event.with_steps(1), float(dp["epsilon_budget"]), delta, accountant, planned))
    promised = epsilon_for(event.with_steps(planned), delta, accountant).epsilon
    word = "round" if kind == "federated" else "step"
    out["epsilon_spent"], out["promised_steps"] = summary["epsilon"], planned
    out["epsilon"] = max(promised, summary["epsilon"])
    out["guarantee"] = f"{summary.get('guarantee') or 'DP'}; " + RECOMPUTED.format(planned=planned, word=word, promised=out["epsilon"], taken=event.steps, spent=summary["epsilon"])
    return out



def client_promise(summary: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """``summary`` with ``client_epsilon_ex_post`` set (and said in its client guarantee) when its
    record-level client-side DP-SGD epsilon is that of the rounds taken before a stop at its
    utility target (a run stored before such runs counted every planned round; the participation
    of the rounds not taken cannot be recomputed from the store); else ``summary`` unchanged."""
    out = dict(summary)
    planned = (config.get("federated") or {}).get("rounds")
    taken = summary.get("rounds")
    if (summary.get("client_epsilon") is None or not (summary.get("target") or {}).get("reached") or EVERY_ROUND in (summary.get("client_guarantee") or "")
            or not isinstance(planned, int) or not isinstance(taken, int) or taken >= planned):
        return out
    out["client_epsilon_ex_post"] = True
    out["client_guarantee"] = (f"{summary.get('client_guarantee') or 'client-side DP-SGD'}; the run stopped at its utility target after {taken} of {planned} "
                               "rounds, a stop that depends on the data: this epsilon is that of the rounds taken, an ex-post figure, not a guarantee")
    return out
