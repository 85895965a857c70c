"""Writing onto a full disk: every write path ends in one line of error (exit 1 on the command line,
an exception from the Python API), leaves no temporary and keeps the old destination byte for byte.

Two real failures of the operating system: a small tmpfs (mounted where this process may mount:
root with CAP_SYS_ADMIN), and a file-size limit (``RLIMIT_FSIZE``, which fails a write with EFBIG
anywhere). HDF5 that met a failed write used to leave its objects open: their flushes from h5py's
deallocators printed screens of "Exception ignored" and the process died of a segmentation fault
(exit 139), the Python API's caller with it.
"""

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from malinn.io.files import TEMP_PATTERN
from malinn.model.saving import is_malinn_file

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits_mlp.keras"
MALINN = [sys.executable, "-m", "malinn"]
OLD = b"the old destination, which a failed write must keep\n"
API = r"""
import sys
import malinn
try:
    malinn.convert(sys.argv[1], sys.argv[2], target="cpu")
except malinn.MalinnError as exc:
    print(f"raised {type(exc).__name__}: {exc}")
    sys.exit(3)
print("no error")
"""


def env() -> dict:
    return {**os.environ, "MALINN_DEVICE": "cpu", "MALINN_GL": "0", "PYTHONFAULTHANDLER": "1"}


def temporaries(folder: Path) -> list:
    return sorted(p.name for p in folder.iterdir() if TEMP_PATTERN.match(p.name) or p.name.endswith("-tmp"))


@pytest.fixture
def small_disk(tmp_path):
    """``make(size)``: a folder on a new tmpfs of ``size`` (unmounted afterwards)."""
    mounted = []

    def make(size: str) -> Path:
        if os.geteuid() != 0 or shutil.which("mount") is None:
            pytest.skip("mounting a tmpfs needs root (the file-size-limit cases run anyway)")
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "tmpfs", str(folder)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); the file-size-limit cases run anyway")
        mounted.append(folder)
        return folder

    yield make
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> None:
    """Fills the disk of ``folder`` to the last byte."""
    with open(folder / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


def limit_file_size(nbytes: int):
    """A ``preexec_fn`` that fails every write past ``nbytes`` of a file with EFBIG (no SIGXFSZ)."""

    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))

    return apply


def destination(how: str, small_disk, tmp_path, name: str, size: str = "32k") -> tuple:
    """(the destination holding :data:`OLD`, the child's preexec_fn) for a disk full ``how``."""
    if how == "tmpfs":
        folder = small_disk(size)
        dest = folder / name
        dest.write_bytes(OLD)
        return dest, None
    folder = tmp_path / "limited"
    folder.mkdir()
    dest = folder / name
    dest.write_bytes(OLD)
    return dest, limit_file_size(8192)


def assert_failed_cleanly(done, dest: Path, returncode: int = 1) -> str:
    assert done.returncode == returncode, (done.returncode, done.stderr[-3000:])
    assert temporaries(dest.parent) == [], "a temporary was left behind"
    assert dest.read_bytes() == OLD, "the old destination was changed"
    return done.stderr


@pytest.mark.parametrize("how", ["tmpfs", "file-size-limit"])
def test_convert_onto_a_full_disk_is_one_line_exit_1(how, small_disk, tmp_path):
    dest, limit = destination(how, small_disk, tmp_path, "digits.malinn")
    done = subprocess.run(
        MALINN + ["convert", str(DIGITS), "-o", str(dest), "--target", "cpu"],
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit,
    )
    stderr = assert_failed_cleanly(done, dest)
    assert stderr.splitlines() == [stderr.strip()], stderr
    assert stderr.startswith(f"malinn: error: {dest}: cannot write the file ("), stderr


@pytest.mark.parametrize("size, fits", [("8k", False), ("64k", False), ("1m", True)])
def test_convert_onto_tmpfs_of_8k_to_1m_fails_cleanly_or_writes_the_whole_file(size, fits, small_disk):
    """The failure strikes in HDF5's metadata (8k), in a weight (64k: the file is 75 KB), or not at all."""
    folder = small_disk(size)
    dest = folder / "digits.malinn"
    dest.write_bytes(OLD)
    done = subprocess.run(
        MALINN + ["convert", str(DIGITS), "-o", str(dest), "--target", "cpu"],
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert temporaries(folder) == []
    if fits:
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert is_malinn_file(dest)
    else:
        assert done.returncode == 1, (done.returncode, done.stderr[-3000:])
        assert dest.read_bytes() == OLD
        assert done.stderr.splitlines() == [f"malinn: error: {dest}: cannot write the file (No space left on device)"]


@pytest.mark.parametrize("how", ["tmpfs", "file-size-limit"])
def test_the_python_api_raises_and_the_interpreter_lives_on(how, small_disk, tmp_path):
    dest, limit = destination(how, small_disk, tmp_path, "digits.malinn")
    done = subprocess.run(
        [sys.executable, "-c", API, str(DIGITS), str(dest)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit,
    )
    assert_failed_cleanly(done, dest, returncode=3)
    assert done.stdout.startswith(f"raised ConversionError: {dest}: cannot write the file ("), done.stdout
    assert done.stderr == "", done.stderr  # no "Exception ignored in ObjectID.__dealloc__"


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".csv"])
def test_predict_onto_a_full_disk_is_one_line_exit_1(suffix, small_disk, tmp_path):
    """(A tmpfs only: a file-size limit would fail PoCL's own writes of the kernels it compiles.)"""
    model, x = tmp_path / "digits.malinn", tmp_path / "x.npy"
    subprocess.run(
        MALINN + ["convert", str(DIGITS), "-o", str(model), "--target", "cpu"],
        env=env(),
        check=True,
        capture_output=True,
        timeout=300,
    )
    np.save(x, np.load(ROOT / "examples" / "digits_test.npz")["x"])  # 360 samples: 14 KB of predictions
    dest, _ = destination("tmpfs", small_disk, tmp_path, "y" + suffix, size="8k")
    done = subprocess.run(
        MALINN + ["predict", str(model), str(x), "-o", str(dest)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    stderr = assert_failed_cleanly(done, dest)
    assert stderr.splitlines() == [stderr.strip()], stderr
    assert stderr.startswith(f"malinn: error: {dest}: cannot write the file ("), stderr


def test_tune_onto_a_full_cache_disk_keeps_the_tuning_database(small_disk):
    folder = small_disk("64k")
    cache = folder / "cache"
    cache.mkdir()
    tuning = cache / "tuning.json"
    old = json.dumps({"format": "malinn-tuning", "version": 1, "devices": {}}).encode()
    tuning.write_bytes(old)
    fill(folder)
    done = subprocess.run(
        MALINN + ["tune", "--shape", "8x8x8", "--budget", "1"],
        env={**env(), "MALINN_CACHE_DIR": str(cache)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert (
        done.stderr.strip().splitlines()[-1]
        == f"malinn: error: {tuning}: cannot store the tuning results (No space left on device)"
    ), done.stderr
    assert tuning.read_bytes() == old
    for sub in [cache] + [p for p in cache.iterdir() if p.is_dir()]:
        assert temporaries(sub) == [], sub
