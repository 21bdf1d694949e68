"""The two kinds of example a corpus holds.

* :class:`TextExample` for next-word prediction: ``text`` is already normalized into
  space-separated tokens (see :mod:`fedpriv.data.tokenize`), so splitting on spaces gives words.
* :class:`TaggedExample` for NER: parallel ``tokens`` and ``tags`` tuples.

``timestamp`` is seconds since the Unix epoch (UTC), or ``None`` when the source has no time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Union

Kind = Literal["text", "tagged"]

#: A tag a NER example may hold: ``O``, or a scheme letter and an entity type (BIO, IOB1, BIOES,
#: BILOU). Every loader of tagged data checks its tags against it: the metrics read a tag without
#: a prefix (``PER``) as ``O``, so such a file would train to an F1 of 0 without a word said.
TAG = re.compile(r"^(O|[BIESLU]-\S+)$")
TAG_HELP = "O or B-/I-/E-/S-/L-/U-<type>"


@dataclass(frozen=True, slots=True)
class TextExample:
    """One NWP example: space-separated normalized tokens."""

    text: str
    timestamp: float | None = None

    def words(self) -> list[str]:
        return self.text.split()

    def to_json(self) -> dict:
        return {"text": self.text, "timestamp": self.timestamp}


@dataclass(frozen=True, slots=True)
class TaggedExample:
    """One NER example: a token sequence and its tag sequence of the same length."""

    tokens: tuple[str, ...]
    tags: tuple[str, ...]
    timestamp: float | None = None

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.tags):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.tags)} tags")

    def words(self) -> list[str]:
        return list(self.tokens)

    def to_json(self) -> dict:
        return {"tokens": list(self.tokens), "tags": list(self.tags), "timestamp": self.timestamp}


Example = Union[TextExample, TaggedExample]


def example_from_json(obj: dict, kind: Kind) -> Example:
    """Inverse of ``to_json`` (used by the on-disk store)."""
    if kind == "text":
        return TextExample(obj["text"], obj.get("timestamp"))
    return TaggedExample(tuple(obj["tokens"]), tuple(obj["tags"]), obj.get("timestamp"))


def kind_of(example: Example) -> Kind:
    return "text" if isinstance(example, TextExample) else "tagged"
