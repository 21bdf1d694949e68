"""``python -m fedpriv.cli``: the ``fedpriv`` command."""

import sys

from fedpriv.cli import main

sys.exit(main())
