"""What a plan says while its kernel programs are built, on stderr.

A network's first prediction on a device whose caches are empty builds one program per kernel
configuration it runs: 12 s for MobileNetV2 and 76 s for DenseNet121 through PoCL on a 2-core CPU.
:class:`BuildProgress` reports them while a plan binds its launches (:meth:`malinn.plan.plan.Plan.allocate`):

* on a terminal (stderr is a tty), once the first program is built, one line updated in place,
  ``malinn: building kernels for 'densenet121' on DEVICE: 12/37`` (the plan's launches bound so
  far, of all of them), finished with the summary and a newline;
* elsewhere (a log, a pipe), only the summary, where the plan built programs for at least
  :data:`MIN_SECONDS`: ``malinn: built 37 kernel programs for 'densenet121' on DEVICE in 12.3 s``.

A device that builds programs side by side (OpenCL: ``MALINN_BUILD_THREADS``) binds a launch
before its program is built: the line counts a launch once its kernel is made, and :meth:`finish`
waits for the last builds (``wait_for_builds``), so that a plan is whole, or raises its build error,
when it is made.

A program served from the device's memory or loaded from the program-binary cache is not built, and
is not counted (the device counts its builds: ``Device.counters["builds"]``, and its loads,
``"binary_hits"``); a plan that builds nothing prints nothing. ``MALINN_PROGRESS=0`` (a switch of
:mod:`malinn.environment`) turns both off.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import TYPE_CHECKING, TextIO

from ..environment import switch

if TYPE_CHECKING:
    from ..backends.base import Device

__all__ = ["BuildProgress", "MIN_SECONDS", "reported_by_caller"]

#: the least time a plan's allocation with builds takes for the summary to be printed where stderr is no terminal
MIN_SECONDS = 1.0
#: the least time between two updates of a terminal's line (a plan whose programs are in memory binds thousands a second)
_REDRAW_SECONDS = 0.1

_local = threading.local()


@contextlib.contextmanager
def reported_by_caller():
    """Within it, the plans this thread makes print no summary (a terminal's line is still drawn,
    and cleared when the plan is made): the caller reports the builds itself (``malinn warm``)."""
    before = getattr(_local, "caller_reports", False)
    _local.caller_reports = True
    try:
        yield
    finally:
        _local.caller_reports = before


class BuildProgress:
    """The progress of one plan's program builds on ``device``, for the model named ``model``.

    Call :meth:`advance` after each launch is bound and :meth:`finish` once all are (or on a failure).

    Args:
        device: the device the plan is made for (its ``counters`` count the builds).
        model: the model's name, as the lines show it.
        total: the launches the plan binds.
        stream: where the lines go (default: ``sys.stderr``; nothing where that is closed).
    """

    def __init__(self, device: "Device", model: str, total: int, stream: TextIO | None = None):
        self.device, self.model, self.total = device, model, int(total)
        self.stream = sys.stderr if stream is None else stream
        self.enabled = self.stream is not None and bool(switch("MALINN_PROGRESS", True))
        try:
            self.terminal = self.enabled and self.stream.isatty()
        except (AttributeError, ValueError, OSError):  # a closed or unusual stream
            self.terminal = False
        self.caller_reports = getattr(_local, "caller_reports", False)
        counters = device.counters
        self._builds, self._hits = counters.get("builds", 0), counters.get("binary_hits", 0)
        self.started = time.perf_counter()
        self.done = 0
        self._drawn = 0  # the length of the line on the terminal (0: none drawn)
        self._drawn_at = 0.0

    @property
    def built(self) -> int:
        """The programs built from source since the plan began."""
        return self.device.counters.get("builds", 0) - self._builds

    @property
    def loaded(self) -> int:
        """The programs loaded from the program-binary cache since the plan began."""
        return self.device.counters.get("binary_hits", 0) - self._hits

    @property
    def ready(self) -> int:
        """The launches bound whose kernels are made (a launch whose program still builds is not)."""
        pending = getattr(self.device, "pending", None) or {}
        return self.done - sum(not made.done() for made in list(pending.values()))

    def advance(self) -> None:
        """One more launch bound: the terminal's line is drawn (once a program was built) or updated."""
        self.done += 1
        self._update()

    def _update(self) -> None:
        if not self.terminal or not self.built:
            return
        now = time.perf_counter()
        ready = self.ready
        if self._drawn and ready < self.total and now - self._drawn_at < _REDRAW_SECONDS:
            return
        self._draw(f"malinn: building kernels for {self.model!r} on {self.device.name}: {ready}/{self.total}")
        self._drawn_at = now

    def summary(self) -> str:
        """``malinn: built 37 kernel programs for 'm' on DEVICE in 12.3 s`` (and how many were loaded
        from the program cache, where some were)."""
        built, loaded = self.built, self.loaded
        seconds = time.perf_counter() - self.started
        cached = f" ({loaded} loaded from the program cache)" if loaded else ""
        return (
            f"malinn: built {built} kernel program{'s' if built != 1 else ''} for {self.model!r} on "
            f"{self.device.name} in {seconds:.1f} s{cached}"
        )

    def finish(self, failed: bool = False) -> None:
        """The plan's launches are bound (or ``failed``): waits for the programs still building (a
        failed plan's are forgotten), then the terminal's line ends with the summary (left as it was
        on a failure, so that the error starts a line of its own; cleared where the caller reports);
        elsewhere the summary is printed where the builds took :data:`MIN_SECONDS` or more.

        Raises:
            KernelBuildError: a program of the plan did not build (the line ends first).
        """
        wait = getattr(self.device, "wait_for_builds", None)
        if wait is not None:
            try:
                wait(on_done=self._update, discard=failed)
            except BaseException:
                self.finish(failed=True)
                raise
        if not self.enabled:
            return
        try:
            if self._drawn:
                if failed:
                    self.stream.write("\n")
                elif self.caller_reports:
                    self.stream.write("\r" + " " * self._drawn + "\r")
                else:
                    self._draw(self.summary())
                    self.stream.write("\n")
                self.stream.flush()
            elif (
                not failed
                and not self.caller_reports
                and self.built
                and time.perf_counter() - self.started >= MIN_SECONDS
            ):
                self.stream.write(self.summary() + "\n")
                self.stream.flush()
        except (OSError, ValueError):  # stderr closed or gone: the plan is made all the same
            pass

    def _draw(self, text: str) -> None:
        try:
            self.stream.write("\r" + text.ljust(self._drawn))
            self.stream.flush()
        except (OSError, ValueError):
            self.terminal = False
            return
        self._drawn = max(self._drawn, len(text))
