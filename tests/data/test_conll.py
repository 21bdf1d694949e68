"""CoNLL/IOB loader on WNUT-17 and NCBI-disease, user rules, and malformed input."""

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedpriv.data.conll import iter_sentences, load_conll
from fedpriv.errors import DataFormatError, FedprivError


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
        ("a\tO\nb\n", 2, "expected 'token<TAB>tag'"),
        ("a\tO\n\nb\tPERSON\n", 3, "tag .PERSON. is not O or B-"),
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
    for rule in ("sentences:0", "sentences:x", "clients:0", "clients:two", "speaker"):
        with pytest.raises(FedprivError, match="users rule"):
            load_conll(p, users=rule)
    p.write_text("\n\n-DOCSTART- O\n\n")
    with pytest.raises(FedprivError, match="no sentences"):
        load_conll(p)


_lines = st.one_of(
    st.text(max_size=30),
    st.builds(lambda t, g: f"{t}\t{g}", st.text(max_size=8), st.sampled_from(["O", "B-PER", "I-LOC", "X", "B-", ""])),
    st.just("-DOCSTART- -X- O"),
    st.just(""),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(_lines, max_size=20), junk=st.binary(max_size=8), rule=st.sampled_from(["document", "sentences:3"]))
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
