"""A public WordPiece vocabulary extended by the words of a private corpus's DP histogram
(issue 23): the public part is learned from public text alone, the private part is whole words
read from the released histogram only, and the report gives the coverage of each part."""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from fedpriv.data.shakespeare import load_shakespeare
from fedpriv.errors import FedprivError
from fedpriv.vocab.build import PRIVATE_WORD_SHARE, build_vocab
from fedpriv.vocab.word import count_words
from fedpriv.vocab.wordpiece import WordPieceVocab, extend_wordpiece, learn_wordpiece


@pytest.fixture(scope="module")
def shakespeare_counts() -> Counter:
    return count_words(ex.text.lower() for ex in load_shakespeare().records())


def test_extension_appends_the_most_frequent_missing_words_in_order():
    base = learn_wordpiece({"the": 50, "cat": 20, "sat": 10}, 30)
    assert "the" in base.tokens and "mitochondria" not in base.tokens
    private = {"the": 900.0, "gene": 40.0, "adenoma": 40.0, "brca1": 30.0, "x" * 101: 500.0, "rare": 1.0, "noise": -3.0}
    v, added = extend_wordpiece(base, private, len(base) + 3)
    # "the" is already a token, the 101-character word cannot be read by the tokenizer, ties by word,
    # and the vocabulary stops at its size: "rare" does not fit, "noise" has no positive count
    assert added == ["adenoma", "gene", "brca1"]
    assert list(v.tokens) == [*base.tokens, *added] and len(v) == len(base) + 3
    assert v.tokenize_word("adenoma") == ("adenoma",) and v.tokenize_word("brca1") == ("brca1",)
    assert extend_wordpiece(base, private, len(base) + 100)[1] == ["adenoma", "gene", "brca1", "rare"]
    with pytest.raises(FedprivError, match="smaller than the base vocabulary"):
        extend_wordpiece(base, private, len(base) - 1)


def test_public_vocabulary_extended_by_the_dp_histogram(tmp_path, ncbi_train, shakespeare_counts):
    size = 3000
    report = build_vocab(
        str(ncbi_train), "wordpiece", size, "gaussian", out_dir=tmp_path / "v", epsilon=0.99, delta=1e-6, tuple_size=32,
        partition="example", lowercase=True, alphabet="ascii", public="shakespeare", source_options={"users": "sentences:10"},
    )
    v = WordPieceVocab.load(tmp_path / "v" / "vocab.txt")
    released = {}
    for line in (tmp_path / "v" / "histogram.tsv").read_text().splitlines():
        w, c = line.split("\t")
        released[w] = float(c)
    pub = report["public"]
    # the public part is exactly the vocabulary learned from the public text alone ...
    from fedpriv.vocab.build import public_alphabet

    chars = public_alphabet("ascii", True)
    public_only = learn_wordpiece(shakespeare_counts, size, alphabet=chars)
    missing = [w for w in released if w not in public_only]
    assert 0 < len(missing) < size * PRIVATE_WORD_SHARE
    base = learn_wordpiece(shakespeare_counts, size - len(missing), alphabet=chars)
    assert v.tokens[: len(base)] == base.tokens and pub["base_tokens"] == len(base)
    # ... and every other token is a whole word of the released (DP) histogram, most frequent first
    added = list(v.tokens[len(base):])
    assert added and len(added) == pub["words_added"] and all(w in released for w in added)
    counts = [released[w] for w in added]
    assert counts == sorted(counts, reverse=True)
    # coverage on the private corpus: the extended vocabulary splits NCBI's words into fewer pieces
    # than the public one alone or the one learned from the DP histogram alone
    ppw = report["vocabulary"]["pieces_per_word"]
    assert ppw < pub["public_only"]["pieces_per_word"] and ppw < pub["histogram_only"]["pieces_per_word"]
    assert report["vocabulary"]["unk_rate"] == 0.0  # the public ASCII alphabet spells every word
    assert "DP histogram" in report["guarantee"] and report["epsilon"] == pytest.approx(0.99)
    assert len(v) == size  # the slots kept for private words are all used


def test_public_needs_wordpiece_and_words(tmp_path, ncbi_train):
    with pytest.raises(FedprivError, match="extends WordPiece vocabularies, not word"):
        build_vocab(str(ncbi_train), "word", 100, out_dir=tmp_path / "w", public="shakespeare")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(FedprivError):
        build_vocab(str(ncbi_train), "wordpiece", 500, out_dir=tmp_path / "e", public=str(empty))
    assert not (tmp_path / "e").exists()  # nothing written


def test_vocab_build_cli_public(tmp_path, ncbi_train):
    out = subprocess.run(
        [str(Path(sys.executable).with_name("fedpriv")), "vocab", "build", str(ncbi_train), "-o", "users=sentences:10", "--kind", "wordpiece",
         "--size", "2000", "--dp", "gaussian", "--epsilon", "0.99", "--tuple-size", "32", "--delta", "1e-6", "--partition", "example", "--lowercase",
         "--alphabet", "ascii", "--public", "shakespeare", "--out", str(tmp_path / "v"), "--json"],
        capture_output=True, text=True, check=True,
    )
    report = json.loads(out.stdout)
    assert report["public"]["words_added"] > 0 and report["public"]["source"]
    assert report["vocabulary"]["vocab_size"] <= 2000


NCBI = "tests/data/ncbi-disease/train.tsv"


@pytest.mark.slow
def test_a_bert_run_with_a_public_extended_vocabulary(run_toml):
    """vocab.public in an experiment: the run's tokenizer is the extended vocabulary, the released
    record names the public text and carries the DP guarantee, never the raw-data coverage."""
    from fedpriv.tasks.bert_run import released_vocabulary

    store, (s,) = run_toml(f"""
name = "public-extended"
seed = 0
[data]
source = "shakespeare"
heldout_fraction = 0.1
max_examples_per_user = 10
[task]
kind = "mlm"
model = "tiny"
options = {{ max_len = 24, lowercase = true }}
[training]
optimizer = "adam"
learning_rate = 0.002
batch_size = 16
steps = 2
eval_every = 2
checkpoint_every = 2
[vocab]
size = 600
alphabet = "ascii"
source = "{NCBI}"
source_options = {{ users = "sentences:10" }}
dp = "gaussian"
epsilon = 0.99
delta = 1e-6
tuple_size = 32
public = "shakespeare"
[[runs]]
name = "bert"
kind = "central"
""")
    rec = s["vocabulary"]
    assert rec["public_source"] == "shakespeare" and rec["public"]["words_added"] > 0 and rec["vocab_size"] == 600
    released = json.loads((store / "bert" / "tokenizer.json").read_text())["vocabulary"]
    assert released == released_vocabulary(rec) and released["public_source"] == "shakespeare"
    assert "public" not in released and released["dp"]["epsilon"] == pytest.approx(0.99)
