"""Text normalization like the TFF Stack Overflow NWP data: lowercase, punctuation split into
separate tokens, tokens joined by single spaces; plus sentence splitting and HTML stripping.

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
