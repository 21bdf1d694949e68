"""FederatedCorpus: order rules, records, IID resharding, splits, filters, on-disk spill."""

from collections import Counter

import numpy as np
import pytest

from fedpriv.data.corpus import FederatedCorpus, stable_unit_hash
from fedpriv.data.examples import TaggedExample, TextExample
from fedpriv.data.shakespeare import load_shakespeare
from fedpriv.data.stores import MemoryStore, PackedStore, user_sort_key
from fedpriv.errors import EmptyCorpusError, FedprivError


def small() -> FederatedCorpus:
    return FederatedCorpus.from_dict(
        {
            "10": [TextExample("j k", 30.0)],
            "2": [TextExample("a b", 10.0), TextExample("c", 20.0), TextExample("d e f", 40.0)],
            "bob": [TextExample("x", 5.0), TextExample("y", 50.0)],
            "empty": [],
        },
        name="small",
    )


def test_users_in_natural_order_and_records_flatten_them():
    c = small()
    assert list(c.user_ids) == ["2", "10", "bob"]  # numeric ids numerically, empty user dropped
    assert c.counts().tolist() == [3, 1, 2]
    assert [e.text for e in c.records()] == ["a b", "c", "d e f", "j k", "x", "y"]
    assert [u for u, _ in c.users()] == list(c.user_ids)
    assert c.num_examples == 6


def test_user_sort_key_orders_numbers_numerically():
    ids = ["100", "9", "009", "a", "B", "10"]
    assert sorted(ids, key=user_sort_key) == ["009", "9", "10", "100", "B", "a"]


def test_unknown_user_is_a_fedpriv_error():
    with pytest.raises(FedprivError, match="no user 'nobody'"):
        small().examples("nobody")


def test_empty_corpus_refused():
    with pytest.raises(EmptyCorpusError):
        FederatedCorpus.from_dict({"a": [], "b": []})
    with pytest.raises(EmptyCorpusError):
        FederatedCorpus.from_stream(iter([]), "text")


def test_mixed_kinds_refused():
    with pytest.raises(FedprivError, match="mixed"):
        FederatedCorpus.from_dict({"a": [TextExample("x")], "b": [TaggedExample(("x",), ("O",))]})


def _multiset(corpus):
    return Counter(e.text for e in corpus.records())


def test_resharded_iid_keeps_users_counts_and_records():
    c = load_shakespeare()
    r = c.resharded_iid(seed=7)
    assert r.num_users == c.num_users
    assert r.counts().tolist() == c.counts().tolist()
    assert [len(exs) for _, exs in r.users()] == c.counts().tolist()
    assert _multiset(r) == _multiset(c)
    # The records really are shuffled across users: most synthetic users mix several speakers.
    speaker_of = {}
    for u, exs in c.users():
        for e in exs:
            speaker_of.setdefault(e.text, set()).add(u)
    big = [exs for _, exs in r.users() if len(exs) >= 20]
    mixed = sum(len(set().union(*(speaker_of[e.text] for e in exs))) > 3 for exs in big)
    assert mixed >= 0.9 * len(big)


def test_resharded_iid_is_deterministic_by_seed():
    c = load_shakespeare()
    a = [e.text for e in c.resharded_iid(1).records()]
    b = [e.text for e in c.resharded_iid(1).records()]
    d = [e.text for e in c.resharded_iid(2).records()]
    assert a == b
    assert a != d


def test_heldout_split_is_stable_and_partitions_users():
    c = load_shakespeare()
    train, held = c.split_heldout_users(0.2)
    assert set(train.user_ids).isdisjoint(held.user_ids)
    assert set(train.user_ids) | set(held.user_ids) == set(c.user_ids)
    assert 0.1 < held.num_users / c.num_users < 0.3
    # Stable: a user's side depends only on its id and the salt, not on the other users.
    sub = c.subset(list(c.user_ids)[:50])
    _, held_sub = sub.split_heldout_users(0.2)
    assert set(held_sub.user_ids) == set(held.user_ids) & set(sub.user_ids)
    assert all(stable_unit_hash(u, "fedpriv-heldout") < 0.2 for u in held.user_ids)
    # A different salt gives a different split.
    _, held2 = c.split_heldout_users(0.2, salt="other")
    assert set(held2.user_ids) != set(held.user_ids)


def test_heldout_split_refuses_bad_fraction_and_empty_side():
    with pytest.raises(FedprivError, match="fraction"):
        small().split_heldout_users(1.0)
    with pytest.raises(EmptyCorpusError):
        small().split_heldout_users(1e-9)


def test_split_by_time():
    before, after = small().split_by_time(25.0)
    assert {u: [e.text for e in exs] for u, exs in before.users()} == {"2": ["a b", "c"], "bob": ["x"]}
    assert {u: [e.text for e in exs] for u, exs in after.users()} == {"2": ["d e f"], "10": ["j k"], "bob": ["y"]}
    iso_before, _ = small().split_by_time("1970-01-01T00:00:25")
    assert iso_before.user_ids == before.user_ids


def test_split_by_time_needs_timestamps_and_nonempty_sides():
    no_time = FederatedCorpus.from_dict({"a": [TextExample("x")]})
    with pytest.raises(FedprivError, match="timestamps"):
        no_time.split_by_time(0)
    with pytest.raises(EmptyCorpusError, match="no user has any example left"):
        small().split_by_time(0.0)


def test_filters():
    c = small()
    assert list(c.with_min_examples(2).user_ids) == ["2", "bob"]
    with pytest.raises(EmptyCorpusError):
        c.with_min_examples(10)
    t = c.truncated(1)
    assert t.counts().tolist() == [1, 1, 1]
    assert [e.text for e in t.records()] == ["a b", "j k", "x"]


@pytest.mark.parametrize("cap", [3, 2**63 - 1, 2**63, 2**70])
def test_a_cap_above_every_users_count_keeps_every_example(cap):
    """data.max_examples_per_user = 2**70 (found by a sweep of config values through `config check`)
    was an OverflowError in numpy: a cap at or above the largest count keeps everything."""
    c = small()
    t = c.truncated(cap)
    assert t.counts().tolist() == c.counts().tolist()
    assert [e.text for e in t.records()] == [e.text for e in c.records()]


def test_truncated_needs_no_pass_over_a_lazy_store_and_equals_map_users():
    from fedpriv.data.synthetic import load_synthetic

    c = load_synthetic("synthetic:users=300,examples=6000,seed=2")
    t = c.truncated(7)
    assert c.store.generated == 0  # the counts come from the base's counts
    ref = c.map_users(lambda exs: exs[:7])
    assert t.user_ids == ref.user_ids and t.counts().tolist() == ref.counts().tolist() == [min(n, 7) for n in c.counts()]
    assert [e.text for e in t.records()] == [e.text for e in ref.records()]
    train, held = load_synthetic("synthetic:users=300,examples=6000,seed=2").split_heldout_users(0.2)
    assert train.store._base.generated == 0  # split and counted without building a user
    assert train.counts().tolist() == [len(train.examples(u)) for u in train.user_ids]
    assert held.num_examples + train.num_examples == 6000


def test_sample_users_is_deterministic_and_without_replacement():
    c = load_shakespeare()
    a, b = c.sample_users(50, seed=3), c.sample_users(50, seed=3)
    assert list(a.user_ids) == list(b.user_ids)
    assert len(set(a.user_ids)) == 50
    assert list(c.sample_users(50, seed=4).user_ids) != list(a.user_ids)
    with pytest.raises(FedprivError):
        c.sample_users(c.num_users + 1, seed=0)


def test_spill_to_disk_gives_the_same_corpus(tmp_path):
    c = load_shakespeare()
    pairs = ((u, e) for u, exs in c.users() for e in exs)
    disk = FederatedCorpus.from_stream(pairs, "text", spill_to=tmp_path / "s.sqlite")
    assert list(disk.user_ids) == list(c.user_ids)
    assert disk.counts().tolist() == c.counts().tolist()
    assert list(disk.records()) == list(c.records())
    assert np.array_equal(disk.resharded_iid(5).counts(), c.counts())
    assert [e.text for e in disk.resharded_iid(5).records()] == [e.text for e in c.resharded_iid(5).records()]


def test_spill_failure_leaves_no_file(tmp_path):
    def bad_stream():
        yield "a", TextExample("x")
        raise FedprivError("source broke")

    target = tmp_path / "s.sqlite"
    with pytest.raises(FedprivError, match="source broke"):
        FederatedCorpus.from_stream(bad_stream(), "text", spill_to=target)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where, message", [
    # found by a sweep of the loader options (spill_to="" and NUL: ValueError; a folder left a stray
    # "<folder>.partial" behind; an unwritable place: sqlite3.OperationalError)
    ("", "spill_to '': not a file path"),
    ("a\x00b", "spill_to 'a\\x00b': not a file path"),
    ("folder", "spill_to {tmp}/folder: not a file path (a folder is there)"),
    ("file/s.sqlite", "spill_to {tmp}/file/s.sqlite: cannot write a corpus store there (Not a directory)"),
])
def test_a_spill_target_that_cannot_be_written_is_refused_in_one_line(where, message, tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("x")
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(FedprivError) as e:
        FederatedCorpus.from_stream([("a", TextExample("x"))], "text", spill_to=str(tmp_path / where) if where.startswith(("folder", "file")) else where)
    assert str(e.value) == message.format(tmp=tmp_path)
    assert sorted(tmp_path.rglob("*")) == before


def test_a_spill_is_readable_by_its_owner_only(tmp_path):
    """A spill is a copy of the users' data: whatever the umask, other users cannot read it."""
    import os

    old = os.umask(0o022)
    try:
        FederatedCorpus.from_stream([("a", TextExample("x"))], "text", spill_to=tmp_path / "s.sqlite")
    finally:
        os.umask(old)
    assert (tmp_path / "s.sqlite").stat().st_mode & 0o777 == 0o600


def test_tagged_examples_spill_round_trip(tmp_path):
    ex = TaggedExample(("Empire", "State"), ("B-location", "I-location"), 1.5)
    disk = FederatedCorpus.from_stream([("u", ex)], "tagged", spill_to=tmp_path / "t.sqlite")
    assert disk.examples("u") == [ex]


# ---- the packed in-memory store (what from_stream builds without a spill) ----------------------

_AWKWARD_TEXTS = [
    "a b c", "", "a  b", " lead", "trail ", "tab\there", "nbsp\u00a0inside", "line\nbreak", "é ü 😀 中文", "a b c",
]


def _stream_of(texts, users, times):
    return [(u, TextExample(t, ts)) for u, t, ts in zip(users, texts, times)]


def test_packed_store_gives_back_every_example_exactly_in_user_then_source_order():
    users = ["10", "2", "bob", "2", "10", "02", "bob", "2", "x", "2"]
    times = [None, 1.5, 0.0, None, 3.0, -2.0, 1e9, None, 2.25, None]
    pairs = _stream_of(_AWKWARD_TEXTS, users, times)
    packed = FederatedCorpus.from_stream(iter(pairs), "text", name="p")
    # the reference keeps the empty text as the packed store does (from_dict would skip it)
    want = FederatedCorpus(MemoryStore({u: [e for v, e in pairs if v == u] for u in dict.fromkeys(users)}, "text"))
    assert isinstance(packed.store, PackedStore)
    assert list(packed.user_ids) == list(want.user_ids) == ["02", "2", "10", "bob", "x"]
    assert packed.counts().tolist() == want.counts().tolist()
    for u in want.user_ids:
        got = packed.examples(u)
        assert got == want.examples(u)  # texts as written (un-normalized ones too) and timestamps, None kept None
        assert [type(e.timestamp) for e in got] == [type(e.timestamp) for e in want.examples(u)]
    assert list(packed.records()) == list(want.records())
    # only the texts that single spaces do not rebuild are kept aside
    assert sorted(e.text for e in packed.store._aside.values()) == sorted(t for t in _AWKWARD_TEXTS if " ".join(t.split()) != t)


def test_packed_store_word_ids_are_the_split_words_of_its_examples():
    users = ["b", "a", "b", "a", "c"]
    texts = ["x y z", "y  y", "", "z x", "w"]
    packed = FederatedCorpus.from_stream(iter(_stream_of(texts, users, [None] * 5)), "text")
    table = packed.store.word_table()
    for u in packed.user_ids:
        ids, lengths = packed.store.word_ids(u)
        words = [table[i] for i in ids.tolist()]
        exs = packed.examples(u)
        assert lengths.tolist() == [len(e.text.split()) for e in exs]
        assert words == [w for e in exs for w in e.text.split()]
    # the flat read through the word table equals the read that splits every text
    flat = packed.flat_text()
    fallback = FederatedCorpus(MemoryStore({u: packed.examples(u) for u in packed.user_ids}, "text")).flat_text()  # the empty text kept
    assert flat.num_examples == fallback.num_examples == 5
    assert [flat.example_words(i) for i in range(5)] == [fallback.example_words(i) for i in range(5)]


def test_packed_store_keeps_tagged_examples():
    pairs = [
        ("u2", TaggedExample(("Empire", "State"), ("B-loc", "I-loc"), 1.5)),
        ("u1", TaggedExample(("a",), ("O",))),
        ("u2", TaggedExample((), ())),
        ("u1", TaggedExample(("State", "a"), ("B-loc", "O"), 0.0)),
    ]
    packed = FederatedCorpus.from_stream(iter(pairs), "tagged")
    assert list(packed.user_ids) == ["u1", "u2"]
    assert packed.examples("u1") == [pairs[1][1], pairs[3][1]]
    assert packed.examples("u2") == [pairs[0][1], pairs[2][1]]
    assert packed.store.word_table() is None  # flat text is for text corpora


def test_packed_store_refuses_no_examples_and_mixed_kinds_naming_the_corpus():
    with pytest.raises(EmptyCorpusError, match="^mine: the source produced no examples"):
        FederatedCorpus.from_stream(iter([]), "text", name="mine")
    with pytest.raises(FedprivError, match="^mine: mixed example kinds"):
        FederatedCorpus.from_stream(iter([("a", TextExample("x")), ("b", TaggedExample(("x",), ("O",)))]), "text", name="mine")
    with pytest.raises(FedprivError, match="no user 'nobody'"):
        FederatedCorpus.from_stream(iter([("a", TextExample("x"))]), "text").examples("nobody")


def test_packed_store_holds_no_object_per_example():
    n = 20_000
    pairs = ((f"u{i % 997}", TextExample(f"w{i % 50} v{i % 7} common", float(i))) for i in range(n))
    store = FederatedCorpus.from_stream(pairs, "text").store
    assert store.counts().sum() == n
    assert store._aside == {}
    arrays = [store._tokens, store._starts, store._times, store._has_time, store._user_starts]
    assert all(isinstance(a, np.ndarray) for a in arrays)
    assert len(store._words) == 50 + 7 + 1 and len(store._ids) == 997  # one string per distinct word and per user


@pytest.mark.parametrize("block", [1, 3, 1 << 16])
def test_grouping_examples_by_user_moves_each_examples_words_whole(block):
    from fedpriv.data.stores import _grouped

    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 5, size=50)
    runs = [rng.integers(0, 1000, size=n).astype(np.int32) for n in lengths]
    flat = np.concatenate(runs)
    for order in (rng.permutation(50), np.arange(50)):
        starts = np.concatenate([[0], np.cumsum(lengths[order])])
        got, twice = _grouped([flat, flat * 2], lengths, order, starts, block=block)
        assert got.tolist() == np.concatenate([runs[i] for i in order]).tolist()
        assert twice.tolist() == (got * 2).tolist()


def test_packed_store_keeps_a_timestamp_that_is_no_float_exactly():
    big = 2**60 + 1  # no float64 holds it
    pairs = [("a", TextExample("x y", big)), ("a", TextExample("z", 5))]
    packed = FederatedCorpus.from_stream(iter(pairs), "text")
    got = packed.examples("a")
    assert [e.timestamp for e in got] == [big, 5] and type(got[1].timestamp) is int
    tagged = FederatedCorpus.from_stream(iter([("b", TaggedExample(("t",), ("O",), 10**400))]), "tagged")
    assert tagged.examples("b")[0].timestamp == 10**400


# ---- from_dict reads its keys and examples as the file loaders do ------------------------------


def test_from_dict_refuses_two_keys_that_are_one_user_id_naming_both():
    """``1`` and ``"1"`` both print as user ``"1"``: the second used to replace the first, whose
    examples were lost without a word."""
    users = {1: [TextExample("hello world")], "1": [TextExample("other person")], "u2": [TextExample("x")]}
    with pytest.raises(FedprivError, match=r"^mine: the user keys 1 and '1' are both the user id '1'"):
        FederatedCorpus.from_dict(users, name="mine")
    # Read as the loaders read ids: trimmed and in NFC form ("e" + combining acute is "é").
    with pytest.raises(FedprivError, match=r"the user keys 'ann' and 'ann ' are both the user id 'ann'"):
        FederatedCorpus.from_dict({"ann": [TextExample("a")], "ann ": [TextExample("b")]})
    with pytest.raises(FedprivError, match="are both the user id 'ren\u00e9'"):
        FederatedCorpus.from_dict({"ren\u00e9": [TextExample("a")], "rene\u0301": [TextExample("b")]})
    assert FederatedCorpus.from_dict({" Ann ": [TextExample("a")], "ann": [TextExample("b")]}).user_ids == ("Ann", "ann")  # case kept, as the loaders keep it


def test_from_dict_notes_ids_that_differ_only_in_case_or_spacing_as_the_loaders_do():
    """Kept apart, so one person with two such keys is two users (group privacy): said in the
    loaders' note, with the counts only, and a remedy that applies to a dict."""
    c = FederatedCorpus.from_dict({"Ann": [TextExample("a")], "ann": [TextExample("b")], "ANN": [TextExample("c")],
                                   "John Smith": [TextExample("d")], "John  Smith": [TextExample("e")], "bob": [TextExample("f")]}, name="mine")
    assert c.num_users == 6
    assert c.notes == [
        "1 groups of user ids of mine (3 ids) differ only in letter case; they are kept apart, so one person with k such ids counts "
        "as k users, and a per-user epsilon covers that person only as k users (group privacy); give each group one key if it is one person",
        "1 groups of user ids of mine (2 ids) differ only in spacing, character width or invisible characters ('John Smith', "
        "'John  Smith', 'Ｊｏｈｎ Smith'); they are kept apart, so one person with k such ids counts as k users, and a per-user "
        "epsilon covers that person only as k users (group privacy)",
    ]
    assert c.info["user_ids_differing_in_case"] == 3 and c.info["user_ids_differing_in_spacing"] == 2
    assert FederatedCorpus.from_dict({"ann": [TextExample("a")], "bob": [TextExample("b")]}).notes == []


def test_from_dict_refuses_values_that_are_no_examples_in_one_line():
    with pytest.raises(FedprivError, match=r"^corpus: user 'a' holds str 'hello'; examples are TextExample or TaggedExample"):
        FederatedCorpus.from_dict({"a": ["hello"]})


def test_from_dict_skips_empty_examples_with_the_loaders_note(tmp_path):
    """Empty and whitespace-only texts (and tagged examples without tokens) are no examples: they
    are skipped and counted with the note the table loaders write, not kept silently."""
    c = FederatedCorpus.from_dict({1: [TextExample("hello world")], "u2": [TextExample(""), TextExample("   ")], "u3": [TextExample("a"), TextExample("\t")]})
    assert [(u, [e.text for e in exs]) for u, exs in c.users()] == [("1", ["hello world"]), ("u3", ["a"])]
    assert c.notes == ["3 examples of corpus have an empty text and were skipped"]
    assert c.info["skipped_empty"] == 3
    # the same words as a table loader's note for its empty rows
    from fedpriv.data.tabular import load_table

    p = tmp_path / "t.jsonl"
    p.write_text('{"user_id": "a", "text": "x"}\n{"user_id": "a", "text": "  "}\n', encoding="utf-8")
    assert load_table(p).notes == ["1 rows of t.jsonl have an empty text and were skipped"]
    tagged = FederatedCorpus.from_dict({"a": [TaggedExample(("x",), ("O",)), TaggedExample((), ())]}, name="t")
    assert tagged.notes == ["1 examples of t have an empty token list and were skipped"] and tagged.num_examples == 1
    with pytest.raises(EmptyCorpusError, match="no users with examples"):
        FederatedCorpus.from_dict({"a": [TextExample(" ")]})
    assert FederatedCorpus.from_dict({"a": [TextExample("x")]}).notes == []  # nothing skipped, nothing said


def test_an_integer_user_id_reads_the_user_it_prints():
    """Ids are strings; ``corpus.examples(1004)`` used to say "no user 1004" although user
    ``"1004"`` is there."""
    c = FederatedCorpus.from_dict({"1004": [TextExample("a b")], "bob": [TextExample("c")]})
    assert c.examples(1004) == c.examples("1004") == [TextExample("a b")]
    assert c[1004] == [TextExample("a b")]
    assert 1004 in c and "1004" in c and 7 not in c
    assert c.examples(np.int64(1004)) == [TextExample("a b")]
    with pytest.raises(FedprivError, match=r"no user 7 \(user ids are strings, such as '1004'\)"):
        c.examples(7)
    with pytest.raises(FedprivError, match=r"no user True"):  # a bool is no id
        c.examples(True)
