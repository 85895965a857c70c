"""The malinn command: convert, predict, verify, devices; help, exit codes, clean errors."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits_mlp.keras"


def malinn(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "malinn.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.mark.parametrize("command", ["convert", "predict", "verify", "devices"])
def test_every_command_has_help(command):
    out = malinn(command, "--help")
    assert out.returncode == 0 and "usage: malinn " + command in out.stdout


def test_usage_errors_exit_2():
    assert malinn().returncode == 2
    assert malinn("bogus").returncode == 2
    assert malinn("convert", DIGITS).returncode == 2        # -o is required


def test_devices_lists_and_marks_the_default():
    out = malinn("devices")
    assert out.returncode == 0 and out.stdout.startswith("* [")


def test_convert_then_predict_matches_keras(tmp_path):
    out = malinn("convert", DIGITS, "-o", tmp_path / "d.malinn")
    assert out.returncode == 0, out.stderr
    assert "weights laid out for" in out.stdout
    data = np.load(ROOT / "examples" / "digits_test.npz")
    np.save(tmp_path / "x.npy", data["x"])
    out = malinn("predict", tmp_path / "d.malinn", tmp_path / "x.npy", "-o", tmp_path / "y.npy", "--batch-size", 50)
    assert out.returncode == 0, out.stderr
    y = np.load(tmp_path / "y.npy")
    assert y.shape == (360, 10) and y.dtype == np.float32
    assert np.abs(y - data["keras"]).max() <= 1e-5
    assert (y.argmax(1) == data["keras"].argmax(1)).all()


@pytest.mark.parametrize("target", ["gpu", "cpu", "morton_4_2"])
def test_convert_target(tmp_path, target):
    out = malinn("convert", DIGITS, "-o", tmp_path / "d.malinn", "--target", target)
    assert out.returncode == 0, out.stderr


def test_errors_are_one_line_without_traceback_and_leave_no_file(tmp_path):
    bad = tmp_path / "bad.keras"
    bad.write_bytes(b"not a model at all")
    out = malinn("convert", bad, "-o", tmp_path / "out.malinn")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("malinn: error: ") and str(bad) in out.stderr
    assert not (tmp_path / "out.malinn").exists()
    out = malinn("convert", DIGITS, "-o", tmp_path / "o.malinn", "--target", "tpu")
    assert out.returncode == 1 and "unknown target 'tpu'" in out.stderr
    np.save(tmp_path / "x.npy", np.zeros((2, 63), np.float32))
    out = malinn("predict", DIGITS, tmp_path / "x.npy", "-o", tmp_path / "y.npy")
    assert out.returncode == 1 and "expected shape (None, 64), found shape (2, 63)" in out.stderr
    assert not (tmp_path / "y.npy").exists()


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="verify needs tensorflow (test extra)")
def test_verify_prints_errors_after_every_layer(tmp_path):
    data = np.load(ROOT / "examples" / "digits_test.npz")
    np.save(tmp_path / "x.npy", data["x"][:20])
    out = malinn("verify", DIGITS, "--input", tmp_path / "x.npy")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    for name in ("dense", "activation", "dense_1", "dense_2", "(model output)"):
        assert any(line.startswith(name + " ") for line in lines[2:]), out.stdout
    assert lines[-1].startswith("OK: worst rel error")


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="verify needs tensorflow (test extra)")
def test_verify_fails_on_a_mismatch(tmp_path):
    out = malinn("verify", DIGITS, "--tolerance", "0")
    assert out.returncode == 1 and "MISMATCH" in out.stdout


def test_malinn_never_imports_tensorflow(tmp_path):
    script = ("import sys, numpy as np, malinn; m = malinn.load_model(sys.argv[1]); m.predict(np.zeros((1, 64)));"
              "import malinn.cli, malinn.converters.to_malinn;"
              "print(sorted(n for n in sys.modules if n.split('.')[0] in ('tensorflow', 'keras', 'tf_keras')))")
    out = subprocess.run([sys.executable, "-c", script, DIGITS], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
