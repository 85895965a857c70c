"""TensorFlow and PoCL in one process: PoCL's LLVM clashes with TensorFlow's, so where TensorFlow is
loaded PoCL is hidden from the OpenCL ICD loader (never loaded) or skipped, with a warning that says
why (:func:`malinn.backends.opencl.discover`).
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from collections.abc import Callable

from .opencl_driver import POCL_PLATFORM, safe_attr, safe_name

__all__ = ["TENSORFLOW_HINT", "tensorflow_loaded", "skipped_for_tensorflow", "forget_skips"]

TENSORFLOW_HINT = (
    "TensorFlow is loaded in this process, and PoCL cannot share a process with it (their LLVMs "
    "clash and PoCL crashes); run TensorFlow in another process (as `malinn verify` does)"
)
_skipped_for_tensorflow = False


def _mapped(*fragments: str) -> bool:
    """Whether a shared object whose path holds one of ``fragments`` is mapped into this process."""
    try:
        with open("/proc/self/maps") as maps:
            return any(fragment in line for line in maps for fragment in fragments)
    except OSError:  # not Linux
        return False


def tensorflow_loaded() -> bool:
    """Whether TensorFlow (and with it TensorFlow's LLVM) is loaded in this process."""
    return "tensorflow" in sys.modules or _mapped("libtensorflow", "_pywrap_tensorflow")


def is_pocl(platform: object) -> bool:
    return POCL_PLATFORM in safe_name(platform) or "pocl" in safe_attr(platform, "vendor").lower()


def skip_pocl_for_tensorflow(what: str) -> None:
    global _skipped_for_tensorflow
    _skipped_for_tensorflow = True
    warnings.warn(f"malinn: skipping {what}: {TENSORFLOW_HINT}", stacklevel=4)


def icd_loader_without_pocl(start_loader: Callable[[], object]) -> bool:
    """Starts the OpenCL ICD loader with PoCL hidden from it; returns whether any other driver is left.

    Loading PoCL's library beside TensorFlow's LLVM crashes the process, so it must not be loaded at
    all: the loader reads its list of drivers once, on its first call, from ``OCL_ICD_VENDORS``
    (else ``/etc/OpenCL/vendors``) and ``OCL_ICD_FILENAMES``; those are pointed, for that first call
    only, at the registered drivers other than PoCL. When PoCL is already loaded (it was used before
    TensorFlow came), the loader is already started and the platform loop skips PoCL instead.
    """
    if _mapped("libpocl"):
        return True
    vendors = os.environ.get("OCL_ICD_VENDORS") or "/etc/OpenCL/vendors"
    if os.path.isdir(vendors):
        icds = [os.path.join(vendors, n) for n in sorted(os.listdir(vendors)) if n.endswith(".icd")]
    else:
        icds = [vendors] if os.path.isfile(vendors) else []
    libraries = {}
    for icd in icds:
        try:
            with open(icd) as f:
                libraries[icd] = f.read().strip()
        except OSError:
            pass
    filenames = [f for f in os.environ.get("OCL_ICD_FILENAMES", "").split(os.pathsep) if f]
    pocl = [icd for icd, library in libraries.items() if "pocl" in os.path.basename(library).lower()]
    pocl += [f for f in filenames if "pocl" in os.path.basename(f).lower()]
    if not pocl:
        return True
    skip_pocl_for_tensorflow("the PoCL OpenCL driver")
    others = {icd: library for icd, library in libraries.items() if icd not in pocl}
    other_files = [f for f in filenames if f not in pocl]
    if not others and not other_files:
        return False
    saved = {name: os.environ.get(name) for name in ("OCL_ICD_VENDORS", "OCL_ICD_FILENAMES")}
    with tempfile.TemporaryDirectory(prefix="malinn-icd-") as folder:
        for icd, library in others.items():
            with open(os.path.join(folder, os.path.basename(icd)), "w") as f:
                f.write(library + "\n")
        os.environ["OCL_ICD_VENDORS"] = folder
        os.environ["OCL_ICD_FILENAMES"] = os.pathsep.join(other_files)
        try:
            start_loader()
        except Exception:  # the caller lists the platforms again and reports what fails
            pass
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    return True


def forget_skips() -> None:
    """A new discovery begins: nothing skipped yet."""
    global _skipped_for_tensorflow
    _skipped_for_tensorflow = False


def skipped_for_tensorflow() -> bool:
    """Whether the last discovery skipped PoCL because TensorFlow is loaded."""
    return _skipped_for_tensorflow
