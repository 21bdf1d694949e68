"""DP-SGD: fast clipping equals the vmap reference, the clip bound, the noise scale, and the
equivalences of the trainer (no noise + no clip = SGD; accumulation; sharding; resume)."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedpriv.central.dpsgd import DPSGDStepper
from fedpriv.central.train import train_central
from fedpriv.config import PrivacyConfig, TrainingConfig, validate_config
from fedpriv.data.examples import TextExample
from fedpriv.data.shakespeare import load_shakespeare
from fedpriv.errors import ConfigError, FedprivError, PrivacyParameterError
from fedpriv.models.capture import apply_model
from fedpriv.models.layers import LSTM, Dense, Embed, LayerNorm
from fedpriv.privacy.accounting import GaussianSteps, epsilon_for, max_steps_within
from fedpriv.privacy.clipping import fast_clipped_sum, per_example_grads, reference_clipped_sum, supports_fast
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.rundir import LEDGER
from fedpriv.runner.prepare import encode_corpus
from fedpriv.tasks.base import Task, pad_batch
from fedpriv.tasks.nwp import NWPTask
from fedpriv.training.loop import gather
from fedpriv.vocab.word import WordVocab


# ---- one-layer tasks: each supported layer type alone ------------------------------------------------
class _Net(nn.Module):
    kind: str

    @nn.compact
    def __call__(self, x, ids):
        if self.kind == "dense1":  # one position: the rank-one shortcut
            return Dense(3)(x[:, 0])
        if self.kind == "dense_ghost":  # T (p + q) <= p q: ghost norms
            return Dense(40)(x)
        if self.kind == "dense_direct":  # few features, many positions: materialized norms
            return Dense(2)(x[..., :2])
        if self.kind == "embed":
            return Embed(11, 5)(ids)
        if self.kind == "layernorm":
            return LayerNorm()(x)
        if self.kind == "lstm":
            return LSTM(6)(x, jnp.sum(ids > 0, axis=1))
        if self.kind == "lstm_reverse":
            return LSTM(6, reverse=True)(x, jnp.sum(ids > 0, axis=1))
        if self.kind == "stack":
            h = LayerNorm()(Embed(11, 8)(ids) + Dense(8)(x))
            return Dense(4)(LSTM(5)(h, jnp.sum(ids > 0, axis=1)))
        raise ValueError(self.kind)


class LayerTask(Task):
    """Per-example loss: a fixed random projection of the layer's output, squared, over real positions."""

    def __init__(self, kind):
        self.kind, self.model = kind, _Net(kind)

    def init_params(self, rng):
        return self.model.init(rng, jnp.zeros((1, 7, 8)), jnp.ones((1, 7), jnp.int32))["params"]

    def encode(self, examples):
        raise NotImplementedError

    def losses(self, params, batch, rng, train):
        out = apply_model(self.model, params, batch["x"], batch["ids"])
        w = jnp.sin(jnp.arange(out.shape[-1]) + 1.0)
        per_pos = (out @ w) ** 2
        if per_pos.ndim == 1:
            return per_pos
        valid = (batch["ids"] > 0).astype(jnp.float32)
        return jnp.sum(per_pos * valid, axis=1)

    def metric_sums(self, params, batch):
        return {}

    def summarize(self, sums):
        return {}


def layer_batch(seed, b=6):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 8, size=b)
    ids = np.where(np.arange(7)[None] < lengths[:, None], rng.integers(1, 11, size=(b, 7)), 0).astype(np.int32)
    ids[0, :3] = 4  # repeated ids exercise the embedding rule
    x = (rng.normal(size=(b, 7, 8)) * rng.uniform(0.1, 3, size=(b, 1, 1))).astype(np.float32)
    mask = np.ones(b, np.float32)
    mask[-1] = 0.0
    return {"x": jnp.asarray(x), "ids": jnp.asarray(ids), "mask": jnp.asarray(mask)}


KINDS = ["dense1", "dense_ghost", "dense_direct", "embed", "layernorm", "lstm", "lstm_reverse", "stack"]


@pytest.mark.parametrize("kind", KINDS)
def test_fast_clipping_equals_vmap_reference_on_each_layer(kind):
    task = LayerTask(kind)
    params = task.init_params(jax.random.key(3))
    batch = layer_batch(1)
    assert supports_fast(task, params, batch, jax.random.key(0)) == (True, "")
    _, grads = jax.jit(lambda p, b: per_example_grads(task, p, b, jax.random.key(0)))(params, batch)
    norms_ref = np.sqrt(sum(np.sum(np.asarray(g).reshape(6, -1) ** 2, axis=1) for g in jax.tree.leaves(grads)))
    c_mid = float(np.median(norms_ref[:-1]))  # some rows clipped, some not
    ref_fn = jax.jit(lambda p, b, c: reference_clipped_sum(task, p, b, jax.random.key(0), c))
    fast_fn = jax.jit(lambda p, b, c: fast_clipped_sum(task, p, b, jax.random.key(0), c))
    for C in (c_mid, 1e6):
        ref, n_ref, l_ref = ref_fn(params, batch, C)
        fast, n_fast, l_fast = fast_fn(params, batch, C)
        np.testing.assert_allclose(np.asarray(n_fast[:-1]), norms_ref[:-1], rtol=1e-5)
        np.testing.assert_allclose(np.asarray(l_fast), np.asarray(l_ref), rtol=1e-6)
        for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(fast)):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5 * max(1.0, float(np.max(np.abs(a)))))


@pytest.mark.parametrize("kind", KINDS)
def test_an_example_with_a_non_finite_gradient_contributes_nothing_on_both_paths(kind):
    """One example whose input is inf (its gradient NaN or inf): the reference and the fast
    clipped sums both leave it out (factor 0, its rows zeroed), so the sum stays finite and its
    sensitivity C; they agree on the others."""
    task = LayerTask(kind)
    params = task.init_params(jax.random.key(3))
    batch = layer_batch(1)
    batch["x"] = batch["x"].at[1, 0, 0].set(jnp.inf)
    ref, norms, _ = reference_clipped_sum(task, params, batch, jax.random.key(0), 1.0)
    fast, _, _ = fast_clipped_sum(task, params, batch, jax.random.key(0), 1.0)
    assert kind == "embed" or not np.isfinite(np.asarray(norms)[1])  # every layer but the embedding reads x
    clean = {**batch, "mask": batch["mask"] * jnp.isfinite(norms)}  # the same batch with the non-finite example masked out
    want, _, _ = reference_clipped_sum(task, params, clean, jax.random.key(0), 1.0)
    for a, b, w in zip(jax.tree.leaves(ref), jax.tree.leaves(fast), jax.tree.leaves(want)):
        assert np.isfinite(np.asarray(a)).all() and np.isfinite(np.asarray(b)).all()
        np.testing.assert_allclose(np.asarray(a), np.asarray(w), atol=1e-6)
        np.testing.assert_allclose(np.asarray(b), np.asarray(w), atol=1e-5 * max(1.0, float(np.max(np.abs(np.asarray(w))))))


def test_fast_clipping_refuses_uncovered_parameters():
    class Bare(nn.Module):
        @nn.compact
        def __call__(self, x, ids):
            return x @ self.param("w", nn.initializers.ones, (8, 2))

    task = LayerTask("dense1")
    task.model = Bare()
    params = task.model.init(jax.random.key(0), jnp.zeros((1, 7, 8)), jnp.ones((1, 7), jnp.int32))["params"]
    ok, why = supports_fast(task, params, layer_batch(0), jax.random.key(0))
    assert not ok and "not in a recorded layer" in why


@pytest.fixture(scope="module")
def nwp():
    corpus = load_shakespeare().with_min_examples(40)
    vocab = WordVocab.build((e.text for e in corpus.records()), 400)
    task = NWPTask(vocab, seq_len=10, model="tiny")
    return task, encode_corpus(task, corpus), corpus.counts()


def test_fast_equals_reference_on_the_nwp_lstm_and_clip_bound(nwp):
    task, arrays, _ = nwp
    params = task.init_params(jax.random.key(0))
    batch = {k: jnp.asarray(v) for k, v in pad_batch({k: v[:20] for k, v in arrays.items()}, 24).items()}
    C = 0.3
    fast_fn = jax.jit(lambda p, b: fast_clipped_sum(task, p, b, jax.random.key(0), C))
    ref, _, _ = jax.jit(lambda p, b: reference_clipped_sum(task, p, b, jax.random.key(0), C))(params, batch)
    fast, norms, _ = fast_fn(params, batch)
    assert float(jnp.min(norms[:20])) > C  # every example is clipped at this C
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(fast)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6)
    # Each example's contribution alone has norm exactly min(norm, C) <= C.
    for i in range(0, 20, 4):
        only = dict(batch, mask=jnp.zeros(24).at[i].set(1.0))
        s, _, _ = fast_fn(params, only)
        n = math.sqrt(sum(float(jnp.sum(x**2)) for x in jax.tree.leaves(s)))
        assert n <= C * (1 + 1e-5) and n == pytest.approx(C, rel=1e-4)


def dp_cfg(**kw):
    base = dict(clip_norm=1e6, noise_multiplier=0.0, delta=1e-5, sampling="fixed")
    base.update(kw)
    base.setdefault("private", base["noise_multiplier"] != 0.0)  # no noise: the clipping-only control
    return PrivacyConfig(**base)


def tcfg(**kw):
    base = dict(optimizer="sgd", learning_rate=0.5, batch_size=32, steps=4, eval_every=100, checkpoint_every=100)
    base.update(kw)
    return TrainingConfig(**base)


def run_dp(task, arrays, tmp_path, name, dp, cfg=None, seed=0, **kw):
    cfg = cfg or tcfg()
    stepper = DPSGDStepper(task, arrays, cfg, dp, seed, optax.sgd(cfg.learning_rate), cfg.steps)
    return train_central(task, arrays, np.array([len(arrays["mask"])]), cfg, seed, tmp_path / name, stepper=stepper, **kw), stepper


def flat(params):
    return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(params)])


def test_no_noise_and_no_clip_equals_sgd_on_the_same_batches(nwp, tmp_path):
    task, arrays, _ = nwp
    res, stepper = run_dp(task, arrays, tmp_path, "dp", dp_cfg())
    params = task.init_params(jax.random.split(jax.random.key(0))[0])
    tx = optax.sgd(0.5)
    opt = tx.init(params)

    @jax.jit  # one program for the 4 steps (the same shapes)
    def sgd_step(params, opt, batch):
        g = jax.grad(task.mean_loss)(params, batch, jax.random.key(0))
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt

    for step in range(4):
        params, opt = sgd_step(params, opt, gather(arrays, stepper.sample(step), 32))
    np.testing.assert_allclose(flat(res.params), flat(params), atol=2e-6)


def test_accumulating_micro_batches_equals_one_batch(nwp, tmp_path):
    task, arrays, _ = nwp
    one, _ = run_dp(task, arrays, tmp_path, "one", dp_cfg(clip_norm=0.3))
    acc, s = run_dp(task, arrays, tmp_path, "acc", dp_cfg(clip_norm=0.3, micro_batch_size=8))
    assert s.T == 4
    np.testing.assert_allclose(flat(acc.params), flat(one.params), atol=2e-6)


@pytest.mark.parametrize("noise", [0.0, 1.3])
def test_sharded_equals_unsharded(nwp, tmp_path, noise):
    task, arrays, _ = nwp
    assert jax.device_count() >= 4
    single, _ = run_dp(task, arrays, tmp_path, "p1", dp_cfg(clip_norm=0.3, noise_multiplier=noise, micro_batch_size=16))
    sharded, s = run_dp(task, arrays, tmp_path, "p4", dp_cfg(clip_norm=0.3, noise_multiplier=noise, devices=4, micro_batch_size=4))
    assert (s.P, s.b, s.T) == (4, 4, 2)
    np.testing.assert_allclose(flat(sharded.params), flat(single.params), atol=2e-6)


def test_noise_std_is_sigma_C_over_B(nwp):
    """Zero gradients in, the update of plain SGD with lr 1 is minus the noise / B."""
    task, arrays, _ = nwp
    sigma, C, B = 1.7, 0.8, 32
    for mode, draws in [("once", 1), ("per-shard", 4)]:
        stepper = DPSGDStepper(task, arrays, tcfg(learning_rate=1.0, batch_size=B), dp_cfg(clip_norm=C, noise_multiplier=sigma, devices=4, noise_mode=mode), 0, optax.sgd(1.0), 4)
        params = task.init_params(jax.random.key(0))
        state = stepper.init_state(params)
        zeros = jax.tree.map(jnp.zeros_like, params)
        after, noised_norm = stepper._apply(state, zeros, jax.random.key(5))
        delta = flat(after["params"]) - flat(params)
        assert float(noised_norm) == pytest.approx(np.linalg.norm(delta), rel=1e-3)  # the public norm a DP row logs: the noised update's
        expected = sigma * C * math.sqrt(draws) / B
        # 20,132 coordinates: the sample std's standard error is 0.5%; this seed's draw is within 1%.
        assert np.std(delta) == pytest.approx(expected, rel=0.01)
        assert abs(np.mean(delta)) < 3 * expected / math.sqrt(delta.size)
        assert stepper.budget.event.effective_noise_multiplier == pytest.approx(sigma * math.sqrt(draws))


def test_per_micro_step_noise_has_the_std_the_budget_accounts(nwp):
    """per-micro-step: each of the P shards adds a draw at each of the T micro-steps, sigma C
    sqrt(P T) / B on the update, and the ledger's effective multiplier is sigma sqrt(P T). (A
    mutant without sqrt(P) passed every other test: docs/privacy.md's mutation review.)"""
    task, arrays, _ = nwp
    sigma, C, B = 1.7, 0.8, 32
    stepper = DPSGDStepper(task, arrays, tcfg(learning_rate=1.0, batch_size=B),
                           dp_cfg(clip_norm=C, noise_multiplier=sigma, devices=4, micro_batch_size=4, noise_mode="per-micro-step"), 0, optax.sgd(1.0), 4)
    assert (stepper.P, stepper.T) == (4, 2)
    params = task.init_params(jax.random.key(0))
    acc = jax.tree.map(jnp.zeros_like, params)
    batch = gather(arrays, np.arange(stepper.rows), stepper.rows)
    batch = {**batch, "mask": np.zeros_like(batch["mask"])}  # no example: the update is the noise alone
    for k in range(stepper.T):
        acc, _, _ = stepper._accumulate(params, acc, batch, jax.random.fold_in(jax.random.key(5), k + 1))
    after, _ = stepper._apply(stepper.init_state(params), acc, jax.random.key(6))
    delta = flat(after["params"]) - flat(params)
    assert np.std(delta) == pytest.approx(sigma * C * math.sqrt(stepper.P * stepper.T) / B, rel=0.03)  # 20,132 coordinates: standard error 0.5%
    assert stepper.budget.event.effective_noise_multiplier == pytest.approx(sigma * math.sqrt(stepper.P * stepper.T))


@pytest.mark.parametrize("mechanism", [{}, {"mechanism": "banded-mf", "bands": 1, "sampling": "cyclic"}], ids=["gaussian", "banded-mf-1-band"])
def test_every_step_draws_fresh_noise(nwp, mechanism):
    """Through step() (the keys production derives, not one a test picks): two steps' updates are
    uncorrelated, the noise being about 16x the signal in norm; a key reused at every step (the
    same Z each step; with one band C = I, so banded MF adds Z_t itself) correlates them near 1."""
    task, arrays, _ = nwp
    stepper = DPSGDStepper(task, arrays, tcfg(learning_rate=1.0), dp_cfg(clip_norm=0.8, noise_multiplier=1.7, **mechanism), 0, optax.sgd(1.0), 4)
    p0 = task.init_params(jax.random.key(0))
    s1, _ = stepper.step(stepper.init_state(p0), 0)
    s2, _ = stepper.step(s1, 1)
    u0, u1 = flat(s1["params"]) - flat(p0), flat(s2["params"]) - flat(s1["params"])
    assert abs(np.corrcoef(u0, u1)[0, 1]) < 0.05


def test_example_level_poisson_batches_have_the_expected_size_b(nwp):
    """q = B/N: over 400 steps the mean batch is B within 4 standard errors (a sampler at 2q, or
    any q, passed the test that batch sizes vary)."""
    task, arrays, _ = nwp
    n, B, T = len(arrays["mask"]), 32, 400
    stepper = DPSGDStepper(task, arrays, tcfg(batch_size=B), dp_cfg(clip_norm=1.0, noise_multiplier=1.0, sampling="poisson"), 0, optax.sgd(1.0), T)
    sizes = np.array([len(stepper.sample(t)) for t in range(T)])
    assert abs(sizes.mean() - B) < 4 * math.sqrt(B * (1 - B / n) / T)


def test_the_user_level_stepper_clips_a_users_whole_contribution(nwp):
    """The clipping the stepper itself picks (not reference_clipped_sum called by a test): one
    user's k = 4 examples together add a vector of norm exactly C (C small enough that every user's
    sum is clipped); clipping per example would add up to k C."""
    task, arrays, counts = nwp
    C = 0.05
    stepper = DPSGDStepper(task, arrays, tcfg(batch_size=2), dp_cfg(clip_norm=C, noise_multiplier=0.0, unit="user", examples_per_user=4), 0,
                           optax.sgd(1.0), 4, user_counts=counts)
    params = task.init_params(jax.random.key(0))
    batch = gather(arrays, stepper.sample(0)[:1].reshape(-1), stepper.rows * stepper.group)  # one user's k rows, the rest padding
    acc, _, _ = stepper._accumulate(params, jax.tree.map(jnp.zeros_like, params), batch, jax.random.key(1))
    assert float(np.linalg.norm(flat(acc))) == pytest.approx(C, rel=1e-4)


def test_ledger_records_the_sampling_used_and_epsilon_is_printed(nwp, tmp_path):
    task, arrays, _ = nwp
    n = len(arrays["mask"])
    res, stepper = run_dp(task, arrays, tmp_path, "pois", dp_cfg(clip_norm=1.0, noise_multiplier=1.1, sampling="poisson"), cfg=tcfg(steps=6, eval_every=3))
    ledger = PrivacyLedger.load(tmp_path / "pois" / LEDGER)
    assert ledger.entries == [GaussianSteps("poisson", 1.1, n, 32, 6)]
    rows = [r for r in res.history if r["split"] == "train"]
    assert rows[-1]["epsilon"] == pytest.approx(epsilon_for(GaussianSteps("poisson", 1.1, n, 32, 6), 1e-5).epsilon)
    assert "add-or-remove-one example" in rows[-1]["guarantee"] and "Poisson" in rows[-1]["guarantee"]
    line = stepper.describe(6, rows[-1], [], 1.0, 6)
    assert f"epsilon {rows[-1]['epsilon']:.3g} (delta 1e-05; example-level, add-or-remove-one, Poisson q = {32 / n:.4g})" in line
    # Poisson batches vary in size; the denominator stays B.
    sizes = {len(stepper.sample(k)) for k in range(20)}
    assert len(sizes) > 3


def test_budget_stops_cleanly_and_resume_stays_stopped(nwp, tmp_path):
    task, arrays, _ = nwp
    n = len(arrays["mask"])
    ev = GaussianSteps("fixed", 0.9, n, 32, 1)
    budget = epsilon_for(ev.with_steps(5), 1e-5).epsilon * 1.0001
    assert max_steps_within(ev, budget, 1e-5, "rdp", 100) == 5
    dp = dp_cfg(clip_norm=1.0, noise_multiplier=0.9, epsilon_budget=budget)
    res, _ = run_dp(task, arrays, tmp_path, "budget", dp, cfg=tcfg(steps=50))
    assert res.done == 5 and "budget" in res.stopped
    assert PrivacyLedger.load(tmp_path / "budget" / LEDGER).steps == 5
    again, _ = run_dp(task, arrays, tmp_path, "budget", dp, cfg=tcfg(steps=50))
    assert again.done == 5 and again.stopped


def test_target_epsilon_is_calibrated_before_training(nwp, tmp_path):
    task, arrays, _ = nwp
    dp = dp_cfg(clip_norm=1.0, noise_multiplier=None, target_epsilon=2.0, sampling="poisson")
    res, stepper = run_dp(task, arrays, tmp_path, "target", dp, cfg=tcfg(steps=8, eval_every=8))
    final = [r for r in res.history if r["split"] == "train"][-1]["epsilon"]
    assert final <= 2.0 and final > 1.99


def test_dp_resume_equals_uninterrupted_with_noise(nwp, tmp_path):
    task, arrays, _ = nwp
    dp = dp_cfg(clip_norm=0.5, noise_multiplier=1.0, sampling="poisson", micro_batch_size=16)
    cfg = tcfg(steps=6, checkpoint_every=2, eval_every=3)
    full, _ = run_dp(task, arrays, tmp_path, "full", dp, cfg=cfg)
    run_dp(task, arrays, tmp_path, "part", dp, cfg=cfg, stop_after=3)
    rest, _ = run_dp(task, arrays, tmp_path, "part", dp, cfg=cfg)
    np.testing.assert_array_equal(flat(rest.params), flat(full.params))
    assert (tmp_path / "part" / "metrics.jsonl").read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()
    assert PrivacyLedger.load(tmp_path / "part" / LEDGER).steps == 6


@pytest.mark.parametrize(
    "kw, cfg_kw, message",
    [
        (dict(noise_mode="per-micro-step", noise_multiplier=1.0, micro_batch_size=5), {}, "multiple of"),
        (dict(noise_multiplier=1.0, devices=64), {}, "JAX sees"),
        (dict(noise_multiplier=1.0, epsilon_budget=1e-6), {}, "even one step exceeds"),
        (dict(noise_multiplier=1.0), dict(batch_size=10**6), "batch_size = 1000000 > "),
    ],
)
def test_impossible_settings_are_refused_before_training(nwp, kw, cfg_kw, message):
    task, arrays, _ = nwp
    with pytest.raises((PrivacyParameterError, FedprivError), match=message):
        DPSGDStepper(task, arrays, tcfg(**cfg_kw), dp_cfg(**kw), 0, optax.sgd(0.1), 4)


def test_noise_multiplier_and_target_epsilon_are_refused_together():
    with pytest.raises(ConfigError, match="privacy: give exactly one of noise_multiplier or target_epsilon"):
        validate_config({"name": "x", "privacy": {"clip_norm": 1.0, "delta": 1e-5, "noise_multiplier": 1.0, "target_epsilon": 1.0}})


def test_fast_equals_reference_on_the_ner_tagger_and_crf_falls_back(wnut_train):
    from fedpriv.data.conll import iter_sentences
    from fedpriv.tasks.ner import NERTask

    sents = [s for _, s in iter_sentences(wnut_train)][:12]
    for head in ("softmax", "crf"):
        task = NERTask.from_examples(sents, head=head, dropout=0.0, embed_dim=16, hidden=8, case_dim=4, max_len=48)
        params = task.init_params(jax.random.key(0))
        batch = {k: jnp.asarray(v) for k, v in task.encode(sents).items()}
        ok, why = supports_fast(task, params, batch, jax.random.key(0))
        if head == "crf":
            assert not ok and "transitions" in why
            continue
        assert ok, why
        ref, _, _ = jax.jit(lambda p, b: reference_clipped_sum(task, p, b, jax.random.key(0), 0.2))(params, batch)
        fast, _, _ = jax.jit(lambda p, b: fast_clipped_sum(task, p, b, jax.random.key(0), 0.2))(params, batch)
        for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(fast)):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6)


def test_fast_equals_reference_on_the_char_cnn_tagger(wnut_train):
    """Character features: a small table read at L x W positions takes the materialized embedding rule."""
    from fedpriv.data.conll import iter_sentences
    from fedpriv.tasks.ner import NERTask

    sents = [s for _, s in iter_sentences(wnut_train)][:8]
    task = NERTask.from_examples(sents, dropout=0.0, embed_dim=8, hidden=6, case_dim=4, max_len=40, char_dim=5, char_filters=7, char_width=12)
    params = task.init_params(jax.random.key(0))
    assert params["char_embed"]["embedding"].shape[0] < 40 * 12
    batch = {k: jnp.asarray(v) for k, v in task.encode(sents).items()}
    assert supports_fast(task, params, batch, jax.random.key(0)) == (True, "")
    ref, n_ref, _ = jax.jit(lambda p, b: reference_clipped_sum(task, p, b, jax.random.key(0), 0.2))(params, batch)
    fast, n_fast, _ = jax.jit(lambda p, b: fast_clipped_sum(task, p, b, jax.random.key(0), 0.2))(params, batch)
    np.testing.assert_allclose(np.asarray(n_fast), np.asarray(n_ref), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(fast)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6)


# ---- user-level DP-SGD --------------------------------------------------------------------------------
def _norm(tree) -> float:
    return math.sqrt(sum(float(jnp.sum(x**2)) for x in jax.tree.leaves(tree)))


def test_a_users_whole_contribution_is_clipped_to_C_whatever_its_examples(nwp):
    """Sensitivity of user-level DP-SGD: one user's term of the clipped sum is the gradient of its
    mean loss over its rows, clipped to C once: norm exactly C when clipped, for 1 or k examples."""
    task, arrays, _ = nwp
    params = task.init_params(jax.random.key(0))
    k, C = 4, 0.05
    rows = {k_: v[:8] for k_, v in arrays.items()}  # 2 users of 4 rows each
    clipped_sum = jax.jit(lambda p, b: reference_clipped_sum(task, p, b, jax.random.key(0), C, group=k))  # one program for both masks
    mean_loss_grad = jax.jit(jax.grad(task.mean_loss), static_argnums=3)
    for real in (1, 4):  # user 0 has `real` examples; user 1 none (masked): it adds nothing
        mask = np.zeros(8, np.float32)
        mask[:real] = 1.0
        batch = {k_: jnp.asarray(v) for k_, v in {**rows, "mask": mask}.items()}
        total, norms, _ = clipped_sum(params, batch)
        assert norms.shape == (2,) and float(norms[0]) > C
        assert _norm(total) == pytest.approx(C, rel=1e-4)  # one clipped user, whatever its example count
        # the unit's direction is the gradient of its mean loss over its real rows
        one = {k_: v[:real] for k_, v in batch.items()}
        g = mean_loss_grad(params, one, jax.random.key(0), True)
        np.testing.assert_allclose(flat(total), flat(g) * C / _norm(g), rtol=1e-4, atol=1e-7)


def test_user_batches_sample_users_with_k_of_their_examples(nwp):
    from fedpriv.central.users import UserBatches

    _, _, counts = nwp
    owner = np.repeat(np.arange(len(counts)), counts)
    fixed = UserBatches(counts, "fixed", 10, 20, 3, seed=4)
    for step in range(5):
        idx = fixed.indices(step)
        assert idx.shape == (10, 3)
        users = owner[idx]
        assert (users == users[:, :1]).all() and len(set(users[:, 0])) == 10  # a row is one user's; 10 distinct users
    again = UserBatches(counts, "fixed", 10, 20, 3, seed=4)
    np.testing.assert_array_equal(again.indices(4), fixed.indices(4))  # replayed: a function of (seed, step)
    poisson = UserBatches(counts, "poisson", 10, 50, 2, seed=4)
    sizes = [len(poisson.indices(s)) for s in range(50)]
    assert len(set(sizes)) > 3 and abs(np.mean(sizes) - 10) < 2.5  # q = 10/N per user: size varies around 10
    with pytest.raises(PrivacyParameterError, match="users > "):
        UserBatches(counts, "fixed", len(counts) + 1, 1, 1, seed=0)


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_user_level_epsilon_is_dp_accountings_for_user_sampling(nwp, tmp_path, sampling):
    import dp_accounting

    from fedpriv.privacy.accounting import RDP_ORDERS

    task, arrays, counts = nwp
    users, B, T, sigma = len(counts), 8, 5, 1.3
    cfg = tcfg(steps=T, batch_size=B, eval_every=T)
    dp = dp_cfg(clip_norm=1.0, noise_multiplier=sigma, sampling=sampling, unit="user", examples_per_user=2)
    stepper = DPSGDStepper(task, arrays, cfg, dp, 0, optax.sgd(cfg.learning_rate), T, user_counts=counts)
    res = train_central(task, arrays, counts, cfg, 0, tmp_path / sampling, stepper=stepper)
    assert PrivacyLedger.load(tmp_path / sampling / LEDGER).entries == [GaussianSteps(sampling, sigma, users, B, T, "user")]
    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE if sampling == "poisson" else dp_accounting.NeighboringRelation.REPLACE_ONE
    acc = dp_accounting.rdp.RdpAccountant(list(RDP_ORDERS), relation)
    one = (dp_accounting.PoissonSampledDpEvent(B / users, dp_accounting.GaussianDpEvent(sigma)) if sampling == "poisson"
           else dp_accounting.SampledWithoutReplacementDpEvent(users, B, dp_accounting.GaussianDpEvent(sigma / 2)))
    acc.compose(dp_accounting.SelfComposedDpEvent(one, T))
    row = [r for r in res.history if r["split"] == "train"][-1]
    assert row["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-12)
    assert "user-level" in row["guarantee"] and row["basis"].startswith("user-level")
