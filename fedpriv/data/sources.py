"""Resolve a SOURCE spec (as the CLI and experiment configs write it) to a FederatedCorpus.

Specs:

* ``shakespeare`` - the bundled Shakespeare by speaker;
* ``synthetic:...`` - synthetic non-IID users (``synthetic:stackoverflow``, ``synthetic:small,seed=3``,
  ``synthetic:users=1000,examples=50000``);
* a path, by format (``format=`` overrides the guess from the name):

  ============================== ==============================================
  ``Posts.xml`` / ``*.xml``       Stack Exchange dump (``stackexchange``)
  ``*.jsonl`` ``*.json``          JSON Lines table (``jsonl``); also ``*.ndjson``
  ``*.csv``                       CSV table (``csv``)
  ``*.parquet``                   Parquet table (``parquet``)
  ``*.sqlite`` ``*.db``           TFF Stack Overflow SQLite (``tff-sqlite``)
  ``*.conll`` ``*.conllu``        CoNLL/IOB NER (``conll``); also ``*.iob``, ``*.iob2``,
                                  ``*.bio``, ``*.bioes``, ``*.iobes``, ``*.annotated``
  ``*.tsv``                       CoNLL/IOB NER, or a TSV table (``tsv``) when its first line
                                  is a header naming ``user_id`` or table options
                                  (``user_column=``, ``text_column=``, ...) are given
  ``*.txt`` ``*.text``            plain text, one example per line (``text``)
  a directory                     ``datasets.Dataset.save_to_disk`` output (``hf``)
  ``*.jsonl.gz`` ``*.json.gz``    compressed tables (gzip; also ``.bz2``, ``.xz``),
  ``*.csv.gz`` ``*.tsv.gz``       decompressed as they stream (a compressed ``.tsv`` is
                                  always a table); ``.zst`` and ``.zip`` are refused with
                                  how to decompress them
  ============================== ==============================================

Loader options (``user_column=...``, ``users="sentences:10"``, ``split="train"``, ...) are passed
through to the loader; an option the loader does not take is refused by name.
"""

from __future__ import annotations

import collections.abc
import inspect
import json
import os
import types
import typing
from pathlib import Path
from typing import Any, Callable

from fedpriv.data.corpus import FederatedCorpus
from fedpriv.errors import SourceError

FORMATS = ("stackexchange", "jsonl", "csv", "tsv", "parquet", "tff-sqlite", "conll", "text", "hf", "shakespeare-text")
TABLES = ("jsonl", "csv", "tsv", "parquet")

_SUFFIXES = {
    ".xml": "stackexchange",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".sqlite": "tff-sqlite",
    ".sqlite3": "tff-sqlite",
    ".db": "tff-sqlite",
    ".conll": "conll",
    ".conllu": "conll",
    ".iob": "conll",
    ".iob2": "conll",
    ".bio": "conll",
    ".bioes": "conll",
    ".iobes": "conll",
    ".tsv": "conll",
    ".annotated": "conll",
    ".txt": "text",
    ".text": "text",
}


def _tsv_table(path: Path) -> bool:
    """A ``.tsv`` whose first line is a header naming the tables' default user column."""
    with open(path, "rb") as f:
        first = f.readline().decode("utf-8", errors="replace").lstrip("\ufeff").rstrip("\r\n")
    return "user_id" in first.split("\t")


#: Formats read from a compressed file, by the suffix before ``.gz``, ``.bz2`` or ``.xz``.
_COMPRESSED_SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv"}
#: Compressions named by a suffix that fedpriv does not stream, and how to read such a file.
_UNREAD_SUFFIXES = {".zst": "decompress it first (zstd -d --long=31 FILE), or recompress it as gzip", ".zip": "unzip it first"}
#: Options only a table loader takes: given with a ``.tsv``, they mean a TSV table, not CoNLL.
_TABLE_OPTIONS = ("user_column", "text_column", "tokens_column", "tags_column", "timestamp_column", "unit", "quoting")


def guess_format(path: Path, options: dict[str, Any] | None = None) -> str:
    """The format a path's name implies (see the module docstring); ``options``, the loader options
    given, tell a TSV table from CoNLL."""
    from fedpriv.data.tabular import COMPRESSION_SUFFIXES

    if path.is_dir():
        return "hf"
    suffix = path.suffix.lower()
    if suffix in _UNREAD_SUFFIXES:
        raise SourceError(f"{path}: {suffix[1:]} files are not read (fedpriv streams gzip, bzip2 and xz): {_UNREAD_SUFFIXES[suffix]}")
    if suffix in COMPRESSION_SUFFIXES:
        inner = Path(path.stem).suffix.lower()
        fmt = _COMPRESSED_SUFFIXES.get(inner)
        if fmt is None:
            raise SourceError(
                f"{path}: {COMPRESSION_SUFFIXES[suffix]} is read for JSON Lines, CSV and TSV tables "
                f"({', '.join('*' + s + suffix for s in _COMPRESSED_SUFFIXES)}); "
                f"decompress it first{'' if inner else ', or pass format= jsonl, csv or tsv'}"
            )
        return fmt
    fmt = _SUFFIXES.get(suffix)
    if fmt is None:
        raise SourceError(f"{path}: cannot tell the format from the name; pass format= one of {', '.join(FORMATS)}")
    if fmt == "conll" and suffix == ".tsv" and (_tsv_table(path) or any(k in (options or {}) for k in _TABLE_OPTIONS)):
        return "tsv"
    return fmt


def _loader(fmt: str) -> Callable[..., FederatedCorpus]:
    # Imported lazily: each loader pulls in only what its format needs.
    if fmt == "stackexchange":
        from fedpriv.data.stackexchange import load_stackexchange

        return load_stackexchange
    if fmt == "tff-sqlite":
        from fedpriv.data.tff_sqlite import load_tff_sqlite

        return load_tff_sqlite
    if fmt == "conll":
        from fedpriv.data.conll import load_conll

        return load_conll
    if fmt == "text":
        from fedpriv.data.text import load_text

        return load_text
    if fmt == "hf":
        from fedpriv.data.hf import load_hf_dataset

        return load_hf_dataset
    if fmt == "shakespeare-text":
        from fedpriv.data.shakespeare import load_shakespeare

        return load_shakespeare
    raise SourceError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")


def _type_name(hint: Any) -> str | None:
    """What ``hint`` (a loader parameter's annotation) accepts, in words; None for a type this
    check does not know (the loader checks it)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not os.PathLike and typing.get_origin(a) is not os.PathLike]
        return None if None in names else " or ".join(dict.fromkeys(names))  # type: ignore[arg-type]
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in args)
    if origin in (tuple, list, collections.abc.Sequence, collections.abc.Collection):
        item = _type_name(args[0]) if args else "anything"
        return None if item is None else f"a list (each {item})"
    if origin is collections.abc.Callable or hint is collections.abc.Callable:
        return "a function"
    return {str: "a string", bool: "true or false", int: "an integer", float: "a number", type(None): "null", Any: "anything"}.get(hint)


def _fits(value: Any, hint: Any) -> bool:
    """``value`` is of the type ``hint`` names (see :func:`_type_name`)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin in (tuple, list, collections.abc.Sequence, collections.abc.Collection):
        return isinstance(value, (list, tuple)) and (not args or all(_fits(v, args[0]) for v in value))
    if origin is collections.abc.Callable or hint is collections.abc.Callable:
        return callable(value)
    if hint is os.PathLike or origin is os.PathLike:
        return isinstance(value, os.PathLike)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (str, bool, type(None)):
        return isinstance(value, hint)
    return hint is Any or not isinstance(hint, type) or isinstance(value, hint)


def _check_option_types(fn: Callable[..., Any], options: dict[str, Any], what: str) -> None:
    """Each option of the type the loader's signature names: a list or a number where a column
    name goes used to end in a TypeError deep in the loader (an "internal error")."""
    try:
        params = inspect.signature(fn, eval_str=True).parameters
    except (NameError, AttributeError):  # an annotation names a type only imported for type checkers: the loader checks its values
        return
    for name, value in options.items():
        hint = params[name].annotation if name in params else inspect.Parameter.empty
        if hint is inspect.Parameter.empty:
            continue
        want = _type_name(hint)
        if want is not None and not _fits(value, hint):
            quote = ""
            if name.endswith("_column") and isinstance(value, (int, float)) and not isinstance(value, bool):
                quote = f" (a column named {value}? quote it: -o '{name}=\"{value}\"', or --set 'data.options.{name}=\"{value}\"')"
            raise SourceError(f"{what}: option {name} must be {want}, got {json.dumps(value, default=repr)[:40]}{quote}")


def _check_options(fn: Callable[..., Any], options: dict[str, Any], what: str) -> None:
    params = inspect.signature(fn).parameters
    missing = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty and n not in options]
    if missing:
        raise SourceError(f"{what}: this source needs the option(s) {', '.join(missing)} (e.g. -o {missing[0]}=... or data.options)")
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(options) - set(params))
    if unknown:
        allowed = [n for n in params if n not in ("path", "dataset_or_path", "spec_or_config", "format")]
        raise SourceError(f"{what}: unknown option(s) {', '.join(unknown)}; this source takes {', '.join(allowed) or 'none'}")
    _check_option_types(fn, options, what)


def split_format(format: str | None, options: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """``(format, the other options)`` when the format may also come as an option (``-o format=jsonl``,
    ``data.options.format``): a format given both ways must agree."""
    if "format" not in options:
        return format, options
    rest = dict(options)
    opt = rest.pop("format")
    if not isinstance(opt, str):
        raise SourceError(f"format must be a string such as 'jsonl', got {opt!r}")
    if format is not None and format != opt:
        raise SourceError(f"the format is given twice: {format!r} and the option format={opt!r}")
    return opt, rest


def _resolved_against(path: Path) -> str:
    """Where a missing relative path was looked for (the current directory: a config's
    ``data.source`` too is relative to where fedpriv runs, not to the config file), and that ``~``
    is not expanded; ``""`` for an absolute path."""
    if str(path).startswith("~"):
        return "~ is not expanded: give the home directory's path; "
    if path.is_absolute():
        return ""
    try:
        here = Path.cwd()
    except OSError:  # the working directory was removed
        return "relative to a working directory that no longer exists; "
    return f"relative to the current directory {here}; "


def open_corpus(spec: str, format: str | None = None, **options: Any) -> FederatedCorpus:
    """The corpus a SOURCE spec names (see the module docstring)."""
    if spec == "shakespeare":
        from fedpriv.data.shakespeare import load_shakespeare

        _check_options(load_shakespeare, options, spec)
        return load_shakespeare(**options)
    if spec.startswith("synthetic:") or spec == "synthetic":
        from fedpriv.data.synthetic import load_synthetic

        if options:
            raise SourceError(f"{spec}: synthetic sources take their options in the spec, e.g. synthetic:small,seed=3")
        return load_synthetic(spec)
    path = Path(spec)
    if not path.exists():
        raise SourceError(f"{spec}: no such file or directory ({_resolved_against(path)}and not 'shakespeare' or 'synthetic:...')")
    fmt = format or guess_format(path, options)
    if fmt in TABLES:
        from fedpriv.data.tabular import load_table

        _check_options(load_table, options, spec)
        return load_table(path, format=fmt, **options)
    loader = _loader(fmt)
    _check_options(loader, options, spec)
    return loader(path, **options)
