"""malinn serve's operations against real server processes: SIGTERM under load, a new version switched
to under load, a failed first load, the command without the serve extra, bad command lines and
config files."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from serving import ServerProcess, close, metric

from malinn.serve.config import BatchingParameters, ConfigError, read_config_file


class Load:
    """``clients`` threads sending predicts of 2 samples of ``x`` to ``model`` until stopped (or,
    with ``until_refused``, until the server refuses a connection); each answer kept with the time
    it was sent."""

    def __init__(self, server, model: str, x: np.ndarray, clients: int = 8):
        self.server, self.model, self.x = server, model, x
        self.answers: list = []  # (sent at, first sample, status, answer)
        self.refused: list = []  # (sent at, exception)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]
        for t in self.threads:
            t.start()

    def _client(self, i: int) -> None:
        rng = np.random.default_rng(i)
        while not self.stop.is_set():
            k = int(rng.integers(0, len(self.x) - 2))
            sent = time.monotonic()
            try:  # a connection per request: one the server refuses was never accepted
                status, answer = self.server.predict(self.model, {"instances": self.x[k : k + 2].tolist()})
            except (OSError, http.client.HTTPException) as exc:
                self.refused.append((sent, exc))
                if isinstance(exc, ConnectionRefusedError):
                    return
                time.sleep(0.01)
                continue
            self.answers.append((sent, k, status, answer))

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


def test_sigterm_under_load_answers_every_request_in_flight_and_exits_0(keras_models, tmp_path):
    x, y = next(iter(keras_models.x("mlp").values())), next(iter(keras_models.y("mlp").values()))
    config = tmp_path / "models.json"
    config.write_text(
        json.dumps(
            {
                "model_config_list": [
                    {"name": "mlp", "base_path": str(keras_models.path("mlp"))},
                    {
                        "name": "held",
                        "base_path": str(keras_models.path("mlp")),
                        "batching_parameters": {"max_batch_size": 64, "batch_timeout_micros": 1_500_000},
                    },
                ],
                "batching_parameters": {"max_batch_size": 8},
            }
        )
    )
    server = ServerProcess("--model-config-file", str(config)).wait_ready()
    load = Load(server, "mlp", x)
    held = []  # requests that wait 1.5 s in the queue of "held": in flight when SIGTERM comes
    pool = [
        threading.Thread(
            target=lambda i=i: held.append((i, server.predict("held", {"instances": x[i : i + 1].tolist()})))
        )
        for i in range(6)
    ]
    try:
        time.sleep(1.0)
        for t in pool:
            t.start()
        end = time.monotonic() + 10
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
    assert any("SIGTERM: stopping" in line for line in server.stderr)
    # every request the server took was answered right: the queued ones and the load's
    assert sorted(i for i, _ in held) == list(range(6))
    for i, (code, answer) in held:
        assert code == 200, answer
        close(answer["predictions"], y[i : i + 1])
    assert len(load.answers) > 8
    for sent, k, code, answer in load.answers:
        assert code == 200, answer
        close(answer["predictions"], y[k : k + 2])
    # refusals only once the server was told to stop, and then no connection is accepted
    assert all(sent >= signalled - 0.05 for sent, _ in load.refused), load.refused[:3]
    with pytest.raises(ConnectionRefusedError):
        server.request("GET", "/healthz")


@pytest.mark.parametrize("http_workers", [1, 2])
def test_a_new_version_is_loaded_beside_the_old_and_switched_to_under_load(keras_models, tmp_path, http_workers):
    x = next(iter(keras_models.x("mlp").values()))
    y1, y2 = next(iter(keras_models.y("mlp").values())), next(iter(keras_models.y("mlp_v2").values()))
    base = tmp_path / "mlp"
    (base / "1").mkdir(parents=True)
    shutil.copy(keras_models.path("mlp"), base / "1" / "model.keras")
    server = ServerProcess(
        f"digits={base}", "--poll-seconds", "0.2", "--max-batch-size", "8", "--http-workers", str(http_workers)
    ).wait_ready()
    load = Load(server, "digits", x)
    try:
        time.sleep(0.8)
        staging = tmp_path / "staging"
        staging.mkdir()
        shutil.copy(keras_models.path("mlp_v2"), staging / "model.keras")
        os.rename(staging, base / "2")  # a version folder appears whole, as TensorFlow Serving asks
        switched = None
        end = time.monotonic() + 120
        while time.monotonic() < end:
            status, answer = server.request("GET", "/v1/models/digits")
            states = {s["version"]: s["state"] for s in answer["model_version_status"]}
            if states.get("2") == "AVAILABLE" and switched is None:
                switched = time.monotonic()
            if states == {"2": "AVAILABLE", "1": "END"}:
                break
            time.sleep(0.05)
        assert states == {"2": "AVAILABLE", "1": "END"}, (states, server.stderr)
        time.sleep(0.8)
    finally:
        load.join()
    assert not load.refused, load.refused[:3]
    old = new = 0
    for sent, k, code, answer in load.answers:
        assert code == 200, answer
        got = np.asarray(answer["predictions"], np.float32)
        if np.allclose(got, y2[k : k + 2], rtol=1e-5, atol=1e-6):
            new += 1
        else:
            close(got, y1[k : k + 2])  # the old version's answer, never anything else
            old += 1
            assert sent < switched + 1.0, "a request sent after the switch was answered by the old version"
    assert old > 0 and new > 0, (old, new)
    status, answer = server.request("GET", "/v1/models/digits/versions/1")
    assert status == 200 and answer["model_version_status"][0]["state"] == "END", answer
    status, answer = server.predict("digits", {"instances": x[:2].tolist()}, version=1)
    assert status == 404 and "Specific(digits, 1)" in answer["error"], answer
    status, answer = server.predict("digits", {"instances": x[:2].tolist()}, version=2)
    assert status == 200
    close(answer["predictions"], y2[:2])
    assert server.stop() == 0, "\n".join(server.stderr)


def test_a_version_label_naming_a_version_not_served_stops_the_server_with_status_1(keras_models, tmp_path):
    """As TensorFlow Serving, which refuses to assign a label to a version that is not available."""
    base = tmp_path / "digits"
    (base / "2").mkdir(parents=True)
    shutil.copy(keras_models.path("mlp"), base / "2" / "model.keras")
    config = tmp_path / "models.json"
    entry = {"name": "digits", "base_path": str(base), "version_labels": {"stable": 2, "canary": 3}}
    config.write_text(json.dumps({"model_config_list": [entry]}))
    server = ServerProcess("--model-config-file", str(config))
    assert server.proc.wait(120) == 1
    time.sleep(0.2)
    text = "\n".join(server.stderr)
    assert "model 'digits': version label 'canary' names version 3, which is not available (available: 2)" in text
    assert "'stable'" not in text and "cannot be served as configured" in text and "Traceback" not in text, text


def test_a_model_that_fails_its_first_load_stops_the_server_with_status_1(tmp_path):
    broken = tmp_path / "broken.keras"
    broken.write_bytes(b"PK\x03\x04 not really a zip")
    server = ServerProcess(str(broken))
    assert server.proc.wait(120) == 1
    time.sleep(0.2)
    text = "\n".join(server.stderr)
    assert "model 'broken' version 1" in text and "failed to load" in text and "broken.keras" in text, text
    assert "Traceback" not in text


def run_command(*args, prelude: str = "") -> subprocess.CompletedProcess:
    from support import python_env

    code = f"import sys\n{prelude}\nfrom malinn.cli.commands import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, env=python_env()
    )


def test_without_the_serve_extra_the_command_says_how_to_install_it(keras_models):
    done = run_command("serve", str(keras_models.path("mlp")), prelude="sys.modules['uvicorn'] = None")
    assert done.returncode == 1, done.stderr
    assert "pip install 'malinn[serve]'" in done.stderr and "uvicorn" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "args, status, words",
    [
        (["serve"], 1, ["give a MODEL or --model-config-file"]),
        (["serve", "/no/such/model.keras"], 1, ["/no/such/model.keras", "no such file"]),
        (["serve", "--port", "70000", "m.keras"], 2, ["--port", "70000"]),
        (["serve", "--max-batch-size", "0", "m.keras"], 2, ["--max-batch-size"]),
        (["serve", "--parse-workers", "-1", "m.keras"], 2, ["--parse-workers", "-1"]),
        (
            ["serve", "--allowed-batch-sizes", "1,2,4", "--max-batch-size", "8", "m.keras"],
            1,
            ["the last of --allowed-batch-sizes (4) must equal --max-batch-size (8)"],
        ),
        (["serve", "--model-config-file", "/no/such.json"], 1, ["/no/such.json"]),
    ],
)
def test_bad_command_lines_are_refused_in_one_line(args, status, words):
    done = run_command(*args)
    assert done.returncode == status, done.stderr
    assert done.stderr.startswith("malinn: error: ") and done.stderr.count("\n") == 1, done.stderr
    for word in words:
        assert word in done.stderr, (word, done.stderr)


@pytest.mark.parametrize(
    "document, words",
    [
        ("{", ["not JSON"]),
        ([], ["expected an object"]),
        ({"models": []}, ["unknown key", "models"]),
        ({"model_config_list": []}, ["non-empty list"]),
        ({"model_config_list": [{"name": "a/b", "base_path": "."}]}, ["model name", "'a/b'"]),
        ({"model_config_list": [{"name": "a", "base_path": "missing"}]}, ["base_path", "does not exist"]),
        ({"model_config_list": [{"name": "a", "base_path": "."}, {"name": "a", "base_path": "."}]}, ["distinct"]),
        (
            {"model_config_list": [{"name": "a", "base_path": ".", "model_version_policy": {"newest": {}}}]},
            ["model_version_policy"],
        ),
        (
            {"model_config_list": [{"name": "a", "base_path": ".", "batching_parameters": {"max_batch_size": 0}}]},
            ["'a'", "max_batch_size", "positive"],
        ),
        (
            {"model_config_list": [{"name": "a", "base_path": "."}], "batching_parameters": {"batch_size": 4}},
            ["unknown batching parameter", "batch_size"],
        ),
    ],
)
def test_a_bad_config_file_is_refused_naming_the_entry(tmp_path, document, words):
    path = tmp_path / "models.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    with pytest.raises(ConfigError) as raised:
        read_config_file(path, BatchingParameters())
    for word in words + [str(path)]:
        assert word in str(raised.value), (word, str(raised.value))


def test_a_config_file_reads_tensorflow_servings_forms(tmp_path):
    (tmp_path / "m" / "3").mkdir(parents=True)
    path = tmp_path / "models.json"
    path.write_text(
        json.dumps(
            {
                "model_config_list": {
                    "config": [
                        {
                            "name": "m",
                            "base_path": "m",
                            "model_platform": "tensorflow",
                            "model_version_policy": {"specific": {"versions": [3, 1]}},
                            "version_labels": {"stable": 3},
                        }
                    ]
                },
                "batching_parameters": {
                    "max_batch_size": {"value": 16},
                    "batch_timeout_micros": {"value": 500},
                    "allowed_batch_sizes": [4, 16],
                },
            }
        )
    )
    (model,), batching, parse_workers = read_config_file(path, BatchingParameters())
    assert model.name == "m" and model.base_path == tmp_path / "m" and model.policy == ("specific", (1, 3))
    assert model.labels == {"stable": 3} and parse_workers is None
    assert (
        batching
        == model.batching
        == BatchingParameters(max_batch_size=16, batch_timeout_micros=500, allowed_batch_sizes=(4, 16))
    )
    assert batching.sizes() == (4, 16) and BatchingParameters(max_batch_size=20).sizes() == (1, 2, 4, 8, 16, 20)
