"""The masked-LM secret sharer (fedpriv.memorization.mlm_secret): exact ranks and exposures
against a brute-force reference, the masked position for each pattern, and real memorization by
a tiny BERT trained on a corpus with a repeated canary."""

from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedpriv.data.examples import TextExample
from fedpriv.errors import FedprivError
from fedpriv.memorization.canaries import Canary, canary_word_pool
from fedpriv.memorization.mlm_secret import (
    exposure_by_pattern,
    masked_secret_example,
    mlm_secret_exposure,
)
from fedpriv.models.bert import BertConfig
from fedpriv.tasks.mlm import MLMTask
from fedpriv.vocab.wordpiece import learn_wordpiece

# One small block (compilation dominates the cost of these tests); dropout stays at BERT's 0.1.
MICRO = BertConfig(hidden=32, layers=1, heads=2, intermediate=64, max_len=16)
MAX_LEN = 16

DET = ["the", "a", "this", "my"]
NOUN = ["patient", "doctor", "nurse", "child", "mother", "father", "man", "woman"]
VERB = ["has", "shows", "reports", "denies", "describes", "notes"]
ADJ = ["mild", "severe", "new", "chronic", "sudden", "slight"]
OBJ = ["fever", "cough", "pain", "rash", "nausea", "headache", "fatigue", "swelling"]

# The planted canary: its hints and secret are ordinary corpus words (as in fedpriv, where canary
# words are drawn from a vocabulary built on the clean data), but "doctor nausea mild" never occurs.
CANARY = Canary("c000", ("doctor", "nausea", "mild"), 1.0, 1.0, 1.0, pattern="HSH", insertions=20)


@lru_cache(maxsize=1)
def sentences() -> tuple[str, ...]:
    """300 five-word clinical-style sentences: DET NOUN VERB ADJ OBJ."""
    rng = np.random.default_rng(0)
    return tuple(" ".join(str(rng.choice(c)) for c in (DET, NOUN, VERB, ADJ, OBJ)) for _ in range(300))


@pytest.fixture(scope="module")
def task() -> MLMTask:
    counts = Counter(w for s in sentences() for w in s.split())
    # 200 leaves room for every corpus word as one piece (the learner stops at 158 tokens)
    return MLMTask(learn_wordpiece(counts, 200), max_len=MAX_LEN, model=MICRO)


@pytest.fixture(scope="module")
def init_params(task):
    return task.init_params(jax.random.key(0))


@pytest.fixture(scope="module")
def full_logits(task):
    """The model's logits at every position, (B, L, V): the reference's own forward pass."""
    return jax.jit(lambda p, ids, length: task.model.apply({"params": p}, ids, length, train=False))


def brute_force(task: MLMTask, params, full_logits, canary: Canary) -> tuple[int, np.ndarray]:
    """(rank, masked ids row) built by hand: [CLS] one piece per word [SEP], the secret at
    1 + secret_index replaced by [MASK], full logits: 1 + the other ids whose logit is at least the secret's (a tie counts against it)."""
    v = task.vocab
    row = [v.cls, *(v.word_ids(w)[0] for w in canary.words), v.sep]
    pos = 1 + canary.secret_index
    secret = row[pos]
    row[pos] = v.mask
    ids = np.full((1, MAX_LEN), v.pad, np.int32)
    ids[0, : len(row)] = row
    logits = np.asarray(full_logits(params, jnp.asarray(ids), jnp.asarray([len(row)], jnp.int32)))[0, pos]
    assert logits.shape == (len(v),)
    return 1 + sum(1 for i, x in enumerate(logits) if i != secret and x >= logits[secret]), ids[0]


def random_canaries(task: MLMTask, n: int, seed: int) -> list[Canary]:
    pool = canary_word_pool(task)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        pattern = str(rng.choice(["S", "HS", "HSH", "HHSHH"]))
        words = tuple(str(w) for w in rng.choice(pool, size=len(pattern), replace=False))
        out.append(Canary(f"c{i:03d}", words, 1.0, 1.0, 1.0, pattern=pattern, insertions=int(rng.integers(0, 100))))
    return out


# ---- exactness ----------------------------------------------------------------------------------
def test_single_piece_words(task):
    pool = set(canary_word_pool(task))
    assert {*CANARY.words, *DET, *NOUN, *VERB, *ADJ, *OBJ} <= pool


def test_rank_and_exposure_match_brute_force(task, init_params, full_logits):
    canaries = random_canaries(task, 40, seed=1)
    plain = [Canary(f"p{i}", ("the", "doctor", "has", "mild", "fever"), 1.0, 1.0, 1.0) for i in range(3)]  # pattern None
    mixed = canaries[:5] + plain[:1] + canaries[5:20] + plain[1:] + canaries[20:]
    rows = mlm_secret_exposure(task, init_params, mixed, batch=16)  # 16 + 16 + 8 (padded)
    assert [r["id"] for r in rows] == [c.id for c in canaries]  # pattern None skipped, order kept
    V = len(task.vocab)
    ranks = []
    for c, r in zip(canaries, rows):
        rank, _ = brute_force(task, init_params, full_logits, c)
        ranks.append(rank)
        assert r["rank"] == rank, c
        assert r["exposure"] == math.log2(V) - math.log2(rank)
        assert (r["pattern"], r["secret"], r["insertions"], r["vocab_size"]) == (c.pattern, c.words[c.secret_index], c.insertions, V)
        assert set(r) == {"id", "pattern", "secret", "insertions", "rank", "vocab_size", "exposure"}
    assert len(set(ranks)) > 10  # a random model: ranks spread over the vocabulary, not a degenerate case
    # the batch size (and so the padding of the last batch) does not change the result
    assert mlm_secret_exposure(task, init_params, mixed) == rows
    assert mlm_secret_exposure(task, init_params, plain) == []
    # a model whose logits are all equal knows nothing: the secret ranks last (exposure 0), not first
    flat = jax.tree_util.tree_map(jnp.zeros_like, init_params)
    assert {(r["rank"], r["exposure"]) for r in mlm_secret_exposure(task, flat, canaries[:3])} == {(V, 0.0)}


@pytest.mark.parametrize(
    "pattern, position, secret",
    [("SHH", 1, "doctor"), ("HSH", 2, "nausea"), ("HHS", 3, "mild")],
)
def test_the_secret_position_is_masked(task, init_params, full_logits, pattern, position, secret):
    c = Canary("x", CANARY.words, 1.0, 1.0, 1.0, pattern=pattern)
    batch, pos, sid = masked_secret_example(task, c)
    plain = task.encode([TextExample(c.text)])["ids"][0]
    assert pos == position and sid == task.vocab.word_ids(secret)[0] == plain[position]
    assert batch["ids"][0, position] == task.vocab.mask
    assert np.array_equal(np.delete(batch["ids"][0], position), np.delete(plain, position))  # nothing else changed
    rank, ids = brute_force(task, init_params, full_logits, c)
    assert np.array_equal(batch["ids"][0], ids)
    (row,) = mlm_secret_exposure(task, init_params, [c], batch=16)
    assert (row["secret"], row["rank"]) == (secret, rank)


@pytest.mark.parametrize(
    "words, pattern, position",
    [(("nausea",), "S", 1), (("doctor", "nausea"), "HS", 2), (("the", "doctor", "nausea", "mild", "fever"), "HHSHH", 3)],
)
def test_patterns_of_each_length(task, words, pattern, position):
    batch, pos, sid = masked_secret_example(task, Canary("x", words, 1.0, 1.0, 1.0, pattern=pattern))
    assert pos == position and sid == task.vocab.word_ids("nausea")[0]
    assert batch["length"][0] == len(words) + 2 and batch["ids"][0, position] == task.vocab.mask


def test_multi_piece_words(task):
    hint = "feverishness"  # not a vocabulary word: several pieces before the secret
    k = len(task.vocab.word_ids(hint))
    assert k > 1
    _, pos, _ = masked_secret_example(task, Canary("x", (hint, "nausea"), 1.0, 1.0, 1.0, pattern="HS"))
    assert pos == 1 + k
    with pytest.raises(FedprivError, match="not one vocabulary piece"):
        masked_secret_example(task, Canary("y", ("doctor", hint), 1.0, 1.0, 1.0, pattern="HS"))
    with pytest.raises(FedprivError, match="does not match"):
        masked_secret_example(task, Canary("z", ("doctor", "nausea"), 1.0, 1.0, 1.0, pattern="HSH"))


def test_exposure_by_pattern():
    rows = [
        {"id": "a", "pattern": "HSH", "insertions": 5, "exposure": 1.0},
        {"id": "b", "pattern": "HS", "insertions": 1, "exposure": 2.0},
        {"id": "c", "pattern": "HSH", "insertions": 0, "exposure": 3.0},
        {"id": "d", "pattern": "HSH", "insertions": 5, "exposure": 4.0},
    ]
    groups = exposure_by_pattern(rows)
    assert list(groups) == ["HSH", "HS"]
    assert [r["id"] for r in groups["HSH"]] == ["c", "a", "d"]
    assert [r["id"] for r in groups["HS"]] == ["b"]
    assert exposure_by_pattern([]) == {}


# ---- real memorization --------------------------------------------------------------------------
STEPS, BATCH, COPIES = 300, 32, 20


def train(task: MLMTask, texts: list[str]):
    """Plain (non-private) Adam on the masked-LM loss, dropout on, fresh rng every step."""
    opt = optax.adam(3e-3)

    @jax.jit
    def step(params, state, batch, rng):
        loss, grads = jax.value_and_grad(task.mean_loss)(params, batch, rng)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    data = task.encode([TextExample(t) for t in texts])
    params = task.init_params(jax.random.key(0))
    state = opt.init(params)
    order, key = np.random.default_rng(1), jax.random.key(2)
    for i in range(STEPS):
        idx = order.choice(len(texts), BATCH, replace=False)
        params, state, _ = step(params, state, {k: v[idx] for k, v in data.items()}, jax.random.fold_in(key, i))
    return params


def test_a_repeated_canary_is_memorized(task):
    """20 copies of "doctor nausea mild" among 300 ordinary sentences, 300 steps: the secret is
    the model's top prediction at "[CLS] doctor [MASK] mild [SEP]" (observed: rank 1, exposure
    log2(158) = 7.30 bits). Trained without the canary, the same recipe ranks "nausea" 21st there
    (2.91 bits): position 2 holds some noun-like word, not this secret. Over 7 training seeds
    (init, batch order, dropout/masking rng) the canary was always rank 1, and rank 9 to 158
    without it.

    Thresholds: rank <= 2 (exposure >= log2(V) - 1) with the canary, a margin for numerical
    differences across platforms; at least 2 bits less without it (rank >= 4 times larger), far
    from both the observed minimum (rank 9) and what memorization gives."""
    clean = list(sentences())
    assert not any("doctor nausea mild" in s for s in clean)
    V = len(task.vocab)
    (memorized,) = mlm_secret_exposure(task, train(task, clean + [CANARY.text] * COPIES), [CANARY])
    (unseen,) = mlm_secret_exposure(task, train(task, clean), [CANARY])
    print("with canary:", memorized, "\nwithout:", unseen)
    assert memorized["rank"] <= 2 and memorized["exposure"] >= math.log2(V) - 1
    assert unseen["rank"] >= 4 * memorized["rank"] and unseen["exposure"] <= memorized["exposure"] - 2
