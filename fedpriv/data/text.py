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

The file is read twice (counting its lines, then streaming them), so memory holds only the
corpus's store; ``spill_to`` (a file path) puts that on disk. The file is read strictly as UTF-8 (a BOM at the start of a line is dropped); an invalid byte or a
NUL byte (a binary or UTF-16 file) is an error naming the line.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from fedpriv.data.corpus import FederatedCorpus, note_user_id_variants
from fedpriv.data.examples import TextExample
from fedpriv.data.tabular import decoded_lines
from fedpriv.data.tokenize import normalize
from fedpriv.data.users import fallback_blocks, parse_users, read_mapping, synthetic_ids
from fedpriv.errors import EmptyCorpusError, SourceError


def _scan(path: Path) -> tuple[int, int]:
    """``(non-blank lines, paragraph breaks)`` of the file: the first of the two passes."""
    count, para, after_blank = 0, 0, False
    with open(path, "rb") as f:
        for _, line in decoded_lines(path, f):
            if not line.strip():
                after_blank = count > 0
                continue
            if after_blank:
                para, after_blank = para + 1, False
            count += 1
    return count, para


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(paragraph index, line)`` of each non-blank line, streamed: the second pass."""
    para, after_blank, seen = 0, False, False
    with open(path, "rb") as f:
        for _, line in decoded_lines(path, f):
            if not line.strip():
                after_blank = seen
                continue
            if after_blank:
                para, after_blank = para + 1, False
            seen = True
            yield para, line.rstrip("\r\n")


def load_text(
    path: str | os.PathLike[str], users: str = "auto", normalize_text: bool = True, spill_to: str | os.PathLike[str] | None = None
) -> FederatedCorpus:
    """A plain text file as a FederatedCorpus, one example per non-blank line (see the module docstring).

    The file is read twice (counting, then streaming), so memory holds only the corpus's store:
    with ``spill_to`` (a file path) that is an on-disk SQLite store, bounded whatever the file's size."""
    path = Path(path)
    if not path.is_file():
        raise SourceError(f"{path}: no such file")
    rule = parse_users(users, "line", "paragraph")
    count, para = _scan(path)
    if not count:
        raise EmptyCorpusError(f"{path}: no examples (every line is blank)")
    notes: list[str] = []
    if rule.kind == "auto":
        rule = parse_users("paragraph", "line", "paragraph") if para > 0 else fallback_blocks("line")
        notes.append(
            f"users are the file's {para + 1} paragraphs (users='auto': blank lines separate them)" if rule.kind == "natural"
            else f"{path.name} has no blank lines between paragraphs, so users='auto' made blocks of lines"
        )
    ids: Sequence[str] | None = None
    if rule.kind == "mapping":
        assert rule.path is not None
        ids = read_mapping(rule.path, count, "non-blank line", path)
    elif rule.kind != "natural":
        ids, note = synthetic_ids(rule, count, "line", path)
        notes.append(note)
    width = len(str(para))
    skipped = 0

    def examples() -> Iterator[tuple[str, TextExample]]:
        nonlocal skipped
        for i, (p, line) in enumerate(_lines(path)):
            text = normalize(line) if normalize_text else " ".join(line.split())
            if not text:
                skipped += 1
                continue
            yield (f"para-{p:0{width}d}" if ids is None else ids[i]), TextExample(text)

    try:
        corpus = FederatedCorpus.from_stream(examples(), "text", name=f"text:{path.name}[{users}]", spill_to=spill_to)
    except EmptyCorpusError:
        raise EmptyCorpusError(f"{path}: no examples (every line normalizes to nothing)") from None
    for message in notes:
        corpus.note(message)
    note_user_id_variants(corpus, corpus.user_ids, fold_hint="give each group one id in the mapping if it is one person")
    corpus.info["lines"] = count
    if skipped:
        corpus.note(f"{skipped} lines of {path.name} normalize to nothing and were skipped", skipped_empty=skipped)
    return corpus
