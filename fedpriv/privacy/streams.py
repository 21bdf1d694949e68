"""The named key streams: one per mechanism, so no two mechanisms ever draw the same key.

Every ``jax.random`` key a run draws is ``fold_in(root, stream.id)`` first (:func:`stream_key`),
then the stream's own indices, in the order :attr:`Stream.then` states (step, round, user,
token...). ``root`` is ``jax.random.key(seed)`` for a simulation (reproducible: anyone with the
seed recomputes every draw) or a secret key from the OS's CSPRNG (:func:`secret_root`) for
anything released (``fedpriv privatize``, ``fedpriv vocab build``, ``--secure-noise`` training).

Why the streams cannot meet (what ``tests/privacy/test_streams.py`` checks):

* For a fixed key k, threefry's ``fold_in(k, d)`` encrypts the counter ``(0, d)`` under k, a
  permutation of 64-bit blocks, so distinct ``d < 2**32`` give distinct keys. The first level of
  every stream is its one id, and the ids are distinct: two mechanisms' first-level keys differ.
* Below the first level each stream folds in only its own indices, so two keys of different
  streams are two outputs of the PRF under different keys, equal only by a 2**-64 accident. A
  collision needs the *same* path from the root, which distinct ids exclude.
* ``jax.random.split(k, n)[i] == fold_in(k, i)`` on this jax (threefry, partitionable): a split of
  the root is a first-level fold. So the ids 0 and 1 are the two halves of
  ``split(key(seed))`` that :mod:`fedpriv.training.loop` has always used (initial parameters; step
  keys), and no other stream may take them, nor any small integer a user, token or step index
  would reach. The older ids (0xC11E, 0xE4B1, 0x4015E) are kept so that every simulation's keys
  are unchanged; the privatization and correlated-noise streams are above 2**31, beyond any index of a run.

Ids are uint32. ``numpy`` generators (cohort and batch sampling, canary planting) draw from
``default_rng([seed, STREAM, ...])`` entropy lists, a separate name space (:data:`NUMPY_STREAMS`).

>>> [s.name for s in STREAMS][:3]
['init', 'step', 'client']
>>> import jax
>>> k = jax.random.key(0)
>>> bool((jax.random.key_data(jax.random.split(k)[1]) == jax.random.key_data(stream_key(0, STEP))).all())
True
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

#: Bits of a secret root key: a threefry key is two uint32 words.
SECRET_BITS = 64


@dataclass(frozen=True)
class Stream:
    """One mechanism's key stream: ``fold_in(root, id)``, then :attr:`then` in that order."""

    name: str
    id: int
    then: str
    where: str


INIT = Stream("init", 0, "nothing: the initial parameters", "training/loop.py init_key")
STEP = Stream(
    "step", 1, "step k; then 0 = DP-SGD noise (apply), j + 1 = micro-step j (clipping, dropout, per-micro-step noise)", "training/loop.py step_key_base; central/sgd.py, central/dpsgd.py"
)
CLIENT = Stream("client", 0xC11E, "round, then user, then local step (client-side DP-SGD noise, dropout)", "clients/update.py client_key; engines/cohort.py")
AUDIT_CANARY = Stream("audit_canary", 0xE4B1, "canary index (the canary client's random direction)", "memorization/empirical.py")
DP_FEDAVG = Stream("dp_fedavg", 0x4015E, "round (Gaussian noise of the round; adaptive clipping splits it)", "strategies/server.py")
PRIVATIZE = Stream("privatize", 0x8D15_0001, "user index (corpus order), then token index over its examples", "privacy/local/corpus.py")
LOCAL_INPUTS = Stream(
    "local_inputs", 0x8D15_0002, "the example's 64-bit content hash as two uint32 words, then piece position (user-side M_txt of BERT inputs)", "tasks/local_inputs.py LocalInputs.fixed"
)
CORRELATED_NOISE = Stream(
    "correlated_noise", 0xC04E_0001, "step (DP-SGD) or round (DP-FedAvg): the i.i.d. draw Z_t that C^-1 correlates (banded MF, BLT)", "central/dpsgd.py; strategies/server.py"
)

STREAMS: tuple[Stream, ...] = (INIT, STEP, CLIENT, AUDIT_CANARY, DP_FEDAVG, PRIVATIZE, LOCAL_INPUTS, CORRELATED_NOISE)

#: numpy ``default_rng([seed, id, ...])`` streams (their own name space, not jax keys).
NUMPY_STREAMS: dict[str, int] = {
    "cohort sampling (strategies/sampling.py)": 0x5A3B1E,
    "user-level DP-SGD batches (central/users.py)": 0x05E5,
    "client batch order (clients/data.py)": 0x5EED_C11E,
    "client-side DP-SGD step plans (clients/privacy.py)": 0x5EED_D95D,
    "canary planting (memorization/canaries.py)": 0xCA7A,
    "cyclic schedule of correlated noise (privacy/correlated.py)": 0xC1C1E,
    "cyclic Poisson sampling of amplified banded MF (privacy/amplified.py)": 0xC1C1E_9015,
    "audit canaries (memorization/empirical.py)": 0xE4B1,
    "random sampling test (memorization/random_sampling.py)": 0x5A3D,
    "extraction test (memorization/extraction.py)": 0xE8A7,
}


def root_key(seed: int | jax.Array) -> jax.Array:
    """The root of every stream: ``jax.random.key(seed)`` for an int seed (a simulation), or the
    key itself (e.g. :func:`secret_root`)."""
    if isinstance(seed, (int, np.integer)):
        return jax.random.key(int(seed))
    return seed


def stream_key(seed: int | jax.Array, stream: Stream) -> jax.Array:
    """``fold_in(root_key(seed), stream.id)``: the first key of ``stream``.

    >>> import jax
    >>> bool((jax.random.key_data(stream_key(3, CLIENT)) == jax.random.key_data(jax.random.fold_in(jax.random.key(3), 0xC11E))).all())
    True
    """
    return jax.random.fold_in(root_key(seed), stream.id)


def secret_root() -> jax.Array:
    """A root key of :data:`SECRET_BITS` bits from the OS's CSPRNG (``os.urandom``), never written
    anywhere: noise drawn from it cannot be recomputed by anyone.

    >>> import jax
    >>> bool((jax.random.key_data(secret_root()) != jax.random.key_data(secret_root())).any())
    True
    """
    return secret_root_from(os.urandom(SECRET_BITS // 8))


def secret_root_from(secret: bytes) -> jax.Array:
    """The root key of a secret of at least 8 bytes (its first 8 bytes, as two uint32 words)."""
    if len(secret) < SECRET_BITS // 8:
        raise ValueError(f"a secret root needs {SECRET_BITS // 8} bytes, got {len(secret)}")
    words = np.frombuffer(secret[: SECRET_BITS // 8], dtype="<u4").astype(np.uint32)
    return jax.random.wrap_key_data(jax.numpy.asarray(words))


def reachable_first_level(stream: Stream) -> frozenset[int]:
    """The first-level ``fold_in`` values ``stream`` can reach from the root: its id alone (every
    other index is folded in below it)."""
    return frozenset({stream.id})


def describe(stream: Stream) -> str:
    """``name: fold_in(root, 0x...) then ...``, for docs and records."""
    return f"{stream.name}: fold_in(root, {stream.id:#x}), then {stream.then}"


def _check_registry(streams: Any = STREAMS) -> None:
    ids = [s.id for s in streams]
    if len(set(ids)) != len(ids) or any(not 0 <= i < 2**32 for i in ids):
        raise AssertionError(f"stream ids must be distinct uint32: {ids}")


_check_registry()


#: Appended to every guarantee of a training run whose noise is reproducible from its seed.
SIMULATION_NOTE = "simulation: the noise is reproducible from the run's seed; a released model needs --secure-noise"
#: Appended instead under a correlated-noise mechanism (banded-mf, blt) without --secure-noise: besides
#: the seed, every checkpoint holds C^-1's streaming state, which is the noise itself (BLT's first
#: buffer is the running sum of all draws); --secure-noise leaves it out and replays the draws on
#: resume (docs/correlated_noise.md).
CORRELATED_SIMULATION_NOTE = ("simulation: the noise is reproducible from the run's seed, and every checkpoint holds the correlated "
                              "noise state (the noise itself); a released model needs --secure-noise, whose checkpoints hold no noise state")
#: Appended to the guarantee of a --secure-noise run (correlated noise included: its checkpoints hold no noise state).
SECURE_NOTE = "secure noise: every noise and sampling draw comes from a secret key that is not stored"


@dataclass(frozen=True)
class NoiseSeed:
    """Where a training run's noise and sampling come from.

    ``root``: the stream root (an int seed, or a secret key); ``entropy``: what numpy samplers seed
    with (``default_rng([entropy, ...])``): the run's seed for a simulation, the 128-bit secret
    for a secure run; ``fingerprint``: SHA-256 of the secret (None for a simulation), recorded so
    a resumed run can check that it was given the same secret (a 128-bit secret cannot be
    recovered from it).

    >>> s = NoiseSeed.simulation(7)
    >>> (s.root, s.entropy, s.secure)
    (7, 7, False)
    >>> t = NoiseSeed.from_secret(bytes(16), b"run a")
    >>> t.secure, len(t.fingerprint), t.entropy == NoiseSeed.from_secret(bytes(16), b"run b").entropy
    (True, 64, False)
    """

    root: Any
    entropy: int
    fingerprint: str | None = None
    #: SHA-256 of the run identity a secure seed is keyed to (None for a simulation): a resume checks it.
    run_digest: str | None = None
    #: The run's nonce (hex; part of the run identity), recorded so that a resume keys to it again.
    nonce: str | None = None

    @property
    def secure(self) -> bool:
        return self.fingerprint is not None

    @staticmethod
    def simulation(seed: int) -> "NoiseSeed":
        return NoiseSeed(int(seed), int(seed))

    @staticmethod
    def from_secret(secret: bytes, run: bytes = b"", nonce: str | None = None) -> "NoiseSeed":
        """A secure noise seed from a secret of at least 16 bytes (128 bits) for the run ``run``
        (what tells runs apart: :func:`fedpriv.training.noise.run_identity` and the run's
        ``nonce``, kept for the record). Root and entropy come from HMAC-SHA256(secret, run), so
        every bit of the secret counts, and two runs under one secret (two seeds, two grid cells,
        two tuning trials, two starts of one config) draw independent noise: with shared noise,
        two released models' difference would cancel it. The root is 64 bits (a threefry key),
        the numpy entropy 128; ``fingerprint`` is the secret's, for the resume check."""
        import hashlib
        import hmac

        if len(secret) < 16:
            raise ValueError(f"a noise secret needs at least 16 bytes (128 bits), got {len(secret)}")
        key = hmac.new(secret, b"fedpriv-run-noise:" + run, hashlib.sha256).digest()
        return NoiseSeed(secret_root_from(key), int.from_bytes(key[8:24], "little"), hashlib.sha256(b"fedpriv-noise-secret:" + secret).hexdigest(),
                         hashlib.sha256(run).hexdigest(), nonce)

    def note(self, correlated: bool = False) -> str:
        """The line every guarantee of the run carries (:data:`SIMULATION_NOTE` or :data:`SECURE_NOTE`;
        :data:`CORRELATED_SIMULATION_NOTE` for a correlated-noise mechanism)."""
        if self.secure:
            return SECURE_NOTE
        return CORRELATED_SIMULATION_NOTE if correlated else SIMULATION_NOTE
