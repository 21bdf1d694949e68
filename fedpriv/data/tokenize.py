"""Text normalization like the TFF Stack Overflow NWP data: lowercase, punctuation split into
separate tokens, tokens joined by single spaces; plus sentence splitting and HTML stripping.

Two sentence splitters: :func:`split_sentences` (any ``.``/``!``/``?`` before whitespace; the
Shakespeare and Stack Exchange loaders, whose numbers stay as they were) and :func:`prose_sentences`
(only before a capital or a digit, never after an abbreviation such as ``e.g.``, ``et al.`` or
``Fig. 3``; scientific prose such as arXiv abstracts, the tables' ``unit="sentence"``).

``normalize("Don't panic, it's HTML!")`` -> ``"don't panic , it's html !"``
"""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

# A word is a run of letters/digits, with inner apostrophes or hyphens (don't, e-mail); every
# other non-space character is a token of its own.
_TOKEN = re.compile(r"[^\W_]+(?:['\u2019\-][^\W_]+)*|[^\w\s]|_", re.UNICODE)
# A sentence ends at . ! or ? (possibly repeated, possibly followed by a closing quote or
# bracket) followed by whitespace.
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+")


def tokenize(text: str) -> list[str]:
    """Lowercased tokens: words (with inner apostrophes/hyphens) and single punctuation marks."""
    return _TOKEN.findall(text.lower().replace("\u2019", "'"))


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


# A candidate sentence end: . ! ? (repeated or not), closing quotes/brackets, whitespace, then a
# letter or digit that is not an ASCII lowercase letter (possibly after an opening quote/bracket).
_PROSE_END = re.compile(r"[.!?]+[\"')\]]*\s+(?=[\"'(\[{]?[^\W_a-z])")
_OPENERS = "\"'([{"
#: Words whose final period never ends a sentence (compared lowercased, without the final period).
ABBREVIATIONS = frozenset(
    "e.g i.e al vs cf viz approx resp ca dr mr mrs ms prof jr sr st inc ltd corp co dept univ u.s u.k w.r.t a.k.a".split()
)
#: Words whose final period does not end a sentence when a number follows (``Fig. 3``, ``Eq. 2``).
NUMBER_ABBREVIATIONS = frozenset("fig figs eq eqs eqn sec secs sect tab ref refs no nos vol pp p ch chap thm lem def app alg".split())


def _abbreviation_before(text: str, end: int, next_char: str) -> bool:
    """Whether the period at ``text[end]`` closes an abbreviation (``e.g.``; ``Fig.`` before a number)."""
    start = text.rfind(" ", 0, end) + 1
    word = text[start:end].lstrip("\"'([{").lower()
    return word in ABBREVIATIONS or (next_char.isdigit() and word in NUMBER_ABBREVIATIONS)


def prose_sentences(text: str) -> list[str]:
    """Sentences of prose, on one line each (hard line breaks joined, whitespace collapsed).

    A sentence ends at ``.``, ``!`` or ``?`` (possibly repeated, possibly followed by closing
    quotes or brackets) followed by whitespace and then a capital letter or a digit (possibly
    after an opening quote or bracket). A period does not end a sentence after an abbreviation
    (:data:`ABBREVIATIONS`: ``e.g.``, ``i.e.``, ``et al.``, ``vs.``, ...), after ``Fig.``, ``Eq.``,
    ``Sec.``, ``No.``, ... before a number (:data:`NUMBER_ABBREVIATIONS`). A single letter is not
    an abbreviation: in scientific prose it is mostly a variable that ends a sentence (``a graph
    G. We show``), so a name's initials split (``J. Smith``). Decimals (``3.5``) and inner periods
    (``arXiv.org``) have no whitespace after them, so they never split. LaTeX and everything else
    is kept as written."""
    flat = " ".join(text.split())
    out: list[str] = []
    start = 0
    for m in _PROSE_END.finditer(flat):
        s, e = m.span()
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
