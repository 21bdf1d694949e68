"""Masked language modelling: BERT pretraining (:class:`fedpriv.models.bert.BertMLM`) on text.

Encoding: an example's words (``TextExample.text`` split on spaces, or ``TaggedExample.tokens``)
become WordPiece pieces ``[CLS] p_1 .. p_n [SEP]``, the pieces cut to ``max_len - 2`` (a word may
be cut in the middle), then padded with ``[PAD]``. Batch (B examples, L = ``max_len``): ``ids``
int32 (B, L), ``length`` int32 (B,) real positions including [CLS] and [SEP], ``seed`` int32
(B,) a hash of the row's ids, ``mask`` float32 (B,).

Masking (BERT's recipe, re-drawn at every call of :meth:`MLMTask.losses`, i.e. every training
step, as in RoBERTa's dynamic masking): the candidates are the real positions holding a
non-special piece ([UNK] included; [CLS], [SEP], [PAD], [MASK] and ``[unusedN]`` never). Of the n
candidates, k = min(P, max(1, round(mask_prob * n))) are selected uniformly without replacement
(0 when n = 0; P = ``max_predictions``, by default round(mask_prob * (max_len - 2)), which never
binds). Each selected position independently becomes [MASK] with probability 0.8, a random
non-special piece with probability 0.1 (which may by chance be the original piece), or stays
unchanged. The model predicts the original piece at the selected positions only (its head runs
on the P gathered positions).

Randomness: example b's masking and dropout come from ``fold_in(fold_in(rng, stream), seed[b])``
(``seed[b]`` the two uint32 words of a 64-bit content hash, :func:`row_seed`, folded in one by one),
so they depend only on the step's rng and the example's own ids, never on the other rows or the
row index; a vmap over single examples (the DP-SGD reference path) gives the same losses. Two
identical examples in one batch get the same masking.

Privacy-adaptive pretraining (``privatize_eta``, Qu et al. 2021 sec. 3.4): the pieces are first
privatized on the user side (:mod:`fedpriv.tasks.local_inputs`, a fresh draw per step, frozen token
embedding), then masked as above; the targets are the privatized pieces (``vanilla``), the draws'
empirical distribution (``prob``; accuracy then counts the privatized piece) or the original pieces
(``denoising``).

Per-example loss (nats per predicted piece): the mean cross-entropy over the example's selected
positions (0 for an example with no candidate). Metrics (:meth:`MLMTask.metric_sums`) use one
fixed masking (key ``eval_seed``, same per-example folding), so evaluations at different steps
see the same masked positions: ``loss_sum`` and ``correct`` over all ``predictions``;
:meth:`MLMTask.summarize` reports loss and accuracy per predicted piece and perplexity.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedpriv.data.examples import Example
from fedpriv.errors import FedprivError
from fedpriv.models.bert import PRESETS, BertConfig, BertMLM
from fedpriv.models.capture import apply_model
from fedpriv.tasks.base import Batch, Params, Task
from fedpriv.tasks.local_inputs import UserSide

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
_UNUSED = re.compile(r"^\[unused\d+\]$")
MASK_STREAM, DROPOUT_STREAM = 0, 1

# Kinds of position returned by MLMTask.mask_batch.
NOT_SELECTED, MASKED, RANDOM, KEPT = 0, 1, 2, 3


@runtime_checkable
class Tokenizer(Protocol):
    """What the BERT tasks need from a WordPiece tokenizer (e.g.
    :class:`fedpriv.vocab.wordpiece.WordPieceVocab`): the vocabulary in id order (``tokens``, the
    lines of a BERT vocab.txt) and one word -> its pieces (``##`` marks continuations; a word that
    cannot be covered is ``[UNK]``). Objects with ``vocab`` (a token list or a token -> id
    mapping) and ``tokenize(word)`` are accepted too."""

    tokens: Sequence[str]

    def tokenize_word(self, word: str) -> Sequence[str]: ...


class PieceVocab:
    """Adapter over a tokenizer: piece ids of a word, special ids, the random-replacement pool.

    ``tokenizer`` is a :class:`Tokenizer`, an object with ``vocab`` and ``tokenize``, or a plain
    list of vocab.txt tokens (tokenized with :class:`fedpriv.vocab.wordpiece.WordPieceVocab`).
    ``lowercase``: words are lowercased before tokenization (for uncased vocabularies). The vocab
    must hold [PAD], [UNK], [CLS] and [SEP] ([MASK] too for MLM). ``special``: ids of those five
    and of ``[unusedN]``; ``unmaskable``: the same without [UNK]; ``pool``: every other id (the
    random replacements)."""

    def __init__(self, tokenizer: Any, lowercase: bool = False):
        if isinstance(tokenizer, PieceVocab):
            tokenizer, lowercase = tokenizer.tokenizer, tokenizer.lowercase
        if isinstance(tokenizer, (list, tuple)):
            from fedpriv.vocab.wordpiece import WordPieceVocab

            tokenizer = WordPieceVocab(tokenizer)
        tokens = getattr(tokenizer, "tokens", None)
        if tokens is None:
            tokens = getattr(tokenizer, "vocab", None)
        if isinstance(tokens, Mapping):
            tokens = [t for t, _ in sorted(tokens.items(), key=lambda kv: kv[1])]
        fn: Callable | None = getattr(tokenizer, "tokenize_word", None) or getattr(tokenizer, "tokenize", None)
        if tokens is None or fn is None:
            raise FedprivError("a BERT task needs a WordPiece tokenizer with a vocabulary (tokens) and tokenize_word(word)")
        self.tokenizer, self.lowercase, self._fn = tokenizer, bool(lowercase), fn
        self.tokens: tuple[str, ...] = tuple(tokens)
        self.index = {t: i for i, t in enumerate(self.tokens)}
        missing = [t for t in (PAD, UNK, CLS, SEP) if t not in self.index]
        if missing:
            raise FedprivError(f"the WordPiece vocabulary lacks {', '.join(missing)}")
        self.pad, self.unk, self.cls, self.sep = (self.index[t] for t in (PAD, UNK, CLS, SEP))
        self.mask = self.index.get(MASK)
        self.special = np.array(
            sorted(i for t, i in self.index.items() if t in (PAD, UNK, CLS, SEP, MASK) or _UNUSED.match(t)), np.int32
        )
        self.unmaskable = self.special[self.special != self.unk]  # [UNK] may be masked, as in BERT
        self.pool = np.setdiff1d(np.array(sorted(self.index.values()), np.int32), self.special).astype(np.int32)
        self._cache: dict[str, tuple[int, ...]] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def word_ids(self, word: str) -> tuple[int, ...]:
        """One word -> its piece ids (at least one: an empty result becomes [UNK])."""
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        pieces = self._fn(word.lower() if self.lowercase else word)
        out = tuple(int(p) if isinstance(p, (int, np.integer)) else self.index.get(p, self.unk) for p in pieces) or (self.unk,)
        if len(self._cache) < 1_000_000:
            self._cache[word] = out
        return out


def row_seed(*rows: np.ndarray) -> np.ndarray:
    """An example's per-example randomness seed: a 64-bit BLAKE2b hash of its arrays (each
    length-prefixed, so no two different examples hash alike by construction), as two uint32
    words (2,). Distinct examples collide with probability about n**2 / 2**65 (3e-6 at 10**7)."""
    h = hashlib.blake2b(digest_size=8)
    for r in rows:
        b = np.ascontiguousarray(r).tobytes()
        h.update(len(b).to_bytes(8, "little") + b)
    return np.frombuffer(h.digest(), dtype="<u4").astype(np.uint32)


def example_keys(rng: jax.Array, seeds: jax.Array, stream: int) -> jax.Array:
    """(B,) keys ``fold_in(fold_in(rng, stream), seeds[b])``, one per example, row-independent;
    ``seeds`` (B,) or (B, 2) (the two words of :func:`row_seed`, folded in one after the other)."""
    base = jax.random.fold_in(rng, stream)
    s = jnp.asarray(seeds).astype(jnp.uint32)
    s = s.reshape(s.shape[0], -1)

    def one(words):  # noqa: ANN001, ANN202
        k = base
        for j in range(words.shape[0]):
            k = jax.random.fold_in(k, words[j])
        return k

    return jax.vmap(one)(s)


def word_pieces(vocab: PieceVocab, words: Sequence[str]) -> int:
    """How many WordPiece pieces ``words`` make (no [CLS]/[SEP], no cut)."""
    return sum(len(vocab.word_ids(w)) for w in words)


def words_beyond(vocab: PieceVocab, words: Sequence[str], room: int) -> int:
    """How many of ``words`` do not wholly fit in ``room`` pieces (the first that does not, and all after it)."""
    for i, w in enumerate(words):
        room -= len(vocab.word_ids(w))
        if room < 0:
            return len(words) - i
    return 0


def resolve_config(model: str | BertConfig, vocab_size: int, max_len: int, dropout: float | None) -> BertConfig:
    """The preset (or config) with the tokenizer's vocabulary size, and ``dropout`` if given."""
    if isinstance(model, str):
        if model not in PRESETS:
            raise FedprivError(f"unknown BERT preset {model!r}; choose one of {', '.join(PRESETS)}")
        model = PRESETS[model]
    fields = {**model.__dict__, "vocab_size": int(vocab_size)}
    if dropout is not None:
        fields["dropout"] = float(dropout)
    try:
        cfg = BertConfig(**fields)
    except ValueError as e:
        raise FedprivError(str(e)) from None
    if not 3 <= max_len <= cfg.max_len:
        raise FedprivError(f"max_len must be in [3, {cfg.max_len}] (the model's position table), got {max_len}")
    return cfg


class MLMTask(UserSide, Task):
    """BERT masked-LM pretraining (see the module docstring)."""

    name = "mlm"
    utility = ("accuracy", "masked-token accuracy")

    def __init__(
        self,
        tokenizer: Any,
        max_len: int = 128,
        model: str | BertConfig = "tiny",
        mask_prob: float = 0.15,
        mask_token_frac: float = 0.8,
        random_token_frac: float = 0.1,
        max_predictions: int | None = None,
        dropout: float | None = None,
        lowercase: bool = False,
        eval_seed: int = 0,
        pretrained: Params | None = None,
        privatize_eta: float | None = None,
        privatize_seed: int = 0,
        mlm_target: str | None = None,
        target_draws: int = 10,
        freeze_token_embedding: bool = False,
    ):
        """``pretrained``: a whole :class:`BertMLM` parameter tree (of this shape and vocabulary) that
        :meth:`init_params` returns instead of fresh parameters: continued pretraining. In a config,
        ``task.options.pretrained`` is a finished BERT run directory (:mod:`fedpriv.tasks.bert_run`).

        Privacy-adaptive pretraining (Qu et al. 2021, sec. 3.4; :mod:`fedpriv.tasks.local_inputs`):
        with ``privatize_eta`` the inputs are M_txt-privatized afresh at every step in the frozen
        token embedding of ``pretrained`` (which must be given), and ``mlm_target`` says what the
        masked positions predict: ``vanilla`` (default) the privatized piece, ``prob`` the
        empirical distribution of ``target_draws`` fresh privatizations of the original piece
        (their eq. 6), ``denoising`` the original piece (eq. 7). ``privatize_seed`` is not used
        here (the draws follow the step's key); it is kept for symmetry with the NER task.
        ``freeze_token_embedding`` keeps the pretrained token embedding fixed without privatizing
        (the control run of the same further training); ``privatize_eta`` implies it."""
        self.vocab = PieceVocab(tokenizer, lowercase)
        if self.vocab.mask is None:
            raise FedprivError(f"the WordPiece vocabulary lacks {MASK}, which masked-LM training needs")
        if not len(self.vocab.pool):
            raise FedprivError("the WordPiece vocabulary has no ordinary pieces")
        if not 0.0 < mask_prob < 1.0:
            raise FedprivError(f"mask_prob must be in (0, 1), got {mask_prob}")
        if mask_token_frac < 0 or random_token_frac < 0 or mask_token_frac + random_token_frac > 1.0:
            raise FedprivError("mask_token_frac and random_token_frac must be >= 0 and sum to at most 1")
        self.max_len = int(max_len)
        self.cfg = resolve_config(model, len(self.vocab), self.max_len, dropout)
        self.model = BertMLM(self.cfg)
        self._init = jax.jit(self.model.init)  # one program: much faster than op-by-op initialization
        self.mask_prob = float(mask_prob)
        self.mask_token_frac, self.random_token_frac = float(mask_token_frac), float(random_token_frac)
        default_p = max(1, round(self.mask_prob * (self.max_len - 2)))
        self.max_predictions = int(max_predictions) if max_predictions is not None else default_p
        if not 1 <= self.max_predictions <= self.max_len:
            raise FedprivError(f"max_predictions must be in [1, {self.max_len}], got {max_predictions}")
        self.eval_seed = int(eval_seed)
        if privatize_eta is None and (mlm_target is not None or target_draws != 10):
            raise FedprivError("mlm_target and target_draws apply to privacy-adaptive pretraining: give privatize_eta too")
        if privatize_eta is not None:
            from fedpriv.tasks.local_inputs import MLM_TARGETS

            mlm_target = mlm_target or "vanilla"
            if mlm_target not in MLM_TARGETS:
                raise FedprivError(f"mlm_target must be one of {', '.join(MLM_TARGETS)}, got {mlm_target!r}")
            if int(target_draws) < 1:
                raise FedprivError(f"target_draws must be >= 1, got {target_draws}")
        self.init_user_side(privatize_eta, privatize_seed, freeze_token_embedding)
        self.mlm_target, self.target_draws = mlm_target, int(target_draws)
        self.pretrained = pretrained
        self.pretrained_from: Any = None  # where ``pretrained`` came from (a run directory), for reports
        self.vocabulary_record: dict | None = None  # where the vocabulary came from (saved in tokenizer.json)

    def save_assets(self, run_dir) -> None:
        """``tokenizer.json`` (vocabulary, lowercasing, model shape) for fine-tuning or reuse, and
        with ``privatize_eta`` the ``privatize.json`` record of the user-side privatization."""
        from fedpriv.tasks.bert_run import save_tokenizer

        save_tokenizer(self, run_dir)
        if self.local is not None:
            draws = "fresh at every step (public pretraining text); evaluation draws from the fixed eval key"
            extra = {"mlm_target": self.mlm_target, **({"target_draws": self.target_draws} if self.mlm_target == "prob" else {})}
            self.local.save_record(run_dir, self.pretrained_from, draws, **extra)

    # ---- batching ---------------------------------------------------------------------------
    def init_params(self, rng: jax.Array) -> Params:
        """Fresh parameters, or a copy of ``pretrained`` (refused unless its structure and shapes match)."""
        z = jnp.zeros((1, self.max_len), jnp.int32)
        args = (z, jnp.ones((1,), jnp.int32), jnp.zeros((1, self.max_predictions), jnp.int32))
        if self.pretrained is None:
            return self._init(rng, *args)["params"]
        fresh = jax.eval_shape(lambda r: self._init(r, *args)["params"], rng)
        shapes = lambda t: jax.tree_util.tree_map(lambda a: (tuple(a.shape), str(a.dtype)), t)  # noqa: E731
        if jax.tree_util.tree_structure(fresh) != jax.tree_util.tree_structure(self.pretrained) or shapes(fresh) != shapes(self.pretrained):
            raise FedprivError("the pretrained masked-LM parameters do not match this model (another BertConfig or vocabulary?)")
        return jax.tree_util.tree_map(jnp.array, self.pretrained)

    @property
    def length_limit(self) -> str:
        return f"task.options.max_len = {self.max_len} pieces ([CLS] and [SEP] included)"

    def words_cut(self, example: Example) -> int:
        return words_beyond(self.vocab, example.words(), self.max_len - 2)

    def pieces(self, example: Example) -> int:
        return word_pieces(self.vocab, example.words())

    def encode(self, examples: Sequence[Example]) -> Batch:
        n, L = len(examples), self.max_len
        ids = np.full((n, L), self.vocab.pad, np.int32)
        length = np.zeros(n, np.int32)
        seed = np.zeros((n, 2), np.uint32)
        for b, ex in enumerate(examples):
            pieces = [p for w in ex.words() for p in self.vocab.word_ids(w)][: L - 2]
            row = [self.vocab.cls, *pieces, self.vocab.sep]
            ids[b, : len(row)] = row
            length[b] = len(row)
            seed[b] = row_seed(ids[b])
        return {"ids": ids, "length": length, "seed": seed, "mask": np.ones(n, np.float32)}

    # ---- masking ----------------------------------------------------------------------------
    def _mask_one(self, key: jax.Array, ids: jax.Array, length: jax.Array):
        L, P = ids.shape[0], self.max_predictions
        draws = jax.random.uniform(key, (L + 2 * P,))  # one draw: selection, kind, random piece
        real = jnp.arange(L) < length
        cand = real & ~jnp.isin(ids, jnp.asarray(self.vocab.unmaskable))
        n = jnp.sum(cand)
        k = jnp.where(n > 0, jnp.clip(jnp.round(self.mask_prob * n), 1, P), 0).astype(jnp.int32)
        scores = jnp.where(cand, draws[:L], 2.0)
        pos = jnp.argsort(scores)[:P].astype(jnp.int32)  # candidates first, in random order
        selected = jnp.arange(P) < k
        orig = ids[pos]
        u = draws[L : L + P]
        pool = jnp.asarray(self.vocab.pool)
        pick = jnp.minimum(jnp.floor(draws[L + P :] * pool.shape[0]).astype(jnp.int32), pool.shape[0] - 1)
        rand = pool[pick]
        kind = jnp.where(u < self.mask_token_frac, MASKED, jnp.where(u < self.mask_token_frac + self.random_token_frac, RANDOM, KEPT))
        kind = jnp.where(selected, kind, NOT_SELECTED)
        new = jnp.where(kind == MASKED, self.vocab.mask, jnp.where(kind == RANDOM, rand, orig))
        return ids.at[pos].set(new), pos, orig, selected.astype(jnp.float32), kind

    def mask_batch(self, rng: jax.Array, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        """The masking of a batch under ``rng``: ``inputs`` (B, L), and at the P prediction slots
        ``positions``, ``targets`` (original ids), ``weights`` (1 = selected) and ``kind``
        (0 not selected, 1 [MASK], 2 random piece, 3 unchanged), each (B, P). Jittable."""
        keys = example_keys(rng, jnp.asarray(batch["seed"]), MASK_STREAM)
        inputs, pos, targets, w, kind = jax.vmap(self._mask_one)(keys, jnp.asarray(batch["ids"]), jnp.asarray(batch["length"]))
        return {"inputs": inputs, "positions": pos, "targets": targets, "weights": w, "kind": kind}

    # ---- loss and metrics -------------------------------------------------------------------
    def _nll(self, params: Params, batch: Mapping[str, jax.Array], rng: jax.Array, train: bool):
        """(logits, per-slot nll (B, P), masking) with ``targets`` the hard targets (for accuracy)."""
        local = self.local
        seeds = jnp.asarray(batch["seed"])
        params = self.user_side(params)
        if local is not None:  # privacy-adaptive: privatized inputs, then masking
            from fedpriv.tasks.local_inputs import INPUT_STREAM, SET_STREAM

            batch = {**batch, "original": batch["ids"], "ids": local.fresh(example_keys(rng, seeds, INPUT_STREAM), batch["ids"])}
        m = self.mask_batch(rng, batch)
        train = bool(train) and self.cfg.dropout > 0
        drop = example_keys(rng, seeds, DROPOUT_STREAM) if train else None
        logits = apply_model(self.model, params, m["inputs"], batch["length"], m["positions"], train=train, dropout_keys=drop)
        if local is not None and self.mlm_target != "vanilla":
            original = jnp.take_along_axis(jnp.asarray(batch["original"]), m["positions"], axis=1)
            if self.mlm_target == "prob":  # eq. 6: cross-entropy against the empirical distribution of the draws
                draws = local.draws(example_keys(rng, seeds, SET_STREAM), original, self.target_draws)
                logp = jax.nn.log_softmax(logits, axis=-1)
                nll = -jnp.mean(jnp.take_along_axis(logp, draws, axis=-1), axis=-1)
                return logits, nll, m
            m = {**m, "targets": original}  # eq. 7, denoising
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, m["targets"])
        return logits, nll, m

    def losses(self, params: Params, batch: Mapping[str, jax.Array], rng: jax.Array, train: bool) -> jax.Array:
        """(B,) mean cross-entropy (nats) over each example's selected positions."""
        if rng is None:
            rng = jax.random.key(self.eval_seed)
        _, nll, m = self._nll(params, batch, rng, train)
        w = m["weights"]
        return jnp.sum(nll * w, axis=1) / jnp.maximum(jnp.sum(w, axis=1), 1.0)

    def metric_sums(self, params: Params, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        logits, nll, m = self._nll(params, batch, jax.random.key(self.eval_seed), False)
        mask = batch["mask"]
        w = m["weights"] * mask[:, None]
        correct = (jnp.argmax(logits, axis=-1) == m["targets"]).astype(jnp.float32)
        return {
            "examples": jnp.sum(mask),
            "predictions": jnp.sum(w),
            "loss_sum": jnp.sum(nll * w),
            "correct": jnp.sum(correct * w),
        }

    def summarize(self, sums: Mapping[str, float]) -> dict[str, float]:
        n = max(sums["predictions"], 1.0)
        loss = sums["loss_sum"] / n
        return {
            "loss": loss,
            "perplexity": math.exp(min(loss, 700.0)),
            "accuracy": sums["correct"] / n,
            "examples": int(sums["examples"]),
            "predictions": int(sums["predictions"]),
        }
