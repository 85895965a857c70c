"""A ``malinn serve`` process for the tests, a plain HTTP client (the standard library's), and the
Keras models they serve (built once per run by tests/serve/keras_models.py in a process of its own:
TensorFlow never enters the test process)."""

from __future__ import annotations

import fcntl
import http.client
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support import python_env  # noqa: E402


class ServerProcess:
    """``python3 -m malinn serve --host 127.0.0.1 --port 0 ARGS``: its port read from its stderr,
    its stdout and stderr lines kept as they come."""

    def __init__(self, *args: str, cwd=None):
        env = python_env(MALINN_BINARY_CACHE="1", PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "malinn", "serve", "--host", "127.0.0.1", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
        )
        self.stdout: list = []
        self.stderr: list = []
        self.port = None
        self._port_found = threading.Event()
        for stream, lines in ((self.proc.stdout, self.stdout), (self.proc.stderr, self.stderr)):
            threading.Thread(target=self._drain, args=(stream, lines), daemon=True).start()

    def _drain(self, stream, lines: list) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))
            found = re.search(r"REST API at http://127\.0\.0\.1:(\d+)", line)
            if found:
                self.port = int(found[1])
                self._port_found.set()
        self._port_found.set()

    def wait_ready(self, timeout: float = 300) -> "ServerProcess":
        """Waits for /readyz to answer 200; fails with the server's stderr if it exits first."""
        end = time.monotonic() + timeout
        self._port_found.wait(timeout)
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"malinn serve exited with {self.proc.returncode}:\n" + "\n".join(self.stderr))
            if self.port is not None:
                try:
                    if self.request("GET", "/readyz", timeout=5)[0] == 200:
                        return self
                except OSError:
                    pass
            time.sleep(0.1)
        raise AssertionError("malinn serve was not ready in time:\n" + "\n".join(self.stderr))

    def connection(self, timeout: float = 60) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method: str, path: str, body=None, timeout: float = 60, connection=None) -> tuple:
        """``(status, the JSON answer or its text)``; a dict or list body is sent as JSON."""
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        conn = connection or self.connection(timeout)
        try:
            conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
            response = conn.getresponse()
            data = response.read().decode()
        finally:
            if connection is None:
                conn.close()
        try:
            return response.status, json.loads(data)
        except ValueError:
            return response.status, data

    def predict(self, model: str, document, version=None, connection=None) -> tuple:
        path = f"/v1/models/{model}" + (f"/versions/{version}" if version is not None else "") + ":predict"
        return self.request("POST", path, document, connection=connection)

    def metrics(self) -> str:
        status, text = self.request("GET", "/monitoring/prometheus/metrics")
        assert status == 200, text
        return text

    def stop(self, signum=signal.SIGTERM, timeout: float = 60) -> int:
        """Sends ``signum`` and returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"malinn serve did not stop within {timeout} s of {signum!r}:\n" + "\n".join(self.stderr)
            ) from None


def metric(text: str, name: str, **labels) -> float:
    """The value of the series ``name{labels}`` in a Prometheus scrape (0 where absent)."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            series, value = line.rsplit(" ", 1)
            found = dict(re.findall(r'(\w+)="([^"]*)"', series))
            if series.split("{")[0] == name and all(found.get(k) == str(v) for k, v in labels.items()):
                return float(value)
    return 0.0


def close(got, want) -> None:
    """Served outputs equal Keras's (the tolerance of the equivalence tests)."""
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=1e-5, atol=1e-6)


SCRIPT = Path(__file__).with_name("keras_models.py")


class KerasModels:
    """The files of tests/serve/keras_models.py and Keras's inputs and outputs of each model."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.manifest = json.loads((folder / "manifest.json").read_text())

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.keras"

    def x(self, key: str) -> dict:
        data = np.load(self.folder / f"{key}.npz")
        return {name: data[f"x:{name}"] for name in self.manifest[key]["inputs"]}

    def y(self, key: str) -> dict:
        data = np.load(self.folder / f"{key}.npz")
        return {name: data[f"y:{name}"] for name in self.manifest[key]["outputs"]}


@pytest.fixture(scope="session")
def keras_models(tmp_path_factory) -> KerasModels:
    """The models, built once per run (xdist's workers share them: the first builds, the others wait)."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "serve_keras_models"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".building", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (folder / "manifest.json").is_file():
                if importlib.util.find_spec("keras") is None:
                    pytest.skip("keras is not installed (bash .ci/setup --test): the Keras models cannot be built")
                done = subprocess.run(
                    [sys.executable, str(SCRIPT), str(folder)],
                    capture_output=True,
                    text=True,
                    timeout=600,
                    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                )
                assert done.returncode == 0 and (folder / "manifest.json").is_file(), done.stderr[-4000:]
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return KerasModels(folder)
