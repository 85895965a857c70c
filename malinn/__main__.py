"""``python3 -m malinn``: the ``malinn`` command (:func:`malinn.cli.main`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
