"""Loader options as a user gives them (``-o KEY=VALUE``, read as JSON; ``data.options`` of a
config): an option of the wrong type is refused in one line naming the source and the option."""

from pathlib import Path

import pytest

from fedpriv.cli import main
from fedpriv.data.sources import open_corpus
from fedpriv.errors import SourceError

POSTS = Path(__file__).parent / "stackexchange-coffee" / "Posts.xml"


def _jsonl(tmp_path: Path) -> Path:
    p = tmp_path / "d.jsonl"
    p.write_text('{"user_id": "a", "text": "hello world"}\n{"user_id": "b", "text": "good day"}\n', encoding="utf-8")
    return p


def _sqlite(tmp_path: Path) -> Path:
    from fedpriv.data.tff_sqlite import write_tff_sqlite

    return write_tff_sqlite(tmp_path / "so.sqlite", {"u0": [{"tokens": "a b c"}]})


@pytest.mark.parametrize("source, option, value, want", [
    # found by a sweep of every loader option with JSON values of each type: each was an internal error
    ("jsonl", "user_column", "[1]", "a string"),              # TypeError: unhashable type: 'list'
    ("jsonl", "text_column", '{"a": 1}', "a string"),         # TypeError: unhashable type: 'dict'
    ("jsonl", "timestamp_column", "[]", "a string or null"),  # TypeError
    ("jsonl", "spill_to", "5", "a string or null"),           # TypeError in pathlib
    ("jsonl", "normalize_text", '"no"', "true or false"),     # (was read as true)
    ("posts", "post_types", "1", "a list (each a string) or null"),  # TypeError: argument of type 'int' is not iterable
    ("posts", "drop_owners", "null", "a list (each a string or an integer)"),  # TypeError: 'NoneType' object is not iterable
    ("posts", "drop_owners", "1.5", "a list (each a string or an integer)"),
    ("sqlite", "split", str(2**70), "a string"),              # OverflowError: Python int too large to convert to SQLite INTEGER
])
def test_a_loader_option_of_the_wrong_type_is_refused_in_one_line(source, option, value, want, tmp_path, capsys):
    path = {"jsonl": _jsonl, "sqlite": _sqlite}[source](tmp_path) if source != "posts" else POSTS
    assert main(["data", "inspect", str(path), "-o", f"{option}={value}"]) == 2
    err = capsys.readouterr().err
    assert err == f"fedpriv: error: {path}: option {option} must be {want}, got {value}\n", err


@pytest.mark.parametrize("options", [
    {"user_column": "user_id", "text_column": "text", "timestamp_column": None, "normalize_text": False, "spill_to": None},
])
def test_loader_options_of_the_right_types_are_taken(options, tmp_path):
    assert open_corpus(str(_jsonl(tmp_path)), **options).num_examples == 2
    every = open_corpus(str(POSTS), post_types=["1", "2"], drop_owners=[], drop_code=True)
    assert every.num_examples == open_corpus(str(POSTS), post_types=("1", "2"), drop_owners=()).num_examples > 0
    assert open_corpus(str(POSTS), drop_owners=["-1", 5]).num_examples > 0
    with pytest.raises(SourceError, match="unit must be 'sentence' or 'turn'"):
        open_corpus("shakespeare", unit=5)


def test_a_missing_relative_source_names_the_directory_it_was_looked_for_in(tmp_path, monkeypatch):
    """A relative ``data.source`` that does not exist said only "no such file or directory":
    relative to what (the config's folder? the current one?) was left to guess."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SourceError) as e:
        open_corpus("data/posts.jsonl")
    assert str(e.value) == (
        f"data/posts.jsonl: no such file or directory (relative to the current directory {tmp_path}; "
        "and not 'shakespeare' or 'synthetic:...')"
    )
    with pytest.raises(SourceError, match=r"^/no/such/posts\.jsonl: no such file or directory \(and not 'shakespeare'"):
        open_corpus("/no/such/posts.jsonl")  # an absolute path says nothing more
    with pytest.raises(SourceError, match=r"^~/posts\.jsonl: no such file or directory \(~ is not expanded"):
        open_corpus("~/posts.jsonl")
