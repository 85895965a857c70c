"""The command line's argument types, usage errors and the options several commands share."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

from ..backends.selection import get_device, set_device
from ..errors import MalinnError

#: the weight precisions (kernels/library.json's "precisions")
PRECISIONS = ("fp32", "fp16-storage", "fp16", "int8-weights")


PRECISION_HELP = (
    "the weights' precision on the device: fp32, fp16-storage (half weights, float "
    "arithmetic), fp16 (half arithmetic: devices with cl_khr_fp16) or int8-weights (per-output-channel "
    "int8 with float scales)"
)


class UsageError(MalinnError):
    """A command line that cannot be run as given (exit status 2)."""


class Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (the usage is in ``--help``)."""

    def error(self, message):
        command = self.prog.split(" ", 1)[1] + ": " if " " in self.prog else ""
        raise UsageError(f"{command}{message} (see {self.prog} --help)")


# ------------------------------------------------------------------ argument types
def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _finite_float(text: str, smallest_ok: Callable[[float], bool], expected: str) -> float:
    """``text`` as a finite float that ``smallest_ok`` accepts, else the argparse error ``expected``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and smallest_ok(value)):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    return _finite_float(text, lambda v: v > 0, "a positive number of seconds")


def tolerance(text: str) -> float:
    return _finite_float(text, lambda v: v >= 0, "a number >= 0")


def product_shape(text: str) -> tuple:
    try:
        shape = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"expected MxKxN with three positive integers, got {text!r}")
    return shape


# ------------------------------------------------------------------ shared steps
def device_of(args):

    if getattr(args, "device", None) is not None:  # --device "" is refused by name, not ignored
        set_device(args.device)
    return get_device()


def check_cache_dir(folder: Path) -> None:
    """Fails before any timing when the tuning cache cannot be written."""
    source = "MALINN_CACHE_DIR" if os.environ.get("MALINN_CACHE_DIR") else "the cache folder"
    if folder.exists() and not folder.is_dir():
        raise MalinnError(f"{source} {folder} is a file, not a folder; the tuning result could not be stored")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MalinnError(f"{source} {folder} cannot be created ({exc.strerror or exc})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise MalinnError(f"{source} {folder} is not writable; the tuning result could not be stored")
