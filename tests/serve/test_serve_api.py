"""malinn serve's REST API against a real server process on 127.0.0.1: TensorFlow Serving's paths and
payloads, answers equal to Keras's, every error path, dynamic batching, the queue's bound, time
limits, disconnecting clients, metrics and the request log."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from serving import ServerProcess, close, metric

#: per-model batching of the server's config file (the global: max_batch_size 8, no wait)
BATCHING = {
    "cnn": {"max_batch_size": 4},
    "mlp_solo": {"enabled": False},
    "merged": {"max_batch_size": 8, "batch_timeout_micros": 1_000_000},
    "slow_queue": {"max_batch_size": 4, "batch_timeout_micros": 2_000_000, "max_enqueued_batches": 1},
    "stuck": {"max_batch_size": 2, "batch_timeout_micros": 10_000_000},
}
FILES = {
    "mlp": "mlp",
    "cnn": "cnn",
    "two_io": "two_io",
    "mlp_solo": "mlp",
    "merged": "mlp",
    "slow_queue": "mlp",
    "stuck": "mlp",
}
MAX_BYTES = 200_000
TIMEOUT = 3


@pytest.fixture(scope="module")
def server(keras_models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve_api")
    entries = []
    for name, key in FILES.items():
        entry = {"name": name, "base_path": str(keras_models.path(key))}
        if name in BATCHING:
            entry["batching_parameters"] = BATCHING[name]
        if name == "mlp":
            entry["version_labels"] = {"stable": 1}
        entries.append(entry)
    config = folder / "models.json"
    config.write_text(json.dumps({"model_config_list": entries, "batching_parameters": {"max_batch_size": 8}}))
    proc = ServerProcess(
        "--model-config-file",
        str(config),
        "--request-timeout",
        str(TIMEOUT),
        "--log-requests",
        "--max-request-bytes",
        str(MAX_BYTES),
    )
    try:
        yield proc.wait_ready()
    finally:
        status = proc.stop()
    assert status == 0, "\n".join(proc.stderr)


def one_input(keras_models, key):
    return next(iter(keras_models.x(key).values()))


def one_output(keras_models, key):
    return next(iter(keras_models.y(key).values()))


@pytest.mark.parametrize("key", ["mlp", "cnn"])
def test_predict_in_the_row_and_columnar_forms_equals_keras(server, keras_models, key):
    x, y = one_input(keras_models, key), one_output(keras_models, key)
    status, answer = server.predict(key, {"instances": x.tolist()})
    assert status == 200, answer
    assert set(answer) == {"predictions"}
    close(answer["predictions"], y)
    status, answer = server.predict(key, {"signature_name": "serving_default", "inputs": x[:5].tolist()})
    assert status == 200, answer
    assert set(answer) == {"outputs"}
    close(answer["outputs"], y[:5])
    # one sample at a time (batch 1), and the one input under the name a client knows it by
    for i in (0, 7):
        status, answer = server.predict(key, {"instances": [{"anything": x[i].tolist()}]})
        assert status == 200, answer
        close(answer["predictions"], y[i : i + 1])


def test_a_model_of_two_named_inputs_and_outputs_equals_keras(server, keras_models):
    x, y = keras_models.x("two_io"), keras_models.y("two_io")
    rows = [{"image": x["image"][i].tolist(), "meta": x["meta"][i].astype(int).tolist()} for i in range(6)]
    status, answer = server.predict("two_io", {"instances": rows})
    assert status == 200, answer
    assert len(answer["predictions"]) == 6 and all(set(p) == {"label", "score"} for p in answer["predictions"])
    close([p["label"] for p in answer["predictions"]], y["label"][:6])
    close([p["score"] for p in answer["predictions"]], y["score"][:6])
    status, answer = server.predict(
        "two_io", {"inputs": {"meta": x["meta"].astype(int).tolist(), "image": x["image"].tolist()}}
    )
    assert status == 200, answer
    assert set(answer["outputs"]) == {"label", "score"}
    close(answer["outputs"]["label"], y["label"])
    close(answer["outputs"]["score"], y["score"])


def test_status_metadata_versions_and_labels_answer_in_tensorflow_servings_shapes(server):
    available = {
        "model_version_status": [
            {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
        ]
    }
    assert server.request("GET", "/v1/models/mlp") == (200, available)
    assert server.request("GET", "/v1/models/mlp/versions/1") == (200, available)
    assert server.request("GET", "/v1/models/mlp/labels/stable") == (200, available)
    status, meta = server.request("GET", "/v1/models/two_io/metadata")
    assert status == 200, meta
    assert meta["model_spec"] == {"name": "two_io", "signature_name": "", "version": "1"}
    sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sig["method_name"] == "tensorflow/serving/predict"
    assert {k: (v["dtype"], [d["size"] for d in v["tensor_shape"]["dim"]]) for k, v in sig["inputs"].items()} == {
        "image": ("DT_FLOAT", ["-1", "6", "6", "1"]),
        "meta": ("DT_INT32", ["-1", "4"]),
    }
    assert {k: (v["dtype"], [d["size"] for d in v["tensor_shape"]["dim"]]) for k, v in sig["outputs"].items()} == {
        "label": ("DT_FLOAT", ["-1", "3"]),
        "score": ("DT_FLOAT", ["-1", "1"]),
    }
    status, meta = server.request("GET", "/v1/models/mlp/versions/1/metadata")
    assert status == 200 and meta["model_spec"]["version"] == "1"
    sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert [d["size"] for d in next(iter(sig["inputs"].values()))["tensor_shape"]["dim"]] == ["-1", "20"]
    assert list(sig["outputs"]) == ["probs"]


GOOD = {"instances": [[0.5] * 20]}
#: (method, path, body, status, words the error must hold)
ERRORS = [
    ("POST", "/v1/models/mlp:predict", b'{"instances": [[1, 2', 400, ["malformed JSON"]),
    ("POST", "/v1/models/mlp:predict", b"\xff\xfe", 400, ["malformed JSON", "UTF-8"]),
    ("POST", "/v1/models/mlp:predict", b"[1, 2]", 400, ["JSON object"]),
    ("POST", "/v1/models/mlp:predict", b"", 400, ["malformed JSON"]),
    ("POST", "/v1/models/mlp:predict", {"instances": [[0.5] * 20], "inputs": [[0.5] * 20]}, 400, ["not both"]),
    ("POST", "/v1/models/mlp:predict", {"examples": []}, 400, ["'examples'"]),
    ("POST", "/v1/models/mlp:predict", {"signature_name": "serving_default"}, 400, ["missing 'instances'"]),
    ("POST", "/v1/models/mlp:predict", {"instances": []}, 400, ["empty"]),
    ("POST", "/v1/models/mlp:predict", {"instances": 3}, 400, ["list of samples"]),
    ("POST", "/v1/models/mlp:predict", {"instances": [[0.5] * 19]}, 400, ["'hidden_input'", "(None, 20)", "(1, 19)"]),
    ("POST", "/v1/models/mlp:predict", {"inputs": [0.5] * 20}, 400, ["(None, 20)", "(20,)", "batch axis first"]),
    (
        "POST",
        "/v1/models/cnn:predict",
        {"instances": [[[[0.0] * 3] * 12] * 11]},
        400,
        ["(None, 12, 12, 3)", "(1, 11, 12, 3)"],
    ),
    ("POST", "/v1/models/mlp:predict", {"instances": [["a"] * 20]}, 400, ["'hidden_input'", "DT_FLOAT", "strings"]),
    ("POST", "/v1/models/mlp:predict", {"instances": [[None] * 20]}, 400, ["'hidden_input'", "null"]),
    ("POST", "/v1/models/mlp:predict", {"instances": [[True] * 20]}, 400, ["booleans"]),
    ("POST", "/v1/models/mlp:predict", {"instances": [[0.5] * 20, [0.5] * 19]}, 400, ["ragged"]),
    (
        "POST",
        "/v1/models/mlp:predict",
        {"instances": [[0.5] * 20], "signature_name": "classify"},
        400,
        ["'classify'", "serving_default"],
    ),
    ("POST", "/v1/models/two_io:predict", {"instances": [{"image": [[[0.0]] * 6] * 6}]}, 400, ["missing", "'meta'"]),
    (
        "POST",
        "/v1/models/two_io:predict",
        {"instances": [{"image": [[[0.0]] * 6] * 6, "meta": [1, 2, 3, 4], "extra": [1]}]},
        400,
        ["unknown", "'extra'"],
    ),
    (
        "POST",
        "/v1/models/two_io:predict",
        {"instances": [{"image": [[[0.0]] * 6] * 6, "meta": [1.5, 2, 3, 4]}]},
        400,
        ["'meta'", "DT_INT32", "integers", "1.5"],
    ),
    ("POST", "/v1/models/two_io:predict", {"instances": [[0.0] * 4]}, 400, ["2 inputs", "image", "meta"]),
    (
        "POST",
        "/v1/models/two_io:predict",
        {"inputs": {"image": [[[[0.0]] * 6] * 6] * 2, "meta": [[1, 2, 3, 4]]}},
        400,
        ["different numbers of samples", "'image' 2", "'meta' 1"],
    ),
    ("POST", "/v1/models/nope:predict", GOOD, 404, ["Servable not found", "nope"]),
    ("POST", "/v1/models/mlp/versions/7:predict", GOOD, 404, ["Servable not found", "Specific(mlp, 7)"]),
    ("POST", "/v1/models/mlp/versions/x:predict", GOOD, 400, ["version: x"]),
    ("POST", "/v1/models/mlp/labels/canary:predict", GOOD, 404, ["canary"]),
    ("GET", "/v1/models/nope", None, 404, ["nope"]),
    ("GET", "/v1/models/mlp/versions/7", None, 404, ["version 7"]),
    ("GET", "/v1/models/nope/metadata", None, 404, ["nope"]),
    ("GET", "/v1/models/mlp:predict", None, 405, ["POST"]),
    ("POST", "/v1/models/mlp", GOOD, 405, ["GET"]),
    ("POST", "/v1/models/mlp:classify", GOOD, 400, ["classify", "predict"]),
    ("GET", "/v2/models/mlp", None, 404, ["Malformed request"]),
    ("POST", "/v1/models/mlp:predict", {"instances": [[0.5] * 20] * 2500}, 413, ["limit", str(MAX_BYTES)]),
]


@pytest.mark.parametrize("method, path, body, status, words", ERRORS, ids=[f"{i}-{e[3]}" for i, e in enumerate(ERRORS)])
def test_every_bad_request_is_answered_as_tensorflow_serving_answers_it(
    server, keras_models, method, path, body, status, words
):
    got, answer = server.request(method, path, body)
    assert got == status, answer
    assert isinstance(answer, dict) and set(answer) == {"error"}, answer
    for word in words:
        assert word in answer["error"], (word, answer)
    # ... and the server still answers right
    x, y = one_input(keras_models, "mlp"), one_output(keras_models, "mlp")
    got, answer = server.predict("mlp", {"instances": x[:2].tolist()})
    assert got == 200, answer
    close(answer["predictions"], y[:2])


def test_head_on_a_status_or_metadata_path_answers_gets_head_without_its_body(server):
    for path in ("/v1/models/mlp", "/v1/models/mlp/metadata", "/v1/models/mlp/versions/1"):
        conn = server.connection()
        conn.request("GET", path)
        got = conn.getresponse()
        body = got.read()
        conn.request("HEAD", path)
        head = conn.getresponse()
        assert head.status == got.status == 200, path
        assert head.getheader("Content-Length") == str(len(body)) and head.read() == b"", path
        conn.close()
    conn = server.connection()
    conn.request("HEAD", "/v1/models/mlp:predict")  # predict is POST's alone
    refused = conn.getresponse()
    assert refused.status == 405 and refused.read() == b""
    conn.close()


def test_an_oversize_body_without_a_declared_length_is_refused_while_it_arrives(server):
    conn = server.connection()
    conn.putrequest("POST", "/v1/models/mlp:predict")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    chunk = b"[" + b"0.5," * 20000
    try:
        for _ in range(4):
            conn.send(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        conn.send(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    response = conn.getresponse()
    assert response.status == 413
    assert "limit" in json.loads(response.read())["error"]
    conn.close()


def concurrently(count: int, call) -> list:
    barrier = threading.Barrier(count)

    def run(i):
        barrier.wait()
        return call(i)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(run, range(count)))


def logged(server, path: str, after: int) -> list:
    lines = [json.loads(line) for line in server.stdout[after:] if line.startswith("{")]
    return [line for line in lines if line["path"] == path]


def test_concurrent_requests_are_merged_into_one_call_each_answered_its_own_rows(server, keras_models):
    x, y = one_input(keras_models, "mlp"), one_output(keras_models, "mlp")
    seen = len(server.stdout)
    answers = concurrently(8, lambda i: server.predict("merged", {"instances": x[i : i + 1].tolist()}))
    for i, (status, answer) in enumerate(answers):
        assert status == 200, answer
        close(answer["predictions"], y[i : i + 1])
    time.sleep(0.2)
    lines = logged(server, "/v1/models/merged:predict", seen)
    assert len(lines) == 8 and all(line["status"] == 200 and line["instances"] == 1 for line in lines)
    # the first request waits up to 1 s for others: the 8 ran in fewer calls than 8, the largest holding several
    assert max(line["batch"] for line in lines) > 1, lines
    scrape = server.metrics()
    calls = metric(scrape, "malinn_serve_batch_size_count", model="merged", version="1")
    samples = metric(scrape, "malinn_serve_batch_size_sum", model="merged", version="1")
    assert samples == 8 and calls < 8, (calls, samples)


def test_without_batching_each_request_runs_in_its_own_call(server, keras_models):
    x, y = one_input(keras_models, "mlp"), one_output(keras_models, "mlp")
    seen = len(server.stdout)
    answers = concurrently(6, lambda i: server.predict("mlp_solo", {"instances": x[2 * i : 2 * i + 2].tolist()}))
    for i, (status, answer) in enumerate(answers):
        assert status == 200, answer
        close(answer["predictions"], y[2 * i : 2 * i + 2])
    time.sleep(0.2)
    lines = logged(server, "/v1/models/mlp_solo:predict", seen)
    assert len(lines) == 6 and all(line["batch"] == 2 for line in lines), lines


def test_a_full_queue_answers_503_and_the_queued_request_is_still_answered(server, keras_models):
    x, y = one_input(keras_models, "mlp"), one_output(keras_models, "mlp")
    with ThreadPoolExecutor(1) as pool:
        # 3 samples wait (up to 2 s) for a batch of 4; the queue holds 4 samples: 3 more do not fit
        first = pool.submit(server.predict, "slow_queue", {"instances": x[:3].tolist()})
        end = time.monotonic() + 10
        while metric(server.metrics(), "malinn_serve_queue_depth", model="slow_queue", version="1") < 1:
            assert time.monotonic() < end and not first.done(), first.result() if first.done() else "not queued"
            time.sleep(0.02)
        status, answer = server.predict("slow_queue", {"instances": x[3:6].tolist()})
        assert status == 503, answer
        assert "overloaded" in answer["error"] and "queue" in answer["error"]
        status, answer = first.result()
    assert status == 200, answer
    close(answer["predictions"], y[:3])
    status, answer = server.predict("slow_queue", {"instances": x[3:7].tolist()})  # a full batch goes at once
    assert status == 200, answer
    close(answer["predictions"], y[3:7])


def test_a_request_past_its_time_limit_is_answered_504(server):
    started = time.monotonic()
    status, answer = server.predict("stuck", GOOD)  # waits 10 s for a second sample; the limit is 3 s
    assert status == 504, answer
    assert "Deadline exceeded" in answer["error"] and f"{TIMEOUT} s" in answer["error"]
    assert time.monotonic() - started < TIMEOUT + 5


def test_clients_that_disconnect_mid_body_or_while_queued_are_dropped_and_counted(server, keras_models):
    before = metric(
        server.metrics(), "malinn_serve_request_errors_total", model="slow_queue", api="predict", error="CANCELLED"
    )
    # a body cut short: the declared length never arrives
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(
            b"POST /v1/models/slow_queue:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 5000\r\n\r\n{"instances": [[0.5, 0.5'
        )
        time.sleep(0.3)
    # a whole request, the client gone while it waits in the queue (up to 2 s for a batch of 4)
    body = json.dumps({"instances": [[0.25] * 20]}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(
            b"POST /v1/models/slow_queue:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        time.sleep(0.3)
    end = time.monotonic() + 10
    while (
        metric(
            server.metrics(), "malinn_serve_request_errors_total", model="slow_queue", api="predict", error="CANCELLED"
        )
        < before + 2
    ):
        assert time.monotonic() < end, server.metrics()
        time.sleep(0.05)
    x, y = one_input(keras_models, "mlp"), one_output(keras_models, "mlp")
    status, answer = server.predict("slow_queue", {"instances": x[:4].tolist()})
    assert status == 200, answer
    close(answer["predictions"], y[:4])


def test_metrics_count_requests_errors_latency_batches_and_queue(server, keras_models):
    x = one_input(keras_models, "mlp")
    before = server.metrics()
    for i in range(3):
        assert server.predict("mlp", {"instances": x[i : i + 1].tolist()})[0] == 200
    assert server.predict("mlp", {"instances": [[1.0]]})[0] == 400
    assert server.request("GET", "/v1/models/mlp")[0] == 200
    after = server.metrics()

    def grew(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert grew("malinn_serve_requests_total", model="mlp", api="predict", code="200") == 3
    assert grew("malinn_serve_requests_total", model="mlp", api="predict", code="400") == 1
    assert grew("malinn_serve_requests_total", model="mlp", api="status", code="200") == 1
    assert grew("malinn_serve_request_errors_total", model="mlp", api="predict", error="INVALID_ARGUMENT") == 1
    assert grew("malinn_serve_request_latency_seconds_count", model="mlp", api="predict") == 4
    assert grew("malinn_serve_request_latency_seconds_bucket", model="mlp", api="predict", le="+Inf") == 4
    assert grew("malinn_serve_batch_size_count", model="mlp", version="1") == 3
    assert grew("malinn_serve_batch_size_sum", model="mlp", version="1") == 3
    assert grew("malinn_serve_queue_latency_seconds_count", model="mlp") == 3
    # each request ran in its own call: its hand-over to the model holds its queue and its call
    assert grew("malinn_serve_run_latency_seconds_count", model="mlp") == 3
    assert grew("malinn_serve_compute_latency_seconds_count", model="mlp", version="1") == 3
    compute = grew("malinn_serve_compute_latency_seconds_sum", model="mlp", version="1")
    queued = grew("malinn_serve_queue_latency_seconds_sum", model="mlp")
    ran = grew("malinn_serve_run_latency_seconds_sum", model="mlp")
    assert 0 < compute and 0 <= queued and compute + queued <= ran
    assert ran <= grew("malinn_serve_request_latency_seconds_sum", model="mlp", api="predict")
    assert "# TYPE malinn_serve_queue_depth gauge" in after
    assert metric(after, "malinn_serve_queue_depth", model="mlp", version="1") == 0
    assert metric(after, "malinn_serve_model_versions", model="mlp", state="AVAILABLE") == 1
    assert "malinn_serve_in_flight 0" in after.splitlines()  # no model request is under way


def test_one_json_log_line_per_request(server, keras_models):
    x = one_input(keras_models, "mlp")
    seen = len(server.stdout)
    assert server.predict("mlp", {"instances": x[:3].tolist()})[0] == 200
    assert server.request("GET", "/v1/models/nope")[0] == 404
    time.sleep(0.2)
    lines = [json.loads(line) for line in server.stdout[seen:]]
    assert [(line["method"], line["path"], line["status"]) for line in lines] == [
        ("POST", "/v1/models/mlp:predict", 200),
        ("GET", "/v1/models/nope", 404),
    ]
    assert lines[0]["model"] == "mlp" and lines[0]["version"] == 1 and lines[0]["instances"] == 3
    assert lines[0]["latency_ms"] > 0 and lines[0]["bytes_in"] > 0
    assert lines[0]["queue_ms"] <= lines[0]["run_ms"] <= lines[0]["latency_ms"]
    assert lines[1]["error_code"] == "NOT_FOUND" and "model" not in lines[1]


def test_a_bounded_load_is_answered_right_without_a_failure(server, keras_models):
    x, y = one_input(keras_models, "mlp"), one_output(keras_models, "mlp")
    end = time.monotonic() + 3
    failures, answered = [], [0] * 16

    def client(i):
        conn = server.connection()
        rng = np.random.default_rng(i)
        while time.monotonic() < end:
            k = int(rng.integers(0, len(x) - 2))
            status, answer = server.predict("mlp", {"instances": x[k : k + 2].tolist()}, connection=conn)
            if status != 200:
                failures.append(answer)
                continue
            try:
                close(answer["predictions"], y[k : k + 2])
            except AssertionError as exc:
                failures.append(str(exc))
            answered[i] += 1
        conn.close()

    concurrently(16, client)
    assert not failures, failures[:3]
    assert sum(answered) > 16
