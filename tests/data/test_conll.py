"""CoNLL/IOB loader on WNUT-17 and NCBI-disease, on files written here the way other corpora come
(CoNLL-U comments and columns, CoNLL-2003, headers, documents), user rules, and malformed input."""

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedpriv.data.conll import iter_sentences, load_conll
from fedpriv.data.sources import guess_format, open_corpus
from fedpriv.errors import DataFormatError, FedprivError

# A CoNLL-U-like NER file as the issue met it: comments, index, token, tag and two more columns.
UD_NER = """# newdoc id = answers-20070404104007AAY1Chs_ans
# sent_id = answers-20070404104007AAY1Chs_ans-0001
# text = where can I get morcillas in tampa bay
1\twhere\tO\tADV\t_
2\tcan\tO\tAUX\t_
3\tI\tO\tPRON\t_
4\tget\tO\tVERB\t_
5\tmorcillas\tO\tNOUN\t_
6\tin\tO\tADP\t_
7\ttampa\tB-LOC\tPROPN\t_
8\tbay\tI-LOC\tPROPN\t_

# sent_id = answers-20070404104007AAY1Chs_ans-0002
# text = thanks
1\tthanks\tO\tNOUN\t_

# newdoc id = email-enronsent01_01
# sent_id = email-enronsent01_01-0001
# text = Mr. Smith went to Paris .
1\tMr.\tB-PER\tPROPN\t_
2\tSmith\tI-PER\tPROPN\t_
3\twent\tO\tVERB\t_
4\tto\tO\tADP\t_
5\tParis\tB-LOC\tPROPN\t_
6\t.\tO\tPUNCT\t_

# newdoc id = reviews-001
# sent_id = reviews-001-0001
# text = Good
1\tGood\tO\tADJ\t_
"""


def test_wnut17_sentences_and_entities(wnut_train):
    sents = [s for _, s in iter_sentences(wnut_train)]
    assert len(sents) == 3394
    assert sents[0].tokens[:3] == ("@paulwalk", "It", "'s")
    assert ("Empire", "B-location") in zip(sents[0].tokens, sents[0].tags)
    assert len(sents[0].tokens) == len(sents[0].tags)


def test_wnut17_split_across_n_clients(wnut_train):
    """clients:N deals sentence i to client i mod N: N users, sizes differing by at most one, every
    sentence kept in order within its client."""
    sents = [s for _, s in iter_sentences(wnut_train)]
    for n in (2, 5, 20):
        corpus = load_conll(wnut_train, users=f"clients:{n}")
        assert corpus.num_users == n and corpus.num_examples == 3394
        assert corpus.counts().max() - corpus.counts().min() <= 1
        first = corpus.user_ids[0]
        assert list(corpus.examples(first)) == sents[::n]
    with pytest.raises(FedprivError, match="cannot make 4000 clients"):
        load_conll(wnut_train, users="clients:4000")


def test_ncbi_disease_loads_with_sentence_blocks(ncbi_train):
    c = load_conll(ncbi_train, users="sentences:25")
    n = sum(1 for _ in iter_sentences(ncbi_train))
    assert c.num_examples == n
    assert c.num_users == -(-n // 25)
    assert c.counts()[:-1].tolist() == [25] * (c.num_users - 1)
    first = c.examples(c.user_ids[0])[0]
    assert first.tags[first.tokens.index("adenomatous")] == "B-Disease"


def test_docstart_documents_are_users(tmp_path):
    p = tmp_path / "docs.conll"
    p.write_text("-DOCSTART- O\n\nA\tB-PER\nb\tO\n\nC\tO\n\n-DOCSTART- O\n\nD\tB-LOC\n")
    c = load_conll(p, users="document")
    assert list(c.user_ids) == ["doc-0", "doc-1"]
    assert [len(c.examples(u)) for u in c.user_ids] == [2, 1]
    assert c.examples("doc-1")[0].tokens == ("D",)


def test_four_column_conll2003_takes_first_and_last(tmp_path):
    p = tmp_path / "c03.txt"
    p.write_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP O\n")
    (s,) = [s for _, s in iter_sentences(p)]
    assert s.tokens == ("EU", "rejects") and s.tags == ("B-ORG", "O")


@pytest.mark.parametrize("suffix", [".iob2", ".conll", ".conllu", ".bio", ".iob"])
def test_conllu_like_file_with_comments_and_extra_columns(tmp_path, suffix):
    """Comments skipped, the token and tag columns found among five, users = the documents' ids."""
    p = tmp_path / f"ud-ner{suffix}"
    p.write_text(UD_NER)
    assert guess_format(p) == "conll"
    c = open_corpus(str(p))
    assert c.num_users == 3 and c.num_examples == 4
    assert list(c.user_ids) == ["answers-20070404104007AAY1Chs_ans", "email-enronsent01_01", "reviews-001"]
    first, second = c.examples("answers-20070404104007AAY1Chs_ans")
    assert first.tokens[-2:] == ("tampa", "bay") and first.tags[-2:] == ("B-LOC", "I-LOC") and second.tokens == ("thanks",)
    assert c.examples("email-enronsent01_01")[0].tags[:2] == ("B-PER", "I-PER")
    assert c.info["comment_lines"] == 11 and c.info["documents"] == 3
    assert any("token in column 1, tag in column 2, both detected" in n for n in c.notes)
    assert any("users are the file's 3 documents" in n for n in c.notes)


def test_explicit_columns_and_comment_users(tmp_path):
    """token_column/tag_column choose the columns; users='comment:KEY' reads a comment's value."""
    p = tmp_path / "posts.tsv"
    p.write_text(
        "# author = alice\n# post = 1\nhi\tINTJ\tO\nBob\tPROPN\tB-PER\n\n"
        "# post = 2\nParis\tPROPN\tB-LOC\n\n"
        "# author = bob\n# post = 3\nok\tINTJ\tO\n"
    )
    c = load_conll(p, users="comment:author")
    assert {u: len(c.examples(u)) for u in c.user_ids} == {"alice": 2, "bob": 1}
    assert c.examples("alice")[0].tokens == ("hi", "Bob") and c.examples("alice")[0].tags == ("O", "B-PER")
    assert not any("differ only" in n for n in c.notes)
    by_post = load_conll(p, users="comment:post")
    assert by_post.num_users == 3
    spaced = tmp_path / "spaced.tsv"  # 'bob' and 'Bob' and 'Bob ' (trimmed: one id), 'Ｂｏｂ' (full width): said, kept apart
    spaced.write_text("# author = bob\nhi\tO\n\n# author = Bob\nho\tO\n\n# author = Bob \nhu\tO\n\n# author = Ｂｏｂ\nha\tO\n")
    v = load_conll(spaced, users="comment:author")
    assert sorted(v.user_ids) == sorted(["Bob", "bob", "Ｂｏｂ"])
    assert v.info["user_ids_differing_in_case"] == 2 and v.info["user_ids_differing_in_spacing"] == 2
    assert sum("give each group one id in the file if it is one person" in n for n in v.notes) == 1
    same = load_conll(p, users="comment:author", token_column=0, tag_column=-1)
    assert list(same.records()) == list(c.records())
    tags_as_tokens = load_conll(p, users="comment:author", token_column=2, tag_column=2)
    assert tags_as_tokens.examples("bob")[0].tokens == ("O",)
    with pytest.raises(DataFormatError, match=r"posts.tsv:3: tag 'INTJ' \(column 1\) is not O or B-"):
        load_conll(p, tag_column=1)
    with pytest.raises(FedprivError, match="token_column='0': expected a column number"):
        load_conll(p, token_column="0")
    q = tmp_path / "late.conll"
    q.write_text("a\tO\n\n# author = carol\nb\tO\n")
    with pytest.raises(DataFormatError, match=r"late.conll: sentence 1 has no '# author = ...' comment"):
        load_conll(q, users="comment:author")


def test_conll2003_documents_and_conllu_multiword_tokens(tmp_path):
    """-DOCSTART- documents become users under 'auto'; CoNLL-U ranges (1-2) and empty nodes (1.1)
    are skipped; hashtag tokens are tokens, not comments."""
    p = tmp_path / "eng.train.bio"
    p.write_text(
        "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n#Brexit NN I-NP O\n\n"
        "-DOCSTART- -X- -X- O\n\nPeter NNP B-NP B-PER\n\n"
        "-DOCSTART- -X- -X- O\n\nBonn NNP B-NP B-LOC\n\nLondon NNP B-NP B-LOC\n"
    )
    c = open_corpus(str(p))
    assert list(c.user_ids) == ["doc-0", "doc-1", "doc-2"] and c.counts().tolist() == [2, 1, 2]
    assert c.examples("doc-0")[1].tokens == ("#Brexit",)
    assert c.examples("doc-0")[0].tags == ("B-ORG", "O")  # the NER column, not the chunk column
    u = tmp_path / "mw.conllu"
    u.write_text("# sent_id = 1\n1-2\tdel\t_\t_\n1\tde\tO\t_\n2\tel\tO\t_\n2.1\tx\tO\t_\n3\tMadrid\tB-LOC\t_\n")
    (s,) = [s for _, s in iter_sentences(u)]
    assert s.tokens == ("de", "el", "Madrid") and s.tags == ("O", "O", "B-LOC")
    assert load_conll(u).info["skipped_multiword_or_empty_nodes"] == 2


def test_header_line_and_synthetic_users_are_noted(tmp_path):
    p = tmp_path / "ner.tsv"
    p.write_text("token\tlabel\n" + "\n\n".join(f"w{i}\tO\nParis\tB-LOC" for i in range(25)) + "\n")
    assert guess_format(p) == "conll"
    c = open_corpus(str(p))
    assert c.num_examples == 25 and c.num_users == 3 and c.counts().tolist() == [10, 10, 5]
    assert any("ner.tsv:1 read as a header line and skipped" in n for n in c.notes)
    assert any("users are synthetic: 3 blocks of 10 consecutive sentences (users='sentences:10')" in n for n in c.notes)
    assert any("marks no documents" in n for n in c.notes)
    clients = load_conll(p, users="clients:4")
    assert clients.num_users == 4 and any("users are synthetic: 4 clients" in n for n in clients.notes)
    single = load_conll(p, users="document")
    assert single.num_users == 1 and any("one user" in n for n in single.notes)


def test_tsv_with_a_user_id_header_is_a_table(tmp_path):
    p = tmp_path / "posts.tsv"
    p.write_text("user_id\ttext\nann\tHello there.\nben\tHi!\nann\tBye.\n")
    assert guess_format(p) == "tsv"
    c = open_corpus(str(p))
    assert c.kind == "text" and c.num_users == 2 and c.counts().tolist() == [2, 1]


def test_mapping_file(tmp_path):
    p = tmp_path / "x.conll"
    p.write_text("a\tO\n\nb\tO\n\nc\tO\n")
    m = tmp_path / "users.txt"
    m.write_text("alice\nbob\nalice\n")
    c = load_conll(p, users=f"mapping:{m}")
    assert {u: [e.tokens for e in exs] for u, exs in c.users()} == {"alice": [("a",), ("c",)], "bob": [("b",)]}
    m.write_text("alice\nbob\n")
    with pytest.raises(DataFormatError, match="2 user ids but .* 3 sentences"):
        load_conll(p, users=f"mapping:{m}")


@pytest.mark.parametrize(
    "content, line, reason",
    [
        ("a\tO\nb\n", 2, r"expected a token and a tag separated by tabs or spaces \(token in column 0, tag in column 1, both detected\), got 'b'"),
        ("a\tO\n\nb\tPERSON\n", 3, r"tag 'PERSON' \(the last column\) is not O or B-/I-/E-/S-/L-/U-<type>; pass tag_column="),
        ("author\ttext\nu0\tPost number 0\n", 1, r"tag 'text' \(the last column\) is not .*; if line 1 is a table's header, name the table's columns \(-o user_column="),
        ("".join(f"{i % 9 + 1}\ta\tO\n" for i in range(1001)) + "c\tO\n", 1002, r"expected a token number in column 0 \(as on the lines before\), got 'c\\tO'"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, content, line, reason):
    p = tmp_path / "bad.conll"
    p.write_text(content)
    with pytest.raises(DataFormatError, match=rf"bad.conll:{line}: {reason}"):
        load_conll(p)


def test_invalid_utf8_names_the_line(tmp_path):
    p = tmp_path / "bad.conll"
    p.write_bytes(b"a\tO\n\xff\tO\n")
    with pytest.raises(DataFormatError, match=r"bad.conll:2: not valid UTF-8"):
        load_conll(p)


def test_bad_users_rule_and_empty_file(tmp_path):
    p = tmp_path / "x.conll"
    p.write_text("a\tO\n")
    for rule in ("sentences:0", "sentences:x", "clients:0", "clients:two", "speaker", "lines:3", "comment:", "paragraph"):
        with pytest.raises(FedprivError, match="users rule"):
            load_conll(p, users=rule)
    p.write_text("\n\n-DOCSTART- O\n\n")
    with pytest.raises(FedprivError, match="no sentences"):
        load_conll(p)


_lines = st.one_of(
    st.text(max_size=30),
    st.builds(lambda t, g: f"{t}\t{g}", st.text(max_size=8), st.sampled_from(["O", "B-PER", "I-LOC", "X", "B-", ""])),
    st.just("-DOCSTART- -X- O"),
    st.just("# newdoc id = d"),
    st.just("# author = x"),
    st.just("1\tw\tB-X\t_"),
    st.just(""),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(_lines, max_size=20), junk=st.binary(max_size=8), rule=st.sampled_from(["auto", "document", "sentences:3", "comment:author"]))
def test_parser_raises_only_fedpriv_errors(lines, junk, rule):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "fuzz.conll"
        p.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass") + junk)
        try:
            c = load_conll(p, users=rule)
        except FedprivError:
            return
        for _, exs in c.users():
            for e in exs:
                assert len(e.tokens) == len(e.tags) > 0


# CoNLL-2003 (token, POS, chunk, NER), the layout where a chunk column of tags sits before the NER tag.
C03 = "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP B-MISC\ncall NN I-NP O\n\nPeter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n"


def test_a_typo_in_the_ner_column_is_an_error_not_a_switch_to_the_chunk_column(tmp_path):
    """One bad NER tag ('0' for 'O') used to make the chunk column the only all-tags column, so every
    sentence was silently labelled NP/VP; now the last column is the tag and the typo names its line."""
    p = tmp_path / "c03.conll"
    p.write_text(C03.replace("call NN I-NP O", "call NN I-NP 0"))
    with pytest.raises(DataFormatError, match=r"c03\.conll:6: tag '0' \(column 3\) is not O") as e:
        load_conll(p)
    assert e.value.where == 6
    good = tmp_path / "good.conll"
    good.write_text(C03)
    c = load_conll(good)
    assert c.examples("doc-0")[0].tags == ("B-ORG", "O", "B-MISC", "O")
    assert any("column 2 also holds tags (a chunk column, as in CoNLL-2003?); the tag is read from the last, column 3" in n for n in c.notes)


@pytest.mark.parametrize("at", [4, 1801])  # inside the detection sample, and after it
def test_a_line_with_an_extra_column_is_an_error_naming_it(tmp_path, at):
    """'New York' with a space shifts the columns: the chunk tag would be read as the NER tag."""
    lines = []
    while len(lines) < at + 10:
        lines += ["EU NNP B-NP B-ORG", "rejects VBZ B-VP O", ""]
    lines[at - 1] = "New York NNP B-NP B-LOC"
    p = tmp_path / "shifted.conll"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match="5 columns where the file's token lines have 4") as e:
        load_conll(p)
    assert e.value.where == at


def test_a_no_break_space_is_part_of_a_token(tmp_path):
    p = tmp_path / "nbsp.conll"
    p.write_text("It PRP B-NP O\ncosts VBZ B-VP O\n10\u00a0000 CD B-NP B-MONEY\n")
    (s,) = [s for _, s in iter_sentences(p)]
    assert s.tokens == ("It", "costs", "10\u00a0000") and s.tags == ("O", "O", "B-MONEY")
    alone = tmp_path / "alone.conll"
    alone.write_text("a\tO\n\u00a0\tO\n")
    with pytest.raises(DataFormatError, match="empty token") as e:  # a no-break space alone is no token
        load_conll(alone)
    assert e.value.where == 2


def test_iob1_entity_starts_are_noted_and_read_as_b_on_request(tmp_path):
    p = tmp_path / "iob1.conll"
    p.write_text("EU NNP I-NP I-ORG\nrejects VBZ I-VP O\nGerman JJ I-NP I-MISC\n\nPeter NNP I-NP I-PER\nBlackburn NNP I-NP I-PER\nand CC O O\nBonn NNP I-NP I-LOC\n")
    kept = load_conll(p, users="sentences:1")
    assert kept.examples(kept.user_ids[0])[0].tags == ("I-ORG", "O", "I-MISC")
    assert any("4 I- tags begin an entity" in n and "pass iob='iob2'" in n for n in kept.notes)
    read = load_conll(p, users="sentences:1", iob="iob2")
    assert [read.examples(u)[0].tags for u in read.user_ids] == [("B-ORG", "O", "B-MISC"), ("B-PER", "I-PER", "O", "B-LOC")]
    assert any("read as B- (iob='iob2')" in n for n in read.notes)
    with pytest.raises(Exception, match="iob must be one of"):
        load_conll(p, iob="iob1")


def test_a_given_tag_column_is_not_called_detected(tmp_path):
    p = tmp_path / "t.conll"
    p.write_text("a\tO\tx\nb\n")
    with pytest.raises(DataFormatError) as e:
        load_conll(p, tag_column=1)
    assert "tag in column 1, the token's detected" in str(e.value) and "pass tag_column=" not in str(e.value)


def test_classic_mac_line_ends_are_refused(tmp_path):
    p = tmp_path / "mac.conll"
    p.write_bytes(b"EU\tB-ORG\rrejects\tO\r\rPeter\tB-PER\r")
    with pytest.raises(DataFormatError, match=r"mac\.conll:1: the file's lines end in a carriage return alone"):
        load_conll(p)


def test_spill_to_streams_the_sentences_to_disk_and_reads_the_same(tmp_path, wnut_train):
    """load_conll reads the file twice (its facts, then its sentences streamed): with spill_to the
    store is on disk, and the corpus is the one held in memory."""
    from fedpriv.data.stores import SqliteStore

    mem = load_conll(wnut_train, users="sentences:10")
    disk = load_conll(wnut_train, users="sentences:10", spill_to=tmp_path / "wnut.sqlite")
    assert isinstance(disk.store, SqliteStore)
    assert disk.user_ids == mem.user_ids and disk.notes == mem.notes and disk.info == mem.info
    assert all(disk.examples(u) == mem.examples(u) for u in mem.user_ids[:50])


def test_mapping_and_comment_ids_are_read_as_the_tables_read_ids(tmp_path):
    p = tmp_path / "x.conll"
    p.write_text("a\tO\n\nb\tO\n\nc\tO\n")
    m = tmp_path / "users.txt"
    m.write_text("alice\ncafe\u0301\nalice \n", encoding="utf-8-sig")  # a BOM, an NFD id, trailing space
    c = load_conll(p, users=f"mapping:{m}")
    assert {u: len(exs) for u, exs in c.users()} == {"alice": 2, "caf\u00e9": 1}
    m.write_text("alice\nnan\nbob\n")
    with pytest.raises(DataFormatError, match="user id 'nan' is a placeholder .* name the user of this sentence") as e:
        load_conll(p, users=f"mapping:{m}")
    assert e.value.where == 2
    q = tmp_path / "y.conll"
    q.write_text("# author = \ufeffann\na\tO\n\n# author = [deleted]\nb\tO\n")
    with pytest.raises(DataFormatError, match=r"sentence 2: its '# author = \[deleted\]' comment: user id '\[deleted\]' is a placeholder"):
        load_conll(q, users="comment:author")
    q.write_text("# author = \ufeffann\na\tO\n\n# author = ann \nb\tO\n")
    assert load_conll(q, users="comment:author").user_ids == ("ann",)
