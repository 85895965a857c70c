"""``malinn serve``'s process: the REST API on uvicorn, the models loading beside it, a graceful stop.

The port is bound first (port 0: a free one) and announced on stderr (``malinn: REST API at
http://HOST:PORT``); the models load while the server already answers liveness (``/healthz``) and
readiness (``/readyz``: 503 until every model has an AVAILABLE version). A model that fails its
first load, or a version label that names a version not then AVAILABLE, stops the server (exit
status 1), as TensorFlow Serving does.

SIGTERM, SIGINT and SIGHUP stop it gracefully: readiness turns 503, no new connection is accepted,
idle keep-alive connections are closed, every request in flight is answered (the queues drain), the
parse workers (:mod:`malinn.serve.parse_workers`, started with the server) end, and the process
exits 0. A second Ctrl-C stops at once.

With ``http_workers`` above 1 this process answers no HTTP itself: it binds the port, owns the
device and the batchers, and starts that many front processes on the socket
(:mod:`malinn.serve.fronts`); a signal stops the fronts (each answers what it holds), then the
batchers, and the process exits 0. It says ``ready`` once every model is loaded and every front
listens.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..errors import MalinnError
from .config import ServeConfig
from .front_process import graceful_server, run_loop
from .fronts import Fronts
from .metrics import Metrics
from .parse_workers import ParsePool
from .servables import ModelManager

__all__ = ["serve", "require_extra", "MissingExtra"]

EXTRA_HINT = "pip install 'malinn[serve]'"


class MissingExtra(MalinnError):
    """The ``serve`` extra (starlette, uvicorn) is not installed."""


def _say(text: str) -> None:
    try:
        print(f"malinn: {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and without it a
    # response written as a head and a body waits for the client's delayed ACK (40 ms a request)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise MalinnError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def require_extra() -> None:
    """Raises :class:`MissingExtra`, saying how to install it, where starlette or uvicorn is missing."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise MissingExtra(
            f"malinn serve needs the serve extra ({exc.name or 'starlette, uvicorn'} is missing): {EXTRA_HINT}"
        ) from None


def serve(config: ServeConfig, say: Callable[[str], None] = _say) -> int:
    """Serves ``config``'s models until a signal stops the server; returns the exit status.

    Raises:
        MissingExtra: starlette or uvicorn is not installed.
        MalinnError: the port cannot be bound.
    """
    require_extra()
    if config.http_workers > 1:
        return _serve_with_fronts(config, say)
    from .app import build_app

    metrics = Metrics()
    manager = ModelManager(config, metrics, say=say)
    parsing = None
    if config.parse_workers:
        parsing = ParsePool(
            config.parse_workers, on_restart=lambda: metrics.count("malinn_serve_parse_worker_restarts_total", ())
        )
    app = build_app(manager, metrics, config, parsing=parsing)
    in_flight = app.state.in_flight
    metrics.gauges = lambda: (
        manager.gauges() + [("malinn_serve_in_flight", "Requests being answered now.", (), {(): in_flight[0]})]
    )

    def stopping(signum: int) -> None:
        manager.stopping = True
        say(f"{signal.Signals(signum).name}: stopping (answering the requests in flight)")

    sock = _listening_socket(config.host, config.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    server = graceful_server(app, config, config.max_connections, stopping)
    workers = f"; {config.parse_workers} parse workers" if parsing is not None else ""
    say(f"REST API at http://{shown}:{port} (models: {', '.join(manager.models)}{workers}); loading the models")
    if parsing is not None:
        parsing.start()
    manager.start()
    try:
        status = run_loop(_run(server, manager, sock, say), server)
    finally:
        manager.stopping = True
        manager.stop()
        if parsing is not None:
            parsing.shutdown()
        sock.close()
    say("stopped")
    return status


async def _run(server: Any, manager: ModelManager, sock: socket.socket, say: Callable[[str], None]) -> int:
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not manager.initial.is_set() and not serving.done():
        await asyncio.sleep(0.02)
    status = 0
    if manager.failed and not serving.done():
        for error in manager.failed:
            say(f"error: {error}")
        say("the models cannot be served as configured: stopping")
        server.should_exit = True
        status = 1
    elif not serving.done():
        say("ready")
    await serving
    return status


def _serve_with_fronts(config: ServeConfig, say: Callable[[str], None]) -> int:
    """``--http-workers N``: this process owns the device and the batchers, N front processes
    answer HTTP on the port bound here (:mod:`malinn.serve.fronts`)."""
    metrics = Metrics()
    manager = ModelManager(config, metrics, say=say)
    sock = _listening_socket(config.host, config.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    fronts = Fronts(config, sock, manager, metrics, say)
    signals: list = []
    wake = threading.Event()

    def caught(signum: int, frame: object) -> None:
        signals.append(signum)
        wake.set()
        if signum == signal.SIGINT and signals.count(signal.SIGINT) > 1:  # a second Ctrl-C: at once
            fronts.kill()
            os._exit(130)

    wanted = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
    before = {signum: signal.signal(signum, caught) for signum in wanted}
    say(
        f"REST API at http://{shown}:{port} (models: {', '.join(manager.models)}; {config.http_workers} HTTP "
        f"workers{f', {config.parse_workers} parse workers each' if config.parse_workers else ''}); loading the models"
    )
    status, announced = 0, False
    try:
        fronts.start()
        manager.start()
        while not signals:
            if manager.initial.is_set() and not announced:
                if manager.failed:
                    for error in manager.failed:
                        say(f"error: {error}")
                    say("the models cannot be served as configured: stopping")
                    status = 1
                    break
                if fronts.all_up:
                    say("ready")
                    announced = True
            wake.wait(0.02)
        if signals:
            say(f"{signal.Signals(signals[0]).name}: stopping (answering the requests in flight)")
        manager.stopping = True
        fronts.publish_now()
        sock.close()  # the fronts hold their own copies until they stop
        fronts.stop(config.request_timeout + 10)
    finally:
        manager.stopping = True
        manager.stop()
        sock.close()
        for signum, handler in before.items():
            signal.signal(signum, handler)
    say("stopped")
    return status
