"""Random Sampling for any task (plug-ins included): the canary scored by the task's own loss.

The test of :mod:`fedpriv.memorization.random_sampling` (Thakkar et al. 2021), with the task's
per-example loss (``task.losses(params, batch, rng, train=False)``) as the score instead of the
NWP LSTM's log-perplexity: the canary keeps its first ``prefix`` words, N candidates replace the
rest with random pool words (drawn like the canary words, never the canary's own suffix), every
candidate is encoded by the task as an example of the corpus's kind (tags all ``O``) and scored.
The canary is memorized when its loss is strictly lowest; rank = 1 + candidates scoring at or
below it (a tie counts against the canary). It uses nothing but the Task interface, so it costs a task forward pass per candidate
(size it with ``audit.rs_candidates`` or ``fedpriv audit --candidates``).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from fedpriv.config import ExperimentConfig
from fedpriv.data.examples import Kind, TaggedExample, TextExample
from fedpriv.memorization.audit import canary_columns, rs_candidates
from fedpriv.memorization.canaries import Manifest, canary_example
from fedpriv.memorization.exposure import exact_exposure, extrapolated_exposure, interpolated_exposure
from fedpriv.tasks.base import Task, pad_batch


class LossScorer:
    """Per-example losses of word sequences under a trained task, in fixed-size jitted batches."""

    def __init__(self, task: Task, params: Any, kind: Kind, batch: int):
        self.task, self.params, self.batch = task, params, batch
        self.like = TextExample("") if kind == "text" else TaggedExample((), ())
        self._losses = jax.jit(lambda p, b: task.losses(p, b, jax.random.key(0), False))

    def __call__(self, sequences: list[tuple[str, ...]]) -> np.ndarray:
        out = []
        for i in range(0, len(sequences), self.batch):
            chunk = sequences[i : i + self.batch]
            batch = pad_batch(self.task.encode([canary_example(w, self.like) for w in chunk]), self.batch)
            out.append(np.asarray(self._losses(self.params, batch))[: len(chunk)])
        return np.concatenate(out) if out else np.zeros(0, np.float32)


def audit_task_canary(scorer: LossScorer, manifest: Manifest, index: int, cfg: ExperimentConfig, candidates: int) -> dict[str, Any]:
    """One canary's Random Sampling by loss, with exposure (exact, interpolated and extrapolated)."""
    a = cfg.audit
    canary = manifest.canaries[index]
    pool = list(manifest.pool)
    position = {w: i for i, w in enumerate(pool)}
    ids = np.array([position[w] for w in canary.words], np.int64)
    pool_ids = np.arange(len(pool), dtype=np.int64)
    suffixes, method, space = rs_candidates(pool_ids, ids, manifest, index, cfg, candidates)
    prefix = tuple(canary.words[: a.rs_prefix])
    scores = scorer([prefix + tuple(pool[j] for j in row) for row in suffixes])
    canary_loss = float(scorer([tuple(canary.words)])[0])
    at_or_below = int(np.sum(scores <= canary_loss))
    exposure = exact_exposure(canary_loss, scores) if method == "exact" else interpolated_exposure(at_or_below, len(scores), space)
    extrapolated = extrapolated_exposure(canary_loss, scores, space, seed=cfg.seed) if len(scores) >= 10 else None
    return {
        **canary_columns(canary),
        "rs_memorized": at_or_below == 0,
        "rs_rank": at_or_below + 1,
        "rs_candidates": len(scores),
        "canary_loss": canary_loss,
        "exposure": exposure,
        "exposure_method": method,
        "exposure_extrapolated": extrapolated,
        "candidate_space_log2": math.log2(space),
    }
