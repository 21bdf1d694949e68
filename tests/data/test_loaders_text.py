"""Shakespeare (bundled) and Stack Exchange Posts.xml loaders, on the real files."""

import json
import xml.etree.ElementTree as ET

import pytest

from fedpriv.data.shakespeare import bundled_path, iter_turns, load_shakespeare
from fedpriv.data.stackexchange import iter_posts, load_stackexchange
from fedpriv.data.tokenize import normalize, split_sentences, strip_html
from fedpriv.errors import DataFormatError, SourceError


def test_tokenize_like_tff_stackoverflow():
    assert normalize("Don't PANIC, it's <b>HTML</b>!") == "don't panic , it's < b > html < / b > !"
    assert normalize("e-mail me: x_y@z.com") == "e-mail me : x _ y @ z . com"
    assert normalize("  ") == ""


def test_split_sentences_and_strip_html():
    assert split_sentences("One. Two!  Three?\n\nFour") == ["One.", "Two!", "Three?", "Four"]
    assert split_sentences('He said "stop." Then left.') == ['He said "stop."', "Then left."]
    text = strip_html("<p>Use &lt;b&gt; tags</p><pre><code>x = 1</code></pre><p>Done</p>", skip=frozenset({"pre"}))
    assert "x = 1" not in text
    assert split_sentences(text) == ["Use <b> tags", "Done"]


def test_bundled_shakespeare_users_are_speakers():
    c = load_shakespeare()
    assert c.num_users == 299
    assert c.num_examples == 12625
    assert c.examples("First Citizen")[0].text == "before we proceed any further , hear me speak ."
    assert "MENENIUS" in c.user_ids
    turns = load_shakespeare(unit="turn")
    assert turns.num_users == 299
    assert turns.examples("All")[0].text == "speak , speak ."
    assert (bundled_path().parent / "tinyshakespeare.NOTICE").is_file()


def test_shakespeare_malformed_turn_names_file_and_line(tmp_path):
    p = tmp_path / "play.txt"
    p.write_text("ROMEO:\nBut soft!\n\nthis line opens no turn\nmore\n")
    with pytest.raises(DataFormatError, match=r"play.txt:4: expected a 'SPEAKER:' line"):
        list(iter_turns(p))


def test_coffee_dump_has_116_owners_and_drops_the_community_account():
    c = load_stackexchange("tests/data/stackexchange-coffee/Posts.xml")
    assert c.num_users == 115 and "-1" not in c.user_ids
    assert c.info["posts"] == 592
    assert c.info["skipped_no_owner"] == 0
    assert c.info["skipped_dropped_owner"] == 12
    assert c.notes == ["12 posts of account -1 (the Community account) dropped (drop_owners=['-1']; pass drop_owners=[] to keep them)"]
    first = c.examples("4")[0]
    assert first.text == "how should i store whole bean coffee ?"
    assert first.timestamp == pytest.approx(1422389372.72)
    every = load_stackexchange("tests/data/stackexchange-coffee/Posts.xml", drop_owners=[])
    assert every.num_users == 116 and "-1" in every.user_ids and not every.notes
    qa = load_stackexchange("tests/data/stackexchange-coffee/Posts.xml", post_types=("1", "2"), drop_owners=[])
    assert qa.num_users == 115 and "-1" not in qa.user_ids  # the Community user owns only tag wikis
    assert qa.info["skipped_type"] == 40
    with pytest.raises(SourceError, match="drop_owners='-1': expected a list"):
        load_stackexchange("tests/data/stackexchange-coffee/Posts.xml", drop_owners="-1")


def test_posts_without_owner_are_skipped_and_counted(tmp_path):
    p = tmp_path / "Posts.xml"
    p.write_text(
        '<?xml version="1.0" encoding="utf-8"?>\n<posts>\n'
        '  <row Id="1" PostTypeId="1" CreationDate="2015-01-27T20:09:32.720" Title="Hot water?" Body="&lt;p&gt;Why. Now!&lt;/p&gt;" OwnerUserId="7" />\n'
        '  <row Id="2" PostTypeId="2" CreationDate="2015-01-27T20:10:00.000" Body="&lt;p&gt;orphan&lt;/p&gt;" />\n'
        "</posts>\n"
    )
    stats = {}
    pairs = list(iter_posts(p, stats=stats))
    assert [(u, e.text) for u, e in pairs] == [("7", "hot water ?"), ("7", "why ."), ("7", "now !")]
    assert stats["skipped_no_owner"] == 1 and stats["posts"] == 2


def test_malformed_xml_names_file_and_line(tmp_path):
    p = tmp_path / "Posts.xml"
    p.write_text('<posts>\n  <row Id="1" OwnerUserId="3" Body="x" />\n  <row Id="2" OwnerUserId=3 />\n</posts>\n')
    with pytest.raises(DataFormatError, match=r"Posts.xml:3: malformed XML"):
        load_stackexchange(p)


def test_bad_creation_date_names_the_post(tmp_path):
    p = tmp_path / "Posts.xml"
    p.write_text('<posts><row Id="9" PostTypeId="1" OwnerUserId="3" Title="t" CreationDate="yesterday" /></posts>')
    with pytest.raises(DataFormatError, match=r"post Id=9.*CreationDate"):
        load_stackexchange(p)


def test_wrong_root_and_missing_file(tmp_path):
    p = tmp_path / "Users.xml"
    p.write_text("<users><row Id='1'/></users>")
    with pytest.raises(DataFormatError, match="expected <posts>"):
        load_stackexchange(p)
    with pytest.raises(SourceError):
        load_stackexchange(tmp_path / "missing.xml")


def test_stackexchange_spill_gives_same_corpus(tmp_path):
    mem = load_stackexchange("tests/data/stackexchange-coffee/Posts.xml")
    disk = load_stackexchange("tests/data/stackexchange-coffee/Posts.xml", spill_to=tmp_path / "c.sqlite")
    assert list(disk.user_ids) == list(mem.user_ids)
    assert list(disk.records()) == list(mem.records())


@pytest.mark.slow
def test_stackexchange_streams_a_big_dump_in_bounded_memory(tmp_path):
    """~60 MB of posts (100x the coffee dump's rows) streamed to disk: memory stays small."""
    import resource
    import subprocess
    import sys

    rows = [ET.tostring(r, encoding="unicode") for r in ET.parse("tests/data/stackexchange-coffee/Posts.xml").getroot()]
    big = tmp_path / "Posts.xml"
    with open(big, "w", encoding="utf-8") as f:
        f.write("<posts>\n")
        for k in range(100):
            for r in rows:
                f.write(r.replace('OwnerUserId="', f'OwnerUserId="{k}0'))
        f.write("</posts>\n")
    code = (
        "import json,resource,sys;from fedpriv.data.stackexchange import load_stackexchange;"
        f"c=load_stackexchange({str(big)!r}, spill_to={str(tmp_path / 'big.sqlite')!r});"
        "print(json.dumps([c.num_users, c.num_examples, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]))"
    )
    base = subprocess.run([sys.executable, "-c", "import resource,fedpriv.data.stackexchange;print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"], capture_output=True, text=True, check=True)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    users, examples, rss_kb = json.loads(res.stdout)
    assert users == 100 * 116 and examples == 100 * 4975
    # The file is ~60 MB and its examples ~50 MB as Python objects; streaming keeps the growth
    # over an idle interpreter well under that.
    assert (rss_kb - int(base.stdout)) / 1024 < 40, (rss_kb, base.stdout)
    del resource
