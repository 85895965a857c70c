"""Device matrices: uploads and downloads, zero-copy on host-unified devices."""

import os
import subprocess
import sys

import numpy as np
import pytest

from malinn.backends.opencl import zero_copy_enabled as zero_copy
from malinn.choice.matrix import DeviceMatrix
from malinn.library.layout import Layout


@pytest.mark.parametrize("layout", ["R", "C", "C_4_2_C", "R_16_16_C_4_4_R"])
@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (13, 7)], ids=str)
def test_round_trip_in_every_layout(device, layout, shape, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    m = DeviceMatrix.upload(device, x, layout, Layout.parse(layout).padded_shape(*shape))
    m.host = None
    got = m.numpy()
    np.testing.assert_array_equal(got, x)
    got[...] = 0  # the host copy owns its memory: no view of a released map
    m.host = None
    np.testing.assert_array_equal(m.numpy(), x)


def test_host_unified_devices_map_instead_of_copying(device, rng):
    before = device.counters.get("zero_copy", 0)
    m = DeviceMatrix.upload(device, rng.standard_normal((4, 4)).astype(np.float32), "R")
    m.host = None
    m.numpy()
    mapped = device.counters.get("zero_copy", 0) - before
    assert zero_copy(device) == device.host_unified_memory
    assert mapped == (2 if device.host_unified_memory else 0)


def test_zero_copy_can_be_turned_off_and_results_agree():
    script = (
        "import numpy as np, malinn; m = malinn.load_model('examples/digits_mlp.keras');"
        "y = m.predict(np.load('examples/digits_test.npz')['x']); np.save('/dev/stdout', y[:3])"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outs = []
    for flag in ("1", "0"):
        out = subprocess.run(
            [sys.executable, "-c", script],
            cwd=root,
            capture_output=True,
            timeout=300,
            env={**os.environ, "MALINN_ZERO_COPY": flag},
        )
        assert out.returncode == 0, out.stderr.decode()
        outs.append(out.stdout)
    assert outs[0] == outs[1]
