"""Top-K word vocabulary and TFF-style fixed-length encoding."""

import numpy as np
import pytest

from fedpriv.data.shakespeare import load_shakespeare
from fedpriv.errors import DataFormatError, FedprivError
from fedpriv.vocab.word import WordVocab, count_words


def test_ids_follow_the_tff_stackoverflow_layout():
    v = WordVocab.from_counts({"b": 5, "a": 5, "c": 9, "d": 1}, size=3)
    assert v.words == ("c", "a", "b")  # by count, ties alphabetical
    assert (v.pad, v.oov, v.bos, v.eos) == (0, 4, 5, 6)
    assert len(v) == 7


def test_encode_pads_adds_bos_eos_and_truncates():
    v = WordVocab(["the", "cat"])
    assert v.encode("the cat sat", seq_len=5).tolist() == [v.bos, 1, 2, v.oov, v.eos, 0]
    # Exactly seq_len words: no room for eos, as in TFF.
    assert v.encode("the cat the", seq_len=3).tolist() == [v.bos, 1, 2, 1]
    assert v.encode("the cat the cat", seq_len=3).tolist() == [v.bos, 1, 2, 1]
    assert v.encode("", seq_len=2).tolist() == [v.bos, v.eos, 0]
    assert v.decode(v.encode("the dog", 4)) == ["<bos>", "the", "<oov>", "<eos>", "<pad>"]


def test_shakespeare_top_10000_gives_10004_ids():
    texts = [e.text for e in load_shakespeare().records()]
    v = WordVocab.build(texts, 10_000)
    assert len(v) == 10_004
    counts = count_words(texts)
    assert v.words[:3] == (",", ".", "the")
    kept_min = min(counts[w] for w in v.words)
    dropped_max = max(c for w, c in counts.items() if w not in set(v.words))
    assert kept_min >= dropped_max
    ids = v.encode_batch(texts[:100], 20)
    assert ids.shape == (100, 21) and ids.dtype == np.int32
    assert (ids[:, 0] == v.bos).all()


def test_save_load_round_trip_and_errors(tmp_path):
    v = WordVocab(["x", "y"])
    v.save(tmp_path / "v.json")
    assert WordVocab.load(tmp_path / "v.json").words == v.words
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DataFormatError, match="bad.json"):
        WordVocab.load(tmp_path / "bad.json")
    with pytest.raises(FedprivError):
        WordVocab(["a", "a"])
    with pytest.raises(FedprivError):
        WordVocab.from_counts({"a": 1}, size=0)
