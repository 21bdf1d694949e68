"""JSON files written atomically (temp name, then rename) and read with errors that name the file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fedpriv.errors import DataFormatError


def write_json_atomic(path: str | os.PathLike[str], obj: Any, indent: int | None = None) -> Path:
    """Write ``obj`` as JSON to ``path``; a crash leaves the old file or the new one, never half."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(obj, indent=indent), encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_json(path: str | os.PathLike[str], what: str) -> Any:
    """The parsed JSON at ``path``; DataFormatError naming the file and ``what`` it should be."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataFormatError(path, None, f"not a readable {what} ({e})") from None
