"""Central training's step rules: a fresh non-IID user order each epoch, train rows that average, step keys fold_in(k),
the short last batch counted, and the prepared (warm-start) parameters as the start."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from federated_helpers import leaves_max_diff

from fedpriv.central.order import epoch_order
from fedpriv.central.sgd import CentralStepper
from fedpriv.config import TrainingConfig


def test_noniid_visits_the_users_in_a_fresh_random_order_each_epoch():
    counts = np.array([2, 3, 1, 4, 2, 3, 1, 2])
    offsets = np.concatenate([[0], np.cumsum(counts)])

    def users(epoch):
        order = epoch_order(counts, "noniid", seed=0, epoch=epoch)
        owner = np.searchsorted(offsets, order, side="right") - 1
        return tuple(int(u) for i, u in enumerate(owner) if i == 0 or owner[i - 1] != u)

    seen = {users(e) for e in range(6)}
    assert len(seen) > 1 and tuple(range(8)) not in seen  # 8! orders: repeating, or corpus order, is a bug


def test_a_central_train_row_averages_the_losses_since_the_last_row():
    row = CentralStepper.train_row(CentralStepper.__new__(CentralStepper), 4, [{"loss": 1.0}, {"loss": 2.0}, {"loss": 6.0}])
    assert row["loss"] == pytest.approx(3.0)


def test_a_central_run_starts_from_the_prepared_initial_parameters(tmp_path, monkeypatch):
    from fedpriv.central.train import train_prepared_central
    from fedpriv.runner.prepare import prepare

    p = tmp_path / "c.toml"
    p.write_text('name = "c"\nseed = 3\n[data]\nsource = "synthetic:users=30,examples=300"\nheldout_fraction = 0.1\n'
                 '[vocab]\nsize = 60\nseq_len = 8\n[task]\nkind = "nwp"\nmodel = "tiny"\n'
                 '[training]\noptimizer = "sgd"\nlearning_rate = 1e-9\nbatch_size = 8\nsteps = 1\n')
    prepared = prepare(p)
    start = prepared.task.init_params(jax.random.key(12345))
    monkeypatch.setattr(type(prepared), "initial_params", lambda self, seed: start)
    got = train_prepared_central(prepared, tmp_path / "run").params
    assert leaves_max_diff(got, start) < 1e-6  # one step of lr 1e-9 from the warm start


def test_central_step_k_draws_its_randomness_from_fold_in_of_k(tmp_path):
    """Step k's key is fold_in(step stream, k) for every k, across epochs (the NWP models take no
    randomness, so a key bug does not show in their training: read the key through the loss)."""
    import optax

    from fedpriv.central.sgd import SGDStepper
    from fedpriv.training.loop import step_key_base

    class T:
        name = "t"

    def grad_fn(params, batch, rng):
        return jax.random.uniform(rng), jax.tree_util.tree_map(jnp.zeros_like, params)

    cfg = TrainingConfig(optimizer="sgd", learning_rate=0.1, batch_size=4, steps=9, order="iid")
    train = {"x": np.arange(10)[:, None], "mask": np.ones(10, np.float32)}
    stepper = SGDStepper(T(), train, np.array([4, 6]), cfg, 5, optax.sgd(0.1), 9, grad_fn)  # 3 steps an epoch
    state = stepper.init_state({"w": jnp.zeros(2)})
    for k in range(9):
        state, info = stepper.step(state, k)
        assert info["loss"] == pytest.approx(float(jax.random.uniform(jax.random.fold_in(step_key_base(5), k))))


def test_epochs_count_the_short_last_batch_as_a_step():
    from fedpriv.central.sgd import total_steps

    assert total_steps(TrainingConfig(epochs=2, batch_size=4), 10) == 6  # 2 x ceil(10/4)
    assert total_steps(TrainingConfig(epochs=1.5, batch_size=4), 10) == 5  # ceil(1.5 x 3)
    assert total_steps(TrainingConfig(epochs=1, batch_size=4), 8) == 2
