"""NWP initial parameters computed once per test process.

Flax initializes op by op (the model's forward pass runs eagerly; a jitted init would be faster but
draws different bits), which costs seconds per model; the parameters depend only on the model
config and the key, so tests that start from the same (config, seed) share them. Callers derive
new trees (``tree_map``) and never mutate the returned one."""

from __future__ import annotations

import jax

_PARAMS: dict = {}


def initial_params(task, seed: int):
    """``task.init_params(jax.random.key(seed))``, remembered per (model config, seq_len, seed)."""
    key = (repr(task.cfg), task.seq_len, seed)
    if key not in _PARAMS:
        _PARAMS[key] = task.init_params(jax.random.key(seed))
    return _PARAMS[key]
