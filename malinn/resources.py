"""Where malinn's shipped files are: the OpenCL kernels folder."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import LibraryError

__all__ = ["kernels_dir", "kernels_overridden"]


def kernels_overridden() -> bool:
    """Whether ``MALINN_KERNELS`` names the kernels folder (a copy being worked on, not the shipped one)."""
    return bool(os.environ.get("MALINN_KERNELS"))


def kernels_dir() -> Path:
    """The folder holding ``library.json`` and the ``.cl`` sources.

    An installed wheel carries the repository's top-level ``kernels/`` as ``malinn/kernels/``; a
    source checkout has it beside ``malinn/``. ``MALINN_KERNELS`` overrides both.

    Raises:
        LibraryError: ``MALINN_KERNELS`` names a folder without a ``library.json`` (a typo would
            otherwise run the shipped kernels unnoticed), or no folder with one was found.
    """
    override = os.environ.get("MALINN_KERNELS")
    if override:
        if not (Path(override) / "library.json").is_file():
            raise LibraryError(
                f"MALINN_KERNELS names {override}, which holds no library.json (it should name a "
                "copy of malinn's kernels folder; unset it for the shipped kernels)"
            )
        return Path(override)
    here = Path(__file__).resolve().parent
    candidates = [here / "kernels", here.parent / "kernels"]
    try:  # an editable install maps the package malinn.kernels onto the checkout's kernels/
        import malinn.kernels as _k  # type: ignore[import-not-found]  # kernels/, data the install maps

        candidates += [Path(p) for p in getattr(_k, "__path__", [])]
    except ImportError:
        pass
    for folder in candidates:
        if (folder / "library.json").is_file():
            return folder
    raise LibraryError(
        "malinn's kernels folder (library.json and *.cl) was not found; looked in "
        + ", ".join(str(c) for c in candidates)
    )
