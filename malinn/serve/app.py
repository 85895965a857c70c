"""The REST API: TensorFlow Serving's paths and payloads, on Starlette.

* ``GET /v1/models/{name}[/versions/{v}|/labels/{l}]``: the versions' status;
* ``GET /v1/models/{name}[/versions/{v}|/labels/{l}]/metadata``: the ``serving_default`` signature;
* ``POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict``: the row or columnar form;
* ``GET /monitoring/prometheus/metrics``: the metrics (:mod:`malinn.serve.metrics`);
* ``GET /healthz`` (liveness: the process answers) and ``GET /readyz`` (readiness: every model has
  an AVAILABLE version and the server is not stopping; 503 otherwise).

An error is ``{"error": "..."}`` with TensorFlow Serving's status: 400 for a request the model cannot
take, 404 for an unknown model, version or label, 503 when the model's queue is full (or a parse
worker exited while the workers held the request), 504 when the request's time limit passed; 413
for a body over the size limit, 500 where the device failed.
A client that goes away while its request waits takes its request out of the queue.

A model path (every predict, status and metadata request) is answered as a raw ASGI application:
no Starlette request, URL or response object, one timer for the request's time limit wherever it
waits, and its metrics counted under one hold of their lock; its answer's messages, status and
words are those Starlette's would be (other paths go through Starlette's router).

A predict body of ``config.parse_worker_min_bytes`` or more is parsed in a parse worker process
(:mod:`malinn.serve.parse_workers`) where the server has them, so that large bodies are parsed in
parallel, and an answer of ``ENCODE_WORKER_MIN_VALUES`` numbers or more
(``ENCODE_WORKER_MIN_VALUES_ORJSON`` where orjson writes the answers) is written there; the
answer, an error's too, is the same wherever the body was parsed.

Starlette is imported here only, on the ``malinn serve`` path (the ``serve`` extra).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import re
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from .batcher import Cancelled, DeadlineExceeded, Overloaded, Retired, Task, Unavailable
from .config import ENCODE_WORKER_MIN_VALUES, ENCODE_WORKER_MIN_VALUES_ORJSON, ServeConfig
from .metrics import Metrics
from .parse_workers import ParsePool, WorkerLost
from .payload import BadRequest, PredictRequest, dumps, encode_predict, parse_predict, writes_fast
from .signature import SIGNATURE_NAME, Signature
from .version_table import ModelVersion, NotFound

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request

    from .front_link import FrontTable
    from .servables import ModelManager

__all__ = ["build_app"]

#: /v1/models/{name}[/versions/{v}|/labels/{l}][/metadata|:verb]
MODEL_PATH = re.compile(
    r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>[^/:]+)|/labels/(?P<label>[^/:]+))?"
    r"(?P<tail>/metadata|:[A-Za-z]+)?/?$"
)
#: bodies above this size are parsed, and answers above this many values written, off the event loop
OFF_LOOP_BYTES = 1 << 16
OFF_LOOP_VALUES = 1 << 14

#: an error's HTTP status, by TensorFlow Serving's error code
STATUS = {
    "INVALID_ARGUMENT": 400,
    "NOT_FOUND": 404,
    "METHOD_NOT_ALLOWED": 405,
    "RESOURCE_EXHAUSTED": 413,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
    "INTERNAL": 500,
    "CANCELLED": 499,
}


#: characters Starlette's ``request.url.path`` writes otherwise than the ASGI scope's path holds them
#: (quoted, or dropped by :func:`urllib.parse.urlsplit`): a path without any is its own URL path
_URL_CHANGES = re.compile(r"[?#\\\t\r\n]")


def _url_path(scope: Any) -> str:
    """``request.url.path`` of the request of ``scope``, as Starlette gives it, without building a
    URL where the path holds nothing that the URL writes otherwise (every usual path)."""
    path = scope["path"]
    if _URL_CHANGES.search(path) is None:
        return path
    from starlette.datastructures import URL

    return URL(scope=scope).path


def _head(body: bytes, content_type: bytes = b"application/json") -> list:
    """An answer's headers, as Starlette's ``Response(body, media_type=...)`` writes them."""
    return [(b"content-length", str(len(body)).encode("latin-1")), (b"content-type", content_type)]


#: the connection of the request being answered, where malinn's HTTP protocol
#: (:func:`malinn.serve.front_process.graceful_server`) set it: ``watch(callback)`` calls back once
#: the client goes away, ``unwatch(callback)`` forgets it. Elsewhere (None) a task per request
#: watches for the disconnect.
CONNECTION: contextvars.ContextVar[Any] = contextvars.ContextVar("malinn_serve_connection", default=None)


def _signature(served: ModelVersion) -> Signature:
    """The signature of a version :meth:`~malinn.serve.version_table.VersionTable.resolve` answered
    (an AVAILABLE version: it has one)."""
    signature = served.signature
    assert signature is not None, f"model {served.name!r} version {served.number} is AVAILABLE without a signature"
    return signature


class _Refused(Exception):
    """A request answered with an error: TensorFlow Serving's code and the message."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class _Gone(Exception):
    """The client went away: nothing can be answered."""


def build_app(
    manager: ModelManager | FrontTable,
    metrics: Metrics,
    config: ServeConfig,
    log: Callable[[str], None] | None = None,
    parsing: ParsePool | None = None,
    submit: Callable[..., Awaitable[tuple]] | None = None,
    scrape: Callable[[], Awaitable[str]] | None = None,
) -> Starlette:
    """The ASGI application serving ``manager``'s models.

    Args:
        manager: the served models (a :class:`~malinn.serve.servables.ModelManager`, or a front
            process's copy of its table).
        metrics: where requests are counted.
        config: the limits (body size, time), whether each request is logged, the smallest body
            sent to a parse worker.
        log: writes one request's JSON line (default: stdout).
        parsing: the parse workers (None: every body is parsed in this process).
        submit: ``await submit(name, version, parsed, pinned, deadline, reparse)`` runs a parsed
            request and returns ``(outputs, version number, batch, queued seconds, parsed,
            signature)`` (default: the version's batcher in this process); cancelling it takes
            the request out of its queue.
        scrape: returns the metrics' text (default: ``metrics.render()``).
    """
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    in_flight = [0]
    encode_min_values = ENCODE_WORKER_MIN_VALUES_ORJSON if writes_fast() else ENCODE_WORKER_MIN_VALUES
    log = log or (lambda line: print(line, flush=True))

    def respond(status: int, document: Any, content_type: str = "application/json") -> Response:
        body = document if isinstance(document, bytes) else dumps(document)
        return Response(body, status_code=status, media_type=content_type)

    def finish(client: Any, record: dict[str, Any], started: float, status: int, code: str | None) -> None:
        seconds = time.monotonic() - started
        metrics.answered(record.get("model", ""), record["api"], status, code, seconds)
        if config.log_requests:
            record.update(
                status=status,
                latency_ms=round(seconds * 1e3, 3),
                client=f"{client[0]}:{client[1]}" if client else None,
            )
            if code is not None:
                record["error_code"] = code
            log(json.dumps(record, separators=(",", ":")))

    async def read_body(scope: Any, receive: Any) -> bytes:
        limit = config.max_request_bytes
        declared = None
        for key, value in scope["headers"]:  # the first content-length, as Starlette's headers read it
            if key == b"content-length":
                declared = value.decode("latin-1")
                break
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _Refused(
                "RESOURCE_EXHAUSTED",
                f"the request body of {int(declared)} bytes is over the limit of {limit} bytes (--max-request-bytes)",
            )
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                if chunk:
                    size += len(chunk)
                    if size > limit:
                        raise _Refused(
                            "RESOURCE_EXHAUSTED",
                            f"the request body is over the limit of {limit} bytes (--max-request-bytes)",
                        )
                    chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            elif message["type"] == "http.disconnect":
                raise _Gone()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def disconnected(receive: Any) -> None:
        """Returns when the client closes its connection (the body is read by then)."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return

    async def run_here(
        name: str,
        served: ModelVersion,
        parsed: PredictRequest,
        pinned: bool,
        deadline: float,
        reparse: Callable[[Signature], PredictRequest],
    ) -> tuple:
        """The request run by its version's batcher in this process: ``(outputs, version number,
        batch, queued seconds, parsed, signature)``; cancelled, it leaves the queue."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[list] = loop.create_future()

        def settle(outputs: list, error: BaseException | None) -> None:
            if not answer.done():
                if error is not None:
                    answer.set_exception(error)
                else:
                    answer.set_result(outputs)

        signature = _signature(served)
        task = Task(parsed.arrays, parsed.samples, lambda o, e: loop.call_soon_threadsafe(settle, o, e), deadline)
        for _ in range(8):  # a version being unloaded sends an unpinned request to the newest
            batcher = served.batcher
            try:
                if batcher is None:
                    raise Retired(served.name)
                batcher.submit(task)
                break
            except Retired:
                if pinned:
                    raise NotFound(
                        f"Servable not found for request: Specific({name}, {served.number}) (it is being unloaded)"
                    ) from None
                served = manager.resolve(name)
                if _signature(served).input_names != signature.input_names:
                    signature = _signature(served)
                    parsed = reparse(signature)
                    task = Task(parsed.arrays, parsed.samples, task.done, deadline)
        else:
            raise Unavailable(f"model {name!r}: every version was being unloaded; try again")
        try:
            outputs = await answer
        except asyncio.CancelledError:
            batcher.withdraw(task)
            raise
        return outputs, served.number, task.batch, task.queued_s, parsed, signature

    run = submit or run_here

    async def predict(
        scope: Any,
        receive: Any,
        name: str,
        version: int | None,
        label: str | None,
        record: dict[str, Any],
        deadline: float,
    ) -> bytes:
        # The request runs in this task (no task of its own: each costs the event loop a turn). One timer
        # cancels it at its time limit, and a client that goes away while it waits for the model cancels
        # it too (the cancelled run leaves its queue); ``ended`` says which did.
        me = asyncio.current_task()
        loop = asyncio.get_running_loop()
        ended: list = []
        waiting = [True]

        def end(why: type) -> None:
            if waiting[0] and me is not None and not ended:
                ended.append(why)
                me.cancel()

        def lost() -> None:
            end(_Gone)

        def went(watch: asyncio.Task) -> None:
            if not watch.cancelled() and watch.exception() is None:
                lost()

        timer = loop.call_at(loop.time() + max(deadline - time.monotonic(), 0.001), end, DeadlineExceeded)
        connection = watch = None
        try:
            body = await read_body(scope, receive)
            record["bytes_in"] = len(body)
            pinned = version is not None or label is not None
            served = manager.resolve(name, version, label)
            record["version"] = served.number
            signature = _signature(served)
            if parsing is not None and len(body) >= config.parse_worker_min_bytes:
                metrics.count("malinn_serve_worker_parses_total", ())
                try:
                    parsed = await asyncio.wait_for(
                        parsing.parse(body, signature), max(deadline - time.monotonic(), 0.001)
                    )
                except WorkerLost as exc:
                    raise _Refused("UNAVAILABLE", str(exc)) from None
            elif len(body) > OFF_LOOP_BYTES:
                parsed = await asyncio.to_thread(parse_predict, body, signature)
            else:
                parsed = parse_predict(body, signature)
            record["instances"] = parsed.samples
            connection = CONNECTION.get()
            if connection is not None:
                connection.watch(lost)
            else:
                watch = asyncio.ensure_future(disconnected(receive))
                watch.add_done_callback(went)
            handed = time.monotonic()
            # raises what ended the request
            outputs, number, batch, queued_s, parsed, signature = await run(
                name, served, parsed, pinned, deadline, lambda signature: parse_predict(body, signature)
            )
            ran_s = time.monotonic() - handed
        except asyncio.CancelledError:
            if not ended:
                raise  # the server is stopping at once
            if me is not None and hasattr(me, "uncancel"):  # Python 3.11 on
                me.uncancel()
            raise ended[0]() from None
        finally:
            waiting[0] = False  # a callback already scheduled must not cancel the answer
            timer.cancel()
            if watch is not None:
                watch.cancel()
            elif connection is not None:
                connection.unwatch(lost)
        record["version"] = number
        record["batch"], record["queue_ms"], record["run_ms"] = batch, round(queued_s * 1e3, 3), round(ran_s * 1e3, 3)
        metrics.ran(name, queued_s, ran_s)
        values = sum(o.size for o in outputs)
        if parsing is not None and values >= encode_min_values:
            metrics.count("malinn_serve_worker_encodes_total", ())
            return await parsing.encode(outputs, signature, parsed.columnar)
        if values > OFF_LOOP_VALUES:
            return await asyncio.to_thread(encode_predict, outputs, signature, parsed.columnar)
        return encode_predict(outputs, signature, parsed.columnar)

    def metadata(name: str, version: int | None, label: str | None) -> dict[str, Any]:
        served = manager.resolve(name, version, label)
        return {
            "model_spec": {"name": name, "signature_name": "", "version": str(served.number)},
            "metadata": {"signature_def": {"signature_def": {SIGNATURE_NAME: _signature(served).signature_def()}}},
        }

    async def models(scope: Any, receive: Any) -> tuple[int, bytes]:
        """A model path's answer, every error's too: ``(HTTP status, JSON body)``."""
        started = time.monotonic()
        deadline = started + config.request_timeout
        method = scope["method"]
        path = _url_path(scope)
        record: dict[str, Any] = {"method": method, "path": path, "api": "other"}
        if config.log_requests:
            record = {"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), **record}
        in_flight[0] += 1
        status = 500
        code: str | None = "INTERNAL"
        try:
            match = MODEL_PATH.match(path)
            if match is None:
                raise _Refused("NOT_FOUND", f"Malformed request: {method} {path}")
            name, tail = match["name"], match["tail"] or ""
            if name in manager.models:
                record["model"] = name
            record["api"] = {"": "status", "/metadata": "metadata", ":predict": "predict"}.get(tail, "other")
            given, label = match["version"], match["label"]
            version = None
            if given is not None:
                if not given.isdigit():
                    raise _Refused("INVALID_ARGUMENT", f"Failed to convert version: {given} to numeric.")
                version = int(given)
            wanted = "POST" if tail.startswith(":") else "GET"
            if method != wanted and not (method == "HEAD" and wanted == "GET"):  # HEAD: GET's head alone
                raise _Refused("METHOD_NOT_ALLOWED", f"{path} takes {wanted}, not {method}")
            if tail == ":predict":
                answer = await predict(scope, receive, name, version, label, record, deadline)
            elif tail.startswith(":"):
                raise _Refused(
                    "INVALID_ARGUMENT",
                    f"{tail[1:]} is not served: a Keras model has the predict API alone ({SIGNATURE_NAME})",
                )
            elif tail == "/metadata":
                answer = dumps(metadata(name, version, label))
            else:
                answer = dumps({"model_version_status": manager.statuses(name, version, label)})
            status, code = 200, None
            return 200, answer
        except _Gone:
            status, code = 499, "CANCELLED"
            return 499, dumps({"error": "the client closed the connection"})
        except _Refused as exc:
            status, code = STATUS[exc.code], exc.code
            return status, dumps({"error": str(exc)})
        except BadRequest as exc:
            status, code = 400, "INVALID_ARGUMENT"
            return 400, dumps({"error": str(exc)})
        except NotFound as exc:
            status, code = 404, "NOT_FOUND"
            return 404, dumps({"error": str(exc)})
        except Overloaded as exc:
            status, code = 503, "UNAVAILABLE"
            return 503, dumps({"error": f"The server is overloaded: {exc}; try again later"})
        except Unavailable as exc:
            status, code = 503, "UNAVAILABLE"
            return 503, dumps({"error": str(exc)})
        except (DeadlineExceeded, asyncio.TimeoutError):
            status, code = 504, "DEADLINE_EXCEEDED"
            return 504, dumps(
                {
                    "error": f"Deadline exceeded: the request was not answered within "
                    f"{config.request_timeout:g} s (--request-timeout)"
                }
            )
        except Cancelled:
            status, code = 499, "CANCELLED"
            return 499, dumps({"error": "the request was cancelled"})
        except Exception as exc:  # the device failed, or a bug: the request is told, the server goes on
            kind = getattr(exc, "kind", None) or type(exc).__name__  # a model process's error keeps its name
            print(f"malinn: error: {method} {path}: {kind}: {exc}", file=sys.stderr, flush=True)
            return 500, dumps({"error": f"{kind}: {exc}"})
        finally:
            in_flight[0] -= 1
            finish(scope.get("client"), record, started, status, code)

    async def answer_model(scope: Any, receive: Any, send: Any) -> None:
        """A model path answered as a raw ASGI application: its two messages sent as Starlette's
        ``Response`` sends them (the same bytes), without a request or a response object."""
        status, body = await models(scope, receive)
        await send({"type": "http.response.start", "status": status, "headers": _head(body)})
        # a HEAD request gets GET's head (its Content-Length too) and no body (RFC 9110, 9.3.2)
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})

    async def models_endpoint(request: Request) -> Response:
        status, body = await models(request.scope, request.receive)
        return respond(status, body)

    async def prometheus(request: Request) -> Response:
        text = await scrape() if scrape is not None else metrics.render()
        return respond(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")

    async def healthz(request: Request) -> Response:
        return respond(200, {"status": "live"})

    async def readyz(request: Request) -> Response:
        if manager.ready:
            return respond(200, {"status": "ready"})
        reason = (
            "stopping"
            if manager.stopping
            else "loading models"
            if not manager.initial.is_set()
            else "a model has no AVAILABLE version"
        )
        return respond(503, {"error": f"not ready: {reason}"})

    async def not_found(request: Request, exc: Exception | None = None) -> Response:
        return respond(404, {"error": f"Malformed request: {request.method} {request.url.path}"})

    async def not_allowed(request: Request, exc: Exception | None = None) -> Response:
        return respond(405, {"error": f"{request.url.path} takes GET, not {request.method}"})

    model_route = Route("/v1/models/{rest:path}", models_endpoint, methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    routes = [
        model_route,
        Route("/monitoring/prometheus/metrics", prometheus, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]

    class App(Starlette):
        """Starlette's application whose model paths (every predict, status and metadata request)
        go straight to :func:`answer_model`: it answers every error itself, so Starlette's error
        middlewares, router and request and response objects would only add their CPU (the same
        answers either way)."""

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            # (every method: a model path names the one it takes, POST or GET, in its 405)
            if scope["type"] == "http" and scope["path"].startswith("/v1/models/"):
                scope["app"] = self
                await answer_model(scope, receive, send)
                return
            await super().__call__(scope, receive, send)

    app = App(routes=routes, exception_handlers={404: not_found, 405: not_allowed})
    app.router.redirect_slashes = False
    app.state.in_flight = in_flight
    return app
