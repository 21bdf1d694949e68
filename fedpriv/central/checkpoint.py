"""Checkpoints in a safe format: msgpack of the state's arrays (flax.serialization), never pickle,
plus a JSON sidecar (step and whatever the trainer needs to resume exactly).

The state goes to ``checkpoint-<step>.msgpack`` first, then the sidecar ``checkpoint.json``
(naming that file) replaces the old one atomically, then older state files are removed; a crash
at any point leaves the previous checkpoint or the new one, whole.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from flax import serialization

from fedpriv.errors import DataFormatError

META_FILE = "checkpoint.json"


def save_checkpoint(directory: str | os.PathLike[str], state: Any, meta: dict) -> None:
    """Write ``state`` (a pytree of arrays) and ``meta`` (JSON-able, must hold ``step``)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    name = f"checkpoint-{int(meta['step'])}.msgpack"
    tmp = d / (name + ".partial")
    tmp.write_bytes(serialization.to_bytes(state))
    os.replace(tmp, d / name)
    tmp = d / (META_FILE + ".partial")
    tmp.write_text(json.dumps({**meta, "state_file": name}, indent=1))
    os.replace(tmp, d / META_FILE)
    for old in d.glob("checkpoint-*.msgpack"):
        if old.name != name:
            old.unlink(missing_ok=True)


def load_checkpoint(directory: str | os.PathLike[str], template: Any) -> tuple[Any, dict] | None:
    """``(state, meta)`` of the checkpoint in ``directory``, or None if there is none.
    ``template`` is a state of the same structure (fresh parameters and optimizer state)."""
    d = Path(directory)
    if not (d / META_FILE).is_file():
        return None
    try:
        meta = json.loads((d / META_FILE).read_text())
        state = serialization.from_bytes(template, (d / meta["state_file"]).read_bytes())
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataFormatError(d / META_FILE, None, f"unreadable checkpoint ({e}); delete the directory to start over") from None
    return state, meta
