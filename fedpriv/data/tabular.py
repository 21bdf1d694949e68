"""Load a user-partitioned table (JSON Lines, CSV, TSV or Parquet) into a :class:`FederatedCorpus`.

Every row is one example of one user. Columns (names configurable):

* ``user_id``: a string or an integer (converted to ``str``); empty or null is an error, and so
  is an integer id that prints the same as a string id of the file (``1`` and ``"1"`` in JSON
  Lines would merge two users into one: refused naming both lines).
* Text mode (default): ``text``, a string, normalized with
  :func:`fedpriv.data.tokenize.normalize` unless ``normalize_text=False`` (then it must already be
  space-separated tokens).
* Tagged mode (``tokens_column`` and ``tags_column`` both given): parallel token and tag
  sequences of equal length. JSONL and Parquet hold lists of strings (Parquet list columns);
  CSV/TSV hold space-separated strings (so a token cannot contain whitespace).
* ``timestamp_column`` (optional): epoch seconds (a number, or a numeric string in CSV), an
  ISO-8601 string (naive means UTC), or a Parquet timestamp/date; stored as epoch seconds UTC.

Gzip (``*.jsonl.gz``, ``*.csv.gz``, ``*.tsv.gz``; any JSONL/CSV/TSV file that starts with the gzip
magic bytes) is decompressed as it streams; line numbers in errors are those of the decompressed
text, and a corrupt or truncated gzip stream is an error naming the line where it broke.

``unit="sentence"`` (text mode only; default ``"row"``, one example per row) makes every sentence
of a row's text an example of the row's user, in order: hard line breaks joined, split by
:func:`fedpriv.data.tokenize.prose_sentences` (``.``/``!``/``?`` before a capital or a digit, not
after abbreviations such as ``e.g.``, ``et al.``, ``Fig. 3``), each sentence normalized; LaTeX is
kept as text. What was done is said once in the corpus notes (rows and sentences counted).

Rows whose example is empty (text normalizing to nothing, or no tokens) are skipped; an empty or
blank token or tag in a list is an error, and so is a NUL character in any string. Text files are
read strictly as UTF-8 (a BOM at the start of a line is dropped; a NUL byte is an error). JSONL
blank lines are skipped; so are CSV records with no fields (blank lines). CSV and TSV use the
:mod:`csv` module's standard quoting (as pandas writes them), strictly: bad quoting is an error.

Rows stream one at a time (Parquet: one record batch at a time), so with ``spill_to`` memory
stays bounded whatever the file's size. Malformed input raises
:class:`~fedpriv.errors.DataFormatError` naming the file and the 1-based line (JSONL, CSV; for
a quoted multi-line CSV record, its last line) or ``"row N"`` (Parquet, 1-based).
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import zlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import date, datetime, timezone
from pathlib import Path

from fedpriv.data.corpus import FederatedCorpus
from fedpriv.data.examples import Example, Kind, TaggedExample, TextExample
from fedpriv.data.tokenize import normalize, prose_sentences
from fedpriv.errors import DataFormatError, EmptyCorpusError, FedprivError, SourceError

_FORMATS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
_FORMAT_NAMES = {"jsonl": "jsonl", "json": "jsonl", "ndjson": "jsonl", "csv": "csv", "tsv": "tsv", "parquet": "parquet"}
_PARQUET_BATCH_ROWS = 4096
#: What an example is: a row, or each sentence of a row's text (see the module docstring).
UNITS = ("row", "sentence")
_GZIP_MAGIC = b"\x1f\x8b"


def format_suffix(path: Path) -> tuple[str, bool]:
    """``(suffix that names the format, lowercased; whether the name ends in .gz)``:
    ``a.jsonl.gz`` -> ``(".jsonl", True)``."""
    suffix = path.suffix.lower()
    if suffix == ".gz":
        return Path(path.stem).suffix.lower(), True
    return suffix, False


class RowError(Exception):
    """One row is malformed; the loader adds the file and line (internal, never escapes a loader)."""


def _type_name(v: object) -> str:
    return "null" if v is None else type(v).__name__


def _check_unicode(s: str, what: str) -> str:
    # JSON "\ud800" escapes give lone surrogates, which cannot be written as UTF-8 later.
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise RowError(f"{what} holds invalid Unicode (a lone surrogate)") from None
    if "\x00" in s:  # a JSON "\u0000" escape, or a NUL in a Parquet string
        raise RowError(f"{what} holds a NUL character")
    return s


def parse_timestamp(value: object) -> float:
    """Epoch seconds (UTC) from a number, a numeric or ISO-8601 string (naive = UTC), a datetime or a date."""
    if value is None:
        raise RowError("missing (null) timestamp")
    if isinstance(value, bool):
        raise RowError(f"timestamp must be a number or an ISO-8601 string, got {value!r}")
    try:
        if isinstance(value, (int, float)):
            t = float(value)
        elif isinstance(value, str):
            s = value.strip()
            try:
                t = float(s)
            except ValueError:
                try:
                    dt = datetime.fromisoformat(s)
                except ValueError:
                    raise RowError(f"unparsable timestamp {value[:60]!r} (need epoch seconds or ISO-8601)") from None
                t = (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()
        elif isinstance(value, datetime):
            t = (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()
        elif isinstance(value, date):
            t = datetime(value.year, value.month, value.day, tzinfo=timezone.utc).timestamp()
        else:
            raise RowError(f"timestamp must be a number or an ISO-8601 string, got {_type_name(value)}")
    except (OverflowError, OSError) as e:
        raise RowError(f"timestamp {value!r} out of range ({e})") from None
    if not math.isfinite(t):
        raise RowError(f"timestamp {value!r} is not finite")
    return t


class RowConverter:
    """Turns one row (a mapping of column name to value) into ``(user_id, example)``, or ``None`` for an
    empty example. Shared by the table and Hugging Face loaders; raises :class:`RowError`."""

    def __init__(
        self,
        *,
        user_column: str,
        text_column: str,
        tokens_column: str | None,
        tags_column: str | None,
        timestamp_column: str | None,
        normalize_text: bool,
        split_strings: bool = False,
        unit: str = "row",
    ):
        if (tokens_column is None) != (tags_column is None):
            raise FedprivError("tagged mode needs both tokens_column and tags_column (or neither, for text mode)")
        if unit not in UNITS:
            raise SourceError(f"unit must be one of {', '.join(repr(u) for u in UNITS)}, got {unit!r}")
        if unit == "sentence" and tokens_column is not None:
            raise SourceError("unit='sentence' splits text; a tagged table (tokens_column, tags_column) keeps one example per row")
        self.unit = unit
        self.user_column = user_column
        self.text_column = text_column
        self.tokens_column = tokens_column
        self.tags_column = tags_column
        self.timestamp_column = timestamp_column
        self.normalize_text = normalize_text
        self.split_strings = split_strings
        self.kind: Kind = "text" if tokens_column is None else "tagged"
        cols = [user_column] + ([text_column] if self.kind == "text" else [tokens_column, tags_column])
        if timestamp_column is not None:
            cols.append(timestamp_column)
        self.columns: list[str] = list(dict.fromkeys(cols))
        #: rows converted to no example (empty text or token list), counted for the corpus notes
        self.skipped_empty = 0
        #: unit="sentence": rows split, and the sentences they gave (for the corpus notes)
        self.split_rows = 0
        self.sentences = 0
        #: where each user id was first seen, by the type it had there (an integer or a string):
        #: 1 and "1" print the same and would merge two users into one
        self._first_seen: dict[bool, dict[str, int | str | None]] = {True: {}, False: {}}

    @staticmethod
    def _get(row: Mapping, col: str) -> object:
        try:
            return row[col]
        except KeyError:
            raise RowError(f"missing column {col!r}") from None

    def user_id(self, value: object, where: int | str | None = None) -> str:
        """The user id as a string; refused when null, empty, of another type, or when it prints
        the same as an id of the other type seen before (``where``: this row's line or ``row N``)."""
        if value is None:
            raise RowError(f"null user id in column {self.user_column!r}")
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise RowError(f"user id must be a string or an integer, got {_type_name(value)}")
        uid = _check_unicode(value, "the user id") if isinstance(value, str) else str(value)
        if not uid.strip():
            raise RowError(f"empty user id in column {self.user_column!r}")
        is_int = isinstance(value, int)
        if uid in self._first_seen[not is_int]:
            first = self._first_seen[not is_int][uid]
            at = "an earlier row" if first is None else f"line {first}" if isinstance(first, int) else first
            this, other = (f"{value} (an integer)", f'"{uid}" (a string)') if is_int else (f'"{uid}" (a string)', f"{uid} (an integer)")
            raise RowError(f"user id {this} prints the same as the user id {other} of {at}: they would merge into one user; give every user id one type")
        self._first_seen[is_int].setdefault(uid, where)
        return uid

    def _str_list(self, row: Mapping, col: str) -> list[str]:
        v = self._get(row, col)
        if self.split_strings and isinstance(v, str):
            return v.split()
        if not isinstance(v, (list, tuple)):
            want = "a space-separated string" if self.split_strings else "a list of strings"
            raise RowError(f"column {col!r} must be {want}, got {_type_name(v)}")
        for x in v:
            if not isinstance(x, str):
                raise RowError(f"column {col!r} must be a list of strings, holds a {_type_name(x)}")
        _check_unicode("".join(v), f"column {col!r}")
        return list(v)

    def _text(self, row: Mapping) -> str:
        text = self._get(row, self.text_column)
        if not isinstance(text, str):
            raise RowError(f"column {self.text_column!r} must be a string, got {_type_name(text)}")
        return _check_unicode(text, f"column {self.text_column!r}")

    def convert_all(self, row: Mapping, where: int | str | None = None) -> list[tuple[str, Example]]:
        """The row's examples: one (or none) for ``unit="row"``, its sentences for ``unit="sentence"``;
        ``where`` as in :meth:`convert`."""
        if self.unit == "row":
            out = self.convert(row, where)
            return [] if out is None else [out]
        uid = self.user_id(self._get(row, self.user_column), where)
        ts = None if self.timestamp_column is None else parse_timestamp(self._get(row, self.timestamp_column))
        clean = normalize if self.normalize_text else (lambda s: " ".join(s.split()))
        texts = [t for t in map(clean, prose_sentences(self._text(row))) if t]
        if not texts:
            self.skipped_empty += 1
            return []
        self.split_rows += 1
        self.sentences += len(texts)
        return [(uid, TextExample(t, ts)) for t in texts]

    def convert(self, row: Mapping, where: int | str | None = None) -> tuple[str, Example] | None:
        """``where``: the row's line (an int) or ``"row N"``, to name the first row of a user id that clashes."""
        uid = self.user_id(self._get(row, self.user_column), where)
        ts = None if self.timestamp_column is None else parse_timestamp(self._get(row, self.timestamp_column))
        if self.kind == "text":
            text = self._text(row)
            if self.normalize_text:
                text = normalize(text)
            if not text.strip():
                self.skipped_empty += 1
                return None
            return uid, TextExample(text, ts)
        tokens = self._str_list(row, self.tokens_column)  # type: ignore[arg-type]
        tags = self._str_list(row, self.tags_column)  # type: ignore[arg-type]
        if len(tokens) != len(tags):
            raise RowError(f"{len(tokens)} tokens but {len(tags)} tags")
        for col, items in ((self.tokens_column, tokens), (self.tags_column, tags)):
            blank = next((i for i, x in enumerate(items) if not x.strip()), None)
            if blank is not None:
                raise RowError(f"column {col!r}: item {blank + 1} is {'empty' if not items[blank] else 'only whitespace'} (tokens and tags must be non-empty)")
        if not tokens:
            self.skipped_empty += 1
            return None
        return uid, TaggedExample(tuple(tokens), tuple(tags), ts)


def note_skipped_rows(corpus: FederatedCorpus, conv: RowConverter) -> None:
    """Say how many rows gave no example (their text or token list was empty)."""
    if conv.skipped_empty:
        what = "text" if conv.kind == "text" else "token list"
        corpus.note(f"{conv.skipped_empty} rows of {corpus.name} have an empty {what} and were skipped", skipped_empty=conv.skipped_empty)


def note_sentences(corpus: FederatedCorpus, conv: RowConverter) -> None:
    """Say once that examples are sentences (``unit="sentence"``), and how many rows gave how many."""
    if conv.unit == "sentence":
        corpus.note(
            f"examples are sentences (unit='sentence'): {conv.split_rows:,} rows of {corpus.name} split into {conv.sentences:,} "
            "sentences at . ! ? before a capital or a digit (not after e.g., i.e., et al., Fig. 3, ...), "
            "hard line breaks joined, LaTeX kept as text",
            unit="sentence", split_rows=conv.split_rows, sentences=conv.sentences,
        )


# ---- readers: each yields (location, row mapping), raising DataFormatError for unreadable input ----


def decode_line(path: str | os.PathLike[str], n: int, raw: bytes) -> str:
    """Physical line ``n`` (1-based) of a text file, decoded strictly as UTF-8. A UTF-8 BOM that
    starts a line is dropped (line 1 of files Windows tools write; any line of files joined with
    ``cat``). Invalid UTF-8 and NUL bytes (a binary file, or UTF-16 text) are errors naming the line."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        if n == 1 and raw.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise DataFormatError(path, n, "not valid UTF-8: the file starts with a UTF-16 byte-order mark (save it as UTF-8)") from None
        raise DataFormatError(path, n, f"not valid UTF-8 ({e.reason} at byte {e.start} of the line)") from None
    nul = text.find("\x00")
    if nul >= 0:
        raise DataFormatError(path, n, f"NUL byte at column {nul + 1}: a binary file, or UTF-16 text? (fedpriv reads UTF-8 text)")
    return text


def decoded_lines(path: Path, f: Iterable[bytes]) -> Iterator[tuple[int, str]]:
    """``(1-based line number, text)`` for each physical line (see :func:`decode_line`)."""
    for n, raw in enumerate(f, start=1):
        yield n, decode_line(path, n, raw)


def _gunzipped(path: Path, f: gzip.GzipFile) -> Iterator[bytes]:
    """The decompressed lines; a corrupt or truncated stream is an error naming the line it broke in."""
    n = 0
    while True:
        try:
            line = f.readline()
        except (OSError, EOFError, zlib.error) as e:
            raise DataFormatError(path, n + 1, f"the gzip data is corrupt or truncated ({_one_line(e)})") from None
        if not line:
            return
        n += 1
        yield line


@contextmanager
def open_lines(path: Path) -> Iterator[Iterable[bytes]]:
    """The physical lines (bytes) of a text file, decompressed as they stream when the file starts
    with the gzip magic bytes (whatever its name)."""
    with open(path, "rb") as raw:
        gz = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        if not gz:
            yield raw
            return
        with gzip.GzipFile(fileobj=raw, mode="rb") as f:
            yield _gunzipped(path, f)


def _jsonl_rows(path: Path, conv: RowConverter) -> Iterator[tuple[str, Example]]:
    with open_lines(path) as f:
        for n, line in decoded_lines(path, f):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as e:
                hint = ""
                if n == 1 and line.lstrip().startswith("["):
                    hint = " (expected JSON Lines, one object per line; a JSON array is not supported)"
                raise DataFormatError(path, n, f"invalid JSON: {e}{hint}") from None
            if not isinstance(obj, dict):
                raise DataFormatError(path, n, f"expected a JSON object, got {_type_name(obj)}")
            try:
                out = conv.convert_all(obj, n)
            except RowError as e:
                raise DataFormatError(path, n, str(e)) from None
            yield from out


def _csv_rows(path: Path, conv: RowConverter, delimiter: str) -> Iterator[tuple[str, Example]]:
    with open_lines(path) as f:
        lines = (text for _, text in decoded_lines(path, f))
        reader = csv.reader(lines, delimiter=delimiter, strict=True)
        try:
            header = next(reader, None)
            if header is None:
                raise EmptyCorpusError(f"{path}: the file is empty (no header line)")
            missing = [c for c in conv.columns if c not in header]
            if missing:
                raise DataFormatError(path, reader.line_num, f"missing column(s) {missing} in the header {header}")
            dup = [c for c in conv.columns if header.count(c) > 1]
            if dup:
                raise DataFormatError(path, reader.line_num, f"column(s) {dup} appear more than once in the header")
            width = len(header)
            for rec in reader:
                if not rec:
                    continue
                if len(rec) != width:
                    raise DataFormatError(path, reader.line_num, f"{len(rec)} fields but the header has {width}")
                try:
                    out = conv.convert_all(dict(zip(header, rec)), reader.line_num)
                except RowError as e:
                    raise DataFormatError(path, reader.line_num, str(e)) from None
                yield from out
        except csv.Error as e:
            raise DataFormatError(path, reader.line_num, f"malformed {'TSV' if delimiter == chr(9) else 'CSV'}: {e}") from None


def _one_line(e: BaseException) -> str:
    """A library's message on one line (pyarrow's hold line breaks)."""
    return " ".join(str(e).split())


def _parquet_values(path: Path, column, name: str, first_row: int) -> list:  # noqa: ANN001
    """A record batch's column as Python values; a string that is not UTF-8 is named by its row."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        for i in range(len(column)):
            try:
                column[i].as_py()
            except UnicodeDecodeError as e:
                raise DataFormatError(path, f"row {first_row + i}", f"column {name!r} is not valid UTF-8 ({e.reason})") from None
        raise DataFormatError(path, f"row {first_row}", f"column {name!r} is not valid UTF-8") from None


def _parquet_rows(path: Path, conv: RowConverter) -> Iterator[tuple[str, Example]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
    except (pa.ArrowException, OSError) as e:
        raise DataFormatError(path, None, f"not a readable Parquet file: {_one_line(e)}") from None
    except UnicodeDecodeError as e:  # a column name in the footer that is not UTF-8
        raise DataFormatError(path, None, f"not a readable Parquet file: a name in its schema is not valid UTF-8 ({e.reason})") from None
    missing = [c for c in conv.columns if c not in names]
    if missing:
        raise DataFormatError(path, "schema", f"missing column(s) {missing}; the file has {names}")
    n = 0
    try:
        for batch in pf.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=conv.columns):
            cols = {c: _parquet_values(path, batch.column(c), c, n + 1) for c in conv.columns}
            for i in range(batch.num_rows):
                n += 1
                try:
                    out = conv.convert_all({c: v[i] for c, v in cols.items()}, f"row {n}")
                except RowError as e:
                    raise DataFormatError(path, f"row {n}", str(e)) from None
                yield from out
    except (pa.ArrowException, OSError) as e:
        raise DataFormatError(path, f"after row {n}", f"cannot read the Parquet data: {_one_line(e)}") from None
    finally:
        pf.close()


def _resolve_format(path: Path, format: str | None) -> str:
    if format is None:
        suffix, gz = format_suffix(path)
        fmt = _FORMATS.get(suffix)
        if fmt is None:
            raise SourceError(f"{path}: cannot tell the format from the suffix {path.suffix!r}; pass format= one of {sorted(_FORMAT_NAMES)}")
        if gz and fmt == "parquet":
            raise SourceError(f"{path}: a gzipped Parquet file is not read (Parquet compresses inside); gunzip it first")
        return fmt
    fmt = _FORMAT_NAMES.get(format.lower().lstrip("."))
    if fmt is None:
        raise SourceError(f"unsupported table format {format!r}; use one of {sorted(_FORMAT_NAMES)}")
    return fmt


def load_table(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    user_column: str = "user_id",
    text_column: str = "text",
    tokens_column: str | None = None,
    tags_column: str | None = None,
    timestamp_column: str | None = None,
    normalize_text: bool = True,
    unit: str = "row",
    spill_to: str | os.PathLike[str] | None = None,
) -> FederatedCorpus:
    """A corpus from a table with one example per row, grouped by ``user_column``.

    ``format`` is ``"jsonl"`` (alias ``"json"``), ``"csv"``, ``"tsv"`` or ``"parquet"``; by default
    inferred from the suffix. Tagged mode when ``tokens_column`` and ``tags_column`` are given,
    text mode otherwise (see the module docstring for the column rules). ``unit`` is ``"row"``
    (one example per row) or ``"sentence"`` (each sentence of a row's text; see the module
    docstring). Gzipped JSONL/CSV/TSV stream decompressed. With ``spill_to`` (a file
    path) examples go to an on-disk SQLite store as they stream; if loading fails, nothing is left
    at ``spill_to`` (an existing file there is kept as it was).

    Raises :class:`SourceError` (missing file, unknown format), :class:`DataFormatError` (bad
    row, naming file and line) or :class:`EmptyCorpusError` (no examples).
    """
    path = Path(path)
    fmt = _resolve_format(path, format)
    if not path.is_file():
        raise SourceError(f"{path}: no such file (or not a regular file)")
    conv = RowConverter(
        user_column=user_column,
        text_column=text_column,
        tokens_column=tokens_column,
        tags_column=tags_column,
        timestamp_column=timestamp_column,
        normalize_text=normalize_text,
        split_strings=fmt in ("csv", "tsv"),
        unit=unit,
    )
    if spill_to is not None:
        spill = Path(spill_to)
        if not spill.parent.is_dir():
            raise FedprivError(f"spill_to {spill}: the directory {spill.parent} does not exist")
        if spill.exists() and spill.resolve() == path.resolve():
            raise FedprivError(f"spill_to {spill} is the source file itself")
    if fmt == "jsonl":
        stream = _jsonl_rows(path, conv)
    elif fmt == "parquet":
        stream = _parquet_rows(path, conv)
    else:
        stream = _csv_rows(path, conv, "\t" if fmt == "tsv" else ",")
    try:
        corpus = FederatedCorpus.from_stream(stream, conv.kind, name=path.name, spill_to=spill_to)
        note_sentences(corpus, conv)
        note_skipped_rows(corpus, conv)
        return corpus
    except EmptyCorpusError as e:
        if str(path) in str(e):
            raise
        raise EmptyCorpusError(f"{path}: no examples (no rows, or every row's {'text' if conv.kind == 'text' else 'token list'} is empty)") from None
    finally:
        stream.close()
