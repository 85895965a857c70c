"""Start-up with warm caches: a new process builds no program, runs no probe kernel, and probes no
device beyond the one its choice needs; the probe cache follows the driver (benchmarks/cold_start.py
times it)."""

import json
import os
import subprocess
import sys

import numpy as np
import pyopencl as cl
import pytest

import malinn
from malinn.backends import opencl
from malinn.io.cache import read_entry

CHILD = r"""
import json, sys
import numpy as np
import malinn
from malinn.backends import opencl
model = malinn.load_model(sys.argv[1])
y = model.predict(np.ones((2, 6), np.float32))
device = malinn.get_device()
print(json.dumps({"y": y.tolist(), "builds": device.counters["builds"], "hits": device.counters["binary_hits"],
                  "probes": opencl.probe_stats, "index": list(device.index)}))
"""


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    model = malinn.Sequential([malinn.layers.Dense(5, activation="relu"), malinn.layers.Dense(3)])
    model.build((None, 6))
    model.set_weights([w + 0.25 for w in model.get_weights()])
    return model.save(tmp_path_factory.mktemp("cold") / "small.malinn")


def run(path, cache_dir, **env) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "MALINN_CACHE_DIR": str(cache_dir), "MALINN_BINARY_CACHE": "1", **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_warm_new_process_builds_nothing_and_runs_no_probe_kernel(model_file, tmp_path):
    first = run(model_file, tmp_path)
    assert first["builds"] >= 1 and first["hits"] == 0 and first["probes"]["run"] >= 1
    second = run(model_file, tmp_path)
    assert second["y"] == first["y"] and second["index"] == first["index"]
    assert second["builds"] == 0 and second["hits"] == first["builds"]
    assert second["probes"] == {"run": 0, "cached": first["probes"]["run"]}


def test_the_probe_cache_can_be_turned_off(model_file, tmp_path):
    run(model_file, tmp_path)
    again = run(model_file, tmp_path, MALINN_PROBE_CACHE="0")
    assert again["probes"]["run"] >= 1 and again["probes"]["cached"] == 0 and again["builds"] == 0


def test_a_driver_update_runs_the_probe_again(monkeypatch, tmp_path):
    """The device reports another driver string (as after an update): the cached result is not used."""
    monkeypatch.setenv("MALINN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(opencl, "probe_stats", {"run": 0, "cached": 0})
    first = opencl.discover()
    assert first and opencl.probe_stats == {"run": len(first), "cached": 0}
    assert all(read_entry("probes", opencl.probe_key(d)) is not None for d in first)
    opencl.discover()
    assert opencl.probe_stats == {"run": len(first), "cached": len(first)}
    monkeypatch.setattr(cl.Device, "driver_version", property(lambda self: "9.9.9-updated"))
    updated = opencl.discover()
    assert [d.driver_version for d in updated] == ["9.9.9-updated"] * len(first)
    assert opencl.probe_stats == {"run": 2 * len(first), "cached": len(first)}
    assert len(list((tmp_path / "probes").iterdir())) == 2 * len(first)


def test_a_damaged_probe_entry_runs_the_probe_again(monkeypatch, tmp_path):
    monkeypatch.setenv("MALINN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(opencl, "probe_stats", {"run": 0, "cached": 0})
    found = opencl.discover()
    for entry in (tmp_path / "probes").iterdir():
        entry.write_bytes(entry.read_bytes()[:-1] + b"X")
    with pytest.warns(RuntimeWarning, match="damaged probe cache entry"):
        opencl.discover()
    assert opencl.probe_stats == {"run": 2 * len(found), "cached": 0}


def test_the_first_choice_probes_only_gpus_up_to_the_first_working_one(monkeypatch):
    probed = []
    real = opencl.probe

    def spy(cl_module, platform, cl_device, index):
        probed.append(index)
        return real(cl_module, platform, cl_device, index)

    monkeypatch.setattr(opencl, "probe", spy)
    known = {}
    gpu = opencl.first_gpu(known)
    gpus = [d for d in malinn.devices() if d.backend == "opencl" and d.kind == "gpu"]
    assert (gpu.index if gpu else None) == (gpus[0].index if gpus else None)
    listed = [(pi, di) for pi, p in enumerate(cl.get_platforms()) for di, d in enumerate(p.get_devices())
              if d.type & cl.device_type.GPU]
    assert probed == (listed[:listed.index(gpu.index) + 1] if gpu else listed)
    assert set(known) == set(probed)
    count = len(probed)
    again = opencl.discover(known)                 # the full discovery reuses those probes
    assert [d.index for d in again] == [d.index for d in malinn.devices() if d.backend == "opencl"]
    assert not set(probed[:count]) & set(probed[count:])
    if gpu is not None:
        assert next(d for d in again if d.index == gpu.index) is gpu


def test_the_lazy_choice_is_the_device_listed_later():
    script = ("import malinn; d = malinn.get_device(); listed = malinn.devices(); "
              "assert any(x is d for x in listed), (d, listed); malinn.set_device(d); "
              "assert malinn.get_device() is d; print(d.index)")
    env = {k: v for k, v in os.environ.items() if k != "MALINN_DEVICE"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = malinn.devices()
    gpus = [d for d in found if d.kind == "gpu"]
    assert out.stdout.strip() == str((gpus[0] if gpus else next(d for d in found if d.kind == "cpu")).index)


def test_loading_a_model_file_draws_no_random_weights(model_file, monkeypatch):
    """Every weight comes from the file: building the layers first draws nothing (for Full CIFAR a
    draw of 25 M weights cost a third of a second before its first prediction)."""
    expected = malinn.load_model(model_file).get_weights()

    def no_draw(*args, **kwargs):
        raise AssertionError("a random draw while loading a model file")

    monkeypatch.setattr(np.random, "default_rng", no_draw)
    loaded = malinn.load_model(model_file)
    for got, want in zip(loaded.get_weights(), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert np.count_nonzero(loaded.get_weights()[0]) > 0
    monkeypatch.undo()
    fresh = malinn.Sequential([malinn.layers.Dense(5)])           # a model built in code still draws Glorot values
    fresh.build((None, 6))
    kernel = fresh.get_weights()[0]
    assert np.count_nonzero(kernel) == kernel.size and np.abs(kernel).max() <= np.sqrt(6 / 11)
