"""`fedpriv vocab build`: Shakespeare and NCBI-disease, with and without DP; figures, files, refusals."""

import json
import math

import pytest

from fedpriv import cli
from fedpriv.cli.vocab import vocab_app
from fedpriv.rundir import MARKER
from fedpriv.vocab.build import build_vocab
from fedpriv.vocab.word import WordVocab
from fedpriv.vocab.wordpiece import WordPieceVocab

if not any(g.name == "vocab" for g in cli.app.registered_groups):  # until fedpriv/cli.py registers it
    cli.app.add_typer(vocab_app, name="vocab")


def run(capsys, *args):
    code = cli.main(["vocab", "build", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_shakespeare_wordpiece_gaussian(tmp_path, capsys):
    out = tmp_path / "wp"
    code, stdout, _ = run(capsys, "shakespeare", "--kind", "wordpiece", "--size", 1500, "--dp", "gaussian", "--sigma", 25,
                          "--delta", 1e-6, "--tuple-size", 16, "--seed", 1, "--out", out, "--json")
    assert code == 0
    r = json.loads(stdout)
    assert r["epsilon"] == pytest.approx(4 / 25 * math.sqrt(2 * math.log(1.25e6)), rel=1e-12)
    assert r["dp"]["sigma"] == 25 and r["dp"]["tuple_size"] == 16 and r["dp"]["unit"] == "16-word tuple"
    assert 0 < r["words_kept"] < r["words_before"] == r["distinct_words"]
    assert r["words_kept"] + r["words_dropped"] == r["words_before"]
    assert r["vocabulary"]["vocab_size"] <= 1500 and r["non_private"]["vocab_size"] == 1500
    assert r["vocabulary"]["pieces_per_word"] > r["non_private"]["pieces_per_word"]  # what privacy costs
    assert "adding or removing one 16-word tuple" in r["guarantee"]
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "histogram.tsv", "report.json", "vocab.txt"]
    assert json.loads((out / "report.json").read_text()) == r
    v = WordPieceVocab.load(out / "vocab.txt")
    assert len(v) == r["vocabulary"]["vocab_size"]
    kept = {line.split("\t")[0] for line in (out / "histogram.tsv").read_text(encoding="utf-8").splitlines()}
    assert len(kept) == r["words_kept"]


def test_shakespeare_plain_word_table(tmp_path, capsys):
    code, stdout, _ = run(capsys, "shakespeare", "--kind", "word", "--size", 500, "--out", tmp_path / "w")
    assert code == 0
    assert "vocabulary size" in stdout and "guarantee: none" in stdout and "12,879" in stdout
    assert len(WordVocab.load(tmp_path / "w" / "vocab.json").words) == 500


def test_ncbi_sentencepiece_count_and_plain(ncbi_train, tmp_path, capsys):
    code, stdout, _ = run(capsys, ncbi_train, "-o", "users=sentences:10", "--kind", "sentencepiece", "--size", 400,
                          "--dp", "count", "--epsilon", 0.9, "--delta", 1e-6, "--tuple-size", 4, "--model-type", "bpe",
                          "--out", tmp_path / "spm", "--json")
    assert code == 0
    r = json.loads(stdout)
    assert r["source"] == "conll:train.tsv[sentences:10]" and r["examples"] == 5424
    assert r["epsilon"] == pytest.approx(0.9, rel=1e-12) and r["dp"]["unit"] == "example"
    assert r["threshold"] > 4 and r["words_kept"] > 0
    assert (tmp_path / "spm" / "spm.model").is_file()
    code, stdout, _ = run(capsys, ncbi_train, "--kind", "sentencepiece", "--size", 400, "--out", tmp_path / "plain")
    assert code == 0 and "pieces per word" in stdout and "not differentially private" in stdout


def test_ncbi_wordpiece_laplace_table(ncbi_train, tmp_path, capsys):
    code, stdout, _ = run(capsys, ncbi_train, "--kind", "wordpiece", "--size", 800, "--dp", "laplace", "--epsilon", 1,
                          "--delta", 1e-7, "--tuple-size", 64, "--out", tmp_path / "lap")
    assert code == 0
    for figure in ("epsilon", "laplace scale", "threshold C", "words kept", "words dropped", "non-private", "guarantee:"):
        assert figure in stdout
    r = json.loads((tmp_path / "lap" / "report.json").read_text())
    assert r["epsilon"] == pytest.approx(64.0) and r["dp"]["epsilon_per_word"] == 1.0
    assert r["threshold"] == pytest.approx(1 + 2 * math.log(2e7), rel=1e-12)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dp", "gaussian", "--sigma", "5"], "epsilon must be in (0, 1)"),
        (["--dp", "gaussian", "--sigma", "200", "--delta", "0"], "delta must be in"),
        (["--dp", "gaussian", "--sigma", "200", "--tuple-size", "0"], "tuple_size (N) must be"),
        (["--dp", "gaussian"], "give exactly one of sigma"),
        (["--dp", "laplace", "--epsilon", "-1"], "epsilon must be > 0"),
        (["--epsilon", "0.5"], "without a DP mechanism"),
        # N = 256, delta = 1e-9 on a small corpus: at epsilon 0.05 the threshold (about 14,000) is 6.4 sigma above
        # Shakespeare's top counts (about 900), so no word is kept whatever the secret noise (at 0.5 one was, 2-3% of runs)
        (["--dp", "gaussian", "--epsilon", "0.05"], "kept no word"),
    ],
)
def test_refusals_are_one_line_and_write_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "v"
    code, _, err = run(capsys, "shakespeare", "--size", 100, "--out", out, *args)
    assert code == 2
    assert err.startswith("fedpriv: error: ") and message in err and err.count("\n") == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_an_out_folder_that_cannot_be_made_is_one_line(capsys):
    """(Once a FileNotFoundError on the staging file.) /proc refuses new folders, even to root."""
    code, _, err = run(capsys, "shakespeare", "--size", 100, "--out", "/proc/fedpriv-nope/v")
    assert code == 2 and err.startswith("fedpriv: error: /proc/fedpriv-nope") and err.count("\n") == 1, err


def test_build_vocab_api_on_a_corpus(tmp_path):
    from fedpriv.data.shakespeare import load_shakespeare

    r = build_vocab(load_shakespeare(), "word", 300, "gaussian", epsilon=0.8, delta=1e-6, tuple_size=8,
                    partition="example", out_dir=tmp_path / "w", seed=2)
    assert r["epsilon"] == pytest.approx(0.8) and r["dp"]["partition"] == "example"
    assert r["vocabulary"]["vocab_size"] == min(300, r["words_kept"])
    assert r["vocabulary"]["oov_rate"] >= r["non_private"]["oov_rate"]


def test_dp_noise_is_secret_unless_seeded(tmp_path, capsys):
    """Without --seed two builds of the same DP histogram draw different noise and the report holds
    nothing that determines it; --seed reproduces it, warns in one line, and is not stored."""
    common = ["shakespeare", "--kind", "word", "--size", 200, "--dp", "gaussian", "--sigma", 20, "--delta", 1e-6, "--tuple-size", 8, "--json"]
    outs = []
    for name in ("a", "b"):
        code, stdout, err = run(capsys, *common, "--out", tmp_path / name)
        assert code == 0 and "reproducible noise" not in err
        r = json.loads(stdout)
        assert "seed" not in r and r["noise"].startswith("secret")
        outs.append((tmp_path / name / "histogram.tsv").read_text(encoding="utf-8"))
    assert outs[0] != outs[1]  # sigma = 20 on rounded counts: two secret draws differ
    for name in ("s", "t"):
        code, stdout, err = run(capsys, *common, "--seed", 4, "--out", tmp_path / name)
        assert code == 0 and err.splitlines()[0] == "warning: reproducible noise: anyone with the seed can remove it; for simulation only"
        r = json.loads(stdout)
        assert "seed" not in r and r["noise"].startswith("reproducible (simulation only)")
    assert (tmp_path / "s" / "histogram.tsv").read_bytes() == (tmp_path / "t" / "histogram.tsv").read_bytes()
    assert (tmp_path / "s" / "histogram.tsv").read_text(encoding="utf-8") not in outs


def test_gaussian_user_partition_one_tuple_per_user(tmp_path, capsys):
    from fedpriv.data.sources import open_corpus
    from fedpriv.vocab.dp_histogram import dp_histogram

    spec = "synthetic:users=600,examples=3000,vocab_size=300,seed=1"
    out = tmp_path / "u"
    code, stdout, _ = run(capsys, spec, "--kind", "word", "--size", 200, "--dp", "gaussian", "--partition", "user", "--epsilon", 0.9,
                          "--delta", 1e-5, "--tuple-size", 16, "--seed", 5, "--out", out, "--json")
    assert code == 0
    r = json.loads(stdout)
    corpus = open_corpus(spec)
    per_user = [[w for ex in exs for w in ex.words()] for _, exs in corpus.users()]
    hist = dp_histogram(per_user, "gaussian", seed=5, epsilon=0.9, delta=1e-5, tuple_size=16, partition="user")
    assert r["dp"]["unit"] == "user" and r["dp"]["partition"] == "user" and r["dp"]["units"] == 600 == hist.units
    assert r["epsilon"] == pytest.approx(0.9, rel=1e-12) and "adding or removing one user" in r["guarantee"]
    kept = {line.split("\t")[0] for line in (out / "histogram.tsv").read_text(encoding="utf-8").splitlines()}
    assert kept == set(hist.counts) and 0 < len(kept) < r["distinct_words"]
