"""``malinn serve``'s process: the REST API on uvicorn, the models loading beside it, a graceful stop.

The port is bound first (port 0: a free one) and announced on stderr (``malinn: REST API at
http://HOST:PORT``); the models load while the server already answers liveness (``/healthz``) and
readiness (``/readyz``: 503 until every model has an AVAILABLE version). A model that fails its
first load stops the server (exit status 1), as TensorFlow Serving does.

SIGTERM, SIGINT and SIGHUP stop it gracefully: readiness turns 503, no new connection is accepted,
idle keep-alive connections are closed, every request in flight is answered (the queues drain), the
parse workers (:mod:`malinn.serve.parse_workers`, started with the server) end, and the process
exits 0. A second Ctrl-C stops at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..errors import MalinnError
from .config import ServeConfig
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
    import uvicorn

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

    class Server(uvicorn.Server):
        """uvicorn's server, whose signals stop it gracefully and are not raised again afterwards
        (uvicorn re-raises them, which would end the process with the signal's status)."""

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
                manager.stopping = True
                say(f"{signal.Signals(sig).name}: stopping (answering the requests in flight)")
            super().handle_exit(sig, frame)

    sock = _listening_socket(config.host, config.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    uv_config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        limit_concurrency=config.max_connections,
        timeout_graceful_shutdown=int(config.request_timeout) + 5,
    )
    server = Server(uv_config)
    workers = f"; {config.parse_workers} parse workers" if parsing is not None else ""
    say(f"REST API at http://{shown}:{port} (models: {', '.join(manager.models)}{workers}); loading the models")
    if parsing is not None:
        parsing.start()
    manager.start()
    try:
        status = asyncio.run(_run(server, manager, sock, say))
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
        say("a model failed to load: stopping")
        server.should_exit = True
        status = 1
    elif not serving.done():
        say("ready")
    await serving
    return status
