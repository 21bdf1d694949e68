"""User-side privatization of a BERT task's input pieces (Qu et al. 2021, sec. 3.3 d and 3.4).

Setting (text-to-text privatization, their Fig. 1.d): the user holds the WordPiece tokenizer and
the token embedding table, and sends the service provider M_txt of every ordinary piece: the
ordinary piece nearest to its embedding plus noise with density ∝ exp(-eta·||N||)
(:func:`fedpriv.privacy.local.mechanisms.privatize_tokens_jit`). [CLS], [SEP], [PAD], [UNK],
[MASK] and ``[unusedN]`` are sent unchanged (an [UNK] still says that a word could not be spelled).
The guarantee is eta·d_chi per piece, d the Euclidean distance between the pieces' embeddings in
that table; for an example, the sum of those distances over its positions.

The table is the token embedding of the pretrained run the task starts from, and it is FROZEN:
:meth:`UserSide.user_side` puts the constant table in place of the parameter, so no trainer
(DP-SGD, FedAvg, DP-FedAvg) can change it; the parameter leaf still exists in the tree but is
never read (its gradient is exactly 0; DP noise added to it changes nothing). A table that
training could move would change what eta means (Qu et al. sec. 3.4 observed it drifting towards
embeddings that noise cannot move).

Draws:

* :meth:`LocalInputs.fixed` (fine-tuning on user data, and evaluation): piece j of an example uses
  ``fold_in(fold_in(fold_in(root, lo), hi), j)``, ``root`` the ``local_inputs`` stream of
  :mod:`fedpriv.privacy.streams` (``fold_in(key(seed), LOCAL_INPUTS.id)``) and (lo, hi) the two
  words of the example's 64-bit content hash (:func:`fedpriv.tasks.mlm.row_seed`): each example is
  privatized once and every step sees that same privatized text (one release per example, which
  is what the guarantee covers). Equal to
  ``privatize_streams(fold_in(root, lo), streams=hi, positions=j, ...)`` on the host.
* :meth:`LocalInputs.fresh` (privacy-adaptive pretraining on public text): a new draw at every step
  from the step's key (data augmentation, "on the fly" as in the paper; public text costs no privacy).
* :meth:`LocalInputs.draws`: n independent draws of given pieces (Prob MLM's set of perturbed tokens).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.errors import FedprivError
from fedpriv.jsonio import write_json_atomic
from fedpriv.privacy.local.mechanisms import check_eta, guarantee_note, privatize_tokens_jit
from fedpriv.privacy.streams import LOCAL_INPUTS, stream_key
from fedpriv.rundir import PRIVATIZE

#: Key streams of the fresh draws (the MLM task uses 0 for masking and 1 for dropout).
INPUT_STREAM, SET_STREAM = 2, 3
#: Targets of privacy-adaptive masked-LM pretraining (Qu et al. 2021, sec. 3.4, eqs. 5-7).
MLM_TARGETS = ("vanilla", "prob", "denoising")


def token_table(params: Any) -> np.ndarray:
    """The (V, d) token embedding of BERT parameters (a whole model or an encoder subtree)."""
    enc = params["encoder"] if "encoder" in params else params
    try:
        return np.asarray(enc["token_embed"]["embedding"], np.float32)
    except (KeyError, TypeError):
        raise FedprivError("the pretrained parameters hold no BERT token embedding (encoder/token_embed)") from None


def with_token_table(params: Any, table: np.ndarray) -> Any:
    """``params`` with the encoder's token embedding replaced by ``table``, a constant of the traced
    program: its gradient is exactly 0 and no update to the parameter leaf is ever read."""
    enc = params["encoder"]
    return {**params, "encoder": {**enc, "token_embed": {**enc["token_embed"], "embedding": jnp.asarray(table)}}}


class LocalInputs:
    """M_txt of a BERT task's ordinary pieces in a frozen embedding table (see the module docstring).

    ``table``: (V, d) token embeddings; ``ordinary``: the ids that may be privatized and output
    (the tokenizer's non-special pieces); ``eta`` > 0; ``seed``: the users' key for the fixed draws."""

    def __init__(self, table: Any, ordinary: Any, eta: float, seed: int = 0):
        self.eta = check_eta(eta)
        self.seed = int(seed)
        tab = np.asarray(table, np.float32)
        ids = np.unique(np.asarray(ordinary, np.int64))
        if tab.ndim != 2 or not ids.size or ids[0] < 0 or ids[-1] >= tab.shape[0]:
            raise FedprivError(f"user-side privatization needs a (V, d) table and ordinary ids in [0, V); got {tab.shape}")
        # numpy, not jax arrays: the object may be built while a loss is being traced, and numpy
        # arrays become constants of whatever program uses them.
        self.table = tab
        self.allowed = ids.astype(np.int32)
        self.ordinary = np.zeros(tab.shape[0], bool)
        self.ordinary[self.allowed] = True

    def _apply(self, keys: jax.Array, ids: jax.Array) -> jax.Array:
        """``ids`` of any shape with one key per element: ordinary pieces privatized, others kept."""
        flat = ids.reshape(-1)
        out = privatize_tokens_jit(keys.reshape(-1), flat, jnp.asarray(self.table), jnp.asarray(self.allowed), self.eta)
        return jnp.where(jnp.asarray(self.ordinary)[flat], out, flat).reshape(ids.shape)

    def fixed(self, ids: jax.Array, seeds: jax.Array) -> jax.Array:
        """(B, L) ids privatized once per example: piece j of row b from
        ``fold_in(fold_in(fold_in(root, seeds[b, 0]), seeds[b, 1]), j)`` (``root`` the
        ``local_inputs`` stream of the user key; ``seeds`` (B, 2), see the module docstring)."""
        ids = jnp.asarray(ids)
        pos = jnp.arange(ids.shape[1], dtype=jnp.uint32)
        root = stream_key(self.seed, LOCAL_INPUTS)
        words = jnp.asarray(seeds).astype(jnp.uint32).reshape(ids.shape[0], 2)
        rows = jax.vmap(lambda w: jax.random.fold_in(jax.random.fold_in(root, w[0]), w[1]))(words)
        keys = jax.vmap(lambda k: jax.vmap(lambda p: jax.random.fold_in(k, p))(pos))(rows)
        return self._apply(keys, ids)

    def fresh(self, example_keys: jax.Array, ids: jax.Array) -> jax.Array:
        """(B, L) ids privatized with new noise: piece j of row b from ``fold_in(example_keys[b], j)``."""
        ids = jnp.asarray(ids)
        pos = jnp.arange(ids.shape[1], dtype=jnp.uint32)
        keys = jax.vmap(lambda k: jax.vmap(lambda p: jax.random.fold_in(k, p))(pos))(example_keys)
        return self._apply(keys, ids)

    def draws(self, example_keys: jax.Array, ids: jax.Array, n: int) -> jax.Array:
        """(B, P, n): n independent privatizations of each of the (B, P) pieces (draw r of slot p of
        row b from ``fold_in(fold_in(example_keys[b], p), r)``)."""
        ids = jnp.asarray(ids)
        slots, reps = jnp.arange(ids.shape[1], dtype=jnp.uint32), jnp.arange(int(n), dtype=jnp.uint32)
        keys = jax.vmap(lambda k: jax.vmap(lambda p: jax.vmap(lambda r: jax.random.fold_in(jax.random.fold_in(k, p), r))(reps))(slots))(example_keys)
        return self._apply(keys, jnp.broadcast_to(ids[..., None], ids.shape + (int(n),)))

    def save_record(self, run_dir: str | os.PathLike[str], embeddings_from: Any, draws: str, **extra: Any) -> Path:
        """Write ``privatize.json`` into the run directory: this stage, its parameters and guarantee
        (the run summary carries it; the report's assumptions column states ``guarantee``)."""
        record = {
            "stage": "user-side privatization of the BERT task's input pieces (Qu et al. 2021)",
            "mechanism": "txt",
            "eta": self.eta,
            "seed": self.seed,
            "embeddings": f"token embeddings of {embeddings_from} (frozen)",
            "ordinary_pieces": int(self.allowed.size),
            "draws": draws,
            **extra,
            "guarantee": guarantee_note(self.eta, "txt") + " Special pieces ([CLS], [SEP], [PAD], [UNK], [MASK]) are sent unchanged.",
        }
        return write_json_atomic(Path(run_dir) / PRIVATIZE, record, indent=1)


class UserSide:
    """What the BERT tasks share for a user-side token embedding: ``privatize_eta`` /
    ``privatize_seed`` (:class:`LocalInputs`, built from ``self.pretrained`` on first use) and
    freezing the table (implied by privatization; ``freeze_token_embedding`` alone is the control
    without privatization). The task has ``pretrained`` and ``vocab`` (a PieceVocab)."""

    privatize_eta: float | None = None
    privatize_seed: int = 0
    freeze_token_embedding: bool = False
    _local: LocalInputs | None = None
    _frozen_table: np.ndarray | None = None

    def init_user_side(self, privatize_eta: float | None, privatize_seed: int, freeze_token_embedding: bool) -> None:
        """Check and keep the options (eta > 0: before any training)."""
        self.privatize_eta = None if privatize_eta is None else check_eta(privatize_eta)
        self.privatize_seed = int(privatize_seed)
        self.freeze_token_embedding = bool(freeze_token_embedding) or privatize_eta is not None
        self._local, self._frozen_table = None, None

    def _pretrained_table(self, option: str) -> np.ndarray:
        if getattr(self, "pretrained", None) is None:
            raise FedprivError(f"{option} needs task.options.pretrained: the user-side embedding table comes from the pretrained run")
        return token_table(self.pretrained)

    @property
    def local(self) -> LocalInputs | None:
        """The user-side privatization, or None without ``privatize_eta``."""
        if self._local is None and self.privatize_eta is not None:
            self._local = LocalInputs(self._pretrained_table("privatize_eta"), self.vocab.pool, self.privatize_eta, self.privatize_seed)
        return self._local

    def user_side(self, params: Any) -> Any:
        """``params`` with the frozen token table in place (unchanged when nothing is frozen)."""
        if not self.freeze_token_embedding:
            return params
        if self._frozen_table is None:
            self._frozen_table = self._pretrained_table("freeze_token_embedding")
        return with_token_table(params, self._frozen_table)

    @property
    def fast_clipping_unsupported(self) -> str | None:
        """Why ghost-norm clipping must not be used (None: it may): a frozen table still records norms."""
        return "the token embedding is frozen (privatize_eta or freeze_token_embedding)" if self.freeze_token_embedding else None
