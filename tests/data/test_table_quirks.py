"""load_table on the quirks of corpora researchers bring: placeholder and mangled user ids, ids
that differ only in whitespace, Unicode form or case, stray quotes in TSV, long fields, bzip2/xz
files, JSON arrays and pretty-printed objects, nested fields, duplicate keys, millisecond
timestamps, and a spill path that holds another file."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import sqlite3
import unicodedata
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fedpriv.data.sources import guess_format, open_corpus
from fedpriv.data.tabular import PLACEHOLDER_USER_IDS, load_table
from fedpriv.errors import DataFormatError, FedprivError, SourceError

# Real sentences (tests/data/wnut17 would do as well): the quirks are in the files, not the text.
SENTENCES = [
    "The patients were treated with ampicillin.",
    "No mutation was found in the second family.",
    "Coffee beans lose their aroma within weeks.",
    "A burr grinder gives a more even grind.",
    "We thank the reviewers for their comments.",
]


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def notes(corpus) -> str:  # noqa: ANN001
    return " | ".join(corpus.notes)


def test_placeholder_user_ids_are_skipped_and_counted(tmp_path):
    ids = ["[deleted]", "ada", "[DELETED]", "NULL", "\\N", "bob", "nan", "[removed]"]
    p = jsonl(tmp_path / "reddit.jsonl", [{"author": u, "body": s} for u, s in zip(ids, SENTENCES * 2)])
    c = load_table(p, user_column="author", text_column="body")
    assert c.user_ids == ("ada", "bob")
    assert "6 rows of reddit.jsonl have a placeholder user id and were skipped" in notes(c)
    assert "'[deleted]' (1), '[DELETED]' (1)" in notes(c)
    kept = load_table(p, user_column="author", text_column="body", placeholder_users="keep")
    assert len(kept.user_ids) == 8  # each spelling one user, as written
    assert {u.casefold() for u in PLACEHOLDER_USER_IDS} == PLACEHOLDER_USER_IDS
    with pytest.raises(SourceError, match="placeholder_users must be one of"):
        load_table(p, user_column="author", text_column="body", placeholder_users="drop")


@pytest.mark.parametrize("unit", ["row", "sentence"])
def test_deleted_and_removed_post_texts_are_skipped_and_counted(tmp_path, unit):
    bodies = ["[removed]", SENTENCES[0], " [Deleted] ", "", SENTENCES[1], "[removed] because spam"]
    p = jsonl(tmp_path / "reddit.jsonl", [{"author": a, "body": b} for a, b in zip(["ada", "ada", "bob", "bob", "bob", "cy"], bodies)])
    c = load_table(p, user_column="author", text_column="body", unit=unit)
    assert c.num_examples == 3 and c.user_ids == ("ada", "bob", "cy")  # a post that says more than the placeholder is text
    note = notes(c)
    assert "2 rows of reddit.jsonl hold a deleted or removed post's placeholder text or a missing-value marker as their whole text and were skipped: '[removed]' (1), '[Deleted]' (1)" in note
    assert "1 rows of reddit.jsonl have an empty text and were skipped" in note


def test_ids_differing_in_whitespace_or_unicode_form_are_one_user(tmp_path):
    nfd = unicodedata.normalize("NFD", "alíce")
    assert nfd != "alíce"
    rows = [{"user_id": u, "text": s} for u, s in zip(["alíce", nfd, " alíce", "alíce\t", "bob"], SENTENCES)]
    c = load_table(jsonl(tmp_path / "ws.jsonl", rows))
    assert c.user_ids == ("alíce", "bob")
    assert len(c.examples("alíce")) == 4
    assert "3 rows of ws.jsonl have a user id with surrounding whitespace or in another Unicode form" in notes(c)


def test_ids_differing_in_case_are_counted_without_naming_them_and_folded_on_request(tmp_path):
    rows = [{"user_id": u, "text": s} for u, s in zip(["Jiaxin Guo", "Jiaxin GUO", "Daniel Geißler", "Daniel Geissler", "bob"], SENTENCES)]
    p = jsonl(tmp_path / "case.jsonl", rows)
    c = load_table(p)
    assert len(c.user_ids) == 5
    note = notes(c)
    assert "2 groups of user ids of case.jsonl (4 ids) differ only in letter case" in note
    assert "Guo" not in note and "Geiss" not in note  # the ids are private users' names
    folded = load_table(p, user_id_case="fold")
    assert folded.user_ids == ("bob", "daniel geissler", "jiaxin guo")
    assert "letter case" not in notes(folded)


@pytest.mark.parametrize(
    ("uid", "why"),
    [("1.23457E+18", "scientific notation: a spreadsheet rounded it"), ("7.0", "an integer written as a float"), ("5E+11", "scientific notation")],
)
def test_ids_mangled_by_spreadsheets_are_refused_with_the_line(tmp_path, uid, why):
    p = tmp_path / "t.csv"
    p.write_text(f"user_id,text\nada,{SENTENCES[0]}\n{uid},{SENTENCES[1]}\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=why) as e:
        load_table(p)
    assert e.value.where == 3


def test_hex_and_other_ids_that_merely_contain_an_e_are_ids(tmp_path):
    ids = ["69e56976", "1e5", "2e-3x", "0e0"]  # hashed pseudonyms: no spreadsheet writes E without a sign
    p = tmp_path / "hex.csv"
    p.write_text("user_id,text\n" + "".join(f"{u},{s}\n" for u, s in zip(ids, SENTENCES)), encoding="utf-8")
    assert sorted(load_table(p).user_ids) == sorted(ids)


def test_a_pandas_tsv_with_tab_indented_code_in_a_field_reads(tmp_path):
    """A quoted field holding line breaks and tabs (code) is no stray quote: no line in it reads as a row."""
    pd = pytest.importorskip("pandas")
    p = tmp_path / "pd.tsv"
    pd.DataFrame({"user_id": ["ada", "bob"], "text": ["My loop:\n\tfor x in y:\n\t\tprint(x)", "fine"]}).to_csv(p, sep="\t", index=False)
    c = load_table(p)
    assert c.user_ids == ("ada", "bob") and "1 records of pd.tsv span several lines" in notes(c)


def test_tsv_stray_quote_joining_rows_is_refused_and_quoting_none_reads_it(tmp_path):
    p = tmp_path / "tweets.tsv"
    p.write_text('user_id\ttext\nu1\t"hello there\nu2\tsecret message of u2"\nu3\tok text\n', encoding="utf-8")
    with pytest.raises(DataFormatError, match="runs over 1 line break.* a stray quote") as e:
        load_table(p)
    assert e.value.where == 2
    c = load_table(p, quoting="none")
    assert c.user_ids == ("u1", "u2", "u3")
    assert c.examples("u1")[0].text == '" hello there'
    with pytest.raises(SourceError, match="quoting='none' is for CSV and TSV"):
        load_table(jsonl(tmp_path / "a.jsonl", [{"user_id": "a", "text": "x"}]), quoting="none")


def test_csv_records_over_several_lines_are_counted(tmp_path):
    p = tmp_path / "posts.csv"
    p.write_text(f'user_id,text\nada,"{SENTENCES[0]}\n\n{SENTENCES[1]}"\nbob,{SENTENCES[2]}\nbob,"{SENTENCES[3]}\nx"\n', encoding="utf-8")
    c = load_table(p)
    assert c.user_ids == ("ada", "bob")
    assert "2 records of posts.csv span several lines" in notes(c) and "the first starts at line 2" in notes(c)


def test_a_long_field_is_a_field(tmp_path):
    long_text = " ".join(SENTENCES * 6000)  # about 240 KB, over the csv module's default limit
    for name, sep in (("t.csv", ","), ("t.tsv", "\t")):
        p = tmp_path / name
        p.write_text(f"user_id{sep}text\nada{sep}{long_text}\n", encoding="utf-8")
        assert len(load_table(p).examples("ada")[0].text) > 200_000


@pytest.mark.parametrize(("suffix", "compress"), [(".bz2", bz2.compress), (".xz", lzma.compress)])
def test_bzip2_and_xz_stream_like_the_plain_file(tmp_path, suffix, compress):
    rows = [{"user_id": u, "text": s} for u, s in zip(["ada", "bob", "ada"], SENTENCES)]
    plain = load_table(jsonl(tmp_path / "a.jsonl", rows))
    data = (tmp_path / "a.jsonl").read_bytes()
    packed = tmp_path / f"a.jsonl{suffix}"
    packed.write_bytes(compress(data))
    c = load_table(packed)
    assert c.user_ids == plain.user_ids and c.examples("ada") == plain.examples("ada")
    misnamed = tmp_path / f"b{suffix}.jsonl"  # known by its magic bytes, whatever its name
    misnamed.write_bytes(compress(data))
    assert load_table(misnamed).examples("bob") == plain.examples("bob")
    cut = tmp_path / f"cut.jsonl{suffix}"
    whole = compress(data * 200)
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataFormatError, match=r"cut\.jsonl\.\w+:\d+: the (bzip2|xz) data is corrupt or truncated"):
        load_table(cut)
    assert guess_format(tmp_path / f"a.csv{suffix}") == "csv"


def test_zstd_and_zip_content_is_refused_with_how_to_read_it(tmp_path):
    for magic, what in ((b"\x28\xb5\x2f\xfd" + b"\x00" * 8, "zstd-compressed"), (b"PK\x03\x04" + b"\x00" * 8, "zip-compressed")):
        p = tmp_path / "data.jsonl"
        p.write_bytes(magic)
        with pytest.raises(SourceError, match=what):
            load_table(p)


def test_ndjson_and_a_tsv_table_without_user_id_header_are_recognized(tmp_path):
    p = jsonl(tmp_path / "r.ndjson", [{"user_id": "ada", "text": SENTENCES[0]}])
    assert open_corpus(str(p)).user_ids == ("ada",)
    t = tmp_path / "posts.tsv"
    t.write_text(f"author\tbody\nada\t{SENTENCES[0]}\nbob\t{SENTENCES[1]}\n", encoding="utf-8")
    assert guess_format(t) == "conll"  # by its name and header alone
    assert open_corpus(str(t), user_column="author", text_column="body").user_ids == ("ada", "bob")


def test_pretty_printed_objects_get_a_hint(tmp_path):
    p = tmp_path / "pretty.jsonl"
    p.write_text('{\n  "user_id": "ada",\n  "text": "x"\n}\n', encoding="utf-8")
    with pytest.raises(DataFormatError, match="an object spread over several lines") as e:
        load_table(p)
    assert e.value.where == 1


@pytest.mark.parametrize("end", [b"", b"\n"])  # with or without a final LF
def test_classic_mac_line_ends_are_refused(tmp_path, end):
    p = tmp_path / "mac.csv"
    p.write_bytes(f"user_id,text\rada,{SENTENCES[0]}\rbob,{SENTENCES[1]}\r".encode() + end)
    with pytest.raises(DataFormatError, match="classic Mac line ends") as e:
        load_table(p)
    assert e.value.where == 1
    crlf = tmp_path / "windows.csv"
    crlf.write_bytes(f"user_id,text\r\nada,{SENTENCES[0]}\r\n".encode() + end)
    assert load_table(crlf).user_ids == ("ada",)


def test_parquet_with_a_used_column_twice_is_a_data_error(tmp_path):
    p = tmp_path / "dup.parquet"
    table = pa.Table.from_arrays([pa.array(["ada"]), pa.array([SENTENCES[0]]), pa.array(["y"])], names=["user_id", "text", "text"])
    pq.write_table(table, p)
    with pytest.raises(DataFormatError, match=r"column\(s\) \['text'\] appear more than once in the schema"):
        load_table(p)


def test_millisecond_timestamps_are_refused(tmp_path):
    p = jsonl(tmp_path / "ms.jsonl", [{"user_id": "ada", "text": SENTENCES[0], "ts": 1_600_000_000_000}])
    with pytest.raises(DataFormatError, match="after the year 3000: milliseconds since the epoch"):
        load_table(p, timestamp_column="ts")
    old = jsonl(tmp_path / "old.jsonl", [{"user_id": "ada", "text": SENTENCES[0], "ts": -1_000_000_000}])  # 1938: allowed
    assert load_table(old, timestamp_column="ts").examples("ada")[0].timestamp == -1e9


def test_nested_fields_by_dotted_name_and_missing_columns_list_the_keys(tmp_path):
    rows = [{"user": {"screen_name": u, "id": i}, "text": s} for i, (u, s) in enumerate(zip(["ada", "bob", "ada"], SENTENCES))]
    p = jsonl(tmp_path / "tweets.jsonl", rows)
    assert load_table(p, user_column="user.screen_name").user_ids == ("ada", "bob")
    with pytest.raises(DataFormatError, match=r"missing column 'user.name'; the row has 'user', 'text'"):
        load_table(p, user_column="user.name")
    dotted = jsonl(tmp_path / "dotted.jsonl", [{"user.screen_name": "flat", "user": {"screen_name": "nested"}, "text": "x"}])
    assert load_table(dotted, user_column="user.screen_name").user_ids == ("flat",)  # a column of that name comes first


def test_a_used_key_twice_in_one_object_is_refused(tmp_path):
    p = tmp_path / "dup.jsonl"
    p.write_text(
        json.dumps({"user_id": "ada", "text": 'she wrote "user_id" twice'}) + "\n"  # the key's text inside a value is fine
        + json.dumps({"user_id": "ada", "meta": {"user_id": "x"}, "text": "nested keys are other objects"}) + "\n"
        + '{"user_id": "ada", "user_id": "bob", "text": "which user?"}\n',
        encoding="utf-8",
    )
    with pytest.raises(DataFormatError, match="the key 'user_id' appears twice in the object") as e:
        load_table(p)
    assert e.value.where == 3
    nested_dup = tmp_path / "nested.jsonl"  # a duplicate inside an object no column reads is not ours to judge
    nested_dup.write_text('{"user_id": "ada", "text": "hi", "meta": {"user_id": 1, "user_id": 2}}\n', encoding="utf-8")
    assert load_table(nested_dup).user_ids == ("ada",)
    han = tmp_path / "han.jsonl"  # json.dumps writes a non-ASCII key escaped: the raw text never shows it twice
    han.write_text(json.dumps({"text": "x"})[:-1] + ', "\\u7528\\u6237": "ada", "\\u7528\\u6237": "bob"}\n', encoding="utf-8")
    with pytest.raises(DataFormatError, match="appears twice"):
        load_table(han, user_column="\u7528\u6237")
    dotted = tmp_path / "dotted_dup.jsonl"
    dotted.write_text('{"user": {"name": "ada", "name": "bob"}, "text": "x"}\n', encoding="utf-8")
    with pytest.raises(DataFormatError, match="the key 'user.name' appears twice"):
        load_table(dotted, user_column="user.name")


def test_spill_refuses_to_replace_a_file_that_is_no_corpus_store(tmp_path):
    src = jsonl(tmp_path / "a.jsonl", [{"user_id": "ada", "text": SENTENCES[0]}])
    precious = tmp_path / "notes.txt"
    precious.write_text("precious notes\n")
    with pytest.raises(FedprivError, match="a file that is not a fedpriv corpus store is there"):
        load_table(src, spill_to=precious)
    assert precious.read_text() == "precious notes\n"
    other_db = tmp_path / "other.sqlite"
    sqlite3.connect(other_db).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(FedprivError, match="not a fedpriv corpus store"):
        load_table(src, spill_to=other_db)
    empty = tmp_path / "fresh.sqlite"  # a file made empty by tempfile.mkstemp is free to fill
    empty.touch()
    assert load_table(src, spill_to=empty).user_ids == ("ada",)
    store = tmp_path / "spill.sqlite"
    load_table(src, spill_to=store)
    again = load_table(jsonl(tmp_path / "b.jsonl", [{"user_id": "bob", "text": SENTENCES[1]}]), spill_to=store)  # a spill replaces a spill
    assert again.user_ids == ("bob",)


def test_gzip_still_reads_and_names_its_lines(tmp_path):
    p = tmp_path / "g.jsonl.gz"
    p.write_bytes(gzip.compress(b'{"user_id": "ada", "text": "x"}\n{"user_id": null, "text": "y"}\n', mtime=0))
    with pytest.raises(DataFormatError, match=r"g\.jsonl\.gz:2: null user id"):
        load_table(p)


# ---- what R, pandas, Excel and tagging tools write (a review of loaders on files not bundled, 2026-11-29) ----


def test_missing_value_ids_as_r_and_pandas_write_them_are_placeholders(tmp_path):
    ids = ["NA", "ada", "<NA>", "nil", "(null)", "N.A.", "bob", "Na"]
    p = tmp_path / "r.csv"
    p.write_text("user_id,text\n" + "".join(f"{u},{s}\n" for u, s in zip(ids, SENTENCES * 2)), encoding="utf-8")
    c = load_table(p)
    assert c.user_ids == ("Na", "ada", "bob")  # 'Na' may be a name: only R's 'NA' as written is a missing value
    assert "5 rows of r.csv have a placeholder user id and were skipped" in notes(c)


def test_a_whole_text_that_is_a_missing_value_marker_is_skipped_and_counted(tmp_path):
    texts = ["NA", "nan", " NULL ", "None", "#N/A", "none", "NA is the answer"]
    p = tmp_path / "t.csv"
    p.write_text("user_id,text\n" + "".join(f"u{i},{t}\n" for i, t in enumerate(texts)), encoding="utf-8")
    c = load_table(p)
    assert [e.text for e in c.records()] == ["none", "na is the answer"]  # a reply "none" in lower case is text
    assert "5 rows of t.csv hold a deleted or removed post's placeholder text or a missing-value marker" in notes(c)


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_tag_without_its_scheme_letter_is_refused_with_the_line(tmp_path, fmt):
    rows = [(["John", "Smith", "visited", "Paris"], ["B-PER", "I-PER", "O", "B-LOC"]), (["Ann", "left"], ["PER", "O"])]
    if fmt == "jsonl":
        p = jsonl(tmp_path / "t.jsonl", [{"user_id": f"u{i}", "tokens": t, "tags": g} for i, (t, g) in enumerate(rows)])
    else:
        p = tmp_path / "t.csv"
        p.write_text("user_id,tokens,tags\n" + "".join(f"u{i},{' '.join(t)},{' '.join(g)}\n" for i, (t, g) in enumerate(rows)))
    with pytest.raises(DataFormatError, match="column 'tags': tag 'PER' is not O or B-/I-/E-/S-/L-/U-<type>") as e:
        load_table(p, tokens_column="tokens", tags_column="tags")
    assert e.value.where == (2 if fmt == "jsonl" else 3)


def test_csv_stray_quote_joining_rows_of_known_users_is_said_and_prose_with_commas_is_not(tmp_path):
    """A TSV refuses a quoted field holding a row-like line; a CSV, where prose has commas and a
    reply may start "bob, thanks", reads it and says where to look (a review found refusals of
    valid files with the first version)."""
    rows = [f"u{i % 4},Post number {i} says hello." for i in range(12)]
    rows[5] = 'u1,"I said hi'
    rows[9] = 'u1,great point"'
    p = tmp_path / "stray.csv"
    p.write_text("user_id,text\n" + "\n".join(rows) + "\n", encoding="utf-8")
    c = load_table(p)
    assert c.num_examples == 8  # rows 6-9 inside one quoted field, as the csv module reads it
    assert "1 of them hold a line that reads as a row of a user seen before (the first record starts at line 7)" in notes(c)
    assert load_table(p, quoting="none").num_examples == 12
    chat = tmp_path / "chat.csv"  # valid files whose quoted posts hold row-like lines
    chat.write_text('user_id,text\nbob,hello everyone\nalice,"Dear all,\nbob, thanks for the tip\ncheers"\n1,first\n2,"We raised\n1,500 dollars"\n', encoding="utf-8")
    assert [e.text for e in load_table(chat).records()] == ["first", "we raised 1 , 500 dollars", "dear all , bob , thanks for the tip cheers", "hello everyone"]
    prose = tmp_path / "prose.csv"  # a quoted post over lines with commas in them: one example, no such note
    prose.write_text('user_id,text\nu1,first\nu2,"Dear all, thanks.\nSee you, u1, soon\nBye, all"\n', encoding="utf-8")
    c = load_table(prose)
    assert [e.text for e in c.records()] == ["first", "dear all , thanks . see you , u1 , soon bye , all"]
    assert "reads as a row" not in notes(c)


def test_ids_differing_only_in_spacing_width_or_invisible_characters_are_counted(tmp_path):
    ids = ["John Smith", "John\u00a0Smith", "John  Smith", "John Smith\u200b", "\uff2aohn Smith", "Ann"]
    p = jsonl(tmp_path / "ids.jsonl", [{"user_id": u, "text": "hello"} for u in ids])
    c = load_table(p)
    assert c.num_users == 6  # kept apart, as written
    assert "1 groups of user ids of ids.jsonl (5 ids) differ only in spacing, character width or invisible characters" in notes(c)
    assert c.info["user_ids_differing_in_spacing"] == 5


def refused_at(path: Path, content: str, match: str) -> int | None:
    """Write ``content`` to ``path``; the line at which load_table refuses it with ``match``."""
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataFormatError, match=match) as e:
        load_table(path)
    return e.value.where


def test_a_header_with_another_delimiter_says_which_and_what_to_do(tmp_path):
    assert refused_at(tmp_path / "semi.csv", "user_id;text\nu1;hello\n", "the header is semicolon-separated.*delimiter=';'") == 1
    assert refused_at(tmp_path / "tab.csv", "user_id\ttext\nu1\thello\n", "the header is tab-separated: pass format='tsv'") == 1
    assert load_table(tmp_path / "tab.csv", format="tsv").num_examples == 1


def test_lines_that_are_arrays_of_values_get_their_own_hint(tmp_path):
    p = tmp_path / "rows.jsonl"
    p.write_text('["u1", "hello there"]\n["u2", "bye"]\n', encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"each line is a JSON array, not an object.*jq -c '\{user_id: \.\[0\], text: \.\[1\]\}'"):
        load_table(p)
    arr = tmp_path / "arr.json"
    arr.write_text('[\n{"user_id": "u1", "text": "x"}\n]\n', encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"a JSON array is not supported.*jq -c '\.\[\]'"):
        load_table(arr, format="jsonl")


def test_a_numeric_column_name_is_told_how_to_quote_it(tmp_path):
    p = tmp_path / "pd.csv"
    p.write_text("0,1\nu1,hello\n", encoding="utf-8")
    with pytest.raises(SourceError, match=r"""option user_column must be a string, got 0 \(a column named 0\? quote it: -o 'user_column="0"'"""):
        open_corpus(str(p), user_column=0, text_column="1")
    assert open_corpus(str(p), user_column="0", text_column="1").num_examples == 1


def test_numeric_timestamps_in_1970_are_counted_in_a_note(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("user_id,text,date\nu1,hello,20210315\nu2,bye,2021\nu3,ok,1615766400\nu4,iso,1970-02-01\n", encoding="utf-8")
    c = load_table(p, timestamp_column="date")
    assert c.info["timestamps_in_1970"] == 2  # not the epoch seconds of 2021, not the ISO date written out
    assert "2 rows of d.csv have a numeric timestamp in 1970" in notes(c)


def test_long_ids_rounded_by_a_spreadsheet_are_noted_and_real_long_ids_are_not(tmp_path):
    rounded = ["1234567890123450000", "1234567890123460000", "9876543210987650000"]
    real = ["1234567890123456789", "1234567890123456788", "9876543210987650000"]  # a real id may end in zeros
    for name, ids, noted in (("rounded", rounded, True), ("real", real, False)):
        p = tmp_path / f"{name}.csv"
        p.write_text("user_id,text\n" + "".join(f"{u},hello\n" for u in ids), encoding="utf-8")
        c = load_table(p)
        assert ("have nothing but zeros after the 15th" in notes(c)) is noted, name
