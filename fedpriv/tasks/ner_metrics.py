"""Entity-level NER scoring with conlleval's chunk semantics, on the host and on device.

A tag is ``O`` or ``<P>-<type>`` with P in B, I, E, S (IOBES); BILOU's L and U read as E and S.
Chunks follow conlleval.pl (and seqeval's default, non-strict mode), each sentence bounded by O:

* a chunk **starts** at a B- or S- tag, at an I- or E- tag after O, E- or S- (so an I- after O
  starts a chunk, as in IOB1), and at any non-O tag whose type differs from the previous tag's;
* a chunk **ends** before the next tag when the current tag is E- or S-, when B-/I- is followed
  by B-, S- or O, and when the type changes.

A chunk is (type at its start, first index, last index). An entity is correct when gold and
prediction have the same chunk (exact span and type). ``entity_counts`` returns
(correct, predicted, gold) counts; precision = correct / predicted, recall = correct / gold.

:func:`entity_counts_ids` computes the same counts from tag-id arrays with ``jax.numpy`` so that
metric sums can be jitted; :func:`chunk_tables` precomputes its lookup tables for a tag set.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.tasks.base import prediction_histogram, top_share

Chunk = tuple[str, int, int]  # (type, first index, last index), indices inclusive


def split_tag(tag: str) -> tuple[str, str]:
    """``'B-PER'`` -> ``('B', 'PER')``; ``'O'`` -> ``('O', '')``; L/U map to E/S."""
    if tag == "O" or "-" not in tag:
        return "O", ""
    prefix, typ = tag.split("-", 1)
    return {"L": "E", "U": "S"}.get(prefix, prefix), typ


def end_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    """Whether a chunk ended between the previous and the current token (prefixes and types)."""
    if prev_tag in ("E", "S"):
        return True
    if prev_tag in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return prev_tag != "O" and prev_type != type_


def start_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    """Whether a chunk starts at the current token."""
    if tag in ("B", "S"):
        return True
    if prev_tag in ("E", "S", "O") and tag in ("I", "E"):
        return True
    return tag != "O" and prev_type != type_


def get_entities(seq: Sequence[str]) -> list[Chunk]:
    """The chunks of one tag sequence, in order."""
    chunks: list[Chunk] = []
    prev_tag, prev_type = "O", ""
    begin, chunk_type = -1, ""
    for i, tag in enumerate([*seq, "O"]):
        p, t = split_tag(tag)
        if begin >= 0 and end_of_chunk(prev_tag, p, prev_type, t):
            chunks.append((chunk_type, begin, i - 1))
            begin = -1
        if start_of_chunk(prev_tag, p, prev_type, t):
            begin, chunk_type = i, t
        prev_tag, prev_type = p, t
    return chunks


def whole_entity_prefix(tags: Sequence[str], fit: int) -> tuple[int, int]:
    """(kept, cut): when only the first ``fit`` words of a sentence fit the model, keep the first
    ``kept`` words, moving the cut back to the start of a gold entity it would split, and count the
    ``cut`` gold entities that start at or after it. Scoring the kept words and adding ``cut`` to
    the gold count makes every gold entity of the file count, whole: one beyond the cut is a miss,
    never a shortened span that a prediction could match."""
    fit = max(0, min(int(fit), len(tags)))
    chunks = get_entities(tags)
    kept = next((begin for _, begin, last in chunks if begin < fit <= last), fit)
    return kept, sum(1 for _, begin, _ in chunks if begin >= kept)


def entity_counts(gold_seqs: Iterable[Sequence[str]], pred_seqs: Iterable[Sequence[str]]) -> tuple[int, int, int]:
    """(true-positive entities, predicted entities, gold entities) over paired sentences."""
    tp = n_pred = n_gold = 0
    for gold, pred in zip(gold_seqs, pred_seqs, strict=True):
        if len(gold) != len(pred):
            raise ValueError(f"gold has {len(gold)} tags but prediction {len(pred)}")
        g, p = set(get_entities(gold)), set(get_entities(pred))
        tp += len(g & p)
        n_pred += len(p)
        n_gold += len(g)
    return tp, n_pred, n_gold


def prf(tp: float, n_pred: float, n_gold: float) -> tuple[float, float, float]:
    """(precision, recall, F1) as fractions in [0, 1]; 0 where a denominator is 0."""
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_gold if n_gold else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return p, r, f


# ---- on device -----------------------------------------------------------------------------
@dataclass(frozen=True)
class ChunkTables:
    """Lookup tables of a tag set (T tags) for :func:`entity_counts_ids`.

    ``start[prev, cur]`` and ``end[cur, nxt]`` are the chunk start / end rules as (T, T) bool
    arrays, ``type_id`` (T,) int32 numbers the entity types (0 for O), and ``outside`` is the id
    of ``O`` (used before the first and after the last real token).
    """

    start: np.ndarray
    end: np.ndarray
    type_id: np.ndarray
    outside: int


def chunk_tables(tags: Sequence[str]) -> ChunkTables:
    if "O" not in tags:
        raise ValueError("the tag set must contain 'O'")
    parsed = [split_tag(t) for t in tags]
    types = sorted({t for p, t in parsed if p != "O"})
    type_id = np.array([0 if p == "O" else 1 + types.index(t) for p, t in parsed], np.int32)
    T = len(tags)
    start = np.zeros((T, T), bool)
    end = np.zeros((T, T), bool)
    for i, (pi, ti) in enumerate(parsed):
        for j, (pj, tj) in enumerate(parsed):
            start[i, j] = start_of_chunk(pi, pj, ti, tj)
            end[i, j] = end_of_chunk(pi, pj, ti, tj)
    return ChunkTables(start, end, type_id, list(tags).index("O"))


def _chunks(ids: jax.Array, tables: ChunkTables):
    """Per position: chunk starts here (bool), last index of the chunk started here, type id."""
    L = ids.shape[-1]
    pad = jnp.full(ids.shape[:-1] + (1,), tables.outside, ids.dtype)
    prev = jnp.concatenate([pad, ids[..., :-1]], axis=-1)
    nxt = jnp.concatenate([ids[..., 1:], pad], axis=-1)
    starts = jnp.asarray(tables.start)[prev, ids]
    ends = jnp.asarray(tables.end)[ids, nxt]
    idx = jnp.where(ends, jnp.arange(L), L)
    last = jax.lax.cummin(idx, axis=idx.ndim - 1, reverse=True)  # first end at or after i
    return starts, last, jnp.asarray(tables.type_id)[ids]


def entity_counts_ids(gold: jax.Array, pred: jax.Array, length: jax.Array, tables: ChunkTables):
    """Per-example (tp, n_pred, n_gold), each (B,) float32, from (B, L) tag ids and (B,) lengths.

    Steps at or after ``length`` are read as O. Same counts as :func:`entity_counts`. Jittable.
    """
    valid = jnp.arange(gold.shape[-1]) < length[..., None]
    gold = jnp.where(valid, gold, tables.outside).astype(jnp.int32)
    pred = jnp.where(valid, pred, tables.outside).astype(jnp.int32)
    gs, gl, gt = _chunks(gold, tables)
    ps, pl, pt = _chunks(pred, tables)
    tp = jnp.sum(gs & ps & (gl == pl) & (gt == pt), axis=-1)
    return tp.astype(jnp.float32), jnp.sum(ps, axis=-1).astype(jnp.float32), jnp.sum(gs, axis=-1).astype(jnp.float32)


def tagging_sums(gold, pred, length, tables, token_valid, mask, loss_sum, gold_cut=None) -> dict:
    """The metric sums both taggers report (jittable): examples, scored tokens, loss sum, correct
    tags and entity counts. ``token_valid`` (B, L) marks the scored positions, ``mask`` (B,) the
    real rows; ``loss_sum`` is already summed over the real rows; ``gold_cut`` (B,), the gold
    entities each row lost to the length limit (:func:`whole_entity_prefix`), counts as missed."""
    correct = jnp.sum((pred == gold) * token_valid, axis=1)
    tp, n_pred, n_gold = entity_counts_ids(gold, pred, length, tables)
    if gold_cut is not None:
        n_gold = n_gold + gold_cut
    return {
        "pred_hist": prediction_histogram(pred, token_valid * mask[:, None], len(tables.type_id)),
        "examples": jnp.sum(mask),
        "tokens": jnp.sum(jnp.sum(token_valid, axis=1) * mask),
        "loss_sum": loss_sum,
        "correct": jnp.sum(correct * mask),
        "tp": jnp.sum(tp * mask),
        "n_pred": jnp.sum(n_pred * mask),
        "n_gold": jnp.sum(n_gold * mask),
    }


def summarize_tagging(sums) -> dict[str, float]:
    """Loss per scored token, tag accuracy, entity-level precision, recall and F1, and the counts."""
    tokens = max(sums["tokens"], 1.0)
    p, r, f = prf(sums["tp"], sums["n_pred"], sums["n_gold"])
    return {
        "loss": sums["loss_sum"] / tokens,
        "accuracy": sums["correct"] / tokens,
        "precision": p,
        "recall": r,
        "f1": f,
        "examples": int(sums["examples"]),
        "tokens": int(sums["tokens"]),
        "entities_gold": int(sums["n_gold"]),
        "entities_pred": int(sums["n_pred"]),
        "entities_correct": int(sums["tp"]),
        "pred_top_share": top_share(sums["pred_hist"]) if "pred_hist" in sums else 0.0,
    }
