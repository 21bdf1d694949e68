"""NWP LSTM and task: shapes, the per-example property, padding, metrics, the LSTM layer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedpriv.data.examples import TextExample
from fedpriv.data.shakespeare import load_shakespeare
from fedpriv.models.layers import LSTM, reverse_padded
from fedpriv.models.nwp import PRESETS
from fedpriv.tasks.base import add_sums, pad_batch
from fedpriv.tasks.nwp import NWPTask, unigram_perplexity
from fedpriv.vocab.word import WordVocab


@pytest.fixture(scope="module")
def task():
    texts = [e.text for e in load_shakespeare().records()]
    return NWPTask(WordVocab.build(texts, 500), seq_len=12, model="tiny")


def test_stackoverflow_preset_shape():
    c = PRESETS["stackoverflow"]
    assert (c.vocab_size, c.embed_dim, c.lstm_units, c.projection_dim) == (10_004, 96, 670, 96)
    t = NWPTask(WordVocab([f"w{i}" for i in range(10_000)]), 20, "stackoverflow")
    params = t.init_params(jax.random.key(0))
    n = sum(x.size for x in jax.tree.leaves(params))
    # embedding 10004*96 + LSTM 4*670*(96+670+1) + projection 670*96+96 + output 96*10004+10004
    assert n == 10004 * 96 + 4 * 670 * (96 + 670 + 1) + 670 * 96 + 96 + 96 * 10004 + 10004


def test_tied_embeddings_share_the_input_matrix():
    t = NWPTask(WordVocab(["a", "b"]), 5, PRESETS["tiny"].__class__(embed_dim=8, lstm_units=8, projection_dim=8, tie_embeddings=True))
    params = t.init_params(jax.random.key(0))
    assert "output" not in params and params["output_bias"].shape == (6,)


def test_per_example_loss_depends_only_on_that_example(task):
    params = task.init_params(jax.random.key(1))
    exs = [TextExample(t) for t in ["to be or not to be", "what light", "a b c d e f g h i j k l m n"]]
    batch = task.encode(exs)
    per_example = jax.jit(task.losses, static_argnums=3)  # one program per batch size, not op by op
    losses = per_example(params, batch, jax.random.key(0), True)
    for i, ex in enumerate(exs):
        alone = per_example(params, task.encode([ex]), jax.random.key(0), True)
        assert float(alone[0]) == pytest.approx(float(losses[i]), rel=1e-5)
    changed = task.encode([exs[0], TextExample("something else entirely"), exs[2]])
    again = per_example(params, changed, jax.random.key(0), True)
    assert float(again[0]) == pytest.approx(float(losses[0]), rel=1e-6)
    assert float(again[2]) == pytest.approx(float(losses[2]), rel=1e-6)


def test_padding_rows_do_not_change_metrics(task):
    params = task.init_params(jax.random.key(1))
    batch = task.encode([TextExample("to be or not"), TextExample("the king")])
    padded = pad_batch(batch, 7)
    a = task.summarize(add_sums({}, task.metric_sums(params, batch)))
    b = task.summarize(add_sums({}, task.metric_sums(params, padded)))
    assert a == pytest.approx(b)
    assert a["tokens"] == 4 + 1 + 2 + 1  # words + eos per example
    assert float(task.mean_loss(params, batch, jax.random.key(0))) == pytest.approx(float(task.mean_loss(params, padded, jax.random.key(0))), rel=1e-6)


def test_accuracy_variants_exclude_oov_and_eos(task):
    v = task.vocab
    ids = np.array([[v.bos, 5, v.oov, v.eos, 0]], dtype=np.int32)
    batch = {"ids": ids, "mask": np.ones(1, np.float32)}

    class Oracle(NWPTask):
        def logits(self, params, ids_):  # predicts every target exactly
            return jax.nn.one_hot(ids_[:, 1:], len(v)) * 10.0

    o = Oracle(v, 4, "tiny")
    s = add_sums({}, o.metric_sums(None, batch))
    assert (s["tokens"], s["tokens_no_oov"], s["tokens_no_oov_eos"]) == (3, 2, 1)
    assert o.summarize(s)["accuracy"] == 1.0


def test_lstm_reverse_respects_lengths():
    x = jnp.arange(2 * 5 * 1, dtype=jnp.float32).reshape(2, 5, 1)
    lengths = jnp.array([3, 5])
    r = reverse_padded(x, lengths)
    assert r[0, :, 0].tolist() == [2.0, 1.0, 0.0, 3.0, 4.0]
    assert r[1, :, 0].tolist() == [9.0, 8.0, 7.0, 6.0, 5.0]
    layer = LSTM(4, reverse=True)
    p = layer.init(jax.random.key(0), x, lengths)
    out = layer.apply(p, x, lengths)
    # The first sequence's output at its real steps does not depend on what its padding holds.
    x2 = x.at[0, 3:].set(100.0)
    out2 = layer.apply(p, x2, lengths)
    assert jnp.allclose(out[0, :3], out2[0, :3]) and jnp.all(out2[0, 3:] == 0)


def test_unigram_perplexity_closed_form():
    train = np.array([[9, 1, 1, 2, 0]])  # targets 1, 1, 2 (pad 0 dropped)
    test = np.array([[9, 1, 2, 0, 0]])
    # add-one over ids 1..3 (pad excluded): p(1) = 3/6, p(2) = 2/6
    expected = np.exp(-(np.log(3 / 6) + np.log(2 / 6)) / 2)
    assert unigram_perplexity(train, test, 4) == pytest.approx(expected)
