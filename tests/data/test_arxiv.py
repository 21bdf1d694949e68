"""The arXiv corpus path: gzipped tables streamed, examples that are sentences (prose_sentences),
the committed slice of ../shared/data/arxiv-csai read as users see it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from fedpriv.data.sources import guess_format, open_corpus, split_format
from fedpriv.data.tabular import load_table
from fedpriv.data.tokenize import normalize, prose_sentences
from fedpriv.errors import DataFormatError, SourceError

SLICE = Path(__file__).resolve().parent / "arxiv-csai" / "abstracts.jsonl.gz"
ARXIV = {"user_column": "first_author", "text_column": "abstract"}


# ---- the splitter -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("We propose X. It works! Does it? Yes.", ["We propose X.", "It works!", "Does it?", "Yes."]),
        ("Results improve by 3.5 points. 12 of 20 tasks gain.", ["Results improve by 3.5 points.", "12 of 20 tasks gain."]),
        ("Models, e.g. BERT, learn. Methods, i.e. Adam, help.", ["Models, e.g. BERT, learn.", "Methods, i.e. Adam, help."]),
        ("As Smith et al. Showed in Fig. 3 and Eq. 2, it holds. Next.", ["As Smith et al. Showed in Fig. 3 and Eq. 2, it holds.", "Next."]),
        ("On a graph G. We show it. By J. Smith.", ["On a graph G.", "We show it.", "By J.", "Smith."]),  # a variable, and so initials
        ("see the U.S. Army vs. Navy cf. Table. Done.", ["see the U.S. Army vs. Navy cf. Table.", "Done."]),
        ("A line\nbroken hard. (Parenthesized.) \"Quoted.\" Last", ["A line broken hard.", "(Parenthesized.)", '"Quoted."', "Last"]),
        ("lower case after a period. stays one. $\\alpha$ is kept. The end", ["lower case after a period. stays one. $\\alpha$ is kept.", "The end"]),
        ("Section No. 5 is here. No. We disagree.", ["Section No. 5 is here.", "No.", "We disagree."]),
        ("Étude finie. Écrite ici.", ["Étude finie.", "Écrite ici."]),
        ("", []),
        ("   \n ", []),
    ],
)
def test_prose_sentences(text, want):
    assert prose_sentences(text) == want


def test_prose_sentences_keep_every_character_but_whitespace():
    text = "We test it.  It works?!\n\nYes (see Fig. 2). 4 more: e.g. this.\tEnd"
    assert "".join(prose_sentences(text)).replace(" ", "") == "".join(text.split())


# ---- gzip --------------------------------------------------------------------------------------
ROWS = [
    {"first_author": "Ada", "abstract": "First paper.\nIt has two sentences.", "published": "2024-01-02T00:00:00"},
    {"first_author": "Bob", "abstract": "One sentence, e.g. this one.", "published": "2024-01-03T00:00:00"},
    {"first_author": "Ada", "abstract": "Second paper! Fig. 3 shows 2.5x gains. Done?", "published": "2024-01-04T00:00:00"},
]


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _write(path: Path, data: bytes, gz: bool) -> Path:
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


def test_gzip_reads_as_the_plain_file(tmp_path):
    plain = load_table(_write(tmp_path / "a.jsonl", _jsonl(ROWS), False), **ARXIV)
    gz = load_table(_write(tmp_path / "a.jsonl.gz", _jsonl(ROWS), True), **ARXIV)
    assert gz.user_ids == plain.user_ids == ("Ada", "Bob")
    assert [e.text for e in gz.records()] == [e.text for e in plain.records()]
    assert guess_format(tmp_path / "a.jsonl.gz") == "jsonl"
    # a format named by option, whatever the name: gzip is told by its magic bytes
    odd = _write(tmp_path / "abstracts.data", _jsonl(ROWS), True)
    assert [e.text for e in open_corpus(str(odd), format="jsonl", **ARXIV).records()] == [e.text for e in plain.records()]


def test_gzip_csv_with_bom_crlf_and_blank_lines(tmp_path):
    data = "\ufeffuser_id,text\r\n1,hello there\r\n\r\n2,\"a, quoted\r\nline\"\r\n".encode()
    c = open_corpus(str(_write(tmp_path / "t.csv.gz", data, True)))
    assert c.user_ids == ("1", "2")
    assert [e.text for e in c.records()] == ["hello there", "a , quoted line"]


def test_gzip_jsonl_quirks(tmp_path):
    lines = ["\ufeff" + json.dumps(ROWS[0]), "", json.dumps(ROWS[1]), "  "]
    c = load_table(_write(tmp_path / "q.jsonl.gz", "\r\n".join(lines).encode(), True), **ARXIV)
    assert c.num_examples == 2
    for bad, msg in [
        ({"first_author": "Ada", "abstract": None}, "column 'abstract' must be a string, got null"),
        ({"first_author": "Ada", "abstract": 3}, "column 'abstract' must be a string, got int"),
        ({"first_author": ["Ada"], "abstract": "x"}, "user id must be a string or an integer, got list"),
        ({"abstract": "x"}, "missing column 'first_author'"),
    ]:
        p = _write(tmp_path / "bad.jsonl.gz", _jsonl([ROWS[0], ROWS[1], bad]), True)
        with pytest.raises(DataFormatError, match=rf"bad\.jsonl\.gz:3: .*{msg}"):
            load_table(p, **ARXIV)


def test_corrupt_and_truncated_gzip_name_the_line(tmp_path):
    data = _jsonl(ROWS * 2000)
    whole = gzip.compress(data, mtime=0)
    p = tmp_path / "cut.jsonl.gz"
    p.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataFormatError, match=r"cut\.jsonl\.gz:\d+: the gzip data is corrupt or truncated"):
        load_table(p, **ARXIV)
    broken = bytearray(whole)
    broken[len(whole) // 2] ^= 0xFF
    p.write_bytes(bytes(broken))
    with pytest.raises(DataFormatError, match=r"cut\.jsonl\.gz:\d+: (the gzip data is corrupt|invalid JSON|not valid UTF-8)"):
        load_table(p, **ARXIV)


def test_gzip_names_that_are_refused(tmp_path):
    for name in ("a.txt.gz", "a.conll.gz", "a.gz"):
        p = _write(tmp_path / name, b"x\n", True)
        with pytest.raises(SourceError, match="gzip is read for JSON Lines, CSV and TSV tables"):
            guess_format(p)
    with pytest.raises(SourceError, match="a compressed Parquet file is not read"):
        load_table(_write(tmp_path / "a.parquet.gz", b"x", True))
    for name, what in (("a.jsonl.zst", "zst files are not read"), ("a.zip", "zip files are not read"), ("a.txt.xz", "xz is read for JSON Lines")):
        p = tmp_path / name
        p.write_bytes(b"x")
        with pytest.raises(SourceError, match=what):
            guess_format(p)


def test_format_as_an_option():
    assert split_format(None, {"format": "jsonl", "unit": "sentence"}) == ("jsonl", {"unit": "sentence"})
    assert split_format("csv", {"x": 1}) == ("csv", {"x": 1})
    with pytest.raises(SourceError, match="the format is given twice"):
        split_format("csv", {"format": "jsonl"})


# ---- unit = "sentence" ----------------------------------------------------------------------------
def test_sentence_unit_examples_in_order_with_one_note(tmp_path):
    p = _write(tmp_path / "a.jsonl.gz", _jsonl(ROWS), True)
    c = load_table(p, unit="sentence", timestamp_column="published", **ARXIV)
    assert [e.text for e in c.examples("Ada")] == [
        "first paper .", "it has two sentences .", "second paper !", "fig . 3 shows 2 . 5x gains .", "done ?",
    ]
    assert [e.text for e in c.examples("Bob")] == ["one sentence , e . g . this one ."]
    assert [e.timestamp for e in c.examples("Ada")] == [1704153600.0] * 2 + [1704326400.0] * 3
    assert len(c.notes) == 1 and "examples are sentences (unit='sentence'): 3 rows of a.jsonl.gz split into 6 sentences" in c.notes[0]
    assert (c.info["split_rows"], c.info["sentences"], c.info["unit"]) == (3, 6, "sentence")
    rows = load_table(p, **ARXIV)  # the default stays one example per row, with no note
    assert rows.num_examples == 3 and rows.notes == []
    assert rows.examples("Bob")[0].text == normalize(ROWS[1]["abstract"])


def test_sentence_unit_refusals(tmp_path):
    p = _write(tmp_path / "a.jsonl", _jsonl(ROWS), False)
    with pytest.raises(SourceError, match="unit must be one of 'row', 'sentence', got 'sentences'"):
        load_table(p, unit="sentences", **ARXIV)
    with pytest.raises(SourceError, match="unit='sentence' splits text"):
        load_table(p, unit="sentence", tokens_column="t", tags_column="g", **ARXIV)


def test_the_committed_arxiv_slice():
    """The slice's users are whole first authors (README: one user per first author); every
    abstract gives at least one sentence, in source order."""
    rows = [json.loads(line) for line in gzip.open(SLICE)]
    c = open_corpus(str(SLICE), unit="sentence", **ARXIV)
    assert (len(rows), c.num_users) == (3295, 2198)
    assert set(c.user_ids) == {r["first_author"] for r in rows}
    assert c.info["split_rows"] == 3295 and c.num_examples == c.info["sentences"] > 3295 * 5
    first = rows[0]
    want = [normalize(s) for s in prose_sentences(first["abstract"])]
    assert [e.text for e in c.examples(first["first_author"])][: len(want)] == want
    assert all(len(e.text.split()) < 400 for e in c.records())  # no abstract left unsplit as one example


def test_the_documented_options_read_the_slice():
    """docs/data.md's [data] snippet, pointed at the slice, gives the slice's users and the note the page quotes."""
    import re
    import tomllib

    page = (Path(__file__).resolve().parents[2] / "docs" / "data.md").read_text()
    (snippet,) = [b for b in re.findall(r"```toml\n(.*?)```", page, flags=re.S) if "arxiv-csai" in b]
    data = tomllib.loads(snippet)["data"]
    assert data["source"] == "../shared/data/arxiv-csai/abstracts.jsonl.gz"
    c = open_corpus(str(SLICE), **data["options"])
    assert c.num_users == 2198
    quoted = re.search(r"note: (examples are sentences .*)", page).group(1)
    assert re.sub(r"[\d,]+ rows of \S+ split into [\d,]+", "", quoted) == re.sub(r"[\d,]+ rows of \S+ split into [\d,]+", "", c.notes[0])


def test_the_device_calls_stripped_corpus_reads_as_the_original(tmp_path):
    """experiments/arxiv_device_call.sh's `corpus` step keeps only first_author and abstract: the
    loader gives the same users, sentences and order as from the full file (the device report's
    source is that copy); a file it cannot read fails the step instead of writing a partial copy."""
    import os
    import subprocess

    script = Path(__file__).resolve().parents[2] / "experiments" / "arxiv_device_call.sh"
    env = {**os.environ, "SRC": str(SLICE), "DEST": "s.jsonl.gz"}  # DEST relative to the caller's directory
    subprocess.run(["bash", str(script), "corpus"], env=env, cwd=tmp_path, check=True)
    stripped = [json.loads(line) for line in gzip.open(tmp_path / "s.jsonl.gz")]
    assert set(stripped[0]) == {"first_author", "abstract"} and len(stripped) == 3295
    full, small = (open_corpus(str(p), unit="sentence", **ARXIV) for p in (SLICE, tmp_path / "s.jsonl.gz"))
    assert small.user_ids == full.user_ids
    assert [(u, [e.text for e in ex]) for u, ex in small.users()] == [(u, [e.text for e in ex]) for u, ex in full.users()]
    good = (tmp_path / "s.jsonl.gz").read_bytes()
    truncated = tmp_path / "truncated.gz"
    truncated.write_bytes(SLICE.read_bytes()[: SLICE.stat().st_size // 2])
    for src in (tmp_path / "missing.gz", truncated):
        bad = subprocess.run(["bash", str(script), "corpus"], env={**env, "SRC": str(src)}, cwd=tmp_path, capture_output=True)
        assert bad.returncode != 0
        assert (tmp_path / "s.jsonl.gz").read_bytes() == good  # the earlier copy is left as it was
        assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl.gz", "truncated.gz"]  # no partial file
    usage = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert usage.returncode == 2 and "prepare|corpus|run" in usage.stderr
