"""The bundled default corpus: Shakespeare's plays by speaker (tiny-shakespeare, public domain).

The file is a sequence of turns separated by blank lines; each turn opens with a ``SPEAKER:``
line. The speaker is the user. An example is one sentence of a turn (``unit="sentence"``,
the default, to suit fixed-length NWP sequences) or the whole turn (``unit="turn"``), normalized
by :func:`fedpriv.data.tokenize.normalize`. The text has no timestamps. A speaker line with no
text of its own (ghosts speaking in chorus, whose lines follow the last name) gives no examples,
so the bundled file yields 299 users of its 309 speaker names.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Literal

from fedpriv.data.corpus import FederatedCorpus
from fedpriv.data.examples import TextExample
from fedpriv.data.tokenize import normalize, split_sentences
from fedpriv.errors import DataFormatError

_SPEAKER = re.compile(r"^([A-Z][A-Za-z' .,&-]*[A-Za-z.]):\s*$")


def bundled_path() -> Path:
    """Path of the bundled tiny-shakespeare text (with its NOTICE beside it)."""
    return Path(str(resources.files("fedpriv") / "_bundled" / "tinyshakespeare.txt"))


def iter_turns(path: str | os.PathLike[str]) -> Iterator[tuple[str, str, int]]:
    """``(speaker, turn text, line number of the SPEAKER: line)`` for every turn, in file order."""
    speaker: str | None = None
    start = 0
    lines: list[str] = []
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, start=1):
            line = raw.rstrip("\n")
            if not line.strip():
                if speaker is not None and lines:
                    yield speaker, "\n".join(lines), start
                speaker, lines = None, []
                continue
            if speaker is None:
                m = _SPEAKER.match(line)
                if m is None:
                    raise DataFormatError(path, n, f"expected a 'SPEAKER:' line to open a turn, got {line[:60]!r}")
                speaker, start = m.group(1).strip(), n
            else:
                lines.append(line)
    if speaker is not None and lines:
        yield speaker, "\n".join(lines), start


def load_shakespeare(
    path: str | os.PathLike[str] | None = None, unit: Literal["sentence", "turn"] = "sentence"
) -> FederatedCorpus:
    """Shakespeare by speaker; ``path`` defaults to the bundled copy."""
    path = bundled_path() if path is None else Path(path)
    if unit not in ("sentence", "turn"):
        raise ValueError(f"unit must be 'sentence' or 'turn', got {unit!r}")

    def stream() -> Iterator[tuple[str, TextExample]]:
        for speaker, text, _ in iter_turns(path):
            pieces = split_sentences(text) if unit == "sentence" else [text]
            for piece in pieces:
                norm = normalize(piece)
                if norm:
                    yield speaker, TextExample(norm)

    return FederatedCorpus.from_stream(stream(), "text", name=f"shakespeare:{unit}" if path == bundled_path() else f"{path.name}:{unit}")
