"""predict over two devices of one model and driver (two identical GPUs of a host): they share
an identity (the key of every on-disk cache and setting) but not a context, so each plan binds
weight and vector buffers of its own device's context and the results equal one device's."""

import numpy as np
import pytest
from support import assert_close, dense_forward

import malinn
from malinn import Sequential
from malinn.backends import opencl as opencl_backend
from malinn.backends import selection
from malinn.layers import BatchNormalization, Dense


def twin_of(device, monkeypatch):
    """A second device object on ``device``'s OpenCL device (a context and queue of its own, the
    same identity, as the second of two identical GPUs has), listed among the working devices."""
    if device.backend != "opencl":
        pytest.skip(f"{device.name}: a twin is made on an OpenCL device (this one is {device.backend})")
    import pyopencl as cl

    twin = opencl_backend.probe(cl, device.cl_device.platform, device.cl_device, (device.index[0], 99))
    assert twin.identity == device.identity and twin.context != device.context
    monkeypatch.setattr(selection, "_devices", [*malinn.devices(), twin])
    return twin


@pytest.mark.parametrize("n", [1, 13, 1001])
def test_twin_devices_bind_buffers_of_their_own_context(device, monkeypatch, n):
    twin = twin_of(device, monkeypatch)
    rng = np.random.default_rng(n)
    model = Sequential([Dense(29, activation="relu"), BatchNormalization(), Dense(5)])
    model.build((None, 37))
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.3 + 1 for w in model.get_weights()])
    w = model.get_weights()
    gamma, beta, mean, var = w[2:6]
    scale = gamma / np.sqrt(var + 1e-3)

    def reference(x):
        h = dense_forward(x, [(w[0], w[1], "relu")])
        return dense_forward((h - mean) * scale + beta, [(w[6], w[7], "linear")])

    x = rng.standard_normal((n, 37)).astype(np.float32)
    assert_close(model.predict(x, verbose=0), reference(x))  # the first device's copies first
    y = model.predict(x, batch_size=max(1, -(-n // 2)), devices=[device, twin], verbose=0)
    assert_close(y, reference(x))
    assert_close(model.predict(x, devices=twin, verbose=0), reference(x))
    held = 0
    for layer in model.layers:
        for key, copy in layer.device_copies.items():
            owner, buffer = key[0], getattr(copy, "buffer", copy)
            assert owner in (device, twin), key
            assert buffer.context == owner.context, f"layer {layer.name!r}: {key[1:]} is in another device's context"
            held += owner is twin
    assert held >= 3  # both kernels and the normalization's vectors on the twin too
