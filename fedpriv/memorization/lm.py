"""The NWP LSTM one token at a time: what Random Sampling, Beam Search and extraction need.

:class:`NWPStepper` runs the trained next-word-prediction model (:class:`fedpriv.models.nwp.NWPLSTM`)
as a recurrent scorer over a batch of states ``(h, c)``, each (B, H). Feeding ``[bos, w_1, ...]``
one id at a time gives exactly the model's log-probabilities (tested against the full forward
pass). Every function is jitted; callers pad batches to a fixed size so nothing recompiles.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.errors import FedprivError
from fedpriv.models.layers import lstm_cell

State = tuple[jax.Array, jax.Array]


def output_layer(params: Any) -> tuple[jax.Array, jax.Array]:
    """(W (d, V), b (V,)) of the output layer, tied to the input embedding or not."""
    if "output" in params:
        return params["output"]["kernel"], params["output"]["bias"]
    return params["embed"]["embedding"].T, params["output_bias"]


def advance(params: Any, h: jax.Array, c: jax.Array, tokens: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Feed ``tokens`` (B,) to states (h, c): the new states, the projection p (B, d) that the
    output layer reads, and the log-normalizer lse (B,) of the next-token distribution."""
    lstm = params["lstm"]
    z = jnp.take(params["embed"]["embedding"], tokens, axis=0) @ lstm["wi"] + lstm["b"]
    h, c = lstm_cell(z, h, c, lstm["wh"])
    p = h @ params["projection"]["kernel"] + params["projection"]["bias"]
    w, b = output_layer(params)
    return h, c, p, jax.nn.logsumexp(p @ w + b, axis=-1)


def next_log_probs(params: Any, p: jax.Array, lse: jax.Array, targets: jax.Array) -> jax.Array:
    """log P(targets | state) from the state's projection p (B, d) and normalizer lse (B,):
    one column of the output layer per row instead of the whole (B, V) matrix."""
    w, b = output_layer(params)
    return jnp.einsum("bd,db->b", p, jnp.take(w, targets, axis=1)) + jnp.take(b, targets) - lse


def all_log_probs(params: Any, p: jax.Array, lse: jax.Array) -> jax.Array:
    """(B, V) log-probabilities of every next id."""
    w, b = output_layer(params)
    return p @ w + b - lse[:, None]


class NWPStepper:
    """Step-by-step log-probabilities of a trained NWP model (see the module docstring)."""

    def __init__(self, task: Any, params: Any):
        if getattr(task, "name", None) != "nwp":
            raise FedprivError(f"Random Sampling, Beam Search and extraction need an nwp task, not {getattr(task, 'name', task)!r}")
        self.task, self.vocab = task, task.vocab
        self.params = jax.tree_util.tree_map(jnp.asarray, params)
        self.hidden = int(self.params["lstm"]["wh"].shape[0])
        self.vocab_size = int(output_layer(self.params)[1].shape[0])
        # one compiled program per shape, shared by every stepper (params are an argument)
        self._advance, self._next, self._all, self._run = _ADVANCE, _NEXT, _ALL, _RUN

    def zero_state(self, n: int) -> State:
        z = jnp.zeros((n, self.hidden), jnp.float32)
        return z, z

    @staticmethod
    def _run_impl(params: Any, ids: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        b = ids.shape[0]
        h0 = jnp.zeros((b, params["lstm"]["wh"].shape[0]), jnp.float32)

        def body(carry, tok):
            h, c, _, _ = carry
            return advance(params, h, c, tok), None

        d = params["projection"]["kernel"].shape[1]
        init = (h0, h0, jnp.zeros((b, d), jnp.float32), jnp.zeros((b,), jnp.float32))
        out, _ = jax.lax.scan(body, init, ids.T)
        return out

    def run(self, ids: np.ndarray) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """Feed whole prefixes ``ids`` (B, L) (all of length L, no padding) from the zero state:
        the final (h, c, p, lse)."""
        ids = jnp.asarray(np.asarray(ids, np.int32))
        if ids.ndim != 2 or ids.shape[1] == 0:
            raise FedprivError(f"prefixes must be a non-empty (B, L) array, got shape {tuple(ids.shape)}")
        return self._run(self.params, ids)

    def advance(self, h: jax.Array, c: jax.Array, tokens: Any) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        return self._advance(self.params, h, c, jnp.asarray(tokens, jnp.int32))

    def next_log_probs(self, p: jax.Array, lse: jax.Array, targets: Any) -> jax.Array:
        return self._next(self.params, p, lse, jnp.asarray(targets, jnp.int32))

    def all_log_probs(self, p: jax.Array, lse: jax.Array) -> jax.Array:
        return self._all(self.params, p, lse)

    def encode_words(self, words: Any) -> np.ndarray:
        """Words -> vocabulary ids (oov for unknown words)."""
        return np.array([self.vocab.id(w) for w in words], np.int32)

    def word_ids(self) -> np.ndarray:
        """The ids of the K in-vocabulary words (1..K: not pad, oov, bos or eos)."""
        return np.arange(1, len(self.vocab.words) + 1, dtype=np.int32)


# Module-level jits: a new stepper (a new model, or the same model again) reuses the traced and
# lowered programs of every earlier stepper of the same shapes instead of tracing them again.
_ADVANCE = jax.jit(advance)
_NEXT = jax.jit(next_log_probs)
_ALL = jax.jit(all_log_probs)
_RUN = jax.jit(NWPStepper._run_impl)
