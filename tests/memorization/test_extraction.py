"""Training-data extraction: edit distance, the three sets, greedy decoding against the full
model, and a tiny model that memorizes a repeated sentence."""

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedpriv.data.corpus import FederatedCorpus
from fedpriv.data.examples import TextExample
from fedpriv.data.sources import open_corpus
from fedpriv.errors import FedprivError
from fedpriv.memorization.canaries import Canary, Manifest
from fedpriv.memorization.extraction import edit_distance, extraction, extraction_sets, greedy_generate
from fedpriv.memorization.lm import NWPStepper
from fedpriv.tasks.nwp import NWPTask
from fedpriv.vocab.word import WordVocab

SECRET = "my uncle keeps forty golden ducats beneath the old oak tree"


@pytest.fixture(scope="module")
def shakespeare():
    return open_corpus("shakespeare")


def manifest_of(*texts: str) -> Manifest:
    canaries = [Canary(f"c{i:03d}", tuple(t.split()), 1.0, 1.0, 1.0) for i, t in enumerate(texts)]
    return Manifest(canaries, seed=0, population=1, scale=1.0, distribution="uniform")


def corpus(users: dict[str, list[str]]) -> FederatedCorpus:
    return FederatedCorpus.from_dict({u: [TextExample(t) for t in texts] for u, texts in users.items()})


# ---- edit distance ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "a, b, d",
    [
        ([], [], 0),
        ([1, 2, 3], [1, 2, 3], 0),
        ([1, 2, 3], [], 3),
        ([], [4, 5], 2),
        ([1, 2, 3], [1, 9, 3], 1),  # substitution
        ([1, 2, 3], [1, 3], 1),  # deletion
        ([1, 3], [1, 2, 3], 1),  # insertion
        ([1, 2, 3, 4], [2, 3, 4, 5], 2),  # shift: delete head, insert tail
        ([1, 2, 3, 4], [4, 3, 2, 1], 4),
        ([11, 9, 20, 20, 5, 14], [19, 9, 20, 20, 9, 14, 7], 3),  # "kitten" -> "sitting"
    ],
)
def test_edit_distance_hand_cases(a, b, d):
    assert edit_distance(a, b) == d
    assert edit_distance(b, a) == d


# ---- the sets -----------------------------------------------------------------------------------
def test_sets_classify_duplicates_filter_length_and_exclude_canaries():
    train = corpus(
        {
            "u1": ["a b c d", "e f g h", "a b c d", "short one", "x y z w v"],
            "u2": ["a b c d", "q r s t", "canary words here now", "e f g h"],
            "u3": ["canary words here now", "tiny"],
        }
    )
    evals = {"test": corpus({"v1": ["v w x y", "no", "canary words here now"]}), "dev": corpus({"v2": ["k l m n"]})}
    sets = extraction_sets(train, evals, manifest_of("canary words here now"), prefix=2, suffix=2, per_set=100, seed=0)
    assert sets["duplicated"] == [("a", "b", "c", "d"), ("e", "f", "g", "h")]  # each distinct text once
    assert sets["unique"] == [("x", "y", "z", "w"), ("q", "r", "s", "t")]  # first 4 words of the 5
    assert sets["validation"] == [("k", "l", "m", "n"), ("v", "w", "x", "y")]  # corpora by name
    # without the manifest the canary, planted twice, is a duplicated training text
    plain = extraction_sets(train, evals, None, prefix=2, suffix=2, per_set=100, seed=0)
    assert ("canary", "words", "here", "now") in plain["duplicated"]
    assert ("canary", "words", "here", "now") in plain["validation"]
    assert extraction_sets(train, {}, None, 2, 2, 100, 0)["validation"] == []
    # a longer need drops the 4-word texts
    assert extraction_sets(train, evals, None, prefix=3, suffix=2, per_set=100, seed=0) == {
        "duplicated": [],
        "unique": [("x", "y", "z", "w", "v")],
        "validation": [],
    }


def test_sets_on_shakespeare_match_a_direct_count(shakespeare):
    need = 6
    counts = Counter(" ".join(ex.words()) for ex in shakespeare.records())
    dup = {tuple(t.split()[:need]) for t, n in counts.items() if n >= 2 and len(t.split()) >= need}
    uni = {tuple(t.split()[:need]) for t, n in counts.items() if n == 1 and len(t.split()) >= need}
    assert len(dup) >= 5 and len(uni) > 1000
    canary = next(t for t, n in counts.items() if n == 1 and len(t.split()) >= need)
    sets = extraction_sets(shakespeare, {}, manifest_of(canary), prefix=3, suffix=3, per_set=10**6, seed=1)
    assert set(sets["duplicated"]) == dup and len(sets["duplicated"]) == len(dup)
    assert set(sets["unique"]) == uni - {tuple(canary.split()[:need])}
    assert all(len(w) == need for s in sets.values() for w in s)


def test_sets_are_deterministic_by_seed_and_capped(shakespeare):
    held, _ = shakespeare.split_heldout_users(0.2)
    _, valid = shakespeare.split_heldout_users(0.2)
    a = extraction_sets(held, {"valid": valid}, None, 4, 4, 50, seed=7)
    b = extraction_sets(held, {"valid": valid}, None, 4, 4, 50, seed=7)
    c = extraction_sets(held, {"valid": valid}, None, 4, 4, 50, seed=8)
    assert a == b
    assert len(a["unique"]) == 50 and len(a["validation"]) == 50
    assert len(a["duplicated"]) < 50  # the whole (small) pool
    assert a["duplicated"] == c["duplicated"]  # pool smaller than the cap: all of it, same order
    assert a["unique"] != c["unique"] and a["validation"] != c["validation"]
    assert set(a["unique"]) <= set(extraction_sets(held, {}, None, 4, 4, 10**6, seed=0)["unique"])
    assert len(set(a["validation"])) == len(a["validation"])  # without replacement (distinct lines here)
    assert extraction_sets(held, {}, None, 4, 4, 0, seed=7) == {"duplicated": [], "unique": [], "validation": []}
    with pytest.raises(FedprivError):
        extraction_sets(held, {}, None, 4, 0, 10, seed=7)


# ---- greedy decoding ----------------------------------------------------------------------------
PREFIX, SUFFIX, BATCH = 4, 6, 8  # one shape for every test, so each function compiles once


@pytest.fixture(scope="module")
def task(shakespeare):
    """A tiny NWP model over the 300 most frequent Shakespeare words plus the secret's words."""
    top = WordVocab.build((ex.text for ex in shakespeare.records()), 300).words
    words = list(top) + [w for w in dict.fromkeys(SECRET.split()) if w not in top]
    return NWPTask(WordVocab(words), seq_len=12, model="tiny")


@pytest.fixture(scope="module")
def init(task):
    return jax.jit(task.init_params)(jax.random.key(0))


def prefix_inputs(task, ids: np.ndarray) -> np.ndarray:
    return np.concatenate([np.full((len(ids), 1), task.vocab.bos, np.int32), ids[:, :PREFIX]], axis=1)


def reference_greedy(task, params, inputs: np.ndarray, steps: int) -> np.ndarray:
    """Argmax decoding with the full model, re-run over the whole sequence at every step. The
    sequence has a fixed length (one compilation): positions not generated yet hold a filler id,
    which the causal LSTM never reads before the position whose logits are taken."""
    v = task.vocab
    logits_fn = jax.jit(task.logits)
    n, start = inputs.shape
    seq = np.ones((n, start + steps + 1), np.int32)  # + 1: task.logits reads ids[:, :-1]
    seq[:, :start] = inputs
    for t in range(start, start + steps):
        logits = np.asarray(logits_fn(params, jnp.asarray(seq)))[:, t - 1].copy()
        logits[:, [v.pad, v.bos]] = -np.inf
        seq[:, t] = np.argmax(logits, axis=-1)
    return seq[:, start : start + steps]


def test_greedy_generation_equals_full_model_argmax(task, init, shakespeare):
    # larger weights than at init, so the argmax has clear margins (no float ties between paths)
    params = jax.tree_util.tree_map(lambda x: x * 4.0, init)
    stepper = NWPStepper(task, params)
    words = extraction_sets(shakespeare, {}, None, PREFIX, SUFFIX, per_set=13, seed=0)["unique"]
    ids = np.stack([stepper.encode_words(w) for w in words])
    inputs = prefix_inputs(task, ids)
    want = reference_greedy(task, params, inputs, SUFFIX)
    got = greedy_generate(stepper, inputs, SUFFIX, batch=BATCH)  # two batches, the last padded
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(want)) > 3  # not a degenerate constant output
    assert not np.isin(want, [task.vocab.pad, task.vocab.bos]).any()
    # the metrics compare exactly these continuations with the next SUFFIX ids
    res = extraction(stepper, {"unique": words, "empty": []}, PREFIX, SUFFIX, batch=BATCH)
    target = ids[:, PREFIX:]
    equal = want == target
    assert res["unique"] == {
        "examples": 13,
        "exact_match": pytest.approx(float(np.mean(equal.all(axis=1)))),
        "token_accuracy": pytest.approx(float(equal.mean())),
        "median_edit_distance": float(np.median([edit_distance(a, b) for a, b in zip(want.tolist(), target.tolist())])),
    }
    assert res["empty"] == {"examples": 0, "exact_match": None, "token_accuracy": None, "median_edit_distance": None}


def test_metrics_when_the_target_is_the_generation(task, init):
    """The model's own greedy continuation as the target matches everywhere; one changed word
    costs one position and one edit."""
    stepper = NWPStepper(task, init)
    vocab = task.vocab
    prefixes = [("to", "be", "or", "not"), ("the", "king", "is", "dead"), ("what", "say", "you", "to")]
    gen = greedy_generate(stepper, prefix_inputs(task, np.stack([stepper.encode_words(w) for w in prefixes])), SUFFIX, BATCH)
    if np.isin(gen, [vocab.oov, vocab.eos]).any():
        pytest.skip("special ids generated: not expressible as words")
    words = [w + tuple(vocab.decode(g)) for w, g in zip(prefixes, gen)]
    res = extraction(stepper, {"self": words}, PREFIX, SUFFIX, BATCH)["self"]
    assert res == {"examples": 3, "exact_match": 1.0, "token_accuracy": 1.0, "median_edit_distance": 0.0}
    other = [w[:-1] + (vocab.words[0] if w[-1] != vocab.words[0] else vocab.words[1],) for w in words]
    res = extraction(stepper, {"x": other}, PREFIX, SUFFIX, BATCH)["x"]
    assert res == {"examples": 3, "exact_match": 0.0, "token_accuracy": pytest.approx(5 / 6), "median_edit_distance": 1.0}
    unknown = [w[:-1] + ("notaword",) for w in words]  # an oov target is matched only by oov
    assert extraction(stepper, {"x": unknown}, PREFIX, SUFFIX, BATCH)["x"]["exact_match"] == 0.0
    with pytest.raises(FedprivError):
        extraction(stepper, {"short": [words[0][:-1]]}, PREFIX, SUFFIX, BATCH)


# ---- a real memorization check ------------------------------------------------------------------
def test_a_repeated_training_sentence_is_extracted_after_training(task, init, shakespeare):
    lines = [ex.text for ex in shakespeare.records() if len(ex.words()) >= PREFIX + SUFFIX]
    lines = list(dict.fromkeys(lines))[:160]  # distinct real lines: the unique set
    texts = lines + [SECRET] * 48
    np.random.default_rng(0).shuffle(texts)
    train = corpus({f"u{i}": texts[i::8] for i in range(8)})
    sets = extraction_sets(train, {}, None, PREFIX, SUFFIX, per_set=40, seed=0)
    assert sets["duplicated"] == [tuple(SECRET.split()[: PREFIX + SUFFIX])]
    assert len(sets["unique"]) == 40 and sets["validation"] == []

    data = jnp.asarray(task.vocab.encode_batch(texts, task.seq_len))
    opt = optax.adam(2e-2)

    @jax.jit
    def step(params, state, rows):
        batch = {"ids": data[rows], "mask": jnp.ones(len(rows), jnp.float32)}
        grads = jax.grad(lambda p: task.losses(p, batch, jax.random.key(0), True).mean())(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    before = extraction(NWPStepper(task, init), sets, PREFIX, SUFFIX, BATCH)
    params, state = init, opt.init(init)
    rng = np.random.default_rng(0)
    for _ in range(150):  # the secret comes out verbatim from about step 60 (seeds 0-3)
        params, state = step(params, state, jnp.asarray(rng.choice(len(texts), 32, replace=False)))
    after = extraction(NWPStepper(task, params), sets, PREFIX, SUFFIX, BATCH)

    assert before["duplicated"]["exact_match"] == 0.0
    assert before["duplicated"]["median_edit_distance"] >= SUFFIX - 1
    assert after["duplicated"] == {"examples": 1, "exact_match": 1.0, "token_accuracy": 1.0, "median_edit_distance": 0.0}
    # lines seen ~30 times each are not yet extracted (0 to 0.025 exact match over seeds 0-3)
    assert after["unique"]["examples"] == 40
    assert after["unique"]["exact_match"] <= 0.2 and after["unique"]["token_accuracy"] < 0.5
    assert after["validation"] == {"examples": 0, "exact_match": None, "token_accuracy": None, "median_edit_distance": None}
