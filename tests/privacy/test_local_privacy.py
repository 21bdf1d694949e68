"""Local d_chi-privacy (fedpriv.privacy.local): the noise, M_rep, M_txt, the Vickrey mechanism,
the embedding loaders, the empirical privacy measures and `fedpriv privatize`.

Statistical tests use fixed keys, so they are deterministic; each states its tolerance. A bound
"z <= 5" means the observed statistic is within 5 standard errors of its expectation (a correct
implementation fails such a check with probability < 6e-7 per check, over seeds).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import jax
import numpy as np
import pytest
from scipy import stats

from fedpriv.data.sources import open_corpus
from fedpriv.errors import DataFormatError, FedprivError, PrivacyParameterError
from fedpriv.privacy.local.embeddings import EmbeddingSpace, load_glove
from fedpriv.privacy.local.measure import corpus_words, plausible_deniability, plot_deniability, token_inversion
from fedpriv.privacy.local.mechanisms import (
    nearest_tokens,
    privatize_representations,
    privatize_streams,
    privatize_text,
    privatize_tokens,
    sample_noise,
    vickrey_probabilities,
    vickrey_select,
    vickrey_tokens,
)
from fedpriv.runner.embeddings import load_run_embeddings
from fedpriv.vocab.word import WordVocab

Z = 5.0  # z-score bound of the statistical checks
KEY = jax.random.key(20240611)


# ---- fixtures: a small real embedding table (PPMI + SVD on the bundled Shakespeare) -------------
@pytest.fixture(scope="module")
def shakespeare_words() -> list[str]:
    return corpus_words(open_corpus("shakespeare"))


@pytest.fixture(scope="module")
def ppmi_space(shakespeare_words) -> EmbeddingSpace:
    """400 frequent Shakespeare words embedded in 16 dimensions: SVD of the positive PMI matrix of
    +-2-word co-occurrences (a quickly built but real distributional embedding)."""
    vocab = WordVocab.from_counts(Counter(shakespeare_words), 400)
    ids = np.array([vocab.id(w) for w in shakespeare_words])
    v = len(vocab)
    co = np.zeros((v, v))
    for off in (1, 2):
        np.add.at(co, (ids[:-off], ids[off:]), 1.0)
    co = co + co.T
    total = co.sum()
    row = co.sum(1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        pmi = np.log(co * total / (row @ row.T))
    ppmi = np.where(np.isfinite(pmi) & (pmi > 0), pmi, 0.0)
    u, s, _ = np.linalg.svd(ppmi)
    table = (u[:, :16] * np.sqrt(s[:16])).astype(np.float32)
    words = ["<pad>", *vocab.words, "<oov>", "<bos>", "<eos>"]
    return EmbeddingSpace(words, table, np.arange(1, len(vocab.words) + 1), vocab.oov, source="ppmi-svd shakespeare")


def _median_nn_distance(space: EmbeddingSpace) -> float:
    sub = space.table[space.allowed].astype(np.float64)
    d = np.sqrt(((sub[:, None, :] - sub[None, :, :]) ** 2).sum(-1))
    np.fill_diagonal(d, np.inf)
    return float(np.median(d.min(1)))


# ---- the noise --------------------------------------------------------------------------------------
def test_noise_radius_is_gamma_and_direction_uniform():
    dim, eta, n = 16, 4.0, 100_000
    noise = sample_noise(KEY, n, dim, eta).astype(np.float64)
    assert noise.shape == (n, dim)
    r = np.linalg.norm(noise, axis=1)
    # Radius ~ Gamma(dim, 1/eta): mean dim/eta, variance dim/eta^2 (excess kurtosis 6/dim).
    mean, var = dim / eta, dim / eta**2
    assert abs(r.mean() - mean) <= Z * math.sqrt(var / n)
    assert abs(r.var() - var) <= Z * var * math.sqrt((2 + 6 / dim) / n)
    # Direction uniform on the sphere: mean 0 (sd sqrt(1/(dim n))), E[u_i^2] = 1/dim with
    # Var[u_i^2] = 3/(dim(dim+2)) - 1/dim^2.
    u = noise / r[:, None]
    assert np.all(np.abs(u.mean(0)) <= Z * math.sqrt(1 / (dim * n)))
    sd2 = math.sqrt((3 / (dim * (dim + 2)) - 1 / dim**2) / n)
    assert np.all(np.abs((u**2).mean(0) - 1 / dim) <= Z * sd2)
    # Radius and direction are independent: the radius does not depend on the sign of u_0.
    pos, neg = r[u[:, 0] > 0], r[u[:, 0] <= 0]
    assert abs(pos.mean() - neg.mean()) <= Z * math.sqrt(var / pos.size + var / neg.size)


def test_noise_in_one_dimension_is_laplace():
    eta, n = 2.0, 50_000
    x = sample_noise(KEY, n, 1, eta)[:, 0].astype(np.float64)
    # Kolmogorov-Smirnov against Laplace(0, 1/eta): D below the 1% critical value 1.63/sqrt(n).
    d = stats.kstest(x, stats.laplace(scale=1 / eta).cdf).statistic
    assert d < 1.63 / math.sqrt(n)
    # Moments: mean 0 (variance 2/eta^2), E|X| = 1/eta (variance 1/eta^2), symmetric.
    assert abs(x.mean()) <= Z * math.sqrt(2 / eta**2 / n)
    assert abs(np.abs(x).mean() - 1 / eta) <= Z * math.sqrt(1 / eta**2 / n)
    assert abs((x > 0).mean() - 0.5) <= Z * math.sqrt(0.25 / n)


def test_noise_is_deterministic_and_per_position():
    a = sample_noise(KEY, (3, 5), 16, 1.0)
    assert a.shape == (3, 5, 16)
    assert np.array_equal(a, sample_noise(KEY, (3, 5), 16, 1.0))
    # Row i draws from fold_in(key, i): a longer batch (over several chunks) starts with the same rows.
    assert np.array_equal(sample_noise(KEY, 9000, 16, 1.0)[:15], a.reshape(15, 16))
    assert not np.array_equal(sample_noise(jax.random.key(1), 15, 16, 1.0), a.reshape(15, 16))
    x = np.random.default_rng(0).normal(size=(15, 16)).astype(np.float32)
    assert np.array_equal(privatize_representations(KEY, x, 1.0), x + a.reshape(15, 16))
    # A legacy uint32 key and an int seed work as their typed equivalents.
    assert np.array_equal(sample_noise(jax.random.PRNGKey(7), 4, 16, 1.0), sample_noise(jax.random.key(7), 4, 16, 1.0))
    assert np.array_equal(sample_noise(7, 4, 16, 1.0), sample_noise(jax.random.key(7), 4, 16, 1.0))
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(PrivacyParameterError, match="eta"):
            sample_noise(KEY, 3, 16, bad)


# ---- nearest neighbours and M_txt ------------------------------------------------------------------
def test_nearest_tokens_equal_brute_force():
    rng = np.random.default_rng(1)
    table = rng.normal(size=(500, 12)).astype(np.float32)
    scales = np.repeat([0.1, 1.0, 10.0, 1000.0], 500)[:, None]
    pts = (table[rng.integers(0, 500, scales.size)] + rng.normal(size=(scales.size, 12)) * scales).astype(np.float32)
    allowed = np.sort(rng.choice(500, 300, replace=False))
    for allow in (None, allowed):
        sub = table if allow is None else table[allow]
        ref_ids = np.arange(500) if allow is None else allow
        d = np.sqrt(((pts[:, None, :].astype(np.float64) - sub[None].astype(np.float64)) ** 2).sum(-1))
        order = np.argsort(d, axis=1)[:, :3]
        ids, dist = nearest_tokens(pts, table, allow, k=3)
        assert np.array_equal(ids, ref_ids[order])
        np.testing.assert_allclose(dist, np.take_along_axis(d, order, 1), rtol=1e-4, atol=1e-4)


def test_txt_is_nearest_token_of_rep_and_extremes(ppmi_space):
    space = ppmi_space
    ids = np.repeat(space.allowed, 5)
    scale = _median_nn_distance(space)
    eta = space.dim / scale  # mean noise radius = the median nearest-neighbour distance
    out = privatize_tokens(KEY, ids, space, eta)
    noised = privatize_representations(KEY, space.table[ids], eta)
    assert np.array_equal(out, nearest_tokens(noised, space)[0][:, 0])
    assert np.isin(out, space.allowed).all()
    # Huge eta: the noise (radius ~ dim/eta) is far below every distance: identity.
    assert np.array_equal(privatize_tokens(KEY, ids, space, 1e7), ids)
    # Tiny eta: the output hardly depends on the input (N_w small, S_w large).
    pd = plausible_deniability(KEY, space, [space.dim / (1000 * scale)], trials=100, sample=40)
    assert pd.same.max() <= 15 and np.median(pd.same) <= 2
    assert np.median(pd.distinct) >= 40
    # Out-of-vocabulary and special inputs are privatized from their own row, never output.
    special = np.array([0, space.oov_id, space.oov_id + 1])
    assert np.isin(privatize_tokens(KEY, np.repeat(special, 50), space, eta), space.allowed).all()


def test_txt_output_distribution_in_one_dimension_is_exact():
    """1-D table: M_txt(x) = the token whose Voronoi interval holds x + Laplace(0, 1/eta), so each
    output's probability is a difference of Laplace CDFs. Empirical counts within z <= 5 of them;
    and those exact probabilities satisfy the eta·d_chi bound for every pair of inputs."""
    pts = np.array([0.0, 1.0, 1.5, 4.0])
    table = pts[:, None].astype(np.float32)
    edges = np.r_[-np.inf, (pts[1:] + pts[:-1]) / 2, np.inf]
    eta, n = 1.0, 40_000

    def exact(x: float) -> np.ndarray:
        return np.diff(stats.laplace(loc=x, scale=1 / eta).cdf(edges))

    out = privatize_tokens(KEY, np.full(n, 1), table, eta)
    p = exact(1.0)
    for j in range(4):
        assert abs(np.sum(out == j) - n * p[j]) <= Z * math.sqrt(n * p[j] * (1 - p[j]))
    probs = np.array([exact(x) for x in pts])
    for a in range(4):
        for b in range(4):
            assert np.all(probs[a] <= np.exp(eta * abs(pts[a] - pts[b])) * probs[b] * (1 + 1e-12))


def test_privatize_streams_match_per_stream_calls(ppmi_space):
    rng = np.random.default_rng(2)
    a, b = rng.choice(ppmi_space.allowed, 30), rng.choice(ppmi_space.allowed, 17)
    streams = np.r_[np.full(30, 7), np.full(17, 3)]
    positions = np.r_[np.arange(30), np.arange(17)]
    for mech, t in (("txt", None), ("vickrey", 0.4)):
        got = privatize_streams(KEY, streams, positions, np.r_[a, b], ppmi_space, 2.0, mech, t)
        one = privatize_tokens if mech == "txt" else (lambda k, i, s, e: vickrey_tokens(k, i, s, e, 0.4))
        want = np.r_[one(jax.random.fold_in(KEY, 7), a, ppmi_space, 2.0), one(jax.random.fold_in(KEY, 3), b, ppmi_space, 2.0)]
        assert np.array_equal(got, want)


# ---- the Vickrey mechanism --------------------------------------------------------------------------
def test_vickrey_probability_is_xu_et_al_algorithm_1():
    rng = np.random.default_rng(3)
    d = np.sort(rng.uniform(0.01, 5, size=(100, 2)), axis=1)
    for t in (0.0, 0.25, 0.5, 0.9, 1.0):
        p = vickrey_probabilities(d, t)
        d1, d2 = d[:, 0], d[:, 1]
        np.testing.assert_allclose(p[:, 1], t * d1 / (t * d1 + (1 - t) * d2), rtol=1e-12)
        np.testing.assert_allclose(p.sum(1), 1.0)
    # k = 3: P(r) proportional to c_r d_1/d_r, c = (1-t, t/2, t/2).
    d3 = np.array([[1.0, 2.0, 4.0]])
    w = np.array([0.4, 0.3 / 2, 0.3 / 4])
    np.testing.assert_allclose(vickrey_probabilities(d3, 0.6), [w / w.sum()])


def test_vickrey_selection_frequencies_match_formula():
    # Hand-built 2-D table; the query point (0.3, 0) has w1 = (0,0) at d1 = 0.3 and w2 = (1,0) at d2 = 0.7.
    table = np.array([[0, 0], [1, 0], [0, 3], [-3, -3], [4, 4]], np.float32)
    n = 20_000
    pts = np.tile(np.array([[0.3, 0.0]], np.float32), (n, 1))
    for t in (0.0, 0.6, 1.0):
        out = vickrey_select(KEY, pts, table, t)
        assert set(np.unique(out)) <= {0, 1}
        p = t * 0.3 / (t * 0.3 + (1 - t) * 0.7)
        count = int(np.sum(out == 1))
        assert abs(count - n * p) <= Z * math.sqrt(n * p * (1 - p)) + 1e-9
    # k = 3 (third nearest (0,3) at d3 = sqrt(0.09 + 9)): each candidate's count within z <= 5.
    d = np.array([0.3, 0.7, math.hypot(0.3, 3.0)])
    p3 = vickrey_probabilities(d[None], 0.6)[0]
    out = vickrey_select(KEY, pts, table, 0.6, k=3)
    for cand, p in zip((0, 1, 2), p3):
        assert abs(np.sum(out == cand) - n * p) <= Z * math.sqrt(n * p * (1 - p))


def test_vickrey_mechanism_end_to_end_frequency():
    """Whole mechanism: with the noised points known (same key as M_rep), the number of second-
    nearest outputs is a sum of Bernoulli(p_i), p_i from Algorithm 1; within z <= 5 of sum p_i."""
    table = np.array([[0, 0], [1, 0], [0, 1], [1, 1], [3, 0], [0, 3]], np.float32)
    ids = np.zeros(20_000, np.int64)
    eta, t = 3.0, 0.5
    out = vickrey_tokens(KEY, ids, table, eta, t)
    noised = privatize_representations(KEY, table[ids], eta).astype(np.float64)
    d = np.sqrt(((noised[:, None, :] - table[None].astype(np.float64)) ** 2).sum(-1))
    order = np.argsort(d, axis=1)
    w1, w2 = order[:, 0], order[:, 1]
    d1, d2 = d[np.arange(ids.size), w1], d[np.arange(ids.size), w2]
    p = t * d1 / (t * d1 + (1 - t) * d2)
    assert np.all((out == w1) | (out == w2))
    second = np.sum(out == w2)
    assert abs(second - p.sum()) <= Z * math.sqrt(np.sum(p * (1 - p)))
    # t = 0 is M_txt with the same key, exactly.
    assert np.array_equal(vickrey_tokens(KEY, ids, table, eta, 0.0), privatize_tokens(KEY, ids, table, eta))
    with pytest.raises(PrivacyParameterError, match=r"\[0, 1\]"):
        vickrey_tokens(KEY, ids, table, eta, 1.5)
    with pytest.raises(PrivacyParameterError, match="k >= 2"):
        vickrey_tokens(KEY, ids, table, eta, 0.5, k=1)


# ---- sequences ---------------------------------------------------------------------------------------
def test_privatize_text_with_a_word_vocab():
    vocab = WordVocab(["the", "cat", "sat", "on", "mat", "dog"])
    table = np.random.default_rng(4).normal(size=(len(vocab), 16)).astype(np.float32)
    words = "the cat sat on the zebra".split()
    new, note = privatize_text(KEY, words, vocab, table, "txt", 1e6)
    assert new[:5] == words[:5]  # huge eta: unchanged; the oov word becomes a vocabulary word
    assert new[5] in vocab.words
    assert "eta·d_chi per token" in note and "sum over positions of the Euclidean distances (Hamming-like composition)" in note
    new, _ = privatize_text(KEY, words * 50, vocab, table, "vickrey", 0.5, t=0.5)
    assert len(new) == 300 and set(new) <= set(vocab.words)  # never <pad>, <oov>, <bos>, <eos>
    with pytest.raises(PrivacyParameterError, match="outputs embeddings"):
        privatize_text(KEY, words, vocab, table, "rep", 1.0)


# ---- empirical privacy ------------------------------------------------------------------------------
def test_plausible_deniability_is_monotone_in_eta(ppmi_space, tmp_path):
    scale = _median_nn_distance(ppmi_space)
    # Mean noise radius from 4x to 1/2 of the median nearest-neighbour distance.
    etas = [ppmi_space.dim / (c * scale) for c in (4.0, 2.0, 1.0, 0.5)]
    for mech, t in (("txt", None), ("vickrey", 0.5)):
        pd = plausible_deniability(KEY, ppmi_space, etas, trials=200, mechanism=mech, t=t, sample=60)
        assert pd.same.shape == pd.distinct.shape == (4, 60)
        assert ((pd.same >= 0) & (pd.same <= 200) & (pd.distinct >= 1) & (pd.distinct <= 200)).all()
        summary = pd.summary()
        for stat in ("mean", "p50"):
            n_w = [s["N_w"][stat] for s in summary]
            s_w = [s["S_w"][stat] for s in summary]
            # eta grows along the grid: N_w grows, S_w shrinks (strictly for the mean).
            assert all(a <= b for a, b in zip(n_w, n_w[1:])) and all(a >= b for a, b in zip(s_w, s_w[1:])), (mech, stat, n_w, s_w)
            if stat == "mean":
                assert all(a < b for a, b in zip(n_w, n_w[1:])) and all(a > b for a, b in zip(s_w, s_w[1:]))
        json.dumps(pd.to_json())
    png = plot_deniability(pd, tmp_path / "pd.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_inversion_accuracy_decreases_with_eta(ppmi_space, shakespeare_words):
    scale = _median_nn_distance(ppmi_space)
    etas = [ppmi_space.dim / (c * scale) for c in (4.0, 2.0, 1.0, 0.5)]
    res = token_inversion(KEY, ppmi_space, shakespeare_words, etas, max_tokens=4000)
    assert res.tokens == 4000 and res.skipped_oov > 0
    assert all(a < b for a, b in zip(res.accuracy, res.accuracy[1:])), res.accuracy
    assert res.accuracy[0] < 0.2 and res.accuracy[-1] > 0.9


# ---- loaders ----------------------------------------------------------------------------------------
def test_glove_loader_and_its_errors(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("3 2\nthe 0.1 0.2\n\n, 1 -1e-3\nThe 5 5\n", encoding="utf-8")
    sp = load_glove(good)
    assert sp.words == ("the", ",", "The", "<oov>") and sp.dim == 2
    np.testing.assert_allclose(sp.table[sp.oov_id], sp.table[:3].mean(0), rtol=1e-6)
    assert list(sp.allowed) == [0, 1]  # "The" is not a normalized token: an input, never an output
    assert sp.id("zebra") == sp.oov_id
    cases = {
        "the 0.1 0.2\ncat 0.3\n": (2, "expected a word and 2 numbers"),
        "the 0.1 0.2\ncat 0.3 0.4 0.5\n": (2, "got 3 numbers"),
        "the 0.1 0.2\n\ncat 0.3 abc\n": (3, "'abc' is not a number"),
        "the 0.1 0.2\ncat nan 0.1\n": (2, "non-finite"),
        "the\n": (1, "a word and at least one number"),
        "the 0.1 0.2\n, 1 1\n\nthe 9 9\n": (4, "'the' has a second vector \\(its first is on line 1\\)"),  # (was kept silently: issue 31)
    }
    for i, (text, (line, message)) in enumerate(cases.items()):
        p = tmp_path / f"bad{i}.txt"
        p.write_text(text, encoding="utf-8")
        with pytest.raises(DataFormatError, match=message) as e:
            load_glove(p)
        assert e.value.path == str(p) and e.value.where == line and f"{p}:{line}:" in str(e.value)
    p = tmp_path / "latin1.txt"
    p.write_bytes(b"the 0.1\ncaf\xe9 0.2\n")
    with pytest.raises(DataFormatError, match="UTF-8") as e:
        load_glove(p)
    assert e.value.where == 2


def test_run_embeddings_from_an_nwp_run(tmp_path):
    from flax import serialization

    from fedpriv.config import validate_config
    from fedpriv.runner.prepare import load_training_corpora
    from fedpriv.tasks.registry import build_task

    raw = {
        "name": "local-privacy-run",
        "data": {"source": "shakespeare", "heldout_fraction": 0.1, "max_examples_per_user": 5},
        "vocab": {"size": 60, "seq_len": 8},
        "task": {"kind": "nwp", "model": "tiny"},
    }
    cfg = validate_config(raw)
    task = build_task(cfg, load_training_corpora(cfg, lambda _m: None)[0])
    params = task.init_params(jax.random.key(5))
    (tmp_path / "config.json").write_text(json.dumps({"experiment": cfg.model_dump()}))
    (tmp_path / "params.msgpack").write_bytes(serialization.to_bytes(params))
    with pytest.raises(FedprivError, match="without vocab.json"):
        load_run_embeddings(tmp_path)
    task.save_assets(tmp_path)  # what training writes: the word vocabulary
    space = load_run_embeddings(tmp_path)
    k = len(task.vocab.words)
    assert space.words[1 : k + 1] == task.vocab.words and space.oov_id == task.vocab.oov == k + 1
    assert np.array_equal(space.table, np.asarray(params["embed"]["embedding"]))
    assert list(space.allowed) == list(range(1, k + 1))
    new, _ = privatize_text(KEY, ["the", "king", "zzz"], task.vocab, space.table, "txt", 1e7)
    assert new[:2] == ["the", "king"] and new[2] in task.vocab.words
    other = tmp_path / "mlm"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"experiment": {**raw, "task": {"kind": "mlm", "model": "tiny"}}}))
    with pytest.raises(FedprivError, match="'mlm' run"):
        load_run_embeddings(other)


# ---- fedpriv privatize ---------------------------------------------------------------------------------
@pytest.fixture()
def cli(monkeypatch):
    """`fedpriv.cli.main` with the privatize app wired in as the main CLI will wire it:
    ``app.add_typer(privatize_app)``."""
    import typer

    import fedpriv.cli as main_cli
    from fedpriv.cli.privatize import privatize_app

    root = typer.Typer(name="fedpriv", no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
    root.registered_callback = main_cli.app.registered_callback
    root.registered_commands = list(main_cli.app.registered_commands)
    root.registered_groups = list(main_cli.app.registered_groups)
    root.add_typer(privatize_app)
    monkeypatch.setattr(main_cli, "app", root)
    return main_cli.main


@pytest.fixture(scope="module")
def coffee_glove(tmp_path_factory, coffee_posts) -> Path:
    corpus = open_corpus(str(coffee_posts))
    counts = Counter(w for ex in corpus.records() for w in ex.words())
    rng = np.random.default_rng(6)
    path = tmp_path_factory.mktemp("glove") / "coffee.txt"
    with open(path, "w", encoding="utf-8") as f:
        for w, _ in counts.most_common(300):
            f.write(w + " " + " ".join(f"{x:.6f}" for x in rng.normal(size=16)) + "\n")
    return path


def test_privatize_cli_end_to_end(cli, coffee_posts, coffee_glove, tmp_path, capsys):
    out = tmp_path / "private.jsonl"
    args = ["privatize", str(coffee_posts), "--embeddings", str(coffee_glove), "--eta", "4", "--out", str(out), "--seed", "3", "--progress-every", "50"]
    assert cli([*args, "--mechanism", "vickrey", "--t", "0.25"]) == 0
    err = capsys.readouterr().err
    assert "50/115 users privatized" in err and "wrote" in err  # the Community account -1 is dropped
    source, private = open_corpus(str(coffee_posts)), open_corpus(str(out))
    assert sorted(private.user_ids) == sorted(source.user_ids)
    assert all(len(private[u]) == len(source[u]) for u in source.user_ids)
    allowed = set(load_glove(coffee_glove).words[:300])
    for u in source.user_ids[:20]:
        for a, b in zip(source[u], private[u]):
            assert len(b.words()) == len(a.words()) and set(b.words()) <= allowed
    meta = json.loads((tmp_path / "private.privacy.json").read_text())
    assert (meta["mechanism"], meta["eta"], meta["t"], meta["k"]) == ("vickrey", 4.0, 0.25, 2)
    assert "seed" not in meta and meta["noise"].startswith("reproducible (simulation only)")
    assert meta["embeddings"]["spec"] == str(coffee_glove) and meta["users"] == 115
    assert "eta·d_chi per token" in meta["guarantee"] and "Hamming-like composition" in meta["guarantee"]
    first = out.read_bytes()
    assert cli([*args, "--mechanism", "vickrey", "--t", "0.25", "--batch-tokens", "1000"]) == 0
    assert out.read_bytes() == first  # batching does not change the output
    capsys.readouterr()
    assert cli(["privatize", "--help"]) == 0
    assert "privatize [OPTIONS] SOURCE" in capsys.readouterr().out  # one command, not a group


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--mechanism", "txt", "--eta", "0"], "eta must be finite and > 0"),
        (["--mechanism", "txt", "--eta", "-2"], "eta must be finite and > 0"),
        (["--mechanism", "vickrey", "--eta", "1", "--t", "1.5"], r"must be in \[0, 1\]"),
        (["--mechanism", "vickrey", "--eta", "1"], "needs --t"),
        (["--mechanism", "txt", "--eta", "1", "--t", "0.5"], "use it with --mechanism vickrey"),
        (["--mechanism", "rep", "--eta", "1"], r"rep writes vectors as a NumPy archive; name it \*\.npz"),
        (["--mechanism", "rep", "--eta", "1", "--t", "0.5"], "use it with --mechanism vickrey, not rep"),
    ],
)
def test_privatize_cli_refuses_bad_parameters(cli, coffee_posts, coffee_glove, tmp_path, capsys, extra, message):
    assert cli(["privatize", str(coffee_posts), "--embeddings", str(coffee_glove), "--out", str(tmp_path / "o.jsonl"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedpriv: error:")
    import re

    assert re.search(message, err), err
    assert not (tmp_path / "o.jsonl").exists()


def test_privatize_cli_rep_writes_the_noised_embeddings_txt_rounds(cli, coffee_posts, coffee_glove, tmp_path, capsys):
    """M_rep as a corpus of vectors: one row per word, the same keys as txt, so the nearest word to
    each row is exactly what --mechanism txt writes with the same seed; the noise radius is the
    Gamma(dim, 1/eta) of the mechanism (mean dim/eta)."""
    common = ["privatize", str(coffee_posts), "--embeddings", str(coffee_glove), "--eta", "4", "--seed", "5", "--batch-tokens", "700"]
    assert cli([*common, "--mechanism", "rep", "--out", str(tmp_path / "rep.npz")]) == 0
    assert cli([*common, "--mechanism", "txt", "--out", str(tmp_path / "txt.jsonl")]) == 0
    capsys.readouterr()
    z = np.load(tmp_path / "rep.npz")
    vectors, offsets, example_user, users = z["vectors"], z["offsets"], z["example_user"], list(z["users"])
    source, txt = open_corpus(str(coffee_posts)), open_corpus(str(tmp_path / "txt.jsonl"))
    assert users == list(source.user_ids) and offsets[-1] == vectors.shape[0] and vectors.shape[1] == 16
    space = load_glove(coffee_glove)
    examples = [(u, ex) for u in source.user_ids for ex in source[u]]
    assert len(examples) == len(example_user) == offsets.size - 1
    from fedpriv.privacy.local.mechanisms import nearest_tokens

    nearest = nearest_tokens(vectors, space)[0][:, 0]
    want = [w for u in txt.user_ids for ex in txt[u] for w in ex.words()]
    assert [space.words[i] for i in nearest] == want  # M_txt = nearest word of M_rep, same keys
    ids = space.ids([w for _u, ex in examples for w in ex.words()])
    radius = np.linalg.norm(vectors - space.table[ids], axis=1)
    assert radius.mean() == pytest.approx(16 / 4, rel=0.03)  # E[r] = dim / eta; std/sqrt(n) is < 0.5% here
    meta = json.loads((tmp_path / "rep.privacy.json").read_text())
    assert meta["mechanism"] == "rep" and "offsets" in meta["layout"] and "M_rep" in meta["guarantee"]


def test_privatize_cli_names_the_malformed_glove_line(cli, coffee_posts, tmp_path, capsys):
    glove = tmp_path / "bad.txt"
    glove.write_text("the 0.1 0.2\nof 0.3 0.4\nand 0.5 x\n", encoding="utf-8")
    assert cli(["privatize", str(coffee_posts), "--embeddings", str(glove), "--mechanism", "txt", "--eta", "1", "--out", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"{glove}:3:" in err and "'x' is not a number" in err
    assert cli(["privatize", str(coffee_posts), "--embeddings", str(glove), "--mechanism", "txt", "--eta", "1", "--out", str(tmp_path / "o.csv")]) == 2
    assert "*.jsonl" in capsys.readouterr().err


def test_docs_example_runs(capsys):
    import re

    doc = Path(__file__).resolve().parents[2] / "docs" / "local_privacy.md"
    (block,) = re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.S)
    exec(compile(block, str(doc), "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert len(out[0].split()) == 6 and "eta·d_chi per token" in out[1]
    medians = [float(line.split()[3]) for line in out[2:5]]
    assert medians == sorted(medians)


def test_privatize_cli_noise_is_secret_unless_seeded(cli, coffee_posts, coffee_glove, tmp_path, capsys):
    """Without --seed the noise comes from the OS CSPRNG: two runs on the same input differ, and
    nothing written beside the output (sidecar, stderr) determines the noise; with --seed the
    output is reproducible and one line warns that the seed removes the noise."""
    common = ["privatize", str(coffee_posts), "--embeddings", str(coffee_glove), "--eta", "2", "--mechanism", "txt", "--progress-every", "1000"]
    assert cli([*common, "--out", str(tmp_path / "a.jsonl")]) == 0
    err_a = capsys.readouterr().err
    assert cli([*common, "--out", str(tmp_path / "b.jsonl")]) == 0
    capsys.readouterr()
    a, b = (tmp_path / "a.jsonl").read_bytes(), (tmp_path / "b.jsonl").read_bytes()
    assert a.count(b"\n") == b.count(b"\n") and a != b  # eta = 2 changes most tokens: two secret draws differ
    side = json.loads((tmp_path / "a.privacy.json").read_text())
    assert "seed" not in side and side["noise"].startswith("secret")
    assert "seed" not in err_a and "reproducible noise" not in err_a
    # The seeds a reader might guess reproduce neither output.
    for guess in (0, 1):
        assert cli([*common, "--seed", str(guess), "--out", str(tmp_path / f"s{guess}.jsonl")]) == 0
        err = capsys.readouterr().err
        assert err.splitlines()[0] == "warning: reproducible noise: anyone with the seed can remove it; for simulation only"
        assert (tmp_path / f"s{guess}.jsonl").read_bytes() not in (a, b)
    assert cli([*common, "--seed", "1", "--out", str(tmp_path / "s1b.jsonl")]) == 0
    assert (tmp_path / "s1b.jsonl").read_bytes() == (tmp_path / "s1.jsonl").read_bytes()
    side = json.loads((tmp_path / "s1.privacy.json").read_text())
    assert "seed" not in side and "1" not in side["noise"]
