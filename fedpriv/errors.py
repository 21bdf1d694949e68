"""The project's own error types.

Everything fedpriv refuses on purpose (bad input, impossible parameters) is raised as a
subclass of :class:`FedprivError`; the CLI prints its message as one line and exits non-zero.
"""

from __future__ import annotations

import os


class FedprivError(Exception):
    """Base class of every error fedpriv raises on purpose."""


class DataFormatError(FedprivError):
    """A source file is malformed; the message names the file and the line (or record)."""

    def __init__(self, path: str | os.PathLike[str], where: int | str | None, message: str):
        self.path = str(path)
        self.where = where
        self.reason = message
        if where is None:
            loc = self.path
        elif isinstance(where, int):
            loc = f"{self.path}:{where}"
        else:
            loc = f"{self.path} ({where})"
        super().__init__(f"{loc}: {message}")


class EmptyCorpusError(FedprivError):
    """A corpus, or a split or filter of one, has no users or no examples left."""


class ConfigError(FedprivError):
    """An experiment config is invalid; the message names the key's path."""


class SourceError(FedprivError):
    """A source spec cannot be resolved (unknown name, missing file, unsupported format)."""


class PrivacyParameterError(FedprivError):
    """An impossible privacy parameter, refused before any work; the message names it and its valid range."""


class TrainingDiverged(FedprivError):
    """The train loss or the parameters became non-finite; the run is marked failed."""


class ConfigChanged(FedprivError):
    """A run would resume (or a store continue) with another config than it started with."""


class RunDirInUse(FedprivError):
    """Another process holds the run directory's (or store's) lock; the message names its pid and command."""
