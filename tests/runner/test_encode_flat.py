"""The vectorized encode path gives what the per-example path gave: the same arrays, in the same
order, and the same counts of words cut, on the arXiv slice (sentences) and on a tagged corpus."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from fedpriv.data.conll import load_conll
from fedpriv.data.sources import open_corpus
from fedpriv.runner import prepare as prep
from fedpriv.runner.prepare import Cuts, encode_corpus
from fedpriv.tasks.ner import NERTask
from fedpriv.tasks.nwp import NWPTask
from fedpriv.vocab.word import WordVocab, count_words

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def arxiv():
    return open_corpus(str(DATA / "arxiv-csai" / "abstracts.jsonl.gz"), user_column="first_author", text_column="abstract", unit="sentence")


def encode_per_example(task, corpus, cuts: Cuts) -> dict[str, np.ndarray]:
    """The path before the flat one: per-example counting, per-example encoding, concatenation."""
    chunks, buf = [], []
    for ex in corpus.records():
        cuts.add(task.words_cut(ex), len(ex.words()), task.pieces(ex))
        buf.append(ex)
        if len(buf) == 1000:
            chunks.append(task.encode(buf) if not isinstance(task, NWPTask) else {"ids": np.stack([task.vocab.encode(e.text, task.seq_len) for e in buf]), "mask": np.ones(len(buf), np.float32)})
            buf = []
    if buf:
        chunks.append(task.encode(buf) if not isinstance(task, NWPTask) else {"ids": np.stack([task.vocab.encode(e.text, task.seq_len) for e in buf]), "mask": np.ones(len(buf), np.float32)})
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}


def test_count_words_in_chunks_equals_text_by_text(arxiv):
    texts = [ex.text for ex in arxiv.records()]
    want: Counter = Counter()
    for t in texts:
        want.update(t.split())
    assert count_words(texts) == want
    assert count_words(["  a b ", "", "b\tc\n", "a"]) == Counter({"a": 2, "b": 2, "c": 1})


def test_encode_words_equals_encode():
    v = WordVocab(["the", "a", "model"])
    texts = ["", "the", "the a model " * 3, "x y z the", " ".join(["a"] * 5), " ".join(["a"] * 6)]
    for seq_len in (1, 5, 20):
        ids, lengths = v.encode_words([t.split() for t in texts], seq_len)
        assert ids.dtype == np.int32 and ids.shape == (len(texts), seq_len + 1)
        np.testing.assert_array_equal(ids, np.stack([v.encode(t, seq_len) for t in texts]))
        assert lengths.tolist() == [len(t.split()) for t in texts]
        np.testing.assert_array_equal(v.encode_batch(texts, seq_len), ids)
    assert v.encode_batch([], 4).shape == (0, 5)


@pytest.mark.parametrize("seq_len", [20, 5])
def test_flat_encode_equals_per_example_on_the_arxiv_slice(arxiv, seq_len, monkeypatch):
    monkeypatch.setattr(prep, "ENCODE_CHUNK", 777)  # chunks that do not line up with the reference's
    task = NWPTask(WordVocab.build((ex.text for ex in arxiv.records()), 2000), seq_len, "tiny")
    old_cuts, new_cuts = Cuts(), Cuts()
    old = encode_per_example(task, arxiv, old_cuts)
    new = encode_corpus(task, arxiv, new_cuts)
    assert new.keys() == old.keys()
    for k in old:
        assert new[k].dtype == old[k].dtype
        np.testing.assert_array_equal(new[k], old[k])
    assert vars(new_cuts) == vars(old_cuts) and new_cuts.cut > 0 and new_cuts.words_in > 100_000


def test_large_encodings_are_memory_mapped_with_the_same_values(arxiv, monkeypatch):
    small = arxiv.subset(list(arxiv.user_ids[:300]))
    task = NWPTask(WordVocab.build((ex.text for ex in small.records()), 500), 20, "tiny")
    in_memory = encode_corpus(task, small)
    monkeypatch.setattr(prep, "MEMMAP_BYTES", 0)
    mapped = encode_corpus(task, small)
    assert isinstance(mapped["ids"], np.memmap) and not isinstance(in_memory["ids"], np.memmap)
    np.testing.assert_array_equal(mapped["ids"], in_memory["ids"])


def test_default_encode_measured_of_a_tagged_task_counts_as_before():
    corpus = load_conll(DATA / "ncbi-disease" / "train.tsv", users="sentences:50")
    corpus = corpus.subset(list(corpus.user_ids[:20]))
    task = NERTask.from_examples(list(corpus.records()), max_len=16)
    old_cuts, new_cuts = Cuts(), Cuts()
    old = encode_per_example(task, corpus, old_cuts)
    new = encode_corpus(task, corpus, new_cuts)
    for k in old:
        np.testing.assert_array_equal(new[k], old[k])
    assert vars(new_cuts) == vars(old_cuts) and new_cuts.cut > 0


def test_flat_text_of_a_synthetic_store_equals_its_texts_split():
    """The synthetic store's ids (no text built) give the words its texts hold, through a held-out
    split and a per-user cap; the generic read (one split per text) gives the same examples."""
    from fedpriv.data.corpus import FederatedCorpus
    from fedpriv.data.stores import SubsetStore
    from fedpriv.data.synthetic import load_synthetic

    train, _ = load_synthetic("synthetic:users=120,examples=3000,seed=4").split_heldout_users(0.2)
    for corpus in (train, train.truncated(5)):
        fast = corpus.flat_text()
        assert corpus.store.word_table() is not None and corpus.store._base.word_table() is not None
        texts = [ex.text for ex in corpus.records()]
        generic = FederatedCorpus(SubsetStore(corpus.store, corpus.user_ids, corpus.counts()), "copy")
        generic.store.word_table = lambda: None  # read it the generic way
        slow = generic.flat_text()
        assert fast.num_examples == slow.num_examples == len(texts) == corpus.num_examples
        np.testing.assert_array_equal(fast.starts, slow.starts)
        assert [fast.example_words(i) for i in range(0, len(texts), 97)] == [texts[i].split() for i in range(0, len(texts), 97)]
        assert [slow.example_words(i) for i in range(0, len(texts), 97)] == [texts[i].split() for i in range(0, len(texts), 97)]
        assert fast.word_counts() == slow.word_counts() == count_words(texts)
        task = NWPTask(WordVocab.from_counts(fast.word_counts(), 300), 12, "tiny")
        assert task.vocab.words == WordVocab.build(texts, 300).words
        old_cuts, new_cuts = Cuts(), Cuts()
        old = encode_per_example(task, corpus, old_cuts)
        new = encode_corpus(task, corpus, new_cuts)
        for k in old:
            np.testing.assert_array_equal(new[k], old[k])
        assert vars(new_cuts) == vars(old_cuts) and new_cuts.cut > 0


def test_encode_ids_equals_encode():
    v = WordVocab(["the", "a", "model"])
    texts = ["", "the", "the a model " * 3, "x y z the", " ".join(["a"] * 5)]
    table = ["the", "a", "model", "x", "y", "z"]
    flat = [table.index(w) for t in texts for w in t.split()]
    starts = np.cumsum([0] + [len(t.split()) for t in texts])
    ids = v.table_ids(table)[np.array(flat, dtype=np.int64)]
    for seq_len in (1, 5, 20):
        np.testing.assert_array_equal(v.encode_ids(ids, starts, seq_len), np.stack([v.encode(t, seq_len) for t in texts]))


def test_a_subclass_that_encodes_otherwise_is_encoded_by_its_own_encode(arxiv):
    class Shifted(NWPTask):
        def encode(self, examples):
            batch = super().encode(examples)
            return {**batch, "ids": batch["ids"] + 1}

    small = arxiv.subset(list(arxiv.user_ids[:50]))
    vocab = WordVocab.build((ex.text for ex in small.records()), 300)
    assert NWPTask(vocab, 20, "tiny").encodes_flat and not Shifted(vocab, 20, "tiny").encodes_flat
    np.testing.assert_array_equal(encode_corpus(Shifted(vocab, 20, "tiny"), small)["ids"], encode_corpus(NWPTask(vocab, 20, "tiny"), small)["ids"] + 1)
