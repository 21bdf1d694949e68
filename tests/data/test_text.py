"""Plain text files: one example per line, users by paragraph, blocks, clients or a mapping."""

import pytest

from fedpriv.data.sources import guess_format, open_corpus
from fedpriv.data.text import load_text
from fedpriv.errors import DataFormatError, EmptyCorpusError, FedprivError

CHAT = """Hello, is the café open today?
It opens at NINE.

Can I bring my dog?
  
Dogs are welcome!
Thanks.
...
"""


def test_paragraphs_are_users_by_default(tmp_path):
    p = tmp_path / "chat.txt"
    p.write_text(CHAT)
    assert guess_format(p) == "text"
    c = open_corpus(str(p))
    assert c.kind == "text" and c.num_users == 3 and c.counts().tolist() == [2, 1, 3]
    assert list(c.user_ids) == ["para-0", "para-1", "para-2"]
    assert c.examples("para-0")[0].text == "hello , is the café open today ?"
    assert c.examples("para-2")[-1].text == ". . ."
    assert any("users are the file's 3 paragraphs" in n for n in c.notes)
    raw = load_text(p, normalize_text=False)
    assert raw.examples("para-0")[1].text == "It opens at NINE."


def test_blocks_clients_and_mapping(tmp_path):
    p = tmp_path / "lines.text"
    p.write_text("".join(f"line number {i}\n" for i in range(23)))
    c = open_corpus(str(p))  # no blank line: blocks of 10, said in the notes
    assert c.num_users == 3 and c.counts().tolist() == [10, 10, 3]
    assert any("users are synthetic: 3 blocks of 10 consecutive lines" in n for n in c.notes)
    assert any("no blank lines" in n for n in c.notes)
    assert load_text(p, users="lines:5").num_users == 5
    clients = load_text(p, users="clients:4")
    assert clients.num_users == 4 and clients.counts().tolist() == [6, 6, 6, 5]
    m = tmp_path / "who.txt"
    m.write_text("".join(("ann" if i % 3 else "bob") + "\n" for i in range(23)))
    mapped = load_text(p, users=f"mapping:{m}")
    assert {u: len(mapped.examples(u)) for u in mapped.user_ids} == {"ann": 15, "bob": 8}
    assert not mapped.notes
    m.write_text("".join(("ann" if i % 3 else "Ann") + "\n" for i in range(23)))  # one person, two spellings?
    variants = load_text(p, users=f"mapping:{m}")
    assert variants.num_users == 2 and variants.info["user_ids_differing_in_case"] == 2
    assert variants.notes == ["1 groups of user ids of text:lines.text[mapping:" + str(m) + "] (2 ids) differ only in letter case; "
                              "they are kept apart, so one person with k such ids counts as k users, and a per-user epsilon covers "
                              "that person only as k users (group privacy); give each group one id in the mapping if it is one person"]
    m.write_text("ann\n")
    with pytest.raises(DataFormatError, match="has 1 user ids but .* has 23 non-blank lines"):
        load_text(p, users=f"mapping:{m}")
    with pytest.raises(FedprivError, match="users rule 'sentences:3'"):
        load_text(p, users="sentences:3")


def test_bad_text_files(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_bytes(b"fine\n\xff oops\n")
    with pytest.raises(DataFormatError, match=r"bad.txt:2: not valid UTF-8"):
        load_text(p)
    p.write_text("\n   \n")
    with pytest.raises(EmptyCorpusError, match="every line is blank"):
        load_text(p)


def test_spill_to_streams_the_lines_to_disk_and_reads_the_same(tmp_path):
    """The file is read twice (count, then stream), so with spill_to no list of its lines is held."""
    from fedpriv.data.stores import SqliteStore
    from fedpriv.data.text import load_text

    p = tmp_path / "t.txt"
    p.write_text("First paragraph, line one.\nLine two!\n\n...\nSecond paragraph.\n\n\nThird.\n", encoding="utf-8")
    mem = load_text(p)
    disk = load_text(p, spill_to=tmp_path / "spill.sqlite")
    assert isinstance(disk.store, SqliteStore)
    assert disk.user_ids == mem.user_ids == ("para-0", "para-1", "para-2")
    assert [disk.examples(u) for u in disk.user_ids] == [mem.examples(u) for u in mem.user_ids]
    assert disk.notes == mem.notes and disk.info["lines"] == mem.info["lines"] == 5


def test_a_mapping_file_in_another_encoding_names_its_line_and_the_fix(tmp_path):
    """The mapping was decoded in chunks, so the error named the line the chunk started at (1),
    not the line of the bad byte, and gave no fix; it is read as every text file is now."""
    p = tmp_path / "lines.txt"
    p.write_text("one\ntwo\nthree\n", encoding="utf-8")
    m = tmp_path / "who.txt"
    m.write_bytes(b"ann\nbob\nj\xf6rg\n")  # Latin-1
    with pytest.raises(DataFormatError) as e:
        load_text(p, users=f"mapping:{m}")
    assert str(e.value).startswith(f"{m}:3: not valid UTF-8 (invalid start byte at byte 1 of the line): ")
    assert str(e.value).endswith("save it as UTF-8, e.g. iconv -f WINDOWS-1252 -t UTF-8 FILE > OUT for a Windows file")
    m.write_bytes(b"\xef\xbb\xbfann\r\nbob\r\nj\xc3\xb6rg\r\n")  # a BOM and CRLF line ends: read as before
    assert list(load_text(p, users=f"mapping:{m}").user_ids) == ["ann", "bob", "jörg"]
