"""Plain text (``*.txt``, ``*.text``): one example per line, normalized like the other text loaders
(:func:`fedpriv.data.tokenize.normalize`, unless ``normalize_text=False``).

Blank lines hold no example; lines that normalize to nothing are skipped and counted. How lines
become users (``users=``, see :mod:`fedpriv.data.users`):

* ``"auto"`` (default): ``"paragraph"`` when blank lines split the file into several
  paragraphs, else ``"lines:10"``;
* ``"paragraph"``: each run of lines between blank lines is a user (``para-0007``);
* ``"lines:N"``, ``"clients:N"``: blocks of N lines, or N round-robin clients;
* ``"mapping:PATH"``: a file naming the user of each non-blank line (line i of the mapping for
  the i-th non-blank line).

The file is read strictly as UTF-8 (a BOM at the start of a line is dropped); an invalid byte or a
NUL byte (a binary or UTF-16 file) is an error naming the line.
"""

from __future__ import annotations

import os
from pathlib import Path

from fedpriv.data.corpus import FederatedCorpus
from fedpriv.data.examples import TextExample
from fedpriv.data.tabular import decoded_lines
from fedpriv.data.tokenize import normalize
from fedpriv.data.users import fallback_blocks, parse_users, read_mapping, synthetic_ids
from fedpriv.errors import EmptyCorpusError, SourceError


def load_text(path: str | os.PathLike[str], users: str = "auto", normalize_text: bool = True) -> FederatedCorpus:
    """A plain text file as a FederatedCorpus, one example per non-blank line (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise SourceError(f"{path}: no such file")
    rule = parse_users(users, "line", "paragraph")
    lines: list[str] = []
    paragraph: list[int] = []  # per non-blank line
    para, after_blank = 0, False
    with open(path, "rb") as f:
        for _, line in decoded_lines(path, f):
            if not line.strip():
                after_blank = bool(lines)
                continue
            if after_blank:
                para, after_blank = para + 1, False
            lines.append(line.rstrip("\r\n"))
            paragraph.append(para)
    if not lines:
        raise EmptyCorpusError(f"{path}: no examples (every line is blank)")
    notes: list[str] = []
    if rule.kind == "auto":
        rule = parse_users("paragraph", "line", "paragraph") if para > 0 else fallback_blocks("line")
        notes.append(
            f"users are the file's {para + 1} paragraphs (users='auto': blank lines separate them)" if rule.kind == "natural"
            else f"{path.name} has no blank lines between paragraphs, so users='auto' made blocks of lines"
        )
    if rule.kind == "natural":
        width = len(str(para))
        ids = [f"para-{p:0{width}d}" for p in paragraph]
    elif rule.kind == "mapping":
        assert rule.path is not None
        ids = read_mapping(rule.path, len(lines), "non-blank line", path)
    else:
        ids, note = synthetic_ids(rule, len(lines), "line", path)
        notes.append(note)
    texts = [normalize(t) if normalize_text else " ".join(t.split()) for t in lines]
    kept = [(u, TextExample(t)) for u, t in zip(ids, texts) if t]
    if not kept:
        raise EmptyCorpusError(f"{path}: no examples (every line normalizes to nothing)")
    corpus = FederatedCorpus.from_stream(kept, "text", name=f"text:{path.name}[{users}]")
    for message in notes:
        corpus.note(message)
    corpus.info["lines"] = len(lines)
    if len(kept) < len(lines):
        corpus.note(f"{len(lines) - len(kept)} lines of {path.name} normalize to nothing and were skipped", skipped_empty=len(lines) - len(kept))
    return corpus
