"""Quiet logs: third-party messages known to be harmless are filtered unless asked for (``fedpriv -v``).

Filtered, each known and harmless:

* dp-accounting's ``_compute_log_a_frac failed to converge`` (absl): the RDP accountant leaves
  that order out of the epsilon, which the other orders still bound;
* JAX's ``os.fork() was called`` RuntimeWarning: Ray and subprocesses fork and exec at once; no
  JAX work runs in the child;
* Ray's FutureWarnings (notices of future defaults);
* Flower's ``Manually terminating ClientAppActor`` (actors ending with the simulation) and its
  ``run_simulation`` deprecation notice (fedpriv's local simulation uses it on purpose).

Flower's log lines, and the prefixes Ray puts on its actors' lines, carry colour codes only on a
terminal, never into a file (``RAY_COLOR_PREFIX=0`` otherwise). ``setup`` runs in the
``fedpriv`` command and in every Flower ClientApp process; the choice travels to those processes
in the environment (``FEDPRIV_VERBOSE``).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

VERBOSE_ENV = "FEDPRIV_VERBOSE"
_ABSL_HARMLESS = ("_compute_log_a_frac failed to converge",)
_FLOWER_HARMLESS = ("Manually terminating", "DEPRECATED FEATURE: The `run_simulation` function is deprecated")


class _Drop(logging.Filter):
    """Drops records whose message starts with one of ``prefixes`` (when quiet)."""

    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes
        self.quiet = True

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.quiet:
            return True
        try:
            message = record.getMessage().lstrip()
        except Exception:  # noqa: BLE001 - a malformed record is not ours to judge
            return True
        return not message.startswith(self.prefixes)


class _FlowerFilter(_Drop):
    """Also switches Flower's console colours off when its stream is not a terminal."""

    def filter(self, record: logging.LogRecord) -> bool:
        for handler in logging.getLogger("flwr").handlers:
            if hasattr(handler, "colored"):
                stream = getattr(handler, "stream", None)
                handler.colored = bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())
        return super().filter(record)


_ABSL = _Drop(_ABSL_HARMLESS)
_FLOWER = _FlowerFilter(_FLOWER_HARMLESS)


def verbose() -> bool:
    """Whether third-party messages are shown (``fedpriv -v``, or ``FEDPRIV_VERBOSE=1``)."""
    return os.environ.get(VERBOSE_ENV) == "1"


def setup(show_all: bool | None = None) -> None:
    """Filter the known-harmless messages, unless ``show_all`` (default: :func:`verbose`); the choice
    is put in the environment for the processes this one starts."""
    if show_all is None:
        show_all = verbose()
    os.environ[VERBOSE_ENV] = "1" if show_all else "0"
    if not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    for logger, f in (("absl", _ABSL), ("flwr", _FLOWER)):
        f.quiet = not show_all
        if f not in logging.getLogger(logger).filters:
            logging.getLogger(logger).addFilter(f)
    if not show_all:
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"ray(\.|$)")
