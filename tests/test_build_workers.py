"""Build worker processes (malinn/backends/opencl_build_workers.py): a cold plan on PoCL starts them,
computes the same values, and the binaries they store (or the device stores, where a worker died)
serve the next process; a warm plan starts none."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import malinn
from malinn.backends.opencl_build_workers import build_workers
from malinn.errors import SettingError

CHILD = r"""
import json, os, sys
import numpy as np
import malinn
model = malinn.load_model(sys.argv[1])
device = malinn.get_device()
model.plan(2)
workers = device.workers.processes if device.workers is not None else []
started = len(workers)
if os.environ.get("KILL_WORKERS"):
    for process in workers:
        process.kill()
        process.wait()
y = model.predict(np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6))
print(json.dumps({"y": y.tolist(), "builds": device.counters["builds"], "hits": device.counters["binary_hits"],
                  "started": started, "pocl": device.is_pocl}))
"""


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    model = malinn.Sequential([malinn.layers.Dense(5, activation="relu"), malinn.layers.Dense(3)])
    model.build((None, 6))
    model.set_weights([w + 0.25 for w in model.get_weights()])
    return model.save(tmp_path_factory.mktemp("workers") / "small.malinn")


def expected(path) -> np.ndarray:
    w1, b1, w2, b2 = malinn.load_model(path).get_weights()
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6)
    return np.maximum(x @ w1 + b1, 0) @ w2 + b2


def run(path, folder, **env) -> dict:
    """A new process's first prediction with its own empty caches under ``folder`` (malinn's and PoCL's)."""
    (folder / "pocl").mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "MALINN_CACHE_DIR": str(folder / "malinn"),
            "POCL_CACHE_DIR": str(folder / "pocl"),
            "MALINN_BINARY_CACHE": "1",
            "MALINN_BUILD_WORKERS": "1",
            **env,
        },
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not result["pocl"]:
        pytest.skip("build workers are PoCL's")
    return result


def test_a_cold_plan_on_pocl_starts_a_worker_and_its_binaries_serve_the_next_process(model_file, tmp_path):
    first = run(model_file, tmp_path)
    np.testing.assert_allclose(first["y"], expected(model_file), rtol=1e-5, atol=1e-5)
    assert first["started"] == 1 and first["builds"] >= 2 and first["hits"] == 0
    stored = list((tmp_path / "malinn" / "programs").glob("*.bin"))
    assert len(stored) >= first["builds"]  # the worker stored each plan's binary before the process ended
    second = run(model_file, tmp_path)
    assert second["y"] == first["y"]
    assert second["started"] == 0 and second["builds"] == 0 and second["hits"] == first["builds"]


def test_a_killed_worker_leaves_a_right_result_and_the_binaries_stored(model_file, tmp_path):
    first = run(model_file, tmp_path, KILL_WORKERS="1")
    np.testing.assert_allclose(first["y"], expected(model_file), rtol=1e-5, atol=1e-5)
    assert first["started"] == 1 and first["builds"] >= 2
    second = run(model_file, tmp_path)  # the device stored what the dead worker was to store
    assert second["y"] == first["y"] and second["builds"] == 0 and second["hits"] == first["builds"]


def test_workers_can_be_turned_off(model_file, tmp_path):
    first = run(model_file, tmp_path, MALINN_BUILD_WORKERS="0")
    np.testing.assert_allclose(first["y"], expected(model_file), rtol=1e-5, atol=1e-5)
    assert first["started"] == 0 and first["builds"] >= 2
    assert run(model_file, tmp_path)["builds"] == 0


def test_the_number_of_workers_is_checked(monkeypatch):
    monkeypatch.setenv("MALINN_BUILD_WORKERS", "3")
    assert build_workers() == 3
    for bad in ("-1", "two", "17"):
        monkeypatch.setenv("MALINN_BUILD_WORKERS", bad)
        with pytest.raises(SettingError, match="MALINN_BUILD_WORKERS"):
            build_workers()
