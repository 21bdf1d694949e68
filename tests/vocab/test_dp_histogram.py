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
    UserCounter,
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
        lambda: UserCounter(5),
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


# ---- partition = "user": one tuple per user ------------------------------------------------------
# A user with many examples: word frequencies a 4, b 3, c 1, d 1, e 1 (first occurrences in that order).
USER_EXAMPLES = [["a", "b", "a"], ["c", "a", "d"], ["b", "e", "b", "a"]]


def test_user_counter_counts_a_users_top_n_distinct_words_once():
    u = UserCounter(3)
    u.add_user(USER_EXAMPLES)  # top 3: a, b, then c (c, d, e tie at 1: the first occurrence wins)
    u.add(["d", "d", "x"])  # 2 distinct <= N: both, once
    u.add([])  # a user with no words: counted as a unit, adds nothing
    assert u.finish() == Counter({"a": 1, "b": 1, "c": 1, "d": 1, "x": 1}) and u.units == 3
    # the tie-break is by first occurrence, not alphabetical
    v = UserCounter(2)
    v.add(["z", "y", "z", "q", "y", "m"])  # z 2, y 2, q 1, m 1
    v.add(["q", "m", "k"])  # all tie at 1: the first two
    assert v.finish() == Counter({"z": 1, "y": 1, "q": 1, "m": 1})


def test_adding_one_user_changes_at_most_n_counts_by_one():
    # The sensitivity the calibration assumes: add or remove one user -> at most N counts change, each by 1
    # (L2 norm <= sqrt(N)), however many examples and words the user has.
    rng = np.random.default_rng(4)
    users = [[f"w{int(x) % 50}" for x in rng.zipf(1.3, size=int(n))] for n in rng.integers(0, 400, size=60)]
    N = 7
    for i in range(len(users)):
        with_u, without_u = UserCounter(N), UserCounter(N)
        with_u.add_many(users)
        without_u.add_many(users[:i] + users[i + 1 :])
        diff = with_u.finish() - without_u.finish()
        assert without_u.finish() - with_u.finish() == Counter()  # only increases
        assert set(diff.values()) <= {1} and len(diff) == min(N, len(set(users[i])))
        assert math.sqrt(sum(v * v for v in diff.values())) <= math.sqrt(N)


def test_user_partition_calibration_uses_sqrt_n_and_corollary1_threshold():
    eps, delta = 0.5, 1e-6
    for N in (4, 16):
        p = gaussian_params(epsilon=eps, delta=delta, tuple_size=N, partition="user")
        # sensitivity sqrt(N): sigma = sqrt(N) * sqrt(2 ln(1.25/delta)) / epsilon, written out here
        assert p.noise == pytest.approx(math.sqrt(N) * math.sqrt(2 * math.log(1.25 / delta)) / eps, rel=1e-12)
        assert p.epsilon == pytest.approx(eps, rel=1e-12) and p.delta == delta
        # the same Corollary-1 threshold as the per-example tuples, with the same parameters
        assert p.threshold == pytest.approx(1 + p.noise * norm.isf(delta / N), rel=1e-12)
        assert p.threshold == gaussian_params(sigma=p.noise, delta=delta, tuple_size=N, partition="example").threshold
    s4 = gaussian_params(epsilon=eps, delta=delta, tuple_size=4, partition="user").noise
    s16 = gaussian_params(epsilon=eps, delta=delta, tuple_size=16, partition="user").noise
    assert s16 / s4 == pytest.approx(2.0, rel=1e-12)  # sqrt(16) / sqrt(4)
    with pytest.raises(PrivacyParameterError, match="epsilon"):  # the same epsilon < 1 requirement
        gaussian_params(epsilon=1.5, delta=delta, tuple_size=4, partition="user")


def test_user_partition_noise_has_the_calibrated_std():
    p = gaussian_params(epsilon=0.8, delta=1e-6, tuple_size=9, partition="user")
    sigma = 3 * math.sqrt(2 * math.log(1.25e6)) / 0.8
    true = int(p.threshold + 20 * sigma)
    h = release(_same_count_histogram(true), p, seed=13)
    noise = np.array(list(h.counts.values())) - true
    assert len(noise) == N_WORDS
    assert abs(noise.std() / sigma - 1) < 0.03  # the sample std's standard error is 0.5%: 6 of them


def test_user_histogram_is_the_per_user_counts_plus_the_seeded_noise():
    # 300 users of 4 examples each; every user says "the" many times; user i also says u{i % 3} and rare words.
    users = [[["the", "the", f"u{i % 3}"], ["the", f"r{i}"], ["the"], [f"u{i % 3}", "the"]] for i in range(300)]
    seqs = [[w for ex in exs for w in ex] for exs in users]
    h = gaussian_histogram(seqs, epsilon=0.9, delta=1e-5, tuple_size=2, partition="user", seed=3)
    # N = 2: each user counts "the" (5x) and u{i%3} (2x) once; its rare word (1x) is past its top 2
    true = {"the": 300, "u0": 100, "u1": 100, "u2": 100}
    assert h.units == 300 and h.words_before == 4
    words = sorted(true)
    noisy = np.array([true[w] for w in words], float) + np.random.default_rng(3).normal(0.0, h.sigma, size=4)
    assert h.counts == {w: float(x) for w, x in zip(words, noisy) if x >= h.threshold}
    assert "the" in h.counts  # 300 >> C


def test_user_partition_guarantee_names_the_user():
    p = gaussian_params(sigma=200, delta=1e-9, tuple_size=256, partition="user")
    assert p.unit == "user"
    g = p.guarantee()
    assert "against adding or removing one user" in g and "at most N=256 most frequent distinct words" in g
    assert "sqrt(256)" in g and "tuple" not in p.unit
    d = p.to_dict()
    assert d["unit"] == "user" and d["partition"] == "user" and d["guarantee"] == g
    assert gaussian_params(sigma=200, delta=1e-9, tuple_size=256, partition="example").unit == "256-word tuple"  # unchanged
