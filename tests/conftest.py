"""Shared fixtures: every device test runs once per working device of every backend (OpenCL, and
OpenGL where moderngl is installed)."""

import contextlib
import fcntl
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def usable_cores() -> int:
    """The cores this process may keep busy: its CPU affinity, capped by a container's CPU quota
    (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), which the affinity does not show: a container
    limited to 2 cores of a 64-core host has 64 CPUs in its affinity."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    for quota_file, period_file in (
        ("/sys/fs/cgroup/cpu.max", None),
        ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
    ):
        try:
            fields = Path(quota_file).read_text().split()
            quota, period = fields[0], (fields[1] if period_file is None else Path(period_file).read_text().strip())
            if quota not in ("max", "-1"):
                cores = min(cores, max(1, -(-int(quota) // int(period))))
        except (OSError, IndexError, ValueError):
            continue
    return max(1, cores)


# PoCL and Mesa's llvmpipe start a thread per CPU they see: the host's, under a container's CPU
# quota too. One per usable core, so that the workers do not crowd the cores they share. (Oclgrind
# runs one simulation thread a process: support.OCLGRIND_FLAGS.)
for _threads in ("POCL_MAX_PTHREAD_COUNT", "LP_NUM_THREADS"):
    os.environ.setdefault(_threads, str(usable_cores()))

# Tuning results and program binaries go to a cache of the test run's own, never the user's.
os.environ["MALINN_CACHE_DIR"] = tempfile.mkdtemp(prefix="malinn-test-cache-")
# No program binaries written for the next process, except where a test asks (test_cache,
# test_cold_start, test_opengl): the tests build thousands of distinct programs once each, and on
# PoCL asking a program for its binary compiles every kernel in it for the device (1.5 s a program
# on a CI core, half a cold build's cost), a binary no later process of the run reads.
os.environ.setdefault("MALINN_BINARY_CACHE", "0")
# Hypothesis keeps its files in ./.hypothesis (the checkout) unless told where: a folder of the run's own.
if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
    os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = tempfile.mkdtemp(prefix="malinn-test-hypothesis-")

# model.summary() fits the terminal's width (at most 100 columns): the same width wherever the suite
# runs (a CI job without a terminal, a developer's narrow window), so that its tables read alike.
os.environ["COLUMNS"] = "100"

# The OpenGL backend joins the device tests wherever moderngl and an EGL driver work, even beside
# an OpenCL GPU (where a plain discovery leaves Mesa unloaded: malinn.backends.opengl.wanted).
os.environ.setdefault("MALINN_GL", "1")

import numpy as np
import pytest  # noqa: E402

import malinn  # noqa: E402
from malinn.choice import kernel_choice  # noqa: E402
from malinn.errors import BackendError  # noqa: E402

DEVICES = malinn.devices()
#: the Keras files a test marked ``formats_once`` reads on every device: one per Keras generation
#: (and one split form each); the other formats hold the same models in another file of the same
#: generation, whose reading does not depend on the device, and are read on the first device only
EVERY_DEVICE_FORMATS = ("keras3-zip", "keras2-h5", "keras3-split", "tf_keras-split")


def pytest_report_header(config):
    return ["malinn devices: " + ("; ".join(str(d) for d in DEVICES) or "none"), f"usable cores: {usable_cores()}"]


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject.toml): one worker per usable core. xdist's own count is the host's
    CPUs (or psutil's physical cores); under a CPU quota that starts more workers than cores, each
    with its own devices and program builds. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides."""
    chosen = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    return int(chosen) if chosen and chosen.isdigit() else usable_cores()


def pytest_configure(config):
    config.addinivalue_line("markers", "run_last: run after every other test (checks what the run left behind)")
    config.addinivalue_line(
        "markers",
        "kernel_grid: kernels checked against numpy over a grid of configurations "
        "and shapes; on PoCL built unoptimised (see the device fixture)",
    )
    config.addinivalue_line(
        "markers",
        "formats_once: a test over Keras file formats (its 'fmt' parameter) that "
        "reads every format on the first device, EVERY_DEVICE_FORMATS on the others",
    )


def pytest_collection_modifyitems(items):
    """Moves the tests marked ``run_last`` to the end, keeping the order of the others."""
    items.sort(key=lambda item: item.get_closest_marker("run_last") is not None)


@pytest.fixture(params=DEVICES or [None], ids=lambda d: d.name if d is not None else "no-device")
def device(request):
    """Each working device in turn, set as the current device; matmul settings restored after."""
    if request.param is None:
        pytest.fail("no working OpenCL device: run `bash .ci/setup` (it installs pocl-opencl-icd)")
    fmt = request.node.callspec.params.get("fmt") if hasattr(request.node, "callspec") else None
    if (
        request.node.get_closest_marker("formats_once")
        and request.param is not DEVICES[0]
        and fmt not in (None,) + EVERY_DEVICE_FORMATS
    ):
        pytest.skip(
            f"{fmt}: read on {DEVICES[0].name}, where the file's model is the one every device gets; "
            f"this device reads {', '.join(EVERY_DEVICE_FORMATS)}"
        )
    previous, options = malinn.get_device(), os.environ.get("MALINN_CL_OPTIONS")
    if request.node.get_closest_marker("kernel_grid") and is_pocl(request.param):
        # A grid of kernels checked against numpy checks each kernel's arithmetic, which does not
        # depend on the optimiser: PoCL builds it unoptimised, about 3x sooner (a cold build there
        # is most of a device test's time). The TensorFlow-equivalence, model, precision and CLI
        # tests build as a user's predict does, optimised, and run every kernel they choose so.
        os.environ["MALINN_CL_OPTIONS"] = f"{options or ''} -cl-opt-disable".strip()
    malinn.set_device(request.param)
    yield request.param
    kernel_choice.forget()
    malinn.set_device(previous)
    if options is None:
        os.environ.pop("MALINN_CL_OPTIONS", None)
    else:
        os.environ["MALINN_CL_OPTIONS"] = options


def is_pocl(device) -> bool:
    """Whether ``device`` is a PoCL (CPU) OpenCL device."""
    return device.backend == "opencl" and device.is_pocl


@pytest.fixture(autouse=True)
def _kernel_on_backend(request):
    """Skips a test parametrised with a kernel ``codename`` on a device whose backend has no source
    for that kernel (the OpenGL backend runs the entries whose "sources" name a GLSL file)."""
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    device, codename = params.get("device"), params.get("codename")
    if device is not None and isinstance(codename, str):
        from malinn.library.kernel_library import load_library

        library = load_library()
        if codename in library and not library[codename].has_source(device.backend):
            pytest.skip(f"kernel {codename} has no {device.backend} source")


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test on a device whose backend has no kernel for what it runs (an op or a precision the
    OpenGL backend has no shader for: malinn raises BackendError, naming it) is skipped with that
    message; on OpenCL, where every kernel has its source, the error fails the test as any other."""
    device = getattr(getattr(pyfuncitem, "callspec", None), "params", {}).get("device")
    try:
        return (yield)
    except BackendError as exc:
        if device is None or device.backend == "opencl":
            raise
        pytest.skip(f"not on the {device.backend} backend: {exc}")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def padding_gpu(device, monkeypatch):
    """``device`` choosing the GPU's kernels (its kind pretended) with padding on the device switched
    off (``MALINN_DEVICE_PADDING=0``), as on a device sharing the host's memory: the host's padding,
    the baseline of tests/test_device_padding.py and test_device_output_padding.py (a discrete GPU,
    the H200 among the devices the tests run on, pads large inputs and unpads large outputs by
    default: ``padding_discrete`` takes that default)."""
    monkeypatch.setenv("MALINN_DEVICE_PADDING", "0")
    monkeypatch.delenv("MALINN_STAGING", raising=False)
    monkeypatch.setattr(type(device), "kind", property(lambda self: "gpu"))
    return device


@pytest.fixture
def padding_discrete(padding_gpu, monkeypatch):
    """``padding_gpu`` as a discrete GPU with the path's default (host_unified_memory False: on PoCL,
    page-locked host arrays are CL_MEM_ALLOC_HOST_PTR buffers mapped once, as on NVIDIA's driver)."""
    if padding_gpu.backend != "opencl":
        pytest.skip("page-locked memory is OpenCL's (the OpenGL backends copy through their own buffers)")
    monkeypatch.delenv("MALINN_PINNED", raising=False)
    monkeypatch.delenv("MALINN_DEVICE_PADDING", raising=False)  # the discrete GPU's default
    monkeypatch.setattr(padding_gpu, "host_unified_memory", False)
    return padding_gpu


# ---------------------------------------------------------------------------------------------
# Keras reference models (tests/converters): built by tests/keras_zoo.py in a process of its own,
# because TensorFlow and PoCL cannot share one. No test file imports tensorflow/keras/tf_keras.

ZOO_SCRIPT = Path(__file__).with_name("keras_zoo.py")


def shared_folder(tmp_path_factory, name: str) -> Path:
    """A folder of this test run that every xdist worker shares (``name`` under the run's base
    folder; the test run's own without xdist), so that what one worker builds the others reuse."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name


@contextlib.contextmanager
def exclusive(lock: Path):
    """Holds an exclusive lock on the file ``lock`` (made if missing) across processes."""
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def built_zoo(
    tmp_path_factory,
    script: Path,
    marker: str = "manifest.json",
    args: tuple = (),
    keep: str | None = None,
    name: str | None = None,
) -> Path:
    """The folder of Keras models and outputs that ``script`` (a zoo, run with Keras in a child
    process: TensorFlow never shares a test process) writes, ending with the file ``marker``; built
    once per test run and shared by the xdist workers, or kept across runs in the folder that the
    environment variable ``keep`` names (``name``: the folder's, default the script's name). Skips where TensorFlow is missing; fails with the script's
    output where it fails."""
    kept = os.environ.get(keep) if keep else None
    folder = Path(kept) if kept else shared_folder(tmp_path_factory, name or script.stem)
    folder.mkdir(parents=True, exist_ok=True)
    with exclusive(folder / ".building"):
        if not (folder / marker).is_file():
            if importlib.util.find_spec("tensorflow") is None:
                pytest.skip("tensorflow is not installed (bash .ci/setup --test): the Keras models cannot be built")
            proc = subprocess.run(
                [sys.executable, str(script), str(folder), *args],
                capture_output=True,
                text=True,
                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES=""),
                timeout=900,
            )
            if proc.returncode != 0:
                pytest.fail(
                    f"{script.name} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
                )
    return folder


@pytest.fixture(scope="session")
def applications(tmp_path_factory) -> Path:
    """One member of every keras.applications family, saved by both Kerases with Keras's logits
    (tests/applications_zoo.py), built once per test run; ``MALINN_APPLICATIONS_ZOO=DIR`` keeps it."""
    return built_zoo(tmp_path_factory, Path(__file__).with_name("applications_zoo.py"), keep="MALINN_APPLICATIONS_ZOO")


@pytest.fixture(scope="session")
def keras_zoo(tmp_path_factory):
    """The Keras models of the converter tests, their files in every format and Keras's outputs.

    Runs ``python3 tests/keras_zoo.py DIR`` once per test run (about 15 s) and returns a
    ``keras_zoo.ZooIndex``. ``MALINN_KERAS_ZOO=DIR`` reuses (or fills) a zoo kept in ``DIR``; a
    zoo made elsewhere runs without TensorFlow (on a GPU machine or a board that has none). Tests
    that need it are skipped when there is neither TensorFlow nor such a zoo.
    """
    kept = os.environ.get("MALINN_KERAS_ZOO")
    folder = Path(kept) if kept else shared_folder(tmp_path_factory, "keras_zoo")
    folder.mkdir(parents=True, exist_ok=True)
    with exclusive(folder / ".building"):  # one xdist worker builds it, the others wait and read it
        return _filled_keras_zoo(folder)


def _filled_keras_zoo(folder: Path):
    """The zoo in ``folder``, built there first unless its manifest (written last) is there."""
    from keras_zoo import ZooIndex

    if (folder / "manifest.json").is_file():
        return ZooIndex(folder)
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip(
            "tensorflow is not installed (pip install tensorflow-cpu tf-keras scikit-learn, "
            "or bash .ci/setup --test): the Keras reference models cannot be built"
        )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    try:
        proc = subprocess.run(
            [sys.executable, str(ZOO_SCRIPT), str(folder)], capture_output=True, text=True, env=env, timeout=900
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"tests/keras_zoo.py did not finish in {exc.timeout} s")
    if proc.returncode != 0 or not (folder / "manifest.json").is_file():
        pytest.fail(
            f"tests/keras_zoo.py {folder} failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
        )
    return ZooIndex(folder)
