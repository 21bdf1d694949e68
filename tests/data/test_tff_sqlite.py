"""The TFF Stack Overflow SQLite loader: hand-written tf.train.Example codec (cross-checked byte for
byte against the real ``protobuf`` package), the lazy store, the writer, and the errors."""

from __future__ import annotations

import math
import random
import sqlite3
import struct
from datetime import datetime, timezone

import numpy as np
import pytest

from fedpriv.data.examples import TextExample
from fedpriv.data.tff_sqlite import (
    TffSqliteStore,
    decode_example,
    encode_example,
    format_creation_date,
    load_tff_sqlite,
    parse_creation_date,
    write_tff_sqlite,
)
from fedpriv.errors import DataFormatError, FedprivError, SourceError


def utc(*args) -> float:
    return datetime(*args, tzinfo=timezone.utc).timestamp()


# ---- a tf.train.Example class built at run time from a descriptor (no TensorFlow needed) ---------


@pytest.fixture(scope="module")
def pb():
    """The tf.train.Example message classes, from the same field numbers/types as TF's example.proto."""
    pytest.importorskip("google.protobuf")
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="fedpriv_test_tf_example.proto", package="fedpriv_test", syntax="proto3")

    def message(name, fields, nested=(), oneof=None):
        m = fdp.message_type.add(name=name)
        if oneof:
            m.oneof_decl.add(name=oneof)
        for fname, number, ftype, label, type_name, packed, in_oneof in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name
            if packed:
                f.options.packed = True
            if in_oneof:
                f.oneof_index = 0
        for n in nested:
            m.nested_type.append(n)
        return m

    rep, opt = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    message("BytesList", [("value", 1, F.TYPE_BYTES, rep, None, False, False)])
    message("FloatList", [("value", 1, F.TYPE_FLOAT, rep, None, True, False)])
    message("Int64List", [("value", 1, F.TYPE_INT64, rep, None, True, False)])
    message(
        "Feature",
        [
            ("bytes_list", 1, F.TYPE_MESSAGE, opt, ".fedpriv_test.BytesList", False, True),
            ("float_list", 2, F.TYPE_MESSAGE, opt, ".fedpriv_test.FloatList", False, True),
            ("int64_list", 3, F.TYPE_MESSAGE, opt, ".fedpriv_test.Int64List", False, True),
        ],
        oneof="kind",
    )
    entry = descriptor_pb2.DescriptorProto(name="FeatureEntry")
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=opt)
    entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=opt, type_name=".fedpriv_test.Feature")
    entry.options.map_entry = True
    message("Features", [("feature", 1, F.TYPE_MESSAGE, rep, ".fedpriv_test.Features.FeatureEntry", False, False)], [entry])
    message("Example", [("features", 1, F.TYPE_MESSAGE, opt, ".fedpriv_test.Features", False, False)])

    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("fedpriv_test.Example"))


_PB_KIND = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}


def pb_features(msg) -> dict:
    """The protobuf message in the codec's ``{name: (kind, values)}`` form."""
    out = {}
    for name, feat in msg.features.feature.items():
        which = feat.WhichOneof("kind")
        out[name] = (_PB_KIND[which], list(getattr(feat, which).value)) if which else (None, [])
    return out


def pb_from_features(cls, features: dict):
    msg = cls()
    for name, (kind, values) in features.items():
        feat = msg.features.feature[name]
        if kind is None:
            continue
        lst = getattr(feat, {v: k for k, v in _PB_KIND.items()}[kind])
        lst.SetInParent()
        lst.value.extend(values)
    return msg


def canon(features: dict) -> dict:
    """Floats compared by their float32 bits (so NaN == NaN)."""
    return {
        k: (kind, [struct.pack("<f", v) if kind == "float" else v for v in vals]) for k, (kind, vals) in features.items()
    }


def random_features(rng: random.Random) -> dict:
    feats = {}
    for i in range(rng.randint(0, 5)):
        name = rng.choice(["tokens", "title", "score", "", "ü-name", f"f{i}", "x" * 200])
        kind = rng.choice(["bytes", "float", "int64", None])
        n = rng.choice([0, 1, 1, 2, 7, 300])
        if kind == "bytes":
            vals = [bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 5, 200]))) for _ in range(n)]
        elif kind == "float":
            vals = [float(np.float32(rng.uniform(-1e6, 1e6))) for _ in range(n)] + [0.0, -0.0, math.inf][: rng.randint(0, 3)]
        elif kind == "int64":
            vals = [rng.choice([0, 1, -1, 127, 128, 2**63 - 1, -(2**63), rng.randint(-(2**40), 2**40)]) for _ in range(n)]
        else:
            vals = []
        feats[name] = (kind, vals)
    return feats


def test_codec_matches_protobuf_byte_for_byte(pb):
    rng = random.Random(0)
    for _ in range(300):
        feats = random_features(rng)
        ours = encode_example(feats)
        msg = pb_from_features(pb, feats)
        # each map entry byte for byte; the whole message too unless a key is a prefix of another
        # (upb's deterministic mode puts "ab" before "a"; we use plain bytewise order)
        for name, feat in feats.items():
            assert encode_example({name: feat}) == pb_from_features(pb, {name: feat}).SerializeToString()
        names = list(feats)
        if not any(a != b and b.startswith(a) for a in names for b in names):
            assert ours == msg.SerializeToString(deterministic=True)
        # protobuf reads ours, we read protobuf's: both give the same features back
        assert canon(pb_features(pb.FromString(ours))) == canon(feats)
        assert canon(decode_example(msg.SerializeToString())) == canon(feats)


def test_codec_reads_unpacked_numbers_and_merges_like_protobuf(pb):
    def key(number, wire):
        return bytes([number << 3 | wire])

    def ld(number, payload):
        n, size = len(payload), b""
        while n >= 0x80:
            size, n = size + bytes([n & 0x7F | 0x80]), n >> 7
        return key(number, 2) + size + bytes([n]) + payload

    unpacked_ints = key(1, 0) + b"\x05" + key(1, 0) + b"\xff" * 9 + b"\x01"  # 5, -1
    unpacked_floats = key(1, 5) + struct.pack("<f", 1.5) + key(1, 5) + struct.pack("<f", -2.0)
    unknown = key(9, 0) + b"\x07" + key(10, 1) + b"\0" * 8 + key(11, 5) + b"\0" * 4 + ld(12, b"zz")
    unknown += key(1, 0) + b"\x01"  # a known field number with the wrong wire type: skipped too
    features = (
        ld(1, ld(1, b"i") + ld(2, ld(3, unpacked_ints) + unknown))
        + ld(1, ld(1, b"f") + ld(2, ld(2, unpacked_floats)))
        + ld(1, ld(1, b"m") + ld(2, ld(1, ld(1, b"a")) + ld(1, ld(1, b"b"))))  # same oneof member twice: merged
        + ld(1, ld(1, b"o") + ld(2, ld(1, ld(1, b"a")) + ld(3, ld(1, b"\x01\x02"))))  # different member: replaced
        + ld(1, ld(1, b"d") + ld(2, ld(1, ld(1, b"old"))))
        + ld(1, ld(1, b"d") + ld(2, ld(1, ld(1, b"new"))))  # repeated map key: last wins
    )
    data = ld(1, features) + unknown
    ours = decode_example(data)
    assert ours == {
        "i": ("int64", [5, -1]),
        "f": ("float", [1.5, -2.0]),
        "m": ("bytes", [b"a", b"b"]),
        "o": ("int64", [1, 2]),
        "d": ("bytes", [b"new"]),
    }
    assert pb_features(pb.FromString(data)) == ours


def test_corrupt_bytes_raise_data_format_error_only(pb):
    from google.protobuf.message import DecodeError
    from google.protobuf.unknown_fields import UnknownFieldSet

    rng = random.Random(1)
    good = [encode_example(random_features(rng)) for _ in range(40)]
    good.append(encode_example({"tokens": ("bytes", [b"hello world"]), "score": ("int64", [-3])}))
    accepted = rejected = 0
    for data in good:
        variants = [data[:cut] for cut in range(len(data))] if len(data) < 400 else [data[: len(data) // 2]]
        for _ in range(30):
            b = bytearray(data)
            for _ in range(rng.randint(1, 3)):
                if b:
                    b[rng.randrange(len(b))] = rng.getrandbits(8)
            variants.append(bytes(b))
        for v in variants:
            # we reject exactly what protobuf rejects, and read the rest the same way
            try:
                msg = pb.FromString(v)
            except DecodeError:
                with pytest.raises(DataFormatError) as err:
                    decode_example(v, "f.sqlite", "client 7, row 3")
                assert str(err.value).startswith("f.sqlite (client 7, row 3): corrupt tf.train.Example")
                rejected += 1
                continue
            ours = decode_example(v)
            theirs = canon(pb_features(msg))
            if canon(ours) != theirs:
                # upb (not C++ protobuf) moves a map entry holding unknown fields to the unknown
                # fields of Features; we keep the entry, as C++ does. Nothing else may differ.
                assert len(UnknownFieldSet(msg.features)) > 0, v.hex()
                assert theirs.items() <= canon(ours).items(), v.hex()
            accepted += 1
    assert accepted > 100 and rejected > 100
    with pytest.raises(DataFormatError, match="truncated varint"):
        decode_example(b"\x0a\x80")
    with pytest.raises(DataFormatError, match="runs past the end"):
        decode_example(b"\x0a\x05\x0a")
    with pytest.raises(DataFormatError, match="longer than 10 bytes"):
        decode_example(b"\x08" + b"\xff" * 11)


def test_encode_infers_kinds_and_refuses_bad_values():
    assert decode_example(encode_example({"a": "x", "b": 3, "c": [1.5, 2], "d": [b"p", "q"]})) == {
        "a": ("bytes", [b"x"]),
        "b": ("int64", [3]),
        "c": ("float", [1.5, 2.0]),
        "d": ("bytes", [b"p", b"q"]),
    }
    with pytest.raises(FedprivError):
        encode_example({"a": []})
    with pytest.raises(FedprivError):
        encode_example({"a": ("int64", [2**63])})
    with pytest.raises(FedprivError):
        encode_example({"a": [object()]})


# ---- creation_date ------------------------------------------------------------------------------


def test_creation_date_formats():
    assert parse_creation_date("2010-01-08 09:34:05 UTC") == utc(2010, 1, 8, 9, 34, 5)
    assert parse_creation_date("2008-08-10 08:28:52.1 UTC") == pytest.approx(utc(2008, 8, 10, 8, 28, 52) + 0.1)
    assert parse_creation_date("2010-01-08 09:34:05.297+00:00") == pytest.approx(utc(2010, 1, 8, 9, 34, 5) + 0.297)
    assert parse_creation_date("2010-01-08T11:34:05+02:00") == utc(2010, 1, 8, 9, 34, 5)
    assert parse_creation_date("2010-01-08 09:34:05") == utc(2010, 1, 8, 9, 34, 5)
    assert parse_creation_date("2010-01-08") == utc(2010, 1, 8)
    assert parse_creation_date("  ") is None
    with pytest.raises(ValueError):
        parse_creation_date("yesterday")
    t = utc(2017, 12, 31, 23, 59, 59) + 0.5
    assert format_creation_date(t) == "2017-12-31 23:59:59.5 UTC"
    assert format_creation_date(utc(2008, 8, 10, 8, 28, 52)) == "2008-08-10 08:28:52 UTC"
    assert parse_creation_date(format_creation_date(t)) == t


# ---- the store ----------------------------------------------------------------------------------

TRAIN = {
    "10": [
        {
            "tokens": "first  post\tof ten",
            "title": "t ten",
            "tags": ["sql", "median"],
            "creation_date": "2010-01-08 09:34:05 UTC",
            "score": 172,
            "type": "question",
        },
        {"tokens": "second", "title": "t ten", "creation_date": "2008-08-10 08:28:52.1 UTC", "score": -1},
        {"tokens": "third <URL> .", "creation_date": utc(2012, 5, 1)},
    ],
    "2": [
        {"tokens": "two a", "title": "a title", "creation_date": ""},
        {"tokens": "two b", "creation_date": datetime(2011, 1, 1, 12, 0)},
    ],
    "alice": [{"tokens": "from alice"}],
    "empty": [],
}
TEST = {"2": [{"tokens": "later", "creation_date": "2018-02-01 00:00:00 UTC"}], "7": [{"tokens": "seven"}]}
HELDOUT = {"30": [{"tokens": "held"}]}


@pytest.fixture
def so_file(tmp_path):
    return write_tff_sqlite(tmp_path / "stackoverflow.sqlite", TRAIN, "train", splits={"test": TEST, "heldout": HELDOUT})


def test_writer_uses_tff_schema(so_file, pb):
    con = sqlite3.connect(so_file)
    cols = {t: [(r[1], r[2], r[3]) for r in con.execute(f"PRAGMA table_info({t})")] for t in ("examples", "client_metadata")}
    assert cols["examples"] == [("split_name", "TEXT", 1), ("client_id", "TEXT", 1), ("serialized_example_proto", "BLOB", 1)]
    assert cols["client_metadata"] == [("client_id", "TEXT", 1), ("split_name", "TEXT", 1), ("num_examples", "INTEGER", 1)]
    meta = sorted(con.execute("SELECT split_name, client_id, num_examples FROM client_metadata"))
    assert meta == [
        ("heldout", "30", 1),
        ("test", "2", 1),
        ("test", "7", 1),
        ("train", "10", 3),
        ("train", "2", 2),
        ("train", "alice", 1),
    ]
    blob = con.execute("SELECT serialized_example_proto FROM examples WHERE client_id='10' ORDER BY rowid").fetchone()[0]
    con.close()
    # every example carries the six features TFF parses, each a single value of the right type
    assert pb_features(pb.FromString(blob)) == {
        "creation_date": ("bytes", [b"2010-01-08 09:34:05 UTC"]),
        "score": ("int64", [172]),
        "tags": ("bytes", [b"sql|median"]),
        "title": ("bytes", [b"t ten"]),
        "tokens": ("bytes", [b"first  post\tof ten"]),
        "type": ("bytes", [b"question"]),
    }
    assert not so_file.with_name(so_file.name + ".partial").exists()


def test_round_trip(so_file):
    corpus = load_tff_sqlite(so_file)
    assert corpus.name == "stackoverflow-tff:train"
    assert corpus.kind == "text"
    assert list(corpus.user_ids) == ["2", "10", "alice"]
    assert corpus.counts().tolist() == [2, 3, 1]
    assert corpus.examples("10") == [
        TextExample("first post of ten", utc(2010, 1, 8, 9, 34, 5)),
        TextExample("second", pytest.approx(utc(2008, 8, 10, 8, 28, 52) + 0.1)),
        TextExample("third <URL> .", utc(2012, 5, 1)),
    ]
    assert corpus.examples("2") == [TextExample("two a", None), TextExample("two b", utc(2011, 1, 1, 12))]
    assert [e.text for e in corpus.records()] == ["two a", "two b", "first post of ten", "second", "third <URL> .", "from alice"]

    test = load_tff_sqlite(so_file, split="test")
    assert test.name == "stackoverflow-tff:test"
    assert list(test.user_ids) == ["2", "7"]
    assert test.examples("2") == [TextExample("later", utc(2018, 2, 1))]
    assert load_tff_sqlite(so_file, split="heldout").counts().tolist() == [1]

    titles = load_tff_sqlite(so_file, field="title")
    assert [e.text for e in titles.examples("10")] == ["t ten", "t ten", ""]
    with pytest.raises(FedprivError, match="no user"):
        corpus.examples("7")  # a test-split client is not in train


def test_counts_without_client_metadata(so_file):
    con = sqlite3.connect(so_file)
    con.execute("DROP TABLE client_metadata")
    con.commit()
    con.close()
    corpus = load_tff_sqlite(so_file)
    assert list(corpus.user_ids) == ["2", "10", "alice"]
    assert corpus.counts().tolist() == [2, 3, 1]
    assert load_tff_sqlite(so_file, split="test").counts().tolist() == [1, 1]


def test_examples_are_read_only_when_asked(so_file):
    store = TffSqliteStore(so_file)
    statements: list[str] = []
    store._con.set_trace_callback(statements.append)
    assert store.counts().tolist() == [2, 3, 1]
    assert store.user_ids() == ("2", "10", "alice")
    assert not [s for s in statements if "serialized_example_proto" in s]
    store.examples("alice")
    reads = [s for s in statements if "serialized_example_proto" in s]
    assert len(reads) == 1 and "'alice'" in reads[0]
    store.close()


def test_corrupt_blob_names_file_client_and_row(so_file):
    con = sqlite3.connect(so_file)
    rowid = con.execute("SELECT rowid FROM examples WHERE split_name='train' AND client_id='10' ORDER BY rowid").fetchall()[1][0]
    con.execute("UPDATE examples SET serialized_example_proto=? WHERE rowid=?", (b"\x0a\x7f\x0a", rowid))
    con.commit()
    con.close()
    corpus = load_tff_sqlite(so_file)  # opening and counting never touch the blobs
    assert corpus.counts().tolist() == [2, 3, 1]
    assert len(corpus.examples("2")) == 2
    with pytest.raises(DataFormatError) as err:
        corpus.examples("10")
    assert err.value.path == str(so_file)
    assert err.value.where == f"client 10, row {rowid}"
    assert "corrupt tf.train.Example" in str(err.value)


def test_bad_features_are_data_format_errors(tmp_path):
    path = write_tff_sqlite(tmp_path / "bad.sqlite", {"1": [{"tokens": "ok", "creation_date": "not a date"}]})
    with pytest.raises(DataFormatError, match=r"client 1, row 1\): creation_date"):
        load_tff_sqlite(path).examples("1")
    con = sqlite3.connect(path)
    con.execute("UPDATE examples SET serialized_example_proto=?", (encode_example({"title": "no tokens"}),))
    con.commit()
    con.close()
    with pytest.raises(DataFormatError, match="no feature 'tokens'"):
        load_tff_sqlite(path).examples("1")
    con = sqlite3.connect(path)
    con.execute("UPDATE examples SET serialized_example_proto=?", (encode_example({"tokens": ("int64", [3])}),))
    con.commit()
    con.close()
    with pytest.raises(DataFormatError, match="not a single bytes value"):
        load_tff_sqlite(path).examples("1")


def test_file_errors(tmp_path, so_file):
    with pytest.raises(SourceError, match="no such file"):
        load_tff_sqlite(tmp_path / "absent.sqlite")

    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database " * 100)
    with pytest.raises(DataFormatError, match="not a readable SQLite file") as err:
        load_tff_sqlite(junk)
    assert err.value.path == str(junk)

    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE client_metadata (client_id TEXT, split_name TEXT, num_examples INTEGER)")
    con.commit()
    con.close()
    with pytest.raises(DataFormatError, match="no 'examples' table") as err:
        load_tff_sqlite(other)
    assert str(other) in str(err.value)

    con = sqlite3.connect(other)
    con.execute("CREATE TABLE examples (split_name TEXT, client_id TEXT, proto BLOB)")
    con.commit()
    con.close()
    with pytest.raises(DataFormatError, match="lacks columns"):
        load_tff_sqlite(other)

    with pytest.raises(FedprivError, match=r"no split 'validation'.*\['heldout', 'test', 'train'\]") as err:
        load_tff_sqlite(so_file, split="validation")
    assert str(so_file) in str(err.value)
    with pytest.raises(FedprivError, match="field must be one of"):
        load_tff_sqlite(so_file, field="tags")


def test_writer_refuses_bad_records_and_leaves_no_file(tmp_path):
    path = tmp_path / "w.sqlite"
    with pytest.raises(FedprivError, match="unknown Stack Overflow example keys"):
        write_tff_sqlite(path, {"1": [{"tokens": "a", "body": "b"}]})
    with pytest.raises(FedprivError, match="needs 'tokens'"):
        write_tff_sqlite(path, {"1": [{"title": "a"}]})
    with pytest.raises(FedprivError, match="given twice"):
        write_tff_sqlite(path, {"1": [{"tokens": "a"}]}, "train", splits={"train": {}})
    assert list(tmp_path.iterdir()) == []


# ---- rows that a loose file would lose silently (found by a fuzz of the loaders) -----------------

import fedpriv.data.tff_sqlite as tff_module  # noqa: E402
from fedpriv.data.sources import open_corpus  # noqa: E402

BLOB = encode_example({"tokens": "hello world", "creation_date": "2010-01-08 09:34:05 UTC"})


def raw_file(path, rows, *, client_type="TEXT", meta=None, index=True):
    """A file of the given ``(split, client_id, blob)`` rows, ``client_id`` declared ``client_type``
    (nullable), with ``client_metadata`` rows ``meta`` (``(client_id, split, count)``) when given,
    and TFF's index on ``(split_name, client_id)`` when ``index``."""
    con = sqlite3.connect(path)
    con.execute(f"CREATE TABLE examples (split_name TEXT, client_id {client_type}, serialized_example_proto BLOB)")
    con.executemany("INSERT INTO examples VALUES (?, ?, ?)", rows)
    if index:
        con.execute("CREATE INDEX idx_examples_client_id_split ON examples (split_name, client_id)")
    if meta is not None:
        con.execute(f"CREATE TABLE client_metadata (client_id {client_type}, split_name TEXT, num_examples INTEGER)")
        con.executemany("INSERT INTO client_metadata VALUES (?, ?, ?)", meta)
    con.commit()
    con.close()
    return path


def traced_open(path, **kw):
    """Open a store with every SQL statement of the opening recorded."""
    statements: list[str] = []

    class Traced(TffSqliteStore):
        def _open(self):
            self._con.set_trace_callback(statements.append)
            super()._open()

    return Traced(path, **kw), statements


@pytest.mark.parametrize("index", [True, False], ids=["tff-index", "no-index"])
def test_a_client_that_client_metadata_omits_is_refused(tmp_path, index):
    path = write_tff_sqlite(tmp_path / "so.sqlite", {"u1": [{"tokens": "hi there"}], "u2": [{"tokens": "second client"}, {"tokens": "x"}]})
    con = sqlite3.connect(path)
    con.execute("DELETE FROM client_metadata WHERE client_id='u2'")
    if not index:
        con.execute("DROP INDEX idx_examples_client_id_split")
    con.commit()
    con.close()
    with pytest.raises(DataFormatError) as err:
        load_tff_sqlite(path)  # it used to load u1 alone, u2's rows dropped unseen
    assert err.value.path == str(path) and err.value.where == "client u2"
    assert "table 'examples' holds rows of this client in split 'train', but client_metadata does not list it (it lists 1 client of the split)" in str(err.value)
    # metadata of another split only says nothing about this split's clients: they are read from 'examples'
    con = sqlite3.connect(path)
    con.execute("UPDATE client_metadata SET split_name='test'")
    con.commit()
    con.close()
    assert list(load_tff_sqlite(path).user_ids) == ["u1", "u2"]


def test_opening_enumerates_clients_by_index_seeks_and_reads_no_blob(so_file):
    store, statements = traced_open(so_file)
    assert store.user_ids() == ("2", "10", "alice")
    assert not [s for s in statements if "serialized_example_proto" in s]
    assert any("WITH RECURSIVE" in s for s in statements) and not any("SELECT DISTINCT client_id" in s for s in statements)
    store.close()
    con = sqlite3.connect(so_file)
    con.execute("DROP INDEX idx_examples_client_id_split")
    con.commit()
    con.close()
    store, statements = traced_open(so_file)  # without the index: one scan of the split, not a scan per client
    assert store.user_ids() == ("2", "10", "alice")
    assert any("SELECT DISTINCT client_id" in s for s in statements) and not any("WITH RECURSIVE" in s for s in statements)
    store.close()


@pytest.mark.parametrize("index", [True, False], ids=["index", "no-index"])
@pytest.mark.parametrize("with_meta", [True, False], ids=["metadata", "no-metadata"])
def test_a_null_client_id_is_refused_with_its_row(tmp_path, index, with_meta):
    rows = [("train", "u1", BLOB), ("train", None, BLOB), ("test", None, BLOB)]
    meta = [("u1", "train", 1)] if with_meta else None
    path = raw_file(tmp_path / "null.sqlite", rows, meta=meta, index=index)
    with pytest.raises(DataFormatError) as err:
        load_tff_sqlite(path)  # it used to give a user 'None' with no example
    assert str(err.value) == f"{path} (row 2): client_id is NULL: the row belongs to no client"


@pytest.mark.parametrize("index", [True, False], ids=["index", "no-index"])
@pytest.mark.parametrize("with_meta", [True, False], ids=["metadata", "no-metadata"])
def test_a_client_id_that_is_not_text_is_refused_with_its_row(tmp_path, index, with_meta):
    rows = [("train", "u1", BLOB), ("train", 12, BLOB), ("train", "12", BLOB)]
    meta = [("u1", "train", 1), ("12", "train", 1)] if with_meta else None
    path = raw_file(tmp_path / "int.sqlite", rows, client_type="", meta=meta, index=index)
    with pytest.raises(DataFormatError) as err:
        load_tff_sqlite(path)  # it used to give two users both named '12', one of them without its row
    assert err.value.where == "row 2"
    assert "client_id 12 is an integer, not text: TFF client ids are TEXT" in str(err.value)
    blob = raw_file(tmp_path / "blob.sqlite", [("train", "u1", BLOB), ("train", b"u2", BLOB)], index=index)
    with pytest.raises(DataFormatError, match=r"\(row 2\): client_id b'u2' is a BLOB, not text"):
        load_tff_sqlite(blob)


def test_client_metadata_with_a_non_text_or_repeated_client_is_refused(tmp_path):
    rows = [("train", "12", BLOB), ("train", "u1", BLOB)]
    path = raw_file(tmp_path / "m1.sqlite", rows, client_type="", meta=[(12, "train", 1), ("u1", "train", 1)])
    with pytest.raises(DataFormatError, match=r"m1.sqlite \(client_metadata\): a client_id of split 'train' is an integer \(12\), not text"):
        load_tff_sqlite(path)
    path = raw_file(tmp_path / "m2.sqlite", rows, meta=[("12", "train", 1), ("u1", "train", 1), ("12", "train", 1)])
    with pytest.raises(DataFormatError, match=r"m2.sqlite \(client_metadata, client 12\): the client is listed twice for split 'train'"):
        load_tff_sqlite(path)
    path = raw_file(tmp_path / "m3.sqlite", [("train", "a b", BLOB)], meta=[("u1", "train", 1)])
    with pytest.raises(DataFormatError) as err:
        load_tff_sqlite(path)
    assert err.value.where == "client 'a b'"


def test_an_empty_tokens_row_is_kept_as_tff_does_or_an_error_when_asked(tmp_path):
    path = write_tff_sqlite(tmp_path / "so.sqlite", {"u1": [{"tokens": "first"}, {"tokens": " \t "}, {"tokens": ""}], "u2": [{"tokens": "fine"}]})
    kept = load_tff_sqlite(path)
    assert kept.counts().tolist() == [3, 1]  # opening reads no blob: the rows are found when read
    assert [e.text for e in kept.examples("u1")] == ["first", "", ""]
    strict = load_tff_sqlite(path, empty_tokens="error")
    assert strict.examples("u2") == [TextExample("fine", None)]
    with pytest.raises(DataFormatError) as err:
        strict.examples("u1")
    assert err.value.path == str(path) and err.value.where == "client u1, row 2"
    assert "feature 'tokens' is empty" in str(err.value)
    with pytest.raises(DataFormatError, match="feature 'tokens' is empty"):
        open_corpus(str(path), empty_tokens="error").examples("u1")
    assert [e.text for e in load_tff_sqlite(path, field="title", empty_tokens="error").examples("u1")] == ["", "", ""]  # answers have no title: kept
    with pytest.raises(FedprivError, match="empty_tokens must be one of"):
        load_tff_sqlite(path, empty_tokens="skip")


def test_a_file_locked_by_a_writer_is_said_to_be_locked(so_file, monkeypatch):
    monkeypatch.setattr(tff_module, "BUSY_TIMEOUT_S", 0.05)
    store = TffSqliteStore(so_file)  # opened before the writer came
    writer = sqlite3.connect(so_file, isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(SourceError) as err:
            load_tff_sqlite(so_file)
        assert str(err.value).startswith(f"{so_file}: the file is locked by another process that is writing to it (database is locked")
        assert "not a readable" not in str(err.value)
        with pytest.raises(SourceError, match="locked by another process"):
            store.examples("alice")
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert store.examples("alice") == [TextExample("from alice", None)]
    store.close()


def test_a_client_listed_with_no_examples_is_no_user_and_is_noted(so_file):
    con = sqlite3.connect(so_file)
    con.execute("INSERT INTO client_metadata VALUES ('ghost', 'train', 0)")
    con.commit()
    corpus = load_tff_sqlite(so_file)
    assert list(corpus.user_ids) == ["2", "10", "alice"] and corpus.counts().tolist() == [2, 3, 1]
    assert corpus.info["empty_clients"] == 1
    assert "1 clients of split 'train' are listed in client_metadata with 0 examples and are not users" in corpus.notes[0]
    con.execute("UPDATE client_metadata SET num_examples = 0 WHERE client_id = 'alice' AND split_name = 'train'")
    con.commit()
    con.close()
    with pytest.raises(DataFormatError, match="client alice.*num_examples is 0 but table 'examples' holds rows of this client"):
        load_tff_sqlite(so_file)
