"""Load a user-partitioned table (JSON Lines, CSV, TSV or Parquet) into a :class:`FederatedCorpus`.

Every row is one example of one user. Columns (names configurable):

* ``user_id``: a string or an integer (converted to ``str``); empty or null is an error, and so
  is an integer id that prints the same as a string id of the file (``1`` and ``"1"`` in JSON
  Lines would merge two users into one: refused naming both lines). A string id is trimmed of
  surrounding whitespace and put in Unicode NFC form (``"alice "`` and ``"alice"`` are one user;
  counted in the corpus notes). An id that a spreadsheet or pandas has mangled is refused: a
  number in scientific notation (``1.23457E+18``: rounding has merged users) or an integer
  written as a float (``1.0``). A placeholder id (:data:`PLACEHOLDER_USER_IDS`: ``[deleted]``,
  ``nan``, ``null``, ``\\N``, ...; any case) stands for many people, so its rows are skipped and
  counted (``placeholder_users="keep"`` keeps them as one user). Ids that differ only in letter
  case stay apart (``user_id_case="fold"`` merges them) and are counted in a note: one person
  with two ids is two users to a per-user ε. A dotted column name (``user.screen_name``) reads a
  nested JSON field when no column has that name.
* Text mode (default): ``text``, a string, normalized with
  :func:`fedpriv.data.tokenize.normalize` unless ``normalize_text=False`` (then it must already be
  space-separated tokens).
* Tagged mode (``tokens_column`` and ``tags_column`` both given): parallel token and tag
  sequences of equal length. JSONL and Parquet hold lists of strings (Parquet list columns);
  CSV/TSV hold space-separated strings (so a token cannot contain whitespace).
* ``timestamp_column`` (optional): epoch seconds (a number, or a numeric string in CSV), an
  ISO-8601 string (naive means UTC), or a Parquet timestamp/date; stored as epoch seconds UTC.

Gzip, bzip2 and xz (``*.jsonl.gz``, ``*.csv.bz2``, ``*.tsv.xz``, ...; any JSONL/CSV/TSV file that
starts with their magic bytes) are decompressed as they stream; line numbers in errors are those of
the decompressed text, and a corrupt or truncated stream is an error naming the line where it
broke. A zstd or zip file is refused with how to decompress it.

``unit="sentence"`` (text mode only; default ``"row"``, one example per row) makes every sentence
of a row's text an example of the row's user, in order: hard line breaks joined, split by
:func:`fedpriv.data.tokenize.prose_sentences` (``.``/``!``/``?`` before a capital or a digit, not
after abbreviations such as ``e.g.``, ``et al.``, ``Fig. 3``; every full-width ``。``/``！``/``？``),
each sentence normalized; LaTeX is kept as text. What was done is said once in the corpus notes
(rows and sentences counted). With either unit, Chinese, Japanese or Thai text without spaces
between words (:func:`unsegmented`) is counted in a note when it is more than a fifth of the
examples: the tokenizer makes each phrase one token.

Rows whose example is empty (text normalizing to nothing, or no tokens) are skipped; an empty or
blank token or tag in a list is an error, and so is a NUL character in any string. Text files are
read strictly as UTF-8 (a BOM at the start of a line is dropped; a NUL byte is an error). JSONL
blank lines are skipped; so are CSV records with no fields (blank lines); a JSON array, or an
object spread over several lines, is refused with a hint; a used key twice in one object is an
error (JSON would keep the last). CSV and TSV use the :mod:`csv` module's standard quoting (as
pandas writes them), strictly: bad quoting is an error, and records that span several lines are
counted in the notes; in a TSV, a quoted field that runs over a line break into a tab (a stray
quote joining rows of other users) is an error. ``quoting="none"`` reads quotes as ordinary
characters (a field then holds no delimiter and no line break). Fields have no size limit.

Rows stream one at a time (Parquet: one record batch at a time), so with ``spill_to`` memory
stays bounded whatever the file's size. Malformed input raises
:class:`~fedpriv.errors.DataFormatError` naming the file and the 1-based line (JSONL, CSV; for
a quoted multi-line CSV record, its last line) or ``"row N"`` (Parquet, 1-based).
"""

from __future__ import annotations

import bz2
import csv
import gzip
import json
import lzma
import math
import os
import re
import sys
import unicodedata
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import date, datetime, timezone
from pathlib import Path

from fedpriv.data.corpus import FederatedCorpus, normalized_user_id, note_skipped_empty, note_user_id_variants
from fedpriv.data.examples import TAG, TAG_HELP, Example, Kind, TaggedExample, TextExample
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
#: Stream compressions read as they stream, by the suffix that names them and by their magic bytes.
COMPRESSION_SUFFIXES = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz"}
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"\xfd7zXZ\x00", "xz"))
#: Compressions refused, by magic bytes: (name, how to read the file instead).
_UNREAD_MAGIC = (
    (b"\x28\xb5\x2f\xfd", "zstd", "decompress it first (zstd -d --long=31 FILE), or recompress it as gzip"),
    (b"PK\x03\x04", "zip", "unzip it first"),
)
#: Quoting of CSV/TSV fields: the csv module's standard quoting, or quotes as ordinary characters.
QUOTINGS = ("csv", "none")
#: User ids that stand for many people (compared casefolded): deleted accounts, missing values.
PLACEHOLDER_USER_IDS = frozenset(
    {"[deleted]", "[removed]", "nan", "none", "null", "\\n", "n/a", "#n/a", "undefined", "<na>", "(null)", "<null>", "n.a.", "#null!"}
)
#: Missing-value markers that are placeholders only as written (R's ``NA``, Ruby's ``nil``): ``Na``
#: may be a person's name.
PLACEHOLDER_USER_IDS_EXACT = frozenset({"NA", "nil"})
PLACEHOLDER_USERS = ("skip", "keep")
#: Texts that stand for a deleted or removed post (Reddit's), compared stripped and casefolded: no data.
PLACEHOLDER_TEXTS = frozenset({"[deleted]", "[removed]"})
#: A whole text that is a missing-value marker as tools write one (R, pandas, SQL dumps, Excel),
#: compared stripped, as written: no data either. (A reply "none" in lower case is kept.)
MISSING_TEXTS = frozenset({"NA", "<NA>", "NaN", "nan", "NULL", "null", "None", "N/A", "#N/A", "\\N", "undefined"})
USER_ID_CASES = ("keep", "fold")
#: A number in scientific notation, or an integer written as a float: ids mangled by a spreadsheet or pandas.
_SCIENTIFIC_ID = re.compile(r"[+-]?\d(?:\.\d+)?[eE][+-]\d+")  # 1.23457E+18, 5E+11; not hex such as 69e56976
_FLOAT_INT_ID = re.compile(r"[+-]?\d+\.0+")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
#: Seconds in the first year of the Unix epoch: a numeric timestamp below it is 1970.
_EPOCH_FIRST_YEAR = 365 * 86400.0
#: Characters that show nothing in an id: zero-width space, (non-)joiners, direction marks, word joiner, BOM, soft hyphen.
#: Epoch seconds of 3000-01-01: a larger timestamp is milliseconds (or finer) since the epoch.
_MAX_EPOCH_SECONDS = 32503680000.0
#: Scripts written without spaces between words: Han (Chinese characters, kanji), Hiragana,
#: Katakana (full and half width), Thai, Lao, Myanmar, Khmer. (Not their punctuation: 。，「 are
#: tokens of their own.)
_NO_SPACE_SCRIPT = (
    "\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f"
)
_NO_SPACE_CHAR = re.compile(f"[{_NO_SPACE_SCRIPT}]")
#: A run of such characters with no space or punctuation in it that is longer than a word: words
#: of Chinese are 1-4 characters, of Japanese mostly 1-5; a run of 8 or more is a phrase or a clause.
UNSEGMENTED_RUN = 8
_NO_SPACE_RUN = re.compile(f"[{_NO_SPACE_SCRIPT}]{{{UNSEGMENTED_RUN},}}")
#: How to reach UTF-8 from the commonest other encoding of text files (Windows' Western European).
TO_UTF8 = "save it as UTF-8, e.g. iconv -f WINDOWS-1252 -t UTF-8 FILE > OUT for a Windows file"

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # a long post is a valid field, not a malformed file


def format_suffix(path: Path) -> tuple[str, bool]:
    """``(suffix that names the format, lowercased; whether the name ends in a compression suffix)``:
    ``a.jsonl.gz`` -> ``(".jsonl", True)`` (also ``.bz2``, ``.xz``)."""
    suffix = path.suffix.lower()
    if suffix in COMPRESSION_SUFFIXES:
        return Path(path.stem).suffix.lower(), True
    return suffix, False


def is_placeholder_id(uid: str) -> bool:
    """Whether a (normalized) string id stands for many people: :data:`PLACEHOLDER_USER_IDS` in any
    case, :data:`PLACEHOLDER_USER_IDS_EXACT` as written."""
    return uid.casefold() in PLACEHOLDER_USER_IDS or uid in PLACEHOLDER_USER_IDS_EXACT


def unsegmented(text: str) -> bool:
    """Whether ``text`` is Chinese, Japanese, Thai, ... (:data:`_NO_SPACE_SCRIPT`) written without
    spaces between its words: most of its characters of those scripts stand in runs of
    :data:`UNSEGMENTED_RUN` or more with no space, which the tokenizer (words end at spaces and
    punctuation only) reads as one token each. ASCII text is answered without a scan."""
    if text.isascii():
        return False
    chars = len(_NO_SPACE_CHAR.findall(text))
    return chars >= UNSEGMENTED_RUN and 2 * sum(map(len, _NO_SPACE_RUN.findall(text))) > chars


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
    number = True  # epoch seconds given as a number (not a date)
    try:
        if isinstance(value, (int, float)):
            t = float(value)
        elif isinstance(value, str):
            s = value.strip()
            try:
                t = float(s)
            except ValueError:
                number = False
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
    if number and isinstance(value, (int, float, str)) and t > _MAX_EPOCH_SECONDS:
        raise RowError(f"timestamp {value!r} is after the year 3000: milliseconds since the epoch? (fedpriv reads epoch seconds: divide by 1000)")
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
        placeholder_users: str = "skip",
        user_id_case: str = "keep",
    ):
        if (tokens_column is None) != (tags_column is None):
            raise FedprivError("tagged mode needs both tokens_column and tags_column (or neither, for text mode)")
        if unit not in UNITS:
            raise SourceError(f"unit must be one of {', '.join(repr(u) for u in UNITS)}, got {unit!r}")
        if unit == "sentence" and tokens_column is not None:
            raise SourceError("unit='sentence' splits text; a tagged table (tokens_column, tags_column) keeps one example per row")
        if placeholder_users not in PLACEHOLDER_USERS:
            raise SourceError(f"placeholder_users must be one of {', '.join(repr(u) for u in PLACEHOLDER_USERS)}, got {placeholder_users!r}")
        if user_id_case not in USER_ID_CASES:
            raise SourceError(f"user_id_case must be one of {', '.join(repr(u) for u in USER_ID_CASES)}, got {user_id_case!r}")
        self.unit = unit
        self.placeholder_users = placeholder_users
        self.user_id_case = user_id_case
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
        #: rows whose string user id was trimmed or put in NFC form; rows skipped for a placeholder id, by id
        self.normalized_ids = 0
        #: numeric timestamps in 1970 (dates written as numbers?); ids a spreadsheet may have rounded
        self.timestamps_in_1970 = 0
        self.long_numeric_ids = 0  # rows whose id is 16 or more digits
        self.rounded_id_rows = 0  # of those, rows whose id has only zeros after its 15th digit
        self.skipped_placeholder: Counter[str] = Counter()
        #: text examples in a script written without spaces whose words were not separated (:func:`unsegmented`)
        self.unsegmented = 0
        self.placeholder_texts: Counter[str] = Counter()  # rows whose text is '[deleted]' or '[removed]' (also in skipped_empty)
        #: the top-level JSON keys the columns read (a duplicate of one is an error)
        self.keys = frozenset(c.split(".", 1)[0] for c in self.columns) | frozenset(self.columns)
        names = self.keys | {part for c in self.columns for part in c.split(".")}  # a dotted column's keys too
        self._quoted_keys = tuple(f'"{k}"' for k in names)  # as a key is written in a JSON line
        self._non_ascii_keys = not all(k.isascii() for k in names)
        #: where each user id was first seen, by the type it had there (an integer or a string):
        #: 1 and "1" print the same and would merge two users into one
        self._first_seen: dict[bool, dict[str, int | str | None]] = {True: {}, False: {}}

    @staticmethod
    def _get(row: Mapping, col: str) -> object:
        """``row[col]``; a dotted name (``user.screen_name``) that is no column reads a nested field."""
        try:
            return row[col]
        except KeyError:
            pass
        value: object = row
        for part in col.split(".") if "." in col else ():
            if not isinstance(value, Mapping) or part not in value:
                break
            value = value[part]
        else:
            if "." in col:
                return value
        keys = list(row)
        shown = ", ".join(map(repr, keys[:20])) + (f", ... ({len(keys)} keys)" if len(keys) > 20 else "")
        raise RowError(f"missing column {col!r}; the row has {shown}")

    def id_key(self, value: str | int) -> str:
        """The user a raw id belongs to, without the checks and counts of :meth:`user_id`."""
        uid = normalized_user_id(value)
        return uid.casefold() if self.user_id_case == "fold" and not isinstance(value, int) else uid

    def seen_user(self, value: str) -> bool:
        """Whether a raw id (as a CSV field holds it) is that of a row converted before."""
        uid = self.id_key(value)
        return uid in self._first_seen[False] or uid in self._first_seen[True]

    def user_id(self, value: object, where: int | str | None = None) -> str | None:
        """The user id as a string (:func:`normalized_user_id`; casefolded with ``user_id_case="fold"``),
        or ``None`` for a placeholder id whose row is skipped. Refused when null, empty, of another
        type, mangled by a spreadsheet (``1.23457E+18``, ``1.0``), or when it prints the same as an
        id of the other type seen before (``where``: this row's line or ``row N``)."""
        if value is None:
            raise RowError(f"null user id in column {self.user_column!r}")
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise RowError(f"user id must be a string or an integer, got {_type_name(value)}")
        uid = normalized_user_id(_check_unicode(value, "the user id") if isinstance(value, str) else value)
        if not uid:
            raise RowError(f"empty user id in column {self.user_column!r}")
        is_int = isinstance(value, int)
        if not is_int:
            if uid != value:
                self.normalized_ids += 1
            if is_placeholder_id(uid) and self.placeholder_users == "skip":
                self.skipped_placeholder[uid] += 1
                return None
            numeric = uid[0] in "+-.0123456789"
            if numeric and len(uid) > 15 and uid.isdigit():
                self.long_numeric_ids += 1
                if len(uid) - len(uid.rstrip("0")) >= len(uid) - 15:  # no digit beyond the 15th significant one
                    self.rounded_id_rows += 1
            if numeric and _SCIENTIFIC_ID.fullmatch(uid):
                raise RowError(
                    f"user id {uid!r} is a number in scientific notation: a spreadsheet rounded it, and users whose ids round "
                    "alike would merge into one; export the ids as text"
                )
            if numeric and _FLOAT_INT_ID.fullmatch(uid):
                raise RowError(
                    f"user id {uid!r} is an integer written as a float (pandas writes integer ids so when the column has "
                    f"missing values): {uid.split('.')[0]!r} and {uid!r} would be two users; write the ids as integers"
                )
            if self.user_id_case == "fold":
                uid = uid.casefold()
        if uid in self._first_seen[not is_int]:
            first = self._first_seen[not is_int][uid]
            at = "an earlier row" if first is None else f"line {first}" if isinstance(first, int) else first
            this, other = (f"{value} (an integer)", f'"{uid}" (a string)') if is_int else (f'"{uid}" (a string)', f"{uid} (an integer)")
            raise RowError(f"user id {this} prints the same as the user id {other} of {at}: they would merge into one user; give every user id one type")
        self._first_seen[is_int].setdefault(uid, where)
        return uid

    def _timestamp(self, row: Mapping) -> float | None:
        """The row's timestamp (:func:`parse_timestamp`), or None without a timestamp column; a number
        in the first year of the epoch is counted (a date written as a number, ``20210315``?)."""
        if self.timestamp_column is None:
            return None
        raw = self._get(row, self.timestamp_column)
        t = parse_timestamp(raw)
        if 0 <= t < _EPOCH_FIRST_YEAR and (isinstance(raw, (int, float)) or (isinstance(raw, str) and _NUMBER.fullmatch(raw.strip()))):
            self.timestamps_in_1970 += 1
        return t

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
        """The row's text; ``""`` (counted) for a deleted or removed post's placeholder or a
        missing-value marker (:data:`MISSING_TEXTS`)."""
        text = self._get(row, self.text_column)
        if not isinstance(text, str):
            raise RowError(f"column {self.text_column!r} must be a string, got {_type_name(text)}")
        text = _check_unicode(text, f"column {self.text_column!r}")
        if len(text) < 16 and (text.strip().casefold() in PLACEHOLDER_TEXTS or text.strip() in MISSING_TEXTS):
            self.placeholder_texts[text.strip()] += 1
            return ""
        return text

    def convert_all(self, row: Mapping, where: int | str | None = None) -> list[tuple[str, Example]]:
        """The row's examples: one (or none) for ``unit="row"``, its sentences for ``unit="sentence"``;
        ``where`` as in :meth:`convert`."""
        if self.unit == "row":
            out = self.convert(row, where)
            return [] if out is None else [out]
        uid = self.user_id(self._get(row, self.user_column), where)
        if uid is None:
            return []
        ts = self._timestamp(row)
        clean = normalize if self.normalize_text else (lambda s: " ".join(s.split()))
        texts = [t for t in map(clean, prose_sentences(self._text(row))) if t]
        if not texts:
            self.skipped_empty += 1
            return []
        self.split_rows += 1
        self.sentences += len(texts)
        self.unsegmented += sum(map(unsegmented, texts))
        return [(uid, TextExample(t, ts)) for t in texts]

    def convert(self, row: Mapping, where: int | str | None = None) -> tuple[str, Example] | None:
        """``where``: the row's line (an int) or ``"row N"``, to name the first row of a user id that clashes."""
        uid = self.user_id(self._get(row, self.user_column), where)
        if uid is None:
            return None
        ts = self._timestamp(row)
        if self.kind == "text":
            text = self._text(row)
            if self.normalize_text:
                text = normalize(text)
            if not text.strip():
                self.skipped_empty += 1
                return None
            self.unsegmented += unsegmented(text)
            return uid, TextExample(text, ts)
        tokens = self._str_list(row, self.tokens_column)  # type: ignore[arg-type]
        tags = self._str_list(row, self.tags_column)  # type: ignore[arg-type]
        if len(tokens) != len(tags):
            raise RowError(f"{len(tokens)} tokens but {len(tags)} tags")
        for col, items in ((self.tokens_column, tokens), (self.tags_column, tags)):
            blank = next((i for i, x in enumerate(items) if not x.strip()), None)
            if blank is not None:
                raise RowError(f"column {col!r}: item {blank + 1} is {'empty' if not items[blank] else 'only whitespace'} (tokens and tags must be non-empty)")
        bad = next((t for t in tags if not TAG.match(t)), None)
        if bad is not None:
            raise RowError(
                f"column {self.tags_column!r}: tag {bad[:30]!r} is not {TAG_HELP} (an entity type needs its scheme letter, "
                "B-PER rather than PER: the metrics would read it as O)"
            )
        if not tokens:
            self.skipped_empty += 1
            return None
        return uid, TaggedExample(tuple(tokens), tuple(tags), ts)


def note_skipped_rows(corpus: FederatedCorpus, conv: RowConverter) -> None:
    """Say how many rows gave no example (their text or token list was empty, or their user id a
    placeholder), and what was done to user ids (:func:`note_user_ids`)."""
    placeholders = sum(conv.placeholder_texts.values())
    if conv.skipped_empty > placeholders:
        note_skipped_empty(corpus, conv.skipped_empty - placeholders, "rows", conv.kind)
    if placeholders:
        which = ", ".join(f"{t!r} ({k:,})" for t, k in conv.placeholder_texts.most_common())
        corpus.note(
            f"{placeholders:,} rows of {corpus.name} hold a deleted or removed post's placeholder text or a missing-value marker "
            f"as their whole text and were skipped: {which}",
            skipped_placeholder_text=placeholders,
        )
    if conv.skipped_placeholder:
        n = sum(conv.skipped_placeholder.values())
        which = ", ".join(f"{u!r} ({k:,})" for u, k in conv.skipped_placeholder.most_common())
        corpus.note(
            f"{n:,} rows of {corpus.name} have a placeholder user id and were skipped: {which}; such an id stands for many "
            "people, not one user (placeholder_users='keep' keeps them, as one user)",
            skipped_placeholder=n,
        )
    if conv.timestamps_in_1970:
        corpus.note(
            f"{conv.timestamps_in_1970:,} rows of {corpus.name} have a numeric timestamp in 1970: fedpriv reads a number as "
            "seconds since 1970-01-01 UTC; a date written as a number (20210315, 2021) or a spreadsheet's day serial (44197) "
            "reads so: write such dates as ISO-8601 (2021-03-15)",
            timestamps_in_1970=conv.timestamps_in_1970,
        )
    if conv.rounded_id_rows * 2 > conv.long_numeric_ids:  # most long ids so (at random: 1 in 10 for 16 digits, 1 in 10^4 for 19)
        corpus.note(
            f"{conv.rounded_id_rows:,} of the {conv.long_numeric_ids:,} rows of {corpus.name} whose user id has 16 or more digits "
            "have nothing but zeros after the 15th: a "
            "spreadsheet keeps 15 significant digits, so ids it exported as numbers were probably rounded, and users whose ids "
            "round alike merged into one; export the ids as text",
            user_id_rows_maybe_rounded=conv.rounded_id_rows,
        )
    note_user_ids(corpus, conv)
    note_unsegmented(corpus, conv.unsegmented)


def note_unsegmented(corpus: FederatedCorpus, count: int) -> None:
    """Say once when more than a fifth of the corpus's examples (``count`` of them) are Chinese,
    Japanese, Thai, ... text without spaces between words (:func:`unsegmented`): the tokenizer
    would make every phrase between two punctuation marks one token."""
    total = corpus.num_examples
    if count and 5 * count > total:
        corpus.note(
            f"{count:,} of the {total:,} examples of {corpus.name} are Chinese, Japanese, Thai or other text written without "
            f"spaces between words (most of it in runs of {UNSEGMENTED_RUN} or more such characters): the tokenizer splits "
            "words at spaces and punctuation only, so each phrase became one token; segment such text into words first "
            "(e.g. jieba for Chinese, MeCab for Japanese, PyThaiNLP for Thai) and join the words by spaces",
            unsegmented_examples=count,
        )


def note_user_ids(corpus: FederatedCorpus, conv: RowConverter) -> None:
    """Say how many rows' ids were trimmed or put in NFC form, and how many ids differ only in
    letter case, or only in spacing, width or invisible characters (counts only: the ids themselves
    are the private users' names)."""
    if conv.normalized_ids:
        corpus.note(
            f"{conv.normalized_ids:,} rows of {corpus.name} have a user id with surrounding whitespace or in another Unicode "
            "form than NFC: trimmed and put in NFC, so ids that differ only so are one user",
            normalized_user_ids=conv.normalized_ids,
        )
    note_user_id_variants(corpus, (u for seen in conv._first_seen.values() for u in seen), conv.user_id_case == "keep")


def note_sentences(corpus: FederatedCorpus, conv: RowConverter) -> None:
    """Say once that examples are sentences (``unit="sentence"``), and how many rows gave how many."""
    if conv.unit == "sentence":
        corpus.note(
            f"examples are sentences (unit='sentence'): {conv.split_rows:,} rows of {corpus.name} split into {conv.sentences:,} "
            "sentences at . ! ? before a capital or a digit (not after e.g., i.e., et al., Fig. 3, ...) and at every "
            "full-width 。！？, "
            "hard line breaks joined, LaTeX kept as text",
            unit="sentence", split_rows=conv.split_rows, sentences=conv.sentences,
        )


# ---- readers: each yields (location, row mapping), raising DataFormatError for unreadable input ----


def decode_line(path: str | os.PathLike[str], n: int, raw: bytes) -> str:
    """Physical line ``n`` (1-based) of a text file, decoded strictly as UTF-8. A UTF-8 BOM that
    starts a line is dropped (line 1 of files Windows tools write; any line of files joined with
    ``cat``). Invalid UTF-8 and NUL bytes (a binary file, or UTF-16 text) are errors naming the line,
    and so is a file whose lines end in CR alone (it reads as one line holding carriage returns)."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        if n == 1 and raw.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise DataFormatError(
                path, n, "not valid UTF-8: the file starts with a UTF-16 byte-order mark (save it as UTF-8, e.g. iconv -f UTF-16 -t UTF-8 FILE > OUT)"
            ) from None
        raise DataFormatError(path, n, f"not valid UTF-8 ({e.reason} at byte {e.start} of the line): text in another encoding? {TO_UTF8}") from None
    nul = text.find("\x00")
    if nul >= 0:
        raise DataFormatError(path, n, f"NUL byte at column {nul + 1}: a binary file, or UTF-16 text? (fedpriv reads UTF-8 text)")
    if n == 1 and "\r" in text.rstrip("\r\n"):
        # the whole file is one line with carriage returns inside: its lines end in CR alone
        raise DataFormatError(path, n, "the file's lines end in a carriage return alone (classic Mac line ends): convert them with tr '\\r' '\\n'")
    return text


def decoded_lines(path: Path, f: Iterable[bytes]) -> Iterator[tuple[int, str]]:
    """``(1-based line number, text)`` for each physical line (see :func:`decode_line`)."""
    for n, raw in enumerate(f, start=1):
        yield n, decode_line(path, n, raw)


def compression_of(path: Path, head: bytes) -> str | None:
    """The stream compression a file's first bytes show (``"gzip"``, ``"bzip2"``, ``"xz"``), or None;
    a zstd or zip file is a :class:`SourceError` saying how to read it."""
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    if head[:3] == b"BZh" and head[3:4] in b"123456789" and head[4:10] in (b"1AY&SY", b"\x17rE8P\x90"):
        return "bzip2"
    for magic, name, how in _UNREAD_MAGIC:
        if head.startswith(magic):
            raise SourceError(f"{path}: {name}-compressed; fedpriv streams gzip, bzip2 and xz: {how}")
    return None


def _decompressed(path: Path, f, name: str) -> Iterator[bytes]:  # noqa: ANN001
    """The decompressed lines; a corrupt or truncated stream is an error naming the line it broke in."""
    n = 0
    while True:
        try:
            line = f.readline()
        except (OSError, EOFError, zlib.error, lzma.LZMAError) as e:
            raise DataFormatError(path, n + 1, f"the {name} data is corrupt or truncated ({_one_line(e)})") from None
        if not line:
            return
        n += 1
        yield line


_DECOMPRESSORS: dict[str, Callable] = {"gzip": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"), "bzip2": bz2.BZ2File, "xz": lzma.LZMAFile}


@contextmanager
def open_lines(path: Path) -> Iterator[Iterable[bytes]]:
    """The physical lines (bytes) of a text file, decompressed as they stream when the file starts
    with gzip, bzip2 or xz magic bytes (whatever its name)."""
    with open(path, "rb") as raw:
        name = compression_of(path, raw.read(10))
        raw.seek(0)
        if name is None:
            yield raw
            return
        with _DECOMPRESSORS[name](raw) as f:
            yield _decompressed(path, f, name)


def _json_hint(line: str, first: bool) -> str:
    """Why a JSON Lines line may not parse: a pretty-printed object, classic Mac line ends."""
    if first and line.strip() in ("{", "{}") or line.strip().endswith("{"):
        return " (an object spread over several lines? JSON Lines needs one object per line: jq -c . FILE)"
    if "\r" in line.rstrip("\r\n"):
        return " (the line holds a carriage return: classic Mac line ends? convert them with tr '\\r' '\\n')"
    return ""


def _duplicate_key(conv: RowConverter, line: str) -> str | None:
    """A key the columns read that appears twice in its object (the top-level object, or one on a
    dotted column's path): JSON would keep the last. The line is parsed again only when such a
    key's text appears twice in it, or when a key is not ASCII (it may be written escaped)."""
    if not conv._non_ascii_keys and not any(line.count(k) > 1 for k in conv._quoted_keys):
        return None
    dups: dict[int, set[str]] = {}

    def pairs(items: list[tuple[str, object]]) -> dict:
        obj = dict(items)
        if len(obj) < len(items):
            seen: set[str] = set()
            twice: set[str] = set()
            for k, _ in items:
                (twice if k in seen else seen).add(k)
            dups[id(obj)] = twice  # the objects stay alive inside top, so their ids stay theirs
        return obj

    top = json.loads(line, object_pairs_hook=pairs)
    for col in conv.columns:
        obj: object = top
        for part in col.split(".") if col not in top else [col]:
            if not isinstance(obj, dict):
                break
            if part in dups.get(id(obj), ()):
                return part if obj is top else col
            obj = obj.get(part)
    return None


def _jsonl_rows(path: Path, conv: RowConverter) -> Iterator[tuple[str, Example]]:
    with open_lines(path) as f:
        first = True
        for n, line in decoded_lines(path, f):
            if not line.strip():
                continue
            if first and line.lstrip().startswith("["):
                if line.lstrip()[1:].lstrip()[:1] not in ("", "{", "]"):  # an array of values, not of objects: a row without names
                    raise DataFormatError(
                        path, n, "each line is a JSON array, not an object: the loader reads objects with named fields "
                        '({"user_id": ..., "text": ...}); give the values names (e.g. jq -c \'{user_id: .[0], text: .[1]}\' FILE)'
                    )
                raise DataFormatError(path, n, "a JSON array is not supported: JSON Lines needs one object per line (convert it with jq -c '.[]' FILE)")
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as e:
                raise DataFormatError(path, n, f"invalid JSON: {e}{_json_hint(line, first)}") from None
            first = False
            if not isinstance(obj, dict):
                raise DataFormatError(path, n, f"expected a JSON object, got {_type_name(obj)}")
            dup = _duplicate_key(conv, line)
            if dup is not None:
                raise DataFormatError(path, n, f"the key {dup!r} appears twice in the object (JSON keeps the last): which value is meant?")
            try:
                out = conv.convert_all(obj, n)
            except RowError as e:
                raise DataFormatError(path, n, str(e)) from None
            yield from out


def _delimiter_hint(header: list[str], delimiter: str) -> str:
    """Why a header may lack the columns: its fields are separated by another character."""
    joined = delimiter.join(header)
    if delimiter != "\t" and "\t" in joined:
        return " (the header is tab-separated: pass format='tsv', or --format tsv)"
    for other, name in ((";", "semicolon"), ("|", "pipe")):
        if other in joined and len(header) <= 1:
            return (
                f" (the header is {name}-separated, as European spreadsheets export CSV: convert the file to commas, e.g. "
                f"python3 -c \"import csv,sys; w=csv.writer(sys.stdout); w.writerows(csv.reader(sys.stdin, delimiter='{other}'))\" < IN > OUT.csv)"
            )
    return ""


def _holds_a_row(field: str, width: int, delimiter: str = "\t", is_user: Callable[[str], bool] | None = None, user_at: int = 0) -> bool:
    """Whether a field holds, after a line break, a line that reads as a row of its own (a stray
    quote joined it). TSV: as many tab-separated fields as the header, the first not empty (code
    with tab indentation inside a quoted field is not). CSV, where prose has commas: as many
    fields as the header, and in the user column an id of a row read before (``is_user``)."""
    for line in field.splitlines()[1:]:
        if delimiter == "\t":
            cols = line.split("\t")
            if len(cols) == width and cols[0].strip():
                return True
            continue
        try:
            cols = next(csv.reader([line], delimiter=delimiter), [])
        except csv.Error:
            continue
        if len(cols) == width and is_user is not None and is_user(cols[user_at]):
            return True
    return False


class MultilineRecords:
    """CSV/TSV records that spanned several physical lines (quoted line breaks), for the notes."""

    def __init__(self) -> None:
        self.count = 0
        self.first_line: int | None = None
        #: CSV records with a line inside a quoted field that reads as a row of a user seen before
        self.row_like = 0
        self.first_row_like: int | None = None


def _csv_rows(path: Path, conv: RowConverter, delimiter: str, quoting: str = "csv", multiline: MultilineRecords | None = None) -> Iterator[tuple[str, Example]]:
    what = "TSV" if delimiter == "\t" else "CSV"
    multiline = multiline if multiline is not None else MultilineRecords()
    with open_lines(path) as f:
        lines = (text for _, text in decoded_lines(path, f))
        reader = csv.reader(lines, delimiter=delimiter, strict=True, quoting=csv.QUOTE_NONE if quoting == "none" else csv.QUOTE_MINIMAL)
        end = 0  # the last physical line of the last whole record read
        try:
            header = next(reader, None)
            if header is None:
                raise EmptyCorpusError(f"{path}: the file is empty (no header line)")
            missing = [c for c in conv.columns if c not in header]
            if missing:
                raise DataFormatError(path, reader.line_num, f"missing column(s) {missing} in the header {header}{_delimiter_hint(header, delimiter)}")
            dup = [c for c in conv.columns if header.count(c) > 1]
            if dup:
                raise DataFormatError(path, reader.line_num, f"column(s) {dup} appear more than once in the header")
            width = len(header)
            user_at = header.index(conv.user_column)
            end = reader.line_num
            for rec in reader:
                start, end = end + 1, reader.line_num
                if not rec:
                    continue
                if end > start:
                    multiline.count += 1
                    multiline.first_line = multiline.first_line or start
                    if any(_holds_a_row(v, width, delimiter, conv.seen_user, user_at) for v in rec):
                        if delimiter == "\t":
                            raise DataFormatError(
                                path, start, f"a quoted field starting on this line runs over {end - start} line break(s), and a line "
                                "inside it reads as a row of its own: a stray quote (\") joining other rows into this one? pass "
                                "quoting='none' if quotes are ordinary characters in this file"
                            )
                        # CSV: prose has commas, so a line may read as a row by chance ("bob, thanks"): said, not refused
                        multiline.row_like += 1
                        multiline.first_row_like = multiline.first_row_like or start
                if len(rec) != width:
                    raise DataFormatError(path, reader.line_num, f"{len(rec)} fields but the header has {width}")
                try:
                    out = conv.convert_all(dict(zip(header, rec)), reader.line_num)
                except RowError as e:
                    raise DataFormatError(path, reader.line_num, str(e)) from None
                yield from out
        except csv.Error as e:
            msg = str(e)
            if "new-line character seen in unquoted field" in msg:
                msg = "a carriage return inside a field: classic Mac line ends? convert them with tr '\\r' '\\n'"
            if "unexpected end of data" in msg:  # a quote opened after the last whole record never closed
                raise DataFormatError(
                    path, end + 1, f"malformed {what}: a quoted field that opens on this line is never closed (the file ends at line "
                    f"{reader.line_num}); pass quoting='none' if quotes are ordinary characters in this file"
                ) from None
            raise DataFormatError(path, reader.line_num, f"malformed {what}: {msg}") from None


def note_multiline(corpus: FederatedCorpus, multiline: MultilineRecords) -> None:
    """Say how many CSV/TSV records spanned several lines, and how many of them hold a line that
    reads as a row of a known user (CSV; a TSV refuses those): a stray quote joins rows this way."""
    if multiline.count:
        corpus.note(
            f"{multiline.count:,} records of {corpus.name} span several lines (quoted fields holding line breaks; the first "
            f"starts at line {multiline.first_line}): if a stray quote joined rows, pass quoting='none'",
            multiline_records=multiline.count,
        )
    if multiline.row_like:
        corpus.note(
            f"{multiline.row_like:,} of them hold a line that reads as a row of a user seen before (the first record starts at "
            f"line {multiline.first_row_like}): a stray quote joining other users' rows into one example, or a post quoting "
            "such a line? look there; quoting='none' reads quotes as ordinary characters",
            row_like_records=multiline.row_like,
        )


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
    dup = [c for c in conv.columns if names.count(c) > 1]
    if dup:
        raise DataFormatError(path, "schema", f"column(s) {dup} appear more than once in the schema {names}")
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
            raise SourceError(f"{path}: a compressed Parquet file is not read (Parquet compresses inside); decompress it first")
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
    quoting: str = "csv",
    placeholder_users: str = "skip",
    user_id_case: str = "keep",
    spill_to: str | os.PathLike[str] | None = None,
) -> FederatedCorpus:
    """A corpus from a table with one example per row, grouped by ``user_column``.

    ``format`` is ``"jsonl"`` (alias ``"json"``), ``"csv"``, ``"tsv"`` or ``"parquet"``; by default
    inferred from the suffix. Tagged mode when ``tokens_column`` and ``tags_column`` are given,
    text mode otherwise (see the module docstring for the column rules). ``unit`` is ``"row"``
    (one example per row) or ``"sentence"`` (each sentence of a row's text; see the module
    docstring). ``quoting`` (CSV/TSV): ``"csv"`` (standard quoting) or ``"none"`` (quotes are
    ordinary characters). ``placeholder_users``: ``"skip"`` rows whose user id is a placeholder
    (``[deleted]``, ``nan``, ...) or ``"keep"`` them as one user; ``user_id_case``: ``"keep"`` ids
    that differ only in letter case apart, or ``"fold"`` them into one user. Compressed
    JSONL/CSV/TSV (gzip, bzip2, xz) stream decompressed. With ``spill_to`` (a file
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
        placeholder_users=placeholder_users,
        user_id_case=user_id_case,
    )
    if quoting not in QUOTINGS:
        raise SourceError(f"quoting must be one of {', '.join(repr(q) for q in QUOTINGS)}, got {quoting!r}")
    if quoting != "csv" and fmt not in ("csv", "tsv"):
        raise SourceError(f"quoting={quoting!r} is for CSV and TSV files, not {fmt}")
    multiline = MultilineRecords()
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
        stream = _csv_rows(path, conv, "\t" if fmt == "tsv" else ",", quoting, multiline)
    try:
        corpus = FederatedCorpus.from_stream(stream, conv.kind, name=path.name, spill_to=spill_to)
        note_sentences(corpus, conv)
        note_skipped_rows(corpus, conv)
        note_multiline(corpus, multiline)
        return corpus
    except EmptyCorpusError as e:
        if str(path) in str(e):
            raise
        raise EmptyCorpusError(f"{path}: no examples (no rows, or every row's {'text' if conv.kind == 'text' else 'token list'} is empty)") from None
    finally:
        stream.close()
