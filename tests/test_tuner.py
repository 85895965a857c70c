"""The tuner and the caches: what is stored, what the runtime then uses, and when it ignores it."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import malinn
from malinn import ops, tuner


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MALINN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuner, "_loaded", None)
    yield tmp_path
    monkeypatch.setattr(tuner, "_loaded", None)


def test_tune_stores_a_correct_winner_that_the_runtime_uses(device, cache, capsys):
    import io

    progress = io.StringIO()
    best = tuner.tune(device, shapes=[(13, 37, 33), (64, 50, 20)], quick=True, repeat=1, stream=progress)
    assert progress.getvalue().count("[") >= len(malinn.load_library().codenames("matmul"))
    stored = json.loads((cache / "tuning.json").read_text())
    entry = stored[f"{device.name}|{device.vendor}|{device.driver_version}"]
    assert entry["codename"] == best["codename"] and entry["seconds"] > 0 and entry["ranking"]
    assert all(r["seconds"] >= entry["seconds"] for r in entry["ranking"])
    chosen = ops.kernel_for("matmul", device, (64, 64, 64))
    if malinn.load_library()[best["codename"]].accepts(64, 64, 64):
        assert chosen.codename == best["codename"] and chosen.config == {**chosen.config, **best["defines"]}


def test_a_stale_or_damaged_cache_is_ignored(device, cache):
    key = f"{device.name}|{device.vendor}|{device.driver_version}"
    (cache / "tuning.json").write_text(json.dumps({key: {"codename": "gemm_tiled", "defines": {"MWG": 7}}}))
    assert tuner.tuned_choice(device) is None
    tuner._loaded = None
    (cache / "tuning.json").write_text("{ damaged")
    assert tuner.tuned_choice(device) is None
    lib = malinn.load_library()
    assert ops.kernel_for("matmul", device).codename == lib.default("matmul", device.kind)


def test_use_overrides_the_tuned_choice(device, cache):
    key = f"{device.name}|{device.vendor}|{device.driver_version}"
    (cache / "tuning.json").write_text(json.dumps({key: {"codename": "crossv", "defines": {}}}))
    assert ops.kernel_for("matmul", device).codename == "crossv"
    ops.use("matmul", "rmcm", device)
    assert ops.kernel_for("matmul", device).codename == "rmcm"


def test_cli_tune_quick_with_a_shape(tmp_path):
    env = {**os.environ, "MALINN_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "malinn.cli", "tune", "--quick", "--shape", "20x30x40", "--budget", "60"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "best: " in out.stdout and (tmp_path / "tuning.json").is_file()
    bad = subprocess.run([sys.executable, "-m", "malinn.cli", "tune", "--shape", "20x30"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "--shape expects MxKxN" in bad.stderr
