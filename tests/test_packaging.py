"""A normal (non-editable) install works: what `pip install .` and the sdist give a user.

The wheel (`pip wheel --no-deps`) and the sdist (`python -m build --sdist`) are built from a copy of
the checkout, so the build's own `build/` and `malinn.egg-info/` never land in it. Each is installed
into a fresh virtual environment outside the source tree (`--system-site-packages`, so numpy, pyopencl
and h5py come from the machine; malinn itself only from the wheel), and there the installed `malinn`
command converts and predicts the example model, with no path pointing back at the checkout.
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

# What a build leaves in its source folder, and what must never be copied into one.
BUILD_OUTPUTS = (".git", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis", ".pytest_cache", ".venv")


def checkout_leftovers():
    """The checkout's untracked and ignored paths (``git status --ignored``), bytecode caches aside.

    Returns:
        A set of paths relative to the repository root, or None outside a git checkout.
    """
    proc = subprocess.run(["git", "status", "--porcelain", "--ignored", "--", "."], cwd=ROOT,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    return {line[3:] for line in proc.stdout.splitlines() if line[:2] in ("??", "!!")
            and not {"__pycache__", ".pytest_cache"} & set(Path(line[3:]).parts)}


# Taken when pytest collects this file, before any test runs.
LEFTOVERS_AT_START = checkout_leftovers()


def library_files():
    """Every file the kernel library reads: ``library.json`` and each kernel's ``source`` and ``includes``.

    Returns:
        Paths relative to the kernels folder, as ``kernels/library.json`` names them.
    """
    library = json.loads((ROOT / "kernels" / "library.json").read_text())
    files = {"library.json"}
    for entry in library["kernels"].values():   # a variant_of entry reads its base's files
        for source in [entry] + list((entry.get("sources") or {}).values()):   # OpenCL's, then each backend's
            source = {"source": source} if isinstance(source, str) else source
            if "source" in source:
                files.add(source["source"])
            files.update(source.get("includes", []))
    return files


def python_modules(package_dir, package):
    """``package/...py`` for every module under ``package_dir`` (a folder of the checkout)."""
    return {f"{package}/{p.relative_to(package_dir).as_posix()}" for p in package_dir.rglob("*.py")
            if "__pycache__" not in p.parts}


def run(command, cwd, env=None, timeout=300):
    """Runs ``command``; fails the test with its output when it exits non-zero."""
    proc = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, (f"{' '.join(map(str, command))} exited {proc.returncode}:\n"
                                  f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc.stdout


def copy_source(dst):
    """Copies the project's files (tracked or not ignored; a plain copy without git) to ``dst``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True)
    if listed.returncode != 0:   # not a git checkout (an unpacked sdist, say)
        shutil.copytree(ROOT, dst, ignore=shutil.ignore_patterns(*BUILD_OUTPUTS))
        return dst
    for name in filter(None, listed.stdout.decode().split("\0")):
        if (ROOT / name).is_file():   # a file deleted but not yet committed is still listed
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dst / name)
    return dst


def outside_env():
    """The environment without anything that points Python or malinn at the checkout."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "MALINN_KERNELS", "VIRTUAL_ENV")}


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """The wheel and the sdist built from a copy of the checkout: ``{"wheel": path, "sdist": path}``."""
    if subprocess.run([sys.executable, "-m", "build", "--version"], capture_output=True).returncode != 0:
        pytest.fail("python -m build is missing: pip install build (the test extra lists it)")
    src = copy_source(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", out, src], cwd=out)
    run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", out, src], cwd=out)
    (wheel,) = out.glob("malinn-*.whl")
    (sdist,) = out.glob("malinn-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def test_wheel_holds_every_file_the_kernel_library_reads(dists):
    names = set(zipfile.ZipFile(dists["wheel"]).namelist())
    missing = sorted(f for f in library_files() if f"malinn/kernels/{f}" not in names)
    assert not missing, f"kernels/library.json names files the wheel lacks: {missing}"
    modules = python_modules(ROOT / "malinn", "malinn") | python_modules(ROOT / "converters", "malinn/converters")
    assert not sorted(modules - names), "modules missing from the wheel"
    assert any(n.endswith(".dist-info/entry_points.txt") for n in names)


def test_sdist_holds_the_package_kernels_and_what_the_tests_need(dists):
    with tarfile.open(dists["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    needed = {f"kernels/{f}" for f in library_files()}
    needed |= {p.relative_to(ROOT).as_posix() for p in (ROOT / "converters").glob("*.py")}
    needed |= {p.relative_to(ROOT).as_posix() for p in (ROOT / "malinn").rglob("*.py")}
    needed |= {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("*.py")}
    needed |= {"pyproject.toml", "README.md", "examples/digits_mlp.keras", "examples/digits_test.npz"}
    assert not sorted(needed - names), "files missing from the sdist"
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_installed_malinn_converts_and_predicts_the_example(dists, kind, tmp_path):
    venv = tmp_path / "venv"
    work = tmp_path / "work"
    work.mkdir()
    env = outside_env()
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], cwd=tmp_path, env=env)
    python = venv / "bin" / "python"
    # The machine's pip (a system site package) installs into the venv; --ignore-installed because the
    # machine may have malinn itself (an editable install of a checkout), which must not count.
    run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-build-isolation",
         "--ignore-installed", dists[kind]], cwd=work, env=env)

    where = run([python, "-c", "import malinn, malinn.resources as r; print(malinn.__file__); "
                 "print(r.kernels_dir())"], cwd=work, env=env).splitlines()
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    cwd=work, env=env).strip())
    assert Path(where[0]).is_relative_to(site), f"malinn imported from {where[0]}, not the venv's {site}"
    assert Path(where[1]) == site / "malinn" / "kernels"

    data = np.load(EXAMPLES / "digits_test.npz")
    np.save(work / "x.npy", data["x"])
    command = venv / "bin" / "malinn"
    run([command, "convert", EXAMPLES / "digits_mlp.keras", "-o", "digits.malinn"], cwd=work, env=env)
    run([command, "predict", "digits.malinn", "x.npy", "-o", "y.npy"], cwd=work, env=env)
    y = np.load(work / "y.npy")
    assert y.shape == data["keras"].shape
    np.testing.assert_allclose(y, data["keras"], rtol=0, atol=1e-5)


@pytest.mark.run_last
def test_the_test_run_leaves_nothing_new_in_the_checkout():
    """No build/, malinn.egg-info/, .hypothesis/ or other file appears in the checkout during the run."""
    if LEFTOVERS_AT_START is None:
        pytest.skip("not a git checkout: nothing to compare with")
    new = sorted(checkout_leftovers() - LEFTOVERS_AT_START)
    assert not new, f"the test run left these in the checkout {ROOT}: {new}"
