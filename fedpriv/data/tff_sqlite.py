"""The TensorFlow Federated Stack Overflow SQLite file, read without TensorFlow.

TFF's ``tff.simulation.datasets.stackoverflow.load_data`` uses one SQLite file with two tables::

    examples(split_name TEXT NOT NULL, client_id TEXT NOT NULL, serialized_example_proto BLOB NOT NULL)
    client_metadata(client_id TEXT NOT NULL, split_name TEXT NOT NULL, num_examples INTEGER NOT NULL)

Splits are ``train``, ``heldout`` and ``test``. Each row is one serialized ``tf.train.Example``
with the bytes features ``tokens`` (space-separated, lowercased tokens), ``title``, ``tags``
('|'-separated), ``creation_date`` (UTC, e.g. ``'2010-01-08 09:34:05 UTC'`` or
``'2008-08-10 08:28:52.1 UTC'``), ``type`` ('question' or 'answer') and the int64 feature ``score``.

The protobuf wire format is decoded and encoded by hand below (only what ``tf.train.Example``
needs), so neither TensorFlow nor the ``protobuf`` package is required.

Opening a split never reads the examples' blobs, and makes Python objects per client, never per
row (TFF's file: 342,477 training clients, 135.8M rows): the split's distinct client ids
are enumerated in SQL (one index seek per client with TFF's ``(split_name, client_id)`` index,
one scan of the split without it), and what would lose rows silently is refused, naming the
file and the row or client: a NULL ``client_id``, one that is not text (an untyped column holding
``12`` and ``'12'`` read as two users of one name), a client with rows in ``examples`` that
``client_metadata`` does not list (when it lists the split), a client listed twice, a client
listed with 0 examples that has rows. A client listed with 0 examples and no rows is no user (it
has nothing to train on; a note counts them). A row whose
``tokens`` is empty is an empty example, as TFF reads it (``empty_tokens='error'`` refuses it
when its client is read: a client's count is known before its rows are read, so such a row
cannot be skipped there). A file locked by a writing process is said to be locked, not unreadable.
"""

from __future__ import annotations

import os
import re
import sqlite3
import struct
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Literal

import numpy as np

from fedpriv.data.corpus import FederatedCorpus
from fedpriv.data.examples import Example, TextExample
from fedpriv.data.stores import UserStore, user_sort_key
from fedpriv.errors import DataFormatError, EmptyCorpusError, FedprivError, SourceError

# ---- protobuf wire format for tf.train.Example ----------------------------------------------------
#
# Example{Features features=1}  Features{map<string, Feature> feature=1}
# Feature{oneof kind {BytesList bytes_list=1; FloatList float_list=2; Int64List int64_list=3}}
# BytesList{repeated bytes value=1}  FloatList{repeated float value=1 [packed]}
# Int64List{repeated int64 value=1 [packed]}
#
# A decoded feature is ``(kind, values)`` with kind "bytes", "float" or "int64" (``None`` for a
# Feature with no kind set).

Feature = tuple[str | None, list]

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_KIND_FIELD = {"bytes": 1, "float": 2, "int64": 3}
_FIELD_KIND = {v: k for k, v in _KIND_FIELD.items()}


class _Corrupt(Exception):
    """Internal: the bytes are not a valid message (turned into DataFormatError by the caller)."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Read an unsigned varint (at most 10 bytes, value kept to 64 bits); return (value, new pos)."""
    value = shift = 0
    for i in range(pos, min(pos + 10, len(buf))):
        b = buf[i]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value & 0xFFFFFFFFFFFFFFFF, i + 1
        shift += 7
    if len(buf) - pos >= 10:
        raise _Corrupt(f"varint longer than 10 bytes at byte {pos}")
    raise _Corrupt(f"truncated varint at byte {pos}")


def _fields(buf: bytes):
    """Yield ``(field_number, wire_type, value)`` for each field; LEN values are bytes, others ints."""
    pos, end = 0, len(buf)
    while pos < end:
        start = pos
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if not 0 < number < 1 << 29:
            raise _Corrupt(f"invalid field number {number} at byte {start}")
        if wire == _VARINT:
            value, pos = _varint(buf, pos)
        elif wire in (_I64, _I32):
            size = 8 if wire == _I64 else 4
            if pos + size > end:
                raise _Corrupt(f"truncated fixed-width field at byte {start}")
            value, pos = int.from_bytes(buf[pos : pos + size], "little"), pos + size
        elif wire == _LEN:
            size, pos = _varint(buf, pos)
            if pos + size > end:
                raise _Corrupt(f"length {size} at byte {start} runs past the end ({end} bytes)")
            value, pos = buf[pos : pos + size], pos + size
        else:
            raise _Corrupt(f"unsupported wire type {wire} at byte {start}")
        yield number, wire, value


def _decode_values(kind: str, buf: bytes) -> list:
    out: list = []
    for number, wire, value in _fields(buf):
        if number != 1:
            continue
        if kind == "bytes" and wire == _LEN:
            out.append(value)
        elif kind == "float" and wire == _LEN:  # packed
            if len(value) % 4:
                raise _Corrupt(f"packed floats of {len(value)} bytes (not a multiple of 4)")
            out.extend(x for (x,) in struct.iter_unpack("<f", value))
        elif kind == "float" and wire == _I32:
            out.append(struct.unpack("<f", value.to_bytes(4, "little"))[0])
        elif kind == "int64" and wire == _VARINT:
            out.append(_int64(value))
        elif kind == "int64" and wire == _LEN:  # packed
            pos = 0
            while pos < len(value):
                v, pos = _varint(value, pos)
                out.append(_int64(v))
    return out


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _decode_feature(buf: bytes) -> Feature:
    kind, values = None, []
    for number, wire, value in _fields(buf):
        if number in _FIELD_KIND and wire == _LEN:
            new = _FIELD_KIND[number]
            # oneof: a different member replaces; the same member merges (repeated fields append)
            values = (values if new == kind else []) + _decode_values(new, value)
            kind = new
    return kind, values


def decode_example(
    data: bytes, path: str | os.PathLike[str] = "<bytes>", where: int | str | None = None
) -> dict[str, Feature]:
    """Parse a serialized ``tf.train.Example`` into ``{name: (kind, values)}``.

    As protobuf does: unknown fields (or known ones with an unexpected wire type) are skipped,
    a repeated map key keeps its last value, repeated message occurrences merge.
    Raises :class:`DataFormatError` (naming ``path`` and ``where``) on truncated or corrupt bytes.
    """
    try:
        features: dict[str, Feature] = {}
        for number, wire, value in _fields(data):
            if number != 1 or wire != _LEN:
                continue
            for n2, w2, entry in _fields(value):
                if n2 != 1 or w2 != _LEN:
                    continue
                name, feat = "", b""
                for n3, w3, v3 in _fields(entry):
                    if n3 == 1 and w3 == _LEN:  # string key: the last counts, each must be UTF-8
                        try:
                            name = v3.decode("utf-8")
                        except UnicodeDecodeError:
                            raise _Corrupt("feature name is not valid UTF-8") from None
                    elif n3 == 2 and w3 == _LEN:  # message value: occurrences merge = concatenate
                        feat += v3
                features[name] = _decode_feature(feat)
        return features
    except _Corrupt as e:
        raise DataFormatError(path, where, f"corrupt tf.train.Example: {e}") from None


def _uvarint(n: int) -> bytes:
    n &= 0xFFFFFFFFFFFFFFFF  # negative int64 -> two's complement, 10 bytes
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _uvarint(number << 3 | _LEN) + _uvarint(len(payload)) + payload


def _as_feature(value) -> Feature:
    """Accept ``(kind, values)``, or a scalar / non-empty list whose kind is inferred from its type."""
    if isinstance(value, tuple) and len(value) == 2 and (value[0] is None or value[0] in _KIND_FIELD):
        return value[0], list(value[1])
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values:
        raise FedprivError("cannot infer the kind of an empty feature list; pass (kind, [])")
    if all(isinstance(v, (bytes, str)) for v in values):
        return "bytes", values
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        return "int64", values
    if all(isinstance(v, (float, int, np.floating, np.integer)) for v in values):
        return "float", values
    raise FedprivError(f"cannot encode feature values {values[:3]!r}: expected bytes/str, int or float")


def encode_example(features: Mapping[str, object]) -> bytes:
    """Serialize ``{name: feature}`` as a ``tf.train.Example``: map entries in bytewise key order,
    numeric lists packed, floats as float32 (protobuf's deterministic serialization; upb's differs
    only in putting a key after its extensions, "ab" before "a", with the same entry bytes)."""
    entries = []
    for name in sorted(features, key=lambda k: k.encode("utf-8")):
        kind, values = _as_feature(features[name])
        if kind is None:
            feat = b""
        elif kind == "bytes":
            body = b"".join(_len_field(1, v.encode("utf-8") if isinstance(v, str) else bytes(v)) for v in values)
            feat = _len_field(_KIND_FIELD[kind], body)
        else:
            if kind == "float":
                try:
                    packed = struct.pack(f"<{len(values)}f", *values)
                except (OverflowError, struct.error) as e:
                    raise FedprivError(f"float feature {name!r}: {e}") from None
            else:
                for v in values:
                    if not -(1 << 63) <= int(v) < 1 << 63:
                        raise FedprivError(f"int64 feature {name!r} value out of range: {v}")
                packed = b"".join(_uvarint(int(v)) for v in values)
            feat = _len_field(_KIND_FIELD[kind], _len_field(1, packed) if packed else b"")
        entries.append(_len_field(1, _len_field(1, name.encode("utf-8")) + _len_field(2, feat)))
    return _len_field(1, b"".join(entries)) if entries else b""


# ---- creation_date ----------------------------------------------------------------------------------

_DATE = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)(?:[ T](\d\d):(\d\d)(?::(\d\d)(\.\d+)?)?)?"
    r"\s*(UTC|GMT|Z|[+-]\d\d:?\d\d)?"
)


def parse_creation_date(text: str) -> float | None:
    """Epoch seconds (UTC) of a TFF ``creation_date`` such as ``'2010-01-08 09:34:05 UTC'``,
    ``'2008-08-10 08:28:52.1 UTC'`` or ISO-8601 with an offset; no zone means UTC.
    ``None`` for an empty string; ``ValueError`` when the text is not a date."""
    text = text.strip()
    if not text:
        return None
    m = _DATE.fullmatch(text)
    if m is None:
        raise ValueError(f"not a date: {text!r}")
    y, mo, d, h, mi, s, frac, zone = m.groups()
    tz = timezone.utc
    if zone and zone[0] in "+-":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        tz = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
    t = datetime(int(y), int(mo), int(d), int(h or 0), int(mi or 0), int(s or 0), tzinfo=tz)
    return t.timestamp() + (float(frac) if frac else 0.0)


def format_creation_date(t: float | str | datetime) -> str:
    """TFF's text form ``'YYYY-MM-DD HH:MM:SS[.f] UTC'`` of epoch seconds or a datetime (naive means
    UTC); a string is returned unchanged."""
    if isinstance(t, str):
        return t
    if isinstance(t, datetime):
        t = (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()
    whole, micros = divmod(round(t * 1_000_000), 1_000_000)
    text = datetime.fromtimestamp(whole, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    frac = f".{micros:06d}".rstrip("0") if micros else ""
    return f"{text}{frac} UTC"


# ---- the store --------------------------------------------------------------------------------------

FIELDS = ("tokens", "title")
EMPTY_TOKENS = ("error", "keep")
_EXAMPLE_COLUMNS = {"split_name", "client_id", "serialized_example_proto"}
_METADATA_COLUMNS = {"client_id", "split_name", "num_examples"}
#: How long opening or reading waits for another process's write lock, in seconds (sqlite3's default).
BUSY_TIMEOUT_S = 5.0
#: The split's distinct client ids in SQLite's order, one index seek each (a loose index scan); used
#: only where the plan of one step is a seek in an index on ``(split_name, client_id)``.
_NEXT_CLIENT = "SELECT client_id FROM examples WHERE split_name=?1 AND client_id > ?2 ORDER BY client_id LIMIT 1"
_CLIENTS_BY_INDEX = """
WITH RECURSIVE ids(id) AS (
    SELECT (SELECT client_id FROM examples WHERE split_name=?1 AND client_id IS NOT NULL ORDER BY client_id LIMIT 1)
    UNION ALL
    SELECT (SELECT client_id FROM examples WHERE split_name=?1 AND client_id > ids.id ORDER BY client_id LIMIT 1)
    FROM ids WHERE ids.id IS NOT NULL)
SELECT id FROM ids WHERE id IS NOT NULL
"""


def _locked(e: sqlite3.Error) -> bool:
    """Whether SQLite gave up waiting for another connection's lock (SQLITE_BUSY / SQLITE_LOCKED)."""
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "is locked" in str(e)


def _show(client_id: str) -> str:
    """A client id as a message shows it: as it is, or quoted when it has spaces or control characters."""
    return client_id if client_id.isprintable() and client_id and " " not in client_id else repr(client_id)


def _sql_type(value: object) -> str:
    return {type(None): "NULL", int: "an integer", float: "a real number", bytes: "a BLOB"}.get(type(value), type(value).__name__)


class TffSqliteStore(UserStore):
    """One split of a TFF SQLite file; a client's rows are read and decoded only when asked.

    Users are the split's clients (from ``client_metadata`` when it lists the split, else from
    ``examples``), in :func:`user_sort_key` order. Opening refuses a NULL or non-text ``client_id``
    in the split's rows, and, when ``client_metadata`` lists the split, a client of the rows that it
    does not list or lists twice (see the module docstring); a client whose rows differ in number
    from its ``client_metadata`` count is an error when its examples are read. Each row becomes a
    :class:`TextExample` whose text is the ``field`` feature ("tokens" or "title") with whitespace
    collapsed to single spaces and whose timestamp is ``creation_date`` in epoch seconds (``None``
    when absent or empty). An empty ``tokens`` is an empty example, as TFF reads it, unless
    ``empty_tokens='error'`` (then an error when read; an empty ``title``, an answer's, is always an
    empty example).
    """

    kind = "text"

    def __init__(
        self, path: str | os.PathLike[str], split: str = "train", field: str = "tokens", empty_tokens: str = "keep"
    ):
        if field not in FIELDS:
            raise FedprivError(f"field must be one of {FIELDS}, got {field!r}")
        if empty_tokens not in EMPTY_TOKENS:
            raise FedprivError(f"empty_tokens must be one of {EMPTY_TOKENS}, got {empty_tokens!r}")
        self.path = Path(path)
        self.split = split
        self.field = field
        self.empty_tokens = empty_tokens
        if not self.path.is_file():
            raise SourceError(f"{self.path}: no such file")
        uri = self.path.resolve().as_uri() + "?mode=ro"
        self._con = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=BUSY_TIMEOUT_S)
        self._counts: np.ndarray | None = None
        try:
            self._open()
        except sqlite3.DatabaseError as e:
            self._con.close()
            if _locked(e):
                raise self._locked_error(e) from None
            raise DataFormatError(self.path, None, f"not a readable SQLite file ({e})") from None
        except UnicodeDecodeError as e:  # a TEXT value (a table name, a client id) that is not UTF-8
            self._con.close()
            raise DataFormatError(self.path, None, f"not a readable SQLite file (a text value is not valid UTF-8: {e.reason})") from None
        except BaseException:
            self._con.close()
            raise

    def _locked_error(self, e: sqlite3.Error) -> SourceError:
        return SourceError(
            f"{self.path}: the file is locked by another process that is writing to it ({e}, after waiting {BUSY_TIMEOUT_S:g} s); "
            "read it once that process is done, or read a copy"
        )

    def _columns(self, table: str) -> set[str]:
        return {r[1] for r in self._con.execute(f"PRAGMA table_info({table})")}

    def _open(self) -> None:
        tables = {r[0] for r in self._con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "examples" not in tables:
            raise DataFormatError(self.path, None, "not a TFF SQLite file: no 'examples' table")
        missing = _EXAMPLE_COLUMNS - self._columns("examples")
        if missing:
            raise DataFormatError(self.path, None, f"table 'examples' lacks columns {sorted(missing)}")
        self._has_meta = "client_metadata" in tables
        if self._has_meta:
            missing = _METADATA_COLUMNS - self._columns("client_metadata")
            if missing:
                raise DataFormatError(self.path, None, f"table 'client_metadata' lacks columns {sorted(missing)}")
        meta = (
            self._con.execute(
                "SELECT client_id, num_examples FROM client_metadata WHERE split_name=?", (self.split,)
            ).fetchall()
            if self._has_meta
            else []
        )
        bad = next(((c, n) for c, n in meta if isinstance(n, bool) or not isinstance(n, int) or n < 0), None)
        if bad is not None:
            raise DataFormatError(self.path, f"client_metadata, client {bad[0]}", f"num_examples {bad[1]!r} is not a count")
        if meta:
            listed: dict[str, int] = {}
            for c, n in meta:
                if not isinstance(c, str):
                    raise DataFormatError(
                        self.path, "client_metadata", f"a client_id of split {self.split!r} is {_sql_type(c)} ({c!r}), not text: TFF client ids are TEXT"
                    )
                if c in listed:
                    raise DataFormatError(self.path, f"client_metadata, client {_show(c)}", f"the client is listed twice for split {self.split!r}")
                listed[c] = int(n)
            self._meta_counts: dict[str, int] | None = listed
            for c in self._clients():  # every client of the split's rows is listed: none is dropped unseen
                if c not in listed:
                    raise DataFormatError(
                        self.path,
                        f"client {_show(c)}",
                        f"table 'examples' holds rows of this client in split {self.split!r}, but client_metadata does not list it "
                        f"(it lists {len(listed):,} client{'' if len(listed) == 1 else 's'} of the split); the file is incomplete: add the client to client_metadata, "
                        "or drop that table to read the clients from 'examples'",
                    )
            ids = [c for c, n in listed.items() if n > 0]  # a client with no example is no user: nothing to train on
            for c in (c for c, n in listed.items() if n == 0):  # unless its rows say otherwise: never dropped unseen
                if self._con.execute("SELECT 1 FROM examples WHERE split_name=? AND client_id=? LIMIT 1", (self.split, c)).fetchone():
                    raise DataFormatError(
                        self.path, f"client_metadata, client {_show(c)}", f"num_examples is 0 but table 'examples' holds rows of this client in split {self.split!r}"
                    )
            #: clients that client_metadata lists with 0 examples of the split (said in a note)
            self.empty_clients = len(listed) - len(ids)
            if not ids and listed:
                raise EmptyCorpusError(f"{self.path}: client_metadata lists {len(listed):,} clients of split {self.split!r}, each with 0 examples")
        else:
            self._meta_counts = None
            self.empty_clients = 0
            ids = list(self._clients())
        if not ids:
            raise FedprivError(f"{self.path}: no split {self.split!r}; the file has splits {self.splits()}")
        self._ids = tuple(sorted(ids, key=user_sort_key))
        self._id_set = frozenset(self._ids)

    def _clients(self) -> Iterator[str]:
        """The split's distinct client ids from table ``examples``, streamed (one seek per client with
        an index on ``(split_name, client_id)``, else one scan); a NULL or non-text id is an error
        naming its first row."""
        plan = [r[3] for r in self._con.execute(f"EXPLAIN QUERY PLAN {_NEXT_CLIENT}", (self.split, ""))]
        by_index = any(re.search(r"\bINDEX\b.*\(split_name=\? AND client_id>\?\)", d) for d in plan) and not any("TEMP B-TREE" in d for d in plan)
        if by_index:
            null = self._con.execute("SELECT 1 FROM examples WHERE split_name=? AND client_id IS NULL LIMIT 1", (self.split,)).fetchone()
            if null is not None:
                self._bad_client(None)
            rows = self._con.execute(_CLIENTS_BY_INDEX, (self.split,))
        else:
            rows = self._con.execute("SELECT DISTINCT client_id FROM examples WHERE split_name=?", (self.split,))
        for (c,) in rows:
            if not isinstance(c, str):
                self._bad_client(c)
            yield c

    def _bad_client(self, value: object) -> None:
        row = self._con.execute(
            "SELECT rowid FROM examples WHERE split_name=? AND client_id IS ? ORDER BY rowid LIMIT 1", (self.split, value)
        ).fetchone()
        where = f"row {row[0]}" if row is not None else f"split {self.split}"
        if value is None:
            raise DataFormatError(self.path, where, "client_id is NULL: the row belongs to no client")
        raise DataFormatError(
            self.path,
            where,
            f"client_id {value!r} is {_sql_type(value)}, not text: TFF client ids are TEXT, and an id stored as a number "
            "and one stored as text that read the same (12 and '12') would be two clients of one name",
        )

    def splits(self) -> list[str]:
        """The split names in the file (from ``client_metadata`` when it has any, else ``examples``)."""
        table = "client_metadata" if self._has_meta else "examples"
        names = [r[0] for r in self._con.execute(f"SELECT DISTINCT split_name FROM {table}")]
        if not names and self._has_meta:
            names = [r[0] for r in self._con.execute("SELECT DISTINCT split_name FROM examples")]
        return sorted(str(n) for n in names)

    def user_ids(self) -> Sequence[str]:
        return self._ids

    def counts(self) -> np.ndarray:
        """Examples per user, from ``client_metadata`` when it covers the split (trusted as written),
        else one ``GROUP BY`` over the split's rows."""
        if self._counts is None:
            got = self._meta_counts
            if got is None:
                try:
                    got = dict(
                        self._con.execute(
                            "SELECT client_id, COUNT(*) FROM examples WHERE split_name=? GROUP BY client_id", (self.split,)
                        )
                    )
                except sqlite3.DatabaseError as e:
                    if _locked(e):
                        raise self._locked_error(e) from None
                    raise DataFormatError(self.path, "table examples", f"cannot count the rows ({e})") from None
                except UnicodeDecodeError as e:
                    raise DataFormatError(self.path, "table examples", f"cannot count the rows ({e})") from None
            self._counts = np.array([got.get(u, 0) for u in self._ids], dtype=np.int64)
        return self._counts

    def examples(self, user_id: str) -> list[Example]:
        if user_id not in self._id_set:
            raise KeyError(user_id)
        try:
            rows = self._con.execute(
                "SELECT rowid, serialized_example_proto FROM examples WHERE split_name=? AND client_id=? ORDER BY rowid",
                (self.split, user_id),
            ).fetchall()
        except sqlite3.DatabaseError as e:
            if _locked(e):
                raise self._locked_error(e) from None
            raise DataFormatError(self.path, f"client {user_id}", f"cannot read rows ({e})") from None
        listed = None if self._meta_counts is None else self._meta_counts.get(user_id)
        if listed is not None and listed != len(rows):  # the counts were trusted: say when they lied
            raise DataFormatError(self.path, f"client {user_id}", f"client_metadata gives {listed} examples but table 'examples' holds {len(rows)}")
        return [self._example(user_id, rowid, blob) for rowid, blob in rows]

    def _example(self, user_id: str, rowid: int, blob: object) -> TextExample:
        where = f"client {user_id}, row {rowid}"
        if not isinstance(blob, bytes):
            raise DataFormatError(self.path, where, f"serialized_example_proto is {type(blob).__name__}, not a BLOB")
        feats = decode_example(blob, self.path, where)

        def text_of(name: str, required: bool) -> str | None:
            if name not in feats:
                if required:
                    raise DataFormatError(self.path, where, f"no feature {name!r}")
                return None
            kind, values = feats[name]
            if kind != "bytes" or len(values) != 1:
                raise DataFormatError(self.path, where, f"feature {name!r} is not a single bytes value")
            try:
                value = values[0].decode("utf-8")
            except UnicodeDecodeError:
                raise DataFormatError(self.path, where, f"feature {name!r} is not valid UTF-8") from None
            if "\x00" in value:
                raise DataFormatError(self.path, where, f"feature {name!r} holds a NUL byte")
            return value

        text = " ".join(text_of(self.field, True).split())
        if not text and self.field == "tokens" and self.empty_tokens == "error":
            raise DataFormatError(
                self.path,
                where,
                "feature 'tokens' is empty: the row has no word to train on, and cannot be skipped here (a client's count is known "
                "before its rows are read); delete the row (and lower the client's client_metadata count), "
                "or leave empty_tokens at 'keep' to read it as an empty example, as TFF does",
            )
        date = text_of("creation_date", False)
        try:
            stamp = parse_creation_date(date) if date is not None else None
        except ValueError as e:
            raise DataFormatError(self.path, where, f"creation_date: {e}") from None
        return TextExample(text, stamp)

    def close(self) -> None:
        self._con.close()


def load_tff_sqlite(
    path: str | os.PathLike[str], split: str = "train", field: str = "tokens", empty_tokens: Literal["error", "keep"] = "keep"
) -> FederatedCorpus:
    """A lazy corpus over one split (``train``, ``heldout`` or ``test``) of TFF's Stack Overflow file
    (see :class:`TffSqliteStore` for what is refused; ``empty_tokens='error'`` refuses a row whose
    ``tokens`` is empty instead of reading it as an empty example, as TFF does)."""
    store = TffSqliteStore(path, split, field, empty_tokens)
    corpus = FederatedCorpus(store, name=f"stackoverflow-tff:{split}")
    if store.empty_clients:
        corpus.note(
            f"{store.empty_clients:,} clients of split {split!r} are listed in client_metadata with 0 examples and are not users "
            "(nothing to train on; a user-level N counts only clients with data)",
            empty_clients=store.empty_clients,
        )
    return corpus


# ---- writer -----------------------------------------------------------------------------------------

_SCHEMA = """
CREATE TABLE examples (
    split_name TEXT NOT NULL,
    client_id TEXT NOT NULL,
    serialized_example_proto BLOB NOT NULL);
CREATE INDEX idx_examples_client_id ON examples (client_id);
CREATE INDEX idx_examples_client_id_split ON examples (split_name, client_id);
CREATE TABLE client_metadata (
    client_id TEXT NOT NULL,
    split_name TEXT NOT NULL,
    num_examples INTEGER NOT NULL);
CREATE INDEX idx_metadata_client_id ON client_metadata (client_id);
"""

_DEFAULTS = {"title": "", "tags": "", "creation_date": "", "score": 0, "type": "answer"}


def _record_features(rec: Mapping) -> dict[str, Feature]:
    unknown = set(rec) - {"tokens", *_DEFAULTS}
    if unknown:
        raise FedprivError(f"unknown Stack Overflow example keys {sorted(unknown)}")
    if "tokens" not in rec:
        raise FedprivError("a Stack Overflow example needs 'tokens'")
    r = {**_DEFAULTS, **rec}
    tags = r["tags"] if isinstance(r["tags"], str) else "|".join(r["tags"])
    date = r["creation_date"]
    return {
        "creation_date": ("bytes", [format_creation_date(date) if date not in ("", None) else ""]),
        "score": ("int64", [int(r["score"])]),
        "tags": ("bytes", [tags]),
        "title": ("bytes", [r["title"]]),
        "tokens": ("bytes", [r["tokens"]]),
        "type": ("bytes", [r["type"]]),
    }


def write_tff_sqlite(
    path: str | os.PathLike[str],
    clients: Mapping[str, Sequence[Mapping]],
    split: str = "train",
    *,
    splits: Mapping[str, Mapping[str, Sequence[Mapping]]] | None = None,
) -> Path:
    """Write a file in TFF's exact schema (both tables and TFF's indexes).

    ``clients`` maps client id -> examples of ``split``; ``splits`` adds more ``{split: clients}``.
    An example is a dict with ``tokens`` (required) and optional ``title``, ``tags`` (str or list,
    joined with '|'), ``creation_date`` (TFF text, epoch seconds or datetime), ``score`` (int) and
    ``type`` (default 'answer'). Rows keep the given order; clients with no example are left out.
    Written to ``<path>.partial`` and renamed, so a failed write leaves no file behind.
    """
    everything = {split: clients, **(splits or {})}
    if splits and split in splits:
        raise FedprivError(f"split {split!r} given twice")
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    tmp.unlink(missing_ok=True)
    con = sqlite3.connect(str(tmp))
    try:
        con.executescript(_SCHEMA)
        for split_name, users in everything.items():
            for client_id, records in users.items():
                if not records:
                    continue
                con.executemany(
                    "INSERT INTO examples VALUES (?, ?, ?)",
                    [(split_name, str(client_id), encode_example(_record_features(r))) for r in records],
                )
                con.execute("INSERT INTO client_metadata VALUES (?, ?, ?)", (str(client_id), split_name, len(records)))
        con.commit()
    except BaseException:
        con.close()
        tmp.unlink(missing_ok=True)
        raise
    con.close()
    os.replace(tmp, path)
    return path
