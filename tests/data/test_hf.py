"""load_hf_dataset: local Dataset / save_to_disk folders equal the JSONL corpus of the same rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from itertools import islice
from pathlib import Path

import pytest

from fedpriv.data.conll import iter_sentences
from fedpriv.data.hf import HFNaturalIdStore, load_hf_dataset  # sets the offline env vars first
from fedpriv.data.tabular import load_table
from fedpriv.data.tokenize import normalize
from fedpriv.errors import DataFormatError, EmptyCorpusError, FedprivError, SourceError

datasets = pytest.importorskip("datasets")

USERS = ["10", "2", "alice", "2", "10", "10", "bob", "2", "alice", "1"]
NCBI = Path(__file__).resolve().parent / "ncbi-disease" / "train.tsv"


def ncbi_sentences(n: int) -> list[tuple[list[str], list[str]]]:
    """The first ``n`` sentences of the NCBI-disease IOB file: (tokens, tags)."""
    return [(list(s.tokens), list(s.tags)) for _, s in islice(iter_sentences(NCBI), n)]


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return [
        {"user_id": u, "text": " ".join(toks), "tokens": toks, "tags": tags, "ts": f"2024-01-{i + 1:02d}T08:00:00Z"}
        for i, (u, (toks, tags)) in enumerate(zip(USERS, ncbi_sentences(len(USERS))))
    ]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def snapshot(c) -> tuple:
    return c.kind, [(u, exs) for u, exs in c.users()], c.counts().tolist()


def test_importing_the_module_turns_the_hub_off():
    env = {k: v for k, v in os.environ.items() if k not in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")}
    code = (
        "import os, fedpriv.data.hf, datasets; "
        "print(os.environ['HF_DATASETS_OFFLINE'], os.environ['HF_HUB_OFFLINE'], datasets.config.HF_HUB_OFFLINE)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "1", "True"]


def test_in_memory_and_saved_dataset_equal_the_jsonl_corpus(tmp_path, rows):
    want_text = snapshot(load_table(write_jsonl(tmp_path / "t.jsonl", rows), timestamp_column="ts"))
    want_tagged = snapshot(load_table(tmp_path / "t.jsonl", tokens_column="tokens", tags_column="tags", timestamp_column="ts"))
    ds = datasets.Dataset.from_list(rows)
    got = load_hf_dataset(ds, user_column="user_id", timestamp_column="ts")
    assert isinstance(got.store, HFNaturalIdStore)
    assert snapshot(got) == want_text
    assert list(got.user_ids) == ["1", "2", "10", "alice", "bob"]
    tagged = load_hf_dataset(ds, user_column="user_id", tokens_column="tokens", tags_column="tags", timestamp_column="ts")
    assert snapshot(tagged) == want_tagged

    ds.save_to_disk(str(tmp_path / "saved"))
    again = load_hf_dataset(tmp_path / "saved", user_column="user_id", timestamp_column="ts")
    assert snapshot(again) == want_text
    assert again.name == "saved"


def test_classlabel_tags_become_names(tmp_path, rows):
    names = sorted({t for r in rows for t in r["tags"]})
    features = datasets.Features(
        {
            "user_id": datasets.Value("string"),
            "tokens": datasets.List(datasets.Value("string")),
            "tags": datasets.List(datasets.ClassLabel(names=names)),
        }
    )
    ds = datasets.Dataset.from_dict(
        {
            "user_id": [r["user_id"] for r in rows],
            "tokens": [r["tokens"] for r in rows],
            "tags": [[names.index(t) for t in r["tags"]] for r in rows],
        },
        features=features,
    )
    got = load_hf_dataset(ds, user_column="user_id", tokens_column="tokens", tags_column="tags")
    want = load_table(write_jsonl(tmp_path / "t.jsonl", rows), tokens_column="tokens", tags_column="tags")
    assert snapshot(got) == snapshot(want)


def test_integer_user_ids_in_natural_order():
    ds = datasets.Dataset.from_dict({"uid": [10, 2, 1, 2, 100], "text": ["a", "b", "c", "d", "e"]})
    c = load_hf_dataset(ds, user_column="uid")
    assert list(c.user_ids) == ["1", "2", "10", "100"]
    assert [e.text for e in c.examples("2")] == ["b", "d"]
    with pytest.raises(FedprivError, match="no user '3'"):
        c.examples("3")


def test_users_with_only_empty_examples_are_dropped():
    ds = datasets.Dataset.from_dict({"u": ["a", "b", "b"], "text": ["  ", "x", "..."]})
    c = load_hf_dataset(ds, user_column="u")
    assert list(c.user_ids) == ["b"] and c.counts().tolist() == [2]
    with pytest.raises(EmptyCorpusError):
        load_hf_dataset(datasets.Dataset.from_dict({"u": ["a"], "text": [" "]}), user_column="u")
    with pytest.raises(EmptyCorpusError, match="no rows"):
        load_hf_dataset(datasets.Dataset.from_dict({"u": [], "text": []}), user_column="u")


def test_dataset_dict_needs_a_split(tmp_path, rows):
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:6]), "test": datasets.Dataset.from_list(rows[6:])})
    with pytest.raises(FedprivError, match="split="):
        load_hf_dataset(dd, user_column="user_id")
    with pytest.raises(FedprivError, match="no split 'dev'"):
        load_hf_dataset(dd, user_column="user_id", split="dev")
    assert load_hf_dataset(dd, user_column="user_id", split="test").num_examples == 4
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(FedprivError, match="DatasetDict"):
        load_hf_dataset(tmp_path / "dd", user_column="user_id")
    assert load_hf_dataset(tmp_path / "dd", user_column="user_id", split="train").num_examples == 6
    with pytest.raises(FedprivError, match="not a DatasetDict"):
        load_hf_dataset(dd["train"], user_column="user_id", split="train")


def test_missing_column_names_it_and_the_available_ones(rows):
    ds = datasets.Dataset.from_list(rows)
    with pytest.raises(FedprivError, match=r"'who'.*'user_id'.*'text'.*pass user_column= to name yours") as e:
        load_hf_dataset(ds, user_column="who")
    assert not isinstance(e.value, DataFormatError)
    with pytest.raises(FedprivError, match="'labels'"):
        load_hf_dataset(ds, user_column="user_id", tokens_column="tokens", tags_column="labels")


def test_saved_dataset_opens_with_the_tables_default_user_column(tmp_path, rows, capsys):
    """A save_to_disk folder through the SOURCE spec and the CLI, users from ``user_id`` as for the
    tables; a folder without that column is refused naming the columns it has."""
    from fedpriv.cli import main
    from fedpriv.data.sources import open_corpus

    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    c = open_corpus(str(tmp_path / "saved"))
    assert c.num_users == 5 and c.num_examples == 10
    assert main(["data", "inspect", str(tmp_path / "saved"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["users"] == 5
    datasets.Dataset.from_dict({"author": ["a", "b", "a"], "body": ["x y", "z", "w"]}).save_to_disk(str(tmp_path / "other"))
    assert main(["data", "inspect", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err
    assert "no column(s) 'user_id', 'text'; the dataset has columns 'author', 'body' (pass user_column=, text_column= to name yours)" in err
    named = open_corpus(str(tmp_path / "other"), user_column="author", text_column="body")
    assert named.num_users == 2 and named.counts().tolist() == [2, 1]
    skipped = load_hf_dataset(datasets.Dataset.from_dict({"user_id": ["a", "b"], "text": ["x", " "]}))
    assert skipped.info["skipped_empty"] == 1 and "1 rows" in skipped.notes[0]


def test_bad_rows_name_the_row():
    ds = datasets.Dataset.from_dict({"u": ["a", "b", None], "text": ["x", "y", "z"]})
    with pytest.raises(DataFormatError, match="null user id") as e:
        load_hf_dataset(ds, user_column="u")
    assert e.value.where == "row 3"
    ds = datasets.Dataset.from_dict({"u": ["a", "b"], "tokens": [["x"], ["y", "z"]], "tags": [["O"], ["O"]]})
    with pytest.raises(DataFormatError, match="2 tokens but 1 tags") as e:
        load_hf_dataset(ds, user_column="u", tokens_column="tokens", tags_column="tags")
    assert e.value.where == "row 2"


def test_missing_or_unsaved_folder_is_a_source_error(tmp_path):
    with pytest.raises(SourceError, match="no such dataset folder"):
        load_hf_dataset(tmp_path / "nope", user_column="u")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="save_to_disk"):
        load_hf_dataset(tmp_path / "empty", user_column="u")
    damaged = tmp_path / "damaged"
    datasets.Dataset.from_dict({"u": ["a"], "text": ["x"]}).save_to_disk(str(damaged))
    (damaged / "state.json").write_text("{}")  # was: an internal KeyError
    with pytest.raises(SourceError, match="or a damaged one"):
        load_hf_dataset(damaged, user_column="u")


def test_user_ids_follow_the_table_rules(tmp_path, rows):
    """Ids that differ only in whitespace are one user (as in a table), placeholders are skipped."""
    ids = ["alice", " bob", "alice ", "[deleted]", "bob", "alice"]
    table = [{"user_id": u, "text": r["text"]} for u, r in zip(ids, rows)]
    ds = datasets.Dataset.from_list(table)
    hf = load_hf_dataset(ds)
    jl = load_table(write_jsonl(tmp_path / "t.jsonl", table))
    assert hf.user_ids == jl.user_ids == ("alice", "bob")
    for user in ("alice", "bob"):  # the same examples in the same (file) order
        assert hf.examples(user) == jl.examples(user)
    assert [e.text for e in hf.examples("alice")] == [normalize(table[i]["text"]) for i in (0, 2, 5)]
    assert any("placeholder user id" in n for n in hf.notes)


def test_loading_and_reading_users_prints_no_progress_bar(tmp_path, capfd):
    """flwr-datasets' NaturalIdPartitioner printed ``Generating partition_id_to_indices: 449it ...``
    on stderr (a tqdm bar) when the first user was read, on ``fedpriv data inspect`` and in runs;
    datasets' own bars are off too. Both are as they were afterwards."""
    from flwr_datasets.partitioner import natural_id_partitioner

    from fedpriv.cli import main

    users = ["a", "b", "c", "a ", "b"]  # "a" and "a " are one user: its rows come from two partitions
    datasets.Dataset.from_dict({"user_id": users, "text": ["x y", "z", "w", "v", "u"]}).save_to_disk(str(tmp_path / "saved"))
    capfd.readouterr()  # saving prints datasets' bars: not ours
    bar, was_off = natural_id_partitioner.tqdm, datasets.are_progress_bars_disabled()
    c = load_hf_dataset(tmp_path / "saved")
    assert [(u, [e.text for e in exs]) for u, exs in c.users()] == [("a", ["x y", "v"]), ("b", ["z", "u"]), ("c", ["w"])]
    assert main(["data", "inspect", str(tmp_path / "saved"), "--json"]) == 0
    out, err = capfd.readouterr()
    assert json.loads(out)["users"] == 3
    assert "Generating" not in err and "it/s" not in err and "it [" not in err, err
    assert err == ""
    assert natural_id_partitioner.tqdm is bar and datasets.are_progress_bars_disabled() == was_off


def test_quiet_progress_restores_what_it_found():
    from flwr_datasets.partitioner import natural_id_partitioner

    from fedpriv.data.hf import quiet_progress

    bar = natural_id_partitioner.tqdm
    for off in (True, False):
        (datasets.disable_progress_bars if off else datasets.enable_progress_bars)()
        with quiet_progress():
            assert datasets.are_progress_bars_disabled() and natural_id_partitioner.tqdm is not bar
            with quiet_progress():
                assert datasets.are_progress_bars_disabled()
            assert datasets.are_progress_bars_disabled()
        assert datasets.are_progress_bars_disabled() == off and natural_id_partitioner.tqdm is bar
    datasets.enable_progress_bars()


def test_a_folder_of_per_user_text_files_points_to_how_to_load_them(tmp_path):
    """A folder of ``alice.txt``, ``bob.txt`` given as the source was refused as "not a dataset
    saved with save_to_disk" and nothing more; the refusal now says how such files load."""
    folder = tmp_path / "userdirs"
    folder.mkdir()
    (folder / "alice.txt").write_text("hello there\n", encoding="utf-8")
    (folder / "bob.txt").write_text("hi\n", encoding="utf-8")
    with pytest.raises(SourceError) as e:
        load_hf_dataset(folder)
    msg = str(e.value)
    assert msg.startswith(f"{folder}: not a dataset saved with save_to_disk") and "\n" not in msg
    assert "it holds 2 text file(s): a folder of per-user text files is not read as users" in msg
    assert "users=mapping:PATH" in msg and "docs/data.md, 'Plain text files, and a folder of per-user text files'" in msg
    page = (Path(__file__).resolve().parents[2] / "docs" / "data.md").read_text()
    assert "## Plain text files, and a folder of per-user text files" in page  # the section it names
    other = tmp_path / "tables"
    other.mkdir()
    (other / "a.jsonl").write_text("{}\n")
    with pytest.raises(SourceError, match=r"it holds 1 data file\(s\): give one file as the source$"):
        load_hf_dataset(other)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match=r"directory\.\)$"):  # nothing to point to
        load_hf_dataset(tmp_path / "empty")
