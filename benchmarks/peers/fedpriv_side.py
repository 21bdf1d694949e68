"""fedpriv's side of the peer benchmarks (runs in the project venv): the same models, batches and
DP-SGD steps as ``benchmarks/dpsgd_step.py``, plus the export of initial weights and data for a
peer (an .npz of plain arrays, read by the peer scripts with NumPy only).

Weight layout exported (``name`` -> array, fedpriv's own layout; the peers transpose as needed):

* NWP LSTM: ``embed`` (V, E), ``lstm_wi`` (E, 4H), ``lstm_wh`` (H, 4H), ``lstm_b`` (4H,) with
  gates i, f, g, o (the Keras and PyTorch order), ``projection_kernel`` (H, P), ``projection_bias``,
  ``output_kernel`` (P, V), ``output_bias``. Data: ``ids`` (B, L + 1); inputs ids[:, :-1], targets
  ids[:, 1:], id 0 = padding (no loss). Loss of an example: mean cross-entropy over its non-pad
  targets; the batch loss is the mean over examples.
* BERT-small MLM: every Flax leaf under its '/'-joined path; data: the masked ``inputs`` (B, L),
  ``length`` (B,), ``positions``/``targets``/``weights`` (B, P) of ONE fixed masking (the
  equivalence run uses the same masking at every step, dropout 0).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from fedpriv.privacy.clipping import fast_clipped_sum, reference_clipped_sum, supports_fast  # noqa: E402
from fedpriv.privacy.aggregate import noise_and_normalize  # noqa: E402

C, SIGMA, ADAM_LR = 1.0, 1.0, 1e-3
EQUIV_KEY = 7


def nwp(batch: int):
    from dpsgd_step import nwp_setup

    task, data, desc = nwp_setup(batch)
    return task, data, desc


def bert(batch: int, max_len: int = 128, dropout: float | None = None):
    from collections import Counter

    from fedpriv.data.conll import iter_sentences
    from fedpriv.data.examples import TextExample
    from fedpriv.tasks.mlm import MLMTask
    from fedpriv.vocab.wordpiece import learn_wordpiece

    sents = [s for _, s in iter_sentences(ROOT / "tests/data/ncbi-disease/train.tsv")]
    tok = learn_wordpiece(Counter(w.lower() for s in sents for w in s.tokens), 8000)
    task = MLMTask(tok, max_len=max_len, model="small", lowercase=True, dropout=dropout)
    texts, buf = [], []
    for s in sents:  # as benchmarks/dpsgd_step.py: pack sentences into examples of about max_len pieces
        buf.extend(s.tokens)
        if len(buf) > max_len * 0.6:
            texts.append(TextExample(" ".join(buf)))
            buf = []
    desc = f"BERT-small (4 layers, hidden 256, 4 heads, FFN 1024) MLM, WordPiece {len(task.vocab):,}, length {max_len}"
    return task, task.encode(texts[:batch]), desc


def flat(params) -> dict[str, np.ndarray]:
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        out["/".join(str(getattr(k, "key", k)) for k in path)] = np.asarray(leaf, np.float32)
    return out


def export_nwp(task, params, batch, path: Path) -> None:
    p = params
    arrays = {
        "embed": p["embed"]["embedding"], "lstm_wi": p["lstm"]["wi"], "lstm_wh": p["lstm"]["wh"], "lstm_b": p["lstm"]["b"],
        "projection_kernel": p["projection"]["kernel"], "projection_bias": p["projection"]["bias"],
        "output_kernel": p["output"]["kernel"], "output_bias": p["output"]["bias"],
    }
    np.savez(path, **{k: np.asarray(v, np.float32) for k, v in arrays.items()}, ids=np.asarray(batch["ids"], np.int64))


def export_bert(task, params, batch, path: Path) -> dict:
    m = task.mask_batch(jax.random.key(EQUIV_KEY), {k: jnp.asarray(v) for k, v in batch.items()})
    c = task.cfg
    data = {
        "inputs": np.asarray(m["inputs"], np.int64), "length": np.asarray(batch["length"], np.int64),
        "positions": np.asarray(m["positions"], np.int64), "targets": np.asarray(m["targets"], np.int64),
        "weights": np.asarray(m["weights"], np.float32),
        "cfg": np.asarray([c.vocab_size, c.hidden, c.layers, c.heads, c.intermediate, c.max_len], np.int64),
    }
    np.savez(path, **{"param:" + k: v for k, v in flat(params).items()}, **data)
    return data


def dp_step(task, clip, C=C, sigma=SIGMA, tx=None):
    tx = tx or optax.adam(ADAM_LR)

    def step(params, opt, batch, key):
        s, _, losses = clip(task, params, batch, key, C)
        g = noise_and_normalize(s, jax.random.fold_in(key, 1), C, sigma, float(batch["mask"].shape[0]))
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt, jnp.mean(losses)

    return step


def sgd_step(task, tx=None):
    tx = tx or optax.adam(ADAM_LR)

    def step(params, opt, batch, key):
        loss, g = jax.value_and_grad(task.mean_loss)(params, batch, key, True)
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt, loss

    return step


class Timed:
    """The jitted steps of one model, each timed in blocks of ``n`` steps on demand."""

    def __init__(self, task, batch, variants: list[str]):
        self.task = task
        self.params = task.init_params(jax.random.key(0))
        self.batch = {k: jnp.asarray(v) for k, v in batch.items()}
        self.tx = optax.adam(ADAM_LR)
        self.opt = self.tx.init(self.params)
        fns = {"non-private": sgd_step(task, self.tx), "dp-reference (vmap)": dp_step(task, reference_clipped_sum, tx=self.tx)}
        ok, why = supports_fast(task, self.params, self.batch, jax.random.key(0))
        if ok:
            fns["dp-fast (ghost + book-keeping)"] = dp_step(task, fast_clipped_sum, tx=self.tx)
        self.fast_why = None if ok else why
        self.fns = {k: jax.jit(v) for k, v in fns.items() if k in variants or (k.startswith("dp-fast") and "dp-fast" in variants)}
        for fn in self.fns.values():  # compile and warm up
            for _ in range(2):
                jax.block_until_ready(fn(self.params, self.opt, self.batch, jax.random.key(1)))

    def time(self, name: str, n: int, seed: int = 0) -> list[float]:
        fn, out = self.fns[name], []
        for r in range(n):
            t = time.perf_counter()
            jax.block_until_ready(fn(self.params, self.opt, self.batch, jax.random.key(seed * 1000 + r)))
            out.append(time.perf_counter() - t)
        return out


def equivalence_losses(task, params, batch, k: int, lr: float, clip=None, key: int = EQUIV_KEY) -> list[float]:
    """Mean batch loss before each of ``k`` noise-free DP-SGD steps (clip C, sigma 0, plain SGD with
    learning rate ``lr``) and after the last: k + 1 numbers. The same key at every step (for MLM:
    the same masking, which the peer receives)."""
    clip = clip or reference_clipped_sum
    tx = optax.sgd(lr)
    step = jax.jit(dp_step(task, clip, C=C, sigma=0.0, tx=tx))
    b = {k_: jnp.asarray(v) for k_, v in batch.items()}
    opt = tx.init(params)
    rng = jax.random.key(key)
    losses = []
    for _ in range(k):
        params, opt, loss = step(params, opt, b, rng)
        losses.append(float(loss))
    losses.append(float(task.mean_loss(params, b, rng, True)))
    return losses
