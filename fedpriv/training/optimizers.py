"""The one optimizer factory: the central trainer's optimizer and the federated server's."""

from __future__ import annotations

from typing import Any

import optax

OPTIMIZERS = ("sgd", "momentum", "adam")
SCHEDULES = ("constant", "cosine", "warmup_cosine")


def make_optimizer(
    name: str,
    learning_rate: float,
    momentum: float = 0.9,
    schedule: str = "constant",
    warmup_steps: int = 0,
    total_steps: int = 1,
) -> optax.GradientTransformation:
    """optax SGD, SGD with momentum, or Adam, with a constant, cosine or warmup+cosine learning
    rate over ``total_steps`` (central steps, or federated rounds for the server optimizer)."""
    lr: Any = learning_rate
    if schedule == "cosine":
        lr = optax.cosine_decay_schedule(learning_rate, max(total_steps, 1))
    elif schedule == "warmup_cosine":
        lr = optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup_steps, max(total_steps, warmup_steps + 1))
    elif schedule != "constant":
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if name == "sgd":
        return optax.sgd(lr)
    if name == "momentum":
        return optax.sgd(lr, momentum=momentum)
    if name == "adam":
        return optax.adam(lr)
    raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")
