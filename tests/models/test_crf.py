"""Linear-chain CRF: log-likelihood and Viterbi against brute-force enumeration of all tag paths."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedpriv.models.crf import (
    NEG,
    allowed_transitions,
    constrain,
    crf_log_likelihood,
    crf_log_partition,
    viterbi_decode,
)

L, T = 5, 3

ll_fn = jax.jit(crf_log_likelihood)
logz_fn = jax.jit(crf_log_partition)
vit_fn = jax.jit(viterbi_decode)


def _random_crf(seed, L=L, T=T):
    r = np.random.default_rng(seed)
    em = r.normal(size=(L, T)).astype(np.float32)
    trans = r.normal(size=(T, T)).astype(np.float32)
    start = r.normal(size=T).astype(np.float32)
    end = r.normal(size=T).astype(np.float32)
    return em, trans, start, end


def _score64(em, path, trans, start, end):
    em, trans, start, end = (np.asarray(a, np.float64) for a in (em, trans, start, end))
    s = start[path[0]] + end[path[-1]] + sum(em[i, t] for i, t in enumerate(path))
    return s + sum(trans[a, b] for a, b in zip(path[:-1], path[1:]))


def _brute(em, n, trans, start, end, allowed=None):
    """All T^n paths: (log Z, {path: score}) in float64; ``allowed`` filters paths."""
    scores = {}
    for path in itertools.product(range(em.shape[1]), repeat=n):
        if allowed is not None and not allowed(path):
            continue
        scores[path] = _score64(em, path, trans, start, end)
    vals = np.array(list(scores.values()))
    logz = vals.max() + np.log(np.exp(vals - vals.max()).sum())
    return logz, scores


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_log_likelihood_equals_brute_force(seed, n):
    em, trans, start, end = _random_crf(seed)
    logz, scores = _brute(em, n, trans, start, end)
    assert float(logz_fn(em, n, trans, start, end)) == pytest.approx(logz, abs=1e-5)
    r = np.random.default_rng(seed + 100)
    for path in [tuple(r.integers(0, T, n)) for _ in range(4)]:
        tags = np.concatenate([path, r.integers(0, T, L - n)]).astype(np.int32)  # junk past the end
        ll = float(ll_fn(em, tags, n, trans, start, end))
        assert ll == pytest.approx(scores[path] - logz, abs=1e-5)
        mask = (np.arange(L) < n).astype(np.float32)
        assert float(ll_fn(em, tags, mask, trans, start, end)) == pytest.approx(ll, abs=1e-6)
    # probabilities of all paths sum to one
    total = sum(np.exp(float(ll_fn(em, np.array(p + (0,) * (L - n), np.int32), n, trans, start, end))) for p in scores)
    assert total == pytest.approx(1.0, abs=1e-4)


def test_padding_steps_do_not_matter():
    em, trans, start, end = _random_crf(7)
    tags = np.array([2, 0, 1, 1, 0], np.int32)
    ll = float(ll_fn(em, tags, 3, trans, start, end))
    em2 = em.copy()
    em2[3:] = 100.0 * np.random.default_rng(0).normal(size=(2, T))
    tags2 = tags.copy()
    tags2[3:] = [2, 2]
    assert float(ll_fn(em2, tags2, 3, trans, start, end)) == pytest.approx(ll, abs=1e-6)
    path, score = vit_fn(em, 3, trans, start, end)
    path2, score2 = vit_fn(em2, 3, trans, start, end)
    assert path.tolist() == path2.tolist() and float(score) == pytest.approx(float(score2), abs=1e-6)


def test_empty_example():
    em, trans, start, end = _random_crf(1)
    assert float(ll_fn(em, np.zeros(L, np.int32), 0, trans, start, end)) == 0.0
    path, score = vit_fn(em, 0, trans, start, end)
    assert path.tolist() == [0] * L and float(score) == 0.0


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n", [1, 2, 4, 5])
def test_viterbi_equals_brute_force_argmax(seed, n):
    em, trans, start, end = _random_crf(seed + 10)
    _, scores = _brute(em, n, trans, start, end)
    best = max(scores, key=scores.get)
    path, score = vit_fn(em, n, trans, start, end)
    assert path.dtype == jnp.int32
    assert tuple(path.tolist()[:n]) == best
    assert path.tolist()[n:] == [0] * (L - n)
    assert float(score) == pytest.approx(scores[best], abs=1e-5)


def test_batched_with_vmap_equals_one_at_a_time():
    em = np.stack([_random_crf(s)[0] for s in range(4)])
    _, trans, start, end = _random_crf(99)
    tags = np.random.default_rng(0).integers(0, T, (4, L)).astype(np.int32)
    lengths = np.array([5, 3, 1, 0], np.int32)
    lls = jax.jit(jax.vmap(crf_log_likelihood, in_axes=(0, 0, 0, None, None, None)))(em, tags, lengths, trans, start, end)
    paths, _ = jax.jit(jax.vmap(viterbi_decode, in_axes=(0, 0, None, None, None)))(em, lengths, trans, start, end)
    for i in range(4):
        assert float(lls[i]) == pytest.approx(float(ll_fn(em[i], tags[i], lengths[i], trans, start, end)), abs=1e-6)
        assert paths[i].tolist() == vit_fn(em[i], lengths[i], trans, start, end)[0].tolist()


BIO = ["O", "B-X", "I-X", "B-Y", "I-Y"]


def _bio_ok(path):
    prev = "O"
    for t in (BIO[i] for i in path):
        if t.startswith("I-") and prev[2:] != t[2:]:
            return False
        prev = t
    return True


def test_bio_constraints_table():
    allowed, start_ok, end_ok = allowed_transitions(BIO)
    ix = BIO.index
    assert not allowed[ix("O"), ix("I-X")] and not allowed[ix("B-Y"), ix("I-X")] and not allowed[ix("I-Y"), ix("I-X")]
    assert allowed[ix("B-X"), ix("I-X")] and allowed[ix("I-X"), ix("I-X")] and allowed[ix("I-X"), ix("B-Y")]
    assert allowed[ix("O"), ix("B-X")] and allowed[ix("I-Y"), ix("O")]
    assert start_ok.tolist() == [True, True, False, True, False] and end_ok.all()


def test_iobes_constraints_table():
    tags = ["O", "B-X", "I-X", "E-X", "S-X", "U-Y", "L-Y", "B-Y"]
    allowed, start_ok, end_ok = allowed_transitions(tags)
    ix = tags.index
    assert allowed[ix("B-X"), ix("I-X")] and allowed[ix("B-X"), ix("E-X")] and allowed[ix("I-X"), ix("E-X")]
    assert not allowed[ix("B-X"), ix("O")] and not allowed[ix("B-X"), ix("B-X")] and not allowed[ix("B-X"), ix("S-X")]
    assert not allowed[ix("O"), ix("I-X")] and not allowed[ix("O"), ix("E-X")] and not allowed[ix("E-X"), ix("I-X")]
    assert allowed[ix("E-X"), ix("B-X")] and allowed[ix("S-X"), ix("U-Y")] and allowed[ix("B-Y"), ix("L-Y")]
    assert not allowed[ix("B-X"), ix("L-Y")]
    assert [start_ok[ix(t)] for t in tags] == [True, True, False, False, True, True, False, True]
    assert [end_ok[ix(t)] for t in tags] == [True, False, False, True, True, True, True, False]


@pytest.mark.parametrize("seed", range(3))
def test_constrained_viterbi_is_best_allowed_path(seed):
    n, T5 = 4, len(BIO)
    em, trans, start, end = _random_crf(seed + 50, L=n, T=T5)
    em[:, 2] += 2.0  # make I-X attractive everywhere, so constraints bind
    ct, cs, ce = constrain(trans, start, end, *allowed_transitions(BIO))
    _, scores = _brute(em, n, trans, start, end, allowed=_bio_ok)
    best = max(scores, key=scores.get)
    assert not _bio_ok(vit_fn(em, n, trans, start, end)[0].tolist())  # the constraints do bind
    path, score = vit_fn(em, n, ct, cs, ce)
    assert tuple(path.tolist()) == best
    assert float(score) == pytest.approx(scores[best], abs=1e-4)


def test_gradients_finite_with_constraints():
    em, trans, start, end = _random_crf(3, L=4, T=len(BIO))
    allowed = allowed_transitions(BIO)

    def f(params):
        t, s, e = constrain(params["t"], params["s"], params["e"], *allowed)
        return crf_log_likelihood(params["em"], jnp.array([1, 2, 0, 3]), 4, t, s, e)

    g = jax.jit(jax.grad(f))({"t": trans, "s": start, "e": end, "em": em})
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(g))
    assert NEG < -1e3
