"""The device layer: enumeration, probing, choice by variable or API, broken platforms skipped."""

import importlib.util
import os
import subprocess
import sys
import warnings

import pytest

import malinn
from malinn.backends import opencl as device_module
from malinn.backends import selection as device_selection
from malinn.choice import kernel_call
from malinn.errors import DeviceError, KernelBuildError
from malinn.library.kernel_library import load_library


def test_devices_are_listed_with_their_figures():
    found = malinn.devices()
    assert found, "no working OpenCL device"
    for d in found:
        info = d.describe()
        assert info["name"] and info["type"] in ("GPU", "CPU", "ACCELERATOR", "CUSTOM")
        assert d.compute_units >= 1 and d.global_memory > 0 and 0 < d.max_allocation <= d.global_memory
        assert d.opencl_c_version.startswith("OpenCL C" if d.backend == "opencl" else "GLSL ES")
        assert d.name in str(d)


def test_a_device_reads_as_a_short_repr_and_prints_as_its_devices_line():
    """``print(malinn.devices())`` printed every field of every device (a screenful each): a device's
    repr is its index, name, type and backend, and its str the line ``malinn devices`` prints."""
    found = malinn.devices()
    for d in found:
        assert repr(d) == f"<Device {d.index[0]}:{d.index[1]} {d.name!r} {d.type} {d.backend}>"
        assert str(d).startswith(
            f"[{d.index[0]}:{d.index[1]}] {d.name} ({d.type}, {d.platform}): {d.compute_units} compute units, "
        )
    assert repr(found) == "[" + ", ".join(repr(d) for d in found) + "]"


def test_default_is_first_gpu_else_cpu():
    found = malinn.devices()
    gpus = [d for d in found if d.kind == "gpu"]
    expected = gpus[0] if gpus else next(d for d in found if d.kind == "cpu")
    script = "import malinn; print(malinn.get_device().index)"
    env = {k: v for k, v in os.environ.items() if k != "MALINN_DEVICE"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(expected.index)


@pytest.mark.parametrize(
    "spec_of", [lambda d: d.kind, lambda d: f"{d.index[0]}:{d.index[1]}", lambda d: d.name[:6].lower(), lambda d: d]
)
def test_set_device_accepts_kind_index_name_and_object(spec_of):
    target = malinn.devices()[-1]
    previous = malinn.get_device()
    try:
        chosen = malinn.set_device(spec_of(target))
        assert chosen.kind == target.kind and malinn.get_device() is chosen
    finally:
        malinn.set_device(previous)


@pytest.mark.parametrize(
    "spec, fragment",
    [("7:7", "platform:device 7:7"), ("no-such-device-name", "matches"), ("accelerator", "no working ACCELERATOR")],
)
def test_bad_choices_name_the_working_devices(spec, fragment):
    if spec == "accelerator" and any(d.kind == "accelerator" for d in malinn.devices()):
        pytest.skip("this machine has an accelerator device")
    with pytest.raises(DeviceError, match=fragment) as info:
        malinn.set_device(spec)
    assert malinn.devices()[0].name in str(info.value)


def test_malinn_device_variable_chooses_and_reports_mistakes():
    d = malinn.devices()[-1]
    script = "import malinn; print(malinn.get_device().index)"
    out = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "MALINN_DEVICE": f"{d.index[0]}:{d.index[1]}"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == str(d.index)
    bad = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, "MALINN_DEVICE": "9:9"}, capture_output=True, text=True
    )
    assert bad.returncode != 0 and "MALINN_DEVICE='9:9'" in bad.stderr and "DeviceError" in bad.stderr


def test_a_broken_icd_entry_does_not_crash_listing(tmp_path):
    """A vendors folder with a real driver beside an entry that is not an OpenCL library."""
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    for folder in ("/etc/OpenCL/vendors", os.environ.get("OCL_ICD_VENDORS", "")):
        if folder and os.path.isdir(folder):
            for entry in os.listdir(folder):
                (vendors / entry).write_text(open(os.path.join(folder, entry)).read())
    (vendors / "broken.icd").write_text("libm.so.6\n")
    (vendors / "missing.icd").write_text("/nonexistent/libOpenCL-driver.so\n")
    out = subprocess.run(
        [sys.executable, "-c", "import malinn; print(len(malinn.devices()))"],
        env={**os.environ, "OCL_ICD_VENDORS": str(vendors)},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) >= 1


def test_a_device_failing_its_probe_is_skipped_with_a_warning(monkeypatch):
    """Fault injection: the first device's probe raises; listing warns, names it and goes on."""
    real_probe = device_module.probe
    calls = []

    def probe(cl, platform, cl_device, index):
        calls.append(index)
        if len(calls) == 1:
            raise DeviceError("injected probe failure")
        return real_probe(cl, platform, cl_device, index)

    monkeypatch.setattr(device_module, "probe", probe)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = device_module.discover()
    assert len(found) == len(calls) - 1
    assert any(
        "skipping OpenCL device 0:0" in str(w.message) and "injected probe failure" in str(w.message) for w in caught
    )


def test_cli_style_listing_runs():
    out = subprocess.run(
        [sys.executable, "-c", "import malinn; print(malinn.devices())"], capture_output=True, text=True, check=True
    )
    assert "Device(" in out.stdout or "[" in out.stdout


needs_tensorflow = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None,
    reason="tensorflow is not installed (the test extra installs tensorflow-cpu)",
)
TF_FIRST = """
import sys, tensorflow, malinn
found = malinn.devices()
print("devices:", [d.platform for d in found])
try:
    print("current:", malinn.get_device().platform)
except malinn.DeviceError as exc:
    print("DeviceError:", exc)
"""
TF_AFTER_POCL = """
import numpy as np, malinn
device = malinn.get_device()
import tensorflow
model = malinn.Sequential([malinn.layers.Dense(7)])
try:
    model.predict(np.ones((3, 5), dtype=np.float32))
    print("predicted")
except malinn.errors.KernelBuildError as exc:
    print("KernelBuildError:", exc)
print("devices after:", [d.platform for d in malinn.devices(refresh=True)])
"""
HINT = "PoCL cannot share a process with it"


def run_with_tensorflow(script):
    """Runs ``script`` with TensorFlow in a process of its own; Mesa's OpenGL drivers stay unloaded
    there (MALINN_GL=0: their LLVM, like PoCL's, crashes a later TensorFlow import)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "MALINN_BINARY_CACHE": "0", "MALINN_GL": "0"}
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)


@needs_tensorflow
def test_tensorflow_imported_first_skips_pocl_with_the_hint_instead_of_crashing():
    out = run_with_tensorflow(TF_FIRST)
    assert out.returncode == 0, f"exit {out.returncode} (a negative code is a signal):\n{out.stderr[-3000:]}"
    pocl = any("Portable Computing Language" in d.platform for d in malinn.devices())
    others = [d for d in malinn.devices() if "Portable Computing Language" not in d.platform and d.backend == "opencl"]
    assert "Portable Computing Language" not in out.stdout.split("current:")[0]
    if pocl:
        assert HINT in out.stderr and "run TensorFlow in another process" in out.stderr
    if not others:
        assert "DeviceError:" in out.stdout and HINT in out.stdout  # get_device() says why nothing is left
    else:  # NVIDIA's driver and the like stay usable
        assert "current:" in out.stdout and "DeviceError" not in out.stdout


@needs_tensorflow
def test_tensorflow_imported_after_pocl_refuses_new_builds_with_the_hint():
    if not any("Portable Computing Language" in d.platform for d in malinn.devices()):
        pytest.skip("no PoCL device here")
    script = (
        TF_AFTER_POCL
        if malinn.get_device().platform.startswith("Portable")
        else TF_AFTER_POCL.replace("malinn.get_device()", "malinn.set_device('Portable Computing Language')")
    )
    out = run_with_tensorflow(script)
    assert out.returncode == 0, f"exit {out.returncode} (a negative code is a signal):\n{out.stderr[-3000:]}"
    assert "KernelBuildError:" in out.stdout and HINT in out.stdout
    assert "devices after:" in out.stdout and "Portable" not in out.stdout.split("devices after:")[1]
    assert HINT in out.stderr


def test_a_cold_build_prints_nothing(tmp_path):
    """A first predict that builds its programs from source (no binary, PoCL's kernel cache empty)
    leaves stderr empty: PoCL's compiler printed "3 warnings generated" (its float16 built-ins on a
    CPU without AVX-512) for the batch-1 kernels of a wide layer before builds passed -w."""
    if not any(d.backend == "opencl" for d in malinn.devices()):
        pytest.skip("no OpenCL device")
    script = (
        "import numpy as np, malinn\n"
        "from malinn.layers import Dense\n"
        "m = malinn.Sequential([Dense(2500, activation='relu'), Dense(10, activation='softmax')])\n"
        "m.build((None, 784))\n"
        "for batch in (1, 7):\n"
        "    m.predict(np.ones((batch, 784), np.float32))\n"
    )
    env = {
        **os.environ,
        "MALINN_GL": "0",
        "MALINN_CACHE_DIR": str(tmp_path / "cache"),
        "POCL_CACHE_DIR": str(tmp_path / "pocl"),
        "MALINN_PROGRESS": "0",
    }  # the compiler's output, not malinn's report
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr == "", out.stderr[-3000:]


def test_a_build_log_is_kept_from_the_user_as_a_debug_record_not_a_warning(monkeypatch, caplog):
    """pyopencl's Program.build turns a non-empty build log into a CompilerWarning, and NVIDIA's
    driver logs a line for every kernel, "-w" or not: malinn builds through the call underneath,
    which warns of nothing, and hands the log to its logger at debug level."""
    import warnings

    from malinn.backends import opencl

    devices = [d for d in malinn.devices() if d.backend == "opencl"]
    if not devices:
        pytest.skip("no OpenCL device")
    device = devices[0]
    cl = opencl.pyopencl_module()
    source = '#warning "malinn test warning"\n__kernel void k(__global float *x) { x[0] = 1.0f; }\n'
    raw = cl._cl._Program(device.context, source)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        # no -w: PoCL logs the directive; NVIDIA's driver (which leaves it out) its note on every kernel
        log = opencl.build_quietly(raw, device.cl_device, ["-DMALINN_QUIET=1"])
        assert log
        # through the device: a log (what NVIDIA's driver writes) reaches the debug record only
        monkeypatch.setattr(opencl, "build_log", lambda raw, cl_device: "the driver said something")
        with caplog.at_level("DEBUG", logger="malinn.backends.opencl"):
            program = device.compile(source.replace("k(", "k2("), origin="the log test")
    assert program.k2 is not None
    assert any(
        "the log test" in r.getMessage() and "the driver said something" in r.getMessage() for r in caplog.records
    ), caplog.records


def test_malinn_cl_options_reach_every_build_and_key_its_programs(monkeypatch):
    """``MALINN_CL_OPTIONS`` is added to every OpenCL build, and a program built with it is not
    the program a build without it gets (the device's memo and the kernel library's key on it)."""
    devices = [d for d in malinn.devices() if d.backend == "opencl"]
    if not devices:
        pytest.skip("no OpenCL device")
    device = devices[0]
    source = (
        "#ifndef MALINN_TEST_OPTION\n#error the option did not reach the build\n#endif\n"
        "__kernel void k(__global float *x) { x[get_global_id(0)] = MALINN_TEST_OPTION; }\n"
    )
    monkeypatch.setenv("MALINN_CL_OPTIONS", "-DMALINN_TEST_OPTION=2 -cl-opt-disable")
    assert device.extra_build_options() == ("-DMALINN_TEST_OPTION=2", "-cl-opt-disable")
    with_option = device.compile(source, origin="the options test")
    spec = load_library()["bias_add"]
    layouts = {name: "C" for name in spec.matrices}
    chosen = kernel_call.program_for(spec, device, layouts)
    monkeypatch.delenv("MALINN_CL_OPTIONS")
    assert device.extra_build_options() == ()
    with pytest.raises(KernelBuildError, match="the option did not reach the build"):
        device.compile(source, origin="the options test")
    assert kernel_call.program_for(spec, device, layouts) is not chosen
    monkeypatch.setenv("MALINN_CL_OPTIONS", "-DMALINN_TEST_OPTION=2 -cl-opt-disable")
    assert device.compile(source, origin="the options test") is with_option


def test_a_kernel_that_does_not_build_for_a_layer_names_the_layer_and_its_shapes(monkeypatch):
    """A build that fails while a model is planned says whose step it was and the matrices it was
    built for, beside the driver's log (a define that breaks every kernel: an unknown type)."""
    devices = [d for d in malinn.devices() if d.backend == "opencl"]
    if not devices:
        pytest.skip("no OpenCL device")
    model = malinn.Sequential([malinn.layers.Dense(5, activation="relu", name="my_dense")])
    model.build((None, 3))
    monkeypatch.setenv("MALINN_CL_OPTIONS", "-Dfloat=malinn_undefined_type")
    with pytest.raises(KernelBuildError) as info:
        model.plan(2, devices[0])
    text = str(info.value)
    assert "layer 'my_dense'" in text and "padded to" in text and "malinn_undefined_type" in text, text


def test_asking_for_gl_without_moderngl_says_how_to_install_it(monkeypatch):
    """The wheel without its ``gl`` extra: ``--device gl`` names the missing package and the extra."""
    opencl_only = [d for d in malinn.devices() if d.backend == "opencl"]
    monkeypatch.setattr(device_selection.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DeviceError, match=r"no working gl device; .*need moderngl.*pip install 'malinn\[gl\]'"):
        device_selection.match("gl", opencl_only)
