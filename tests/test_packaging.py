"""A normal (non-editable) install carries kernels/ inside the wheel and finds it at run time."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(ROOT)], check=True, capture_output=True, timeout=300)
    (path,) = out.glob("malinn-*.whl")
    return path


def test_wheel_holds_every_kernel_source_and_the_library(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for source in (ROOT / "kernels").iterdir():
        if source.suffix in (".cl", ".json"):
            assert f"malinn/kernels/{source.name}" in names
    for source in (ROOT / "converters").glob("*.py"):
        assert f"malinn/converters/{source.name}" in names


def test_installed_wheel_finds_its_kernels(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    script = ("import malinn, malinn.resources as r; "
              "print(r.kernels_dir()); import malinn.converters as c; print(c.__file__)")
    env = {k: v for k, v in os.environ.items() if k != "MALINN_KERNELS"}
    env["PYTHONPATH"] = str(target)
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == str(target / "malinn" / "kernels")
    assert out.stdout.splitlines()[1] == str(target / "malinn" / "converters" / "__init__.py")
