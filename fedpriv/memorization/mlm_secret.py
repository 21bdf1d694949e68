"""The masked-LM secret sharer (Hoory et al. 2021, Section 5.2; after Carlini et al. 2019).

A masked-LM canary follows a hint/secret pattern (S, HS, HSH, HHSHH, ...): ``H`` a hint word, ``S``
the secret (see :mod:`fedpriv.memorization.canaries`; every canary word of a WordPiece task is a
whole-word vocabulary token that tokenizes to exactly one piece). To audit a trained model, the
canary is encoded exactly as the task encodes an example (``[CLS] pieces [SEP]``), the secret's
piece is replaced by ``[MASK]``, and the model (no dropout) scores every vocabulary id at that
position.

Evaluation context: the canary itself. In fedpriv a planted example is *replaced* by the canary
(the federated secret sharer of Thakkar et al. 2021), rather than the canary being inserted at a
random location of each chosen example as in Hoory et al.; so every insertion of a canary has
the same context, its own hint words, and one evaluation gives the secret's rank (Hoory et al.
average the rank over the training examples that hold the canary).

Rank convention: rank = the number of vocabulary ids whose logit is at least the secret's (the
secret included): 1 + the other ids at or above it, so ties count against the secret (rank 1 =
the model's sole top prediction; a model whose logits are all equal ranks it last, exposure 0),
as Random Sampling counts them.
Logits, not probabilities, are compared; the softmax is monotone, so the order is the same.
The ranking is over all ``V = len(task.vocab)`` vocabulary tokens, special tokens and ``##``
continuations included, as in the paper's ``|vocab|``.

Exposure (bits): ``log2(V) - log2(rank)``, in [0, log2(V)]; log2(V) when the secret is the
model's top prediction, about 1 bit for a secret of median rank (a model that knows nothing).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.data.examples import TextExample
from fedpriv.errors import FedprivError
from fedpriv.memorization.canaries import Canary
from fedpriv.models.capture import apply_model
from fedpriv.tasks.mlm import MLMTask


@partial(jax.jit, static_argnums=0)
def _secret_ranks(model: Any, params: Any, ids: jax.Array, length: jax.Array, position: jax.Array, secret: jax.Array) -> jax.Array:
    """(B,) rank of ``secret[b]`` among all ids at ``position[b]`` of row b (``ids`` already
    masked). ``model`` is static (Flax modules hash by their config): one program per model
    shape and batch size."""
    logits = apply_model(model, params, ids, length, position[:, None], train=False)[:, 0, :]  # (B, V)
    target = jnp.take_along_axis(logits, secret[:, None], axis=1)  # (B, 1)
    return jnp.sum(logits >= target, axis=1, dtype=jnp.int32)


def masked_secret_example(task: MLMTask, canary: Canary) -> tuple[dict[str, np.ndarray], int, int]:
    """The canary encoded as the task encodes an example, with the secret's piece replaced by
    [MASK]: (the one-row batch, the secret's position in it, the secret's piece id)."""
    si = canary.secret_index
    if si is None:
        raise FedprivError(f"canary {canary.id}: no hint/secret pattern")
    if len(canary.pattern) != len(canary.words):
        raise FedprivError(f"canary {canary.id}: pattern {canary.pattern!r} does not match its {len(canary.words)} words")
    vocab = task.vocab
    secret_word = canary.words[si]
    pieces = vocab.word_ids(secret_word)
    if len(pieces) != 1 or pieces[0] in {int(i) for i in vocab.special}:
        shown = [vocab.tokens[i] for i in pieces]
        raise FedprivError(f"canary {canary.id}: the secret {secret_word!r} is not one vocabulary piece ({shown})")
    position = 1 + sum(len(vocab.word_ids(w)) for w in canary.words[:si])  # after [CLS]
    batch = task.encode([TextExample(" ".join(canary.words))])
    if position >= int(batch["length"][0]) - 1:  # cut off by max_len (the last real slot is [SEP])
        raise FedprivError(f"canary {canary.id}: the secret falls beyond max_len={task.max_len}")
    assert int(batch["ids"][0, position]) == pieces[0]
    batch["ids"][0, position] = vocab.mask
    return batch, position, pieces[0]


def mlm_secret_exposure(task: MLMTask, params: Any, canaries: Sequence[Canary], batch: int = 64) -> list[dict]:
    """The secret's rank and exposure for every canary with a pattern (see the module docstring),
    in the canaries' order; canaries without a pattern are skipped. Rows: ``id``, ``pattern``,
    ``secret`` (the word), ``insertions``, ``rank``, ``vocab_size``, ``exposure`` (bits)."""
    if batch < 1:
        raise FedprivError(f"batch must be >= 1, got {batch}")
    todo = [c for c in canaries if c.pattern is not None]
    if not todo:
        return []
    encoded = [masked_secret_example(task, c) for c in todo]
    ids = np.concatenate([e[0]["ids"] for e in encoded])
    length = np.concatenate([e[0]["length"] for e in encoded])
    position = np.array([e[1] for e in encoded], np.int32)
    secret = np.array([e[2] for e in encoded], np.int32)
    n = len(todo)
    ranks = np.empty(n, np.int64)
    for start in range(0, n, batch):
        sl = slice(start, min(start + batch, n))
        k = sl.stop - sl.start
        pad = np.full(batch, sl.stop - 1)  # pad with copies of the last real row: fixed shapes, no empty rows
        pad[:k] = np.arange(sl.start, sl.stop)
        r = _secret_ranks(task.model, params, jnp.asarray(ids[pad]), jnp.asarray(length[pad]), jnp.asarray(position[pad]), jnp.asarray(secret[pad]))
        ranks[sl] = np.asarray(r)[:k]
    V = len(task.vocab)
    log_v = math.log2(V)
    return [
        {
            "id": c.id,
            "pattern": c.pattern,
            "secret": c.words[c.secret_index],
            "insertions": int(c.insertions),
            "rank": int(rank),
            "vocab_size": V,
            "exposure": log_v - math.log2(int(rank)),
        }
        for c, rank in zip(todo, ranks)
    ]


def exposure_by_pattern(rows: list[dict]) -> dict[str, list[dict]]:
    """Rows grouped by pattern (patterns in first-seen order), each group sorted by insertions
    (stable: ties keep the rows' order): the series of the exposure-vs-insertions plot."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["pattern"], []).append(r)
    return {p: sorted(g, key=lambda r: r["insertions"]) for p, g in groups.items()}
