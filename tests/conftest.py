"""Shared fixtures: every device test runs once per working OpenCL device."""

import numpy as np
import pytest

import malinn
from malinn import ops

DEVICES = malinn.devices()


def pytest_report_header(config):
    return ["malinn devices: " + ("; ".join(str(d) for d in DEVICES) or "none")]


@pytest.fixture(params=DEVICES or [None], ids=lambda d: d.name if d is not None else "no-device")
def device(request):
    """Each working device in turn, set as the current device; matmul settings restored after."""
    if request.param is None:
        pytest.fail("no working OpenCL device: run `bash .ci/setup` (it installs pocl-opencl-icd)")
    previous = malinn.get_device()
    malinn.set_device(request.param)
    saved = {k: dict(v) for k, v in ops._settings.items()}
    yield request.param
    ops._settings.clear()
    ops._settings.update(saved)
    malinn.set_device(previous)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)

