"""Run a Flax model so that fast per-example clipping can see inside it.

Tasks call :func:`apply_model` instead of ``model.apply``. Normally that is the same call. Inside
:func:`capturing`, it also passes the zero ``perturbations`` being differentiated and collects the
``intermediates`` the layers of :mod:`fedpriv.models.layers` record, on the capture object.
The capture is read at trace time only, and its contents must be returned from the traced
function that made them (never kept outside it).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import flax.linen as nn

_ACTIVE: contextvars.ContextVar["Capture | None"] = contextvars.ContextVar("fedpriv_capture", default=None)


class Capture:
    def __init__(self, perturbations: Any | None):
        self.perturbations = perturbations
        self.intermediates: Any = None
        self.perturbation_zeros: Any = None
        self.calls = 0


@contextmanager
def capturing(perturbations: Any | None = None) -> Iterator[Capture]:
    """Within the block, :func:`apply_model` records intermediates; with ``perturbations=None`` it
    creates the zero perturbations (their shapes are what the caller needs)."""
    cap = Capture(perturbations)
    token = _ACTIVE.set(cap)
    try:
        yield cap
    finally:
        _ACTIVE.reset(token)


def apply_model(model: nn.Module, params: Any, *args: Any, **kwargs: Any) -> Any:
    """``model.apply({"params": params}, ...)``, capturing inside :func:`capturing`."""
    cap = _ACTIVE.get()
    if cap is None:
        return model.apply({"params": params}, *args, **kwargs)
    cap.calls += 1
    variables = {"params": params}
    if cap.perturbations is not None:
        variables["perturbations"] = cap.perturbations
        out, state = model.apply(variables, *args, mutable=["intermediates"], **kwargs)
    else:
        out, state = model.apply(variables, *args, mutable=["intermediates", "perturbations"], **kwargs)
        cap.perturbation_zeros = state.get("perturbations", {})
    cap.intermediates = state.get("intermediates", {})
    return out
