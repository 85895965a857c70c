"""malinn serve --http-workers 2: two HTTP front processes on one port, the models in the process that
owns the device. Its answers are the one-process server's, errors word for word; concurrent clients
are answered right and counted once in the merged metrics; a killed front is started again; SIGTERM
answers every request in flight and exits 0; a killed model process ends the fronts."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import threading
import time

import pytest
from serving import ServerProcess, close, metric
from test_serve_api import ERRORS
from test_serve_operations import Load, run_command

MODELS = ("mlp", "cnn", "two_io")


def config_file(keras_models, folder) -> str:
    entries = [{"name": key, "base_path": str(keras_models.path(key))} for key in MODELS]
    entries.append(
        {
            "name": "held",  # its requests wait 1.5 s for a batch: in flight when a signal comes
            "base_path": str(keras_models.path("mlp")),
            "batching_parameters": {"max_batch_size": 64, "batch_timeout_micros": 1_500_000},
        }
    )
    path = folder / "models.json"
    path.write_text(json.dumps({"model_config_list": entries, "batching_parameters": {"max_batch_size": 8}}))
    return str(path)


def front_pids(server: ServerProcess) -> dict:
    """``{front index: pid}`` of the fronts listening now, from the server's stderr."""
    found = {}
    for line in list(server.stderr):
        match = re.search(r"HTTP worker (\d+) listening \(pid (\d+)\)", line)
        if match:
            found[int(match[1])] = int(match[2])
    return found


def wait_fronts(server: ServerProcess, count: int, seconds: float = 30.0) -> dict:
    """:func:`front_pids` once ``count`` fronts have said they listen: a front writes its line to
    the shared stderr itself, so it may reach the reader after the model process's ``ready``."""
    end = time.monotonic() + seconds
    while len(found := front_pids(server)) < count:
        assert time.monotonic() < end, "\n".join(server.stderr)
        time.sleep(0.02)
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def servers(keras_models, tmp_path_factory):
    """The same models served by one process and by two HTTP fronts."""
    config = config_file(keras_models, tmp_path_factory.mktemp("http_workers"))
    single = ServerProcess("--model-config-file", config, "--http-workers", "1", "--parse-workers", "0")
    fronts = ServerProcess("--model-config-file", config, "--http-workers", "2")
    try:
        yield single.wait_ready(), fronts.wait_ready()
    finally:
        statuses = single.stop(), fronts.stop()
    assert statuses == (0, 0), "\n".join(single.stderr + fronts.stderr)


def test_two_fronts_answer_as_one_process_does_outputs_and_errors(servers, keras_models):
    single, fronts = servers
    assert len(wait_fronts(fronts, 2)) == 2 and not front_pids(single)
    for key in ("mlp", "cnn"):
        x, y = next(iter(keras_models.x(key).values())), next(iter(keras_models.y(key).values()))
        for document, answer_key, rows in (
            ({"instances": x.tolist()}, "predictions", slice(None)),
            ({"signature_name": "serving_default", "inputs": x[:5].tolist()}, "outputs", slice(0, 5)),
            ({"instances": [{"any": x[3].tolist()}]}, "predictions", slice(3, 4)),
        ):
            status, answer = fronts.predict(key, document)
            assert status == 200, answer
            close(answer[answer_key], y[rows])
            assert answer == single.predict(key, document)[1]  # the same float32 values, written alike
    x, y = keras_models.x("two_io"), keras_models.y("two_io")
    rows = [{"image": x["image"][i].tolist(), "meta": x["meta"][i].astype(int).tolist()} for i in range(4)]
    status, answer = fronts.predict("two_io", {"instances": rows})
    assert status == 200, answer
    close([p["score"] for p in answer["predictions"]], y["score"][:4])
    # every refusal of the API's tests, word for word, and the status and metadata answers
    for method, path, body, status, words in ERRORS:
        got, want = fronts.request(method, path, body), single.request(method, path, body)
        assert got == want, (method, path, str(body)[:100])
        if status != 413:  # the API's tests serve with a smaller --max-request-bytes
            assert got[0] == status and all(w in json.dumps(got[1]) for w in words), got
    for path in ("/v1/models/mlp", "/v1/models/cnn/versions/1", "/v1/models/two_io/metadata", "/readyz", "/healthz"):
        assert fronts.request("GET", path) == single.request("GET", path), path


def test_32_concurrent_clients_are_answered_right_and_counted_once(servers, keras_models):
    _, fronts = servers
    x, y = next(iter(keras_models.x("mlp").values())), next(iter(keras_models.y("mlp").values()))
    before = fronts.metrics()
    answers, failures = [], []

    def client(i: int) -> None:
        conn = fronts.connection()  # one keep-alive connection: it stays on one front
        try:
            for j in range(5):
                k = (i * 5 + j) % (len(x) - 1)
                status, answer = fronts.predict("mlp", {"instances": x[k : k + 2].tolist()}, connection=conn)
                answers.append((k, status, answer))
        except (OSError, http.client.HTTPException) as exc:
            failures.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures[:3]
    assert len(answers) == 160
    for k, status, answer in answers:
        assert status == 200, answer
        close(answer["predictions"], y[k : k + 2])
    after = fronts.metrics()
    # counted once across both fronts, and the batches counted in the model process
    ok = {"model": "mlp", "api": "predict", "code": "200"}
    assert (
        metric(after, "malinn_serve_requests_total", **ok) - metric(before, "malinn_serve_requests_total", **ok) == 160
    )
    sums = [metric(t, "malinn_serve_batch_size_sum", model="mlp", version="1") for t in (before, after)]
    assert sums[1] - sums[0] == 320
    # the fronts time each request's round trip to the model process, which times its calls
    runs = [metric(t, "malinn_serve_run_latency_seconds_count", model="mlp") for t in (before, after)]
    assert runs[1] - runs[0] == 160
    calls = [metric(t, "malinn_serve_batch_size_count", model="mlp", version="1") for t in (before, after)]
    computed = [
        metric(t, "malinn_serve_compute_latency_seconds_count", model="mlp", version="1") for t in (before, after)
    ]
    assert computed[1] - computed[0] == calls[1] - calls[0] > 0
    assert "malinn_serve_in_flight 0" in after.splitlines()  # every request answered, in each front
    assert metric(after, "malinn_serve_model_versions", model="mlp", state="AVAILABLE") == 1


def test_a_killed_front_is_started_again_and_the_server_serves_on(servers, keras_models):
    _, fronts = servers
    x, y = next(iter(keras_models.x("mlp").values())), next(iter(keras_models.y("mlp").values()))
    restarts = metric(fronts.metrics(), "malinn_serve_front_restarts_total")
    victim = wait_fronts(fronts, 2)[0]
    os.kill(victim, signal.SIGKILL)
    end = time.monotonic() + 60
    while front_pids(fronts)[0] == victim:
        # meanwhile every new connection is taken by the other front
        status, answer = fronts.predict("mlp", {"instances": x[:2].tolist()})
        assert status == 200, answer
        close(answer["predictions"], y[:2])
        assert time.monotonic() < end, "\n".join(fronts.stderr)
        time.sleep(0.05)
    pids = front_pids(fronts)
    assert victim not in pids.values() and all(alive(p) for p in pids.values())
    assert any(f"(pid {victim}) exited" in line for line in fronts.stderr)
    for _ in range(8):  # both fronts answer
        status, answer = fronts.predict("mlp", {"instances": x[4:6].tolist()})
        assert status == 200, answer
        close(answer["predictions"], y[4:6])
    assert metric(fronts.metrics(), "malinn_serve_front_restarts_total") == restarts + 1


def test_sigterm_answers_every_request_in_flight_in_every_front_and_exits_0(keras_models, tmp_path):
    x, y = next(iter(keras_models.x("mlp").values())), next(iter(keras_models.y("mlp").values()))
    server = ServerProcess("--model-config-file", config_file(keras_models, tmp_path), "--http-workers", "2")
    server.wait_ready()
    fronts = list(wait_fronts(server, 2).values())
    load = Load(server, "mlp", x)
    held = []

    def hold(i: int) -> None:
        held.append((i, server.predict("held", {"instances": x[i : i + 1].tolist()})))

    pool = [threading.Thread(target=hold, args=(i,)) for i in range(6)]
    try:
        time.sleep(1.0)
        for t in pool:
            t.start()
        end = time.monotonic() + 20
        while metric(server.metrics(), "malinn_serve_queue_depth", model="held", version="1") < 6:
            assert time.monotonic() < end, server.metrics()
            time.sleep(0.02)
        signalled = time.monotonic()
        status = server.stop(signal.SIGTERM)
    finally:
        load.join()
        for t in pool:
            t.join(30)
        if server.proc.poll() is None:
            server.proc.kill()
    assert status == 0, "\n".join(server.stderr)
    assert sorted(i for i, _ in held) == list(range(6))
    for i, (code, answer) in held:
        assert code == 200, answer
        close(answer["predictions"], y[i : i + 1])
    assert len(load.answers) > 8
    for sent, k, code, answer in load.answers:
        assert code == 200, answer
        close(answer["predictions"], y[k : k + 2])
    assert all(sent >= signalled - 0.05 for sent, _ in load.refused), load.refused[:3]
    assert not any(alive(pid) for pid in fronts)
    with pytest.raises(ConnectionRefusedError):
        server.request("GET", "/healthz")


def test_a_killed_model_process_ends_the_fronts_answering_503(keras_models, tmp_path):
    x = next(iter(keras_models.x("mlp").values()))
    server = ServerProcess("--model-config-file", config_file(keras_models, tmp_path), "--http-workers", "2")
    server.wait_ready()
    fronts = list(wait_fronts(server, 2).values())
    held = []
    pool = [
        threading.Thread(target=lambda i=i: held.append(server.predict("held", {"instances": x[i : i + 1].tolist()})))
        for i in range(4)
    ]
    for t in pool:
        t.start()
    end = time.monotonic() + 20
    while metric(server.metrics(), "malinn_serve_queue_depth", model="held", version="1") < 4:
        assert time.monotonic() < end
        time.sleep(0.02)
    server.proc.kill()
    assert server.proc.wait(30) == -signal.SIGKILL
    for t in pool:
        t.join(30)
    # the requests the fronts held are answered 503, and the fronts end
    assert [status for status, _ in held] == [503] * 4, held
    assert all("the process running the models exited" in answer["error"] for _, answer in held)
    end = time.monotonic() + 30
    while any(alive(pid) for pid in fronts):
        assert time.monotonic() < end, "a front outlived its model process"
        time.sleep(0.05)


def test_http_workers_in_the_commands_help_and_refused_below_1():
    done = run_command("serve", "--help")
    assert "--http-workers" in done.stdout and "front processes" in done.stdout
    done = run_command("serve", "--http-workers", "0", "m.keras")
    assert done.returncode == 2 and "--http-workers" in done.stderr, done.stderr
