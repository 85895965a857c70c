"""The ``malinn`` command: ``python3 -m malinn`` and the console script (pyproject.toml's
``[project.scripts]``), which both run :func:`main`.

Ctrl-C, SIGTERM and SIGHUP are taken here before :mod:`malinn.cli.commands` imports numpy, pyopencl and h5py
(a few tenths of a second; the package's own import is lazy, :mod:`malinn`): a Ctrl-C in that time
printed a ``KeyboardInterrupt`` traceback and the process died of the signal. A signal during those
imports is noted and acted on once they end, never raised inside an extension's initialisation. At any moment the
command now ends with one line on stderr and the shell's status (130, 143, 129), as
:func:`malinn.cli.commands.main` ends it once it runs.
"""

import signal
import sys

__all__ = ["main"]


#: the signals that arrived, in order
_received: list = []


class _Stopped(BaseException):
    """SIGTERM or SIGHUP arrived before :func:`malinn.cli.commands.main` took them over."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _note(signum, frame):
    _received.append(signum)


def _stop(signum, frame):
    _received.append(signum)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise _Stopped(signum)


def _said(text: str, status: int) -> int:
    try:
        print(f"malinn: error: {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError, AttributeError):  # stderr closed or gone
        pass
    return status


def main() -> int:
    """Runs the ``malinn`` command (:func:`malinn.cli.commands.main`) on ``sys.argv[1:]``; returns its exit status."""
    wanted = [signal.SIGINT] + [getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]
    try:
        try:
            # while numpy, pyopencl and h5py import (the slow part of starting) a signal is only
            # noted: raised inside an extension's initialisation, numpy's C code prints its own
            # ImportError ("_multiarray_umath failed to import") before any handler here runs
            for signum in wanted:
                signal.signal(signum, _note)
            from .cli.commands import main as run

            if _received:
                raise _Stopped(_received[0])
            for signum in wanted:
                signal.signal(signum, _stop)
            return run()
        except BaseException:
            # an import that a signal interrupts inside C may end as another exception (numpy's
            # ImportError "could not import module datetime"): what counts is that a signal came
            if not _received:
                raise  # a failure of its own (a broken installation): Python's report of it
            _over(wanted)
            signum = _received[0]
            return _said(
                "interrupted" if signum == signal.SIGINT else f"terminated ({signal.Signals(signum).name})",
                128 + signum,
            )
    finally:
        _over(wanted)


def _over(wanted: list) -> None:
    """The command is over: a Ctrl-C from here to the exit is ignored, SIGTERM and SIGHUP end the
    process without a word."""
    for signum in wanted:
        signal.signal(signum, signal.SIG_IGN if signum == signal.SIGINT else signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
