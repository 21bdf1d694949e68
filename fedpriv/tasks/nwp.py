"""Next-word prediction: the NWP LSTM over TFF-style encoded sequences.

An example is ``[bos, w_1..w_n, eos, pad...]`` (length L + 1, see :mod:`fedpriv.vocab.word`);
inputs are ids[:-1], targets ids[1:]. The per-example loss is the mean cross-entropy over the
example's non-pad targets. Metrics follow the TFF Stack Overflow convention: accuracy over
non-pad targets, also without oov targets, and without oov and eos targets; loss and perplexity
are per token over the whole evaluation set (perplexity = exp(total loss / total tokens)).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedpriv.data.examples import Example
from fedpriv.data.flat import FlatText
from fedpriv.models.capture import apply_model
from fedpriv.models.nwp import NWPLSTM, PRESETS, NWPConfig
from fedpriv.rundir import WORD_VOCAB
from fedpriv.tasks.base import Batch, Params, Task, prediction_histogram, save_vocabulary_record, top_share
from fedpriv.vocab.word import WordVocab


class NWPTask(Task):
    name = "nwp"
    utility = ("accuracy_no_oov_no_eos", "next-token accuracy without OOV and EOS")
    target_metrics = ("accuracy_no_oov_no_eos", "accuracy_no_oov", "accuracy")

    def __init__(self, vocab: WordVocab, seq_len: int = 20, model: str | NWPConfig = "small"):
        self.vocab = vocab
        self.seq_len = seq_len
        self.length_limit = f"vocab.seq_len = {seq_len} words"
        cfg = PRESETS[model] if isinstance(model, str) else model
        self.cfg = NWPConfig(**{**cfg.__dict__, "vocab_size": len(vocab)})
        self.model = NWPLSTM(self.cfg)

    def save_assets(self, run_dir) -> None:
        """The word vocabulary (``vocab.json``): the run's ids read back without the corpus."""
        self.vocab.save(Path(run_dir) / WORD_VOCAB)
        save_vocabulary_record(self, run_dir)

    def init_params(self, rng: jax.Array) -> Params:
        return self.model.init(rng, jnp.zeros((1, self.seq_len), jnp.int32))["params"]

    def words_cut(self, example: Example) -> int:
        return max(0, len(example.words()) - self.seq_len)

    def encode(self, examples: Sequence[Example]) -> Batch:
        return self._encode_words(examples)[0]

    def encode_measured(self, examples: Sequence[Example]) -> tuple[Batch, np.ndarray, np.ndarray, list[None]]:
        """One split of each text gives the ids, the words and the words cut (vectorized)."""
        if type(self).encode is not NWPTask.encode:  # a subclass that encodes otherwise
            return super().encode_measured(examples)
        batch, lengths = self._encode_words(examples)
        return batch, np.maximum(lengths - self.seq_len, 0), lengths, [None] * len(examples)

    def _encode_words(self, examples: Sequence[Example]) -> tuple[Batch, np.ndarray]:
        ids, lengths = self.vocab.encode_words([e.text.split() for e in examples], self.seq_len)
        return {"ids": ids, "mask": np.ones(len(ids), np.float32)}, lengths

    @property
    def encodes_flat(self) -> bool:
        """Whether :meth:`encode_flat` gives what :meth:`encode` gives: not for a subclass that
        encodes otherwise."""
        return type(self).encode is NWPTask.encode and type(self).encode_measured is NWPTask.encode_measured

    def encode_flat(self, flat: FlatText, chunk: int) -> Iterator[tuple[Batch, np.ndarray, np.ndarray, list[None]]]:
        """:meth:`encode_measured` of a corpus's examples read as flat arrays, ``chunk`` examples at
        a time: the word table mapped to vocabulary ids once, then NumPy only (same rows)."""
        to_vocab = self.vocab.table_ids(flat.words)
        for tokens, starts in flat.chunks(chunk):
            ids = self.vocab.encode_ids(to_vocab[tokens], starts, self.seq_len)
            lengths = np.diff(starts)
            yield {"ids": ids, "mask": np.ones(len(ids), np.float32)}, np.maximum(lengths - self.seq_len, 0), lengths, [None] * len(ids)

    def logits(self, params: Params, ids: jax.Array) -> jax.Array:
        return apply_model(self.model, params, ids[:, :-1])

    def _token_terms(self, params: Params, batch: Mapping[str, jax.Array]):
        ids = batch["ids"]
        logits = self.logits(params, ids)
        targets = ids[:, 1:]
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
        valid = (targets != self.vocab.pad).astype(jnp.float32)
        return logits, targets, nll, valid

    def losses(self, params: Params, batch: Mapping[str, jax.Array], rng: jax.Array, train: bool) -> jax.Array:
        _, _, nll, valid = self._token_terms(params, batch)
        return jnp.sum(nll * valid, axis=1) / jnp.maximum(jnp.sum(valid, axis=1), 1.0)

    def metric_sums(self, params: Params, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        logits, targets, nll, valid = self._token_terms(params, batch)
        valid = valid * batch["mask"][:, None]
        pred = jnp.argmax(logits, axis=-1)
        correct = (pred == targets).astype(jnp.float32)
        no_oov = valid * (targets != self.vocab.oov)
        no_oov_eos = no_oov * (targets != self.vocab.eos)
        return {
            "examples": jnp.sum(batch["mask"]),
            "tokens": jnp.sum(valid),
            "loss_sum": jnp.sum(nll * valid),
            "correct": jnp.sum(correct * valid),
            "tokens_no_oov": jnp.sum(no_oov),
            "correct_no_oov": jnp.sum(correct * no_oov),
            "tokens_no_oov_eos": jnp.sum(no_oov_eos),
            "correct_no_oov_eos": jnp.sum(correct * no_oov_eos),
            "pred_oov_eos": jnp.sum(valid * ((pred == self.vocab.oov) | (pred == self.vocab.eos))),
            "pred_hist": prediction_histogram(pred, valid, len(self.vocab)),
        }

    def summarize(self, sums: Mapping[str, float]) -> dict[str, float]:
        tokens = max(sums["tokens"], 1.0)
        loss = sums["loss_sum"] / tokens
        return {
            "loss": loss,
            "perplexity": math.exp(min(loss, 700.0)),
            "accuracy": sums["correct"] / tokens,
            "accuracy_no_oov": sums["correct_no_oov"] / max(sums["tokens_no_oov"], 1.0),
            "accuracy_no_oov_no_eos": sums["correct_no_oov_eos"] / max(sums["tokens_no_oov_eos"], 1.0),
            "pred_oov_eos_share": sums.get("pred_oov_eos", 0.0) / tokens,
            "pred_top_share": top_share(sums["pred_hist"]) if "pred_hist" in sums else 0.0,
            "examples": int(sums["examples"]),
            "tokens": int(sums["tokens"]),
        }


def unigram_perplexity(train_ids: np.ndarray, test_ids: np.ndarray, vocab_size: int) -> float:
    """Perplexity of the add-one-smoothed unigram model of the train targets on the test targets
    (same token convention as the task: targets are ids[:, 1:], pad excluded)."""
    train_t = train_ids[:, 1:][train_ids[:, 1:] != 0]
    test_t = test_ids[:, 1:][test_ids[:, 1:] != 0]
    counts = np.bincount(train_t, minlength=vocab_size).astype(np.float64) + 1.0
    counts[0] = 0.0  # pad is never a target
    with np.errstate(divide="ignore"):
        logp = np.log(counts / counts.sum())
    return float(np.exp(-logp[test_t].mean()))
