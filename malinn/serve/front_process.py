"""An HTTP process on uvicorn whose signals stop it gracefully, and an HTTP front process's main.

:func:`graceful_server` is the uvicorn server of ``malinn serve``'s process and of each HTTP front
process (``--http-workers``): SIGTERM, SIGINT and SIGHUP close the listening socket and idle
connections, answer every request in flight and end the server; a second Ctrl-C stops at once.
Its HTTP/1.1 protocol is uvicorn's (httptools' parser where installed) with the writes of one
turn of the event loop joined, so that an answer's head and body reach the client as one segment,
and a request's disconnect watch a callback of its connection's (no task a request); a
front's server accepts its share of the shared socket's connections
(:class:`~malinn.serve.front_accept.ShareAcceptor`); :func:`run_loop` runs it on uvloop where
installed.

:func:`run_front` is a front process's whole life, spawned by :mod:`malinn.serve.fronts` with the
listening socket and its pipe: the REST API (:mod:`malinn.serve.app`) on its copy of the version
table, each parsed request sent to the model process (:mod:`malinn.serve.front_link`). A front
imports the REST API, the JSON parser and numpy, never the model or the device. It exits 0 once
a signal stopped it, 1 when the model process is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from .app import CONNECTION
from .config import ServeConfig
from .front_accept import ShareAcceptor
from .front_link import FrontTable, ModelLink
from .metrics import Metrics
from .parse_workers import ParsePool

__all__ = ["graceful_server", "run_front", "run_loop"]


def graceful_server(
    app: Any, config: ServeConfig, limit: int, on_signal: Callable[[int], None], share: tuple | None = None
) -> Any:
    """A uvicorn server of ``app`` (``limit`` connections at once, a request on one more answered
    503 with the API's JSON error and the connection closed) whose signals call
    ``on_signal(signum)`` once and stop it gracefully (uvicorn re-raises them, which would end the
    process with the signal's status: not here). With ``share`` (the fronts' connection counts and
    this front's slot) the socket it serves is shared with other fronts, and it accepts its share of
    the connections (:class:`~malinn.serve.front_accept.ShareAcceptor`)."""
    import uvicorn

    class Server(uvicorn.Server):
        acceptor: ShareAcceptor | None = None

        async def startup(self, sockets: list | None = None) -> None:
            if share is None or not sockets:
                await super().startup(sockets)
                return
            await super().startup(sockets=[])  # everything but the socket's own server: accepted here
            loop = asyncio.get_running_loop()
            uv = self.config

            def protocol() -> Any:
                return uv.http_protocol_class(  # type: ignore[call-arg]
                    config=uv, server_state=self.server_state, app_state=self.lifespan.state, _loop=loop
                )

            self.acceptor = ShareAcceptor(
                sockets[0], share[0], share[1], lambda: len(self.server_state.connections), protocol
            )
            self.acceptor.start(loop)

        async def shutdown(self, sockets: list | None = None) -> None:
            if self.acceptor is not None:
                self.acceptor.stop()  # accepts no more, as the socket's server would once closed
            await super().shutdown(sockets)

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

    refusal = json.dumps(
        {"error": f"The server is serving its limit of {limit} connections (--max-connections); try again later"},
        separators=(",", ":"),
    ).encode()

    async def limited(scope: Any, receive: Any, send: Any) -> None:
        # The limit is kept here, not by uvicorn's limit_concurrency: that one counts the connection
        # asking among those served (limit - 1 served, none at 1) and answers plain text.
        if scope["type"] == "http" and len(server.server_state.connections) > limit:
            headers = [(b"content-length", str(len(refusal)).encode()), (b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 503, "headers": headers + [(b"connection", b"close")]})
            await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else refusal})
            return
        await app(scope, receive, send)

    uv_config = uvicorn.Config(
        limited,
        http=_coalescing_protocol(),
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=int(config.request_timeout) + 5,
    )
    server = Server(uv_config)
    return server


class _Coalescing:
    """A connection's transport whose writes within one turn of the event loop go out as one write:
    uvicorn writes a response's head and its body apart, and on loopback or a LAN each write is a
    TCP segment and a wakeup of the client (about 40 us of this process's CPU a request); joined,
    the client gets the answer in one. Everything but ``write`` and ``close`` is the transport's."""

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop):
        self._transport, self._loop = transport, loop
        self._pending: list | None = None
        self._watchers: set | None = set()  # called when the connection is lost (None: it was)

    def watch(self, callback: Callable[[], None]) -> None:
        """Calls ``callback()`` once the connection is lost (at once where it was): a request's
        disconnect watch without a task of its own (:data:`malinn.serve.app.CONNECTION`)."""
        if self._watchers is None:
            callback()
        else:
            self._watchers.add(callback)

    def unwatch(self, callback: Callable[[], None]) -> None:
        if self._watchers is not None:
            self._watchers.discard(callback)

    def lost(self) -> None:
        watchers, self._watchers = self._watchers, None
        for callback in watchers or ():
            callback()

    def write(self, data: bytes) -> None:
        if self._pending is None:
            self._pending = [data]
            self._loop.call_soon(self._flush)
        else:
            self._pending.append(data)

    def _flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending or ()))

    def close(self) -> None:
        self._flush()  # what was written goes out before the connection closes
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _coalescing_protocol() -> type:
    """uvicorn's HTTP/1.1 protocol (httptools' C parser where installed, else h11) on a
    :class:`_Coalescing` transport."""
    base: Any
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:  # httptools is not installed
        from uvicorn.protocols.http.h11_impl import H11Protocol as base

    class Protocol(base):
        def connection_made(self, transport: Any) -> None:
            self._malinn_transport = _Coalescing(transport, asyncio.get_running_loop())
            super().connection_made(self._malinn_transport)

        def data_received(self, data: bytes) -> None:
            # the task uvicorn starts for a request here copies this context: the app finds its connection
            CONNECTION.set(self._malinn_transport)
            super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            super().connection_lost(exc)
            self._malinn_transport.lost()

    return Protocol


def run_loop(main: Coroutine, server: Any) -> Any:
    """Runs ``main`` to its end on the event loop uvicorn chose for ``server``: uvloop where it is
    installed (the ``serve`` extra brings it on Linux and macOS), else asyncio's own loop. Returns
    what ``main`` returns."""
    config = server.config
    factory = config.get_loop_factory() if hasattr(config, "get_loop_factory") else None  # uvicorn 0.36 on
    if factory is None:
        if not hasattr(config, "get_loop_factory"):
            config.setup_event_loop()  # an older uvicorn installs uvloop's event loop policy
        return asyncio.run(main)
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(main)
    loop = factory()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def run_front(index: int, sock: Any, conn: Any, config: ServeConfig, parent: int, counts: Any = None) -> None:
    """An HTTP front process: serves ``sock`` until a signal stops it or the model process (pid
    ``parent``, at the other end of ``conn``) is gone; with ``counts`` (every front's connection
    count, :class:`~malinn.serve.front_accept.ConnectionCounts`), its share of the connections."""
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

    server = graceful_server(app, config, limit, stopping, None if counts is None else (counts, index))
    lost = []

    def gone() -> None:
        lost.append(True)
        server.should_exit = True

    link.on_lost = gone
    if parsing is not None:
        parsing.start()

    async def main() -> None:
        link.start(asyncio.get_running_loop())
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        if server.started:
            with contextlib.suppress(OSError, ValueError):
                link.send(("up", os.getpid()))
        await serving

    try:
        run_loop(main(), server)
    finally:
        if parsing is not None:
            parsing.shutdown()
        sock.close()
    sys.exit(1 if lost and os.getppid() != parent else 0)
