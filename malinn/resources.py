"""Where malinn's shipped files are: the OpenCL kernels folder."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import LibraryError

__all__ = ["kernels_dir"]


def kernels_dir() -> Path:
    """The folder holding ``library.json`` and the ``.cl`` sources.

    An installed wheel carries the repository's top-level ``kernels/`` as ``malinn/kernels/``; a
    source checkout has it beside ``malinn/``. ``MALINN_KERNELS`` overrides both.

    Raises:
        LibraryError: no folder with a ``library.json`` was found.
    """
    here = Path(__file__).resolve().parent
    candidates = [Path(os.environ["MALINN_KERNELS"])] if os.environ.get("MALINN_KERNELS") else []
    candidates += [here / "kernels", here.parent / "kernels"]
    try:  # an editable install maps the package malinn.kernels onto the checkout's kernels/
        import malinn.kernels as _k

        candidates += [Path(p) for p in getattr(_k, "__path__", [])]
    except ImportError:
        pass
    for folder in candidates:
        if (folder / "library.json").is_file():
            return folder
    raise LibraryError("malinn's kernels folder (library.json and *.cl) was not found; looked in "
                       + ", ".join(str(c) for c in candidates))
