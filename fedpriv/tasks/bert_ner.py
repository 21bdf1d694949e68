"""NER by fine-tuning BERT (:class:`fedpriv.models.bert.BertTokenClassifier`) on WordPiece pieces.

Each word (``TaggedExample.tokens``) becomes its WordPiece pieces; the row is
``[CLS] pieces.. [SEP] [PAD]..``. The word's tag labels its FIRST piece; continuation pieces,
[CLS], [SEP] and padding are ignored (label -1). Words are kept whole: the first word whose
pieces do not fit in ``max_len - 2`` and all after it are cut (not trained on), the cut moved back to
the start of a gold entity it would split; the gold entities cut count as missed in the entity
scores (:func:`fedpriv.tasks.ner_metrics.whole_entity_prefix`), so F1 is always over every gold
entity of the evaluation file, whatever the vocabulary's pieces per word.

Batch (B examples, L = ``max_len``, W = L - 2 word slots): ``ids`` int32 (B, L), ``length`` int32
(B,) real positions incl. [CLS]/[SEP], ``labels`` int32 (B, L) tag id or -1, ``word_pos`` int32
(B, W) position of each kept word's first piece (0 past ``n_words``), ``word_tags`` int32 (B, W)
gold tag ids (O past ``n_words``), ``n_words`` int32 (B,), ``gold_cut`` float32 (B,) gold entities
past the cut, ``seed`` int32 (B,) a hash of the
row (per-example dropout keys, as in :mod:`fedpriv.tasks.mlm`), ``mask`` float32 (B,).

Per-example loss: the mean cross-entropy (nats) over the example's labeled pieces (its words).
Prediction: argmax at each word's first piece. Metrics: word-level ``loss_sum``, ``tokens``
(words), ``correct``, and entity counts ``tp`` / ``n_pred`` / ``n_gold`` with conlleval
semantics (exact span and type, :mod:`fedpriv.tasks.ner_metrics`); :meth:`BertNERTask.summarize`
reports entity precision, recall and F1, word accuracy and loss per word. The tag set is ``O``
(id 0) then the other training tags sorted (pass ``tags=`` to fix it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedpriv.data.examples import Example, TaggedExample
from fedpriv.errors import FedprivError
from fedpriv.models.bert import BertConfig, BertTokenClassifier, transfer_encoder
from fedpriv.models.capture import apply_model
from fedpriv.tasks.base import Batch, Params, Task
from fedpriv.tasks.local_inputs import UserSide
from fedpriv.tasks.mlm import DROPOUT_STREAM, PieceVocab, example_keys, resolve_config, row_seed, word_pieces, words_beyond
from fedpriv.tasks.ner_metrics import chunk_tables, summarize_tagging, tagging_sums, whole_entity_prefix

IGNORE = -1


class BertNERTask(UserSide, Task):
    """BERT token classification for NER (see the module docstring)."""

    name = "bert_ner"
    utility = ("f1", "entity F1")
    target_metrics = ("f1", "precision", "recall", "accuracy")

    def __init__(
        self,
        tokenizer: Any,
        tags: Sequence[str],
        max_len: int = 128,
        model: str | BertConfig = "tiny",
        dropout: float | None = None,
        lowercase: bool = False,
        pretrained: Params | None = None,
        privatize_eta: float | None = None,
        privatize_seed: int = 0,
        freeze_token_embedding: bool = False,
    ):
        """``pretrained``: MLM parameters (or an encoder subtree) that :meth:`init_params` starts
        the encoder from by default (so a trainer calling ``init_params(rng)`` fine-tunes them).

        Privacy-constrained fine-tuning (Qu et al. 2021, sec. 3.3 d; :mod:`fedpriv.tasks.local_inputs`):
        with ``privatize_eta`` every example's pieces, training and evaluation alike, are
        M_txt-privatized once (key ``privatize_seed`` and the example's content) in the frozen token
        embedding of ``pretrained`` (which must be given); the tags stay (the paper assumes labels
        are available). Words keep their positions: M_txt maps a piece to one piece.
        ``freeze_token_embedding`` keeps the pretrained token embedding fixed without privatizing
        (the control of that constraint alone); ``privatize_eta`` implies it."""
        tags = list(tags)
        if not tags or tags[0] != "O" or len(set(tags)) != len(tags):
            raise FedprivError("the NER tag set must be distinct tags starting with 'O'")
        self.vocab = PieceVocab(tokenizer, lowercase)
        self.max_len = int(max_len)
        self.cfg = resolve_config(model, len(self.vocab), self.max_len, dropout)
        self.tags = tuple(tags)
        self._tag_index = {t: i for i, t in enumerate(self.tags)}
        self.model = BertTokenClassifier(self.cfg, len(self.tags))
        self._init = jax.jit(self.model.init)  # one program: much faster than op-by-op initialization
        self.tables = chunk_tables(self.tags)
        self.init_user_side(privatize_eta, privatize_seed, freeze_token_embedding)
        self.pretrained = pretrained
        self.pretrained_from: Any = None  # where ``pretrained`` came from (a run directory), for reports
        self.vocabulary_record: dict | None = None  # where the vocabulary came from (saved in tokenizer.json)

    @classmethod
    def from_examples(cls, examples: Sequence[Example], tokenizer: Any, tags: Sequence[str] | None = None, **kw) -> "BertNERTask":
        """The tag set from the training examples (``O`` first, then sorted), unless ``tags`` is given."""
        tagged = [e for e in examples if isinstance(e, TaggedExample)]
        if len(tagged) != len(examples) or not tagged:
            raise FedprivError("a BERT NER task needs tagged training examples")
        if tags is None:
            tags = sorted({t for e in tagged for t in e.tags} - {"O"})
        return cls(tokenizer, ["O", *[t for t in tags if t != "O"]], **kw)

    # ---- model ------------------------------------------------------------------------------
    def init_params(self, rng: jax.Array, pretrained: Params | None = None) -> Params:
        """Fresh parameters; with ``pretrained`` (MLM parameters or an encoder subtree, same
        config; default: the one given to the constructor) the encoder starts from it and only
        the classifier is fresh."""
        if pretrained is None:
            pretrained = self.pretrained
        z = jnp.zeros((1, self.max_len), jnp.int32)
        params = self._init(rng, z, jnp.ones((1,), jnp.int32))["params"]
        if pretrained is not None:
            try:
                params = transfer_encoder(pretrained, params)
            except (ValueError, KeyError, TypeError) as e:
                raise FedprivError(f"cannot start from the pretrained encoder: {e}") from None
        return params

    def save_assets(self, run_dir) -> None:
        """``tokenizer.json`` (vocabulary, lowercasing, model shape) for fine-tuning or reuse, and
        with ``privatize_eta`` the ``privatize.json`` record of the user-side privatization."""
        from fedpriv.tasks.bert_run import save_tokenizer

        save_tokenizer(self, run_dir)
        if self.local is not None:
            self.local.save_record(run_dir, self.pretrained_from, "once per example (training and evaluation), key privatize_seed and the example's content")

    @property
    def length_limit(self) -> str:
        return f"task.options.max_len = {self.max_len} pieces ([CLS] and [SEP] included)"

    def words_cut(self, example: Example) -> int:
        words = example.words()
        fit = len(words) - words_beyond(self.vocab, words, self.max_len - 2)
        if isinstance(example, TaggedExample):
            fit = whole_entity_prefix(example.tags, fit)[0]
        return len(words) - fit

    def pieces(self, example: Example) -> int:
        return word_pieces(self.vocab, example.words())

    def encode(self, examples: Sequence[Example]) -> Batch:
        n, L = len(examples), self.max_len
        W = L - 2
        v = self.vocab
        ids = np.full((n, L), v.pad, np.int32)
        labels = np.full((n, L), IGNORE, np.int32)
        word_pos = np.zeros((n, W), np.int32)
        word_tags = np.zeros((n, W), np.int32)
        length = np.zeros(n, np.int32)
        n_words = np.zeros(n, np.int32)
        gold_cut = np.zeros(n, np.float32)
        seed = np.zeros((n, 2), np.uint32)
        for b, ex in enumerate(examples):
            if not isinstance(ex, TaggedExample):
                raise FedprivError("the BERT NER task encodes tagged examples only")
            fit = len(ex.tokens) - words_beyond(v, ex.tokens, W)
            kept, gold_cut[b] = whole_entity_prefix(ex.tags, fit)
            ids[b, 0] = v.cls
            pos = 1
            for w, (tok, tag) in enumerate(zip(ex.tokens[:kept], ex.tags[:kept])):
                pieces = v.word_ids(tok)
                try:
                    t = self._tag_index[tag]
                except KeyError:
                    raise FedprivError(
                        f"tag {tag!r} is not in the task's tag set ({', '.join(self.tags)}); pass tags= to include it"
                    ) from None
                ids[b, pos : pos + len(pieces)] = pieces
                labels[b, pos] = t
                word_pos[b, w] = pos
                word_tags[b, w] = t
                n_words[b] = w + 1
                pos += len(pieces)
            ids[b, pos] = v.sep
            length[b] = pos + 1
            seed[b] = row_seed(ids[b], labels[b])
        return {
            "ids": ids,
            "length": length,
            "labels": labels,
            "word_pos": word_pos,
            "word_tags": word_tags,
            "n_words": n_words,
            "gold_cut": gold_cut,
            "seed": seed,
            "mask": np.ones(n, np.float32),
        }

    def logits(self, params: Params, batch: Mapping[str, jax.Array], rng: jax.Array | None = None, train: bool = False) -> jax.Array:
        """(B, L, T) per-piece tag scores."""
        train = bool(train) and self.cfg.dropout > 0 and rng is not None
        drop = example_keys(rng, jnp.asarray(batch["seed"]), DROPOUT_STREAM) if train else None
        ids, local = batch["ids"], self.local
        params = self.user_side(params)  # the frozen user-side table, if any
        if local is not None:  # privacy-constrained: inputs privatized once per example
            ids = local.fixed(ids, batch["seed"])
        return apply_model(self.model, params, ids, batch["length"], train=train, dropout_keys=drop)

    def _piece_nll(self, logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
        valid = (labels >= 0).astype(jnp.float32)
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
        return nll * valid, valid

    def losses(self, params: Params, batch: Mapping[str, jax.Array], rng: jax.Array, train: bool) -> jax.Array:
        """(B,) mean cross-entropy (nats) over each example's labeled (first) pieces."""
        nll, valid = self._piece_nll(self.logits(params, batch, rng, train), batch["labels"])
        return jnp.sum(nll, axis=1) / jnp.maximum(jnp.sum(valid, axis=1), 1.0)

    def _word_pred(self, logits: jax.Array, batch: Mapping[str, jax.Array]) -> jax.Array:
        at_words = jnp.take_along_axis(logits, batch["word_pos"][..., None], axis=1)  # (B, W, T)
        pred = jnp.argmax(at_words, axis=-1)
        valid = jnp.arange(pred.shape[1])[None, :] < batch["n_words"][:, None]
        return jnp.where(valid, pred, 0).astype(jnp.int32)

    def predict(self, params: Params, batch: Mapping[str, jax.Array]) -> jax.Array:
        """(B, W) int32 predicted tag id per word (0 = O past ``n_words``). Jittable."""
        return self._word_pred(self.logits(params, batch), batch)

    def decode_tags(self, ids: np.ndarray, n_words: np.ndarray) -> list[list[str]]:
        """Host side: tag-id rows -> tag strings, each cut to its number of words."""
        return [[self.tags[i] for i in row[: int(n)]] for row, n in zip(np.asarray(ids), np.asarray(n_words))]

    # ---- metrics ----------------------------------------------------------------------------
    def metric_sums(self, params: Params, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        logits = self.logits(params, batch)
        mask = batch["mask"]
        nll, valid = self._piece_nll(logits, batch["labels"])
        pred = self._word_pred(logits, batch)
        wvalid = (jnp.arange(pred.shape[1])[None, :] < batch["n_words"][:, None]).astype(jnp.float32)
        loss_sum = jnp.sum(jnp.sum(nll, axis=1) * mask)
        return tagging_sums(batch["word_tags"], pred, batch["n_words"], self.tables, wvalid, mask, loss_sum, batch["gold_cut"])

    def summarize(self, sums: Mapping[str, float]) -> dict[str, float]:
        return summarize_tagging(sums)
