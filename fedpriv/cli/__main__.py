"""``python -m fedpriv.cli``: the ``fedpriv`` command (SIGTERM handled, as the installed script does)."""

from fedpriv.cli import console

console()
