"""Text normalization like the TFF Stack Overflow NWP data: lowercase, punctuation split into
separate tokens, tokens joined by single spaces; plus sentence splitting and HTML stripping.

Text is put in Unicode NFC form first, so a precomposed ``é`` and ``e`` + combining accent give the
same token, and combining marks (Unicode categories Mn, Mc, Me: Devanagari vowel signs and viramas,
Arabic harakat, ...) continue the word they follow (``हिन्दी``, ``مُحَمَّد`` stay one token each).

Two sentence splitters: :func:`split_sentences` (any ``.``/``!``/``?`` before whitespace; the
Shakespeare and Stack Exchange loaders, whose numbers stay as they were) and :func:`prose_sentences`
(only before a capital or a digit, possibly after an opening quote or bracket such as ``"``, ``(``,
``¿``, ``¡``, ``«``, ``“``; never after an abbreviation such as ``e.g.``, ``et al.`` or ``Fig. 3``;
and after every full-width ``。``, ``！``, ``？``, which need no whitespace after them: Chinese and
Japanese text; scientific prose such as arXiv abstracts, the tables' ``unit="sentence"``). Both take
time linear in the text's length, runs of punctuation included.

``normalize("Don't panic, it's HTML!")`` -> ``"don't panic , it's html !"``
"""

from __future__ import annotations

import html
import itertools
import re
import sys
import unicodedata
from html.parser import HTMLParser


def _mark_class() -> str:
    """A regex character class of every combining mark (categories Mn, Mc, Me), as ranges."""
    is_mark = {"Mn", "Mc", "Me"}.__contains__
    points = itertools.compress(range(sys.maxunicode + 1), map(is_mark, map(unicodedata.category, map(chr, range(sys.maxunicode + 1)))))
    ranges: list[list[int]] = []
    for c in points:
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return "[" + "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges) + "]"


# Python's ``\w`` holds letters and digits but no combining marks, so a mark after a word's
# first letter or digit is allowed separately (an unambiguous pattern: marks, then letters/digits).
# The zero-width non-joiner and joiner continue a word as marks do (Persian ``می‌خواهم``, a
# Devanagari half form ``क्‍ष``, a Malayalam chillu ``ന്‍``).
_MARK = _mark_class()
_JOINER = "[\u200c\u200d]"
_WORD_PART = rf"[^\W_]+(?:(?:{_MARK}|{_JOINER})+[^\W_]*)*"
# A word is a run of letters/digits and the combining marks after them, with inner apostrophes or
# hyphens (don't, e-mail); every other non-space character (a mark with no word before it too)
# is a token of its own.
_TOKEN = re.compile(rf"{_WORD_PART}(?:['\u2019\-]{_WORD_PART})*|[^\w\s]|_", re.UNICODE)
# Invisible characters that are no token (default-ignorable: the soft hyphen, direction marks
# and isolates, the Arabic letter mark, word joiner and invisible operators, the BOM, variation
# selectors, tag characters, musical formatting) are dropped; so is a joiner that follows no
# letter, digit or mark (between emoji, after a space). Visible format characters (the Arabic
# number sign U+0600, end of ayah U+06DD) are kept. The zero-width space is a word break (Thai,
# Khmer and Japanese text mark words with it): a space.
_IGNORABLE = (
    "[\u00ad\u061c\u180b-\u180f\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufe00-\ufe0f\ufeff"
    "\ufff9-\ufffb\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f\U000e0100-\U000e01ef]"
)
_ANY_INVISIBLE = re.compile(rf"{_IGNORABLE}|[\u200b-\u200d]")
_INVISIBLE = re.compile(rf"{_IGNORABLE}|(?<![^\W_])(?<!{_MARK}){_JOINER}")
# ASCII text has no combining marks and is its own NFC form: the same tokens by a smaller pattern.
_ASCII_TOKEN = re.compile(r"[^\W_]+(?:['\-][^\W_]+)*|[^\w\s]|_")
# A sentence ends at . ! or ? (possibly repeated, possibly followed by a closing quote or
# bracket) followed by whitespace. (Lookbehinds of one or two characters: linear on any run.)
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+")


def tokenize(text: str) -> list[str]:
    """Lowercased tokens of the NFC form of ``text``: words (letters and digits with the combining
    marks and zero-width (non-)joiners after them, with inner apostrophes/hyphens) and single
    punctuation marks; invisible characters are dropped first, and a zero-width space separates
    words (see ``_INVISIBLE``)."""
    if text.isascii():
        return _ASCII_TOKEN.findall(text.lower())
    if _ANY_INVISIBLE.search(text):  # (rare: the scan for one is cheaper than the substitution)
        text = _INVISIBLE.sub("", text.replace("\u200b", " "))  # before NFC, which they could block
    return _TOKEN.findall(unicodedata.normalize("NFC", text).lower().replace("\u2019", "'"))


def normalize(text: str) -> str:
    """``tokenize`` joined by single spaces: the form every NWP example's ``text`` takes."""
    return " ".join(tokenize(text))


def split_sentences(text: str) -> list[str]:
    """Sentences of plain text (line breaks inside a paragraph are spaces); empty ones dropped."""
    out = []
    for paragraph in re.split(r"\n\s*\n", text):
        flat = " ".join(paragraph.split())
        out.extend(s.strip() for s in _SENTENCE_END.split(flat) if s.strip())
    return out


# A candidate sentence end, matched only from the start of a run of terminators (the lookbehind:
# otherwise a long run that does not end a sentence is retried from each of its characters, which
# takes quadratic time). Either (group "wide") a run holding a full-width 。！？, then closing
# quotes/brackets and any whitespace: a sentence end whatever follows; or . ! ? (repeated or
# not), closing quotes/brackets, whitespace, then a letter or digit that is not an ASCII lowercase
# letter (possibly after an opening quote/bracket): a sentence end if it is a capital or a digit
# and the period closes no abbreviation.
_OPENERS = "\"'([{\u00bf\u00a1\u00ab\u201c\u2018"  # also ¿ ¡ « “ ‘
_WIDE_CLOSERS = "\"')\\]}\u00bb\u2019\u201d\u300d\u300f\u3009\u300b\u3011\u3015\u3017\u3019\u301b\uff09\uff3d\uff5d\uff63"
_PROSE_END = re.compile(
    r"(?=[.!?\u3002\uff01\uff1f])(?<![.!?\u3002\uff01\uff1f])(?:"  # the lookahead first: the engine skips to a terminator fast
    r"(?P<wide>[.!?]*[\u3002\uff01\uff1f][.!?\u3002\uff01\uff1f]*[" + _WIDE_CLOSERS + r"]*\s*)"
    r"|[.!?]+[\"')\]]*\s+(?=[" + re.escape(_OPENERS) + r"]?[^\W_a-z]))"
)
#: Words whose final period never ends a sentence (compared lowercased, without the final period).
ABBREVIATIONS = frozenset(
    "e.g i.e al vs cf viz approx resp ca dr mr mrs ms prof jr sr st inc ltd corp co dept univ u.s u.k w.r.t a.k.a".split()
)
#: Words whose final period does not end a sentence when a number follows (``Fig. 3``, ``Eq. 2``).
NUMBER_ABBREVIATIONS = frozenset("fig figs eq eqs eqn sec secs sect tab ref refs no nos vol pp p ch chap thm lem def app alg".split())


def _abbreviation_before(text: str, end: int, next_char: str) -> bool:
    """Whether the period at ``text[end]`` closes an abbreviation (``e.g.``; ``Fig.`` before a number)."""
    start = text.rfind(" ", 0, end) + 1
    word = text[start:end].lstrip(_OPENERS).lower()
    return word in ABBREVIATIONS or (next_char.isdigit() and word in NUMBER_ABBREVIATIONS)


def prose_sentences(text: str) -> list[str]:
    """Sentences of prose, on one line each (hard line breaks joined, whitespace collapsed).

    A sentence ends at ``.``, ``!`` or ``?`` (possibly repeated, possibly followed by closing
    quotes or brackets) followed by whitespace and then a capital letter or a digit (possibly
    after one opening quote or bracket: ``"``, ``'``, ``(``, ``[``, ``{``, ``¿``, ``¡``, ``«``,
    ``“``, ``‘``). It always ends at a full-width ``。``, ``！`` or ``？`` (possibly among other
    terminators, possibly followed by closing quotes or brackets such as ``」``, ``』``, ``”``,
    ``’``, ``）``), whatever follows, with or without whitespace: Chinese and Japanese text. A
    period does not end a sentence after an abbreviation (:data:`ABBREVIATIONS`: ``e.g.``,
    ``i.e.``, ``et al.``, ``vs.``, ...), after ``Fig.``, ``Eq.``, ``Sec.``, ``No.``, ... before a
    number (:data:`NUMBER_ABBREVIATIONS`). A single letter is not an abbreviation: in scientific
    prose it is mostly a variable that ends a sentence (``a graph G. We show``), so a name's
    initials split (``J. Smith``). Decimals (``3.5``) and inner periods (``arXiv.org``) have no
    whitespace after them, so they never split. LaTeX and everything else is kept as written
    (no Unicode normalization either). Linear time, long runs of punctuation included."""
    flat = " ".join(text.split())
    out: list[str] = []
    start = 0
    for m in _PROSE_END.finditer(flat):
        s, e = m.span()
        if m.group("wide") is None:
            nxt = flat[e + 1] if flat[e] in _OPENERS else flat[e]
            if not (nxt.isupper() or nxt.isdigit()):
                continue
            if flat[s] == "." and _abbreviation_before(flat, s, nxt):
                continue
        out.append(flat[start:e].rstrip())
        start = e
    if start < len(flat):
        out.append(flat[start:])
    return out


class _TextExtractor(HTMLParser):
    """Collects the text of an HTML fragment; block elements become paragraph breaks."""

    BLOCKS = {"p", "div", "br", "li", "ul", "ol", "pre", "blockquote", "h1", "h2", "h3", "h4", "h5", "h6", "tr", "hr", "table"}

    def __init__(self, skip: frozenset[str]) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = skip
        self.skipping = 0

    def handle_starttag(self, tag, attrs):  # noqa: ANN001
        if tag in self.skip:
            self.skipping += 1
        if tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag):  # noqa: ANN001
        if tag in self.skip and self.skipping:
            self.skipping -= 1
        if tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_data(self, data):  # noqa: ANN001
        if not self.skipping:
            self.parts.append(data)


def strip_html(fragment: str, skip: frozenset[str] = frozenset()) -> str:
    """Plain text of an HTML fragment, with block elements turned into paragraph breaks; the
    content of elements named in ``skip`` (e.g. ``{"pre"}`` for code blocks) is dropped."""
    parser = _TextExtractor(skip)
    parser.feed(fragment)
    parser.close()
    return html.unescape("".join(parser.parts))
