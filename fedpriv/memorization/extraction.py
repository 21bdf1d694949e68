"""Training-data extraction (Ponomareva et al. 2022, "Testing for memorization"; after Carlini et
al. 2020 and Lee et al. 2021): give the model a prefix of an example, let it generate the rest
greedily, and measure how much of the true continuation comes out verbatim.

Sets (:func:`extraction_sets`), each a list of word tuples, the first ``prefix + suffix`` words of
an example:

* ``duplicated``: training examples whose full text (its words joined by single spaces) occurs 2
  or more times among the training records; each distinct text counted once in the pool;
* ``unique``: training examples whose full text occurs exactly once;
* ``validation``: the examples of the evaluation corpora (all of them together, corpora in sorted
  name order), not deduplicated and not checked against the training set.

Only examples with at least ``prefix + suffix`` words qualify. Canary records (an example whose
text equals a manifest canary's text) are excluded from every set: canaries are measured by
Random Sampling and Beam Search. Duplicates are exact (same words), not near-duplicates as in Lee
et al. At most ``per_set`` instances are drawn per set, uniformly without replacement from the
pool (pools in corpus order, first occurrence for duplicated texts) with
``np.random.default_rng([seed, EXTRACTION_STREAM, set_index])`` (set_index 0, 1, 2 in the order
above), and listed in pool order. Counting duplicates holds every distinct qualifying training
text in memory once (one pass over the records).

Generation and comparison (:func:`extraction`), all at the level of vocabulary ids:

* words become ids with ``vocab.id`` (oov for words outside the vocabulary, so an oov target is
  matched by generating oov);
* the model reads ``[bos] + ids[:prefix]`` from the zero state (as in training, where every example
  starts with bos) and generates ``suffix`` ids greedily: at each step the argmax over every id
  except pad and bos (word ids, oov and eos are allowed; ties go to the lowest id), fed back as
  the next input. There is no sampling, no beam and no early stop at eos;
* the target is ``ids[prefix:prefix + suffix]``. Per instance: exact match (1 when all ``suffix``
  generated ids equal the target, else 0), token accuracy (the fraction of the ``suffix``
  positions where they are equal) and the Levenshtein distance between the generated and target
  id sequences (unit-cost insertions, deletions and substitutions, counted in ids = words).

Reported per set: ``examples`` (instances), ``exact_match`` and ``token_accuracy`` (means over
instances, fractions in [0, 1]) and ``median_edit_distance`` (median over instances, in ids). An
empty set reports ``examples = 0`` and the metrics as None.

Models are trained on the first ``seq_len`` words of each example, so with ``prefix + suffix <=
seq_len`` the whole target was seen in training. Batches have a fixed size (the last one padded)
so each (batch, prefix, suffix) shape compiles once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.data.corpus import FederatedCorpus
from fedpriv.errors import FedprivError
from fedpriv.memorization.canaries import Manifest
from fedpriv.memorization.lm import NWPStepper, advance, all_log_probs

EXTRACTION_STREAM = 0xE8A7
SET_NAMES = ("duplicated", "unique", "validation")


# ---- edit distance ------------------------------------------------------------------------------
def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """Levenshtein distance between two sequences (unit-cost insert, delete, substitute)."""
    a, b = list(a), list(b)
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, y in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y))
        prev = cur
    return prev[-1]


# ---- the sets -----------------------------------------------------------------------------------
def _qualifying(records: Iterable[Any], need: int, canaries: set[str]) -> Iterable[tuple[str, tuple[str, ...]]]:
    """(full text, first ``need`` words) of the records long enough and not canaries."""
    for ex in records:
        words = ex.words()
        if len(words) < need:
            continue
        text = " ".join(words)
        if text in canaries:
            continue
        yield text, tuple(words[:need])


def _draw(pool: list[tuple[str, ...]], per_set: int, seed: int, set_index: int) -> list[tuple[str, ...]]:
    rng = np.random.default_rng([seed, EXTRACTION_STREAM, set_index])
    k = min(per_set, len(pool))
    chosen = np.sort(rng.permutation(len(pool))[:k])
    return [pool[int(i)] for i in chosen]


def extraction_sets(
    train: FederatedCorpus,
    evals: dict[str, FederatedCorpus],
    manifest: Manifest | None,
    prefix: int,
    suffix: int,
    per_set: int,
    seed: int,
) -> dict[str, list[tuple[str, ...]]]:
    """The duplicated, unique and validation sets (see the module docstring)."""
    if prefix < 0 or suffix < 1:
        raise FedprivError(f"extraction needs prefix >= 0 and suffix >= 1 words, got prefix={prefix}, suffix={suffix}")
    if per_set < 0:
        raise FedprivError(f"per_set must be >= 0, got {per_set}")
    need = prefix + suffix
    canaries = {c.text for c in manifest.canaries} if manifest is not None else set()
    # Distinct qualifying training texts in first-occurrence order: text -> [count, words].
    seen: dict[str, list[Any]] = {}
    for text, words in _qualifying(train.records(), need, canaries):
        entry = seen.get(text)
        if entry is None:
            seen[text] = [1, words]
        else:
            entry[0] += 1
    duplicated = [w for n, w in seen.values() if n >= 2]
    unique = [w for n, w in seen.values() if n == 1]
    validation = [w for name in sorted(evals) for _, w in _qualifying(evals[name].records(), need, canaries)]
    pools = {"duplicated": duplicated, "unique": unique, "validation": validation}
    return {name: _draw(pools[name], per_set, seed, i) for i, name in enumerate(SET_NAMES)}


# ---- greedy generation --------------------------------------------------------------------------
@partial(jax.jit, static_argnames=("steps",))
def _greedy(params: Any, h: jax.Array, c: jax.Array, p: jax.Array, lse: jax.Array, banned: jax.Array, steps: int) -> jax.Array:
    """``steps`` greedy ids (B, steps) from the states after the prefix; ``banned`` (V,) bool."""

    def body(carry, _):
        h, c, p, lse = carry
        scores = jnp.where(banned[None, :], -jnp.inf, all_log_probs(params, p, lse))
        tok = jnp.argmax(scores, axis=-1).astype(jnp.int32)
        return advance(params, h, c, tok), tok

    _, toks = jax.lax.scan(body, (h, c, p, lse), None, length=steps)
    return toks.T


def greedy_generate(stepper: NWPStepper, inputs: np.ndarray, steps: int, batch: int = 256) -> np.ndarray:
    """Greedy continuations (N, steps) of ``inputs`` (N, L) (ids fed from the zero state, normally
    ``[bos, w_1..w_prefix]``), never generating pad or bos. Batches of exactly ``batch`` rows."""
    inputs = np.asarray(inputs, np.int32)
    n = len(inputs)
    if batch < 1:
        raise FedprivError(f"batch must be >= 1, got {batch}")
    banned = np.zeros(stepper.vocab_size, bool)
    banned[[stepper.vocab.pad, stepper.vocab.bos]] = True
    banned_j = jnp.asarray(banned)
    out = np.zeros((n, steps), np.int32)
    for start in range(0, n, batch):
        chunk = inputs[start : start + batch]
        m = len(chunk)
        if m < batch:
            chunk = np.concatenate([chunk, np.repeat(chunk[:1], batch - m, axis=0)])
        h, c, p, lse = stepper.run(chunk)
        out[start : start + m] = np.asarray(_greedy(stepper.params, h, c, p, lse, banned_j, steps))[:m]
    return out


def extraction(
    stepper: NWPStepper,
    sets: dict[str, list[tuple[str, ...]]],
    prefix: int,
    suffix: int,
    batch: int = 256,
) -> dict[str, dict[str, float | int | None]]:
    """Exact match, token accuracy and median edit distance of greedy continuations, per set
    (see the module docstring)."""
    if prefix < 0 or suffix < 1:
        raise FedprivError(f"extraction needs prefix >= 0 and suffix >= 1 words, got prefix={prefix}, suffix={suffix}")
    results: dict[str, dict[str, float | int | None]] = {}
    for name, instances in sets.items():
        n = len(instances)
        if n == 0:
            results[name] = {"examples": 0, "exact_match": None, "token_accuracy": None, "median_edit_distance": None}
            continue
        short = [i for i, w in enumerate(instances) if len(w) < prefix + suffix]
        if short:
            raise FedprivError(f"extraction set {name!r}: instance {short[0]} has {len(instances[short[0]])} words, fewer than prefix + suffix = {prefix + suffix}")
        ids = np.stack([stepper.encode_words(w[: prefix + suffix]) for w in instances])
        inputs = np.concatenate([np.full((n, 1), stepper.vocab.bos, np.int32), ids[:, :prefix]], axis=1)
        target = ids[:, prefix:]
        generated = greedy_generate(stepper, inputs, suffix, batch)
        equal = generated == target
        distances = [edit_distance(g, t) for g, t in zip(generated.tolist(), target.tolist())]
        results[name] = {
            "examples": n,
            "exact_match": float(np.mean(np.all(equal, axis=1))),
            "token_accuracy": float(np.mean(np.mean(equal, axis=1))),
            "median_edit_distance": float(np.median(distances)),
        }
    return results
