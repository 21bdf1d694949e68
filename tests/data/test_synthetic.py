"""Synthetic non-IID users: determinism, exact counts, order independence, laziness, non-IID-ness."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest

from fedpriv.data.corpus import FederatedCorpus
from fedpriv.data.examples import TextExample
from fedpriv.data.synthetic import (
    PRESETS,
    SyntheticConfig,
    SyntheticStore,
    load_synthetic,
    make_word,
    parse_synthetic_spec,
    user_counts,
)
from fedpriv.errors import FedprivError, SourceError


def texts(exs):
    return [(e.text, e.timestamp) for e in exs]


# ---- determinism -------------------------------------------------------------------------------
def test_same_spec_gives_identical_examples():
    a = load_synthetic("synthetic:small,seed=3")
    b = load_synthetic("synthetic:small,seed=3")
    assert a.user_ids == b.user_ids
    np.testing.assert_array_equal(a.counts(), b.counts())
    for u in a.user_ids[:20]:
        assert texts(a.examples(u)) == texts(b.examples(u))


def test_different_seed_gives_different_data():
    a = load_synthetic("synthetic:small,seed=3")
    b = load_synthetic("synthetic:small,seed=4")
    assert not np.array_equal(a.counts(), b.counts())
    assert a.examples("u000000")[0].text != b.examples("u000000")[0].text


# ---- counts ------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["synthetic:small", "synthetic:users=7,examples=7", "synthetic:users=1000,examples=1001,seed=5", "synthetic:stackoverflow"])
def test_counts_sum_exactly_and_all_positive(spec):
    cfg = parse_synthetic_spec(spec)
    c = SyntheticStore(cfg).counts()
    assert c.dtype == np.int64 and len(c) == cfg.users
    assert int(c.sum()) == cfg.examples
    assert c.min() >= 1


def test_generated_examples_match_counts():
    store = SyntheticStore(PRESETS["small"])
    c = store.counts()
    for i in range(0, 200, 17):
        assert len(store.generate(i)) == c[i]


def test_heavy_tail():
    c = user_counts(PRESETS["stackoverflow"])
    med = float(np.median(c))
    assert c.max() > 1000 * med  # a few users hold huge numbers of examples
    top = np.sort(c)[::-1][: len(c) // 100]
    assert top.sum() > 0.25 * c.sum()  # the top 1% of users hold over a quarter of the data
    small = SyntheticStore(PRESETS["small"]).counts()
    assert small.max() > 10 * np.median(small)


# ---- order independence and laziness -------------------------------------------------------------
def test_user_alone_equals_user_after_others():
    cfg = PRESETS["small"]
    alone = SyntheticStore(cfg).examples("u000042")
    s = SyntheticStore(cfg)
    for u in list(s.user_ids())[:42][::-1]:
        s.examples(u)
    assert texts(s.examples("u000042")) == texts(alone)
    # and through a sampled sub-corpus, in another order
    corpus = load_synthetic(cfg)
    sub = corpus.subset(["u000199", "u000042", "u000000"])
    assert texts(dict(sub.users())["u000042"]) == texts(alone)


def test_stackoverflow_preset_is_lazy():
    store = SyntheticStore(PRESETS["stackoverflow"])
    calls = []
    real = store.generate
    store.generate = lambda i: (calls.append(i), real(i))[1]
    corpus = FederatedCorpus(store, "so")
    assert corpus.num_users == 342_477 and corpus.num_examples == 135_818_730
    sample = corpus.sample_users(3, seed=0)
    got = dict(sample.users())
    assert len(got) == 3
    assert sorted(calls) == sorted(store.index_of(u) for u in got)  # no other user was generated
    assert store.generated == 3  # laziness by count, not by wall time (timing never goes into a unit test)


def test_unknown_user():
    store = SyntheticStore(PRESETS["small"])
    for bad in ["u000200", "u00001", "x000001", "u00000a", "", "u-00001"]:
        with pytest.raises(KeyError):
            store.examples(bad)
    with pytest.raises(FedprivError):
        load_synthetic("synthetic:small").examples("u999999")


# ---- content -----------------------------------------------------------------------------------
def test_words_and_examples_shape():
    store = SyntheticStore(PRESETS["small"])
    vocab = store.vocabulary
    assert len(set(vocab)) == len(vocab) == PRESETS["small"].vocab_size
    assert all(re.fullmatch(r"[a-z]+", w) for w in vocab)
    assert [make_word(r) for r in (0, 69, 70)] == ["ba", "zu", "baba"]
    vocab_set = set(vocab)
    lengths = []
    for i in range(0, 200, 10):
        exs = store.generate(i)
        assert all(isinstance(e, TextExample) for e in exs)
        ts = [e.timestamp for e in exs]
        assert ts == sorted(ts)
        assert all(1217548800 <= t < 1577836800 for t in ts)  # 2008-08-01 .. 2019-12-31 UTC
        for e in exs:
            w = e.text.split(" ")
            assert w and set(w) <= vocab_set
            lengths.append(len(w))
    assert abs(np.mean(lengths) - PRESETS["small"].sentence_mean) < 1.5


def test_time_split_has_both_sides():
    before, after = load_synthetic("synthetic:users=30,examples=900").split_by_time("2014-01-01")
    assert before.num_examples > 0 and after.num_examples > 0
    assert before.num_examples + after.num_examples == 900


# ---- non-IID -----------------------------------------------------------------------------------
def _unigram(exs):
    return Counter(w for e in exs for w in e.text.split())


def _js(a: Counter, b: Counter, keys: list[str]) -> float:
    """Jensen-Shannon divergence (bits) over ``keys`` plus one bucket for every other word."""

    def vec(c):
        v = np.array([c[k] for k in keys] + [0], dtype=float)
        v[-1] = sum(c.values()) - v[:-1].sum()
        return v / v.sum()

    p, q = vec(a), vec(b)
    m = (p + q) / 2

    def kl(x, y):
        nz = x > 0
        return float(np.sum(x[nz] * np.log2(x[nz] / y[nz])))

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def _between_within(spec: str) -> tuple[list[float], list[float]]:
    """JS between halves of one user's data, and between halves of two different users' data,
    over the 300 most frequent words of all the data (rare words only add sampling noise)."""
    store = SyntheticStore(parse_synthetic_spec(spec))
    halves = []
    for i in range(10):
        exs = store.generate(i)
        h = len(exs) // 2
        halves.append((_unigram(exs[:h]), _unigram(exs[h:])))
    pooled = Counter()
    for a, b in halves:
        pooled.update(a)
        pooled.update(b)
    keys = [w for w, _ in pooled.most_common(300)]
    within = [_js(a, b, keys) for a, b in halves]
    between = [_js(halves[k][0], halves[(k + 1) % 10][1], keys) for k in range(10)]
    return within, between


def test_users_are_non_iid():
    # 10 users of ~2,000 examples each (~13 tokens per example).
    within, between = _between_within("synthetic:users=10,examples=20000,count_sigma=0.3")
    # Measured over seeds 0-9: mean ratio 3.1-3.7, min(between)/max(within) 1.2-2.4 (2.05 here).
    assert np.mean(between) > 2.5 * np.mean(within)
    assert min(between) > 1.1 * max(within)


def test_topic_concentration_controls_non_iid():
    # With a huge Dirichlet alpha and no favourite words every user has the same mixture: IID.
    within, between = _between_within("synthetic:users=10,examples=20000,count_sigma=0.3,topic_concentration=1000,favourite_rate=0")
    assert np.mean(between) < 1.2 * np.mean(within)  # measured 0.93-1.04 over seeds 0-9


# ---- specs -------------------------------------------------------------------------------------
def test_parse_presets_and_overrides():
    so = parse_synthetic_spec("synthetic:stackoverflow")
    assert (so.users, so.examples) == (342_477, 135_818_730)
    assert parse_synthetic_spec("synthetic:small,seed=3") == SyntheticConfig(**{**PRESETS["small"].__dict__, "seed": 3})
    cfg = parse_synthetic_spec("synthetic:users=1000,examples=50000,seed=0,topics=20")
    assert (cfg.users, cfg.examples, cfg.seed, cfg.topics) == (1000, 50000, 0, 20)
    assert parse_synthetic_spec("synthetic:users=1e3,examples=5e4,zipf_exponent=1.1").zipf_exponent == 1.1
    assert load_synthetic("synthetic:stackoverflow").name == "synthetic:stackoverflow"
    for c in (so, cfg, PRESETS["small"], parse_synthetic_spec("small,seed=9,topic_jitter=0.5")):
        assert parse_synthetic_spec(c.spec()) == c


@pytest.mark.parametrize(
    "spec, key",
    [
        ("synthetic:small,colour=3", "colour"),
        ("synthetic:small,users=abc", "users"),
        ("synthetic:small,seed=1.5", "seed"),
        ("synthetic:small,zipf_exponent=nan", "zipf_exponent"),
        ("synthetic:small,users=0", "users"),
        ("synthetic:users=-3,examples=10", "users"),
        ("synthetic:users=10,examples=0", "examples"),
        ("synthetic:users=10,examples=9", "examples"),
        ("synthetic:examples=100", "users"),
        ("synthetic:users=10", "examples"),
        ("synthetic:small,seed=-1", "seed"),
        ("synthetic:small,favourite_rate=2", "favourite_rate"),
        ("synthetic:small,vocab_size=50", "function_words"),
        ("synthetic:small,seed=1,seed=2", "seed"),
        ("synthetic:tiny", "tiny"),
        ("synthetic:small,stackoverflow", "stackoverflow"),
    ],
)
def test_spec_errors_name_the_key(spec, key):
    with pytest.raises(SourceError) as info:
        parse_synthetic_spec(spec)
    msg = str(info.value)
    assert key in msg and "\n" not in msg


def test_config_validates_directly():
    with pytest.raises(SourceError, match="users"):
        SyntheticConfig(users=0, examples=10)
    with pytest.raises(SourceError, match="load_synthetic|spec string"):
        load_synthetic(42)  # type: ignore[arg-type]


# ---- memory bound (issue 31: users=10,examples=99999999999999 ended in MemoryError) ----------------
def test_a_population_beyond_this_machines_memory_is_refused_stating_the_estimate():
    with pytest.raises(SourceError) as info:
        load_synthetic("synthetic:users=10,examples=99999999999999")
    msg = str(info.value)
    assert "needs about 5.24 PiB of memory" in msg and "average user's 10,000,000,000,000 examples" in msg and "this machine has" in msg
    with pytest.raises(SourceError, match=r"for 1,000,000,000,000 users and 20,000 words"):
        load_synthetic("synthetic:users=1000000000000,examples=1000000000000")


def test_the_largest_user_is_bounded_once_the_counts_are_drawn(monkeypatch):
    """The mean fits, the heavy tail's largest user does not: refused after the counts, before any user is built."""
    import fedpriv.data.synthetic as synthetic

    cfg = SyntheticConfig(users=100, examples=100_000, vocab_size=500, topics=5, count_sigma=2.0)
    largest = int(user_counts(cfg).max())
    tables = cfg.users * synthetic.BYTES_PER_USER + cfg.vocab_size * (synthetic.BYTES_PER_WORD + synthetic.BYTES_PER_WORD_AND_TOPIC * cfg.topics)
    per_example = synthetic.BYTES_PER_EXAMPLE + synthetic.BYTES_PER_EXAMPLE_TOKEN * cfg.sentence_mean
    assert largest > 3 * cfg.examples / cfg.users
    monkeypatch.setattr(synthetic, "memory_bytes", lambda: int(tables + 2 * per_example * cfg.examples / cfg.users))  # a machine of this size
    with pytest.raises(SourceError, match=f"the largest user's {largest:,} examples"):
        SyntheticStore(cfg)


def test_the_memory_estimate_covers_what_generating_a_user_takes():
    """The per-example constants against tracemalloc's peak: not below it, and within 2x of it."""
    import tracemalloc

    import fedpriv.data.synthetic as synthetic

    for mean in (3.0, 13.0, 40.0):
        cfg = SyntheticConfig(users=2, examples=20_001, vocab_size=300, function_words=10, topics=2, count_sigma=0.0, sentence_mean=mean, sentence_std=mean / 2)
        store = SyntheticStore(cfg)
        n = int(store.counts()[0])
        tracemalloc.start()
        try:
            store.generate(0)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        estimate = n * (synthetic.BYTES_PER_EXAMPLE + synthetic.BYTES_PER_EXAMPLE_TOKEN * mean)
        assert peak <= estimate <= 2 * peak, (mean, peak, estimate)
