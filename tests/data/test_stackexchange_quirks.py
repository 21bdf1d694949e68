"""Stack Exchange dumps as a fuzz found them: the automatic spill is private and deleted, one huge
attribute is parsed in large reads, and a dump that gives no example says why."""

from __future__ import annotations

import gc
import stat
import tempfile
from pathlib import Path

import pytest

import fedpriv.data.stackexchange as se
from fedpriv.data.stackexchange import iter_posts, load_stackexchange
from fedpriv.errors import DataFormatError, EmptyCorpusError

COFFEE = Path(__file__).parent / "stackexchange-coffee" / "Posts.xml"
HEAD = '<?xml version="1.0" encoding="utf-8"?>\n<posts>\n'


def posts(tmp_path: Path, *rows: str, name: str = "Posts.xml") -> Path:
    p = tmp_path / name
    p.write_text(HEAD + "".join(f"  {r}\n" for r in rows) + "</posts>\n", encoding="utf-8")
    return p


@pytest.fixture
def tmpdir_spill(tmp_path, monkeypatch):
    """Every dump spills automatically, into a temporary folder under tmp_path/tmp."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setattr(se, "SPILL_ABOVE_BYTES", 0)
    return tmp


# ---- the automatic spill -----------------------------------------------------------------------


def test_automatic_spill_is_private_said_and_deleted_when_unused(tmpdir_spill):
    corpus = load_stackexchange(COFFEE)
    spill = corpus.store.path
    assert spill.is_file() and tmpdir_spill in spill.parents
    assert stat.S_IMODE(spill.stat().st_mode) == 0o600
    assert stat.S_IMODE(spill.parent.stat().st_mode) == 0o700
    note = corpus.notes[0]
    assert "spilled to a temporary file" in note and str(spill) in note and "deleted when the corpus is no longer used and at exit" in note
    # the corpus reads, and a corpus derived from it keeps the file alive after the first is gone
    assert corpus.num_users == 115 and corpus.examples("4")[0].text == "how should i store whole bean coffee ?"
    sub = corpus.subset(list(corpus.user_ids)[:2])
    del corpus
    gc.collect()
    assert spill.is_file() and len(sub.examples(sub.user_ids[0])) > 0
    del sub
    gc.collect()
    assert not spill.exists() and not spill.parent.exists()
    assert list(tmpdir_spill.iterdir()) == []


def test_automatic_spill_gives_the_same_corpus(tmpdir_spill, monkeypatch):
    disk = load_stackexchange(COFFEE)
    monkeypatch.setattr(se, "SPILL_ABOVE_BYTES", 256 * 2**20)
    mem = load_stackexchange(COFFEE)
    assert list(disk.user_ids) == list(mem.user_ids)
    assert list(disk.records()) == list(mem.records())
    assert disk.notes[1:] == mem.notes and disk.info["posts"] == mem.info["posts"] == 592


def test_a_named_spill_file_is_never_deleted(tmpdir_spill, tmp_path):
    mine = tmp_path / "mine.sqlite"
    corpus = load_stackexchange(COFFEE, spill_to=mine)
    assert corpus.store.path == mine and not any("temporary file" in n for n in corpus.notes)
    del corpus
    gc.collect()
    assert mine.is_file()
    assert list(tmpdir_spill.iterdir()) == []


def test_a_failed_automatic_spill_leaves_nothing(tmpdir_spill, tmp_path):
    bad = posts(tmp_path, '<row Id="1" OwnerUserId="3" Body="x" />', '<row Id="2" OwnerUserId=3 />', name="Bad.xml")
    with pytest.raises(DataFormatError, match=r"Bad.xml:4: malformed XML"):
        load_stackexchange(bad)
    empty = posts(tmp_path, '<row Id="1" PostTypeId="1" Body="orphan" />', name="Empty.xml")
    with pytest.raises(EmptyCorpusError, match="without an OwnerUserId"):
        load_stackexchange(empty)
    assert list(tmpdir_spill.iterdir()) == []


# ---- large reads --------------------------------------------------------------------------------


def test_one_huge_attribute_is_read_whole(tmp_path):
    """A 3 MB Body (a token that spans many reads): read right, in few reads."""
    body = ("word " * 600_000).strip() + " ."
    p = posts(tmp_path, f'<row Id="1" PostTypeId="2" OwnerUserId="5" CreationDate="2015-01-27T20:09:32.720" Body="{body}" />', '<row Id="2" OwnerUserId="6" Title="Next post" />')
    seen: list[int] = []
    pairs = list(iter_posts(p, progress=seen.append))
    assert [u for u, _ in pairs] == ["5", "6"]
    assert pairs[0][1].text == body and pairs[1][1].text == "next post"
    assert seen[-1] == p.stat().st_size and len(seen) <= 4  # 1 MiB, then 2 MiB while the Body is open (16 KB reads: ~190)


def test_reads_are_large_and_shrink_back_after_an_element(tmp_path):
    class Source:
        def __init__(self):
            self.asked: list[int] = []

        def read(self, n):
            self.asked.append(n)
            return b"x" * n

    src = Source()
    reader = se._CountingReader(src, None)
    reader.read(16 * 1024)
    reader.read(16 * 1024)  # no element ended: twice as much
    reader.read(16 * 1024)
    reader.progressed = True
    reader.read(16 * 1024)
    assert src.asked == [se.READ_BYTES, 2 * se.READ_BYTES, 4 * se.READ_BYTES, se.READ_BYTES]
    for _ in range(20):
        reader.read(16 * 1024)
    assert max(src.asked) == se.READ_MAX_BYTES


def test_entities_stay_refused_and_errors_name_the_line(tmp_path):
    lol = tmp_path / "lol.xml"
    ents = "".join(f'<!ENTITY lol{i} "{"&lol%d;" % (i - 1) * 10}">\n' for i in range(1, 10))
    lol.write_text(f'<?xml version="1.0"?>\n<!DOCTYPE posts [\n<!ENTITY lol0 "lol">\n{ents}]>\n<posts>\n  <row Id="1" OwnerUserId="4" Body="&lol9;" />\n</posts>\n')
    with pytest.raises(DataFormatError, match=r"lol.xml:\d+: malformed XML .*amplification"):
        load_stackexchange(lol)
    xxe = tmp_path / "xxe.xml"
    xxe.write_text('<?xml version="1.0"?>\n<!DOCTYPE posts [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>\n<posts>\n  <row Id="1" OwnerUserId="4" Body="&xxe;" />\n</posts>\n')
    with pytest.raises(DataFormatError, match=r"xxe.xml:4: malformed XML .*external entity"):
        load_stackexchange(xxe)
    rows = [f'<row Id="{i}" OwnerUserId="{i}" Body="post number {i} ." />' for i in range(1, 30000)]
    full = posts(tmp_path, *rows, name="Full.xml").read_text()
    cut = tmp_path / "Cut.xml"
    cut.write_text(full[: len(full) * 2 // 3])  # truncated inside a row, past the first read
    line = cut.read_text().count("\n") + 1
    with pytest.raises(DataFormatError, match=rf"Cut.xml:{line}: malformed XML"):
        load_stackexchange(cut)


# ---- a dump that gives no example ---------------------------------------------------------------


def test_no_examples_says_why_each_post_was_skipped(tmp_path):
    p = posts(
        tmp_path,
        '<row Id="1" PostTypeId="1" OwnerUserId="-1" Body="Tag wiki text." />',
        '<row Id="2" PostTypeId="1" OwnerDisplayName="anon" Body="Anon text." />',
        '<row Id="3" PostTypeId="2" OwnerUserId="7" Body="&lt;pre&gt;&lt;code&gt;x = 1&lt;/code&gt;&lt;/pre&gt;" />',
        '<row Id="4" PostTypeId="5" OwnerUserId="7" Body="A tag excerpt." />',
    )
    with pytest.raises(EmptyCorpusError) as err:
        load_stackexchange(p, post_types=("1", "2"))
    msg = str(err.value)
    assert msg.startswith(f"{p}: the dump gave no examples: 4 posts read, none used: ")
    assert "1 of a PostTypeId not in post_types=['1', '2']" in msg
    assert "1 without an OwnerUserId" in msg
    assert "1 of dropped account -1, the Community account (drop_owners=['-1']; drop_owners=[] keeps them)" in msg
    assert "1 with no text in their Title and Body attributes once HTML and code blocks were stripped (drop_code=False keeps the code)" in msg
    # each hint is right: keeping the code, or the Community account, gives examples
    assert load_stackexchange(p, post_types=("1", "2"), drop_code=False).num_users == 1
    assert load_stackexchange(p, post_types=("1", "2"), drop_owners=[]).user_ids == ("-1",)


def test_no_examples_from_the_fuzz_reproducer_and_an_empty_dump(tmp_path):
    p = posts(
        tmp_path,
        '<row Id="1" PostTypeId="1" OwnerUserId="-1" CreationDate="2015-01-27T20:09:32.720" Body="Tag wiki text." />',
        '<row Id="2" PostTypeId="1" OwnerDisplayName="anon" CreationDate="2015-01-27T20:09:32.720" Body="Anon text." />',
    )
    with pytest.raises(EmptyCorpusError, match=r"2 posts read, none used: 1 without an OwnerUserId .*; 1 of dropped account -1"):
        load_stackexchange(p)
    none = posts(tmp_path, name="None.xml")
    with pytest.raises(EmptyCorpusError, match=r"None.xml: the dump gave no examples: it holds no <row> element under <posts>"):
        load_stackexchange(none)
