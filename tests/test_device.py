"""The device layer: enumeration, probing, choice by variable or API, broken platforms skipped."""

import os
import subprocess
import sys
import warnings

import pytest

import malinn
from malinn import device as device_module
from malinn.errors import DeviceError


def test_devices_are_listed_with_their_figures():
    found = malinn.devices()
    assert found, "no working OpenCL device"
    for d in found:
        info = d.describe()
        assert info["name"] and info["type"] in ("GPU", "CPU", "ACCELERATOR", "CUSTOM")
        assert d.compute_units >= 1 and d.global_memory > 0 and 0 < d.max_allocation <= d.global_memory
        assert d.opencl_c_version.startswith("OpenCL C")
        assert d.name in str(d)


def test_default_is_first_gpu_else_cpu():
    found = malinn.devices()
    gpus = [d for d in found if d.kind == "gpu"]
    expected = gpus[0] if gpus else next(d for d in found if d.kind == "cpu")
    script = "import malinn; print(malinn.get_device().index)"
    env = {k: v for k, v in os.environ.items() if k != "MALINN_DEVICE"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(expected.index)


@pytest.mark.parametrize("spec_of", [lambda d: d.kind, lambda d: f"{d.index[0]}:{d.index[1]}",
                                     lambda d: d.name[:6].lower(), lambda d: d])
def test_set_device_accepts_kind_index_name_and_object(spec_of):
    target = malinn.devices()[-1]
    previous = malinn.get_device()
    try:
        chosen = malinn.set_device(spec_of(target))
        assert chosen.kind == target.kind and malinn.get_device() is chosen
    finally:
        malinn.set_device(previous)


@pytest.mark.parametrize("spec, fragment", [("7:7", "platform:device 7:7"), ("no-such-device-name", "matches"),
                                            ("accelerator", "no working ACCELERATOR")])
def test_bad_choices_name_the_working_devices(spec, fragment):
    if spec == "accelerator" and any(d.kind == "accelerator" for d in malinn.devices()):
        pytest.skip("this machine has an accelerator device")
    with pytest.raises(DeviceError, match=fragment) as info:
        malinn.set_device(spec)
    assert malinn.devices()[0].name in str(info.value)


def test_malinn_device_variable_chooses_and_reports_mistakes():
    d = malinn.devices()[-1]
    script = "import malinn; print(malinn.get_device().index)"
    out = subprocess.run([sys.executable, "-c", script], env={**os.environ, "MALINN_DEVICE": f"{d.index[0]}:{d.index[1]}"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(d.index)
    bad = subprocess.run([sys.executable, "-c", script], env={**os.environ, "MALINN_DEVICE": "9:9"},
                         capture_output=True, text=True)
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
    out = subprocess.run([sys.executable, "-c", "import malinn; print(len(malinn.devices()))"],
                         env={**os.environ, "OCL_ICD_VENDORS": str(vendors)}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) >= 1


def test_a_device_failing_its_probe_is_skipped_with_a_warning(monkeypatch):
    """Fault injection: the first device's probe raises; listing warns, names it and goes on."""
    real_probe = device_module._probe
    calls = []

    def probe(cl, platform, cl_device, index):
        calls.append(index)
        if len(calls) == 1:
            raise DeviceError("injected probe failure")
        return real_probe(cl, platform, cl_device, index)

    monkeypatch.setattr(device_module, "_probe", probe)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = device_module._enumerate()
    assert len(found) == len(calls) - 1
    assert any("skipping OpenCL device 0:0" in str(w.message) and "injected probe failure" in str(w.message)
               for w in caught)


def test_cli_style_listing_runs():
    out = subprocess.run([sys.executable, "-c", "import malinn; print(malinn.devices())"],
                         capture_output=True, text=True, check=True)
    assert "Device(" in out.stdout or "[" in out.stdout
