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
from fedpriv.data.tabular import decoded_lines
from fedpriv.errors import DataFormatError, EmptyCorpusError, SourceError

_NEWLINE = re.compile(r"\r\n?")
_SPEAKER = re.compile(r"^([A-Z][A-Za-z' .,&-]*[A-Za-z.]):\s*$")


def bundled_path() -> Path:
    """Path of the bundled tiny-shakespeare text (with its NOTICE beside it)."""
    return Path(str(resources.files("fedpriv") / "_bundled" / "tinyshakespeare.txt"))


def _text_lines(path: str | os.PathLike[str], f) -> Iterator[str]:  # noqa: ANN001
    """The file's lines, read strictly as UTF-8 (a BOM dropped; an error names the line); ``\\n``,
    ``\\r\\n`` and a lone ``\\r`` end a line, as in Python's text mode."""
    for _, line in decoded_lines(path, f):
        yield from _NEWLINE.split(line.removesuffix("\n").removesuffix("\r"))


def iter_turns(path: str | os.PathLike[str]) -> Iterator[tuple[str, str, int]]:
    """``(speaker, turn text, line number of the SPEAKER: line)`` for every turn, in file order."""
    speaker: str | None = None
    start = 0
    lines: list[str] = []
    with open(path, "rb") as f:
        for n, line in enumerate(_text_lines(path, f), start=1):
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
        raise SourceError(f"unit must be 'sentence' or 'turn', got {unit!r}")
    if not path.is_file():
        raise SourceError(f"{path}: no such file")

    def stream() -> Iterator[tuple[str, TextExample]]:
        for speaker, text, _ in iter_turns(path):
            pieces = split_sentences(text) if unit == "sentence" else [text]
            for piece in pieces:
                norm = normalize(piece)
                if norm:
                    yield speaker, TextExample(norm)

    try:
        return FederatedCorpus.from_stream(stream(), "text", name=f"shakespeare:{unit}" if path == bundled_path() else f"{path.name}:{unit}")
    except EmptyCorpusError:
        raise EmptyCorpusError(f"{path}: no examples (no 'SPEAKER:' turn with text)") from None
