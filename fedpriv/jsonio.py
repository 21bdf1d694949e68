"""JSON files written atomically (temp name, then rename) and read with errors that name the file."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from fedpriv.errors import DataFormatError


def json_text(obj: Any, indent: int | None = None) -> str:
    """The exact text :func:`write_json_atomic` writes for ``obj`` (so its digest can be taken first)."""
    return json.dumps(obj, indent=indent)


def sha256_bytes(data: bytes) -> str:
    """The hex SHA-256 digest of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The hex SHA-256 digest of the file at ``path``."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` through ``PATH.partial`` and a rename: a crash leaves the old file
    or the new one, never half. The partial file is written afresh (a stale one, or a link planted
    under its name, is removed first, not followed) and never outlives a failed write (e.g.
    ``path`` is a directory)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    try:
        if tmp.is_symlink() or tmp.is_file():
            tmp.unlink()
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        if tmp.is_symlink() or tmp.is_file():
            tmp.unlink()
        raise
    return path


def write_json_atomic(path: str | os.PathLike[str], obj: Any, indent: int | None = None) -> Path:
    """Write ``obj`` as JSON to ``path``; a crash leaves the old file or the new one, never half."""
    return write_bytes_atomic(path, json_text(obj, indent).encode("utf-8"))


def read_json(path: str | os.PathLike[str], what: str) -> Any:
    """The parsed JSON at ``path``; DataFormatError naming the file and ``what`` it should be."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataFormatError(path, None, f"not a readable {what} ({e})") from None
