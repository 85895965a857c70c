"""malinn serve's parse workers: request bodies parsed in worker processes give the answers, errors
included, that the server's own parse gives; the workers never load OpenCL; a worker that dies is
answered 503 and replaced, the server serving on; SIGTERM stops them with the server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from serving import ServerProcess, close, metric
from test_serve_api import ERRORS
from test_serve_operations import run_command

from malinn.serve.config import (
    ENCODE_WORKER_MIN_VALUES,
    ENCODE_WORKER_MIN_VALUES_ORJSON,
    BatchingParameters,
    ConfigError,
    default_parse_workers,
    read_config_file,
)
from malinn.serve.payload import writes_fast

MODELS = ("mlp", "cnn", "two_io")
WIDE = 600
assert WIDE >= ENCODE_WORKER_MIN_VALUES
#: the answers the server writes in a worker: orjson (the serve extra's) writes them several times faster
ENCODES_FROM = ENCODE_WORKER_MIN_VALUES_ORJSON if writes_fast() else ENCODE_WORKER_MIN_VALUES


def wide_model(folder: Path) -> Path:
    """A model of 600 outputs: its answers are written in a worker (ENCODE_WORKER_MIN_VALUES)."""
    import malinn
    from malinn.layers import Dense

    model = malinn.Sequential([Dense(WIDE, activation="tanh")], name="wide")
    model.build((None, 20))
    rng = np.random.default_rng(0)
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in model.get_weights()])
    model.save(folder / "wide.malinn", overwrite=True)
    return folder / "wide.malinn"


def start(keras_models, folder: Path, *args: str, file_workers: int = 3) -> ServerProcess:
    """The models (and the wide one) served with ``parse_workers`` of ``file_workers`` in the
    config file, and ``args``."""
    config = folder / "models.json"
    entries = [{"name": key, "base_path": str(keras_models.path(key))} for key in MODELS]
    config.write_text(
        json.dumps(
            {
                "model_config_list": entries + [{"name": "wide", "base_path": str(wide_model(folder))}],
                "batching_parameters": {"max_batch_size": 8},
                "parse_workers": file_workers,
            }
        )
    )
    return ServerProcess("--model-config-file", str(config), "--max-request-bytes", "2000000", *args)


@pytest.fixture(scope="module")
def servers(keras_models, tmp_path_factory):
    """The same models served twice: every body parsed in the server's process, and every body
    parsed in one of 2 workers (the flag over the config file's 3)."""
    in_process = start(keras_models, tmp_path_factory.mktemp("in_process"), "--parse-workers", "0")
    workers = start(
        keras_models,
        tmp_path_factory.mktemp("workers"),
        "--parse-workers",
        "2",
        "--parse-worker-min-bytes",
        "0",
    )
    try:
        yield in_process.wait_ready(), workers.wait_ready()
    finally:
        statuses = in_process.stop(), workers.stop()
    assert statuses == (0, 0), "\n".join(in_process.stderr + workers.stderr)


def children(pid: int) -> dict:
    """The processes whose parent is ``pid``: {pid: command line}."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found[int(entry)] = cmdline
    return found


def parse_workers(server: ServerProcess, count: int, timeout: float = 60) -> set:
    """The server's parse worker processes, once there are ``count`` of them."""
    end = time.monotonic() + timeout
    while True:
        pids = {pid for pid, cmd in children(server.proc.pid).items() if "spawn_main" in cmd}
        if len(pids) == count or time.monotonic() > end:
            return pids
        time.sleep(0.05)


def mapped(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def bodies(keras_models) -> list:
    """(path, body): right requests of every form, and every malformed predict of the API's tests."""
    x = {key: keras_models.x(key) for key in MODELS}
    rows = np.random.default_rng(2).standard_normal((5, 20)).round(3)
    mlp, cnn, two = next(iter(x["mlp"].values())), next(iter(x["cnn"].values())), x["two_io"]
    big = np.concatenate([cnn] * (1 + 200 // len(cnn)))[:200]  # about 1 MB of JSON
    right = [
        ("/v1/models/mlp:predict", {"instances": mlp[:3].tolist()}),
        ("/v1/models/mlp:predict", {"inputs": mlp[:2].tolist(), "signature_name": "serving_default"}),
        ("/v1/models/cnn:predict", {"instances": [{"pixels": s.tolist()} for s in cnn[:2]]}),
        ("/v1/models/cnn:predict", {"instances": big.tolist()}),
        (
            "/v1/models/two_io:predict",
            {
                "instances": [
                    {"image": two["image"][i].tolist(), "meta": two["meta"][i].astype(int).tolist()} for i in range(3)
                ]
            },
        ),
        (
            "/v1/models/two_io:predict",
            {"inputs": {"meta": two["meta"][:4].astype(int).tolist(), "image": two["image"][:4].tolist()}},
        ),
        ("/v1/models/mlp:predict", b'{"instances": [[NaN, Infinity, -Infinity' + b", 0.5" * 17 + b"]]}"),
        ("/v1/models/wide:predict", {"instances": rows[:1].tolist()}),  # answers written in a worker
        ("/v1/models/wide:predict", {"inputs": rows.tolist()}),
        ("/v1/models/wide:predict", {"instances": np.concatenate([rows] * 2).tolist()}),  # 6,000 numbers
        ("/v1/models/wide:predict", {"inputs": np.concatenate([rows] * 3).tolist()}),
    ]
    wrong = [
        (path, body)
        for method, path, body, status, _ in ERRORS
        if method == "POST" and status == 400 and path.split("/")[3].split(":")[0] in MODELS
    ]
    return right + wrong + [("/v1/models/mlp:predict", b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")]


def alike(got, want) -> None:
    """Two answers of the same keys and nesting, their numbers equal (NaN equal to NaN)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (got, want)
        for key in want:
            alike(got[key], want[key])
    elif isinstance(want, list) and want and isinstance(want[0], dict):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want):
            alike(g, w)
    else:
        close(got, want)


def numbers(document) -> int:
    """How many numbers a JSON answer holds."""
    if isinstance(document, dict):
        return sum(numbers(v) for v in document.values())
    if isinstance(document, list):
        return sum(numbers(v) for v in document)
    return 1


def test_a_body_parsed_in_a_worker_is_answered_as_one_parsed_in_the_server(servers, keras_models):
    in_process, workers = servers
    before = metric(workers.metrics(), "malinn_serve_worker_parses_total")
    encoded = metric(workers.metrics(), "malinn_serve_worker_encodes_total")
    cases = bodies(keras_models)
    statuses, wide_answers = set(), 0
    for path, body in cases:
        want, got = in_process.request("POST", path, body), workers.request("POST", path, body)
        assert got[0] == want[0], (path, str(body)[:200], want, got)
        statuses.add(got[0])
        if got[0] == 200:
            alike(got[1], want[1])
            wide_answers += numbers(want[1]) >= ENCODES_FROM
        else:
            assert got == want, (path, str(body)[:200])  # TensorFlow Serving's {"error": ...}, word for word
    assert statuses == {200, 400}
    # every body the model's path takes to its parse went to a worker there, none here
    parsed = sum(path in {f"/v1/models/{key}:predict" for key in MODELS + ("wide",)} for path, _ in cases)
    assert parsed > 25
    assert metric(workers.metrics(), "malinn_serve_worker_parses_total") - before == parsed
    assert wide_answers >= 2
    assert metric(workers.metrics(), "malinn_serve_worker_encodes_total") - encoded == wide_answers
    assert metric(in_process.metrics(), "malinn_serve_worker_parses_total") == 0
    assert metric(in_process.metrics(), "malinn_serve_worker_encodes_total") == 0


def test_the_workers_load_no_opencl_and_ignore_the_servers_signals(servers):
    in_process, workers = servers
    pids = parse_workers(workers, 2)
    assert len(pids) == 2, children(workers.proc.pid)
    assert "pyopencl" in mapped(workers.proc.pid)  # the server's own process runs the device
    for pid in pids:
        text = mapped(pid)
        assert "numpy" in text
        for word in ("pyopencl", "libOpenCL", "pocl", "libcuda"):
            assert word not in text, (pid, word)
        os.kill(pid, signal.SIGTERM)  # a service manager signals the whole group: the server stops them
        os.kill(pid, signal.SIGINT)
    time.sleep(0.5)
    assert parse_workers(workers, 2) == pids
    # the module a worker imports first starts no thread (numpy's BLAS would, taking SIGTERM unblocked)
    code = (
        "import sys, malinn.serve.worker_process; print(sorted(m for m in sys.modules if m.split('.')[0] == 'numpy'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
    assert not parse_workers(in_process, 0)  # --parse-workers 0 over the config file's 3


def test_a_worker_that_dies_is_answered_503_and_replaced_and_sigterm_stops_the_rest(keras_models, tmp_path):
    x, y = next(iter(keras_models.x("cnn").values())), next(iter(keras_models.y("cnn").values()))
    server = start(keras_models, tmp_path, "--parse-worker-min-bytes", "0", file_workers=2).wait_ready()
    try:
        first = parse_workers(server, 2)  # the config file's count
        assert len(first) == 2 and any("2 parse workers" in line for line in server.stderr), server.stderr
        status, answer = server.predict("cnn", {"instances": x[:2].tolist()})
        assert status == 200, answer
        close(answer["predictions"], y[:2])
        # a worker dies while it holds a request: both stopped, the request sent, one killed
        for pid in first:
            os.kill(pid, signal.SIGSTOP)
        held = []
        thread = threading.Thread(target=lambda: held.append(server.predict("cnn", {"instances": x[:3].tolist()})))
        thread.start()
        end = time.monotonic() + 30
        while metric(server.metrics(), "malinn_serve_in_flight") < 1:
            assert time.monotonic() < end
            time.sleep(0.02)
        time.sleep(1.0)  # the body read and sent to the stopped workers
        killed, other = sorted(first)
        os.kill(killed, signal.SIGKILL)
        thread.join(60)  # answered while the other worker is still stopped: it could not have parsed it
        os.kill(other, signal.SIGCONT)
        ((status, answer),) = held
        assert status == 503, answer
        assert set(answer) == {"error"} and "parse worker exited" in answer["error"], answer
        # the server goes on serving with a new pair of workers
        for i in range(4):
            status, answer = server.predict("cnn", {"instances": x[i : i + 2].tolist()})
            assert status == 200, answer
            close(answer["predictions"], y[i : i + 2])
        second = parse_workers(server, 2)
        assert len(second) == 2 and not second & first, (first, second)
        assert metric(server.metrics(), "malinn_serve_parse_worker_restarts_total") == 1
        # one killed while idle: the next request goes to a new pool, answered right
        os.kill(sorted(second)[0], signal.SIGKILL)
        time.sleep(0.5)
        status, answer = server.predict("cnn", {"instances": x[:2].tolist()})
        assert status == 200, answer
        close(answer["predictions"], y[:2])
        third = parse_workers(server, 2)
        assert len(third) == 2 and not third & second
        assert metric(server.metrics(), "malinn_serve_parse_worker_restarts_total") == 2
    finally:
        status = server.stop(signal.SIGTERM)
    assert status == 0, "\n".join(server.stderr)
    time.sleep(0.2)
    assert not any(Path(f"/proc/{pid}").exists() for pid in first | second | third)


def test_parse_workers_in_the_config_file_and_in_the_commands_help(tmp_path):
    (tmp_path / "m").mkdir()
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"model_config_list": [{"name": "m", "base_path": "m"}], "parse_workers": 3}))
    assert read_config_file(path, BatchingParameters()).parse_workers == 3
    path.write_text(json.dumps({"model_config_list": [{"name": "m", "base_path": "m"}]}))
    assert read_config_file(path, BatchingParameters()).parse_workers is None
    for bad in (-1, "4", 1.5, True):
        path.write_text(json.dumps({"model_config_list": [{"name": "m", "base_path": "m"}], "parse_workers": bad}))
        with pytest.raises(ConfigError) as raised:
            read_config_file(path, BatchingParameters())
        assert "parse_workers" in str(raised.value) and str(path) in str(raised.value)
    done = run_command("serve", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert f"at most 8: {default_parse_workers()} here" in text and "--parse-worker-min-bytes" in text
    assert default_parse_workers() == min(8, len(os.sched_getaffinity(0)) // 2)
