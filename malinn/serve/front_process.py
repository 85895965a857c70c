"""An HTTP process on uvicorn whose signals stop it gracefully, and an HTTP front process's main.

:func:`graceful_server` is the uvicorn server of ``malinn serve``'s process and of each HTTP front
process (``--http-workers``): SIGTERM, SIGINT and SIGHUP close the listening socket and idle
connections, answer every request in flight and end the server; a second Ctrl-C stops at once.

:func:`run_front` is a front process's whole life, spawned by :mod:`malinn.serve.fronts` with the
listening socket and its pipe: the REST API (:mod:`malinn.serve.app`) on its copy of the version
table, each parsed request sent to the model process (:mod:`malinn.serve.front_link`). A front
imports the REST API, the JSON parser and numpy, never the model or the device. It exits 0 once
a signal stopped it, 1 when the model process is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from .config import ServeConfig
from .front_link import FrontTable, ModelLink
from .metrics import Metrics
from .parse_workers import ParsePool

__all__ = ["graceful_server", "run_front"]


def graceful_server(app: Any, config: ServeConfig, limit: int, on_signal: Callable[[int], None]) -> Any:
    """A uvicorn server of ``app`` (``limit`` connections at once) whose signals call
    ``on_signal(signum)`` once and stop it gracefully (uvicorn re-raises them, which would end the
    process with the signal's status: not here)."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            wanted = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
            before = {signum: signal.signal(signum, self.handle_exit) for signum in wanted}
            try:
                yield
            finally:
                for signum, handler in before.items():
                    signal.signal(signum, handler)

        def handle_exit(self, sig, frame):
            if not self.should_exit:
                on_signal(sig)
            super().handle_exit(sig, frame)

    uv_config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        limit_concurrency=limit,
        timeout_graceful_shutdown=int(config.request_timeout) + 5,
    )
    return Server(uv_config)


def run_front(index: int, sock: Any, conn: Any, config: ServeConfig, parent: int) -> None:
    """An HTTP front process: serves ``sock`` until a signal stops it or the model process (pid
    ``parent``, at the other end of ``conn``) is gone."""
    from .app import build_app

    metrics = Metrics()
    table = FrontTable(config.models)
    link = ModelLink(conn, table, metrics, [0])
    parsing = ParsePool(config.parse_workers) if config.parse_workers else None
    app = build_app(table, metrics, config, parsing=parsing, submit=link.submit, scrape=link.scrape)
    link._in_flight = app.state.in_flight
    limit = max(1, math.ceil(config.max_connections / config.http_workers))

    def stopping(signum: int) -> None:
        table.stopping = True

    server = graceful_server(app, config, limit, stopping)
    lost = []

    def gone() -> None:
        lost.append(True)
        server.should_exit = True

    link.on_lost = gone
    link.start()
    if parsing is not None:
        parsing.start()

    async def main() -> None:
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        if server.started:
            with contextlib.suppress(OSError, ValueError):
                link.send(("up", os.getpid()))
        await serving

    try:
        asyncio.run(main())
    finally:
        if parsing is not None:
            parsing.shutdown()
        sock.close()
    sys.exit(1 if lost and os.getppid() != parent else 0)
