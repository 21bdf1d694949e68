"""load_table: JSONL/CSV/TSV/Parquet agree, tagged mode, timestamps, errors with file and line, spill."""

from __future__ import annotations

import csv
import io
import json
import string
from datetime import datetime, timezone
from itertools import islice
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fedpriv.data.conll import iter_sentences
from fedpriv.data.corpus import FederatedCorpus
from fedpriv.data.examples import TaggedExample, TextExample
from fedpriv.data.stores import PackedStore, SqliteStore
from fedpriv.data.tabular import load_table
from fedpriv.data.tokenize import normalize
from fedpriv.errors import DataFormatError, EmptyCorpusError, FedprivError, SourceError

USERS = ["10", "2", "alice", "2", "10", "10", "bob", "2", "alice", "1"]


def ncbi_sentences(path: Path, n: int) -> list[tuple[list[str], list[str]]]:
    """The first ``n`` sentences of the NCBI-disease IOB file: (tokens, tags)."""
    return [(list(s.tokens), list(s.tags)) for _, s in islice(iter_sentences(path), n)]


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    """Real sentences spread over users, with epoch-second timestamps."""
    sents = ncbi_sentences(Path(__file__).resolve().parent / "ncbi-disease" / "train.tsv", len(USERS))
    return [
        {"user_id": u, "text": " ".join(toks), "tokens": toks, "tags": tags, "ts": 1_600_000_000 + 3600 * i}
        for i, (u, (toks, tags)) in enumerate(zip(USERS, sents))
    ]


def write_jsonl(path: Path, rows: list[dict], numeric_ids: bool = True) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            r = dict(r)
            if numeric_ids and r["user_id"].isdigit():
                r["user_id"] = int(r["user_id"])  # JSON ints become the same str ids as CSV strings
            f.write(json.dumps(r) + "\n")
    return path


def write_csv(path: Path, rows: list[dict], delimiter: str = ",") -> Path:
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, delimiter=delimiter)
        w.writerow(["user_id", "text", "tokens", "tags", "ts"])
        for r in rows:
            w.writerow([r["user_id"], r["text"], " ".join(r["tokens"]), " ".join(r["tags"]), r["ts"]])
    return path


def write_parquet(path: Path, rows: list[dict], row_group_size: int | None = None) -> Path:
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def snapshot(c: FederatedCorpus) -> tuple:
    return c.kind, [(u, exs) for u, exs in c.users()]


def all_formats(tmp_path: Path, rows: list[dict]) -> list[Path]:
    return [
        write_jsonl(tmp_path / "t.jsonl", rows),
        write_csv(tmp_path / "t.csv", rows),
        write_csv(tmp_path / "t.tsv", rows, delimiter="\t"),
        write_parquet(tmp_path / "t.parquet", rows),
    ]


def test_all_formats_give_the_same_text_corpus(tmp_path, rows):
    corpora = [load_table(p, timestamp_column="ts") for p in all_formats(tmp_path, rows)]
    first = snapshot(corpora[0])
    for c in corpora[1:]:
        assert snapshot(c) == first
    c = corpora[0]
    assert c.kind == "text"
    assert list(c.user_ids) == ["1", "2", "10", "alice", "bob"]
    assert c.counts().tolist() == [1, 3, 3, 2, 1]
    # a user's examples in source order, normalized, timestamps as floats
    want = [TextExample(normalize(r["text"]), float(r["ts"])) for r in rows if r["user_id"] == "10"]
    assert c.examples("10") == want
    assert c.name == "t.jsonl"
    assert isinstance(c.store, PackedStore)


def test_all_formats_give_the_same_tagged_corpus(tmp_path, rows):
    corpora = [load_table(p, tokens_column="tokens", tags_column="tags") for p in all_formats(tmp_path, rows)]
    first = snapshot(corpora[0])
    for c in corpora[1:]:
        assert snapshot(c) == first
    c = corpora[0]
    assert c.kind == "tagged"
    r = rows[6]  # the only row of "bob"
    assert c.examples("bob") == [TaggedExample(tuple(r["tokens"]), tuple(r["tags"]), None)]
    assert any("B-Disease" in ex.tags for ex in c.records())


def test_normalize_text_false_keeps_text_verbatim(tmp_path):
    p = write_jsonl(tmp_path / "v.jsonl", [{"user_id": "u", "text": "Keep It, As Is"}])
    assert load_table(p, normalize_text=False).examples("u") == [TextExample("Keep It, As Is")]
    assert load_table(p).examples("u") == [TextExample("keep it , as is")]


def test_custom_column_names_and_format_override(tmp_path):
    p = tmp_path / "data.txt"
    p.write_text(json.dumps({"who": 7, "body": "Hello there"}) + "\n", encoding="utf-8")
    c = load_table(p, format="jsonl", user_column="who", text_column="body")
    assert list(c.user_ids) == ["7"]
    with pytest.raises(SourceError, match="suffix"):
        load_table(p)
    with pytest.raises(SourceError, match="unsupported"):
        load_table(p, format="xml")


@pytest.mark.parametrize(
    "value, want",
    [
        (1_700_000_000, 1_700_000_000.0),
        (1.5, 1.5),
        ("1700000000", 1_700_000_000.0),
        ("2024-03-01T12:00:00Z", datetime(2024, 3, 1, 12, tzinfo=timezone.utc).timestamp()),
        ("2024-03-01T14:00:00+02:00", datetime(2024, 3, 1, 12, tzinfo=timezone.utc).timestamp()),
        ("2024-03-01T12:00:00", datetime(2024, 3, 1, 12, tzinfo=timezone.utc).timestamp()),  # naive = UTC
        ("2024-03-01", datetime(2024, 3, 1, tzinfo=timezone.utc).timestamp()),
    ],
)
def test_timestamps_number_or_iso(tmp_path, value, want):
    p = write_jsonl(tmp_path / "t.jsonl", [{"user_id": "u", "text": "a b", "ts": value}])
    assert load_table(p, timestamp_column="ts").examples("u")[0].timestamp == want
    q = tmp_path / "t.csv"
    q.write_text(f"user_id,text,ts\nu,a b,{value}\n", encoding="utf-8")
    assert load_table(q, timestamp_column="ts").examples("u")[0].timestamp == want


def test_parquet_timestamp_column_type(tmp_path):
    t = datetime(2024, 3, 1, 12, tzinfo=timezone.utc)
    table = pa.table({"user_id": ["u", "u"], "text": ["a", "b"], "ts": pa.array([t, t.replace(tzinfo=None)], pa.timestamp("s"))})
    pq.write_table(table, tmp_path / "t.parquet")
    c = load_table(tmp_path / "t.parquet", timestamp_column="ts")
    assert [e.timestamp for e in c.examples("u")] == [t.timestamp()] * 2


def test_empty_examples_skipped_and_blank_jsonl_lines_ignored(tmp_path):
    p = tmp_path / "e.jsonl"
    p.write_text('{"user_id": "a", "text": "  "}\n\n   \n{"user_id": "b", "text": "x"}\n', encoding="utf-8")
    c = load_table(p)
    assert list(c.user_ids) == ["b"]
    assert c.info["skipped_empty"] == 1 and c.notes == ["1 rows of e.jsonl have an empty text and were skipped"]


def test_empty_result_names_the_file(tmp_path):
    p = tmp_path / "e.jsonl"
    p.write_text('{"user_id": "a", "text": "  "}\n\n', encoding="utf-8")
    with pytest.raises(EmptyCorpusError, match="e.jsonl"):
        load_table(p)
    q = tmp_path / "e.csv"
    q.write_text("", encoding="utf-8")
    with pytest.raises(EmptyCorpusError, match="e.csv"):
        load_table(q)
    q.write_text("user_id,text\n", encoding="utf-8")
    with pytest.raises(EmptyCorpusError, match="e.csv"):
        load_table(q)
    with pytest.raises(EmptyCorpusError, match="e.csv"):
        load_table(q, spill_to=tmp_path / "s.sqlite")
    assert not (tmp_path / "s.sqlite").exists()


def test_missing_file_is_a_source_error(tmp_path):
    with pytest.raises(SourceError, match="nope.jsonl"):
        load_table(tmp_path / "nope.jsonl")


def test_tokens_without_tags_is_refused(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [{"user_id": "u", "text": "a"}])
    with pytest.raises(FedprivError, match="tags_column"):
        load_table(p, tokens_column="tokens")


GOOD = '{"user_id": "u1", "text": "fine", "tokens": ["a", "b"], "tags": ["O", "O"], "ts": 1}\n'

JSONL_ERRORS = [
    # (body after one good line and a blank line, i.e. the bad line is line 3, kwargs, reason regex)
    ('{"user_id": "u", "text": "x",\n', {}, "invalid JSON"),
    ("[1, 2]\n", {}, "expected a JSON object, got list"),
    ('"just a string"\n', {}, "expected a JSON object, got str"),
    ('{"text": "x"}\n', {}, "missing column 'user_id'"),
    ('{"user_id": null, "text": "x"}\n', {}, "null user id"),
    ('{"user_id": "  ", "text": "x"}\n', {}, "empty user id"),
    ('{"user_id": [1], "text": "x"}\n', {}, "user id must be a string or an integer"),
    ('{"user_id": true, "text": "x"}\n', {}, "user id must be a string or an integer"),
    ('{"user_id": "u", "text": 5}\n', {}, "'text' must be a string, got int"),
    ('{"user_id": "u", "text": null}\n', {}, "'text' must be a string, got null"),
    ('{"user_id": "u", "text": "\\ud800"}\n', {}, "lone surrogate"),
    ('{"user_id": "u", "tokens": "a b", "tags": ["O", "O"]}\n', {"tokens_column": "tokens", "tags_column": "tags"}, "'tokens' must be a list of strings, got str"),
    ('{"user_id": "u", "tokens": ["a", 1], "tags": ["O", "O"]}\n', {"tokens_column": "tokens", "tags_column": "tags"}, "list of strings, holds a int"),
    ('{"user_id": "u", "tokens": ["a", "b"], "tags": ["O"]}\n', {"tokens_column": "tokens", "tags_column": "tags"}, "2 tokens but 1 tags"),
    ('{"user_id": "u", "text": "x", "ts": "yesterday"}\n', {"timestamp_column": "ts"}, "unparsable timestamp 'yesterday'"),
    ('{"user_id": "u", "text": "x", "ts": null}\n', {"timestamp_column": "ts"}, "missing \\(null\\) timestamp"),
    ('{"user_id": "u", "text": "x", "ts": "nan"}\n', {"timestamp_column": "ts"}, "not finite"),
    ('{"user_id": "u", "text": "x", "ts": [1]}\n', {"timestamp_column": "ts"}, "timestamp must be"),
]


@pytest.mark.parametrize("bad, kwargs, reason", JSONL_ERRORS)
def test_jsonl_errors_name_file_and_line(tmp_path, bad, kwargs, reason):
    p = tmp_path / "bad.jsonl"
    p.write_text(GOOD + "\n" + bad + GOOD, encoding="utf-8")
    with pytest.raises(DataFormatError, match=reason) as e:
        load_table(p, **kwargs)
    assert e.value.path == str(p) and e.value.where == 3
    assert str(e.value).startswith(f"{p}:3: ")


def test_jsonl_invalid_utf8_names_the_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(GOOD.encode() * 3 + b'{"user_id": "u", "text": "caf\xe9"}\n' + GOOD.encode())
    with pytest.raises(DataFormatError, match="not valid UTF-8") as e:
        load_table(p)
    assert e.value.where == 4


@pytest.mark.parametrize("content", ['[\n{"user_id": "u", "text": "x"}\n]\n', '\n  [{"user_id": "u", "text": "x"}, {"user_id": "v", "text": "y"}]\n'])
def test_jsonl_array_file_gets_a_hint(tmp_path, content):
    p = tmp_path / "arr.json"
    p.write_text(content, encoding="utf-8")  # pretty-printed, or on one line (parsed whole before: now refused at once)
    with pytest.raises(DataFormatError, match="JSON array is not supported") as e:
        load_table(p)
    assert e.value.where == content.count("\n", 0, content.index("[")) + 1


def test_jsonl_utf8_bom_is_accepted(tmp_path):
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + GOOD.encode())
    assert list(load_table(p).user_ids) == ["u1"]


CSV_HEAD = "user_id,text,tokens,tags,ts\n"
CSV_GOOD = "u1,fine,a b,O O,1\n"

CSV_ERRORS = [
    # (content, bad line, kwargs, reason regex)
    (CSV_HEAD + CSV_GOOD + "u2,too,many,fields,1,2\n", 3, {}, "6 fields but the header has 5"),
    (CSV_HEAD + CSV_GOOD + "u2,few\n", 3, {}, "2 fields but the header has 5"),
    ("user,text\n" + "u1,x\n", 1, {}, "missing column\\(s\\) \\['user_id'\\]"),
    ("user_id,text,text\n" + "u1,x,y\n", 1, {}, "more than once"),
    (CSV_HEAD + CSV_GOOD + CSV_GOOD + ",x,a,O,1\n", 4, {}, "empty user id"),
    (CSV_HEAD + CSV_GOOD + "u2,x,a b,O,1\n", 3, {"tokens_column": "tokens", "tags_column": "tags"}, "2 tokens but 1 tags"),
    (CSV_HEAD + CSV_GOOD + "u2,x,a,O,\n", 3, {"timestamp_column": "ts"}, "unparsable timestamp ''"),
    (CSV_HEAD + CSV_GOOD + 'u2,"multi\nline\ntext",a,O,soon\n', 5, {"timestamp_column": "ts"}, "unparsable timestamp 'soon'"),
    (CSV_HEAD + CSV_GOOD + 'u2,"never closed,a,O,1\n' + CSV_GOOD, 3, {}, "malformed CSV: a quoted field that opens on this line is never closed"),
    (CSV_HEAD + CSV_GOOD + 'u2,"quoted"junk,a,O,1\n', 3, {}, "malformed CSV"),
]


@pytest.mark.parametrize("content, line, kwargs, reason", CSV_ERRORS)
def test_csv_errors_name_file_and_line(tmp_path, content, line, kwargs, reason):
    p = tmp_path / "bad.csv"
    p.write_text(content, encoding="utf-8")
    with pytest.raises(DataFormatError, match=reason) as e:
        load_table(p, **kwargs)
    assert e.value.path == str(p) and e.value.where == line


def test_csv_invalid_utf8_names_the_line(tmp_path):
    p = tmp_path / "bad.tsv"
    p.write_bytes(b"user_id\ttext\nu1\tfine\nu2\tfine\nu3\tna\xefve\n")
    with pytest.raises(DataFormatError, match="not valid UTF-8") as e:
        load_table(p)
    assert e.value.where == 4


def test_csv_quoted_fields_and_blank_lines(tmp_path):
    p = tmp_path / "q.csv"
    p.write_text('user_id,text\n\n007,"Hello, ""world""\nagain"\n', encoding="utf-8")
    c = load_table(p)
    assert c.examples("007") == [TextExample(normalize('Hello, "world"\nagain'))]


def test_parquet_errors_name_the_row(tmp_path, rows):
    bad = [dict(r) for r in rows]
    bad[4]["user_id"] = None
    p = write_parquet(tmp_path / "b.parquet", bad)
    with pytest.raises(DataFormatError, match="null user id") as e:
        load_table(p)
    assert e.value.where == "row 5" and str(e.value).startswith(f"{p} (row 5): ")

    bad = [dict(r) for r in rows]
    bad[7]["tags"] = bad[7]["tags"][:-1]
    p = write_parquet(tmp_path / "m.parquet", bad)
    with pytest.raises(DataFormatError, match="tokens but") as e:
        load_table(p, tokens_column="tokens", tags_column="tags")
    assert e.value.where == "row 8"

    with pytest.raises(DataFormatError, match="missing column\\(s\\) \\['who'\\]"):
        load_table(p, user_column="who")

    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(DataFormatError, match="not a readable Parquet file"):
        load_table(junk)


def test_parquet_row_numbers_cross_batches(tmp_path):
    n = 9000  # more than two record batches
    users = [f"u{i % 7}" for i in range(n)]
    texts = [f"word {i}" for i in range(n)]
    texts[8500] = None
    pq.write_table(pa.table({"user_id": users, "text": texts}), tmp_path / "big.parquet", row_group_size=1000)
    with pytest.raises(DataFormatError, match="'text' must be a string, got null") as e:
        load_table(tmp_path / "big.parquet")
    assert e.value.where == "row 8501"


def test_spill_gives_the_same_corpus(tmp_path, rows):
    for src in all_formats(tmp_path, rows):
        spill = tmp_path / (src.name + ".sqlite")
        mem = load_table(src, tokens_column="tokens", tags_column="tags", timestamp_column="ts")
        disk = load_table(src, tokens_column="tokens", tags_column="tags", timestamp_column="ts", spill_to=spill)
        assert isinstance(disk.store, SqliteStore) and spill.is_file()
        assert snapshot(disk) == snapshot(mem)
        assert disk.counts().tolist() == mem.counts().tolist()


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_spill_leaves_no_file_on_error(tmp_path, rows, fmt):
    bad = [dict(r) for r in rows]
    bad[-1]["ts"] = "not a time"
    bad = [{**r, "ts": str(r["ts"])} for r in bad]
    src = {"jsonl": write_jsonl, "csv": write_csv, "parquet": write_parquet}[fmt](tmp_path / f"b.{fmt}", bad)
    spill = tmp_path / "out.sqlite"
    with pytest.raises(DataFormatError, match="unparsable timestamp"):
        load_table(src, timestamp_column="ts", spill_to=spill)
    assert not spill.exists()
    assert list(tmp_path.glob("out.sqlite*")) == []


def test_spill_into_missing_directory_is_refused(tmp_path, rows):
    src = write_jsonl(tmp_path / "t.jsonl", rows)
    with pytest.raises(FedprivError, match="does not exist"):
        load_table(src, spill_to=tmp_path / "no" / "such" / "dir.sqlite")


# ---- property-based: arbitrary bytes either load or raise a FedprivError ---------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
_keys = st.sampled_from(["user_id", "text", "tokens", "tags", "ts", "other"])
_objects = st.dictionaries(_keys, _json_values | st.text(max_size=20) | st.lists(st.text(max_size=5), max_size=4), max_size=6)
_user_ids = st.one_of(st.text(string.ascii_letters + string.digits, min_size=1, max_size=3), st.integers(0, 50))
_timestamps = st.one_of(st.integers(0, 2**34), st.floats(0, 1e10), st.just("2024-01-02T03:04:05Z"), st.just("2020-05-06"))


@st.composite
def _good_row(draw) -> dict:
    """A row every mode accepts (tokens and tags of equal length)."""
    n = draw(st.integers(1, 3))
    return {
        "user_id": draw(_user_ids),
        "text": draw(st.text(min_size=1, max_size=30)),
        "tokens": draw(st.lists(st.text(string.ascii_letters, min_size=1, max_size=4), min_size=n, max_size=n)),
        "tags": draw(st.lists(st.sampled_from(["O", "B-X", "I-X"]), min_size=n, max_size=n)),
        "ts": draw(_timestamps),
    }


@st.composite
def _bad_jsonl_line(draw) -> bytes:
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(st.binary(max_size=40))
    if kind == 1:
        return json.dumps(draw(_json_values)).encode()
    line = json.dumps(draw(_objects), ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    if kind == 2:  # truncated
        return line[: draw(st.integers(0, len(line)))]
    return line


@st.composite
def _jsonl_bytes(draw) -> bytes:
    lines = [json.dumps(r, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass") for r in draw(st.lists(_good_row(), max_size=6))]
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):  # corrupt some files, leave others valid
        lines.insert(draw(st.integers(0, len(lines))), draw(_bad_jsonl_line()))
    if draw(st.booleans()):
        lines.insert(draw(st.integers(0, len(lines))), b"   ")
    return draw(st.sampled_from([b"\n", b"\r\n"])).join(lines)


_LOAD_KWARGS = st.sampled_from(
    [
        {},
        {"normalize_text": False},
        {"timestamp_column": "ts"},
        {"tokens_column": "tokens", "tags_column": "tags"},
        {"tokens_column": "tokens", "tags_column": "tags", "timestamp_column": "ts"},
    ]
)


def _load_or_refuse(path: Path, kwargs: dict) -> None:
    try:
        c = load_table(path, **kwargs)
    except FedprivError as e:
        event(f"refused: {type(e).__name__}")
        return
    event("loaded")
    assert isinstance(c, FederatedCorpus)
    assert c.num_examples == sum(len(exs) for _, exs in c.users()) > 0


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_jsonl_bytes(), kwargs=_LOAD_KWARGS)
def test_arbitrary_jsonl_loads_or_raises_fedprivError(tmp_path, data, kwargs):
    p = tmp_path / "fuzz.jsonl"
    p.write_bytes(data)
    _load_or_refuse(p, kwargs)


_csv_field = st.one_of(
    st.text(max_size=12),
    st.text(alphabet=',"\n\r\t ab1', max_size=10),
    st.sampled_from(["", "1700000000", "2024-01-02", "a b", "O O", "nan", "1e999"]),
)
_HEADER = ["user_id", "text", "tokens", "tags", "ts"]


def _csv_line(fields: list[str]) -> str:
    buf = io.StringIO()
    csv.writer(buf).writerow(fields)
    return buf.getvalue().rstrip("\r\n")


@st.composite
def _csv_bytes(draw) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=120))
    header = draw(st.one_of(st.just(_HEADER), st.just(_HEADER), st.lists(_keys, max_size=6)))
    out = [",".join(header)]
    for r in draw(st.lists(_good_row(), max_size=6)):
        r = {**r, "tokens": " ".join(r["tokens"]), "tags": " ".join(r["tags"])}
        out.append(_csv_line([str(r.get(h, "x")) for h in header]))
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):  # corrupt some files, leave others valid
        n = draw(st.sampled_from([len(header), max(len(header) - 1, 0), len(header) + 1]))
        fields = draw(st.lists(_csv_field, min_size=n, max_size=n))
        # quoted rows are well-formed CSV; unquoted ones break on commas, quotes and newlines
        line = _csv_line(fields) if draw(st.booleans()) else ",".join(fields)
        out.insert(draw(st.integers(1, len(out))), line)
    data = "\n".join(out).encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 4)) == 0:
        data = data[: draw(st.integers(0, len(data)))]
    if draw(st.integers(0, 4)) == 0:
        i = draw(st.integers(0, len(data)))
        data = data[:i] + draw(st.sampled_from([b"\xff", b"\xc3", b"\x00", b"\xed\xa0\x80"])) + data[i:]
    return data


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_csv_bytes(), kwargs=_LOAD_KWARGS)
def test_arbitrary_csv_loads_or_raises_fedprivError(tmp_path, data, kwargs):
    p = tmp_path / "fuzz.csv"
    p.write_bytes(data)
    _load_or_refuse(p, kwargs)


def test_user_ids_of_two_types_that_print_the_same_are_refused_naming_both_lines(tmp_path):
    """1 and "1" used to merge into one user with no note (issue 31); user-level DP counts users."""
    p = tmp_path / "ids.jsonl"
    p.write_text('{"user_id": "7", "text": "a"}\n\n{"user_id": 7, "text": "b"}\n', encoding="utf-8")
    with pytest.raises(DataFormatError) as e:
        load_table(p)
    assert str(e.value) == f'{p}:3: user id 7 (an integer) prints the same as the user id "7" (a string) of line 1: they would merge into one user; give every user id one type'
    p.write_text('{"user_id": 7, "text": "a"}\n{"user_id": 8, "text": "b"}\n{"user_id": "7", "text": "c"}\n', encoding="utf-8")
    with pytest.raises(DataFormatError, match='^.*:3: user id "7" \\(a string\\) prints the same as the user id 7 \\(an integer\\) of line 1'):
        load_table(p)
    p.write_text('{"user_id": 7, "text": "a"}\n{"user_id": "07", "text": "b"}\n{"user_id": 7, "text": "c"}\n{"user_id": "x", "text": "d"}\n', encoding="utf-8")
    assert sorted(load_table(p).user_ids) == ["07", "7", "x"]  # one type per printed id: read as before


# ---- review fixes: the UTF-8 hint, text without spaces between words, the sentence note ----------


def test_text_in_another_encoding_says_how_to_save_it_as_utf8(tmp_path):
    """A CSV saved as Windows-1252 was refused with the byte and line only; the UTF-16 case gave
    the fix. Both say it now (one line, file and line first)."""
    p = tmp_path / "mixed.csv"
    rows = [f"u{i},fine text {i}\n".encode() for i in range(50)]
    p.write_bytes(b"user_id,text\n" + b"".join(rows) + "u9,caf\u00e9 cr\u00e8me\n".encode("cp1252"))
    with pytest.raises(DataFormatError) as e:
        load_table(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}:52: not valid UTF-8 (invalid continuation byte at byte 6 of the line): ") and "\n" not in msg
    assert msg.endswith("save it as UTF-8, e.g. iconv -f WINDOWS-1252 -t UTF-8 FILE > OUT for a Windows file")
    u16 = tmp_path / "u16.jsonl"
    u16.write_bytes('{"user_id": "a", "text": "x"}\n'.encode("utf-16"))
    with pytest.raises(DataFormatError, match=r"u16.jsonl:1: not valid UTF-8: the file starts with a UTF-16 byte-order mark \(save it as UTF-8, e\.g\. iconv -f UTF-16"):
        load_table(u16)


CHINESE = ["我今天去了商店买东西。天气很好，我们一起去公园散步吧！", "他说这本书非常有意思，所以我也想读一读。"]
JAPANESE = ["今日は天気がいいですね。明日も晴れるでしょうか？"]


def _rows(tmp_path, texts, name="t.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps({"user_id": f"u{i % 2}", "text": t}, ensure_ascii=False) + "\n" for i, t in enumerate(texts)), encoding="utf-8")
    return p


def _unsegmented_notes(c):
    return [n for n in c.notes if "without spaces between words" in n]


@pytest.mark.parametrize("unit", ["row", "sentence"])
def test_text_without_spaces_between_words_is_noted_once(tmp_path, unit):
    """Chinese and Japanese sentences became one token per clause (``tokens per example 2.0``)
    without a word; a note now says why, and how to segment such text."""
    c = load_table(_rows(tmp_path, CHINESE + JAPANESE), unit=unit)
    (note,) = _unsegmented_notes(c)
    n = c.num_examples
    assert note.startswith(f"{n} of the {n} examples of t.jsonl are Chinese, Japanese, Thai or other text written without spaces between words")
    assert "the tokenizer splits words at spaces and punctuation only" in note
    assert "jieba for Chinese, MeCab for Japanese" in note and "join the words by spaces" in note
    assert c.info["unsegmented_examples"] == n


def test_segmented_or_other_text_gives_no_such_note(tmp_path):
    segmented = ["我 今天 去 了 商店 买 东西 。 天气 很 好 ， 我们 一起 去 公园 散步 吧 ！", "今日 は 天気 が いい です ね 。"]
    korean = ["오늘은 날씨가 정말 좋네요. 내일도 맑을까요?"]  # Korean is written with spaces
    latin = ["Hello world, this is text.", "Ünïcödé wörds with äccents and naïve façades."]
    for i, texts in enumerate((segmented, korean, latin)):
        assert _unsegmented_notes(load_table(_rows(tmp_path, texts, f"t{i}.jsonl"))) == []
    # a few unsegmented rows among many English ones are not a large share
    mixed = load_table(_rows(tmp_path, CHINESE[:1] + latin * 5, "mixed.jsonl"))
    assert _unsegmented_notes(mixed) == []


def test_unsegmented_counts_runs_of_the_scripts_without_spaces():
    from fedpriv.data.tabular import unsegmented

    assert unsegmented(normalize("我今天去了商店买东西。"))
    assert unsegmented(normalize("ภาษาไทยเขียนติดกันโดยไม่มีช่องว่าง"))  # Thai
    assert not unsegmented(normalize("我 今天 去 了 商店 买 东西 。"))
    assert not unsegmented("你好")  # too short to tell
    assert not unsegmented("plain ascii text with averyveryverylongwordindeed")
    assert not unsegmented("。。。。。。。。。。")  # punctuation is no word


def test_the_sentence_note_names_the_full_width_terminators(tmp_path):
    """The note said sentences were split "at . ! ? before a capital or a digit" also where they
    were split at 。"""
    c = load_table(_rows(tmp_path, CHINESE), unit="sentence")
    assert c.num_examples == 3
    assert "split into 3 sentences at . ! ? before a capital or a digit (not after e.g., i.e., et al., Fig. 3, ...) and at every full-width 。！？, " in c.notes[0]
