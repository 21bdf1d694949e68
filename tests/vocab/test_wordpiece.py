"""WordPiece learner and greedy tokenizer on real text (Shakespeare, NCBI-disease), vs a naive reference."""

import random
import time
from collections import Counter

import pytest

from fedpriv.data.conll import iter_sentences
from fedpriv.data.shakespeare import load_shakespeare
from fedpriv.errors import DataFormatError, FedprivError
from fedpriv.vocab.word import count_words
from fedpriv.vocab.wordpiece import RESERVED_TOKENS, WordPieceVocab, learn_wordpiece


@pytest.fixture(scope="module")
def shakespeare_counts() -> Counter:
    return count_words(ex.text for ex in load_shakespeare().records())


@pytest.fixture(scope="module")
def ncbi_counts(ncbi_train) -> Counter:
    counts: Counter = Counter()
    for _, sent in iter_sentences(ncbi_train):
        counts.update(sent.tokens)
    return counts


def _joined(pieces) -> str:
    return "".join(p[2:] if i and p.startswith("##") else p for i, p in enumerate(pieces))


def test_shakespeare_vocab_size_layout_and_round_trip(shakespeare_counts):
    v = learn_wordpiece(shakespeare_counts, 3000)
    assert len(v) == 3000
    assert v.tokens[:5] == RESERVED_TOKENS
    chars = {ch for w in shakespeare_counts for ch in w}
    for ch in chars:  # every character and its continuation form
        assert ch in v and "##" + ch in v
    for w in shakespeare_counts:  # every word splits into pieces that join back into it
        pieces = v.tokenize_word(w)
        assert "[UNK]" not in pieces and _joined(pieces) == w
        assert all(p.startswith("##") for p in pieces[1:]) and not pieces[0].startswith("##")
    for w, _ in shakespeare_counts.most_common(100):  # frequent (known) words are one piece
        assert v.tokenize_word(w) == (w,)
    assert v.tokenize("the king") == ["the", "king"]


def test_ncbi_tokens_round_trip_case_preserved(ncbi_counts):
    v = learn_wordpiece(ncbi_counts, 4000)
    assert len(v) <= 4000
    for w in ncbi_counts:
        assert _joined(v.tokenize_word(w)) == w
    assert v.tokenize_word("cancer") == ("cancer",)
    assert len(v.tokenize_word("adenomatous")) >= 1
    ids = v.encode("APC gene mutations")
    assert v.decode(ids) == ["APC", "gene", "mutations"]


def _naive_learner(counts: dict, size: int, reserved=RESERVED_TOKENS, min_pair_count=2.0) -> list[str]:
    """The same algorithm, recounting every pair at every step (slow, obviously right)."""
    counts = dict(sorted((w, float(c)) for w, c in counts.items() if c > 0))
    chars: Counter = Counter()
    for w, c in counts.items():
        for ch in w:
            chars[ch] += c
    alphabet = [ch for ch, _ in sorted(chars.items(), key=lambda kv: (-kv[1], kv[0]))][: (size - len(reserved)) // 2]
    id2tok = alphabet + ["##" + ch for ch in alphabet]
    tok2id = {t: i for i, t in enumerate(id2tok)}
    vocab = list(reserved) + list(id2tok)
    words = [([tok2id[w[0]]] + [tok2id["##" + ch] for ch in w[1:]], c) for w, c in counts.items() if len(w) > 1 and set(w) <= set(alphabet)]
    while len(vocab) < size:
        pairs: Counter = Counter()
        for sym, c in words:
            for x, y in zip(sym, sym[1:]):
                pairs[(x, y)] += c
        if not pairs:
            break
        (a, b) = min(pairs, key=lambda k: (-pairs[k], k))
        if pairs[(a, b)] < min_pair_count:
            break
        new = id2tok[a] + id2tok[b][2:]
        if new not in tok2id:
            tok2id[new] = len(id2tok)
            id2tok.append(new)
            vocab.append(new)
        nid = tok2id[new]
        out = []
        for sym, c in words:
            m, j = [], 0
            while j < len(sym):
                if j + 1 < len(sym) and sym[j] == a and sym[j + 1] == b:
                    m.append(nid)
                    j += 2
                else:
                    m.append(sym[j])
                    j += 1
            out.append((m, c))
        words = out
    return vocab


def test_learner_matches_naive_reference(ncbi_counts):
    sample = dict(list(sorted(ncbi_counts.items()))[::10])  # ~900 words, integer counts (exact ties)
    sample["aaaa"] = 9  # overlapping pairs (a, a)
    sample["##ab"] = 3  # a literal '#'
    fast = learn_wordpiece(sample, 300)
    assert list(fast.tokens) == _naive_learner(sample, 300)


def test_deterministic_whatever_the_input_order(shakespeare_counts):
    items = list(shakespeare_counts.items())
    random.Random(1).shuffle(items)
    assert learn_wordpiece(dict(items), 1500).tokens == learn_wordpiece(shakespeare_counts, 1500).tokens


def test_unknown_words_and_reserved_tokens(shakespeare_counts):
    v = learn_wordpiece(shakespeare_counts, 1000)
    assert v.tokenize_word("a" * 101) == ("[UNK]",)  # longer than max_input_chars_per_word
    assert len(v.tokenize_word("a" * 100)) >= 1 and v.tokenize_word("a" * 100) != ("[UNK]",)
    assert v.tokenize_word("snow\u2603man") == ("[UNK]",)  # a character outside the alphabet
    assert "[MASK]" not in v.tokenize_word("[MASK]")  # reserved tokens never match inside text
    assert v.encode("the \u2603") == [v.index["the"], v.unk_id]


def test_small_vocab_trims_the_alphabet(shakespeare_counts):
    v = learn_wordpiece(shakespeare_counts, 15)
    assert len(v) == 15  # 5 reserved + 5 characters x 2
    with pytest.raises(FedprivError, match="vocab_size"):
        learn_wordpiece(shakespeare_counts, 6)


def test_noisy_float_counts(shakespeare_counts):
    rng = random.Random(0)
    noisy = {w: c * 10 + rng.gauss(0, 3) for w, c in shakespeare_counts.items()}
    v = learn_wordpiece(noisy, 800)
    assert len(v) == 800


def test_save_load_vocab_txt(tmp_path, shakespeare_counts):
    v = learn_wordpiece(shakespeare_counts, 500)
    path = tmp_path / "vocab.txt"
    v.save(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines == list(v.tokens) and lines[1] == "[UNK]"
    w = WordPieceVocab.load(path)
    assert w.tokens == v.tokens and w.tokenize("thou art") == v.tokenize("thou art")
    assert WordPieceVocab(["[UNK]", "a", "##b", "a"]).index["a"] == 3  # BERT's load_vocab: the last line wins
    (tmp_path / "bad.txt").write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match="UNK"):
        WordPieceVocab.load(tmp_path / "bad.txt")


def test_hundred_thousand_words_in_seconds():
    from fedpriv.data.synthetic import SyntheticStore, parse_synthetic_spec

    words = SyntheticStore(parse_synthetic_spec("synthetic:users=1,examples=1,vocab_size=100000")).vocabulary
    counts = {w: 1e6 / (r + 1) for r, w in enumerate(words)}
    t = time.perf_counter()
    v = learn_wordpiece(counts, 8000)
    elapsed = time.perf_counter() - t
    assert len(v) == 8000
    assert elapsed < 20, f"learning from 100,000 words took {elapsed:.1f} s"  # about 2 s here
