"""malinn/environment.py: the switches read one way, a value malinn does not read refused by name."""

import pytest

from malinn.backends import opengl
from malinn.environment import switch
from malinn.errors import MalinnError, SettingError


@pytest.mark.parametrize(
    "value,expected",
    [
        ("1", True),
        ("true", True),
        (" Yes ", True),
        ("ON", True),
        ("0", False),
        ("false", False),
        ("no", False),
        (" off", False),
        ("", "default"),
        ("  ", "default"),
    ],
)
def test_a_switch_reads_every_spelling_of_on_and_off(monkeypatch, value, expected):
    monkeypatch.setenv("MALINN_SOME_SWITCH", value)
    assert switch("MALINN_SOME_SWITCH", "default") == expected


def test_an_unset_switch_keeps_its_default(monkeypatch):
    monkeypatch.delenv("MALINN_SOME_SWITCH", raising=False)
    assert switch("MALINN_SOME_SWITCH", True) is True and switch("MALINN_SOME_SWITCH", None) is None


@pytest.mark.parametrize("value", ["flase", "2", "disabled"])
def test_a_value_malinn_does_not_read_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv("MALINN_GL", value)
    with pytest.raises(SettingError, match=f"MALINN_GL='{value}': expected 1 or 0") as info:
        opengl.wanted([])  # where MALINN_GL=false once looked for OpenGL devices (Mesa loaded)
    assert isinstance(info.value, MalinnError) and isinstance(info.value, ValueError)


def test_malinn_gl_false_keeps_the_opengl_devices_unlisted(monkeypatch):
    monkeypatch.setenv("MALINN_GL", "false")
    assert opengl.wanted([]) is False and opengl.discover([]) == []


@pytest.mark.parametrize("given", ["-DMWG=3", "-D MWG=3", "-UMWG -cl-opt-disable"])
def test_cl_options_that_redefine_a_kernels_define_are_refused(monkeypatch, given):
    """MALINN_CL_OPTIONS comes after a kernel's own defines, so ``-DMWG=3`` replaced the configuration
    the launch was sized for: wrong results with no word. Refused, naming the define."""
    import malinn

    device = next((d for d in malinn.devices() if d.backend == "opencl"), None)
    if device is None:
        pytest.skip("no OpenCL device")
    source = "__kernel void k(__global float *x) { x[get_global_id(0)] = MWG + OTHER; }"
    monkeypatch.setenv("MALINN_CL_OPTIONS", given)
    with pytest.raises(
        SettingError, match=f"MALINN_CL_OPTIONS='{given}' sets MWG, which probe.cl takes from its configuration"
    ):
        device.compile(source, ("-DMWG=64", "-DOTHER=1"), origin="probe.cl")
    monkeypatch.setenv("MALINN_CL_OPTIONS", "-DUNRELATED=2 -cl-opt-disable")  # a define no kernel takes: built
    assert device.compile(source, ("-DMWG=64", "-DOTHER=1"), origin="probe.cl") is not None


@pytest.mark.parametrize(
    "name", ["MALINN_BINARY_CACHE", "MALINN_PROBE_CACHE", "MALINN_ZERO_COPY", "MALINN_PINNED", "MALINN_PROGRESS"]
)
def test_a_bad_switch_is_refused_before_any_device_is_probed(tmp_path, name):
    """Read inside a probe, a bad value only failed that device, and the model ran on the next one
    (llvmpipe, Mesa loaded); a switch some devices never read (MALINN_PINNED on a CPU) was accepted."""
    import os
    import subprocess
    import sys

    script = (
        "import malinn\ntry:\n    malinn.get_device()\nexcept malinn.SettingError as e:\n    print('refused', e)\n"
        "try:\n    malinn.devices()\nexcept malinn.SettingError as e:\n    print('refused', e)\n"
    )
    env = {**os.environ, name: "bogus", "MALINN_CACHE_DIR": str(tmp_path), "PYTHONWARNINGS": "default"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.count(f"refused {name}='bogus'") == 2, out.stdout + out.stderr
    assert "skipping" not in out.stderr, out.stderr
