"""BERT model, masked-LM pretraining task and BERT NER fine-tuning task."""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedpriv.data.conll import iter_sentences
from fedpriv.data.examples import TaggedExample, TextExample
from fedpriv.errors import FedprivError
from fedpriv.models.bert import PRESETS, BertConfig, BertEncoder, BertMLM, BertTokenClassifier, param_count, transfer_encoder
from fedpriv.tasks.base import add_sums
from fedpriv.tasks.bert_ner import IGNORE, BertNERTask
from fedpriv.tasks.mlm import KEPT, MASKED, NOT_SELECTED, RANDOM, MLMTask, PieceVocab

RESERVED = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# One small block: the fast tests' cost is mostly XLA compilation, which grows with depth.
MICRO = BertConfig(hidden=32, layers=1, heads=2, intermediate=64, max_len=16)


class TinyWordPiece:
    """A test-local greedy longest-match WordPiece tokenizer (the Tokenizer protocol)."""

    def __init__(self, tokens):
        self.tokens = list(tokens)
        self._set = set(self.tokens) - set(RESERVED)

    def tokenize_word(self, word):
        out, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self._set:
                    break
            else:
                return ["[UNK]"]
            out.append(piece)
            start = end
        return out


def toy_tokenizer() -> TinyWordPiece:
    words = ["the", "patient", "has", "hyper", "##tension", "and", "breast", "cancer", "is", "a", "disease", "."]
    chars = "abcdefghijklmnopqrstuvwxyz"
    return TinyWordPiece(dict.fromkeys(RESERVED + words + list(chars) + ["##" + c for c in chars]))  # distinct


@lru_cache(maxsize=1)
def ncbi_sentences() -> tuple[TaggedExample, ...]:
    return tuple(s for _, s in iter_sentences(Path(__file__).resolve().parents[1] / "data" / "ncbi-disease" / "train.tsv"))


def ncbi_tokenizer(size: int = 800):
    """A WordPiece vocabulary of the lowercased NCBI training words (the project's learner when
    present, else the most frequent words plus all characters)."""
    counts = Counter(w.lower() for s in ncbi_sentences() for w in s.tokens)
    try:
        from fedpriv.vocab.wordpiece import learn_wordpiece
    except ImportError:
        chars = sorted({c for w in counts for c in w})
        words = [w for w, _ in counts.most_common(size) if w not in chars]
        return TinyWordPiece(RESERVED + chars + ["##" + c for c in chars] + words)
    return learn_wordpiece(counts, size)


def expected_params(cfg: BertConfig) -> tuple[int, int]:
    """(encoder, MLM head) parameter counts of the architecture, written out."""
    H, I, V = cfg.hidden, cfg.intermediate, cfg.vocab_size
    emb = (V + cfg.max_len + cfg.type_vocab) * H + 2 * H
    layer = 4 * (H * H + H) + 2 * H + (H * I + I) + (I * H + H) + 2 * H
    head = (H * H + H) + 2 * H + (H * V + V)
    return emb + cfg.layers * layer, head


@lru_cache(maxsize=None)
def micro_params(kind: str):
    """Initial MICRO parameters over the toy vocabulary (shared: initialization compiles slowly)."""
    if kind == "mlm":
        return MLMTask(toy_tokenizer(), max_len=16, model=MICRO).init_params(jax.random.key(0))
    return BertNERTask(toy_tokenizer(), ["O", "B-D", "I-D"], max_len=16, model=MICRO).init_params(jax.random.key(1))


def shapes_of(module, *args):
    return jax.eval_shape(lambda: module.init(jax.random.key(0), *args)["params"])


# ---- model ------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_preset_shapes_and_parameter_counts(preset):
    cfg = BertConfig(**{**PRESETS[preset].__dict__, "vocab_size": 1000})
    assert (cfg.layers, cfg.hidden, cfg.heads, cfg.intermediate, cfg.max_len) == {
        "tiny": (2, 64, 2, 128, 128),
        "small": (4, 256, 4, 1024, 128),
    }[preset]
    B, L, P = 2, 16, 3
    ids, length = jnp.zeros((B, L), jnp.int32), jnp.full((B,), L, jnp.int32)
    enc, head = expected_params(cfg)
    mlm = shapes_of(BertMLM(cfg), ids, length, jnp.zeros((B, P), jnp.int32))
    assert param_count(mlm) == enc + head
    assert param_count(mlm["encoder"]) == enc
    clf = shapes_of(BertTokenClassifier(cfg, 5), ids, length)
    assert param_count(clf) == enc + cfg.hidden * 5 + 5
    out = jax.eval_shape(lambda p: BertMLM(cfg).apply({"params": p}, ids, length), mlm)
    assert out.shape == (B, L, 1000)
    out = jax.eval_shape(lambda p: BertMLM(cfg).apply({"params": p}, ids, length, jnp.zeros((B, P), jnp.int32)), mlm)
    assert out.shape == (B, P, 1000)
    out = jax.eval_shape(lambda p: BertTokenClassifier(cfg, 5).apply({"params": p}, ids, length), clf)
    assert out.shape == (B, L, 5)


def test_small_encoder_matches_bert_mini_size():
    # 4 x 256 with BERT's 30,522-piece vocab, 512 positions and 2 segments: ~11.1M encoder
    # parameters (Turc et al.'s BERT-Mini, 11.3M with its pooler).
    cfg = BertConfig(**{**PRESETS["small"].__dict__, "max_len": 512, "type_vocab": 2})
    n = param_count(shapes_of(BertEncoder(cfg), jnp.zeros((1, 8), jnp.int32), jnp.ones((1,), jnp.int32)))
    assert n == expected_params(cfg)[0]
    assert 11.0e6 < n < 11.3e6


def test_padding_does_not_change_real_positions():
    cfg = BertConfig(**{**MICRO.__dict__, "layers": 2, "vocab_size": 50})
    enc = BertEncoder(cfg)
    rng = np.random.default_rng(0)
    L, n = 12, 7
    ids = rng.integers(5, 50, size=(1, L)).astype(np.int32)
    params = jax.jit(enc.init)(jax.random.key(1), jnp.asarray(ids), jnp.array([n]))["params"]
    apply = jax.jit(lambda i, n: enc.apply({"params": params}, i, n))
    base = apply(jnp.asarray(ids), jnp.array([n]))
    other = ids.copy()
    other[0, n:] = rng.integers(0, 50, size=L - n)  # different padding content
    changed = apply(jnp.asarray(other), jnp.array([n]))
    np.testing.assert_allclose(changed[0, :n], base[0, :n], atol=1e-5)
    shorter = apply(jnp.asarray(ids[:, :n]), jnp.array([n]))  # no padding at all
    np.testing.assert_allclose(shorter[0], base[0, :n], atol=1e-5)
    # without the mask (length = L) the padding does change the real positions
    unmasked = apply(jnp.asarray(other), jnp.array([L]))
    assert not np.allclose(unmasked[0, :n], base[0, :n], atol=1e-3)


def test_transfer_encoder_copies_exactly_the_encoder():
    tok = toy_tokenizer()
    mlm_task = MLMTask(tok, max_len=16, model=MICRO)
    ner_task = BertNERTask(tok, ["O", "B-D", "I-D"], max_len=12, model=MICRO)  # shorter inputs, same position table
    assert ner_task.cfg == mlm_task.cfg
    mlm, clf = micro_params("mlm"), micro_params("ner")
    with_default = BertNERTask(tok, ["O", "B-D", "I-D"], max_len=12, model=MICRO, pretrained=mlm)
    for out in (transfer_encoder(mlm, clf), ner_task.init_params(jax.random.key(1), mlm), with_default.init_params(jax.random.key(1))):
        assert jax.tree.structure(out) == jax.tree.structure(clf)
        assert set(out) == {"encoder", "classifier"}
        for x, y in zip(jax.tree.leaves(out["encoder"]), jax.tree.leaves(mlm["encoder"])):
            np.testing.assert_array_equal(x, y)
        for x, y in zip(jax.tree.leaves(out["classifier"]), jax.tree.leaves(clf["classifier"])):
            np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(transfer_encoder(mlm["encoder"], clf)["encoder"]["token_embed"]["embedding"], mlm["encoder"]["token_embed"]["embedding"])
    ids, length = jnp.zeros((1, 8), jnp.int32), jnp.ones((1,), jnp.int32)
    deeper = BertConfig(**{**mlm_task.cfg.__dict__, "layers": 2})
    deep = jax.eval_shape(lambda: BertMLM(deeper).init(jax.random.key(0), ids, length)["params"])
    with pytest.raises(ValueError):
        transfer_encoder(deep, clf)
    with pytest.raises(FedprivError):
        ner_task.init_params(jax.random.key(1), deep)


# ---- tokenizer adapter and encodings ------------------------------------------------------------
def test_piece_vocab_accepts_protocol_mapping_and_list():
    tok = toy_tokenizer()
    v = PieceVocab(tok)
    assert v.word_ids("hypertension") == (v.index["hyper"], v.index["##tension"])
    assert v.word_ids("Hypertension") != v.word_ids("hypertension")
    assert PieceVocab(tok, lowercase=True).word_ids("Hypertension") == v.word_ids("hypertension")
    assert v.word_ids("é") == (v.unk,)
    assert (v.pad, v.unk, v.cls, v.sep, v.mask) == (0, 1, 2, 3, 4)
    assert set(v.pool.tolist()).isdisjoint(range(5)) and len(v.pool) == len(tok.tokens) - 5

    class MappingTok:  # a ``vocab`` mapping and ``tokenize``
        vocab = {t: i for i, t in enumerate(tok.tokens)}
        tokenize = staticmethod(tok.tokenize_word)

    assert PieceVocab(MappingTok()).word_ids("hypertension") == v.word_ids("hypertension")
    try:  # a plain vocab.txt token list goes through the project's WordPiece tokenizer
        import fedpriv.vocab.wordpiece  # noqa: F401
    except ImportError:
        pass
    else:
        assert PieceVocab(list(tok.tokens)).word_ids("hypertension") == v.word_ids("hypertension")
    with pytest.raises(FedprivError):
        PieceVocab(TinyWordPiece(["[PAD]", "a"]))


def test_mlm_encode_layout():
    task = MLMTask(toy_tokenizer(), max_len=8)
    v = task.vocab
    b = task.encode([TextExample("the patient has hypertension"), TaggedExample(("a", "disease"), ("O", "O")), TextExample("")])
    assert b["ids"].shape == (3, 8) and b["ids"].dtype == np.int32
    row = [v.cls, *[v.index[p] for p in ["the", "patient", "has", "hyper", "##tension"]], v.sep, v.pad]
    assert b["ids"][0].tolist() == row
    assert b["length"].tolist() == [7, 4, 2]
    assert b["ids"][1, :4].tolist() == [v.cls, v.index["a"], v.index["disease"], v.sep]
    long = task.encode([TextExample("the patient has hypertension and cancer")])
    assert long["ids"][0, -1] == v.sep and long["length"][0] == 8  # pieces cut to max_len - 2
    assert b["seed"].shape == (3, 2) and b["seed"].dtype == np.uint32
    np.testing.assert_array_equal(b["seed"][0], task.encode([TextExample("the patient has hypertension")])["seed"][0])
    assert not np.array_equal(b["seed"][0], b["seed"][2])


def test_bert_ner_label_alignment():
    tok = toy_tokenizer()
    ex = TaggedExample(("the", "patient", "has", "hypertension", "and", "breast", "cancer"), ("O", "O", "O", "B-Disease", "O", "B-Disease", "I-Disease"))
    task = BertNERTask.from_examples([ex], tok, max_len=16)
    assert task.tags == ("O", "B-Disease", "I-Disease")
    v = task.vocab
    b = task.encode([ex])
    ids, labels = b["ids"][0], b["labels"][0]
    pieces = ["[CLS]", "the", "patient", "has", "hyper", "##tension", "and", "breast", "cancer", "[SEP]"]
    assert ids[:10].tolist() == [v.index[p] for p in pieces]
    assert b["length"][0] == 10
    #                          CLS  the patient has hyper ##tension and breast cancer SEP
    assert labels[:10].tolist() == [IGNORE, 0, 0, 0, 1, IGNORE, 0, 1, 2, IGNORE]
    assert (labels[10:] == IGNORE).all()
    assert b["n_words"][0] == 7
    assert b["word_pos"][0, :7].tolist() == [1, 2, 3, 4, 6, 7, 8]
    assert b["word_tags"][0, :7].tolist() == [0, 0, 0, 1, 0, 1, 2]
    # words are kept whole: with max_len 6 only "the patient has" fit (hyper ##tension would not)
    short = BertNERTask(tok, task.tags, max_len=6).encode([ex])
    assert short["n_words"][0] == 3 and short["length"][0] == 5
    assert short["ids"][0].tolist() == [v.cls, v.index["the"], v.index["patient"], v.index["has"], v.sep, v.pad]
    assert short["gold_cut"][0] == 2  # both diseases are past the cut, and count as missed
    # "breast cancer" would be split after "breast" (7 pieces of room): the cut moves to its start
    split = BertNERTask(tok, task.tags, max_len=9).encode([ex])
    assert split["n_words"][0] == 5 and split["gold_cut"][0] == 1 and split["length"][0] == 8
    assert task.words_cut(ex) == 0 and BertNERTask(tok, task.tags, max_len=9).words_cut(ex) == 2
    with pytest.raises(FedprivError):
        task.encode([TaggedExample(("a",), ("B-Chemical",))])


# ---- per-example losses -------------------------------------------------------------------------
def _tasks():
    tok = toy_tokenizer()
    texts = ["the patient has hypertension", "breast cancer is a disease", "the disease and the patient", "a patient has breast cancer ."]
    tags = [("O", "O", "O", "B-D"), ("B-D", "I-D", "O", "O", "O"), ("O", "O", "O", "O", "O"), ("O", "O", "O", "B-D", "I-D", "O")]
    tagged = [TaggedExample(tuple(t.split()), g) for t, g in zip(texts, tags)]
    mlm = MLMTask(tok, max_len=16, model=MICRO, mask_prob=0.3, dropout=0.1)
    ner = BertNERTask.from_examples(tagged, tok, max_len=16, model=MICRO, dropout=0.1)
    other = TaggedExample(("cancer", "and", "hypertension"), ("B-D", "O", "B-D"))
    return [(mlm, [TextExample(t) for t in texts], TextExample("cancer and hypertension")), (ner, tagged, other)]


@pytest.mark.parametrize("which", [0, 1], ids=["mlm", "bert_ner"])
def test_losses_are_per_example(which):
    task, examples, other = _tasks()[which]
    params = micro_params(task.name.replace("bert_", ""))
    rng = jax.random.key(7)
    batch = task.encode(examples)
    losses = jax.jit(task.losses, static_argnums=3)
    base = np.asarray(losses(params, batch, rng, True))
    assert base.shape == (4,) and np.isfinite(base).all() and (base > 0).all()
    changed = task.encode([*examples[:2], other, examples[3]])
    out = np.asarray(losses(params, changed, rng, True))
    np.testing.assert_allclose(out[[0, 1, 3]], base[[0, 1, 3]], rtol=1e-5)
    assert out[2] != base[2]
    perm = [3, 1, 0, 2]  # row order does not matter
    out = np.asarray(losses(params, task.encode([examples[i] for i in perm]), rng, True))
    np.testing.assert_allclose(out, base[perm], rtol=1e-5)
    for i in range(4):  # single-example batches give the same values (the DP-SGD reference path)
        single = {k: v[i : i + 1] for k, v in batch.items()}
        np.testing.assert_allclose(losses(params, single, rng, True), base[i : i + 1], rtol=1e-5)
    # a new rng re-draws dropout (and the MLM masking)
    assert not np.allclose(losses(params, batch, jax.random.key(8), True), base)
    if isinstance(task, BertNERTask):  # no randomness at all without dropout
        np.testing.assert_array_equal(losses(params, batch, rng, False), losses(params, batch, jax.random.key(9), False))


@pytest.mark.slow
@pytest.mark.parametrize("which", [0, 1], ids=["mlm", "bert_ner"])
def test_fast_clipping_matches_reference(which):
    """The fast (ghost) clipping path covers the whole model and agrees with the vmap reference,
    with dropout on (per-example dropout keys make both paths draw the same masks)."""
    from fedpriv.privacy import clipping
    task, examples, _ = _tasks()[which]
    params = micro_params(task.name.replace("bert_", ""))
    batch = {k: jnp.asarray(v) for k, v in task.encode(examples).items()}
    rng = jax.random.key(3)
    ok, why = clipping.supports_fast(task, params, batch, rng)
    assert ok, why
    fast = jax.jit(lambda p, b: clipping.fast_clipped_sum(task, p, b, rng, 0.5))(params, batch)
    ref = jax.jit(lambda p, b: clipping.reference_clipped_sum(task, p, b, rng, 0.5))(params, batch)
    np.testing.assert_allclose(fast[1], ref[1], rtol=1e-4)
    for a, b in zip(jax.tree.leaves(fast[0]), jax.tree.leaves(ref[0])):
        np.testing.assert_allclose(a, b, atol=1e-5)


# ---- masking ------------------------------------------------------------------------------------
def test_mlm_masking_statistics():
    tok = toy_tokenizer()
    task = MLMTask(tok, max_len=64)
    v = task.vocab
    rng = np.random.default_rng(0)
    words = ["the", "patient", "has", "hypertension", "and", "breast", "cancer", "is", "a", "disease", ".", "xyz"]
    examples = [TextExample(" ".join(rng.choice(words, size=rng.integers(0, 40)))) for _ in range(3000)]
    batch = task.encode(examples)
    mask_batch = jax.jit(task.mask_batch)  # one program for the three maskings below (same shapes)
    m = mask_batch(jax.random.key(0), batch)
    m = {k: np.asarray(x) for k, x in m.items()}
    ids, length = batch["ids"], batch["length"]
    n_cand = length - 2  # every piece of these words is ordinary (no [UNK])
    k = np.where(n_cand > 0, np.clip(np.round(0.15 * n_cand), 1, task.max_predictions), 0)
    sel = m["kind"] != NOT_SELECTED
    np.testing.assert_array_equal(sel.sum(1), k)  # BERT's count: max(1, round(15% of the candidates))
    frac = sel.sum() / n_cand.sum()
    assert abs(frac - 0.15) < 0.005, frac  # rounding per example; long rows dominate
    rows, slots = np.nonzero(sel)
    pos = m["positions"][rows, slots]
    assert (pos >= 1).all() and (pos <= length[rows] - 2).all()  # never [CLS], [SEP] or padding
    assert len(set(zip(rows.tolist(), pos.tolist()))) == len(rows)  # distinct positions
    np.testing.assert_array_equal(m["targets"][rows, slots], ids[rows, pos])
    kinds = m["kind"][sel]
    total = len(kinds)
    assert total > 8000
    for kind, p in [(MASKED, 0.8), (RANDOM, 0.1), (KEPT, 0.1)]:  # +-4 standard deviations
        assert abs(np.mean(kinds == kind) - p) < 4 * np.sqrt(p * (1 - p) / total)
    new = m["inputs"][rows, pos]
    np.testing.assert_array_equal(new[kinds == MASKED], v.mask)
    np.testing.assert_array_equal(new[kinds == KEPT], ids[rows, pos][kinds == KEPT])
    assert np.isin(new[kinds == RANDOM], v.pool).all()
    assert np.mean(new[kinds == RANDOM] != ids[rows, pos][kinds == RANDOM]) > 0.9
    untouched = np.ones_like(ids, bool)
    untouched[rows, pos] = False
    np.testing.assert_array_equal(m["inputs"][untouched], ids[untouched])  # specials, padding, the rest
    # deterministic given the rng; a new rng re-masks
    again = mask_batch(jax.random.key(0), batch)
    np.testing.assert_array_equal(np.asarray(again["inputs"]), m["inputs"])
    assert not np.array_equal(np.asarray(mask_batch(jax.random.key(1), batch)["inputs"]), m["inputs"])


def test_mlm_never_selects_special_pieces():
    tok = TinyWordPiece(RESERVED + ["a", "b", "[unused0]"])
    task = MLMTask(tok, max_len=12, mask_prob=0.5)
    v = task.vocab
    batch = task.encode([TextExample("a [unused0] b b a é")] * 200)  # é -> [UNK], which may be masked
    batch["ids"][:, 4] = v.mask  # as if the text held [MASK]
    batch["seed"] = np.arange(200, dtype=np.int32)  # identical rows would share one masking
    assert batch["ids"][0, :8].tolist() == [v.cls, 5, 7, 6, 4, 5, v.unk, v.sep]
    m = jax.jit(task.mask_batch)(jax.random.key(0), batch)
    sel = np.asarray(m["kind"]) != NOT_SELECTED
    pos = np.asarray(m["positions"])[sel]
    assert set(pos.tolist()) == {1, 3, 5, 6}  # never [unused0] (2) or [MASK] (4)
    assert (sel.sum(1) == 2).all()  # round(0.5 * 4)
    kind, positions, inputs = (np.asarray(m[k]) for k in ("kind", "positions", "inputs"))
    rows, slots = np.nonzero(kind == RANDOM)
    assert len(rows) > 10
    assert not np.isin(inputs[rows, positions[rows, slots]], v.special).any()  # random pieces are ordinary


def test_mlm_metric_sums_use_a_fixed_masking():
    task = MLMTask(toy_tokenizer(), max_len=16, model=MICRO)
    params = micro_params("mlm")
    texts = ["the patient has hypertension and breast cancer", "a patient has breast cancer", "the disease is cancer", "a disease"]
    batch = task.encode([TextExample(t) for t in texts] + [TextExample("the disease")] * 2)
    batch["mask"][4:] = 0.0
    sums = jax.jit(task.metric_sums)
    a = {k: float(x) for k, x in sums(params, batch).items()}
    b = {k: float(x) for k, x in sums(params, batch).items()}
    assert a == b  # the same masking at every evaluation
    assert a["predictions"] == 1 + 1 + 1 + 1  # round(0.15 * n) = 1 for n = 8, 5, 4 pieces; max(1, .) for 2
    assert a["examples"] == 4
    other = dict(batch, ids=batch["ids"].copy())
    other["ids"][4:] = batch["ids"][0]  # masked rows add nothing, whatever they hold
    assert {k: float(x) for k, x in sums(params, other).items()} == a
    s = task.summarize(a)
    assert s["loss"] == pytest.approx(a["loss_sum"] / 4) and 0 <= s["accuracy"] <= 1


# ---- training on real text ----------------------------------------------------------------------
def _adam_steps(task, params, batches, steps, lr):
    tx = optax.adam(lr)

    @jax.jit
    def step(params, opt, batch, i):
        loss, g = jax.value_and_grad(task.mean_loss)(params, batch, jax.random.fold_in(jax.random.key(42), i))
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt, loss

    opt = tx.init(params)
    for i in range(steps):
        params, opt, _ = step(params, opt, batches[i % len(batches)], i)
    return params


def _batches(task, examples, size):
    return [task.encode(examples[i : i + size]) for i in range(0, len(examples) - size + 1, size)]


@lru_cache(maxsize=1)
def pretrained_mlm():
    """The tiny preset pretrained with MLM on NCBI-disease training sentences (300 Adam steps)."""
    tok = ncbi_tokenizer()
    task = MLMTask(tok, max_len=48, model="tiny", lowercase=True)
    sents = ncbi_sentences()
    texts = [TextExample(" ".join(s.tokens)) for s in sents[:2000]]
    held_out = task.encode([TextExample(" ".join(s.tokens)) for s in sents[-200:]])
    params0 = task.init_params(jax.random.key(0))
    params = _adam_steps(task, params0, _batches(task, texts, 32), 300, 2e-3)
    evaluate = jax.jit(task.metric_sums)
    before = task.summarize(add_sums({}, evaluate(params0, held_out)))
    after = task.summarize(add_sums({}, evaluate(params, held_out)))
    return tok, task, params, before, after


@pytest.mark.slow
def test_mlm_loss_falls_on_ncbi_text():
    tok, task, params, before, after = pretrained_mlm()
    assert before["loss"] > 6.0  # ~ log(vocab) at initialization
    assert after["loss"] < before["loss"] - 0.8, (before, after)
    # below the best context-free guess: the add-one unigram distribution of the training pieces
    train = task.encode([TextExample(" ".join(s.tokens)) for s in ncbi_sentences()[:2000]])
    counts = np.bincount(train["ids"][train["ids"] >= len(RESERVED)], minlength=len(task.vocab)) + 1.0
    held_out = task.encode([TextExample(" ".join(s.tokens)) for s in ncbi_sentences()[-200:]])
    m = jax.jit(task.mask_batch)(jax.random.key(task.eval_seed), held_out)  # the evaluation's masking (jitted, as the evaluation runs it)
    targets = np.asarray(m["targets"])[np.asarray(m["weights"]) > 0]
    unigram = -np.mean(np.log(counts / counts.sum())[targets])
    assert after["loss"] < unigram < before["loss"], (unigram, after)
    assert after["accuracy"] > 0.04
    assert before["predictions"] == after["predictions"] == len(targets) > 200


@pytest.mark.slow
def test_ner_fine_tuning_from_the_pretrained_encoder():
    tok, mlm_task, mlm_params, _, _ = pretrained_mlm()
    sents = ncbi_sentences()
    train = list(sents[:2000])
    task = BertNERTask.from_examples(train, tok, max_len=48, lowercase=True)
    assert task.cfg == mlm_task.cfg
    params0 = task.init_params(jax.random.key(1), mlm_params)
    for a, b in zip(jax.tree.leaves(params0["encoder"]), jax.tree.leaves(mlm_params["encoder"])):
        np.testing.assert_array_equal(a, b)
    fresh = task.init_params(jax.random.key(1))
    np.testing.assert_array_equal(params0["classifier"]["kernel"], fresh["classifier"]["kernel"])
    held_out = task.encode(sents[-200:])
    evaluate = jax.jit(task.metric_sums)
    before = task.summarize(add_sums({}, evaluate(params0, held_out)))
    params = _adam_steps(task, params0, _batches(task, train, 32), 300, 2e-3)
    after = task.summarize(add_sums({}, evaluate(params, held_out)))
    assert after["loss"] < before["loss"] - 0.5, (before, after)
    assert after["accuracy"] > 0.92  # above all-O (0.916 of the held-out words)
    assert after["f1"] > 0.1, after  # ~0.2 after 300 steps; a proper run trains far longer
    assert after["entities_gold"] == before["entities_gold"] > 50
    assert 0.0 <= after["f1"] <= 1.0
    pred = task.predict(params, {k: v[:4] for k, v in held_out.items()})
    tags = task.decode_tags(np.asarray(pred), held_out["n_words"][:4])
    assert [len(t) for t in tags] == held_out["n_words"][:4].tolist()
    with pytest.raises(FedprivError):  # a differently shaped encoder is refused
        BertNERTask(tok, task.tags, max_len=48, model="small").init_params(jax.random.key(0), mlm_params)
