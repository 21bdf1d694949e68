"""What a task is: a model, its batching, a per-example loss and its metrics.

Trainers (central SGD and DP-SGD) and federated clients only ever call these methods, so they
never depend on a particular model. A task is a plain Python object (hyperparameters and
vocabularies); parameters are a pytree passed in and out.

Contract (what DP-SGD relies on):

* ``encode(examples)`` turns examples into a :data:`Batch`: a dict of NumPy arrays whose leading
  axis is the example axis, with FIXED trailing shapes (so every batch compiles once), plus
  ``"mask"`` (float32 (B,), 1 for a real example, 0 for padding rows).
* ``losses(params, batch, rng, train)`` returns the (B,) per-example losses. Example i's loss must
  depend only on example i's arrays (no batch statistics), so that per-example gradients are
  well defined and vmapping over single examples gives the same values.
* ``metric_sums(params, batch)`` returns sums over the real (mask = 1) examples (scalars, or arrays
  that add up elementwise such as a histogram of predictions), so sums from many batches (or many
  clients) add up (:func:`add_sums`); ``summarize(sums)`` turns the totals into the reported metrics.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.data.examples import Example
from fedpriv.errors import ConfigError

if TYPE_CHECKING:
    from fedpriv.config import ExperimentConfig
    from fedpriv.data.corpus import FederatedCorpus

Batch = dict[str, np.ndarray]
Params = Any  # a pytree of jax arrays


class Task(ABC):
    """A model bound to its batching, per-example loss and metrics (see the module docstring).

    ``utility``: the reported metric that says whether the model learned (the headline of every
    table and the metric a utility target is set on), and its label."""

    name: str = "task"
    utility: tuple[str, str] = ("accuracy", "accuracy")
    #: The metrics a ``[utility]`` target may be set on: fractions in [0, 1], higher is better
    #: (never loss or perplexity, nor a count); empty: the headline ``utility`` only.
    target_metrics: tuple[str, ...] = ()
    #: What :meth:`encode` keeps of an example, for the log (e.g. ``"vocab.seq_len = 20 words"``);
    #: None for a task that keeps every word.
    length_limit: str | None = None

    @classmethod
    def from_config(cls, config: "ExperimentConfig", train: "FederatedCorpus") -> "Task":
        """The task an experiment config names, built from the TRAINING users only (a plug-in's
        vocabulary must not see evaluation users). Default: ``cls(**config.task.options)``."""
        try:
            inspect.signature(cls).bind(**config.task.options)
        except TypeError as e:
            raise ConfigError(f"task.options for {config.task.kind!r}: {e}") from None
        return cls(**config.task.options)

    def words_cut(self, example: Example) -> int:
        """How many of the example's words :meth:`encode` drops (see :attr:`length_limit`)."""
        return 0

    def pieces(self, example: Example) -> int | None:
        """How many model inputs (subword pieces) the example's words make before any cut; None
        for a task that does not split words. The data record sums it per split (pieces per word)."""
        return None

    def encode_measured(self, examples: Sequence[Example]) -> tuple[Batch, np.ndarray, np.ndarray, list[int | None]]:
        """``(encode(examples), words cut, words, pieces)``: the batch, and per example what
        :meth:`words_cut`, ``len(example.words())`` and :meth:`pieces` give (the counts a split's
        data record sums). A task that can count while it encodes overrides it (NWP: one split of
        each text); the default calls the per-example methods."""
        cut = np.fromiter((self.words_cut(e) for e in examples), dtype=np.int64, count=len(examples))
        words = np.fromiter((len(e.words()) for e in examples), dtype=np.int64, count=len(examples))
        return self.encode(examples), cut, words, [self.pieces(e) for e in examples]

    @abstractmethod
    def init_params(self, rng: jax.Array) -> Params:
        """Fresh model parameters."""

    @abstractmethod
    def encode(self, examples: Sequence[Example]) -> Batch:
        """Examples -> a batch of fixed trailing shapes, with ``"mask"`` all ones."""

    @abstractmethod
    def losses(self, params: Params, batch: Mapping[str, jax.Array], rng: jax.Array, train: bool) -> jax.Array:
        """(B,) per-example losses (mean over the example's tokens); masked rows may be anything finite."""

    @abstractmethod
    def metric_sums(self, params: Params, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        """Sums over the real examples of the batch (scalars), e.g. correct tokens, tokens, loss sum."""

    @abstractmethod
    def summarize(self, sums: Mapping[str, float]) -> dict[str, float]:
        """Reported metrics from summed ``metric_sums`` (e.g. accuracy, perplexity, F1)."""

    def save_assets(self, run_dir: Any) -> None:
        """Write what is needed to use the trained parameters again (e.g. a BERT task's tokenizer)
        into the run directory. Trainers call it once the run directory exists; default: nothing."""

    # ---- shared helpers -----------------------------------------------------------------------
    def mean_loss(self, params: Params, batch: Mapping[str, jax.Array], rng: jax.Array, train: bool = True) -> jax.Array:
        """The non-private objective: mean per-example loss over the real examples of the batch."""
        mask = batch["mask"]
        return jnp.sum(self.losses(params, batch, rng, train) * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def save_vocabulary_record(task: Any, run_dir: Any) -> None:
    """Write the task's ``vocabulary_record`` (where its word vocabulary came from, plain or DP,
    with the DP histogram's guarantee) as the run's ``vocabulary.json``, if it has one."""
    record = getattr(task, "vocabulary_record", None)
    if record is not None:
        from fedpriv.rundir import RunDir, VOCABULARY

        RunDir(run_dir).write_json(VOCABULARY, record, indent=1)


def pad_batch(batch: Batch, size: int) -> Batch:
    """Append masked zero rows so the batch has ``size`` rows (fixed shapes for jit)."""
    n = len(batch["mask"])
    if n > size:
        raise ValueError(f"batch of {n} does not fit in {size}")
    if n == size:
        return batch
    return {k: np.concatenate([v, np.zeros((size - n, *v.shape[1:]), dtype=v.dtype)]) for k, v in batch.items()}


def add_sums(total: dict[str, Any], sums: Mapping[str, Any]) -> dict[str, Any]:
    """Accumulate metric sums: scalars as Python floats, arrays (e.g. a histogram of predicted
    classes) as float64 NumPy arrays."""
    for k, v in sums.items():
        if np.ndim(v) == 0:
            total[k] = total.get(k, 0.0) + float(v)
        else:
            total[k] = total.get(k, 0.0) + np.asarray(v, np.float64)
    return total


def prediction_histogram(pred: jax.Array, weight: jax.Array, num_classes: int) -> jax.Array:
    """(num_classes,) how often each class was predicted at the positions of nonzero ``weight``."""
    return jnp.zeros(num_classes, jnp.float32).at[pred.reshape(-1)].add(weight.reshape(-1).astype(jnp.float32))


def top_share(histogram: Any) -> float:
    """The most frequent predicted class's share of all predictions (0 when there are none)."""
    h = np.asarray(histogram, np.float64)
    return float(h.max() / h.sum()) if h.sum() > 0 else 0.0


#: A model whose most frequent prediction takes at least this share of positions is flagged.
DEGENERATE_SHARE = 0.99
#: An NWP model predicting <oov> or <eos> at least at this share of positions is flagged.
DEGENERATE_OOV_EOS_SHARE = 0.95


def degenerate(metrics: Mapping[str, Any]) -> str | None:
    """Why an evaluation shows a model that did not learn (it predicts (almost) one class, only
    <oov>/<eos>, or no entity), or None. Reads the keys the tasks report."""
    if metrics.get("pred_oov_eos_share", 0.0) >= DEGENERATE_OOV_EOS_SHARE:
        return f"predicts <oov>/<eos> at {metrics['pred_oov_eos_share']:.0%} of positions"
    if metrics.get("accuracy_no_oov_no_eos") == 0.0:
        return "makes no correct prediction outside <oov>/<eos>"
    if metrics.get("entities_gold", 0) > 0 and metrics.get("entities_pred") == 0:
        return "predicts no entity (only O)"
    if metrics.get("pred_top_share", 0.0) >= DEGENERATE_SHARE:
        return f"predicts one class at {metrics['pred_top_share']:.1%} of positions"
    return None
