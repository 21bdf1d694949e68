"""The optimizers and learning-rate schedules against their formulas, central and server side (a mutation review found
that only run-equals-resumed-run tests covered them: a wrong optimizer still gives equal runs)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from fedpriv.central.train import training_optimizer
from fedpriv.config import FederatedConfig, TrainingConfig
from fedpriv.training.optimizers import make_optimizer


G = [np.array([1.0, -2.0]), np.array([0.5, 3.0]), np.array([-1.0, 0.25]), np.array([2.0, 2.0])]


def updates_of(tx, grads):
    """The updates ``tx`` makes for the gradient sequence ``grads`` from params 0."""
    params = jnp.zeros(2)
    state = tx.init(params)
    out = []
    for g in grads:
        u, state = tx.update(jnp.asarray(g, jnp.float32), state, params)
        out.append(np.asarray(u))
    return out


def test_sgd_momentum_and_adam_are_the_textbook_updates():
    lr, mu = 0.1, 0.7
    np.testing.assert_allclose(updates_of(make_optimizer("sgd", lr), G), [-lr * g for g in G], rtol=1e-6)
    m, want = np.zeros(2), []
    for g in G:  # heavy ball: m_t = g_t + mu m_{t-1}, once
        m = g + mu * m
        want.append(-lr * m)
    np.testing.assert_allclose(updates_of(make_optimizer("momentum", lr, mu), G), want, rtol=1e-6)
    b1, b2, eps = 0.9, 0.999, 1e-8
    m, v, want = np.zeros(2), np.zeros(2), []
    for t, g in enumerate(G, 1):  # Adam with bias correction (Kingma and Ba, Algorithm 1)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        want.append(-lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps))
    np.testing.assert_allclose(updates_of(make_optimizer("adam", lr), G), want, rtol=1e-4)  # float32


def lrs_of(tx, steps):
    """The learning rate of each step: SGD's update for a gradient of -1."""
    return [float(u[0]) for u in updates_of(tx, [np.array([-1.0, -1.0])] * steps)]


def test_cosine_and_warmup_cosine_schedules_follow_their_formulas():
    lr, T, W = 0.2, 10, 3
    cosine = [lr * 0.5 * (1 + math.cos(math.pi * t / T)) for t in range(T)]
    np.testing.assert_allclose(lrs_of(make_optimizer("sgd", lr, schedule="cosine", total_steps=T), T), cosine, rtol=1e-5, atol=1e-7)
    warm = [lr * t / W if t < W else lr * 0.5 * (1 + math.cos(math.pi * (t - W) / (T - W))) for t in range(T)]
    np.testing.assert_allclose(lrs_of(make_optimizer("sgd", lr, schedule="warmup_cosine", warmup_steps=W, total_steps=T), T), warm, rtol=1e-5, atol=1e-7)


def test_the_training_optimizer_takes_the_configs_schedule():
    cfg = TrainingConfig(optimizer="sgd", learning_rate=0.2, schedule="warmup_cosine", warmup_steps=2, steps=8, batch_size=4)
    got = lrs_of(training_optimizer(cfg, 8), 8)
    assert got[0] == 0.0 and got[2] == pytest.approx(0.2) and got[-1] < 0.02


def test_the_server_optimizer_uses_the_configured_learning_rate_and_momentum():
    from fedpriv.strategies.server import ServerCore

    f = FederatedConfig(rounds=2, clients_per_round=1, server_optimizer="momentum", server_learning_rate=0.5, server_momentum=0.5)
    core = ServerCore(f, population=3, seed=0)
    state = core.init_state({"w": jnp.zeros(2)})
    d = np.array([1.0, -2.0], np.float32)
    for r in (1, 2):
        acc = core.accumulator(state)
        acc.add({"w": jnp.asarray(d)[None]}, np.array([4]))
        state, _ = core.finish_round(state, r, acc)
    # round 1: 0.5 d; round 2: 0.5 (d + 0.5 d) = 0.75 d (lr 1 gives 2.5 d, momentum 0.9 gives 1.45 d)
    np.testing.assert_allclose(state["params"]["w"], 1.25 * d, rtol=1e-6)
