"""Numpy references for the kernels: the formulas the tests hold malinn to."""

import numpy as np

ACTIVATIONS = {
    "linear": lambda x: x,
    "relu": lambda x: np.where(x < 0, 0.0, x),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
}


def softmax(x, axis):
    z = np.exp(x - x.max(axis=axis, keepdims=True))
    return z / z.sum(axis=axis, keepdims=True)


def activation(name, x, axis=-1):
    """Reference activation; softmax runs over ``axis`` (the feature axis)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return softmax(x, axis) if name == "softmax" else ACTIVATIONS[name](x)


def dense_forward(x, layers):
    """A numpy forward pass: layers is a list of (kernel, bias or None, activation)."""
    h = np.asarray(x, dtype=np.float64)
    for kernel, bias, act in layers:
        h = h @ kernel.astype(np.float64)
        if bias is not None:
            h = h + bias
        h = activation(act, h, axis=-1)
    return h


def assert_close(got, want, rtol=1e-5):
    """Max |got - want| <= rtol * max(1, max |want|), with NaN where want has NaN."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    if finite.any():
        scale = max(1.0, float(np.abs(want[finite]).max()))
        err = float(np.abs(got[finite] - want[finite]).max())
        assert err <= rtol * scale, f"max abs error {err:.3g} > {rtol:g} x {scale:.3g}"
