"""Local (per-user) d_chi-privacy mechanisms for tokens and their embeddings.

Metric differential privacy (d_chi-privacy; Qu et al. 2021, eq. 2; Feyisetan et al. 2020): a
mechanism M is eta·d_chi private when, for every two inputs x, x' and every output y,

    P[M(x) = y] <= exp(eta · d(x, x')) · P[M(x') = y],

here with d the Euclidean distance between the inputs' embeddings, d(x, x') = ||phi(x) - phi(x')||.

* :func:`sample_noise`: N in R^n with density proportional to exp(-eta·||N||), drawn as a radius
  r ~ Gamma(shape=n, scale=1/eta) times a direction uniform on the unit sphere (Qu et al. sec. 3.2.3).
* :func:`privatize_representations` (M_rep, Qu et al. eq. 3): x + N;
  :func:`privatize_stream_representations` the same for many sequences with per-stream keys.
* :func:`privatize_tokens` (M_txt, Qu et al. eq. 4): the vocabulary token nearest (Euclidean) to
  phi(w) + N. Post-processing of M_rep, so the same eta·d_chi guarantee.
* :func:`privatize_tokens_jit`: M_txt inside a jitted computation (the BERT tasks' user-side
  privatization, :mod:`fedpriv.tasks.local_inputs`), the same draws as :func:`privatize_tokens`.
* :func:`vickrey_tokens`: the Vickrey mechanism of Xu et al. 2021 (PrivateNLP 2021, "On a
  Utilitarian Approach to Privacy Preserving Text Generation", Algorithm 1): the first or the second
  nearest token to phi(w) + N, chosen at random with the probability of Algorithm 1, step 6; and
  a k-neighbour generalization (see :func:`vickrey_select`). Also post-processing of M_rep (the
  choice depends only on the noised vector and the table), so the same eta·d_chi guarantee.
* :func:`privatize_text`: a sequence, token by token. For sequences the guarantee composes over
  positions: eta·d_chi with d(x, x') = sum_i ||phi(x_i) - phi(x'_i)|| (Qu et al. sec. 3.2.5).

Randomness: every function takes a ``jax.random`` key (``jax.random.key(seed)``, a legacy
``PRNGKey``, or an int seed) and is deterministic given it. Position i of a batch of n draws from
its own key, ``fold_in(key, i)`` (split three ways: Gamma radius, Gaussian direction, Vickrey
choice), so what position i gets depends only on ``(key, i)`` and its input, never on batch or
chunk sizes; and M_txt, Vickrey and M_rep called with the same key add the very same noise.
:func:`privatize_streams` batches many sequences: position j of stream s uses
``fold_in(fold_in(key, s), j)``, which is what ``privatize_tokens(fold_in(key, s), ...)`` uses.

Nearest neighbours are exact: a shortlist of the ``k + 8`` best candidates by the expanded form
``||b||^2 - 2 a·b`` (one matrix product per chunk of queries), re-ranked by differences to the
shortlist's best, ``(||b_j||^2 - ||b_1||^2) - 2 a·(b_j - b_1)``, which stays accurate in float32
even when the noise is huge. Queries go in chunks sized so one chunk's score matrix stays under
``CHUNK_BYTES``; a short last chunk is padded to a power of four (at least 256 rows), and noise
is drawn in fixed chunks of 4,096 positions, so few programs compile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from typing import Any, Literal, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.errors import PrivacyParameterError

Mechanism = Literal["rep", "txt", "vickrey"]
MECHANISMS: tuple[str, ...] = ("rep", "txt", "vickrey")

#: Bound on one chunk's (queries x allowed tokens) float32 score matrix.
CHUNK_BYTES = 64 << 20
#: Extra shortlisted candidates re-ranked exactly beyond the k needed.
SHORTLIST_EXTRA = 8
_MIN_ROWS = 16
_MAX_ROWS = 4096


def guarantee_note(eta: float, mechanism: str = "txt") -> str:
    """The statement of what ``mechanism`` at ``eta`` guarantees, for sidecars and logs."""
    what = {
        "rep": "M_rep (x + N, N with density ∝ exp(-eta·||N||))",
        "txt": "M_txt (nearest token to phi(w) + N)",
        "vickrey": "Vickrey (first or second nearest token to phi(w) + N; Xu et al. 2021)",
    }.get(mechanism, mechanism)
    return (
        f"{what} at eta = {eta:g}: eta·d_chi per token, d_chi the Euclidean distance between embeddings "
        f"(P[M(x)=y] <= exp(eta·||phi(x)-phi(x')||)·P[M(x')=y]); for a sequence, the sum over positions of the "
        f"Euclidean distances (Hamming-like composition): d(x, x') = sum_i ||phi(x_i) - phi(x'_i)||. "
        f"Words outside the embedding vocabulary all take the one OOV point, so they are indistinguishable from each other."
    )


# ---- parameter checks -----------------------------------------------------------------------------
def check_eta(eta: float) -> float:
    try:
        e = float(eta)
    except (TypeError, ValueError):
        raise PrivacyParameterError(f"eta must be a number > 0, got {eta!r}") from None
    if not (math.isfinite(e) and e > 0):
        raise PrivacyParameterError(f"eta must be finite and > 0 (smaller eta = more noise), got {eta!r}")
    return e


def check_t(t: float) -> float:
    try:
        v = float(t)
    except (TypeError, ValueError):
        raise PrivacyParameterError(f"t must be a number in [0, 1], got {t!r}") from None
    if not (0.0 <= v <= 1.0):
        raise PrivacyParameterError(f"t (the Vickrey tuning parameter) must be in [0, 1], got {t!r}")
    return v


def check_mechanism(mechanism: str) -> str:
    if mechanism not in MECHANISMS:
        raise PrivacyParameterError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")
    return mechanism


# ---- tables ---------------------------------------------------------------------------------------
class TokenIndex:
    """An embedding table prepared for exact nearest-neighbour search: the float32 (V, d) table,
    the sorted ids that may be output, and device copies of their rows and squared norms. Build it
    once and pass it (or an EmbeddingSpace, which caches one) to every call on the same table."""

    def __init__(self, table: Any, allowed: Any = None):
        arr = np.asarray(table, dtype=np.float32)
        if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
            raise PrivacyParameterError(f"the embedding table must be 2-D (tokens, dim), got shape {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise PrivacyParameterError("the embedding table holds non-finite values")
        if allowed is None:
            ids = np.arange(arr.shape[0], dtype=np.int32)
        else:
            a = np.asarray(allowed)
            if a.dtype == bool:
                if a.shape != (arr.shape[0],):
                    raise PrivacyParameterError(f"allowed mask has shape {a.shape}, the table has {arr.shape[0]} rows")
                ids = np.flatnonzero(a).astype(np.int32)
            else:
                ids = np.unique(a.astype(np.int64)).astype(np.int32)
                if ids.size and (ids[0] < 0 or ids[-1] >= arr.shape[0]):
                    raise PrivacyParameterError(f"allowed ids must be in [0, {arr.shape[0]}), got {ids[0]}..{ids[-1]}")
        if ids.size == 0:
            raise PrivacyParameterError("no allowed output tokens")
        self.table = arr
        self.allowed = ids
        self.sub = jnp.asarray(arr[ids])
        self.sq = jnp.sum(self.sub * self.sub, axis=1)

    @property
    def dim(self) -> int:
        return int(self.table.shape[1])

    @property
    def rows(self) -> int:
        return int(self.table.shape[0])


def as_index(table: Any, allowed: Any = None) -> TokenIndex:
    """``table`` as a :class:`TokenIndex`: a TokenIndex, an EmbeddingSpace (its cached index, or
    its table with ``allowed`` when given), or a plain (V, d) array (every row allowed by default)."""
    if isinstance(table, TokenIndex):
        return table if allowed is None else TokenIndex(table.table, allowed)
    if hasattr(table, "index") and hasattr(table, "table"):
        return table.index() if allowed is None else TokenIndex(table.table, allowed)
    return TokenIndex(table, allowed)


def _check_ids(ids: Any, vocab_rows: int) -> np.ndarray:
    a = np.asarray(ids)
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise PrivacyParameterError(f"token ids must be integers, got dtype {a.dtype}")
    a = a.astype(np.int64)
    if a.size and (a.min() < 0 or a.max() >= vocab_rows):
        raise PrivacyParameterError(f"token ids must be in [0, {vocab_rows}), got {a.min()}..{a.max()}")
    return a


def chunk_rows(allowed_count: int, budget_bytes: int = CHUNK_BYTES) -> int:
    """Queries per chunk: the largest power of two (16..4096) whose float32 score matrix against
    ``allowed_count`` tokens fits ``budget_bytes``."""
    rows = max(1, budget_bytes // (4 * max(1, allowed_count)))
    p = 1 << (int(rows).bit_length() - 1)
    return int(min(_MAX_ROWS, max(_MIN_ROWS, p)))


def _bucket(n: int, cap: int) -> int:
    """n rounded up to a power of four (at least 256), capped at ``cap``: few program shapes."""
    b = 256
    while b < n:
        b *= 4
    return int(min(cap, b))


# ---- noise and per-position keys -----------------------------------------------------------------
_NOISE_STEP = 1 << 16
#: Positions per call of the key, radius, direction and uniform programs: one fixed shape, so each
#: compiles once per process (the Gamma sampler alone takes seconds to compile on CPU).
_KEY_CHUNK = 4096


def _key(key: Any) -> jax.Array:
    """A typed ``jax.random`` key from a key, a legacy uint32 ``PRNGKey`` or an int seed."""
    if isinstance(key, (int, np.integer)):
        return jax.random.key(int(key))
    arr = key if hasattr(key, "dtype") else jnp.asarray(key)
    if jax.dtypes.issubdtype(arr.dtype, jax.dtypes.prng_key):
        return arr
    return jax.random.wrap_key_data(jnp.asarray(arr, dtype=jnp.uint32))


@partial(jax.jit, static_argnums=(3,))
def _keys_at(key: jax.Array, streams: jax.Array, positions: jax.Array, nested: bool) -> jax.Array:
    """Each position's three sub-keys (radius, direction, Vickrey choice), shape (C, 3)."""
    if nested:
        pos_keys = jax.vmap(lambda s_, p_: jax.random.fold_in(jax.random.fold_in(key, s_), p_))(streams, positions)
    else:
        pos_keys = jax.vmap(lambda p_: jax.random.fold_in(key, p_))(positions)
    return jax.vmap(lambda k: jax.random.split(k, 3))(pos_keys)


@jax.jit
def _radii(keys: jax.Array, shape: jax.Array, eta: jax.Array) -> jax.Array:
    """r ~ Gamma(shape, scale 1/eta) from each position's first sub-key (``shape`` is traced, so
    one program serves every dimension)."""
    return jax.vmap(lambda k: jax.random.gamma(k[0], shape, dtype=jnp.float32))(keys) / eta


@partial(jax.jit, static_argnums=(1,))
def _directions(keys: jax.Array, dim: int) -> jax.Array:
    """u uniform on the unit sphere of R^dim (a normalized standard Gaussian) from the second sub-key."""

    def one(k: jax.Array) -> jax.Array:
        z = jax.random.normal(k[1], (dim,), jnp.float32)
        norm = jnp.linalg.norm(z)
        e1 = jnp.zeros((dim,), jnp.float32).at[0].set(1.0)
        return jnp.where(norm > 0, z / jnp.where(norm > 0, norm, 1.0), e1)  # norm 0 has probability 0

    return jax.vmap(one)(keys)


@jax.jit
def _choice_uniforms(keys: jax.Array) -> jax.Array:
    """The Vickrey choice's uniform in [0, 1) from the third sub-key."""
    return jax.vmap(lambda k: jax.random.uniform(k[2], (), jnp.float32))(keys)


def _chunk_keys(key: jax.Array, streams: np.ndarray | None, positions: np.ndarray, s: int) -> tuple[jax.Array, int]:
    m = min(_KEY_CHUNK, positions.size - s)
    pos = np.zeros(_KEY_CHUNK, np.uint32)
    pos[:m] = positions[s : s + m]
    st = np.zeros(_KEY_CHUNK, np.uint32)
    if streams is not None:
        st[:m] = streams[s : s + m]
    return _keys_at(key, jnp.asarray(st), jnp.asarray(pos), streams is not None), m


def _noise(key: jax.Array, streams: np.ndarray | None, positions: np.ndarray, dim: int, eta: float) -> np.ndarray:
    """Noise rows for the given positions (float32 (n, dim)): row j from ``fold_in(key, positions[j])``,
    or ``fold_in(fold_in(key, streams[j]), positions[j])`` with streams. Computed in fixed chunks
    (padding rows are computed and dropped: a row depends only on its own key)."""
    n = positions.size
    out = np.empty((n, dim), np.float32)
    shape, e = jnp.float32(dim), jnp.float32(eta)
    for s in range(0, n, _KEY_CHUNK):
        keys, m = _chunk_keys(key, streams, positions, s)
        r = np.asarray(_radii(keys, shape, e))[:m]
        u = np.asarray(_directions(keys, dim))[:m]
        out[s : s + m] = r[:, None] * u
    return out


def _uniforms(key: jax.Array, streams: np.ndarray | None, positions: np.ndarray) -> np.ndarray:
    """The Vickrey choice's uniform in [0, 1) for each position (the third sub-key of its key)."""
    n = positions.size
    out = np.empty(n, np.float32)
    for s in range(0, n, _KEY_CHUNK):
        keys, m = _chunk_keys(key, streams, positions, s)
        out[s : s + m] = np.asarray(_choice_uniforms(keys))[:m]
    return out


def _u32(x: Any, what: str) -> np.ndarray:
    a = np.asarray(x).reshape(-1)
    if a.size and (not np.issubdtype(a.dtype, np.integer) or a.min() < 0 or a.max() >= 2**32):
        raise PrivacyParameterError(f"{what} must be integers in [0, 2**32)")
    return a.astype(np.uint32)


def sample_noise(key: Any, shape_n: int | Sequence[int], dim: int, eta: float) -> np.ndarray:
    """Noise with density ∝ exp(-eta·||N||) in R^dim, of shape ``(*shape_n, dim)`` (float32).

    Each row is r·u with r ~ Gamma(shape=dim, scale=1/eta) and u uniform on the unit sphere (a
    normalized standard Gaussian vector); in polar coordinates the density ∝ exp(-eta r)·r^(dim-1),
    which is that Gamma. Adding it to an embedding (:func:`privatize_representations`) gives
    eta·d_chi privacy w.r.t. the Euclidean distance between embeddings (metric DP), per token:
    p(y | x) / p(y | x') = exp(-eta(||y-x|| - ||y-x'||)) <= exp(eta·||x - x'||). E[r] = dim/eta,
    Var[r] = dim/eta². For dim = 1 this is Laplace(0, 1/eta).

    Row i (in C order over ``shape_n``) draws from ``fold_in(key, i)``."""
    e = check_eta(eta)
    if int(dim) < 1:
        raise PrivacyParameterError(f"dim must be >= 1, got {dim}")
    shape = (int(shape_n),) if isinstance(shape_n, (int, np.integer)) else tuple(int(s) for s in shape_n)
    n = int(np.prod(shape)) if shape else 1
    return _noise(_key(key), None, np.arange(n, dtype=np.uint32), int(dim), e).reshape(shape + (int(dim),))


def privatize_representations(key: Any, x: Any, eta: float) -> np.ndarray:
    """M_rep (Qu et al. eq. 3): ``x + N`` for every row of ``x`` (shape (..., dim)), N from
    :func:`sample_noise` with the same key (row i uses ``fold_in(key, i)``). eta·d_chi private per
    row w.r.t. the Euclidean distance; a sequence of rows composes to the sum of the distances."""
    arr = np.asarray(x, dtype=np.float32)
    if arr.ndim < 1:
        raise PrivacyParameterError("x must have a last axis (the embedding dimension)")
    return arr + sample_noise(key, arr.shape[:-1], arr.shape[-1], eta)


def privatize_stream_representations(key: Any, streams: Any, positions: Any, ids: Any, table: Any, eta: float) -> np.ndarray:
    """M_rep of many sequences in one batch: row j is ``table[ids[j]] + N`` with N drawn from
    ``fold_in(fold_in(key, streams[j]), positions[j])``, the key :func:`privatize_streams` uses for
    the same position, so M_txt there is the nearest allowed token to this row. (n, dim) float32."""
    e = check_eta(eta)
    tab = np.asarray(table.table if hasattr(table, "table") else table, np.float32)
    a = _check_ids(ids, tab.shape[0]).reshape(-1)
    st, pos = _u32(streams, "streams"), _u32(positions, "positions")
    if not st.size == pos.size == a.size:
        raise PrivacyParameterError(f"ids, streams and positions must have the same length ({a.size}, {st.size}, {pos.size})")
    return tab[a] + _noise(_key(key), st, pos, tab.shape[1], e)


# ---- nearest neighbours ---------------------------------------------------------------------------
@partial(jax.jit, static_argnums=(3, 4))
def _knn(q: jax.Array, tab: jax.Array, sq: jax.Array, m: int, k: int) -> tuple[jax.Array, jax.Array]:
    """(positions in ``tab`` (Q, k), Euclidean distances (Q, k)), nearest first."""
    score = sq[None, :] - 2.0 * (q @ tab.T)
    _, short = jax.lax.top_k(-score, m)  # (Q, m) shortlist
    # The barrier keeps XLA from fusing the gathers below into the score computation (which
    # recomputed the whole score matrix per gathered element: 30x slower on CPU).
    short = jax.lax.optimization_barrier(short)
    cand = tab[short]  # (Q, m, d)
    base = cand[:, :1, :]
    delta = (sq[short] - sq[short[:, :1]]) - 2.0 * jnp.sum(q[:, None, :] * (cand - base), axis=-1)
    order = jnp.argsort(delta, axis=1, stable=True)[:, :k]
    pos = jnp.take_along_axis(short, order, axis=1)
    d1sq = jnp.sum((q - base[:, 0, :]) ** 2, axis=1)
    dsq = jnp.maximum(d1sq[:, None] + jnp.take_along_axis(delta, order, axis=1), 0.0)
    return pos, jnp.sqrt(dsq)


def nearest_tokens(points: Any, table: Any, allowed: Any = None, k: int = 1, chunk: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` nearest allowed tokens to each point, exactly (Euclidean): ``(ids, distances)``,
    each of shape ``points.shape[:-1] + (k,)``, nearest first. ``allowed`` defaults to the
    table's (an EmbeddingSpace's regular words) or every row of a plain array."""
    idx = as_index(table, allowed)
    pts = np.asarray(points, dtype=np.float32)
    if pts.ndim < 1 or pts.shape[-1] != idx.dim:
        raise PrivacyParameterError(f"points have dimension {pts.shape[-1] if pts.ndim else None}, the table {idx.dim}")
    return _nearest(pts, idx, int(k), chunk)


def _nearest(pts: np.ndarray, idx: TokenIndex, k: int, chunk: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    if not 1 <= k <= idx.allowed.size:
        raise PrivacyParameterError(f"k must be between 1 and the {idx.allowed.size} allowed tokens, got {k}")
    flat = pts.reshape(-1, idx.dim)
    m = min(idx.allowed.size, k + SHORTLIST_EXTRA)
    rows = chunk or chunk_rows(idx.allowed.size)
    ids = np.empty((flat.shape[0], k), np.int32)
    dist = np.empty((flat.shape[0], k), np.float32)
    for s in range(0, flat.shape[0], rows):
        q = flat[s : s + rows]
        b = _bucket(q.shape[0], rows)
        qp = np.zeros((b, idx.dim), np.float32)
        qp[: q.shape[0]] = q
        pos, d = _knn(jnp.asarray(qp), idx.sub, idx.sq, m, k)
        ids[s : s + q.shape[0]] = idx.allowed[np.asarray(pos)[: q.shape[0]]]
        dist[s : s + q.shape[0]] = np.asarray(d)[: q.shape[0]]
    lead = pts.shape[:-1]
    return ids.reshape(lead + (k,)), dist.reshape(lead + (k,))


# ---- the Vickrey choice ---------------------------------------------------------------------------
def vickrey_weights(t: float, k: int) -> np.ndarray:
    """Rank weights c_1..c_k of the k-neighbour rule: c_1 = 1 - t, c_r = t/(k-1) for r >= 2."""
    return np.array([1.0 - t] + [t / (k - 1)] * (k - 1), np.float64)


def vickrey_probabilities(dists: Any, t: float) -> np.ndarray:
    """Selection probabilities over the k nearest candidates (distances ascending, shape (..., k)).

    The rule: P(r) ∝ c_r · d_1/d_r with c_1 = 1 - t and c_r = t/(k-1) for r >= 2 (inverse-distance
    weights with rank weights; a ratio d_1/d_r with d_r = 0 counts as 1). For k = 2 this is exactly
    Xu et al. 2021, Algorithm 1, step 6:
    P(w_2) = t·d_1 / (t·d_1 + (1-t)·d_2), P(w_1) = (1-t)·d_2 / (t·d_1 + (1-t)·d_2).
    t = 0 always gives the nearest token (M_txt). When every weight is 0 (t = 1 and d_1 = 0, a
    probability-zero event) the nearest token is returned."""
    d = np.asarray(dists, dtype=np.float64)
    k = d.shape[-1]
    c = vickrey_weights(check_t(t), k)
    ratio = np.where(d > 0, d[..., :1] / np.where(d > 0, d, 1.0), 1.0)
    q = c * ratio
    total = q.sum(axis=-1, keepdims=True)
    first = np.zeros_like(q)
    first[..., 0] = 1.0
    return np.where(total > 0, q / np.where(total > 0, total, 1.0), first)


@jax.jit
def _choose(dists: jax.Array, c: jax.Array, u: jax.Array) -> jax.Array:
    ratio = jnp.where(dists > 0, dists[:, :1] / jnp.where(dists > 0, dists, 1.0), 1.0)
    q = c[None, :] * ratio
    total = jnp.sum(q, axis=1, keepdims=True)
    first = jnp.zeros_like(q).at[:, 0].set(1.0)
    p = jnp.where(total > 0, q / jnp.where(total > 0, total, 1.0), first)
    cdf = jnp.cumsum(p, axis=1)[:, :-1]
    return jnp.minimum(jnp.sum(u[:, None] >= cdf, axis=1), dists.shape[1] - 1)


def vickrey_select(key: Any, points: Any, table: Any, t: float, k: int = 2, allowed: Any = None) -> np.ndarray:
    """The Vickrey choice among the k nearest allowed tokens to each (already noised) point, with
    the probabilities of :func:`vickrey_probabilities`. Position i draws its uniform from
    ``fold_in(key, i)`` (the third of its three sub-keys), so ``vickrey_tokens(key, ids, ...)``
    equals ``vickrey_select(key, privatize_representations(key, table[ids], eta), ...)``.

    Candidates are the nearest tokens over all allowed ids, the input's own token included: that
    is what makes the choice post-processing of M_rep (it depends on the noised point only), and
    what makes t = 0 the Laplace mechanism M_txt, as Xu et al. state (sec. 2 and 4)."""
    tv = check_t(t)
    if int(k) < 2:
        raise PrivacyParameterError(f"the Vickrey mechanism needs k >= 2 candidates, got {k}")
    idx = as_index(table, allowed)
    pts = np.asarray(points, dtype=np.float32)
    if pts.ndim < 1 or pts.shape[-1] != idx.dim:
        raise PrivacyParameterError(f"points have dimension {pts.shape[-1] if pts.ndim else None}, the table {idx.dim}")
    flat = pts.reshape(-1, idx.dim)
    u = _uniforms(_key(key), None, np.arange(flat.shape[0], dtype=np.uint32))
    return _vickrey_choice(flat, idx, tv, int(k), u).reshape(pts.shape[:-1])


def _vickrey_choice(pts: np.ndarray, idx: TokenIndex, t: float, k: int, u: np.ndarray) -> np.ndarray:
    ids, dists = _nearest(pts, idx, k)
    c = jnp.asarray(vickrey_weights(t, k), jnp.float32)
    out = np.empty(ids.shape[0], np.int32)
    for s in range(0, ids.shape[0], _KEY_CHUNK):
        n = min(_KEY_CHUNK, ids.shape[0] - s)
        dp = np.ones((_KEY_CHUNK, k), np.float32)
        dp[:n] = dists[s : s + n]
        up = np.zeros(_KEY_CHUNK, np.float32)
        up[:n] = u[s : s + n]
        r = np.asarray(_choose(jnp.asarray(dp), c, jnp.asarray(up)))[:n]
        out[s : s + n] = ids[s : s + n][np.arange(n), r]
    return out


# ---- token mechanisms -----------------------------------------------------------------------------
def _token_mechanism(key: Any, ids: Any, table: Any, eta: float, allowed: Any, t: float | None, k: int, streams: Any = None, positions: Any = None) -> np.ndarray:
    e = check_eta(eta)
    idx = as_index(table, allowed)
    a = _check_ids(ids, idx.rows)
    kk = _key(key)
    flat = a.reshape(-1)
    pos = np.arange(flat.size, dtype=np.uint32) if positions is None else _u32(positions, "positions")
    st = None if streams is None else _u32(streams, "streams")
    if pos.size != flat.size or (st is not None and st.size != flat.size):
        raise PrivacyParameterError(f"ids, streams and positions must have the same length ({flat.size}, {None if st is None else st.size}, {pos.size})")
    out = np.empty(flat.size, np.int32)
    # Bound the noised-embedding buffer: a position's draw depends on its key only, not the chunk.
    for s in range(0, flat.size, _NOISE_STEP):
        part = flat[s : s + _NOISE_STEP]
        sp = None if st is None else st[s : s + part.size]
        pts = idx.table[part] + _noise(kk, sp, pos[s : s + part.size], idx.dim, e)
        if t is None:
            out[s : s + part.size] = _nearest(pts, idx, 1)[0][:, 0]
        else:
            out[s : s + part.size] = _vickrey_choice(pts, idx, t, k, _uniforms(kk, sp, pos[s : s + part.size]))
    return out.reshape(a.shape)


def privatize_tokens(key: Any, ids: Any, table: Any, eta: float, allowed: Any = None) -> np.ndarray:
    """M_txt (Qu et al. eq. 4; Feyisetan et al. 2020): each id w becomes the allowed token nearest
    (exact Euclidean) to ``table[w] + N``, N from :func:`sample_noise` (position i: ``fold_in(key, i)``).
    Same shape as ``ids``, int32.

    ``table``: a (V, d) array, a :class:`TokenIndex`, or an
    :class:`~fedpriv.privacy.local.embeddings.EmbeddingSpace` whose ``allowed`` ids (its regular
    words, not pad/oov/bos/eos) are the default outputs; for a plain array every row is allowed
    unless ``allowed`` (ids or a boolean mask) says otherwise. Guarantee: eta·d_chi per token
    w.r.t. ||table[w] - table[w']|| (post-processing of M_rep)."""
    return _token_mechanism(key, ids, table, eta, allowed, None, 1)


def vickrey_tokens(key: Any, ids: Any, table: Any, eta: float, t: float, k: int = 2, allowed: Any = None) -> np.ndarray:
    """The Vickrey mechanism (Xu et al. 2021, Algorithm 1; k > 2: see :func:`vickrey_probabilities`).

    Noise as M_txt with the same key; then among the k nearest allowed tokens w_1, w_2, ... to the
    noised embedding, w_2 is output with probability t·d_1 / (t·d_1 + (1-t)·d_2) and w_1 otherwise
    (k = 2; Algorithm 1, step 6, with d_r = ||phi(w_r) - noised||). t = 0 is M_txt exactly, for the
    same key. Guarantee (their Theorem 1, and post-processing of M_rep): eta·d_chi per token."""
    tv = check_t(t)
    if int(k) < 2:
        raise PrivacyParameterError(f"the Vickrey mechanism needs k >= 2 candidates, got {k}")
    return _token_mechanism(key, ids, table, eta, allowed, tv, int(k))


def privatize_tokens_jit(keys: jax.Array, ids: jax.Array, table: jax.Array, allowed: jax.Array, eta: Any) -> jax.Array:
    """M_txt inside a traced computation (e.g. a training loss): ``ids`` (Q,) int32 -> (Q,) int32,
    each the allowed token nearest (exact Euclidean) to ``table[id] + N``. Position q draws its noise
    from the typed key ``keys[q]`` exactly as :func:`privatize_tokens` draws position i from
    ``fold_in(key, i)`` (split in three: radius, direction, unused), so with those keys both give
    the same tokens. ``table``: (V, d) float32; ``allowed``: (A,) int32 sorted output ids; ``eta``
    may be traced (check it with :func:`check_eta` before). Same eta·d_chi guarantee per token."""
    sub = jax.vmap(lambda k: jax.random.split(k, 3))(keys)
    dim = int(table.shape[1])
    noised = table[ids] + _radii(sub, jnp.float32(dim), jnp.asarray(eta, jnp.float32))[:, None] * _directions(sub, dim)
    tab = table[allowed]
    pos, _ = _knn(noised, tab, jnp.sum(tab * tab, axis=1), min(int(allowed.shape[0]), 1 + SHORTLIST_EXTRA), 1)
    return allowed[pos[:, 0]]


def privatize_streams(
    key: Any, streams: Any, positions: Any, ids: Any, table: Any, eta: float, mechanism: str = "txt", t: float | None = None, k: int = 2, allowed: Any = None
) -> np.ndarray:
    """Many independent sequences in one batch: id j (of stream ``streams[j]``, at position
    ``positions[j]`` in it) draws from ``fold_in(fold_in(key, streams[j]), positions[j])``. So the
    result for stream s equals ``privatize_tokens(fold_in(key, s), ids_of_s)`` (or
    ``vickrey_tokens``) whatever else is in the batch: corpora privatize user by user
    (stream = the user's index) in batches of many users. ``mechanism``: txt or vickrey."""
    check_mechanism(mechanism)
    if mechanism == "rep":
        raise PrivacyParameterError("mechanism 'rep' outputs embeddings, not tokens")
    if mechanism == "txt":
        if t is not None:
            raise PrivacyParameterError("t applies to the vickrey mechanism only")
        return _token_mechanism(key, ids, table, eta, allowed, None, 1, streams, positions)
    if int(k) < 2:
        raise PrivacyParameterError(f"the Vickrey mechanism needs k >= 2 candidates, got {k}")
    if t is None:
        raise PrivacyParameterError("the vickrey mechanism needs t in [0, 1]")
    return _token_mechanism(key, ids, table, eta, allowed, check_t(t), int(k), streams, positions)


# ---- sequences ------------------------------------------------------------------------------------
class WordLookup(Protocol):
    """What :func:`privatize_text` needs of a vocabulary: word -> id (unknown words -> the oov id)."""

    def id(self, word: str) -> int: ...


def _word_of(vocab: Any, i: int) -> str:
    if hasattr(vocab, "word"):
        return vocab.word(i)
    return vocab.decode([i])[0]


def _default_allowed(vocab: Any, table: Any, allowed: Any) -> Any:
    if allowed is not None:
        return allowed
    if hasattr(table, "allowed"):
        return table.allowed
    if hasattr(vocab, "allowed"):
        return vocab.allowed
    words = getattr(vocab, "words", None)
    if words is not None and hasattr(vocab, "oov"):  # a WordVocab: ids 1..K are the regular words
        return np.arange(1, len(words) + 1, dtype=np.int32)
    return None


def privatize_text(
    key: Any,
    words: Sequence[str],
    vocab: Any,
    table: Any,
    mechanism: str,
    eta: float,
    t: float = 0.0,
    k: int = 2,
    allowed: Any = None,
) -> tuple[list[str], str]:
    """Privatize a word sequence token by token: ``(new words, guarantee note)``.

    ``vocab`` maps words to ids (a :class:`~fedpriv.vocab.word.WordVocab`, whose unknown words go
    to its oov id, or an EmbeddingSpace); ``table`` holds one row per id. Outputs are allowed ids
    only (by default the regular words: never pad, oov, bos or eos). ``mechanism`` is ``txt`` or
    ``vickrey`` (``rep`` produces vectors, not words, and is refused). Guarantee: eta·d_chi per
    token; for a sequence, the sum over positions of the Euclidean distances (Hamming-like
    composition)."""
    check_mechanism(mechanism)
    if mechanism == "rep":
        raise PrivacyParameterError("mechanism 'rep' outputs embeddings, not words: use privatize_representations, or txt / vickrey for text")
    ids = np.array([vocab.id(w) for w in words], dtype=np.int64)
    allow = _default_allowed(vocab, table, allowed)
    if mechanism == "txt":
        out = privatize_tokens(key, ids, table, eta, allow)
    else:
        out = vickrey_tokens(key, ids, table, eta, t, k, allow)
    return [_word_of(vocab, int(i)) for i in out], guarantee_note(check_eta(eta), mechanism)


def check_text_mechanism(mechanism: str, eta: float, t: float | None, k: int) -> tuple[float, float | None]:
    """``(eta, t)`` for a mechanism that outputs words, or PrivacyParameterError (before any work):
    rep (vectors), eta <= 0 or not finite, t outside [0, 1], t without vickrey or vickrey without t,
    k < 2."""
    check_mechanism(mechanism)
    if mechanism == "rep":
        raise PrivacyParameterError(
            "mechanism 'rep' (M_rep) adds noise to embeddings and outputs vectors, not words: it cannot privatize a "
            "text corpus. Use 'txt' (nearest word to the noised embedding) or 'vickrey' (first or second nearest word)"
        )
    e = check_eta(eta)
    if mechanism == "txt":
        if t is not None:
            raise PrivacyParameterError("t is the Vickrey tuning parameter: use it with mechanism 'vickrey' (txt is t = 0)")
        return e, None
    if t is None:
        raise PrivacyParameterError("mechanism 'vickrey' needs t in [0, 1] (0 = txt; larger favours the second nearest word)")
    tv = check_t(t)
    if int(k) < 2:
        raise PrivacyParameterError(f"k must be >= 2 for the Vickrey mechanism, got {k}")
    return e, tv
