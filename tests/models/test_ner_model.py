"""NER task and BiLSTM tagger: encoding, the per-example property, padding, metrics, learning on WNUT-17."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedpriv.data.conll import iter_sentences
from fedpriv.data.examples import TaggedExample, TextExample
from fedpriv.errors import DataFormatError, FedprivError
from fedpriv.models.crf import crf_log_likelihood
from fedpriv.models.ner import (
    CASE_HASHTAG,
    CASE_LOWER,
    CASE_MENTION,
    CASE_MIXED,
    CASE_NUMERIC,
    CASE_OTHER,
    CASE_TITLE,
    CASE_UPPER,
    CASE_URL,
    case_class,
)
from fedpriv.tasks.base import add_sums, pad_batch
from fedpriv.tasks.ner import NERTask, TokenVocab, normalize_token
from fedpriv.tasks.ner_metrics import entity_counts, entity_counts_ids


@pytest.fixture(scope="module")
def wnut(wnut_train):
    return [s for _, s in iter_sentences(wnut_train)]


@pytest.fixture(scope="module")
def ncbi(ncbi_train):
    return [s for _, s in iter_sentences(ncbi_train)]


def small_task(examples, head, **kw):
    opts = dict(embed_dim=16, hidden=12, case_dim=4, dropout=0.0, head=head, max_len=24)
    return NERTask.from_examples(examples, **{**opts, **kw})


EXS = [
    TaggedExample(("Alice", "lives", "in", "New", "York"), ("B-person", "O", "O", "B-location", "I-location")),
    TaggedExample(("@bob", "likes", "iPhone", "7"), ("O", "O", "B-product", "I-product")),
    TaggedExample(("ok",), ("O",)),
]


def test_case_classes():
    cases = {
        "hello": CASE_LOWER, "Hello": CASE_TITLE, "I": CASE_TITLE, "NASA": CASE_UPPER, "iPhone": CASE_MIXED,
        "McDonald": CASE_MIXED, "2017": CASE_NUMERIC, "3.5": CASE_NUMERIC, "...": CASE_OTHER, "@user": CASE_MENTION,
        "#tag": CASE_HASHTAG, "https://t.co/x": CASE_URL, "www.x.org": CASE_URL, "@": CASE_OTHER, "don't": CASE_LOWER,
    }
    assert {t: case_class(t) for t in cases} == cases


def test_vocab_and_tag_set_from_training_examples():
    task = NERTask.from_examples(EXS + [TaggedExample(("NEW", "in", "2019"), ("O", "O", "O"))], vocab_size=4)
    # normalized counts: in 2, new 2, then 0, 0000, @bob, alice, ... 1 each (ties alphabetical)
    assert task.vocab.words == ("in", "new", "0", "0000")
    assert len(task.vocab) == 6 and task.vocab.id("New") == 3 and task.vocab.id("1999") == 5 and task.vocab.id("8") == 4
    assert task.vocab.id("zebra") == TokenVocab.UNK and normalize_token("iPhone7") == "iphone0"
    assert task.tags == ("O", "B-location", "B-person", "B-product", "I-location", "I-product")
    assert task.hyper["max_len"] == 128
    fixed = NERTask.from_examples(EXS, tags=["B-person", "I-person", "O", "B-location", "I-location", "B-product", "I-product"])
    assert fixed.tags[0] == "O" and len(fixed.tags) == 7


def test_encode_shapes_masks_and_truncation():
    task = small_task(EXS, "softmax", max_len=4)
    b = task.encode(EXS)
    assert {k: (v.dtype, v.shape) for k, v in b.items()} == {
        "tokens": (np.int32, (3, 4)), "case": (np.int32, (3, 4)), "tags": (np.int32, (3, 4)),
        "length": (np.int32, (3,)), "gold_cut": (np.float32, (3,)), "mask": (np.float32, (3,)),
    }
    # "New York" would be split at 4 tokens: the cut moves to its start and the entity counts as missed
    assert b["length"].tolist() == [3, 4, 1] and b["mask"].tolist() == [1, 1, 1] and b["gold_cut"].tolist() == [1, 0, 0]
    assert b["tokens"][2].tolist()[1:] == [0, 0, 0] and b["case"][2].tolist() == [CASE_LOWER, 0, 0, 0]
    assert b["tags"][0].tolist() == [task.tags.index(t) for t in ("B-person", "O", "O")] + [0]  # cut at 3, before "New York"
    assert b["tags"][2].tolist() == [0, 0, 0, 0] and task.tags[0] == "O"
    assert b["case"][1].tolist() == [CASE_MENTION, CASE_LOWER, CASE_MIXED, CASE_NUMERIC]
    assert task.words_cut(EXS[0]) == 2 and task.words_cut(EXS[1]) == 0


@pytest.mark.parametrize("max_len", [3, 8, 24])
def test_entity_scores_count_every_gold_entity_whatever_the_cut(wnut, max_len):
    """Recall is over every gold entity of the evaluation data: a gold entity past the length limit
    counts as missed, so a shorter max_len cannot raise F1 by scoring fewer entities."""
    task = small_task(wnut[:200], "softmax", max_len=max_len)
    params = task.init_params(jax.random.key(0))
    b = task.encode(wnut[:200])
    summary = task.summarize(add_sums({}, jax.jit(task.metric_sums)(params, b)))
    gold = entity_counts([s.tags for s in wnut[:200]], [s.tags for s in wnut[:200]])[2]
    assert summary["entities_gold"] == gold
    if max_len == 3:  # the test exercises the cut: entities past it exist and are counted
        assert b["gold_cut"].sum() > 0 and summary["entities_correct"] < gold


def test_encode_refuses_unknown_tags_and_text_examples():
    task = small_task(EXS, "softmax")
    with pytest.raises(FedprivError, match="B-event"):
        task.encode([TaggedExample(("x",), ("B-event",))])
    with pytest.raises(FedprivError):
        task.encode([TextExample("a b")])
    with pytest.raises(FedprivError):
        small_task(EXS, "bogus")


def test_default_max_len_covers_wnut17_and_ncbi_disease(wnut_train, ncbi_train):
    longest = {}
    for path in [*wnut_train.parent.glob("*.conll"), *wnut_train.parent.glob("*.annotated"), *ncbi_train.parent.glob("*.tsv")]:
        longest[path.name] = max(len(s.tokens) for _, s in iter_sentences(path))
    assert longest == {
        "wnut17train.conll": 41, "emerging.dev.conll": 82, "emerging.test.annotated": 105,
        "train.tsv": 123, "devel.tsv": 86, "test.tsv": 106,
    }
    assert max(longest.values()) <= NERTask.from_examples(EXS).max_len


def test_ncbi_disease_encodes(ncbi):
    task = NERTask.from_examples(ncbi)
    assert task.tags == ("O", "B-Disease", "I-Disease")
    b = task.encode(ncbi)
    assert b["length"].tolist() == [len(s.tokens) for s in ncbi]  # nothing truncated at 128
    for i in (0, 17, len(ncbi) - 1):
        n = len(ncbi[i].tokens)
        assert [task.tags[t] for t in b["tags"][i, :n]] == list(ncbi[i].tags)
        assert (b["tokens"][i, n:] == 0).all() and (b["case"][i, n:] == 0).all() and (b["tokens"][i, :n] > 1).all()
    # gold entities counted on device from the encoding = conlleval count on the raw tags
    _, _, n_gold = jax.jit(lambda g, n: entity_counts_ids(g, g, n, task.tables))(b["tags"], b["length"])
    assert int(n_gold.sum()) == entity_counts([s.tags for s in ncbi], [s.tags for s in ncbi])[2] == 5134


class Setup:
    """A small task on 80 WNUT-17 sentences (max_len 24) with random non-zero parameters, and its
    functions jitted once (batches of 4 rows everywhere, so each compiles once)."""

    def __init__(self, wnut, head):
        self.task = task = small_task(wnut[:80], head)
        params = jax.jit(task.init_params)(jax.random.key(1))
        keys = iter(jax.random.split(jax.random.key(2), 100))
        self.params = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(next(keys), x.shape), params)
        self.losses = jax.jit(task.losses, static_argnums=3)
        self.emissions = jax.jit(task.emissions)
        self.metric_sums = jax.jit(task.metric_sums)
        self.predict = jax.jit(task.predict)
        self.short = [s for s in wnut if len(s.tokens) <= 20][:8]  # not truncated at 24

    def sums(self, batch):
        return add_sums({}, self.metric_sums(self.params, batch))


@pytest.fixture(scope="module", params=["softmax", "crf"])
def setup(request, wnut):
    return Setup(wnut, request.param)


def test_per_example_losses(setup, wnut):
    task, params = setup.task, setup.params
    exs = setup.short[:4]
    rng = jax.random.key(0)
    losses = setup.losses(params, task.encode(exs), rng, True)
    assert losses.shape == (4,) and bool(jnp.all(losses > 0))
    for i, ex in enumerate(exs):
        alone = setup.losses(params, task.encode([ex]), rng, True)  # a batch of one
        assert float(alone[0]) == pytest.approx(float(losses[i]), rel=1e-5)
    changed = setup.losses(params, task.encode([exs[0], wnut[30], exs[2], wnut[31]]), rng, True)
    assert float(changed[0]) == pytest.approx(float(losses[0]), rel=1e-6)
    assert float(changed[2]) == pytest.approx(float(losses[2]), rel=1e-6)


@pytest.mark.slow
def test_per_example_gradients_by_vmap(wnut):
    """vmap over single examples gives per-example gradients that sum to the batch gradient."""
    setup = Setup(wnut, "crf")
    task, params, rng = setup.task, setup.params, jax.random.key(0)
    batch = {k: jnp.asarray(v) for k, v in task.encode(setup.short[:4]).items()}
    one = lambda p, ex: task.losses(p, jax.tree.map(lambda a: a[None], ex), rng, False)[0]
    per = jax.jit(jax.vmap(jax.grad(one), in_axes=(None, 0)))(params, batch)
    total = jax.jit(jax.grad(lambda p: jnp.sum(task.losses(p, batch, rng, False))))(params)
    for a, b in zip(jax.tree.leaves(jax.tree.map(lambda x: x.sum(0), per)), jax.tree.leaves(total)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_loss_definitions(setup):
    task, params = setup.task, setup.params
    batch = task.encode(setup.short[:4])
    em = setup.emissions(params, batch)
    losses = setup.losses(params, batch, None, False)
    em = np.asarray(em, np.float64)
    for i in range(4):
        n, tags = int(batch["length"][i]), batch["tags"][i]
        if task.head == "crf":  # sentence NLL / length
            ll = jax.jit(crf_log_likelihood)(em[i], tags, n, params["transitions"], params["start"], params["end"])
            expected = -float(ll) / n
        else:  # mean token cross-entropy
            z = em[i, :n] - em[i, :n].max(axis=1, keepdims=True)
            logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
            expected = -logp[np.arange(n), tags[:n]].mean()
        assert float(losses[i]) == pytest.approx(expected, rel=1e-5)


def test_padding_invariance(setup):
    task, params = setup.task, setup.params
    batch = task.encode(setup.short[:4])
    em = setup.emissions(params, batch)
    # junk in the padding positions reaches no real position (forward nor backward direction)
    pad = np.arange(task.max_len)[None, :] >= batch["length"][:, None]
    junk = {**batch, "tokens": np.where(pad, 5, batch["tokens"]).astype(np.int32),
            "case": np.where(pad, 3, batch["case"]).astype(np.int32), "tags": np.where(pad, 2, batch["tags"]).astype(np.int32)}
    em2 = setup.emissions(params, junk)
    np.testing.assert_allclose(np.asarray(em)[~pad], np.asarray(em2)[~pad], rtol=1e-6, atol=1e-6)
    base = setup.losses(params, batch, None, False)
    np.testing.assert_allclose(setup.losses(params, junk, None, False), base, rtol=1e-6)
    # more padding (a longer max_len, same parameter shapes) gives the same losses
    longer = NERTask.from_json({**task.to_json(), "hyper": {**task.hyper, "max_len": 40}})
    np.testing.assert_allclose(jax.jit(longer.losses, static_argnums=3)(params, longer.encode(setup.short[:4]), None, False), base, rtol=1e-5)
    # masked padding rows change no sum, and sums add up over batches
    whole = setup.sums(batch)
    halves = [setup.sums(pad_batch(task.encode(setup.short[i : i + 2]), 4)) for i in (0, 2)]
    for k in whole:
        np.testing.assert_allclose(whole[k], halves[0][k] + halves[1][k], rtol=1e-5, err_msg=k)
    assert whole["tokens"] == sum(len(s.tokens) for s in setup.short[:4]) and whole["examples"] == 4


def test_metric_sums_match_host_scoring(setup, wnut):
    task, params = setup.task, setup.params
    total: dict = {}
    gold_tags, pred_tags = [], []
    for i in range(0, 80, 4):
        batch = task.encode(wnut[i : i + 4])
        add_sums(total, setup.metric_sums(params, batch))
        pred_tags += task.decode_tags(np.asarray(setup.predict(params, batch)), batch["length"])
        gold_tags += [list(s.tags[:24]) for s in wnut[i : i + 4]]
    assert (total["tp"], total["n_pred"], total["n_gold"]) == entity_counts(gold_tags, pred_tags)
    assert total["n_pred"] > 0 and total["n_gold"] > 0
    assert total["correct"] == sum(g == p for gs, ps in zip(gold_tags, pred_tags) for g, p in zip(gs, ps))
    m = task.summarize(total)
    assert set(m) >= {"loss", "accuracy", "precision", "recall", "f1"}
    assert m["loss"] == pytest.approx(total["loss_sum"] / total["tokens"])
    if task.head == "crf":  # constrained Viterbi never emits I-X after O or after another type
        for seq in pred_tags:
            for prev, t in zip(["O", *seq], seq):
                assert not t.startswith("I-") or prev[2:] == t[2:], seq


def test_save_and_load_roundtrip(tmp_path, wnut):
    task = small_task(wnut[:100], "crf", vocab_size=300)
    path = tmp_path / "task.json"
    task.save(path)
    obj = json.loads(path.read_text())
    assert obj["format"] == "fedpriv-ner-task" and obj["tags"][0] == "O" and len(obj["words"]) == 300
    again = NERTask.load(path)
    assert again.tags == task.tags and again.vocab.words == task.vocab.words and again.hyper == task.hyper
    b1, b2 = task.encode(wnut[100:110]), again.encode(wnut[100:110])
    assert all((b1[k] == b2[k]).all() for k in b1)
    shapes = lambda t: jax.tree.map(lambda x: x.shape, jax.eval_shape(t.init_params, jax.random.key(0)))
    assert shapes(again) == shapes(task)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DataFormatError):
        NERTask.load(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"format": "fedpriv-word-vocab", "words": []}')
    with pytest.raises(DataFormatError):
        NERTask.load(tmp_path / "other.json")


def _train(task, batch, steps, seed=0, lr=1e-2, bs=32):
    opt = optax.adam(lr)
    params = task.init_params(jax.random.key(seed))
    state = opt.init(params)

    @jax.jit
    def step(params, state, b, rng):
        loss, g = jax.value_and_grad(task.mean_loss)(params, b, rng, True)
        updates, state = opt.update(g, state, params)
        return optax.apply_updates(params, updates), state, loss

    r = np.random.default_rng(seed)
    n = len(batch["mask"])
    for i in range(steps):
        idx = r.choice(n, bs, replace=False)
        params, state, _ = step(params, state, {k: v[idx] for k, v in batch.items()}, jax.random.key(i))
    return params


@pytest.mark.slow
@pytest.mark.parametrize("head", ["softmax", "crf"])
def test_learns_wnut17(wnut, head):
    train = wnut[:500]
    task = NERTask.from_examples(train, embed_dim=48, hidden=48, case_dim=8, dropout=0.1, head=head, max_len=48)
    batch = task.encode(train)
    sums = jax.jit(task.metric_sums)
    before = task.summarize(add_sums({}, sums(task.init_params(jax.random.key(0)), batch)))
    params = _train(task, batch, steps=200)
    after = task.summarize(add_sums({}, sums(params, batch)))
    assert after["loss"] < before["loss"] / 10
    assert after["entities_gold"] == before["entities_gold"] > 200
    assert after["f1"] > 0.3 and after["precision"] > 0 and after["recall"] > 0


@pytest.mark.parametrize("setup", ["softmax"], indirect=True)  # the input path is the same for both heads
def test_word_dropout_replaces_real_tokens_by_unk(setup, wnut):
    task = NERTask.from_json({**setup.task.to_json(), "hyper": {**setup.task.hyper, "word_dropout": 0.999999}})
    batch = task.encode(setup.short[:4])
    noisy = jax.jit(task.emissions, static_argnums=3)(setup.params, batch, jax.random.key(1), True)
    real = np.arange(task.max_len)[None, :] < batch["length"][:, None]
    all_unk = {**batch, "tokens": np.where(real, TokenVocab.UNK, 0).astype(np.int32)}
    np.testing.assert_allclose(noisy, setup.emissions(setup.params, all_unk), rtol=1e-6, atol=1e-6)
    with pytest.raises(FedprivError):
        small_task(wnut[:10], "softmax", word_dropout=1.0)


def test_character_features_are_per_example_and_ignore_padding(wnut_train):
    from fedpriv.models.ner import char_ids

    sents = [s for _, s in iter_sentences(wnut_train)][:6]
    task = NERTask.from_examples(sents, dropout=0.0, embed_dim=8, hidden=6, max_len=48, char_dim=5, char_filters=7, char_width=10)
    batch = task.encode(sents)
    assert batch["chars"].shape == (6, 48, 10)
    tok = sents[0].tokens[0]
    assert batch["chars"][0, 0, : min(10, len(tok))].tolist() == char_ids(tok, 10) and char_ids("a", 3) == [1 + ord("a") % 255]
    params = task.init_params(jax.random.key(0))
    per_example = jax.jit(task.losses, static_argnums=3)  # one program per batch size, not op by op
    losses = per_example(params, batch, jax.random.key(1), False)
    for i in (0, 3):
        alone = per_example(params, task.encode([sents[i]]), jax.random.key(1), False)
        assert float(alone[0]) == pytest.approx(float(losses[i]), rel=1e-5)
    assert "char_embed" in params and "char_conv" in params
