"""delta against 1/N: a delta of at least 1/N of the privacy unit promises nothing.

A mechanism that publishes one of N units (examples or users), chosen at random, in the clear is
(0, 1/N)-DP: so "epsilon at delta" with delta >= 1/N is met by publishing a record verbatim.
fedpriv refuses such a delta before any work, unless the user says ``--allow-large-delta``; then
the guarantee is printed with :func:`large_delta_note`, which says what it means.

>>> large_delta_problem("privacy.delta", 1e-3, 250, "user") is None
True
>>> large_delta_problem("privacy.delta", 0.5, 250, "user")[:46]
'privacy.delta = 0.5 is at least 1/N = 0.004 fo'
"""

from __future__ import annotations

#: How to let a large delta through (the CLI flag).
ALLOW_FLAG = "--allow-large-delta"


def large_delta_problem(key: str, delta: float, n: int, unit: str) -> str | None:
    """Why ``delta`` (at ``key``) is meaningless for ``n`` units of ``unit`` ("example" or
    "user"), or None when delta < 1/n."""
    if n <= 0 or delta < 1.0 / n:
        return None
    return (f"{key} = {delta:g} is at least 1/N = {1.0 / n:.3g} for N = {n} {unit}s: publishing one {unit}'s data in the clear "
            f"meets such a guarantee; use delta well below 1/N (e.g. {_suggest(n):g}), or pass {ALLOW_FLAG}")


def large_delta_note(key: str, delta: float, n: int, unit: str) -> str:
    """What an allowed ``delta >= 1/n`` means, to print beside the guarantee."""
    return (f"{key} = {delta:g} >= 1/N = {1.0 / n:.3g} (N = {n} {unit}s), allowed by {ALLOW_FLAG}: this guarantee does not rule out "
            f"publishing one {unit}'s data in the clear; it is no privacy guarantee for any one {unit}")


def answered_delta_note(delta: float, n: int, unit: str, epsilon: float) -> str | None:
    """What a delta the accountant answered for ``epsilon`` means when it is at least 1/n (None below)."""
    if n <= 0 or delta < 1.0 / n:
        return None
    return (f"delta = {delta:.3g} >= 1/N = {1.0 / n:.3g} (N = {n} {unit}s): at epsilon {epsilon:g} this mechanism does not rule out "
            f"publishing one {unit}'s data in the clear; it is no privacy guarantee for any one {unit}")


def _suggest(n: int) -> float:
    """A delta well below 1/n: the power of ten at or below 1/(10 n)."""
    import math

    return 10.0 ** math.floor(math.log10(1.0 / (10 * n)))
