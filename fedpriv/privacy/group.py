"""Group privacy: what an (epsilon, delta) guarantee about one unit says about k units.

If M is (epsilon, delta)-DP for datasets that differ in one unit (added or removed), then for
datasets that differ in k units, chaining the k neighbouring steps x_0 ~ x_1 ~ ... ~ x_k gives

    P[M(x_0) in S] <= e^(k epsilon) P[M(x_k) in S] + delta * (1 + e^epsilon + ... + e^((k-1) epsilon))

so M is (k epsilon, delta * sum_{i<k} e^(i epsilon))-DP for groups of k units (Vadhan 2017,
"The Complexity of Differential Privacy", Lemma 2.2, which states the looser
delta_k = k e^((k-1) epsilon) delta; Dwork and Roth 2014, Theorem 2.2, for delta = 0). The sum
equals (e^(k epsilon) - 1) / (e^epsilon - 1) * delta for epsilon > 0 and is never above
k e^((k-1) epsilon) delta.

Uses here: an example-level guarantee read per user of at most k examples, and a filter that
changes up to k training examples when one raw example is added or removed.

>>> group_privacy(1.0, 1e-6, 1)
(1.0, 1e-06)
>>> eps, delta = group_privacy(0.5, 1e-6, 2)
>>> eps, round(delta / 1e-6, 6)
(1.0, 2.648721)

A large epsilon or group gives delta_k >= 1, which says nothing (:func:`vacuous`); past a float's
range it is inf:

>>> group_privacy(1000.0, 1e-5, 3)
(3000.0, inf)
"""

from __future__ import annotations

import math

from fedpriv.errors import PrivacyParameterError


def group_privacy(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """(epsilon_k, delta_k) for groups of ``k`` >= 1 units from (epsilon, delta) for one unit:
    (k epsilon, delta * sum_{i<k} e^(i epsilon)) (see the module docstring)."""
    if not isinstance(k, int) or k < 1:
        raise PrivacyParameterError(f"group size must be an integer >= 1, got {k!r}")
    if not (math.isfinite(epsilon) and epsilon >= 0) or not (0 <= delta <= 1):
        raise PrivacyParameterError(f"group privacy needs epsilon >= 0 and 0 <= delta <= 1, got ({epsilon}, {delta})")
    if delta == 0.0:
        return k * epsilon, 0.0
    try:
        return k * epsilon, delta * math.fsum(math.exp(i * epsilon) for i in range(k))
    except OverflowError:  # e^(i epsilon) beyond a float: delta_k is far above 1
        return k * epsilon, math.inf


def vacuous(delta: float) -> bool:
    """Whether a delta says nothing (>= 1: every event may have any probability)."""
    return not delta < 1.0
