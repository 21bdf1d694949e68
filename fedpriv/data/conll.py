"""CoNLL / IOB NER files: one token per line, columns separated by tabs (or spaces), a blank line
between sentences. Suffixes ``.conll .conllu .iob .iob2 .bio .bioes .iobes .tsv .annotated``.

Columns (0-based; negative counts from the end of the line): ``token_column`` and ``tag_column``.
Left out, they are detected from the file's first 1,000 token lines: the token is column 1 when
column 0 numbers the tokens of each sentence 1, 2, 3, ... (CoNLL-U style), else column 0; the tag
is the last other column whose every value is a tag. Tags are ``O`` or ``<P>-<type>`` with P in B,
I, E, S, L, U (BIO/IOB2, IOBES, BILOU). A first line that is not a token line but a header
(``token<TAB>tag``) is skipped and said in the notes.

Left out, the tag is the last column when at least 80% of its sampled values are tags (its other
values are then errors naming their lines), and a note names other columns that hold tags too
(CoNLL-2003's chunk column). Detection reads the sampled lines of the usual number of columns;
when at least 90% of them have it, a line with another number is an error naming it (a space inside a token would shift the columns).
Columns are separated by tabs, or on a line without a tab by ASCII spaces (a no-break space is
part of a token). I- tags that begin an entity (IOB1 files, or slips) are counted in a note and
kept, or read as B- with ``iob="iob2"`` (as conlleval and seqeval count them).

Skipped lines: comments (a line starting with ``#`` that does not read as a token line, e.g.
``# text = ...``), CoNLL-U multiword-token ranges (``3-4``) and empty nodes (``3.1``).

Documents start at ``-DOCSTART-`` lines, ``# newdoc`` / ``# newdoc id = X`` (CoNLL-U),
``#begin document (X)`` (CoNLL-2012) and ``# doc_id = X`` / ``# document_id = X`` comments.

How sentences become users (``users=``, see :mod:`fedpriv.data.users`):

* ``"auto"`` (default): ``"document"`` when the file marks documents, else ``"sentences:10"``;
* ``"document"``: one user per document, named by its id (``X`` above) or ``doc-0007`` (numbered
  in file order); a file that marks none is one document;
* ``"comment:KEY"``: the value of the last ``# KEY = VALUE`` comment before the sentence (e.g.
  ``comment:author``); a sentence before any is an error;
* ``"sentences:N"``, ``"clients:N"``, ``"mapping:PATH"``: blocks, round-robin clients, or a file
  naming the user of each sentence (0-based, in file order).

Errors name the file, the line and what was expected. The file is read strictly as UTF-8 (a BOM at
the start of a line is dropped; a NUL byte is an error).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fedpriv.data.corpus import FederatedCorpus, note_user_id_variants
from fedpriv.data.examples import TAG as _TAG
from fedpriv.data.examples import TAG_HELP, TaggedExample
from fedpriv.data.tabular import decode_line
from fedpriv.data.users import fallback_blocks, named_user, parse_users, placeholder_problem, read_mapping, synthetic_ids
from fedpriv.errors import DataFormatError, FedprivError, SourceError

_INDEX = re.compile(r"^\d+$")
_SKIPPED_INDEX = re.compile(r"^\d+[-.]\d+$")  # CoNLL-U multiword range or empty node
_DOC_COMMENTS = [
    re.compile(r"^#\s*newdoc(?:\s+id)?\s*(?:=\s*(?P<id>.*?))?\s*$", re.I),
    re.compile(r"^#\s*begin\s+document\s*\(?(?P<id>[^)]*?)\)?\s*(?:;.*)?$", re.I),
    re.compile(r"^#\s*(?:doc_?id|document_?id|doc id|document id)\s*[=:]\s*(?P<id>.*?)\s*$", re.I),
]
_KEY_VALUE = re.compile(r"^#\s*(?P<key>[^=]*?)\s*=\s*(?P<value>.*?)\s*$")
SAMPLE_LINES = 1000
_HEADER_TAGS = {"tag", "tags", "label", "labels", "ner", "ner_tag", "ner_tags", "bio", "iob", "iob2", "entity", "entities", "class"}


def column_name(j: int) -> str:
    return "the last column" if j == -1 else f"column {j}"


_ASCII_SPACE = re.compile(r"[ \t\n\r\f\v]+")
_ASCII_WHITESPACE = " \t\n\r\f\v"


def _columns(line: str) -> list[str]:
    """A line's columns: tab-separated when it has a tab (empty columns kept), else separated by
    ASCII spaces (a no-break or other Unicode space is part of a token, as in ``10\u00a0000``)."""
    line = line.rstrip(_ASCII_WHITESPACE)
    if "\t" in line:
        return [c.strip(_ASCII_WHITESPACE) for c in line.split("\t")]
    return [c for c in _ASCII_SPACE.split(line) if c]


@dataclass
class Layout:
    """Where the token and the tag are, and how the file was read (for the notes)."""

    token: int
    tag: int
    detected: bool  # the token column was detected (not given)
    width: int = 0  # columns of a typical token line (a '#' line of another width is a comment)
    indexed: bool = False  # column 0 numbers the tokens (CoNLL-U)
    header_line: int | None = None
    tag_detected: bool = True
    uniform: bool = False  # every sampled token line has `width` columns: a line of another width is an error
    other_tag_columns: tuple[int, ...] = ()  # other columns that hold tags too (CoNLL-2003's chunk column)

    def describe(self) -> str:
        which = {(True, True): ", both detected", (True, False): ", the token's detected", (False, True): ", the tag's detected"}
        return f"token in {column_name(self.token)}, tag in {column_name(self.tag)}" + which.get((self.detected, self.tag_detected), "")


def _decode(path: Path, n: int, raw: bytes) -> str:
    return decode_line(path, n, raw).rstrip("\r\n")


def _sample(path: Path) -> list[tuple[int, list[str]]]:
    """``(line number, columns)`` of the first token lines (not blank, not comments or -DOCSTART-)."""
    out: list[tuple[int, list[str]]] = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            line = _decode(path, n, raw)
            if not line.strip() or line.startswith("#") or line.startswith("-DOCSTART-"):
                continue
            out.append((n, _columns(line)))
            if len(out) >= SAMPLE_LINES:
                break
    return out


def _tag_columns(sample: list[tuple[int, list[str]]], token: int) -> list[int]:
    """Columns (other than ``token``) holding a tag on every sampled line long enough to have them."""
    width = max((len(c) for _, c in sample), default=0)
    return [j for j in range(width) if j != token and all(_TAG.match(c[j]) for _, c in sample if len(c) > j)]


#: A last column whose sampled values are at least this share tags is the tag column (CoNLL puts
#: the tag last): its few other values are errors to report by line, not a reason to take another
#: column of tags (CoNLL-2003's chunk column) in its place.
MOSTLY_TAGS = 0.8
#: When at least this share of the sampled token lines have the usual number of columns, a line with
#: another number is an error naming it.
UNIFORM_SHARE = 0.9


def _mostly_tags(sample: list[tuple[int, list[str]]], j: int) -> bool:
    values = [c[j] for _, c in sample if len(c) > j]
    return bool(values) and sum(1 for v in values if _TAG.match(v)) >= MOSTLY_TAGS * len(values)


def detect_layout(path: Path, token_column: int | None = None, tag_column: int | None = None) -> Layout:
    """The token and tag columns: as given, else detected (see the module docstring)."""
    for name, value in (("token_column", token_column), ("tag_column", tag_column)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise FedprivError(f"{name}={value!r}: expected a column number (0-based; -1 = the last column)")
    sample = _sample(path)
    widths = sorted(len(c) for _, c in sample)
    width = widths[len(widths) // 2] if widths else 0
    indexed = bool(sample) and re.match(r"^1([-.]\d+)?$", sample[0][1][0]) is not None and all(_INDEX.match(c[0]) or _SKIPPED_INDEX.match(c[0]) for _, c in sample)
    if indexed:  # multiword ranges and empty nodes carry no tag
        sample = [(n, c) for n, c in sample if not _SKIPPED_INDEX.match(c[0])]
    token = token_column if token_column is not None else (1 if indexed and width > 2 else 0)
    # Detection reads the lines of the usual width: a stray wider line (a space inside a token)
    # must not move the tag column; when nearly all lines have that width, another is an error.
    main = [(n, c) for n, c in sample if len(c) == width]
    uniform = bool(main) and len(main) >= UNIFORM_SHARE * len(sample)
    if tag_column is not None:
        return Layout(token, tag_column, token_column is None, width, indexed and token_column is None, tag_detected=False, uniform=uniform)
    header = None
    found = _tag_columns(main, token % max(width, 1))
    if not found and len(sample) > 1:  # a header line (token<TAB>tag) above the tokens?
        rest = _tag_columns([(n, c) for n, c in sample[1:] if len(c) == width], token % max(width, 1))
        first = sample[0][1]
        if rest and len(first) > rest[-1] and first[rest[-1]].lower() in _HEADER_TAGS:
            header, found = sample[0][0], rest
    last = width - 1
    if width > 1 and last != token % width and last not in found and _mostly_tags(main, last):
        found.append(last)  # the tag column with a few bad values: they are reported by line
    # No column is all tags: the classic layout (tag last), so the first bad tag is reported by line.
    tag = found[-1] if found else -1
    return Layout(token, tag, token_column is None, width, indexed and token_column is None, header, uniform=uniform, other_tag_columns=tuple(found[:-1]))


@dataclass
class ConllFile:
    """What reading a file found: its sentences with their document and comment values."""

    sentences: list[TaggedExample] = field(default_factory=list)
    doc_index: list[int] = field(default_factory=list)  # per sentence
    doc_ids: dict[int, str] = field(default_factory=dict)  # document index -> its id, when named
    comment_values: list[str | None] = field(default_factory=list)  # per sentence, for comment:KEY
    marks_documents: bool = False
    comments: int = 0
    skipped_tokens: int = 0  # multiword ranges and empty nodes
    iob_starts: int = 0  # I- tags that begin an entity (IOB1, or slips): B- under iob="iob2"


#: How I- tags that begin an entity are read: as written, or as B- (IOB1 or slips read as IOB2).
IOB_MODES = ("keep", "iob2")


def _iob_starts(tags: list[str], repair: bool) -> int:
    """How many I- tags begin an entity (at the start, after O, or after a tag of another type);
    with ``repair``, they become B- in place."""
    n, prev = 0, "O"
    for i, t in enumerate(tags):
        if t.startswith("I-") and (prev == "O" or prev[2:] != t[2:]):
            n += 1
            if repair:
                tags[i] = t = "B-" + t[2:]
        prev = t
    return n


def read_conll(path: str | os.PathLike[str], layout: Layout | None = None, comment_key: str | None = None, iob: str = "keep") -> ConllFile:
    """Every sentence of a CoNLL/IOB file (see the module docstring); ``comment_key``: also record the
    value of the last ``# KEY = VALUE`` comment before each sentence; ``iob``: see :data:`IOB_MODES`."""
    path = Path(path)
    out = ConllFile()
    for doc, value, sentence in stream_conll(path, layout or detect_layout(path), comment_key, iob, out):
        out.sentences.append(sentence)
        out.doc_index.append(doc)
        out.comment_values.append(value)
    return out


def stream_conll(path: Path, lay: Layout, comment_key: str | None, iob: str, out: ConllFile) -> Iterator[tuple[int, str | None, TaggedExample]]:
    """``(document index, comment value, sentence)`` of each sentence, streamed; ``out`` gathers the
    file's facts (documents and their ids, comments, skipped tokens, I- entity starts) but not the
    sentences (see :func:`read_conll`)."""
    if iob not in IOB_MODES:
        raise SourceError(f"iob must be one of {', '.join(repr(m) for m in IOB_MODES)}, got {iob!r}")
    doc, doc_has_sentences = 0, False
    value: str | None = None
    tokens: list[str] = []
    tags: list[str] = []
    ready: list[tuple[int, str | None, TaggedExample]] = []  # sentences ended by the line just read

    def end_sentence() -> None:
        nonlocal tokens, tags, doc_has_sentences
        if tokens:
            out.iob_starts += _iob_starts(tags, iob == "iob2")
            ready.append((doc, value, TaggedExample(tuple(tokens), tuple(tags))))
            tokens, tags = [], []
            doc_has_sentences = True

    def new_document(doc_id: str | None) -> None:
        nonlocal doc, doc_has_sentences
        end_sentence()
        out.marks_documents = True
        if doc_has_sentences:
            doc, doc_has_sentences = doc + 1, False
        if doc_id:
            out.doc_ids[doc] = doc_id

    def token_line(n: int, cols: list[str], line: str, strict: bool) -> bool:
        """Add the line's token; False (strict: an error) when it is not a token line."""
        if lay.indexed and not _INDEX.match(cols[0]):
            if _SKIPPED_INDEX.match(cols[0]):
                out.skipped_tokens += 1
                return True
            if strict:
                raise DataFormatError(path, n, f"expected a token number in column 0 (as on the lines before), got {line[:60]!r}")
            return False
        need = max(lay.token if lay.token >= 0 else -lay.token - 1, lay.tag if lay.tag >= 0 else -lay.tag - 1) + 1
        if lay.uniform and len(cols) != lay.width and not line.startswith("#"):
            raise DataFormatError(
                path, n, f"{len(cols)} columns where the file's token lines have {lay.width} (a space inside a token? columns are "
                f"separated by tabs, or by spaces on a line without a tab), got {line[:60]!r}"
            )
        if len(cols) < max(need, 2):
            if strict:
                raise DataFormatError(path, n, f"expected a token and a tag separated by tabs or spaces ({lay.describe()}), got {line[:60]!r}")
            return False
        token, tag = cols[lay.token], cols[lay.tag]
        if not _TAG.match(tag):
            if strict:
                hint = "; pass tag_column= to choose the column" if lay.tag_detected else ""
                if len(cols) != lay.width:
                    hint += f" (this line has {len(cols)} columns, the file's token lines {lay.width}: a space inside a token?)"
                if n == 1:
                    hint += "; if line 1 is a table's header, name the table's columns (-o user_column=... -o text_column=...)"
                raise DataFormatError(path, n, f"tag {tag[:30]!r} ({column_name(lay.tag)}) is not {TAG_HELP}{hint}")
            return False
        if not token.strip():  # a no-break space alone is no token either
            if strict:
                raise DataFormatError(path, n, f"empty token ({column_name(lay.token)})")
            return False
        tokens.append(token)
        tags.append(tag)
        return True

    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            if ready:
                yield from ready
                ready.clear()
            line = _decode(path, n, raw)
            if n == lay.header_line:
                continue
            if not line.strip():
                end_sentence()
                continue
            if line.startswith("-DOCSTART-"):
                new_document(None)
                continue
            if line.startswith("#"):
                cols = _columns(line)
                if len(cols) == lay.width and token_line(n, cols, line, strict=False):
                    continue
                out.comments += 1
                for pattern in _DOC_COMMENTS:
                    m = pattern.match(line)
                    if m:
                        new_document((m.group("id") or "").strip() or None)
                        break
                if comment_key is not None:
                    m = _KEY_VALUE.match(line)
                    if m and m.group("key") == comment_key:
                        end_sentence()
                        value = m.group("value")
                continue
            token_line(n, _columns(line), line, strict=True)
    end_sentence()
    yield from ready


def iter_sentences(path: str | os.PathLike[str], token_column: int | None = None, tag_column: int | None = None) -> Iterator[tuple[int, TaggedExample]]:
    """``(document index, sentence)`` in file order."""
    path = Path(path)
    read = read_conll(path, detect_layout(path, token_column, tag_column))
    yield from zip(read.doc_index, read.sentences)


def load_conll(
    path: str | os.PathLike[str],
    users: str = "auto",
    token_column: int | None = None,
    tag_column: int | None = None,
    iob: str = "keep",
    spill_to: str | os.PathLike[str] | None = None,
) -> FederatedCorpus:
    """A CoNLL/IOB file as a FederatedCorpus of tagged sentences, users formed by ``users``;
    ``iob="iob2"`` reads I- tags that begin an entity as B- (they are counted in a note either way).
    With ``spill_to`` (a file path) the file is read twice (its facts, then its sentences streamed
    to an on-disk store), so memory stays bounded whatever the file's size."""
    path = Path(path)
    if not path.is_file():
        raise SourceError(f"{path}: no such file")
    rule = parse_users(users, "sentence", "document", comment=True)
    layout = detect_layout(path, token_column, tag_column)
    key = rule.key if rule.kind == "comment" else None
    read = ConllFile()
    count, docs, missing = 0, set[int](), None
    held: list[tuple[int, str | None, TaggedExample]] = []  # without spill_to, the one pass keeps the sentences
    for item in stream_conll(path, layout, key, iob, read):
        doc, value, _ = item
        if missing is None and not value:
            missing = count
        why = placeholder_problem(named_user(value)) if value and rule.kind == "comment" else None
        if why:
            raise DataFormatError(path, None, f"sentence {count + 1}: its '# {rule.key} = {value}' comment: {why}")
        count += 1
        docs.add(doc)
        if spill_to is None:
            held.append(item)
    if not count:
        raise FedprivError(f"{path}: no sentences found (expected token lines: {layout.describe()})")
    notes: list[str] = []
    if rule.kind == "auto":
        rule = parse_users("document", "sentence", "document") if read.marks_documents else fallback_blocks("sentence")
        if rule.kind == "blocks":
            notes.append(f"{path.name} marks no documents (-DOCSTART-, '# newdoc id = ...'), so users='auto' made blocks of sentences")
    ids: list[str] | None = None
    if rule.kind == "natural":
        doc_id = _document_id(read, max(docs))
        if not read.marks_documents:
            notes.append(f"{path.name} marks no documents: users='document' made all {count} sentences one user")
        elif users == "auto":
            named = len(read.doc_ids)
            how = "named by their ids" if named == len(docs) else "numbered in file order" if not named else f"{named} named by their ids, the others numbered"
            notes.append(f"users are the file's {len({doc_id(d) for d in docs})} documents (users='auto'; {how})")
    elif rule.kind == "comment":
        if missing is not None:
            raise DataFormatError(path, None, f"sentence {missing + 1} has no '# {rule.key} = ...' comment before it (users={rule.text!r})")
    elif rule.kind == "mapping":
        assert rule.path is not None
        ids = read_mapping(rule.path, count, "sentence", path)
    else:
        ids, note = synthetic_ids(rule, count, "sentence", path)
        notes.append(note)

    def user(i: int, doc: int, value: str | None) -> str:
        if ids is not None:
            return ids[i]
        return named_user(str(value)) if rule.kind == "comment" else doc_id(doc)

    again = held if spill_to is None else stream_conll(path, layout, key, iob, ConllFile())  # spilled: a second pass
    sentences = ((user(i, doc, value), s) for i, (doc, value, s) in enumerate(again))
    corpus = FederatedCorpus.from_stream(sentences, "tagged", name=f"conll:{path.name}[{users}]", spill_to=spill_to)
    if (layout.detected or layout.tag_detected) and not (layout.token == 0 and layout.tag in (-1, layout.width - 1)):
        notes.append(f"{path.name}: {layout.describe()}; pass token_column= / tag_column= to choose others")
    if layout.tag_detected and layout.other_tag_columns:
        others = " and ".join(column_name(j) for j in layout.other_tag_columns)
        notes.append(
            f"{path.name}: {others} also hold{'s' if len(layout.other_tag_columns) == 1 else ''} tags (a chunk column, as in CoNLL-2003?); "
            f"the tag is read from the last, {column_name(layout.tag)}; pass tag_column= to read another"
        )
    if read.iob_starts:
        notes.append(
            f"{path.name}: {read.iob_starts:,} I- tags begin an entity (at a sentence start, after O, or after another type): "
            + ("read as B- (iob='iob2'), as conlleval and seqeval count them" if iob == "iob2" else
               "kept as written; if the file is IOB1, or these are slips, pass iob='iob2' to read them as B- (conlleval and seqeval count them as entity starts)")
        )
    if layout.header_line is not None:
        notes.append(f"{path.name}:{layout.header_line} read as a header line and skipped")
    for message in notes:
        corpus.note(message)
    note_user_id_variants(corpus, corpus.user_ids, fold_hint="give each group one id in the file if it is one person")
    corpus.info.update(sentences=count, comment_lines=read.comments, documents=len(docs) if read.marks_documents else 0)
    if read.skipped_tokens:
        corpus.info["skipped_multiword_or_empty_nodes"] = read.skipped_tokens
    return corpus


def _document_id(read: ConllFile, last: int) -> Callable[[int], str]:
    """A sentence's document as a user: its id when the file names it, else ``doc-0007`` by position."""
    width = len(str(last))
    return lambda d: read.doc_ids.get(d) or f"doc-{d:0{width}d}"
