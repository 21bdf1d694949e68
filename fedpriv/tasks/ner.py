"""NER: the BiLSTM tagger (softmax or CRF head) over fixed-length encoded sentences.

Vocabularies come from the training examples only (:meth:`NERTask.from_examples`): words are
normalized (lowercased, each digit -> ``0``) and the ``vocab_size`` most frequent with count >=
``min_count`` kept (ties alphabetical); id 0 = pad, 1 = unk, 2.. = words. The casing the
lowercasing removes is fed separately (:func:`fedpriv.models.ner.case_class`). The tag set is
``O`` (id 0) then the other training tags sorted; evaluation tags outside it are refused (pass
``tags=`` to fix the set). Sentences longer than ``max_len`` are truncated (default 128 covers
WNUT-17 and NCBI-disease: their longest sentences have 105 and 123 tokens); the cut tokens are
not trained on, the cut is moved back to the start of a gold entity it would split, and the gold
entities cut count as missed (:func:`fedpriv.tasks.ner_metrics.whole_entity_prefix`), so F1 is
over every gold entity of the evaluation file.

Batch (B examples, L = ``max_len``): ``tokens``, ``case``, ``tags`` int32 (B, L) (0 past the
end), ``length`` int32 (B,), ``gold_cut`` float32 (B,) gold entities past the cut, ``mask``
float32 (B,).

Training noise (``train=True``, drawn from the step's rng): dropout (``dropout``) and word
dropout (``word_dropout``: each real token's id becomes unk with that probability, so the model
learns to tag unseen words from casing and context).

Per-example loss, in nats per token: softmax head, the mean token cross-entropy over the
example's real tokens; CRF head, the sentence negative log-likelihood divided by its length.
Both depend only on the example's own row. Decoding: argmax per token (softmax) or Viterbi
(CRF, restricted to valid transitions of the tag scheme when ``constrained`` is set; training
uses the unconstrained CRF).

Metrics (:meth:`NERTask.metric_sums`, jittable, computed on device): ``loss_sum`` (token
cross-entropy sum, or sentence NLL sum for the CRF), ``tokens``, ``correct`` tokens, and
entity counts ``tp`` / ``n_pred`` / ``n_gold`` with conlleval semantics (exact span and type;
see :mod:`fedpriv.tasks.ner_metrics`). :meth:`NERTask.summarize` reports entity precision,
recall, F1, token accuracy and loss per token.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedpriv.data.examples import Example, TaggedExample
from fedpriv.errors import DataFormatError, FedprivError
from fedpriv.jsonio import read_json, write_json_atomic
from fedpriv.models.crf import allowed_transitions, constrain, crf_log_likelihood, viterbi_decode
from fedpriv.models.capture import apply_model
from fedpriv.models.ner import BiLSTMTagger, case_class, char_ids
from fedpriv.tasks.base import Batch, Params, Task, save_vocabulary_record
from fedpriv.tasks.ner_metrics import chunk_tables, summarize_tagging, tagging_sums, whole_entity_prefix

FORMAT = "fedpriv-ner-task"
_DIGIT = re.compile(r"\d")


def normalize_token(token: str) -> str:
    """Vocabulary key of a token: lowercased, every digit replaced by 0."""
    return _DIGIT.sub("0", token.lower())


class TokenVocab:
    """Normalized words with id 0 = pad, 1 = unk, 2.. = words (in the given order)."""

    PAD, UNK = 0, 1

    def __init__(self, words: Iterable[str]):
        self.words: tuple[str, ...] = tuple(words)
        if len(set(self.words)) != len(self.words):
            raise FedprivError("vocabulary words must be distinct")
        self._index = {w: i + 2 for i, w in enumerate(self.words)}

    @classmethod
    def build(cls, sentences: Iterable[Sequence[str]], size: int = 20_000, min_count: int = 1) -> "TokenVocab":
        """The ``size`` most frequent normalized words with count >= ``min_count`` (ties alphabetical)."""
        if size < 1:
            raise FedprivError(f"vocab_size must be >= 1, got {size}")
        counts: Counter = Counter()
        for tokens in sentences:
            counts.update(normalize_token(t) for t in tokens)
        return cls.from_counts(counts, size, min_count)

    @classmethod
    def from_counts(cls, counts: Mapping[str, float], size: int = 20_000, min_count: float = 1) -> "TokenVocab":
        """The ``size`` most frequent words of a normalized word -> count mapping (plain or a DP
        histogram's noisy counts) with count >= ``min_count`` (ties alphabetical)."""
        if size < 1:
            raise FedprivError(f"vocab_size must be >= 1, got {size}")
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return cls(w for w, c in ranked[:size] if c >= min_count)

    def __len__(self) -> int:
        """Number of ids, including pad and unk."""
        return len(self.words) + 2

    def id(self, token: str) -> int:
        return self._index.get(normalize_token(token), self.UNK)


class NERTask(Task):
    name = "ner"
    utility = ("f1", "entity F1")
    target_metrics = ("f1", "precision", "recall", "accuracy")

    def __init__(
        self,
        vocab: TokenVocab,
        tags: Sequence[str],
        embed_dim: int = 100,
        hidden: int = 100,
        case_dim: int = 16,
        dropout: float = 0.5,
        head: str = "softmax",
        max_len: int = 128,
        constrained: bool = True,
        word_dropout: float = 0.0,
        char_dim: int = 0,
        char_filters: int = 50,
        char_width: int = 16,
    ):
        tags = list(tags)
        if not tags or tags[0] != "O" or len(set(tags)) != len(tags):
            raise FedprivError("the NER tag set must be distinct tags starting with 'O'")
        if head not in ("softmax", "crf"):
            raise FedprivError(f"task.options.head: expected 'softmax' or 'crf', got {head!r}")
        if max_len < 1:
            raise FedprivError(f"task.options.max_len must be >= 1, got {max_len}")
        for key, p in (("dropout", dropout), ("word_dropout", word_dropout)):
            if not 0.0 <= p < 1.0:
                raise FedprivError(f"task.options.{key} must be in [0, 1), got {p}")
        self.vocab = vocab
        self.tags = tuple(tags)
        self._tag_index = {t: i for i, t in enumerate(self.tags)}
        self.hyper = {
            "embed_dim": int(embed_dim),
            "hidden": int(hidden),
            "case_dim": int(case_dim),
            "dropout": float(dropout),
            "head": head,
            "max_len": int(max_len),
            "constrained": bool(constrained),
            "word_dropout": float(word_dropout),
            "char_dim": int(char_dim),
            "char_filters": int(char_filters),
            "char_width": int(char_width),
        }
        self.char_dim, self.char_width = int(char_dim), int(char_width)
        self.head, self.max_len, self.dropout, self.word_dropout = head, int(max_len), float(dropout), float(word_dropout)
        self.model = BiLSTMTagger(len(vocab), len(self.tags), int(embed_dim), int(hidden), int(case_dim), float(dropout), head, int(char_dim), int(char_filters))
        self.tables = chunk_tables(self.tags)
        self._allowed = allowed_transitions(self.tags) if constrained else None

    @classmethod
    def from_examples(
        cls,
        examples: Sequence[Example],
        vocab_size: int = 20_000,
        min_count: int = 1,
        tags: Sequence[str] | None = None,
        word_counts: Mapping[str, float] | None = None,
        **hyper,
    ) -> "NERTask":
        """Build the vocabularies from training examples (see the module docstring); the words
        from ``word_counts`` (normalized words, e.g. a DP histogram's) when given."""
        tagged = [e for e in examples if isinstance(e, TaggedExample)]
        if len(tagged) != len(examples):
            raise FedprivError("an NER task needs tagged examples (tokens and tags)")
        if not tagged:
            raise FedprivError("no training examples to build the NER vocabularies from")
        if word_counts is None:
            vocab = TokenVocab.build((e.tokens for e in tagged), vocab_size, min_count)
        else:
            vocab = TokenVocab.from_counts(word_counts, vocab_size, min_count)
        if tags is None:
            tags = ["O", *sorted({t for e in tagged for t in e.tags} - {"O"})]
        else:
            tags = ["O", *[t for t in tags if t != "O"]]
        return cls(vocab, tags, **hyper)

    def save_assets(self, run_dir) -> None:
        """``vocabulary.json``: where the word vocabulary came from (plain or a DP histogram)."""
        save_vocabulary_record(self, run_dir)

    # ---- model ------------------------------------------------------------------------------
    def init_params(self, rng: jax.Array) -> Params:
        z = jnp.zeros((1, self.max_len), jnp.int32)
        chars = jnp.zeros((1, self.max_len, self.char_width), jnp.int32) if self.char_dim else None
        return self.model.init(rng, z, z, jnp.ones((1,), jnp.int32), chars=chars)["params"]

    @property
    def length_limit(self) -> str:
        return f"task.options.max_len = {self.max_len} tokens"

    def words_cut(self, example: Example) -> int:
        words = example.words()
        fit = min(len(words), self.max_len)
        if isinstance(example, TaggedExample):
            fit = whole_entity_prefix(example.tags, fit)[0]
        return len(words) - fit

    def encode(self, examples: Sequence[Example]) -> Batch:
        n, L = len(examples), self.max_len
        tokens = np.zeros((n, L), np.int32)
        case = np.zeros((n, L), np.int32)
        tags = np.zeros((n, L), np.int32)
        length = np.zeros(n, np.int32)
        gold_cut = np.zeros(n, np.float32)
        chars = np.zeros((n, L, self.char_width), np.int32)
        for b, ex in enumerate(examples):
            if not isinstance(ex, TaggedExample):
                raise FedprivError("the NER task encodes tagged examples only")
            kept, gold_cut[b] = whole_entity_prefix(ex.tags, L)
            toks, tgs = ex.tokens[:kept], ex.tags[:kept]
            length[b] = len(toks)
            tokens[b, : len(toks)] = [self.vocab.id(t) for t in toks]
            case[b, : len(toks)] = [case_class(t) for t in toks]
            if self.char_dim:
                for i, t in enumerate(toks):
                    ids = char_ids(t, self.char_width)
                    chars[b, i, : len(ids)] = ids
            try:
                tags[b, : len(tgs)] = [self._tag_index[t] for t in tgs]
            except KeyError as e:
                raise FedprivError(
                    f"tag {e.args[0]!r} is not in the task's tag set ({', '.join(self.tags)}); "
                    "pass task.options.tags to include it"
                ) from None
        out = {"tokens": tokens, "case": case, "tags": tags, "length": length, "gold_cut": gold_cut, "mask": np.ones(n, np.float32)}
        if self.char_dim:
            out["chars"] = chars
        return out

    def emissions(self, params: Params, batch: Mapping[str, jax.Array], rng: jax.Array | None = None, train: bool = False) -> jax.Array:
        """(B, L, T) emission scores. With ``train``, word dropout and dropout draw from ``rng``."""
        tokens = batch["tokens"]
        if train and self.word_dropout > 0:
            rng, sub = jax.random.split(rng)
            drop = jax.random.bernoulli(sub, self.word_dropout, tokens.shape) & (tokens != TokenVocab.PAD)
            tokens = jnp.where(drop, TokenVocab.UNK, tokens)
        train = bool(train) and self.dropout > 0
        rngs = {"dropout": rng} if train else {}
        return apply_model(self.model, params, tokens, batch["case"], batch["length"], train=train, rngs=rngs, chars=batch.get("chars"))

    def _crf(self, params: Params, constrained: bool):
        trans, start, end = params["transitions"], params["start"], params["end"]
        if constrained and self._allowed is not None:
            trans, start, end = constrain(trans, start, end, *self._allowed)
        return trans, start, end

    def _sentence_nll(self, params: Params, em: jax.Array, batch: Mapping[str, jax.Array]) -> jax.Array:
        trans, start, end = self._crf(params, constrained=False)
        ll = jax.vmap(crf_log_likelihood, in_axes=(0, 0, 0, None, None, None))(em, batch["tags"], batch["length"], trans, start, end)
        return -ll

    def _token_nll(self, em: jax.Array, batch: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        valid = (jnp.arange(em.shape[1])[None, :] < batch["length"][:, None]).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(em, batch["tags"]) * valid, valid

    def losses(self, params: Params, batch: Mapping[str, jax.Array], rng: jax.Array, train: bool) -> jax.Array:
        """(B,) per-example loss in nats per real token (see the module docstring)."""
        em = self.emissions(params, batch, rng, train)
        n = jnp.maximum(batch["length"], 1).astype(jnp.float32)
        if self.head == "crf":
            return self._sentence_nll(params, em, batch) / n
        nll, _ = self._token_nll(em, batch)
        return jnp.sum(nll, axis=1) / n

    def _decode(self, params: Params, em: jax.Array, length: jax.Array) -> jax.Array:
        if self.head == "crf":
            trans, start, end = self._crf(params, constrained=True)
            path, _ = jax.vmap(viterbi_decode, in_axes=(0, 0, None, None, None))(em, length, trans, start, end)
        else:
            path = jnp.argmax(em, axis=-1)
        valid = jnp.arange(em.shape[1])[None, :] < length[:, None]
        return jnp.where(valid, path, 0).astype(jnp.int32)

    def predict(self, params: Params, batch: Mapping[str, jax.Array]) -> jax.Array:
        """(B, L) int32 predicted tag ids (0 = O past each example's length). Jittable."""
        return self._decode(params, self.emissions(params, batch), batch["length"])

    def decode_tags(self, ids: np.ndarray, length: np.ndarray) -> list[list[str]]:
        """Host side: tag-id rows -> tag strings, each cut to its length."""
        ids = np.asarray(ids)
        return [[self.tags[i] for i in row[: int(n)]] for row, n in zip(ids, np.asarray(length))]

    # ---- metrics ----------------------------------------------------------------------------
    def metric_sums(self, params: Params, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        em = self.emissions(params, batch)
        mask = batch["mask"]
        length = batch["length"]
        nll_tok, valid = self._token_nll(em, batch)
        if self.head == "crf":
            loss_sum = jnp.sum(self._sentence_nll(params, em, batch) * mask)
        else:
            loss_sum = jnp.sum(jnp.sum(nll_tok, axis=1) * mask)
        pred = self._decode(params, em, length)
        return tagging_sums(batch["tags"], pred, length, self.tables, valid, mask, loss_sum, batch["gold_cut"])

    def summarize(self, sums: Mapping[str, float]) -> dict[str, float]:
        return summarize_tagging(sums)

    # ---- persistence ------------------------------------------------------------------------
    def to_json(self) -> dict:
        """Vocabularies and hyperparameters (enough to rebuild the task; parameters are separate)."""
        return {"format": FORMAT, "version": 1, "words": list(self.vocab.words), "tags": list(self.tags), "hyper": dict(self.hyper)}

    @classmethod
    def from_json(cls, obj: dict) -> "NERTask":
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise FedprivError("not a fedpriv NER task description")
        return cls(TokenVocab(obj["words"]), obj["tags"], **obj.get("hyper", {}))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_json` as JSON (atomically)."""
        write_json_atomic(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "NERTask":
        obj = read_json(path, "NER task file")
        try:
            return cls.from_json(obj)
        except (FedprivError, KeyError, TypeError) as e:
            raise DataFormatError(path, None, f"not a fedpriv NER task ({e})") from None
