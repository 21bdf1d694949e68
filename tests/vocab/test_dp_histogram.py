"""DP histograms: closed forms (incl. the paper's numbers), noise statistics, counting rules, refusals."""

import math
from collections import Counter

import numpy as np
import pytest
from scipy.special import erfinv
from scipy.stats import norm

from fedpriv.errors import PrivacyParameterError
from fedpriv.vocab.dp_histogram import (
    COROLLARY1_DELTA_MAX,
    CappedCounter,
    DistinctCounter,
    TupleCounter,
    WordCounter,
    corollary1_epsilon,
    corollary1_sigma,
    corollary1_threshold,
    count_histogram,
    count_params,
    dp_histogram,
    gaussian_histogram,
    gaussian_params,
    laplace_histogram,
    laplace_params,
    laplace_threshold,
    release,
    theorem1_epsilon,
    theorem1_sigma,
    theorem1_threshold,
)


# ---- closed forms ---------------------------------------------------------------------------------
def test_corollary1_reproduces_the_papers_numbers():
    # Hoory et al. 2021, section 3.2: N = 256, delta = 1e-9, sigma = 200 -> C = 982.5, epsilon = 0.517.
    eps = corollary1_epsilon(200, 1e-9, 256)
    assert eps == pytest.approx(16 / 200 * math.sqrt(2 * math.log(1.25e9)), rel=1e-12)
    assert eps == pytest.approx(0.5178, abs=5e-5)
    # The printed rule C = 1 + sigma * erfinv(1 - delta/N) is what gives the paper's 982.5 ...
    assert corollary1_threshold(200, 1e-9, 256, rule="paper") == pytest.approx(982.5, abs=0.05)
    # ... the sound rule is the Gaussian quantile: C = 1 + sigma * Phi^-1(1 - delta/N).
    C = corollary1_threshold(200, 1e-9, 256)
    assert C == pytest.approx(1 + 200 * norm.isf(1e-9 / 256), rel=1e-12)
    assert C == pytest.approx(1369.389, abs=1e-3)


def test_corollary1_hand_computed_small_case():
    # N = 4, delta = 0.01, sigma = 2: epsilon = 2/2 * sqrt(2 ln 125) = 3.107511...
    assert corollary1_epsilon(2, 0.01, 4) == pytest.approx(3.1075110, abs=1e-6)
    # Phi^-1(1 - 0.0025) = 2.8070338 -> C = 1 + 2 * 2.8070338
    assert corollary1_threshold(2, 0.01, 4) == pytest.approx(6.6140675, abs=1e-6)
    # paper rule: erfinv(0.9975) = 2.1200... (erfc(2.12) = 0.0025)
    assert corollary1_threshold(2, 0.01, 4, rule="paper") == pytest.approx(1 + 2 * erfinv(0.9975), rel=1e-10)
    # the quantile equals sqrt(2) * erfinv(1 - 2 delta/N)
    assert corollary1_threshold(2, 0.01, 4) == pytest.approx(1 + 2 * math.sqrt(2) * erfinv(1 - 0.005), rel=1e-10)


def test_theorem1_general_form():
    # k = 3, m = 2, sigma = 10, delta = 1e-5, N = 8: epsilon = 0.3 sqrt(2 ln 2.5e5) = 0.3 * 4.985823 = 1.495747
    assert theorem1_epsilon(10, 1e-5, 3) == pytest.approx(0.3 * math.sqrt(2 * math.log(2.5e5)), rel=1e-12)
    assert theorem1_epsilon(10, 1e-5, 3) == pytest.approx(1.4957469, abs=1e-6)
    assert theorem1_threshold(10, 1e-5, 2, 8) == pytest.approx(2 + 10 * norm.isf(1e-5 / 16), rel=1e-12)
    assert theorem1_threshold(10, 1e-5, 2, 8, rule="paper") == pytest.approx(2 + 10 * erfinv(1 - 1e-5 / 16), rel=1e-9)
    # Theorem 1 at k = sqrt(N), m = 1 is Corollary 1 with the slightly worse constants (2.5, delta/2N)
    assert theorem1_epsilon(200, 1e-9, 16) > corollary1_epsilon(200, 1e-9, 256)


def test_inverse_sigma_for_epsilon_round_trips():
    for eps, delta, n in [(0.5, 1e-9, 256), (0.9, 1e-6, 16), (0.1, 1e-3, 1)]:
        s = corollary1_sigma(eps, delta, n)
        assert corollary1_epsilon(s, delta, n) == pytest.approx(eps, rel=1e-12)
        s = theorem1_sigma(eps, delta, n)
        assert theorem1_epsilon(s, delta, n) == pytest.approx(eps, rel=1e-12)
    p = gaussian_params(epsilon=0.5, delta=1e-9, tuple_size=256)
    assert p.epsilon == pytest.approx(0.5, rel=1e-12)
    assert p.noise == pytest.approx(16 * math.sqrt(2 * math.log(1.25e9)) / 0.5, rel=1e-12)
    q = count_params(epsilon=0.5, delta=1e-6, tuple_size=16)  # k = m = N
    assert q.noise == pytest.approx(16 * math.sqrt(2 * math.log(2.5e6)) / 0.5, rel=1e-12)
    assert q.threshold == pytest.approx(16 + q.noise * norm.isf(1e-6 / 32), rel=1e-12)


def test_laplace_closed_forms_and_composition():
    # epsilon = 0.5, delta = 1e-6: scale 4, C = 1 + 4 ln(2e6) = 1 + 4 * 14.5086577 = 59.034631
    assert laplace_threshold(0.5, 1e-6) == pytest.approx(59.034631, abs=1e-6)
    p = laplace_params(epsilon=0.5, delta=1e-6, tuple_size=100)
    assert p.noise == 4.0 and p.threshold == pytest.approx(59.034631, abs=1e-6)
    assert (p.epsilon_per_word, p.delta_per_word) == (0.5, 1e-6)
    assert p.epsilon == pytest.approx(50.0) and p.delta == pytest.approx(1e-4)
    g = p.guarantee()
    assert "per word" in g and "per example" in g and "basic composition" in g


def test_paper_rule_reports_the_delta_it_actually_gives():
    p = gaussian_params(sigma=200, delta=1e-9, tuple_size=256, threshold_rule="paper")
    tail = norm.sf(erfinv(1 - 1e-9 / 256))  # P[Z > erfinv(1 - delta/N)] (1 - 3.9e-12 loses digits: rel 1e-4)
    assert p.delta == pytest.approx(1e-9 + 256 * tail, rel=1e-4)
    assert p.delta > 1e-4 and p.delta_requested == 1e-9
    assert "not the requested" in p.guarantee()
    q = gaussian_params(sigma=200, delta=1e-9, tuple_size=256)
    assert q.delta == 1e-9 and "adding or removing one 256-word tuple" in q.guarantee()


# ---- counting rules -----------------------------------------------------------------------------
def test_tuple_partition_counts_a_word_once_per_tuple():
    seqs = [["a", "a", "a", "b"], ["a", "c"], ["c", "c"]]
    stream = TupleCounter(4, "stream")
    for s in seqs:
        stream.add(s)
    # a a a b | a c c c -> {a, b}, {a, c}
    assert stream.finish() == Counter({"a": 2, "b": 1, "c": 1}) and stream.units == 2
    per_example = TupleCounter(4, "example")
    for s in seqs:
        per_example.add(s)
    # {a, b}, {a, c}, {c}
    assert per_example.finish() == Counter({"a": 2, "b": 1, "c": 2}) and per_example.units == 3
    tail = TupleCounter(3, "stream")
    for s in [["x", "y"], ["x", "z", "z"]]:
        tail.add(s)
    # x y x | z z  (the last, short tuple counts too)
    assert tail.finish() == Counter({"x": 1, "y": 1, "z": 1}) and tail.units == 2


def test_distinct_and_capped_counters():
    d = DistinctCounter(3)
    d.add(["x", "y", "x", "z", "w"])  # first 3 distinct: x y z
    d.add(["w", "w"])
    assert d.finish() == Counter({"x": 1, "y": 1, "z": 1, "w": 1}) and d.units == 2
    c = CappedCounter(3)
    c.add(["x", "x", "y", "z"])  # first 3 words, counts not capped at 1
    assert c.finish() == Counter({"x": 2, "y": 1})


@pytest.mark.parametrize(
    "make",
    [
        lambda: TupleCounter(5, "stream"),
        lambda: TupleCounter(5, "example"),
        lambda: DistinctCounter(5),
        lambda: CappedCounter(5),
        lambda: WordCounter(),
    ],
)
def test_batched_counting_equals_one_by_one(make):
    rng = np.random.default_rng(0)
    seqs = [[f"w{int(x)}" for x in rng.zipf(1.5, size=int(n)) % 40] for n in rng.integers(0, 14, size=300)]
    one, many = make(), make()
    for s in seqs:
        one.add(s)
    for i in range(0, len(seqs), 37):
        many.add_many(seqs[i : i + 37])
    assert one.finish() == many.finish() and one.units == many.units


def test_stream_histogram_figures_and_determinism():
    seqs = [[f"w{i % 7}", f"v{i % 3}", "the"] for i in range(600)]
    h = gaussian_histogram(iter(seqs), sigma=30, delta=1e-5, tuple_size=6, seed=3)
    assert h.words_before == 11 and h.units == 300  # 1800 words / 6
    assert h.words_kept + h.words_dropped == h.words_before
    assert "the" in h.counts  # in every tuple: 300 >> C
    assert h.threshold == pytest.approx(1 + 30 * norm.isf(1e-5 / 6), rel=1e-12)
    again = gaussian_histogram(iter(seqs), sigma=30, delta=1e-5, tuple_size=6, seed=3)
    assert again.counts == h.counts
    # per-example partition: the noise depends on the histogram and seed only, not the stream order
    a = gaussian_histogram(seqs, sigma=30, delta=1e-5, tuple_size=6, partition="example", seed=1)
    b = gaussian_histogram(seqs[::-1], sigma=30, delta=1e-5, tuple_size=6, partition="example", seed=1)
    assert a.counts == b.counts
    d = a.to_dict()
    assert d["sigma"] == 30 and d["partition"] == "example" and d["words_kept"] == a.words_kept


# ---- noise statistics -----------------------------------------------------------------------------
N_WORDS = 20_000


def _same_count_histogram(count: int) -> Counter:
    return Counter({f"w{i}": count for i in range(N_WORDS)})


def test_gaussian_noise_has_std_sigma():
    p = gaussian_params(sigma=40.0, delta=1e-6, tuple_size=4)
    true = int(p.threshold + 20 * 40)  # every word far above C: all kept
    h = release(_same_count_histogram(true), p, seed=7)
    noise = np.array(list(h.counts.values())) - true
    assert len(noise) == N_WORDS
    # std of the sample std is sigma / sqrt(2n) = 0.5%: 3% is 6 standard errors
    assert abs(noise.std() / 40.0 - 1) < 0.03
    assert abs(noise.mean()) < 3 * 40.0 / math.sqrt(N_WORDS)


def test_count_mechanism_noise_has_std_sigma():
    p = count_params(sigma=60.0, delta=1e-6, tuple_size=8)
    true = int(p.threshold + 20 * 60)
    h = release(_same_count_histogram(true), p, seed=11)
    noise = np.array(list(h.counts.values())) - true
    assert abs(noise.std() / 60.0 - 1) < 0.03


def test_laplace_noise_has_scale_two_over_epsilon():
    p = laplace_params(epsilon=0.5, delta=1e-7, tuple_size=8)
    true = int(p.threshold + 40 * p.noise)
    h = release(_same_count_histogram(true), p, seed=5)
    noise = np.array(list(h.counts.values())) - true
    # E|X| = b for Lap(b); the sample mean of |X| has relative std 1/sqrt(n) = 0.7%
    assert abs(np.abs(noise).mean() / 4.0 - 1) < 0.03
    assert abs(noise.std() / (math.sqrt(2) * 4.0) - 1) < 0.03


def test_threshold_drops_small_counts():
    p = gaussian_params(sigma=12.0, delta=1e-6, tuple_size=4)
    counts = Counter({"big": int(p.threshold + 100), "one": 1})
    kept = set()
    for seed in range(50):
        kept |= set(release(counts, p, seed=seed).counts)
    assert kept == {"big"}  # P[1 + N(0, 144) >= C] is about 1e-7 per draw


def test_laplace_and_count_histograms_over_streams():
    seqs = [["a", "a", "b"] + [f"x{i}"] for i in range(400)]
    h = laplace_histogram(seqs, epsilon=1.0, delta=1e-4, tuple_size=4, seed=0)
    assert h.units == 400 and h.words_before == 402 and set(h.counts) == {"a", "b"}
    assert h.counts["a"] == pytest.approx(400, abs=40)  # "a" once per example, not twice
    c = count_histogram(seqs, sigma=20, delta=1e-5, tuple_size=4, seed=0)
    assert c.counts["a"] == pytest.approx(800, abs=120)  # counts not capped at 1
    via_name = dp_histogram(seqs, "count", sigma=20, delta=1e-5, tuple_size=4, seed=0)
    assert via_name.counts == c.counts


# ---- refusals -------------------------------------------------------------------------------------
def _untouchable():
    raise AssertionError("the stream was read before the parameters were checked")
    yield  # pragma: no cover


@pytest.mark.parametrize(
    "mechanism, kwargs, name",
    [
        ("gaussian", dict(sigma=200, delta=0.0), "delta"),
        ("gaussian", dict(sigma=200, delta=1.0), "delta"),
        ("gaussian", dict(sigma=200, delta=-1e-9), "delta"),
        ("gaussian", dict(sigma=200, delta=COROLLARY1_DELTA_MAX), "delta"),  # outside Corollary 1
        ("gaussian", dict(sigma=0.0, delta=1e-9), "sigma"),
        ("gaussian", dict(sigma=-3.0, delta=1e-9), "sigma"),
        ("gaussian", dict(sigma=float("nan"), delta=1e-9), "sigma"),
        ("gaussian", dict(epsilon=0.0, delta=1e-9), "epsilon"),
        ("gaussian", dict(epsilon=-1.0, delta=1e-9), "epsilon"),
        ("gaussian", dict(epsilon=1.5, delta=1e-9), "epsilon"),  # Gaussian mechanism bound: epsilon < 1
        ("gaussian", dict(sigma=5, delta=1e-9), "epsilon"),  # sigma too small: epsilon >= 1
        ("gaussian", dict(sigma=200, epsilon=0.5, delta=1e-9), "sigma"),  # both
        ("gaussian", dict(delta=1e-9), "sigma"),  # neither
        ("gaussian", dict(sigma=200, delta=1e-9, tuple_size=0), "tuple_size"),
        ("gaussian", dict(sigma=200, delta=1e-9, tuple_size=2.5), "tuple_size"),
        ("gaussian", dict(sigma=200, delta=1e-9, threshold_rule="erf"), "threshold_rule"),
        ("gaussian", dict(sigma=200, delta=1e-9, partition="users"), "partition"),
        ("laplace", dict(epsilon=0.0, delta=1e-9), "epsilon"),
        ("laplace", dict(epsilon=1.0, delta=2.0), "delta"),
        ("laplace", dict(epsilon=1.0, delta=0.01, tuple_size=256), "delta"),  # N * delta >= 1
        ("laplace", dict(epsilon=1.0, delta=1e-9, tuple_size=-1), "tuple_size"),
        ("count", dict(sigma=1e6, delta=1.5), "delta"),
        ("count", dict(sigma=-1.0, delta=1e-6), "sigma"),
        ("count", dict(sigma=10.0, delta=1e-6, tuple_size=256), "epsilon"),  # k = 256: epsilon >> 1
        ("count", dict(sigma=1e6, delta=1e-6, tuple_size=0), "tuple_size"),
    ],
)
def test_bad_parameters_are_refused_before_any_work(mechanism, kwargs, name):
    with pytest.raises(PrivacyParameterError, match=name) as e:
        dp_histogram(_untouchable(), mechanism, **kwargs)
    assert "(" in str(e.value) or "must" in str(e.value)  # names the valid range


def test_unknown_mechanism_is_refused():
    with pytest.raises(PrivacyParameterError, match="mechanism"):
        dp_histogram([], "exponential", epsilon=1.0, delta=1e-6)


def test_laplace_assumption_delta_below_one_over_n():
    # Hoory et al. v1 assume delta < 1/n (n distinct words): 3 words and delta = 0.5 (per word) are refused.
    with pytest.raises(PrivacyParameterError, match="1/n"):
        laplace_histogram([["a"], ["b"], ["c"]], epsilon=0.5, delta=0.5, tuple_size=1)
