"""A normal (non-editable) install works: what `pip install .` and the sdist give a user.

The wheel (`pip wheel --no-deps`) and the sdist (`python -m build --sdist`) are built from a copy of
the checkout, so the build's own `build/` and `malinn.egg-info/` never land in it. Each is installed
into a fresh virtual environment outside the source tree, and there the installed `malinn` command
converts and predicts the example model, with no path pointing back at the checkout.

The fresh environment has no system site packages: the interpreter running the tests may itself be a
virtual environment (the project's `.venv`), whose base interpreter lacks numpy, pyopencl and h5py,
and `--system-site-packages` would see that base, not the running environment. Instead a `.pth`
file in the fresh environment lists the running interpreter's package folders
(:func:`dependency_dirs`), so the dependencies (and pip, setuptools and wheel, which install the
sdist without build isolation) come from the environment that runs the tests, whatever kind it is
(a distribution's Python, pyenv, a venv), while malinn comes only from the wheel installed into the
fresh environment: its own site-packages precedes every folder a `.pth` file adds.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

# What a build leaves in its source folder, and what must never be copied into one.
BUILD_OUTPUTS = (".git", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis", ".pytest_cache", ".venv")


def checkout_leftovers():
    """The checkout's untracked and ignored paths (``git status --ignored``), bytecode caches aside.

    Returns:
        A set of paths relative to the repository root, or None outside a git checkout.
    """
    proc = subprocess.run(
        ["git", "status", "--porcelain", "--ignored", "--", "."], cwd=ROOT, capture_output=True, text=True
    )
    if proc.returncode != 0:
        return None
    return {
        line[3:]
        for line in proc.stdout.splitlines()
        if line[:2] in ("??", "!!") and not {"__pycache__", ".pytest_cache"} & set(Path(line[3:]).parts)
    }


# Taken when pytest collects this file, before any test runs.
LEFTOVERS_AT_START = checkout_leftovers()


def library_files():
    """Every file the kernel library reads: ``library.json`` and each kernel's ``source`` and ``includes``.

    Returns:
        Paths relative to the kernels folder, as ``kernels/library.json`` names them.
    """
    library = json.loads((ROOT / "kernels" / "library.json").read_text())
    files = {"library.json"}
    for entry in library["kernels"].values():  # a variant_of entry reads its base's files
        for source in [entry] + list((entry.get("sources") or {}).values()):  # OpenCL's, then each backend's
            source = {"source": source} if isinstance(source, str) else source
            if "source" in source:
                files.add(source["source"])
            files.update(source.get("includes", []))
    return files


def python_modules(package_dir, package):
    """``package/...py`` for every module under ``package_dir`` (a folder of the checkout)."""
    return {
        f"{package}/{p.relative_to(package_dir).as_posix()}"
        for p in package_dir.rglob("*.py")
        if "__pycache__" not in p.parts
    }


def run(command, cwd, env=None, timeout=300):
    """Runs ``command``; fails the test with its output when it exits non-zero."""
    proc = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, command))} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    return proc.stdout


def copy_source(dst):
    """Copies the project's files (tracked or not ignored; a plain copy without git) to ``dst``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True
    )
    if listed.returncode != 0:  # not a git checkout (an unpacked sdist, say)
        shutil.copytree(ROOT, dst, ignore=shutil.ignore_patterns(*BUILD_OUTPUTS))
        return dst
    for name in filter(None, listed.stdout.decode().split("\0")):
        if (ROOT / name).is_file():  # a file deleted but not yet committed is still listed
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dst / name)
    return dst


def outside_env():
    """The environment without anything that points Python or malinn at the checkout."""
    return {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "MALINN_KERNELS", "VIRTUAL_ENV")
    }


def is_within(path, folder) -> bool:
    """Whether ``path`` is ``folder`` or inside it, symbolic links resolved."""
    return Path(path).resolve().is_relative_to(Path(folder).resolve())


def dependency_dirs():
    """The folders the running interpreter imports installed packages from, in its import order.

    Every ``site-packages`` or ``dist-packages`` folder on ``sys.path`` (a venv's own; a
    distribution's ``/usr/lib/python3/dist-packages``; a user site), with ``sysconfig``'s purelib and
    platlib of ``sys.prefix``, and any other folder on ``sys.path`` outside the interpreter's prefixes
    (``PYTHONPATH``, a ``.pth`` file's entries), except the checkout's own folders (its root and
    ``tests/``, which pytest or an editable install put there) and the folders above it.

    Returns:
        Existing folders as strings, each once.
    """
    prefixes = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    candidates = list(sys.path) + [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    found = []
    for entry in candidates:
        if not entry or not Path(entry).is_dir() or entry in found:
            continue
        site_folder = Path(entry).name in ("site-packages", "dist-packages")
        elsewhere = not any(is_within(entry, prefix) for prefix in prefixes)
        if site_folder or (elsewhere and not is_within(entry, ROOT) and not is_within(ROOT, entry)):
            found.append(entry)
    return found


def fresh_environment(folder, env):
    """A virtual environment at ``folder`` that imports installed packages from the running one.

    Made by the running interpreter with neither pip nor system site packages; a ``.pth`` file in its
    site-packages lists :func:`dependency_dirs`. Python adds those folders after the environment's own
    site-packages and reads no ``.pth`` file inside them, so the running environment's malinn (an
    editable install's import hook, say) stays out, while its numpy, pyopencl, h5py, pip, setuptools
    and wheel are found.

    Returns:
        ``(python, site)``: the environment's interpreter and its site-packages folder.
    """
    run([sys.executable, "-m", "venv", "--without-pip", folder], cwd=folder.parent, env=env)
    python = folder / "bin" / "python"
    site = Path(
        run(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=folder.parent, env=env
        ).strip()
    )
    (site / "running_environment.pth").write_text("".join(f"{d}\n" for d in dependency_dirs()))
    return python, site


# Printed as JSON by the fresh environment's interpreter: where malinn and its dependencies came from.
WHERE_SCRIPT = """
import importlib.metadata, json, sys
import malinn, malinn.converters, malinn.resources
print(json.dumps({
    "modules": {n: getattr(m, "__file__", None) for n, m in sorted(sys.modules.items()) if n.split(".")[0] == "malinn"},
    "kernels": str(malinn.resources.kernels_dir()),
    "metadata": str(importlib.metadata.distribution("malinn").locate_file("")),
    "requires": importlib.metadata.requires("malinn") or [],
    "versions": {n: v for n, v in reversed([(d.metadata["Name"].lower(), [d.version, str(d.locate_file(""))])
                                             for d in importlib.metadata.distributions()])},   # the first found
    "path": sys.path,
}))
"""


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """The wheel and the sdist built from a copy of the checkout: ``{"wheel": path, "sdist": path}``."""
    if subprocess.run([sys.executable, "-m", "build", "--version"], capture_output=True).returncode != 0:
        pytest.fail("python -m build is missing: pip install build (the test extra lists it)")
    if not (
        importlib.util.find_spec("setuptools")
        and (importlib.util.find_spec("wheel") or importlib.util.find_spec("setuptools.command.bdist_wheel"))
    ):
        pytest.fail(
            "building without isolation needs setuptools>=64 and wheel in this environment: "
            "pip install 'setuptools>=64' wheel (the test extra lists them)"
        )
    src = copy_source(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("dist")
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", out, src],
        cwd=out,
    )
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


def test_dependency_dirs_hold_the_dependencies_and_never_the_checkout():
    """The folders the fresh environments take their packages from hold numpy, pyopencl and h5py as
    this process imports them, and none is the checkout or its tests folder (where pytest and an
    editable install put malinn's sources)."""
    dirs = dependency_dirs()
    for module in ("numpy", "pyopencl", "h5py", "pip"):
        origin = importlib.util.find_spec(module).origin
        assert any(is_within(origin, d) for d in dirs), f"{module} ({origin}) is in none of {dirs}"
    assert not [
        d
        for d in dirs
        if Path(d).resolve() in (ROOT, ROOT / "tests")
        or (ROOT / "malinn" / "__init__.py").is_relative_to(Path(d).resolve())
    ]


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_installed_malinn_converts_and_predicts_the_example(dists, kind, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    env = outside_env()
    python, site = fresh_environment(tmp_path / "venv", env)
    venv = python.parent.parent
    # --ignore-installed: the running environment may hold malinn itself (an editable install of this
    # checkout), which must not count as installed; --no-deps: the dependencies are the running
    # environment's, checked against the installed metadata below.
    run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--ignore-installed",
            dists[kind],
        ],
        cwd=work,
        env=env,
    )

    where = json.loads(run([python, "-c", WHERE_SCRIPT], cwd=work, env=env))
    assert Path(where["modules"]["malinn"]).resolve() == (site / "malinn" / "__init__.py").resolve()
    outside = {name: f for name, f in where["modules"].items() if f and not is_within(f, site)}
    assert not outside, f"malinn modules imported from outside the fresh environment's {site}: {outside}"
    assert Path(where["kernels"]).resolve() == (site / "malinn" / "kernels").resolve()
    assert is_within(where["metadata"], site), f"malinn's metadata read from {where['metadata']}"
    dirs = dependency_dirs()
    stray = [p for p in where["path"] if p and is_within(p, ROOT) and p not in dirs]
    assert not stray, f"the fresh environment's sys.path points into the checkout: {stray}"
    # malinn's declared dependencies: each installed in the running environment, in a version it allows
    needed = [Requirement(r) for r in where["requires"]]
    needed = [r for r in needed if r.marker is None or r.marker.evaluate({"extra": ""})]
    assert {r.name for r in needed} == {"numpy", "pyopencl", "h5py"}
    for requirement in needed:
        version, location = where["versions"][requirement.name.lower()]
        assert requirement.specifier.contains(version, prereleases=True), f"{requirement}: {version} installed"
        assert any(is_within(location, d) for d in dirs), f"{requirement.name} from {location}, not {dirs}"
    # pip writes "#!PYTHON", or where that line would be too long a /bin/sh line that execs PYTHON
    script = "\n".join((venv / "bin" / "malinn").read_text().splitlines()[:2])
    assert f"{python}" in script, f"the malinn command starts {script!r}, not the fresh environment's {python}"

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
