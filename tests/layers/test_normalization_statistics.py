"""LayerNormalization of samples whose mean and variance float32 computes badly, against Keras.

Each row of the zoo's ``ln_statistics_*`` data (tests/keras_zoo.py) is one sample: constant ones
(1e10, 65504, 1e4, 3e38...), offset ones (1e4 + noise), huge ones (1e18, 1e30 times noise) and
plain ones, over 1, 3, 13, 1001 and 4096 features, gamma and beta random, with and without
rms_scaling. Summed as they were, 16 x 1e10 had a mean one rounding step off and the variance
1024^2: malinn gave -1 where Keras gives 0 (65504: -0.054 on PoCL, where an fma contracted Keras's
x * inv + (beta - mean * inv)); with rms_scaling 9.77e6 for Keras's 3.16e11.

Each sample must equal Keras's (within 1e-5 of max(1, |y|)) or be nearer the exact answer
(float64) than Keras's: Keras itself is off where its own float32 sums round (1001 x 1e10: its
mean is one step off, and it answers -1 x gamma for beta), where its x * inv and mean * inv cancel
(a constant 1e10 gives 0 for beta) or overflow (3e38 x 31.6: NaN for beta).
"""

from __future__ import annotations

import numpy as np
import pytest
from keras_zoo import FORMATS, statistics_models

import malinn

#: one file per Keras generation: the statistics do not depend on the format
CASES = [
    pytest.param(fmt, key, id=f"{fmt}-{key}")
    for fmt in ("keras3-zip", "keras2-h5")
    for key in statistics_models(FORMATS[fmt][0])
]


def exact(x, weights, epsilon, rms):
    """The layer in float64: ``(x - mean) / sqrt(var + epsilon) * gamma + beta``, or with
    rms_scaling ``x / sqrt(var + epsilon) * gamma`` (Keras 3 subtracts the mean for the variance
    there too)."""
    x = x.astype(np.float64)
    mean, var = x.mean(axis=1, keepdims=True), x.var(axis=1, keepdims=True)
    with np.errstate(over="ignore", invalid="ignore"):
        if rms:
            return x / np.sqrt(var + epsilon) * weights[0]
        return (x - mean) / np.sqrt(var + epsilon) * weights[0] + weights[1]


def row_errors(got, want) -> np.ndarray:
    """Each row's max |got - want| over max(1, max |want|), want's finite values; a NaN or infinity
    against another value is an infinite error, the same one on both sides none."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    with np.errstate(invalid="ignore"):
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        diff = np.where(same, 0.0, np.abs(got - want))
    diff = np.where(np.isnan(diff), np.inf, diff)
    scale = np.maximum(1.0, np.max(np.where(np.isfinite(want), np.abs(want), 0.0), axis=1))
    return diff.max(axis=1) / scale


def check_rows(got, data, weights, epsilon, rms, what):
    keras, x = data["y"], data["x"]
    truth = exact(x, weights, epsilon, rms)
    with np.errstate(over="ignore"):
        truth32 = truth.astype(np.float32)  # what float32 can hold: 3e38 x 31.6 is inf
    to_keras, ours, theirs = row_errors(got, keras), row_errors(got, truth32), row_errors(keras, truth32)
    bad = [i for i in range(len(x)) if not (to_keras[i] <= 1e-5 or ours[i] <= theirs[i])]
    assert not bad, "; ".join(
        f"{what} sample {i} (x[:3] = {x[i, :3].tolist()}): malinn {got[i, :3].tolist()}, keras "
        f"{keras[i, :3].tolist()}, exact {truth32[i, :3].tolist()} (errors: malinn {ours[i]:.3g}, keras "
        f"{theirs[i]:.3g})"
        for i in bad[:4]
    )
    return ours, theirs


def layer_of(keras_zoo, fmt, key):
    entry = keras_zoo.require(fmt, key)
    config = entry["layers"][0]["config"]
    return keras_zoo.weights(fmt, key)[0], float(config.get("epsilon", 1e-3)), bool(config.get("rms_scaling"))


@pytest.mark.parametrize("fmt,key", CASES)
def test_layer_normalization_of_constant_offset_and_huge_samples_matches_keras(keras_zoo, device, fmt, key):
    weights, epsilon, rms = layer_of(keras_zoo, fmt, key)
    data = keras_zoo.data(fmt, key)
    got = malinn.load_model(keras_zoo.path(fmt, key)).predict(data["x"])
    ours, _ = check_rows(got, data, weights, epsilon, rms, f"{fmt} {key} on {device.name}")
    # a constant sample of a finite value: exactly beta (gamma x 31.6 x the value with rms_scaling),
    # as the exact answer rounds it, wherever float32 holds that answer
    constant = np.all(data["x"] == data["x"][:, :1], axis=1) & np.all(np.isfinite(got), axis=1)
    assert np.all(ours[constant] <= 1e-6), (key, ours[constant])


@pytest.fixture(scope="module")
def gles3():
    """A gles3 device (vertex kernels, transform feedback) on the first GL device's EGL device."""
    pytest.importorskip("moderngl", reason="the OpenGL backend's extra is not installed (pip install malinn[gl])")
    from malinn.backends import gl_feedback

    gl = [d for d in malinn.devices() if d.backend == "gl"]
    if not gl:
        pytest.skip("no working OpenGL device (EGL)")
    return gl_feedback.probe(gl[0].index[1])


@pytest.mark.parametrize("key", statistics_models("keras3"))
def test_layer_normalization_of_hard_samples_on_gles3(keras_zoo, gles3, key):
    """The gles3 backend's vertex kernel (llvmpipe standing in for such a GPU), same samples."""
    weights, epsilon, rms = layer_of(keras_zoo, "keras3-zip", key)
    data = keras_zoo.data("keras3-zip", key)
    model = malinn.load_model(keras_zoo.path("keras3-zip", key))
    got = model.plan(len(data["x"]), gles3).run([data["x"]])[0]
    check_rows(got, data, weights, epsilon, rms, f"{key} on gles3")
