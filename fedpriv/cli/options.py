"""Command-line option parsing shared by the ``fedpriv`` subcommands."""

from __future__ import annotations

import json
from typing import Any

from fedpriv.errors import FedprivError


def parse_options(pairs: list[str], flag: str = "--option") -> dict[str, Any]:
    """``KEY=VALUE`` pairs (of ``flag``) -> dict; VALUE is read as JSON when it parses (numbers, true,
    lists, tables), else a string."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise FedprivError(f"{flag} {pair!r}: expected KEY=VALUE")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value
        except RecursionError:
            raise FedprivError(f"{flag} {key.strip()}: the value nests arrays or objects too deeply to read") from None
    return options
