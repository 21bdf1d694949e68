"""Generated bad data files (issue #26): real, valid files of every file format fedpriv reads,
damaged the way real files get damaged, through the loader users meet (``open_corpus``, then
``inspect_corpus``: what ``fedpriv data inspect`` and training run).

Each generated file must be EITHER read, with sane contents (tokens and tags of equal length, no
empty or NUL tokens, normalized texts, every string valid Unicode, statistics that serialize), OR
refused with a :class:`~fedpriv.errors.FedprivError` whose message is one line naming the file
and, where the problem is at a line, that line (which must exist; an invalid UTF-8 line must be
the file's first). Never a raw Python exception: the CLI prints those as "internal error".

The seeds are cut from the real samples in tests/data (NCBI-disease, WNUT-17, the coffee Stack
Exchange dump) and ../shared/data (tiny-shakespeare), plus a CoNLL-U and a CoNLL-2003 snippet and
tables made from them. Hypothesis is derandomized, so every run tries the same files.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from fedpriv.data.inspect import inspect_corpus
from fedpriv.data.sources import open_corpus
from fedpriv.data.tokenize import normalize
from fedpriv.errors import DataFormatError, FedprivError

ROOT = Path(__file__).parents[2]
DATA = ROOT / "tests" / "data"
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
_TAG = re.compile(r"^(O|[BIESLU]-\S+)$")


# ---- seeds: small valid files of each format --------------------------------------------------------


def _sentences(path: Path, n: int) -> str:
    """The first ``n`` sentences of a CoNLL file, with the blank lines between them as they are
    (WNUT-17's hold a tab)."""
    out: list[str] = []
    with open(path, encoding="utf-8", newline="") as f:
        for line in f:
            if not line.strip() and out and out[-1].strip():
                n -= 1
                if n == 0:
                    break
            out.append(line)
    return "".join(out)


def _tagged(text: str) -> list[tuple[list[str], list[str]]]:
    out = []
    for block in re.split(r"\n\s*\n", text.strip()):
        rows = [line.split("\t") for line in block.splitlines()]
        out.append(([r[0] for r in rows], [r[-1] for r in rows]))
    return out


def _posts_xml() -> str:
    lines = (DATA / "stackexchange-coffee" / "Posts.xml").read_text(encoding="utf-8-sig").splitlines()
    rows = [line for line in lines if line.lstrip().startswith("<row ")][:4]
    return '<?xml version="1.0" encoding="utf-8"?>\n<posts>\n' + "\n".join(rows) + "\n</posts>\n"


def _shakespeare() -> str:
    if SHAKESPEARE.is_file():
        text = SHAKESPEARE.read_text(encoding="utf-8")
    else:  # the same file is bundled with the package
        from fedpriv.data.shakespeare import bundled_path

        text = bundled_path().read_text(encoding="utf-8")
    return "\n\n".join(text.split("\n\n")[:8]) + "\n"


CONLLU = """# newdoc id = answers-0001
# sent_id = answers-0001-1
# text = where can I get morcillas in tampa bay
1\twhere\tO\tADV\t_
2\tcan\tO\tAUX\t_
3\tI\tO\tPRON\t_
4\tget\tO\tVERB\t_
5\tmorcillas\tO\tNOUN\t_
6\tin\tO\tADP\t_
7\ttampa\tB-LOC\tPROPN\t_
8\tbay\tI-LOC\tPROPN\t_

# newdoc id = email-0001
# sent_id = email-0001-1
# text = Mr. Müller went to Zürich .
1\tMr.\tB-PER\tPROPN\t_
2\tMüller\tI-PER\tPROPN\t_
3-4\twent to\t_\t_\t_
3\twent\tO\tVERB\t_
4\tto\tO\tADP\t_
5\tZürich\tB-LOC\tPROPN\t_
6\t.\tO\tPUNCT\t_
"""

CONLL2003 = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
. . O O

-DOCSTART- -X- -X- O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
"""


@dataclass(frozen=True)
class Seed:
    """One valid file: its name (the suffix picks the loader), bytes and loader options."""

    name: str
    text: bytes
    kind: str  # "tagged" or "text"
    family: str  # which structural mutations apply: conll, text, xml, json, csv, binary
    format: str | None = None
    options: dict = field(default_factory=dict)
    strict_tags: bool = False  # the loader checks tags (CoNLL): every tag read is O or P-TYPE


def _table_rows() -> list[dict]:
    ncbi = _tagged(_sentences(DATA / "ncbi-disease" / "train.tsv", 4))
    texts = [" ".join(t) for t, _ in ncbi]
    return [{"user_id": f"u{i % 3}", "text": t, "tokens": tk, "tags": tg} for i, (t, (tk, tg)) in enumerate(zip(texts, ncbi))]


def _csv(rows: list[dict], cols: list[str], delimiter: str) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, delimiter=delimiter, lineterminator="\n")
    w.writerow(cols)
    for r in rows:
        w.writerow([" ".join(r[c]) if isinstance(r[c], list) else r[c] for c in cols])
    return buf.getvalue().encode("utf-8")


def _binary_seeds(tmp: Path) -> list[Seed]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fedpriv.data.tff_sqlite import write_tff_sqlite

    rows = _table_rows()
    pq.write_table(pa.Table.from_pylist([{k: r[k] for k in ("user_id", "text")} for r in rows]), tmp / "posts.parquet")
    clients = {r["user_id"]: [] for r in rows}
    for r in rows:
        clients[r["user_id"]].append({"tokens": normalize(r["text"]), "creation_date": 1_420_000_000, "title": "t"})
    write_tff_sqlite(tmp / "so.sqlite", clients)
    return [
        Seed("posts.parquet", (tmp / "posts.parquet").read_bytes(), "text", "binary"),
        Seed("so.sqlite", (tmp / "so.sqlite").read_bytes(), "text", "binary"),
    ]


def _seeds() -> list[Seed]:
    rows = _table_rows()
    jsonl_text = "".join(json.dumps({k: r[k] for k in ("user_id", "text")}, ensure_ascii=False) + "\n" for r in rows)
    jsonl_tagged = "".join(json.dumps({k: r[k] for k in ("user_id", "tokens", "tags")}) + "\n" for r in rows)
    tagged = {"tokens_column": "tokens", "tags_column": "tags"}
    with tempfile.TemporaryDirectory() as d:
        binary = _binary_seeds(Path(d))
    return [
        Seed("train.tsv", _sentences(DATA / "ncbi-disease" / "train.tsv", 4).encode(), "tagged", "conll", strict_tags=True),
        Seed("wnut17.conll", _sentences(DATA / "wnut17" / "wnut17train.conll", 3).encode(), "tagged", "conll", strict_tags=True),
        Seed("ud.conllu", CONLLU.encode(), "tagged", "conll", strict_tags=True),
        Seed("eng.bio", CONLL2003.encode(), "tagged", "conll", strict_tags=True),
        Seed("plays.txt", _shakespeare().encode(), "text", "text"),
        Seed("input.txt", _shakespeare().encode(), "text", "text", format="shakespeare-text"),
        Seed("Posts.xml", _posts_xml().encode(), "text", "xml"),
        Seed("posts.jsonl", jsonl_text.encode(), "text", "json"),
        Seed("ner.jsonl", jsonl_tagged.encode(), "tagged", "json", options=tagged),
        Seed("posts.csv", _csv(rows, ["user_id", "text"], ","), "text", "csv"),
        Seed("ner.csv", _csv(rows, ["user_id", "tokens", "tags"], ","), "tagged", "csv", options=tagged),
        Seed("posts.tsv", _csv(rows, ["user_id", "text"], "\t"), "text", "csv"),
        *binary,
    ]


SEEDS = {s.name: s for s in _seeds()}


# ---- mutations: what happens to real files ----------------------------------------------------------


class Draw:
    """Random choices, from Hypothesis (``st.data()``) or from a seeded ``random.Random``."""

    def __init__(self, data=None, rng: random.Random | None = None):  # noqa: ANN001
        self.data, self.rng = data, rng

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi)) if self.data is not None else self.rng.randint(lo, hi)

    def choice(self, options: Sequence):  # noqa: ANN201
        return self.data.draw(st.sampled_from(options)) if self.data is not None else self.rng.choice(list(options))

    def bytes(self, lo: int, hi: int) -> bytes:
        if self.data is not None:
            return self.data.draw(st.binary(min_size=lo, max_size=hi))
        return bytes(self.rng.randrange(256) for _ in range(self.rng.randint(lo, hi)))

    def text(self, hi: int) -> str:
        if self.data is not None:
            return self.data.draw(st.text(max_size=hi))
        pool = "aZ09 \t-_.,;:'\"<>&#{}[]\\/é€\u00a0\u200b\ufeff\x00\x1f\ud800"
        return "".join(self.rng.choice(pool) for _ in range(self.rng.randint(0, hi)))


def _lines(b: bytes) -> list[bytes]:
    return b.split(b"\n")


def _at_line(b: bytes, d: Draw, fn: Callable[[bytes], bytes]) -> bytes:
    """``fn`` applied to one line (a line with content when there is one)."""
    lines = _lines(b)
    full = [i for i, line in enumerate(lines) if line.strip()] or list(range(len(lines)))
    i = d.choice(full)
    lines[i] = fn(lines[i])
    return b"\n".join(lines)


def _on_lines(b: bytes, d: Draw, fn: Callable[[bytes], bytes]) -> bytes:
    """``fn`` applied to every line, every second or every third line (as files edited by hand)."""
    every = d.int(1, 3)
    return b"\n".join(fn(line) if i % every == 0 else line for i, line in enumerate(_lines(b)))


def _insert(b: bytes, d: Draw, piece: bytes, line_start: bool = False) -> bytes:
    if line_start:
        cuts = [0] + [m.end() for m in re.finditer(rb"\n", b)]
        i = d.choice(cuts)
    else:
        i = d.int(0, len(b))
    return b[:i] + piece + b[i:]


def _re_encode(b: bytes, d: Draw, codec: str, extra: str) -> bytes:
    """The file's text saved in another encoding, with ``extra`` (non-ASCII) put in a word so the
    encoding shows."""
    s = b.decode("utf-8", "replace")
    spots = [m.end() for m in re.finditer(r"\w", s)] or [0]
    i = d.choice(spots[:200])
    return (s[:i] + extra + s[i:]).encode(codec, "replace")


def _last_field(line: bytes, new: bytes | None) -> bytes:
    sep = b"\t" if b"\t" in line else b" "
    head, _, _ = line.rstrip(b"\r").rpartition(sep)
    if not head:
        return line
    return head if new is None else head + sep + new


FORMAT_TOKENS = {
    "conll": ["-DOCSTART- -X- O", "# newdoc id = d2", "# text = x", "#", "1-2\tx\t_\t_\t_", "1.1\tx\tO", "B-", "I-PER", "O", "-", "_", "\t", " ", "\t\t"],
    "text": ["ALL:", ":", "First Citizen:", "\t", "#"],
    "xml": ["<", ">", "&", "&bogus;", '"', "</row>", "<row/>", "</posts>", "<posts>", "<!--", "<![CDATA[", "&#0;", "&#xD800;", "<row OwnerUserId='1' Body='x'/>",
            ' OwnerUserId=""', ' CreationDate="yesterday"', ' CreationDate="99999-01-01T00:00:00"', ' Title="&lt;b&gt;&#x85;"', '<?xml version="1.0"?>',
            '<!DOCTYPE posts [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;"><!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]>'],
    "json": ['"', "{", "}", "[", "]", ",", ":", "null", "1e999", "NaN", '"\\ud800"', '"\\u0000"', '{"user_id": null}', '{"user_id": 1, "text": 2}', '{"user_id": "x", "tokens": ["a", ""], "tags": ["O", ""]}', "[]"],
    "csv": ['"', ",", '""', "\t", "\r", '"a\nb"', "user_id"],
    "binary": [],
}
XML_ENCODINGS = [b"tf-8", b"utf-16", b"utf-32", b"euc-jp", b"latin-1", b"ascii", b"cp1252", b"bogus", b"", b"idna", b"rot13"]
LONG_UNITS = ["a", "ab ", "\t", "é", "<", '"', ",", "O\t", "x\tO ", "{"]


def _mutations(seed: Seed) -> dict[str, Callable[[bytes, Draw], bytes]]:
    """The mutations that fit a seed's format: name -> function of (bytes, draw)."""
    binary: dict[str, Callable[[bytes, Draw], bytes]] = {
        "truncate": lambda b, d: b[: d.int(0, max(len(b) - 1, 0))],
        "insert random bytes": lambda b, d: _insert(b, d, d.bytes(1, 16)),
        "overwrite bytes": lambda b, d: (lambda i, r: b[:i] + r + b[i + len(r) :])(d.int(0, len(b)), d.bytes(1, 16)),
        "delete bytes": lambda b, d: (lambda i: b[:i] + b[i + d.int(1, 64) :])(d.int(0, len(b))),
        "zero a page": lambda b, d: (lambda i: b[:i] + bytes(min(512, len(b) - i)) + b[i + 512 :])(d.int(0, len(b))),
        "empty file": lambda b, d: b"",
        "NUL bytes": lambda b, d: _insert(b, d, b"\x00" * d.int(1, 3)),
    }
    if seed.family == "binary":
        return binary
    tokens = FORMAT_TOKENS[seed.family]
    text: dict[str, Callable[[bytes, Draw], bytes]] = {
        **binary,
        "Latin-1": lambda b, d: _re_encode(b, d, "latin-1", "é"),
        "Windows-1252": lambda b, d: _re_encode(b, d, "cp1252", "\u201cquoted\u201d"),
        "UTF-16 with BOM": lambda b, d: _re_encode(b, d, "utf-16", ""),
        "UTF-16-LE without BOM": lambda b, d: _re_encode(b, d, "utf-16-le", ""),
        "UTF-8 BOM at the start": lambda b, d: b"\xef\xbb\xbf" + b,
        "BOM inside (concatenated files)": lambda b, d: _insert(b, d, b"\xef\xbb\xbf", line_start=d.choice([True, False])),
        "CRLF": lambda b, d: b.replace(b"\n", b"\r\n"),
        "CR only": lambda b, d: b.replace(b"\n", b"\r"),
        "mixed line endings": lambda b, d: _on_lines(b, d, lambda line: line + b"\r"),
        "no final newline": lambda b, d: b.rstrip(b"\r\n"),
        "tabs to spaces": lambda b, d: _on_lines(b, d, lambda line: line.replace(b"\t", d.choice([b" ", b"    "]))),
        "spaces to tabs": lambda b, d: _on_lines(b, d, lambda line: line.replace(b" ", b"\t")),
        "missing column": lambda b, d: _at_line(b, d, lambda line: _last_field(line, None)),
        "extra column": lambda b, d: _at_line(b, d, lambda line: line + d.choice([b"\tX", b" X", b"\t", b",x", b"\t\t"])),
        "garbage tag": lambda b, d: _at_line(b, d, lambda line: _last_field(line, d.text(12).encode("utf-8", "surrogatepass"))),
        "blank lines doubled": lambda b, d: b.replace(b"\n\n", b"\n\n\n") if b"\n\n" in b else b.replace(b"\n", b"\n\n"),
        "blank lines removed": lambda b, d: re.sub(rb"\n(\s*\n)+", b"\n", b),
        "blank line inserted": lambda b, d: _insert(b, d, d.choice([b"\n", b" \n", b"\t\n", b"\r\n"]), line_start=True),
        "line deleted": lambda b, d: (lambda ls, i: b"\n".join(ls[:i] + ls[i + 1 :]))(_lines(b), d.int(0, len(_lines(b)) - 1)),
        "line duplicated": lambda b, d: (lambda ls, i: b"\n".join(ls[: i + 1] + ls[i:]))(_lines(b), d.int(0, len(_lines(b)) - 1)),
        "lines swapped": lambda b, d: (lambda ls, i, j: b"\n".join(_swap(ls, i, j)))(_lines(b), d.int(0, len(_lines(b)) - 1), d.int(0, len(_lines(b)) - 1)),
        "very long line": lambda b, d: _insert(b, d, (d.choice(LONG_UNITS) * 100_000).encode()[:200_000] + d.choice([b"\n", b""]), line_start=d.choice([True, False])),
        "only whitespace": lambda b, d: "".join(d.choice([" ", "\t", "\n", "\r\n", "\r", "\x0b", "\x0c", "\u00a0", "\u3000"]) for _ in range(d.int(1, 40))).encode(),
        "random text inserted": lambda b, d: _insert(b, d, d.text(20).encode("utf-8", "surrogatepass")),
    }
    if seed.family == "xml":
        text["declared encoding changed"] = lambda b, d: re.sub(rb'encoding="[^"]*"', b'encoding="' + d.choice(XML_ENCODINGS) + b'"', b, count=1)
    if tokens:
        text["format token inserted"] = lambda b, d: _insert(b, d, d.choice(tokens).encode("utf-8", "surrogatepass"), line_start=d.choice([True, False]))
    return text


def _swap(lines: list[bytes], i: int, j: int) -> list[bytes]:
    lines = list(lines)
    lines[i], lines[j] = lines[j], lines[i]
    return lines


def mutate(seed: Seed, d: Draw) -> tuple[bytes, list[str]]:
    """The seed's bytes after one to three mutations; returns the bytes and the mutations' names."""
    table = _mutations(seed)
    names = sorted(table)
    b, done = seed.text, []
    for _ in range(d.int(1, 3)):
        name = d.choice(names)
        b = table[name](b, d)
        done.append(name)
    return b, done


# ---- the oracle -------------------------------------------------------------------------------------

#: Refusals that are about the whole file, not a line of it (no line number to give).
WHOLE_FILE = re.compile(
    r"no examples|no sentences|has no users|produced no examples|the file is empty|not a readable (SQLite|Parquet) file|not a TFF SQLite file"
    r"|table '\w+' lacks columns|no split 'train'|cannot tell the format"
)


def _valid_utf8(line: bytes) -> bool:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def check_refusal(path: Path, data: bytes, seed: Seed, e: FedprivError) -> None:
    msg = str(e)
    assert "\n" not in msg and "\r" not in msg, f"a message of more than one line: {msg!r}"
    assert str(path) in msg, f"the message does not name the file: {msg!r}"
    if isinstance(e, DataFormatError) and isinstance(e.where, int):
        lines = data.count(b"\n") + data.count(b"\r") + 1  # expat also counts a lone CR as a line break
        assert 1 <= e.where <= lines, f"line {e.where} of a file of {lines} lines: {msg!r}"
        assert msg.startswith(f"{path}:{e.where}: "), msg
        if "not valid UTF-8" in msg:
            first_bad = next((i for i, line in enumerate(data.split(b"\n"), start=1) if not _valid_utf8(line)), None)
            assert e.where == first_bad, f"invalid UTF-8 first at line {first_bad}, reported at {e.where}: {msg!r}"
    elif not (isinstance(e, DataFormatError) and e.where is not None):
        assert WHOLE_FILE.search(msg), f"a refusal that names no line or record: {msg!r}"


def check_sane(corpus, stats: dict, seed: Seed) -> None:  # noqa: ANN001
    assert corpus.kind == seed.kind or seed.name.endswith(".tsv"), (corpus.kind, seed.kind)  # a .tsv is a table or CoNLL by its header
    counts = corpus.counts()
    assert corpus.num_users == len(corpus.user_ids) == len(counts) >= 1
    seen = 0
    for user, examples in corpus.users():
        assert isinstance(user, str) and user.strip(), repr(user)
        user.encode("utf-8")
        assert examples, f"user {user!r} has no examples"
        seen += len(examples)
        for ex in examples:
            if corpus.kind == "tagged":
                assert len(ex.tokens) == len(ex.tags) >= 1, ex
                for tok, tag in zip(ex.tokens, ex.tags):
                    assert isinstance(tok, str) and tok.strip() and "\x00" not in tok, f"bad token {tok!r} in {ex}"
                    assert isinstance(tag, str) and tag.strip() and "\x00" not in tag, f"bad tag {tag!r} in {ex}"
                    tok.encode("utf-8"), tag.encode("utf-8")
                    if seed.strict_tags:
                        assert _TAG.match(tag), f"tag {tag!r} read from a CoNLL file"
            else:
                text = ex.text
                assert isinstance(text, str) and text.strip(), f"empty text {text!r}"
                assert text == " ".join(text.split()), f"text not space-separated tokens: {text!r}"
                assert "\x00" not in text, f"NUL in {text!r}"
                text.encode("utf-8")
                if seed.family != "binary":  # the TFF file holds tokens as written
                    assert normalize(text) == text, f"text not normalized: {text!r}"
    assert seen == corpus.num_examples == int(counts.sum()) == stats["examples"] >= 1
    json.dumps(stats)


def load(path: Path, seed: Seed) -> tuple[str, object]:
    """What ``fedpriv data inspect PATH`` does, in-process: ("loaded", stats) or ("refused", error)."""
    try:
        corpus = open_corpus(str(path), format=seed.format, **seed.options)
        stats = inspect_corpus(corpus)
    except FedprivError as e:
        return "refused", e
    check_sane(corpus, stats, seed)
    return "loaded", stats


def check_file(path: Path, data: bytes, seed: Seed) -> tuple[str, object]:
    path.write_bytes(data)
    outcome, what = load(path, seed)
    if outcome == "refused":
        check_refusal(path, data, seed, what)  # type: ignore[arg-type]
    elif seed.family in ("conll", "text", "json", "csv"):
        body = data.removeprefix(b"\xef\xbb\xbf")
        assert _valid_utf8(body), "a file that is not UTF-8 was read"
    return outcome, what


# ---- the tests --------------------------------------------------------------------------------------


def test_every_seed_is_read():
    """The seeds are valid: the fuzzer damages files that load, so a refusal is the damage's."""
    with tempfile.TemporaryDirectory() as d:
        for seed in SEEDS.values():
            outcome, what = check_file(Path(d) / seed.name, seed.text, seed)
            assert outcome == "loaded", (seed.name, what)


def _corpus_of(path: Path, seed: Seed) -> list:
    corpus = open_corpus(str(path), format=seed.format, **seed.options)
    return [(u, [ex.to_json() for ex in exs]) for u, exs in corpus.users()]


@pytest.mark.parametrize("change", ["UTF-8 BOM", "CRLF"])
@pytest.mark.parametrize("name", [n for n, s in SEEDS.items() if s.family != "binary"])
def test_a_bom_or_crlf_changes_nothing(name, change, tmp_path):
    """A UTF-8 BOM (as Windows editors write) or CRLF line endings read as the same corpus."""
    seed = SEEDS[name]
    plain, changed = tmp_path / "a" / name, tmp_path / "b" / name
    plain.parent.mkdir(), changed.parent.mkdir()
    plain.write_bytes(seed.text)
    changed.write_bytes(b"\xef\xbb\xbf" + seed.text if change == "UTF-8 BOM" else seed.text.replace(b"\n", b"\r\n"))
    assert _corpus_of(changed, seed) == _corpus_of(plain, seed)


def _fuzz(name: str):  # noqa: ANN202
    seed = SEEDS[name]

    @settings(max_examples=300 if seed.family != "binary" else 100, derandomize=True, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data())
    def run(data) -> None:  # noqa: ANN001
        b, done = mutate(seed, Draw(data))
        note(f"mutations: {done}; file: {b[:300]!r}{'...' if len(b) > 300 else ''}")
        with tempfile.TemporaryDirectory() as d:
            check_file(Path(d) / seed.name, b, seed)

    return run


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_generated_bad_files_are_read_sanely_or_refused_in_one_line(name):
    _fuzz(name)()


def _zero_page(b: bytes) -> bytes:
    return b[:1] + bytes(512) + b[513:]


def _bad_utf8_in_parquet(b: bytes) -> bytes:
    i = b.index(b"dentification") - 1  # the first text's first byte (stored as a literal)
    return b[:i] + b"\x80" + b[i + 1 :]


def _sqlite(change: str) -> Callable[[bytes], bytes]:
    """The TFF SQLite seed after SQL statements (what a foreign tool or damage may leave)."""

    def make(b: bytes) -> bytes:
        import sqlite3

        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "so.sqlite"
            path.write_bytes(b)
            con = sqlite3.connect(path)
            con.executescript(change)
            con.commit()
            con.close()
            return path.read_bytes()

    return make


def _tff_tokens(tokens: str) -> Callable[[bytes], bytes]:
    """A TFF SQLite file of one example whose ``tokens`` feature is ``tokens``."""

    def make(b: bytes) -> bytes:
        from fedpriv.data.tff_sqlite import write_tff_sqlite

        with tempfile.TemporaryDirectory() as d:
            return write_tff_sqlite(Path(d) / "so.sqlite", {"u0": [{"tokens": tokens}]}).read_bytes()

    return make


# The bugs the fuzzer found, each as its smallest input: a raw exception ("internal error"), a
# silent misread, or a message that was not one line naming the file. ``expect``: "loaded", or
# what the refusal says after "FILE".
REPRODUCERS = [
    pytest.param("input.txt", lambda b: b"F\xe9irst Citizen:\nBefore we proceed.\n", ":1: not valid UTF-8 (invalid continuation byte at byte 1 of the line)",
                 id="shakespeare-latin1-was-UnicodeDecodeError"),
    pytest.param("input.txt", lambda b: b"\xef\xbb\xbfFirst Citizen:\nBefore we proceed.\n", "loaded", id="shakespeare-bom-was-refused"),
    pytest.param("input.txt", lambda b: b"", ": no examples (no 'SPEAKER:' turn with text)", id="shakespeare-empty-named-no-file"),
    pytest.param("plays.txt", lambda b: "First Citizen:\n".encode("utf-16-le"), ":1: NUL byte at column 2", id="utf16le-text-was-read-as-NUL-tokens"),
    pytest.param("eng.bio", lambda b: b"\x00" + b, ":1: NUL byte at column 1", id="conll-NUL-was-in-a-token"),
    pytest.param("ner.jsonl", lambda b: b'{"user_id": "x", "tokens": ["a", ""], "tags": ["O", ""]}\n', ":1: column 'tokens': item 2 is empty", id="jsonl-empty-token-was-read"),
    pytest.param("ner.jsonl", lambda b: b'{"user_id": "x", "tokens": ["a", " "], "tags": ["O", "O"]}\n', ":1: column 'tokens': item 2 is only whitespace", id="jsonl-blank-token-was-read"),
    pytest.param("posts.jsonl", lambda b: b'{"user_id": "x", "text": "a\\u0000b"}\n', ":1: column 'text' holds a NUL character", id="jsonl-escaped-NUL-was-a-token"),
    pytest.param("Posts.xml", lambda b: b.replace(b'encoding="utf-8"', b'encoding="tf-8"'), ":1: the encoding in the XML declaration cannot be read (unknown encoding: tf-8)",
                 id="xml-unknown-encoding-was-LookupError"),
    pytest.param("Posts.xml", lambda b: b.replace(b'encoding="utf-8"', b'encoding="euc-jp"'), ":1: the encoding in the XML declaration cannot be read (multi-byte encodings",
                 id="xml-multibyte-encoding-was-ValueError"),
    pytest.param("so.sqlite", _sqlite("PRAGMA writable_schema = ON; UPDATE sqlite_master SET name = CAST(X'7461626C6580' AS TEXT) WHERE name = 'client_metadata'"),
                 ": not a readable SQLite file (a text value is not valid UTF-8: invalid start byte)", id="sqlite-non-utf8-text-was-UnicodeDecodeError"),
    pytest.param("so.sqlite", _sqlite("UPDATE client_metadata SET num_examples = 'many' WHERE client_id = 'u1'"),
                 " (client_metadata, client u1): num_examples 'many' is not a count", id="sqlite-text-count-was-ValueError"),
    pytest.param("so.sqlite", _sqlite("UPDATE client_metadata SET num_examples = 10 WHERE client_id = 'u0'"),
                 " (client u0): client_metadata gives 10 examples but table 'examples' holds 2", id="tff-metadata-count-was-trusted"),
    pytest.param("so.sqlite", _tff_tokens("\x00he adenomatous polyposis"), " (client u0, row 1): feature 'tokens' holds a NUL byte", id="tff-NUL-token-was-read"),
    pytest.param("posts.parquet", _zero_page, " (after row 0): cannot read the Parquet data: ", id="parquet-message-was-several-lines"),
    pytest.param("posts.parquet", lambda b: (lambda i: b[:i] + b"\x80" + b[i + 1 :])(b.index(b"user_id", b.index(b"dentification"))),  # the footer schema's first name
                 ": not a readable Parquet file: a name in its schema is not valid UTF-8", id="parquet-bad-utf8-name-was-UnicodeDecodeError"),
    pytest.param("posts.parquet", _bad_utf8_in_parquet, " (row 1): column 'text' is not valid UTF-8", id="parquet-bad-utf8-was-UnicodeDecodeError"),
]


@pytest.mark.parametrize("name, make, expect", REPRODUCERS)
def test_reproducers(name, make, expect, tmp_path):
    seed = SEEDS[name]
    path = tmp_path / name
    outcome, what = check_file(path, make(seed.text), seed)
    if expect == "loaded":
        assert outcome == "loaded", what
    else:
        assert outcome == "refused" and str(what).startswith(f"{path}{expect}"), what


def test_a_bom_at_the_start_of_a_later_line_is_dropped(tmp_path):
    """Files joined with ``cat``, each with its BOM, read as the same files joined without them
    (a CoNLL-2003 ``-DOCSTART-`` after a BOM used to become a token)."""
    for seed in SEEDS.values():
        if seed.family not in ("conll", "text", "json"):
            continue
        plain, joined = tmp_path / "plain" / seed.name, tmp_path / "joined" / seed.name
        plain.parent.mkdir(exist_ok=True), joined.parent.mkdir(exist_ok=True)
        plain.write_bytes(seed.text + seed.text)
        joined.write_bytes(b"\xef\xbb\xbf" + seed.text + b"\xef\xbb\xbf" + seed.text)
        assert _corpus_of(joined, seed) == _corpus_of(plain, seed), seed.name


# ---- a sample through the real command --------------------------------------------------------------


def test_a_sample_of_generated_files_through_fedpriv_data_inspect(tmp_path):
    """Five generated files (a fixed seed) through ``python -m fedpriv.cli data inspect``: exit 0 or
    2, one stderr line and no "internal error"; the same line as the loader's in-process error."""
    rng = random.Random(2604)
    names = ["train.tsv", "Posts.xml", "ner.jsonl", "posts.csv", "input.txt"]
    env = {k: v for k, v in os.environ.items() if k != "FEDPRIV_DEBUG"}
    outcomes = []
    for i, name in enumerate(names):
        seed = SEEDS[name]
        b, done = mutate(seed, Draw(rng=rng))
        path = tmp_path / str(i) / name
        path.parent.mkdir()
        outcome, what = check_file(path, b, seed)
        outcomes.append(outcome)
        args = [sys.executable, "-m", "fedpriv.cli", "data", "inspect", str(path), "--json"]
        args += [a for k, v in seed.options.items() for a in ("-o", f"{k}={v}")] + (["--format", seed.format] if seed.format else [])
        proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
        info = (name, done, proc.stderr)
        assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, info
        if outcome == "refused":
            assert proc.returncode == 2, info
            assert proc.stderr == f"fedpriv: error: {what}\n", info
        else:
            assert proc.returncode == 0 and proc.stderr == "", info
            assert json.loads(proc.stdout)["examples"] == what["examples"], info  # type: ignore[index]
    assert {"refused", "loaded"} <= set(outcomes), outcomes  # the sample exercises both exits
