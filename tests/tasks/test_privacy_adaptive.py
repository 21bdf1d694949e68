"""Privacy-adaptive BERT (Qu et al. 2021): user-side M_txt of the BERT tasks' input pieces in a
frozen token embedding, the three masked-LM targets (vanilla, prob, denoising), privacy-constrained
NER fine-tuning, and the run store's record of it."""

from __future__ import annotations

import json
from collections import Counter
from itertools import islice

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import serialization

from fedpriv.config import validate_config
from fedpriv.data.conll import iter_sentences
from fedpriv.data.corpus import FederatedCorpus
from fedpriv.errors import ConfigError, FedprivError, PrivacyParameterError
from fedpriv.privacy.clipping import supports_fast
from fedpriv.privacy.local.mechanisms import TokenIndex, privatize_streams, privatize_tokens, privatize_tokens_jit
from fedpriv.privacy.streams import LOCAL_INPUTS, stream_key
from fedpriv.tasks.bert_ner import BertNERTask
from fedpriv.tasks.local_inputs import SET_STREAM, LocalInputs
from fedpriv.tasks.mlm import MLMTask, example_keys
from fedpriv.tasks.registry import build_task
from fedpriv.vocab.wordpiece import learn_wordpiece

NCBI = "tests/data/ncbi-disease/train.tsv"
SENTENCES = [s for _, s in islice(iter_sentences(NCBI), 120)]


@pytest.fixture(scope="module")
def tok():
    return learn_wordpiece(Counter(w.lower() for s in SENTENCES for w in s.tokens), 300)


@pytest.fixture(scope="module")
def pretrained(tok):
    """MLM parameters with the token table scaled to std 1 per coordinate: M_txt at eta 3 changes
    about 60% of the pieces, at eta 8 almost none (measured on this table)."""
    params = MLMTask(tok, max_len=32, lowercase=True).init_params(jax.random.key(0))
    table = params["encoder"]["token_embed"]["embedding"]
    return {**params, "encoder": {**params["encoder"], "token_embed": {"embedding": table * 50.0}}}


def batch_of(task, n=8):
    return {k: jnp.asarray(v) for k, v in task.encode(SENTENCES[:n]).items()}


# ---- the mechanism inside a traced computation -----------------------------------------------------
@pytest.mark.parametrize("eta", [0.5, 5.0, 50.0])
def test_jitted_m_txt_draws_exactly_what_the_host_m_txt_draws(eta):
    rng = np.random.default_rng(1)
    table = rng.normal(size=(400, 12)).astype(np.float32)
    allowed = np.arange(7, 400, dtype=np.int32)
    ids = rng.integers(0, 400, 2500)
    key = jax.random.key(3)
    host = privatize_tokens(key, ids, TokenIndex(table, allowed), eta)
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(ids.size, dtype=jnp.uint32))
    traced = jax.jit(lambda k, i: privatize_tokens_jit(k, i, jnp.asarray(table), jnp.asarray(allowed), eta))(keys, jnp.asarray(ids))
    np.testing.assert_array_equal(np.asarray(traced), host)
    assert set(np.unique(host)) <= set(allowed)
    changed = np.mean(host != ids)
    assert (changed > 0.9) if eta == 0.5 else (changed < 0.2) if eta == 50.0 else (0.2 < changed < 0.99)


def test_fixed_draws_are_one_release_per_example_and_match_the_host_streams(tok, pretrained):
    task = BertNERTask.from_examples(SENTENCES, tok, max_len=32, lowercase=True, pretrained=pretrained, privatize_eta=3.0, privatize_seed=4)
    b = batch_of(task, 12)
    local = task.local
    out = np.asarray(local.fixed(b["ids"], b["seed"]))
    ids, seeds = np.asarray(b["ids"]), np.asarray(b["seed"])
    # the same as the host-side corpus privatizer: key fold_in(root, lo), stream = hi, position = j,
    # root the local_inputs stream of the user key
    assert seeds.shape == (12, 2) and seeds.dtype == np.uint32
    rows, cols = np.nonzero(local.ordinary[ids])
    root = stream_key(4, LOCAL_INPUTS)
    for r in range(12):
        at = rows == r
        host = privatize_streams(jax.random.fold_in(root, int(seeds[r, 0])), np.full(at.sum(), seeds[r, 1], np.uint32), cols[at], ids[r, cols[at]], TokenIndex(local.table, local.allowed), 3.0)
        np.testing.assert_array_equal(out[r, cols[at]], host)
    special = ~local.ordinary[ids]
    np.testing.assert_array_equal(out[special], ids[special])  # [CLS], [SEP], [PAD], [UNK] sent unchanged
    assert 0.1 < np.mean(out[rows, cols] != ids[rows, cols]) < 0.99
    # per example: the same rows in another batch (order, company) get the same privatized pieces
    perm = np.array([5, 0, 11, 3])
    np.testing.assert_array_equal(np.asarray(local.fixed(b["ids"][perm], b["seed"][perm])), out[perm])
    other = LocalInputs(local.table, local.allowed, 3.0, seed=5).fixed(b["ids"], b["seed"])
    assert np.mean(np.asarray(other)[rows, cols] != out[rows, cols]) > 0.1  # another user key, other draws


# ---- frozen user side --------------------------------------------------------------------------------
def test_the_user_side_token_embedding_is_frozen_and_never_read_from_the_parameters(tok, pretrained):
    for task in (
        MLMTask(tok, max_len=32, lowercase=True, pretrained=pretrained, privatize_eta=10.0, mlm_target="denoising"),
        MLMTask(tok, max_len=32, lowercase=True, pretrained=pretrained, freeze_token_embedding=True),  # the control: frozen, in the clear
        BertNERTask.from_examples(SENTENCES, tok, max_len=32, lowercase=True, pretrained=pretrained, privatize_eta=10.0),
        BertNERTask.from_examples(SENTENCES, tok, max_len=32, lowercase=True, pretrained=pretrained, freeze_token_embedding=True),
    ):
        b, params = batch_of(task), task.init_params(jax.random.key(1))
        loss = lambda p: jnp.mean(task.losses(p, b, jax.random.key(2), True))  # noqa: E731
        g = jax.grad(loss)(params)
        assert float(jnp.max(jnp.abs(g["encoder"]["token_embed"]["embedding"]))) == 0.0
        assert float(jnp.max(jnp.abs(g["encoder"]["position_embed"]["embedding"]))) > 0.0
        moved = jax.tree_util.tree_map(lambda a: a, params)
        moved["encoder"]["token_embed"]["embedding"] = jnp.zeros_like(params["encoder"]["token_embed"]["embedding"])
        assert float(loss(moved)) == pytest.approx(float(loss(params)), abs=0)
        ok, why = supports_fast(task, params, b, jax.random.key(0))
        assert not ok and "frozen" in why
    plain = MLMTask(tok, max_len=32, lowercase=True, pretrained=pretrained)
    b, params = batch_of(plain), plain.init_params(jax.random.key(1))
    g = jax.grad(lambda p: jnp.mean(plain.losses(p, b, jax.random.key(2), True)))(params)
    assert float(jnp.max(jnp.abs(g["encoder"]["token_embed"]["embedding"]))) > 0.0  # without privatization it trains


# ---- the three targets -----------------------------------------------------------------------------
def test_at_a_huge_eta_every_target_is_plain_masked_lm(tok, pretrained):
    plain = MLMTask(tok, max_len=32, lowercase=True, pretrained=pretrained)
    b, params = batch_of(plain), plain.init_params(jax.random.key(1))
    want = plain.losses(params, b, jax.random.key(7), False)
    for target in ("vanilla", "prob", "denoising"):
        task = MLMTask(tok, max_len=32, lowercase=True, pretrained=pretrained, privatize_eta=1e9, mlm_target=target, target_draws=3)
        np.testing.assert_allclose(task.losses(params, b, jax.random.key(7), False), want, rtol=1e-6)


def test_the_targets_are_the_privatized_the_drawn_or_the_original_pieces(tok, pretrained):
    rng = jax.random.key(9)
    tasks = {t: MLMTask(tok, max_len=32, lowercase=True, pretrained=pretrained, privatize_eta=3.0, mlm_target=t, target_draws=4) for t in ("vanilla", "prob", "denoising")}
    b = batch_of(tasks["vanilla"])
    params = tasks["vanilla"].init_params(jax.random.key(1))
    _, _, mv = tasks["vanilla"]._nll(params, b, rng, False)
    logits, nll_d, md = tasks["denoising"]._nll(params, b, rng, False)
    sel = np.asarray(mv["weights"]) > 0
    original = np.take_along_axis(np.asarray(b["ids"]), np.asarray(md["positions"]), axis=1)
    np.testing.assert_array_equal(np.asarray(md["targets"])[sel], original[sel])  # denoising: the original pieces
    np.testing.assert_array_equal(np.asarray(md["positions"]), np.asarray(mv["positions"]))  # same masking
    assert np.mean(np.asarray(mv["targets"])[sel] != original[sel]) > 0.2  # vanilla: the privatized pieces
    np.testing.assert_allclose(nll_d, optax.softmax_cross_entropy_with_integer_labels(logits, md["targets"]), rtol=1e-6)
    # prob (eq. 6): the mean cross-entropy over target_draws fresh privatizations of the original piece
    task = tasks["prob"]
    logits, nll_p, _ = task._nll(params, b, rng, False)
    draws = np.asarray(task.local.draws(example_keys(rng, b["seed"], SET_STREAM), jnp.asarray(original), 4))
    logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    want = -np.mean(np.take_along_axis(logp, draws, axis=-1), axis=-1)
    np.testing.assert_allclose(np.asarray(nll_p), want, rtol=1e-5)
    assert np.mean([len(set(r)) > 1 for r in draws[sel]]) > 0.3  # a set, not one token


# ---- configuration ---------------------------------------------------------------------------------
def _cfg(kind="mlm", privatize=None, **options):
    raw = {"name": "t", "vocab": {"size": 300}, "task": {"kind": kind, "model": "tiny", "options": options}}
    if privatize:
        raw["privatize"] = privatize
    return validate_config(raw)


def test_impossible_or_incomplete_settings_are_refused_before_training(tok):
    train = FederatedCorpus.from_dict({f"u{i}": SENTENCES[i : i + 10] for i in range(0, 120, 10)}, "ncbi-part")
    with pytest.raises(ConfigError, match="privatize_eta needs task.options.pretrained"):
        build_task(_cfg(privatize_eta=5.0), train)
    with pytest.raises(ConfigError, match="privatize_eta and \\[privatize\\]"):
        build_task(_cfg("bert-ner", privatize={"mechanism": "txt", "eta": 5.0, "embeddings": "x.txt"}, privatize_eta=5.0, pretrained="runs/x"), train)
    with pytest.raises(ConfigError, match="freeze_token_embedding needs task.options.pretrained"):
        build_task(_cfg(freeze_token_embedding=True), train)
    with pytest.raises(FedprivError, match="give privatize_eta too"):
        MLMTask(tok, max_len=32, mlm_target="denoising")
    with pytest.raises(FedprivError, match="mlm_target must be one of vanilla, prob, denoising"):
        MLMTask(tok, max_len=32, privatize_eta=5.0, mlm_target="original")
    with pytest.raises(FedprivError, match="target_draws must be >= 1"):
        MLMTask(tok, max_len=32, privatize_eta=5.0, mlm_target="prob", target_draws=0)
    with pytest.raises(PrivacyParameterError):
        BertNERTask.from_examples(SENTENCES, tok, privatize_eta=0.0)
    with pytest.raises(FedprivError, match="pretrained"):
        _ = BertNERTask.from_examples(SENTENCES, tok, privatize_eta=3.0).local  # no table to privatize in


# ---- end to end through the run store -----------------------------------------------------------------
EXPERIMENT = f"""
name = "tiny-adaptive"
seed = 0
[data]
source = "{NCBI}"
options = {{ users = "sentences:10" }}
heldout_fraction = 0.0
max_examples_per_user = 4
eval_source = "tests/data/ncbi-disease/devel.tsv"
eval_options = {{ users = "sentences:50" }}
[vocab]
size = 300
[task]
kind = "mlm"
model = "tiny"
options = {{ max_len = 24, lowercase = true }}
[training]
learning_rate = 0.002
batch_size = 16
steps = 4
eval_every = 4
checkpoint_every = 4
eval_batch_size = 64

[[runs]]
name = "orig"
kind = "central"

[[runs]]
name = "denoising"
kind = "central"
task = {{ options = {{ pretrained = "run:orig", max_len = 24, privatize_eta = 20.0, mlm_target = "denoising" }} }}

[[runs]]
name = "ner"
kind = "central"
task = {{ kind = "bert-ner", options = {{ pretrained = "run:denoising", max_len = 24, privatize_eta = 20.0 }} }}
"""


@pytest.mark.slow
def test_privacy_adaptive_chain_keeps_the_table_and_records_the_guarantee(run_toml):
    from fedpriv.report.tables import write_report

    store, summaries = run_toml(EXPERIMENT)
    orig, den, ner = summaries

    def table(run):
        raw = serialization.msgpack_restore((store / run / "params.msgpack").read_bytes())
        return np.asarray(raw["encoder"]["token_embed"]["embedding"])

    assert np.array_equal(table("orig"), table("denoising"))  # frozen through Adam: exactly unchanged
    assert "privatize" not in orig
    for s, draws in ((den, "fresh at every step"), (ner, "once per example")):
        rec = s["privatize"]
        assert rec["mechanism"] == "txt" and rec["eta"] == 20.0 and draws in rec["draws"]
        assert "eta·d_chi per token" in rec["guarantee"] and str((store / s["starts_from"]["pretrained"]).resolve()) in rec["embeddings"]
    assert den["privatize"]["mlm_target"] == "denoising"
    assert 0.0 <= ner["eval_f1"] <= 1.0 and ner["task"] == "bert-ner"
    comparison = (write_report(store) / "comparison.md").read_text()
    assert "locally privatized" in comparison
    assert json.loads((store / "ner" / "privatize.json").read_text()) == ner["privatize"]


def test_the_shipped_experiment_fine_tunes_each_adaptive_encoder_at_its_own_eta():
    from fedpriv.runner.grid import read_experiment

    exp = read_experiment("experiments/local-privacy.toml")
    by = {s.name: s.config for s in exp.runs}
    adaptive = {n: c for n, c in by.items() if n.startswith("adaptive-")}
    assert {(c.task.options["mlm_target"], c.task.options["privatize_eta"]) for c in adaptive.values()} == {
        (t, e) for t in ("vanilla", "prob", "denoising") for e in (30, 50, 80)
    }
    assert all(c.task.options["pretrained"] == "run:bert-public" for c in adaptive.values())
    assert by["bert-continued"].task.options["freeze_token_embedding"] is True
    for name, c in by.items():
        if name.startswith("ner-eta"):
            eta, encoder = c.task.options["privatize_eta"], c.task.options["pretrained"][len("run:"):]
            assert name.startswith(f"ner-eta{eta}-") and (encoder in ("bert-public", "bert-continued") or by[encoder].task.options["privatize_eta"] == eta)
    assert {m.name for m in exp.measures} == {"nwp-words", "bert-pieces"}
