"""malinn serve as a client written for TensorFlow Serving and its operator meet it: the connection
limit (``--max-connections``) serves that many connections, alone or shared among HTTP fronts, and
refuses the next with the API's JSON error; the counts of an HTTP front that exited stay in the
metrics; a request whose version is not a number is counted and logged under its API; a method a
model path does not take is told the one it takes."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time

import pytest
from serving import ServerProcess, close, metric
from test_serve_http_workers import front_pids


def wait_said(proc: ServerProcess, words: str, timeout: float = 120) -> None:
    """Waits for ``malinn: WORDS`` on the server's stderr (readiness may itself be refused)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if f"malinn: {words}" in proc.stderr:
            return
        if proc.proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"malinn serve did not say {words!r}:\n" + "\n".join(proc.stderr))


def answer(conn: http.client.HTTPConnection, method: str, path: str, body=None) -> tuple:
    """``(status, headers, JSON answer)`` of one request on the kept-alive connection ``conn``."""
    conn.request(method, path, body=json.dumps(body) if body is not None else None)
    response = conn.getresponse()
    return response.status, response.headers, json.loads(response.read())


def serving(*args: str):
    """A server of ``args`` once it says it is ready; stopped after, with exit status 0."""
    proc = ServerProcess(*args)
    try:
        wait_said(proc, "ready")
        yield proc
    finally:
        status = proc.stop()
    assert status == 0, "\n".join(proc.stderr)


@pytest.fixture(scope="module")
def limited(keras_models):
    """One process serving ``mlp`` with ``--max-connections 2``, logging each request."""
    yield from serving(
        str(keras_models.path("mlp")), "--parse-workers", "0", "--max-connections", "2", "--log-requests"
    )


def test_max_connections_serves_that_many_and_refuses_the_next_with_a_json_503(limited, keras_models):
    x = next(iter(keras_models.x("mlp").values()))[:1]
    y = next(iter(keras_models.y("mlp").values()))[:1]
    first, second, third = (limited.connection(10) for _ in range(3))
    try:
        for conn in (first, second):  # two connections open at once: both served, kept alive
            status, _, got = answer(conn, "POST", "/v1/models/mlp:predict", {"instances": x.tolist()})
            assert status == 200, got
            close(got["predictions"], y)
        status, headers, got = answer(third, "GET", "/v1/models/mlp")
        assert status == 503 and "--max-connections" in got["error"], got
        assert headers["content-type"] == "application/json" and headers["connection"] == "close"
        first.close()  # a place frees: a new connection is served
        deadline = time.monotonic() + 10
        while True:
            fourth = limited.connection(10)
            try:
                status, _, got = answer(fourth, "GET", "/v1/models/mlp")
            finally:
                fourth.close()
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert status == 200 and got["model_version_status"][0]["state"] == "AVAILABLE", got
    finally:
        for conn in (first, second, third):
            conn.close()


@pytest.fixture(scope="module")
def fronts(keras_models):
    """``mlp`` served by two HTTP fronts sharing ``--max-connections 2``."""
    yield from serving(str(keras_models.path("mlp")), "--http-workers", "2", "--max-connections", "2")


def test_max_connections_shared_by_http_fronts_serves_each_fronts_share(fronts):
    # one connection for each front (uvicorn's own limit served N - 1: none)
    conn = fronts.connection(10)
    try:
        status, _, got = answer(conn, "GET", "/readyz")
        assert status == 200, got
    finally:
        conn.close()


def test_the_counts_of_a_front_that_exited_stay_in_the_metrics(fronts, keras_models):
    x = next(iter(keras_models.x("mlp").values()))
    for i in range(6):
        status, got = fronts.predict("mlp", {"instances": x[i : i + 2].tolist()})
        assert status == 200, got
    before = fronts.metrics()  # every front tells its counts
    series = [
        ("malinn_serve_requests_total", {"model": "mlp", "api": "predict", "code": "200"}),
        ("malinn_serve_request_latency_seconds_count", {"model": "mlp", "api": "predict"}),
        ("malinn_serve_run_latency_seconds_count", {"model": "mlp"}),
        ("malinn_serve_queue_latency_seconds_sum", {"model": "mlp"}),
    ]
    counted = [metric(before, name, **labels) for name, labels in series]
    assert counted[0] >= 6 and counted[2] >= 6, counted
    end = time.monotonic() + 60
    while len(front_pids(fronts)) < 2:
        assert time.monotonic() < end, "\n".join(fronts.stderr)
        time.sleep(0.02)
    for index, pid in front_pids(fronts).items():  # both fronts killed, each started again
        os.kill(pid, signal.SIGKILL)
        while front_pids(fronts)[index] == pid:
            assert time.monotonic() < end, "\n".join(fronts.stderr)
            time.sleep(0.02)
    after = fronts.metrics()
    assert metric(after, "malinn_serve_front_restarts_total") == 2
    # the counters and histograms do not go back (Prometheus would read a drop as a reset)
    assert [metric(after, name, **labels) for name, labels in series] == counted


@pytest.mark.parametrize(
    "method, path, api",
    [
        ("POST", "/v1/models/mlp/versions/x:predict", "predict"),
        ("GET", "/v1/models/mlp/versions/x/metadata", "metadata"),
    ],
)
def test_a_version_that_is_not_a_number_is_counted_and_logged_under_its_api(limited, method, path, api):
    before = limited.metrics()
    seen = len(limited.stdout)
    status, got = limited.request(method, path, {"instances": [[0.0] * 20]} if method == "POST" else None)
    assert status == 400 and got == {"error": "Failed to convert version: x to numeric."}, got
    after = limited.metrics()
    labels = {"model": "mlp", "api": api}
    for name, more in (
        ("malinn_serve_requests_total", {"code": "400"}),
        ("malinn_serve_request_errors_total", {"error": "INVALID_ARGUMENT"}),
    ):
        assert metric(after, name, **labels, **more) - metric(before, name, **labels, **more) == 1, name
    time.sleep(0.2)
    lines = [json.loads(line) for line in limited.stdout[seen:]]
    assert [(line["path"], line["api"], line["status"]) for line in lines] == [(path, api, 400)], lines


@pytest.mark.parametrize("method", ["OPTIONS", "TRACE"])
def test_another_method_on_predict_is_told_that_predict_takes_post(limited, method):
    status, got = limited.request(method, "/v1/models/mlp:predict")
    assert status == 405 and got == {"error": f"/v1/models/mlp:predict takes POST, not {method}"}, got
