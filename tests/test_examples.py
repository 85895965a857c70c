"""The examples a new user starts from run and check themselves."""

import subprocess
import sys
from pathlib import Path

import malinn

ROOT = Path(__file__).resolve().parents[1]


def test_quickstart_runs_and_matches_numpy():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK: malinn matches numpy" in out.stdout


def test_quickstart_on_each_device_and_kernel():
    for d in malinn.devices():
        out = subprocess.run(
            [
                sys.executable,
                str(ROOT / "examples" / "quickstart.py"),
                "--device",
                f"{d.index[0]}:{d.index[1]}",
                "--kernel",
                "blocked_rmcm",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "matmul kernel: blocked_rmcm" in out.stdout


def test_graph_examples_agree_with_keras():
    """The residual MLP and the two-input tabular model (examples/train_graphs.py), converted and
    predicted, give Keras's probabilities."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "graphs_convert_and_predict.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK: malinn agrees with Keras on both graphs" in out.stdout
    assert "Connected to" in out.stdout


def test_cnn_digits_agrees_with_keras_on_every_sample():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "cnn_digits.py")], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK: malinn agrees with Keras on every sample" in out.stdout
    assert any(a in out.stdout for a in ("conv_kn2", "im2row", "im2col")) and "pool" in out.stdout
