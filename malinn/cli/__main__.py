"""``python3 -m malinn.cli``: the ``malinn`` command (:func:`malinn.cli.commands.main`)."""

import sys

from .commands import main

if __name__ == "__main__":
    sys.exit(main())
