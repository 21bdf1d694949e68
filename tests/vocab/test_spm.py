"""DP-SentencePiece: TSV histogram, unigram and BPE training, atomic output, the built-in DP probe."""

import pytest

from fedpriv.data.shakespeare import load_shakespeare
from fedpriv.errors import FedprivError
from fedpriv.vocab.dp_histogram import corpus_word_sequences, count_histogram
from fedpriv.vocab.spm import builtin_dp_available, load_sentencepiece, train_builtin_dp, train_sentencepiece, write_counts_tsv


@pytest.fixture(scope="module")
def dp_counts() -> dict:
    h = count_histogram(corpus_word_sequences(load_shakespeare()), epsilon=0.9, delta=1e-6, tuple_size=4, seed=0)
    assert 50 < h.words_kept < h.words_before
    return h.counts


def test_counts_tsv_rounds_to_positive_ints(tmp_path):
    path = tmp_path / "h.tsv"
    n = write_counts_tsv({"b": 2.6, "a": 0.4, "c": 2.5, "neg": -3.0, "zero": 0.0, "two words": 9.0, "tab\tword": 9.0}, path)
    assert n == 3
    assert path.read_text(encoding="utf-8") == "b\t3\nc\t2\na\t1\n"  # most frequent first; round half to even
    assert not list(tmp_path.glob("*.partial"))


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_trains_from_the_dp_histogram_and_encodes(tmp_path, dp_counts, model_type):
    m = train_sentencepiece(dp_counts, tmp_path / "out", vocab_size=300, model_type=model_type)
    assert m.model_path.is_file() and m.vocab_path.is_file()
    assert 0 < m.vocab_size <= 300
    sp = load_sentencepiece(m.model_path)
    text = "the king is dead , long live the king"
    pieces = sp.encode(text, out_type=str)
    assert len(pieces) >= len(text.split())
    assert sp.decode(sp.encode(text)) == text
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["spm.model", "spm.vocab"]  # no staging left


def test_unigram_scales_a_large_total_down(tmp_path, dp_counts):
    total = sum(dp_counts.values())
    m = train_sentencepiece(dp_counts, tmp_path / "u", vocab_size=200, max_total_count=int(total // 10))
    assert m.count_scale == pytest.approx(0.1, rel=0.01)
    b = train_sentencepiece(dp_counts, tmp_path / "b", vocab_size=200, model_type="bpe", max_total_count=int(total // 10))
    assert b.count_scale == 1.0  # BPE's cost does not grow with the total
    path = tmp_path / "s.tsv"
    write_counts_tsv({"a": 1000.0, "b": 3.0}, path, scale=0.01)
    assert path.read_text(encoding="utf-8") == "a\t10\nb\t1\n"


def test_trains_from_a_tsv_path(tmp_path, dp_counts):
    tsv = tmp_path / "h.tsv"
    write_counts_tsv(dp_counts, tsv)
    m = train_sentencepiece(tsv, tmp_path / "out", vocab_size=200, model_type="unigram", prefix="m")
    assert m.model_path.name == "m.model" and m.processor().get_piece_size() == m.vocab_size


def test_failure_leaves_nothing_behind(tmp_path, dp_counts):
    out = tmp_path / "out"
    with pytest.raises(FedprivError, match="sentencepiece"):
        train_sentencepiece(dp_counts, out, vocab_size=5)  # fewer than the required characters
    assert list(out.iterdir()) == []
    with pytest.raises(FedprivError, match="model_type"):
        train_sentencepiece(dp_counts, out, vocab_size=100, model_type="char")


def test_builtin_dp_cross_check(tmp_path):
    import sentencepiece

    available = builtin_dp_available()
    if sentencepiece.__version__ == "0.2.3":
        assert available is False  # 0.2.3 logs "deprecated and ignored" and trains on the raw counts
    raw = {"hello": 500, "world": 400, "help": 300, "rare": 1}
    if not available:
        with pytest.raises(FedprivError, match="ignores enable_differential_privacy"):
            train_builtin_dp(raw, tmp_path, vocab_size=30, noise_level=1.0, clipping_threshold=50)
        assert not any(tmp_path.iterdir())
    else:  # pragma: no cover - sentencepiece builds that still honour the options
        m = train_builtin_dp(raw, tmp_path, vocab_size=30, noise_level=1.0, clipping_threshold=50)
        assert m.model_path.is_file()
