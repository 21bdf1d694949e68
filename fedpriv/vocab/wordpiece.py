"""WordPiece vocabularies: a learner from (word, count) pairs and BERT's greedy tokenizer.

The learner (no TensorFlow, no Hugging Face ``tokenizers``) is the BPE-style WordPiece trainer
that Hugging Face's ``WordPieceTrainer`` implements: a word is split into its first character and
``##``-prefixed continuation characters; the most frequent adjacent pair (weighted by the word
counts, which may be noisy floats from a DP histogram) is merged, ``"a" + "##b" -> "ab"``,
``"##a" + "##b" -> "##ab"``, until the vocabulary has ``vocab_size`` tokens or no pair occurs
``min_pair_count`` times. Ties go to the pair of the earlier-learned tokens (characters count as
learned in alphabet order), so the result depends only on the counts, not on their order. It is *not* the
likelihood-score variant (pair count / product of part counts) nor tensorflow_text's
``bert_vocab_from_dataset`` threshold search; at inference all three use the same greedy
longest-match-first tokenizer, which is what BERT models consume.

Vocabulary order (BERT ``vocab.txt``, one token per line, id = line number): the reserved tokens
(``[PAD] [UNK] [CLS] [SEP] [MASK]``), the alphabet's single characters by frequency, their
``##`` forms in the same order, then the merged tokens in the order they were learned.
"""

from __future__ import annotations

import heapq
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from fedpriv.errors import DataFormatError, FedprivError

RESERVED_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
UNK = "[UNK]"
PREFIX = "##"
MAX_INPUT_CHARS_PER_WORD = 100
_SHIFT = 1 << 24  # pair key = a * _SHIFT + b (token ids < 2^24)


class WordPieceVocab:
    """A WordPiece vocabulary and BERT's greedy longest-match-first tokenizer.

    A word longer than ``max_input_chars_per_word`` characters, or one that cannot be covered by
    the pieces, becomes the single token ``[UNK]``. Reserved tokens never match inside a word.
    Ids are line numbers; a token listed twice gets its last line's id, as BERT's own
    ``load_vocab`` does (the learner never lists one twice)."""

    def __init__(
        self,
        tokens: Iterable[str],
        reserved_tokens: Sequence[str] = RESERVED_TOKENS,
        unk_token: str = UNK,
        max_input_chars_per_word: int = MAX_INPUT_CHARS_PER_WORD,
    ):
        self.tokens: tuple[str, ...] = tuple(tokens)
        if unk_token not in self.tokens:
            raise FedprivError(f"WordPiece vocabulary has no unknown token {unk_token!r}")
        if any(not t or any(ch.isspace() for ch in t) for t in self.tokens):
            raise FedprivError("WordPiece tokens must be non-empty and free of whitespace")
        self.unk_token = unk_token
        self.reserved_tokens: tuple[str, ...] = tuple(reserved_tokens)
        self.max_input_chars_per_word = max_input_chars_per_word
        self.index = {t: i for i, t in enumerate(self.tokens)}
        self.unk_id = self.index[unk_token]
        reserved = set(reserved_tokens)
        self._pieces = frozenset(t for t in self.tokens if t not in reserved)
        lengths = [len(t) - len(PREFIX) if t.startswith(PREFIX) and len(t) > len(PREFIX) else len(t) for t in self._pieces]
        self._max_len = max(lengths, default=1)
        self._cache: dict[str, tuple[str, ...]] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: object) -> bool:
        return token in self.index

    def tokenize_word(self, word: str) -> tuple[str, ...]:
        """One word -> its pieces (greedy longest match first), or ``("[UNK]",)``."""
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        n = len(word)
        if n > self.max_input_chars_per_word:
            out: tuple[str, ...] = (self.unk_token,)
        else:
            pieces, vocab, maxlen = [], self._pieces, self._max_len
            start = 0
            while start < n:
                end = min(n, start + maxlen)
                while end > start:
                    piece = word[start:end] if start == 0 else PREFIX + word[start:end]
                    if piece in vocab:
                        break
                    end -= 1
                if end == start:
                    pieces = [self.unk_token]
                    break
                pieces.append(piece)
                start = end
            out = tuple(pieces)
        if len(self._cache) < 1_000_000:
            self._cache[word] = out
        return out

    def tokenize(self, text: str | Sequence[str]) -> list[str]:
        """A space-separated text (or a list of words) -> pieces."""
        words = text.split() if isinstance(text, str) else text
        out: list[str] = []
        for w in words:
            out.extend(self.tokenize_word(w))
        return out

    def encode(self, text: str | Sequence[str]) -> list[int]:
        """Text -> token ids (line numbers of vocab.txt)."""
        index = self.index
        return [index[p] for p in self.tokenize(text)]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Ids -> words: continuation pieces are glued to the piece before them."""
        words: list[str] = []
        for i in ids:
            t = self.tokens[int(i)]
            if t.startswith(PREFIX) and len(t) > len(PREFIX) and words:
                words[-1] += t[len(PREFIX):]
            else:
                words.append(t)
        return words

    def save(self, path: str | os.PathLike[str]) -> None:
        """BERT ``vocab.txt``: one token per line, UTF-8 (written atomically)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".partial")
        tmp.write_text("".join(t + "\n" for t in self.tokens), encoding="utf-8")
        os.replace(tmp, path)

    #: ``format`` tag of :meth:`to_json` objects
    JSON_FORMAT = "fedpriv-wordpiece"

    def to_json(self) -> dict:
        """Everything that defines the tokenizer, as a JSON-able dict (:meth:`from_json` inverts it)."""
        return {
            "format": self.JSON_FORMAT,
            "version": 1,
            "tokens": list(self.tokens),
            "reserved_tokens": list(self.reserved_tokens),
            "unk_token": self.unk_token,
            "max_input_chars_per_word": self.max_input_chars_per_word,
        }

    @classmethod
    def from_json(cls, obj: object, origin: str | os.PathLike[str] = "tokenizer") -> "WordPieceVocab":
        """Inverse of :meth:`to_json`; DataFormatError naming ``origin`` when ``obj`` is not one."""
        if not isinstance(obj, dict) or obj.get("format") != cls.JSON_FORMAT:
            raise DataFormatError(origin, None, f"not a WordPiece tokenizer (expected format {cls.JSON_FORMAT!r})")
        try:
            tokens, reserved = obj["tokens"], obj["reserved_tokens"]
            if not all(isinstance(t, str) for t in [*tokens, *reserved]):
                raise TypeError("tokens must be strings")
            return cls(tokens, reserved_tokens=reserved, unk_token=obj["unk_token"], max_input_chars_per_word=int(obj["max_input_chars_per_word"]))
        except (KeyError, TypeError, ValueError, FedprivError) as e:
            raise DataFormatError(origin, None, f"malformed WordPiece tokenizer ({e})") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str], **kwargs) -> "WordPieceVocab":
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DataFormatError(path, None, f"not a readable vocab.txt ({e})") from None
        tokens = text.split("\n")
        if tokens and tokens[-1] == "":
            tokens.pop()
        for n, t in enumerate(tokens, start=1):
            if not t.strip() or t != t.strip():
                raise DataFormatError(path, n, "a vocab.txt line must hold one token, without spaces")
        try:
            return cls(tokens, **kwargs)
        except FedprivError as e:
            raise DataFormatError(path, None, str(e)) from None


def learn_wordpiece(
    word_counts: Mapping[str, float] | Iterable[tuple[str, float]],
    vocab_size: int,
    *,
    reserved_tokens: Sequence[str] = RESERVED_TOKENS,
    min_pair_count: float = 2.0,
    max_alphabet: int = 1000,
    max_input_chars_per_word: int = MAX_INPUT_CHARS_PER_WORD,
    alphabet: Sequence[str] = (),
) -> WordPieceVocab:
    """Learn a WordPiece vocabulary of at most ``vocab_size`` tokens from word counts (see the module doc).

    ``word_counts``: word -> count (floats allowed; counts <= 0 ignored). The alphabet is the
    ``max_alphabet`` most frequent characters that fit (each takes two slots: ``c`` and ``##c``);
    words with other characters, or longer than ``max_input_chars_per_word``, are not learned from.
    ``alphabet``: characters that are always in it, first (e.g. a public character set, so a
    vocabulary learned from a small DP histogram still spells every word instead of [UNK])."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise FedprivError(f"vocab_size must be an integer, got {vocab_size!r}")
    reserved = list(dict.fromkeys(reserved_tokens))
    if UNK not in reserved:
        raise FedprivError(f"reserved_tokens must include {UNK}")
    if vocab_size < len(reserved) + 2:
        raise FedprivError(f"vocab_size must be >= {len(reserved) + 2} (the reserved tokens and one character with its ## form), got {vocab_size}")
    items = word_counts.items() if isinstance(word_counts, Mapping) else word_counts
    counts: dict[str, float] = {}
    for w, c in items:
        c = float(c)
        if c > 0 and w and len(w) <= max_input_chars_per_word and not any(ch.isspace() for ch in w):
            counts[w] = counts.get(w, 0.0) + c
    counts = dict(sorted(counts.items()))  # the result must not depend on the input's order

    # Alphabet: the most frequent characters that fit.
    char_counts: dict[str, float] = defaultdict(float)
    for w, c in counts.items():
        for ch in w:
            char_counts[ch] += c
    budget = min(max_alphabet, (vocab_size - len(reserved)) // 2)
    if any(not isinstance(ch, str) or len(ch) != 1 or ch.isspace() for ch in alphabet):
        raise FedprivError("alphabet must hold single non-space characters")
    fixed = list(dict.fromkeys(alphabet))
    if len(fixed) > budget:
        raise FedprivError(
            f"vocab_size {vocab_size} leaves room for {budget} characters (each takes two slots), fewer than the "
            f"{len(fixed)} of the given alphabet"
        )
    learned = [ch for ch, _ in sorted(char_counts.items(), key=lambda kv: (-kv[1], kv[0])) if ch not in set(fixed)]
    alphabet = fixed + learned[: budget - len(fixed)]
    id2tok: list[str] = []
    tok2id: dict[str, int] = {}

    def token_id(t: str) -> int:
        i = tok2id.get(t)
        if i is None:
            i = tok2id[t] = len(id2tok)
            id2tok.append(t)
        return i

    for ch in alphabet:
        token_id(ch)
    for ch in alphabet:
        token_id(PREFIX + ch)
    vocab: list[str] = [*reserved, *[t for t in id2tok if t not in reserved]]
    in_vocab = set(vocab)

    # Words as symbol-id lists; only words of 2+ characters can hold a pair.
    allowed = set(alphabet)
    first = {ch: tok2id[ch] for ch in alphabet}
    cont = {ch: tok2id[PREFIX + ch] for ch in alphabet}
    words: list[list[int]] = []
    wcounts: list[float] = []
    for w, c in counts.items():
        if len(w) < 2 or not allowed.issuperset(w):
            continue
        words.append([first[w[0]], *[cont[ch] for ch in w[1:]]])
        wcounts.append(c)

    S = _SHIFT
    pair_count: dict[int, float] = defaultdict(float)
    where: dict[int, set[int]] = defaultdict(set)
    for wi, sym in enumerate(words):
        c = wcounts[wi]
        for j in range(len(sym) - 1):
            k = sym[j] * S + sym[j + 1]
            pair_count[k] += c
            where[k].add(wi)
    heap = [(-c, k) for k, c in pair_count.items()]
    heapq.heapify(heap)

    while len(vocab) < vocab_size and heap:
        negc, key = heapq.heappop(heap)
        c = pair_count.get(key, 0.0)
        if c <= 0.0:
            continue
        if c != -negc:  # stale entry: re-queue at its current count
            heapq.heappush(heap, (-c, key))
            continue
        if c < min_pair_count:
            break
        a, b = divmod(key, S)
        new_tok = id2tok[a] + id2tok[b][len(PREFIX):]
        nid = token_id(new_tok)
        if new_tok not in in_vocab:
            in_vocab.add(new_tok)
            vocab.append(new_tok)
        delta: dict[int, float] = defaultdict(float)
        for wi in where.pop(key, ()):
            sym = words[wi]
            L = len(sym)
            pos = []
            j = 0
            while j < L - 1:
                if sym[j] == a and sym[j + 1] == b:
                    pos.append(j)
                    j += 2
                else:
                    j += 1
            if not pos:
                continue
            merged: list[int] = []
            prev = 0
            for j in pos:
                merged.extend(sym[prev:j])
                merged.append(nid)
                prev = j + 2
            merged.extend(sym[prev:])
            cnt = wcounts[wi]
            last = len(pos) - 1
            for i, j in enumerate(pos):
                p = j - i  # position of the merged token in the new word
                if j > 0:  # the pair on the left, (x, a) -> (x', nid); x' is nid when merges are adjacent
                    delta[sym[j - 1] * S + a] -= cnt
                    k = merged[p - 1] * S + nid
                    delta[k] += cnt
                    where[k].add(wi)
                if j + 2 < L and not (i < last and pos[i + 1] == j + 2):  # the pair on the right
                    delta[b * S + sym[j + 2]] -= cnt
                    k = nid * S + merged[p + 1]
                    delta[k] += cnt
                    where[k].add(wi)
            words[wi] = merged
        pair_count.pop(key, None)
        for k, dv in delta.items():
            if dv == 0.0 or k == key:
                continue
            nc = pair_count.get(k, 0.0) + dv
            if nc <= 1e-9:
                pair_count.pop(k, None)
                where.pop(k, None)
            else:
                pair_count[k] = nc
                heapq.heappush(heap, (-nc, k))

    return WordPieceVocab(vocab, reserved_tokens=reserved, max_input_chars_per_word=max_input_chars_per_word)


def extend_wordpiece(base: WordPieceVocab, word_counts: Mapping[str, float], vocab_size: int) -> tuple[WordPieceVocab, list[str]]:
    """``base`` extended by whole-word tokens: the most frequent words of ``word_counts`` (ties by
    word) that ``base`` does not hold as one token, appended until the vocabulary has
    ``vocab_size`` tokens or the words run out; returns (vocabulary, the words added).

    This is how a public vocabulary takes in the words of a private corpus that survived a DP
    histogram: ``base`` is learned from public text only, and only the released (noisy) counts
    are read here, so the result is post-processing of the DP release. Words longer than the
    tokenizer reads, or with whitespace, are skipped."""
    if vocab_size < len(base):
        raise FedprivError(f"vocab_size {vocab_size} is smaller than the base vocabulary ({len(base)} tokens)")
    have = set(base.tokens)
    ranked = sorted(((w, float(c)) for w, c in word_counts.items() if float(c) > 0), key=lambda wc: (-wc[1], wc[0]))
    added: list[str] = []
    room = vocab_size - len(base)
    for w, _ in ranked:
        if len(added) >= room:
            break
        if w in have or not w or len(w) > base.max_input_chars_per_word or any(ch.isspace() for ch in w):
            continue
        added.append(w)
        have.add(w)
    vocab = WordPieceVocab([*base.tokens, *added], base.reserved_tokens, base.unk_token, base.max_input_chars_per_word)
    return vocab, added
