"""Shakespeare (bundled) and Stack Exchange Posts.xml loaders, on the real files."""

import json
import xml.etree.ElementTree as ET

import pytest

from fedpriv.data.shakespeare import bundled_path, iter_turns, load_shakespeare
from fedpriv.data.stackexchange import iter_posts, load_stackexchange
from fedpriv.data.tokenize import normalize, prose_sentences, split_sentences, strip_html, tokenize
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


@pytest.mark.parametrize(
    ("text", "want"),
    [  # ASCII and precomposed Latin text: exactly the output it had before marks joined words
        ("It\u2019s the U.S.A.'s e-mail\u2014x_y... \"Quoted\" (paren) [b] {c} 3.5% #1 @home",
         "it's the u . s . a . ' s e-mail \u2014 x _ y . . . \" quoted \" ( paren ) [ b ] { c } 3 . 5 % # 1 @ home"),
        ("\u00dcn\u00efc\u00f6d\u00e9 Stra\u00dfe na\u00efve fa\u00e7ade \u2014 \u00c9LAN", "\u00fcn\u00efc\u00f6d\u00e9 stra\u00dfe na\u00efve fa\u00e7ade \u2014 \u00e9lan"),
        ("rock-'n'-roll o'clock -x- 'q' --", "rock - ' n ' - roll o'clock - x - ' q ' - -"),
        ("Tabs\tand\nnewlines  ", "tabs and newlines"),
        ("<p>x</p> a<b &amp; \u00a92024 \u00bd \u00b2 \u2153 \u0663", "< p > x < / p > a < b & amp ; \u00a9 2024 \u00bd \u00b2 \u2153 \u0663"),
    ],
)
def test_normalize_keeps_ascii_and_latin_output(text, want):
    assert normalize(text) == want


def test_combining_marks_continue_words():
    # Devanagari vowel signs (Mc) and virama (Mn) stay inside the word
    assert tokenize("\u0939\u093f\u0928\u094d\u0926\u0940 \u092d\u093e\u0937\u093e") == ["\u0939\u093f\u0928\u094d\u0926\u0940", "\u092d\u093e\u0937\u093e"]
    assert normalize("\u0939\u093f\u0928\u094d\u0926\u0940 \u092d\u093e\u0937\u093e.") == "\u0939\u093f\u0928\u094d\u0926\u0940 \u092d\u093e\u0937\u093e ."
    # Arabic with harakat and shadda: one word
    muhammad = "\u0645\u064f\u062d\u064e\u0645\u064e\u0651\u062f"
    assert tokenize(muhammad) == [muhammad]
    assert normalize(f"\u0642\u0627\u0644 {muhammad}\u060c") == f"\u0642\u0627\u0644 {muhammad} \u060c"
    # after inner apostrophes and hyphens too
    assert tokenize("\u0939\u093f\u0928\u094d\u0926\u0940-\u092d\u093e\u0937\u093e") == ["\u0939\u093f\u0928\u094d\u0926\u0940-\u092d\u093e\u0937\u093e"]
    assert tokenize("l'\u00e9te\u0301") == ["l'\u00e9t\u00e9"]
    # a mark with no word before it is its own token, as before
    assert tokenize("\u0301a \u0301") == ["\u0301", "a", "\u0301"]
    assert tokenize("x'\u0301") == ["x", "'", "\u0301"]


def test_nfd_and_nfc_give_the_same_tokens():
    nfc, nfd = "Caf\u00e9 cr\u00e8me", "Cafe\u0301 cre\u0300me"
    assert normalize(nfd) == normalize(nfc) == "caf\u00e9 cr\u00e8me"  # precomposed in the output
    assert tokenize("NA\u0303O") == ["n\u00e3o"]


def test_turkish_dotted_capital_i_is_one_word():
    # "İ".lower() is "i" + U+0307 COMBINING DOT ABOVE: the mark stays in the word
    assert normalize("\u0130stanbul") == "i\u0307stanbul"
    assert tokenize("\u0130STANBUL'da \u0131s\u0131k") == ["i\u0307stanbul'da", "\u0131s\u0131k"]


@pytest.mark.parametrize(
    "text",
    ["\u0939\u093f\u0928\u094d\u0926\u0940 \u092d\u093e\u0937\u093e", "Cafe\u0301 \u0130stanbul", " \u0301\u0316 x\u0300\u0301 =\u0338 \u05e9\u05c1\u05b8", "\u0645\u064f\u062d\u064e\u0645\u064e\u0651\u062f!"],
)
def test_normalize_is_idempotent_on_marked_text(text):
    once = normalize(text)
    assert normalize(once) == once


def test_prose_sentences_split_cjk_without_whitespace():
    text = "\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002\u6211\u4eec\u53bb\u516c\u56ed\u5427\uff01\u4f60\u6765\u5417\uff1f\u300c\u597d\u7684\u3002\u300d\u4ed6\u8bf4\u3002"
    assert prose_sentences(text) == [
        "\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002",
        "\u6211\u4eec\u53bb\u516c\u56ed\u5427\uff01",
        "\u4f60\u6765\u5417\uff1f",
        "\u300c\u597d\u7684\u3002\u300d",
        "\u4ed6\u8bf4\u3002",
    ]
    # Japanese, with whitespace or a closing bracket after the terminator, and Latin text after it
    assert prose_sentences("\u3053\u308c\u306f\u30da\u30f3\u3067\u3059\u3002 \u305d\u308c\u306f\u672c\u3067\u3059\uff08\u4f8b\uff09\uff01\uff1f\uff09 ok\u3002") == [
        "\u3053\u308c\u306f\u30da\u30f3\u3067\u3059\u3002",
        "\u305d\u308c\u306f\u672c\u3067\u3059\uff08\u4f8b\uff09\uff01\uff1f\uff09",
        "ok\u3002",
    ]


def test_prose_sentences_openers_before_the_capital():
    assert prose_sentences("Hola. \u00bfQu\u00e9 tal? \u00a1Muy bien! Gracias.") == ["Hola.", "\u00bfQu\u00e9 tal?", "\u00a1Muy bien!", "Gracias."]
    assert prose_sentences("Fin. \u00abBonjour\u00bb dit-il. \u201cWhy\u201d nobody knew. \u2018Fine\u2019 then.") == [
        "Fin.", "\u00abBonjour\u00bb dit-il.", "\u201cWhy\u201d nobody knew.", "\u2018Fine\u2019 then."
    ]
    # a lowercase letter after the opener, or an abbreviation before it, still does not split
    assert prose_sentences("uno. \u00bfqu\u00e9? dos, e.g. \u201cBERT\u201d.") == ["uno. \u00bfqu\u00e9? dos, e.g. \u201cBERT\u201d."]


def test_long_punctuation_runs_split_correctly():
    dots = "Loading" + "." * 40000 + " done"
    assert prose_sentences(dots) == [dots]
    assert prose_sentences(dots + ". Next") == [dots + ".", "Next"]
    assert split_sentences(dots) == ["Loading" + "." * 40000, "done"]
    bangs = "!" * 40000 + ")" * 40000
    assert prose_sentences(bangs) == [bangs]
    assert prose_sentences(f"Wait{bangs} Next one.") == [f"Wait{bangs}", "Next one."]
    assert prose_sentences(f"Wait{bangs} next one.") == [f"Wait{bangs} next one."]
    assert split_sentences(f"Wait{bangs} x") == [f"Wait{bangs} x"]  # two closers: no end, as before
    assert split_sentences("?" * 40000 + ") Yes") == ["?" * 40000 + ")", "Yes"]
    wide = "\uff1f" * 40000 + "\u4e0b\u4e00\u53e5\u3002"
    assert prose_sentences(wide) == ["\uff1f" * 40000, "\u4e0b\u4e00\u53e5\u3002"]
    assert prose_sentences("." * 40000 + "\u3002x") == ["." * 40000 + "\u3002", "x"]


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


@pytest.mark.parametrize(
    "text, want",
    [
        ("\u0645\u0646 \u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645", ["\u0645\u0646", "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"]),  # ZWNJ inside a Persian word
        ("inter\u00adnational", ["international"]),  # soft hyphen
        ("I \u2764\ufe0f NY", ["i", "\u2764", "ny"]),  # variation selector
        ("\u200b", []),
        ("\u0e41\u0e21\u0e27\u200b\u0e01\u0e34\u0e19", ["\u0e41\u0e21\u0e27", "\u0e01\u0e34\u0e19"]),  # a zero-width space breaks Thai words
        ("\u200ehello\u200f w\ufefforld\u2060", ["hello", "world"]),  # direction marks, BOM, word joiner
        ("x \u200c y \u200d", ["x", "y"]),  # joiners outside a word
        ("\U0001f468\u200d\U0001f469", ["\U0001f468", "\U0001f469"]),
        ("\u0915\u094d\u200d\u0937", ["\u0915\u094d\u200d\u0937"]),  # a joiner after a virama: a Devanagari half form
        ("\u0d28\u0d4d\u200d", ["\u0d28\u0d4d\u200d"]),  # a Malayalam chillu
        ("\u06a9\u062a\u0627\u0628\u0652\u200c\u0647\u0627", ["\u06a9\u062a\u0627\u0628\u0652\u200c\u0647\u0627"]),  # ZWNJ after a diacritic
        ("e\u00ad\u0301", ["\u00e9"]),  # dropped before NFC, so the accent composes (normalize stays idempotent)
        ("\u0600\u0661", ["\u0600", "\u0661"]),  # the Arabic number sign is a visible format character: kept
    ],
)
def test_invisible_characters_are_no_tokens(text, want):
    assert tokenize(text) == want
    assert normalize(normalize(text)) == normalize(text)
