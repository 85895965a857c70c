"""A parse worker process's set-up: the signals it obeys, and its end when the server is gone.

A service manager (systemd signals every process of the service) or a Ctrl-C (every process of the
terminal's group) sends its signal to the workers too, but the server stops them itself once the
requests in flight are answered: a worker ignores SIGINT and SIGHUP, and SIGTERM unless the server
sends it (the process pool ends a broken pool's workers so). It exits when the server's process
is gone.

This module imports nothing that starts a thread (numpy's BLAS starts its own at import): the
worker runs :func:`worker_started` before anything else is imported, so that every thread the
process starts afterwards keeps SIGTERM blocked and the one thread waiting for it sees who sent it.
"""

from __future__ import annotations

import os
import signal
import threading

__all__ = ["worker_started"]


def worker_started(parent: int) -> None:
    """Sets up a worker whose server's process id is ``parent``; the pool's initializer."""
    for name in ("SIGINT", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    if not hasattr(signal, "sigtimedwait"):  # not POSIX: the default actions stay
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # every thread started after holds it too

    def watch() -> None:
        while os.getppid() == parent:
            info = signal.sigtimedwait({signal.SIGTERM}, 1.0)
            if info is not None and info.si_pid == parent:
                os._exit(0)
        os._exit(0)

    threading.Thread(target=watch, name="malinn-serve parse worker signals", daemon=True).start()
