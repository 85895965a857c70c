"""A front's predict path without Starlette's request and response objects answers what they answer:
the model path's ASGI messages are those Starlette's ``Response`` sends, its URL path the one
Starlette's ``request.url.path`` gives (paths with characters the URL writes otherwise too); one
timer ends a request at its time limit wherever it waits (the body, the model) and a client that
goes away mid-body is counted as gone; the request metrics of one answer equal those of separate
counts; a front's pipe writes the bytes ``Connection.send`` writes, in one write, and reads the
model process's messages however the pipe cuts them."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import threading
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
from starlette.requests import Request
from starlette.responses import Response

import malinn
from malinn.layers import Dense
from malinn.serve.app import _url_path, build_app
from malinn.serve.config import ModelConfig, ServeConfig
from malinn.serve.front_link import FrontTable, ModelLink, read_messages
from malinn.serve.fronts import Failed, _Front
from malinn.serve.metrics import Metrics
from malinn.serve.servables import ModelManager


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A saved 4 -> 3 Dense model of random weights and the model itself."""
    model = malinn.Sequential([Dense(3)], name="tiny")
    model.build((None, 4))
    rng = np.random.default_rng(0)
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in model.get_weights()])
    path = tmp_path_factory.mktemp("tiny") / "tiny.malinn"
    model.save(path, overwrite=True)
    return path, model


@pytest.fixture(scope="module")
def served(tiny):
    """The app of a server of ``tiny`` (its own batcher in this process, 0.3 s time limit)."""
    config = ServeConfig(models=(ModelConfig("tiny", tiny[0]),), poll_seconds=0, request_timeout=0.3)
    metrics = Metrics()
    manager = ModelManager(config, metrics, say=lambda text: None)
    manager.start()
    assert manager.initial.wait(120) and not manager.failed, manager.failed
    yield build_app(manager, metrics, config), metrics
    manager.stop()


def scope_of(method: str, path: str, body: bytes = b"", headers: list | None = None) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers if headers is not None else [(b"host", b"127.0.0.1:8501")],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8501),
    }


def call(app, scope: dict, messages: list) -> list:
    """The ASGI messages ``app`` sends for ``scope``, its body read from ``messages`` (an
    ``asyncio.Event`` in the list waits forever: a client that sends no more)."""

    async def run() -> list:
        sent: list = []
        queue = list(messages)

        async def receive() -> dict:
            item = queue.pop(0) if queue else asyncio.Event()
            if isinstance(item, asyncio.Event):
                await item.wait()
            return item

        async def send(message: dict) -> None:
            sent.append(message)

        await app(scope, receive, send)
        return sent

    return asyncio.run(run())


def starlette_sends(status: int, body: bytes) -> list:
    """The messages Starlette's ``Response`` sends for an answer of ``status`` and ``body``."""
    sent: list = []

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(Response(body, status_code=status, media_type="application/json")({"type": "http"}, None, send))
    return sent


def body_of(document) -> list:
    return [{"type": "http.request", "body": json.dumps(document).encode(), "more_body": False}]


@pytest.mark.parametrize(
    "method, path, messages, status",
    [
        ("POST", "/v1/models/tiny:predict", body_of({"instances": [[0.5, -1.0, 2.0, 0.25]]}), 200),
        ("POST", "/v1/models/tiny:predict", body_of({"inputs": [[0.5, -1.0, 2.0, 0.25]] * 3}), 200),
        ("POST", "/v1/models/tiny:predict", [{"type": "http.request", "body": b"[1", "more_body": False}], 400),
        ("POST", "/v1/models/nope:predict", body_of({"instances": [[0.0] * 4]}), 404),
        ("GET", "/v1/models/tiny:predict", [], 405),
        ("GET", "/v1/models/tiny", [], 200),
        ("GET", "/v1/models/tiny/metadata", [], 200),
        ("GET", "/v1/models/a?b", [], 404),  # a path of a decoded %3F: the URL path Starlette gives
        ("GET", "/v1/models/a#b\\c", [], 404),
    ],
)
def test_a_model_path_sends_what_starlettes_response_sends(served, tiny, method, path, messages, status):
    app, _ = served
    scope = scope_of(method, path)
    sent = call(app, scope, messages)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == status
    assert sent == starlette_sends(status, sent[1]["body"])
    answer = json.loads(sent[1]["body"])
    if status == 200 and method == "POST":
        given = json.loads(messages[0]["body"])
        rows = np.asarray(given.get("instances", given.get("inputs")), np.float32)
        got = answer.get("predictions", answer.get("outputs"))
        np.testing.assert_allclose(np.asarray(got, np.float32), tiny[1].predict(rows), rtol=1e-5, atol=1e-6)
    if path.startswith("/v1/models/a"):  # the model's name as Starlette's URL path quotes it
        url_path = Request(scope).url.path
        assert url_path != path and url_path.split("/")[3] in answer["error"]


@pytest.mark.parametrize("path", ["/v1/models/tiny:predict", "/v1/models/a?b", "/v1/models/a#b", "/x\\y", "/a\tb\r\nc"])
def test_the_url_path_is_starlettes(path):
    scope = scope_of("GET", path)
    assert _url_path(scope) == Request(scope).url.path


def test_a_body_that_stops_arriving_is_answered_504_at_the_time_limit(served):
    app, metrics = served
    before = metrics.value("malinn_serve_request_errors_total", ("tiny", "predict", "DEADLINE_EXCEEDED"))
    half = {"type": "http.request", "body": b'{"instances": [[0.5,', "more_body": True}
    sent = call(app, scope_of("POST", "/v1/models/tiny:predict"), [half, asyncio.Event()])
    assert sent[0]["status"] == 504
    assert json.loads(sent[1]["body"]) == {
        "error": "Deadline exceeded: the request was not answered within 0.3 s (--request-timeout)"
    }
    assert metrics.value("malinn_serve_request_errors_total", ("tiny", "predict", "DEADLINE_EXCEEDED")) == before + 1


def test_a_client_gone_mid_body_is_counted_cancelled(served):
    app, metrics = served
    before = metrics.value("malinn_serve_requests_total", ("tiny", "predict", "499"))
    half = {"type": "http.request", "body": b'{"instances": [[0.5,', "more_body": True}
    sent = call(app, scope_of("POST", "/v1/models/tiny:predict"), [half, {"type": "http.disconnect"}])
    assert sent[0]["status"] == 499 and json.loads(sent[1]["body"]) == {"error": "the client closed the connection"}
    assert metrics.value("malinn_serve_requests_total", ("tiny", "predict", "499")) == before + 1


def test_an_oversize_body_is_refused_by_its_declared_length(served):
    app, _ = served
    headers = [(b"host", b"127.0.0.1"), (b"content-length", str(33 * 2**20).encode())]
    sent = call(app, scope_of("POST", "/v1/models/tiny:predict", headers=headers), [])
    assert sent[0]["status"] == 413
    assert json.loads(sent[1]["body"]) == {
        "error": f"the request body of {33 * 2**20} bytes is over the limit of {32 * 2**20} bytes (--max-request-bytes)"
    }


@pytest.mark.parametrize("code", [None, "NOT_FOUND"])
def test_one_answers_metrics_equal_separate_counts(code):
    one, apart = Metrics(), Metrics()
    for seconds in (0.0002, 0.003, 0.7, 100.0):
        one.answered("m", "predict", 404 if code else 200, code, seconds)
        apart.count("malinn_serve_requests_total", ("m", "predict", "404" if code else "200"))
        if code is not None:
            apart.count("malinn_serve_request_errors_total", ("m", "predict", code))
        apart.observe("malinn_serve_request_latency_seconds", ("m", "predict"), seconds)
    assert one.snapshot() == apart.snapshot()
    assert one.render() == apart.render()


def raw_bytes(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        data += os.read(fd, size - len(data))
    return data


@pytest.mark.parametrize("size", [10, 40_000])  # Connection.send writes one over 16 KiB in two writes
def test_both_ends_write_the_bytes_connection_send_writes(size):
    request = ("predict", [("m", 1, False, ("x",), [0], [1], [1.5], [("<f4", (1, size), b"\1" * 4 * size)])])
    answer = ("done", [([0, 1], [1, 1], 1, 2, 0.5)], [("<f4", (2, size), b"\2" * 8 * size)])
    error = ("error", 3, Failed("DeviceError", "the device failed"))
    for message in (request, answer, error):
        ours, theirs = multiprocessing.Pipe(), multiprocessing.Pipe()
        link = ModelLink(ours[1], FrontTable(()), Metrics(), [0])
        front = _Front(0, None, ours[1])
        written = []
        senders = (
            lambda: theirs[1].send(message),  # a write of over 64 KiB waits for the reader
            lambda: link.send(message),  # the front's end
            lambda: front.send(message),  # the model process's end
        )
        for sender, reader in zip(senders, (theirs[0], ours[0], ours[0])):
            thread = threading.Thread(target=sender)
            thread.start()
            head = raw_bytes(reader.fileno(), 4)
            written.append(head + raw_bytes(reader.fileno(), int.from_bytes(head, "big")))
            thread.join(10)
        assert written[0] == written[1] == written[2]
        got = read_messages(bytearray(written[1]))
        assert len(got) == 1 and got[0][:2] == message[:2]
        if message is error:
            assert (type(got[0][2]), got[0][2].kind, str(got[0][2])) == (Failed, "DeviceError", "the device failed")
        else:
            assert got == [message]
        for conn in (*ours, *theirs):
            conn.close()


def test_the_front_reads_messages_however_the_pipe_cuts_them():
    model_end, front_end = multiprocessing.Pipe()
    link = ModelLink(front_end, FrontTable(()), Metrics(), [0])

    async def run() -> list:
        link.start(asyncio.get_running_loop())
        scrapes = [asyncio.ensure_future(link.scrape()) for _ in range(3)]
        await asyncio.sleep(0.05)
        keys = [model_end.recv()[1] for _ in range(3)]
        data = b""
        for key in keys:
            pickled = ForkingPickler.dumps(("metrics", key, f"text {key}" * 3000))
            data += len(pickled).to_bytes(4, "big") + bytes(pickled)
        cut = len(data) // 3 + 100
        os.write(model_end.fileno(), data[:cut])  # the first message, and part of the second
        await asyncio.sleep(0.05)
        done = [s.done() for s in scrapes]
        os.write(model_end.fileno(), data[cut:])  # the rest
        texts = await asyncio.wait_for(asyncio.gather(*scrapes), 10)
        model_end.close()
        await asyncio.sleep(0.05)
        return done, texts, keys

    done, texts, keys = asyncio.run(run())
    assert done == [True, False, False]
    assert texts == [f"text {key}" * 3000 for key in keys]
    assert link._lost  # the model process's end closed: the link ended
    front_end.close()
