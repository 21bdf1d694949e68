"""A tiny federated experiment the engine and client tests share (Shakespeare, the tiny NWP LSTM).

Test modules import it by name (``from federated_helpers import ...``): pytest puts this folder,
the one holding ``conftest.py``, on ``sys.path``."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp

TINY = """
name = "{name}"
seed = 3
[data]
source = "shakespeare"
heldout_fraction = 0.1
max_examples_per_user = 16
[vocab]
size = 300
seq_len = 10
[task]
kind = "nwp"
model = "tiny"
[training]
eval_batch_size = 256
[federated]
rounds = 3
clients_per_round = 6
local_epochs = 2
local_batch_size = 8
client_learning_rate = 0.5
eval_every = 2
chunk_size = {chunk}
{extra}
[federated.flower]
num_supernodes = 2
{flower}
"""

DP = 'strategy = "dp-fedavg"\nclip_norm = 0.3\ndp = { noise_multiplier = 0.7, delta = 1e-3 }\nserver_optimizer = "momentum"'
DP_ADAPTIVE = 'strategy = "dp-fedavg"\nclip_norm = 0.3\ndp = { noise_multiplier = 0.7, delta = 1e-3, adaptive_clip = true, clip_count_stddev = 1.0 }\nserver_optimizer = "momentum"'
#: DP-FedAvg with BLT correlated noise on cyclic groups; SECURE_BLT draws its noise from a secret.
BLT = 'strategy = "dp-fedavg"\nclip_norm = 0.3\ndp = { mechanism = "blt", buffers = 2, target_epsilon = 8.0, delta = 1e-3 }\nserver_optimizer = "momentum"'
SECURE_BLT = BLT.replace("delta = 1e-3", "delta = 1e-3, secure_noise = true")


def write_config(tmp_path: Path, file: str = "fed", chunk: int = 64, extra: str = "", flower: str = "") -> Path:
    """The tiny experiment (always named "fed": the name salts the held-out split); ``extra``
    goes into [federated], ``flower`` into [federated.flower]."""
    p = tmp_path / f"{file}.toml"
    p.write_text(TINY.format(name="fed", chunk=chunk, extra=extra, flower=flower))
    return p


def leaves_max_diff(a, b) -> float:
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def train_cut_and_resume(cfg: Path, tmp_path: Path):
    """Train ``cfg`` (3 rounds) on the vectorized engine in full, and again stopped after round 1 and
    resumed; assert the resumed run equals the full one bit for bit (parameters and metrics without
    times); return the full run's result."""
    import json

    from fedpriv.engines.vectorized import run_vectorized
    from fedpriv.runner.prepare import prepare

    full = run_vectorized(prepare(cfg), tmp_path / "full")
    part = run_vectorized(prepare(cfg), tmp_path / "cut", stop_after=1)
    assert part.done == 1
    resumed = run_vectorized(prepare(cfg), tmp_path / "cut")
    assert resumed.done == 3
    assert leaves_max_diff(full.params, resumed.params) == 0.0
    strip = lambda p: [{k: v for k, v in json.loads(x).items() if k != "round_seconds"} for x in p.read_text().splitlines()]  # noqa: E731
    assert strip(tmp_path / "full" / "metrics.jsonl") == strip(tmp_path / "cut" / "metrics.jsonl")
    return full
