"""The progress bar ``predict`` prints on stdout, as Keras's ``Progbar`` prints it::

    12/40 ━━━━━━━━━━━━━━━━━━━━ 3s 80ms/step        (verbose=1: one line, redrawn on a terminal)
    40/40 - 3s - 80ms/step                          (verbose=2: one line at the end)

A step is one batch of the input (Keras's word). ``verbose="auto"`` is 1 where stdout is a
terminal and the prediction runs more than one batch (of ``batch_size``, of a memory-mapped
array's passes, of an iterable), else 0: a one-pass call, the serving case, prints nothing (Keras
prints ``1/1 ...`` on every call), and neither does a split malinn makes on its own (one share
per device, the device's largest allocation).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressBar", "verbosity", "shown"]

#: the bar's width in characters (Keras's)
WIDTH = 20
#: the least time between two redraws of the line, in seconds (Keras's ``interval``)
INTERVAL = 0.05


def verbosity(verbose: object) -> str | int:
    """``verbose`` checked: ``"auto"``, 0, 1 or 2 (a bool as 0 or 1).

    Raises:
        ValueError: any other value.
    """
    if isinstance(verbose, str):
        if verbose == "auto":
            return verbose
    elif isinstance(verbose, bool):
        return int(verbose)
    elif isinstance(verbose, int) and verbose in (0, 1, 2):
        return int(verbose)
    raise ValueError(f"verbose must be 'auto', 0, 1 or 2 (as Keras's predict), got {verbose!r}")


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def shown(verbose: str | int, steps: int | None) -> int:
    """The verbosity a prediction of ``steps`` batches (None: not known) prints with: ``verbose``, or
    for ``"auto"`` 1 on a terminal where more than one batch runs, else 0."""
    if not isinstance(verbose, str):  # "auto", as verbosity() leaves it
        return verbose
    return 1 if (steps is None or steps > 1) and _is_terminal(sys.stdout) else 0


def _per_step(seconds: float) -> str:
    """``80ms/step`` as Keras writes a time per step."""
    if seconds >= 1 or seconds == 0:
        return f"{seconds:.0f}s/step"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.0f}ms/step"
    return f"{seconds * 1e6:.0f}us/step"


def _duration(seconds: float) -> str:
    """``7s``, ``1:05`` or ``1:00:05`` as Keras writes an estimate."""
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
    if seconds >= 60:
        return f"{seconds // 60}:{seconds % 60:02d}"
    return f"{seconds}s"


class ProgressBar:
    """Keras's progress bar over ``target`` steps (None: not known), at ``verbose`` 1 or 2 (0 prints
    nothing).

    Args:
        target: the number of steps, or None where an iterable's length is not known.
        verbose: 0, 1 or 2.
        stream: where it prints (default: stdout, as Keras).
    """

    def __init__(self, target: int | None, verbose: int, stream: TextIO | None = None):
        self.target, self.verbose = target, verbose
        self.stream = stream if stream is not None else sys.stdout
        self.dynamic = _is_terminal(self.stream)
        self.start = time.perf_counter()
        self._drawn, self._width = 0.0, 0

    def update(self, current: int, finalize: bool = False) -> None:
        """Shows ``current`` steps done (redrawn at most every :data:`INTERVAL` on a terminal; at
        the end elsewhere); ``finalize`` ends the line."""
        if not self.verbose or self.stream is None:
            return
        now = time.perf_counter()
        if not finalize and (self.verbose == 2 or not self.dynamic or now - self._drawn < INTERVAL):
            return
        self._drawn = now
        elapsed = now - self.start
        per_step = elapsed / current if current else 0.0
        count = f"{current}/{self.target}" if self.target else f"{current:7d}/Unknown"
        if self.verbose == 2:
            line = f"{count} - {elapsed:.0f}s - {_per_step(per_step)}"
        else:
            if self.target:
                done = min(WIDTH, int(WIDTH * current / self.target))
                bar = (
                    "\x1b[32m" + "━" * done + "\x1b[37m" + "━" * (WIDTH - done) + "\x1b[0m"
                    if self.dynamic
                    else "━" * done + "─" * (WIDTH - done)
                )
                count = f"{current:{len(str(self.target))}d}/{self.target} {bar}"
            left = (
                f"{_duration(per_step * (self.target - current))}"
                if self.target and not finalize
                else f"{elapsed:.0f}s"
            )
            line = f"{count} {left} {_per_step(per_step)}"
        try:
            if self.dynamic and self.verbose == 1:
                pad = max(0, self._width - len(line))
                self._width = len(line)
                self.stream.write("\r" + line + " " * pad + ("\n" if finalize else ""))
            else:
                self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed or full stdout: the prediction goes on without its bar
            self.verbose = 0
