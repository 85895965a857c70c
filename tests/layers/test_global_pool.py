"""Global pooling by work-groups (kernels/global_pool.cl: ``global_pool``, ``global_pool_sliced``)
against numpy on odd and large shapes (1, 3, 13, 1001 and 4096 pixels, channels and images;
EfficientNetB0's first squeeze, 112 x 112 x 32, at batch 4), in every configuration the library
lists, after a convolution (its layout and padding) and with NaN and infinities; and which kernel
the library gives a global pooling on each kind of device; on the OpenGL backend their GLSL twin
(kernels/gl/global_pool.comp)."""

import numpy as np
import pytest
from keras_zoo import FORMATS
from support import conv2d_reference, depthwise_reference

import malinn
from malinn import Functional, Input, ops
from malinn.errors import LibraryError
from malinn.layers import (
    Conv2D,
    Dense,
    DepthwiseConv2D,
    GlobalAveragePooling1D,
    GlobalAveragePooling2D,
    GlobalMaxPooling2D,
    Multiply,
)
from malinn.library.kernel_library import load_library

pytestmark = pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)

LIB = load_library()
U = 2.0**-24  # float32's unit roundoff

#: (batch, height, width, channels)
SHAPES = [
    (1, 1, 1, 1),
    (3, 13, 1, 1001),
    (13, 3, 1, 13),
    (1, 1, 1001, 3),
    (2, 64, 64, 13),
    (4, 112, 112, 32),
    (1001, 1, 3, 5),
    (4096, 1, 1, 3),
    (1, 7, 7, 4096),
]
#: the shapes every configuration of the entries runs (their defaults run every shape)
CONFIG_SHAPES = [(3, 13, 1, 1001), (2, 64, 64, 13), (4, 112, 112, 32)]


def _configurations():
    """(codename, defines or None for the entry's own) of every configuration of the new entries."""
    found = []
    for codename in ("global_pool", "global_pool_sliced"):
        spec = LIB[codename]
        for config in spec.configurations():
            tuned = {k: config[k] for k in ("LC", "LP", "SLICES", "UNROLL")}
            found.append((codename, None if config == dict(spec.defines) else tuned))
    return found


CASES = [(shape, codename, None) for shape in SHAPES for codename in ("global_pool", "global_pool_sliced")]
CASES += [(shape, codename, config) for shape in CONFIG_SHAPES for codename, config in _configurations() if config]


def _expected_kernel(device, codename, pixels):
    """The kernel the plan runs for ``use("pool", codename)``: the sliced one takes images of 2048
    pixels or more (its constraints), the others fall to the library's defaults for the device."""
    if codename == "global_pool_sliced" and pixels < 2048:
        defaults = [s.codename for s in LIB.default_specs("pool", device.kind, device.backend)]
        return next(name for name in defaults if name != "global_pool_sliced")  # a GPU's next: global_pool
    return codename


def _predict(device, layer, x, codename, config):
    ops.use("pool", codename, device, config)
    model = malinn.Sequential([layer])
    model.build((None,) + x.shape[1:])
    steps = [s for s in model.plan(x.shape[0], device).steps if s.kind.name == "pool"]
    return model.predict(x, batch_size=x.shape[0]), steps[0].spec.codename


def assert_mean(got, x):
    """``got`` is the mean over axes 1, 2 of ``x`` within the error any float32 summation order
    may make: (n - 1) u sum|x| / n for the sum of n terms, then the division's rounding."""
    x64 = x.astype(np.float64)
    want = x64.mean(axis=(1, 2))
    n = x.shape[1] * x.shape[2]
    bound = 1.01 * (max(n - 1, 0) * U * np.abs(x64).mean(axis=(1, 2)) + 2 * U * np.abs(want)) + 1e-30
    error = np.abs(got.astype(np.float64) - want)
    assert (error <= bound).all(), f"largest error {error.max()} where the bound is {bound[error > bound].min()}"


@pytest.mark.parametrize("shape, codename, config", CASES, ids=str)
def test_global_pooling_matches_numpy(device, rng, shape, codename, config):
    # offset from 0, so that a pixel counted twice or left out moves the mean by far more than rounding
    x = (rng.standard_normal(shape) + 1.0).astype(np.float32)
    mean, ran = _predict(device, GlobalAveragePooling2D(), x, codename, config)
    assert ran == _expected_kernel(device, codename, shape[1] * shape[2])
    assert_mean(mean, x)
    maximum, ran = _predict(device, GlobalMaxPooling2D(keepdims=True), x, codename, config)
    np.testing.assert_array_equal(maximum, x.max(axis=(1, 2), keepdims=True))


@pytest.mark.parametrize("codename", ["global_pool", "global_pool_sliced"])
def test_nan_and_infinities_as_reduce_max(device, codename):
    """GlobalMaxPooling is TensorFlow's reduce_max: a NaN gives NaN wherever it lies (here in a late
    slice), a channel of -inf gives -inf, an inf gives inf; the mean sums them as IEEE does."""
    x = np.ones((2, 64, 48, 5), np.float32)
    x[1, 50, 40, 0] = np.nan
    x[:, :, :, 1] = -np.inf
    x[0, 63, 47, 2] = np.inf
    x[1, 3, 5, 3] = -np.inf
    maximum, _ = _predict(device, GlobalMaxPooling2D(), x, codename, None)
    np.testing.assert_array_equal(maximum, x.max(axis=(1, 2)))
    mean, _ = _predict(device, GlobalAveragePooling2D(), x, codename, None)
    np.testing.assert_array_equal(np.isnan(mean), np.isnan(x.mean(axis=(1, 2))))
    finite = np.isfinite(x.mean(axis=(1, 2)))
    np.testing.assert_array_equal(mean[~finite], x.mean(axis=(1, 2))[~finite])
    np.testing.assert_allclose(mean[finite], x.mean(axis=(1, 2))[finite], rtol=1e-6)


@pytest.mark.parametrize("codename", ["global_pool", "global_pool_sliced"])
def test_squeeze_after_a_convolution(device, rng, codename):
    """A squeeze as in a squeeze-and-excitation block: a convolution (its layout and padded rows),
    the global mean (R's rows padded to the work-group's channels, written as 0) and a Dense layer
    reading those padded rows."""
    ops.use("pool", codename, device)
    x = rng.standard_normal((3, 48, 48, 5)).astype(np.float32)
    conv, dense = Conv2D(13, 3, padding="same", activation="relu"), Dense(3)
    model = malinn.Sequential([conv, GlobalAveragePooling2D(), dense])
    model.build((None,) + x.shape[1:])
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.5 for w in model.get_weights()])
    kernel, bias, weights, dense_bias = model.get_weights()
    hidden = np.maximum(conv2d_reference(x, kernel, bias, padding="same"), 0.0).mean(axis=(1, 2))
    np.testing.assert_allclose(model.predict(x), hidden @ weights + dense_bias, rtol=1e-4, atol=1e-4)


def test_global_average_pooling_1d(device, rng):
    """A sequence's mean (an image of height 1) of 4096 steps in the sliced kernel."""
    ops.use("pool", "global_pool_sliced", device)
    x = (rng.standard_normal((3, 4096, 13)) + 1.0).astype(np.float32)
    model = malinn.Sequential([GlobalAveragePooling1D()])
    model.build((None,) + x.shape[1:])
    assert [s.spec.codename for s in model.plan(3, device).steps if s.kind.name == "pool"] == ["global_pool_sliced"]
    assert_mean(model.predict(x), x[:, None])


def test_library_chooses_global_pool_on_gpus():
    """GPUs (OpenCL and OpenGL: global_pool.comp) take the sliced kernel for images of 2048 pixels
    or more, then global_pool, then pool; CPUs keep pool (PoCL ran it faster at small images:
    benchmarks/results/global_pool_pocl_cpu.json; llvmpipe is a CPU too)."""
    names = lambda kind, backend: [s.codename for s in LIB.default_specs("pool", kind, backend)]  # noqa: E731
    assert names("gpu", "opencl") == ["global_pool_sliced", "global_pool", "pool"]
    assert names("gpu", "gl") == ["global_pool_sliced", "global_pool", "pool"]
    assert names("cpu", "opencl") == ["pool"]
    assert names("cpu", "gl") == ["pool"]


@pytest.mark.parametrize("codename", ["global_pool", "global_pool_sliced"])
def test_window_pooling_is_refused(codename):
    """The work-group kernels compute a whole image's window only: a 2 x 2 window is refused (the
    plan then takes pool), as is a small image for the sliced kernel."""
    window = {"IH": 64, "IW": 64, "OH": 32, "OW": 32, "KH": 2, "KW": 2, "SH": 2, "SW": 2, "PT": 0, "PL": 0}
    with pytest.raises(LibraryError, match="breaks"):
        LIB[codename].configure(window)
    small = {"IH": 7, "IW": 7, "OH": 1, "OW": 1, "KH": 7, "KW": 7, "SH": 1, "SW": 1, "PT": 0, "PL": 0}
    if codename == "global_pool_sliced":
        with pytest.raises(LibraryError, match="2048"):
            LIB[codename].configure(small)
    else:
        assert LIB[codename].configure(small).config["IH"] == "7"


@pytest.mark.parametrize("codename", ["global_pool"])
@pytest.mark.parametrize("key", ["cnn", "cnn_odd"])
def test_keras_models_match_in_the_work_group_kernel(keras_zoo, device, codename, key):
    """The Keras zoo's convolutional networks ending in GlobalAveragePooling2D (``cnn``) and
    GlobalMaxPooling2D (``cnn_odd``) give Keras's outputs (within 1e-5 of their scale) with their
    global pooling in ``global_pool`` (their images are far below the sliced kernel's 2048 pixels)."""
    fmt = next(iter(FORMATS))
    ops.use("pool", codename, device)
    model = malinn.load_model(keras_zoo.path(fmt, key))
    data = keras_zoo.data(fmt, key)
    assert codename in {s.spec.codename for s in model.plan(7, device).steps if s.kind.name == "pool"}
    want = np.asarray(data["y"][:7], np.float64)
    got = model.predict(data["x"][:7])
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))


@pytest.mark.parametrize("codename", ["global_pool", "global_pool_sliced"])
def test_squeeze_and_excitation_block(device, rng, codename):
    """EfficientNet's squeeze-and-excitation block as a graph: a depthwise convolution, its global
    mean kept as 1 x 1 x 144 (R's 144 rows padded to the work-group's 32-channel multiple), two 1 x 1
    convolutions reading it, and the excitation multiplied back over the image."""
    ops.use("pool", codename, device)
    x = rng.standard_normal((2, 48, 48, 144)).astype(np.float32)
    inputs = Input(x.shape[1:])
    features = DepthwiseConv2D(3, padding="same", activation="swish")(inputs)
    squeezed = GlobalAveragePooling2D(keepdims=True)(features)
    reduced = Conv2D(6, 1, activation="swish")(squeezed)
    excited = Conv2D(144, 1, activation="sigmoid")(reduced)
    model = Functional(inputs, Multiply()([features, excited]))
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.3 for w in model.get_weights()])
    assert codename in {s.spec.codename for s in model.plan(2, device).steps if s.kind.name == "pool"}
    kernel, bias, w1, b1, w2, b2 = model.get_weights()
    swish = lambda v: v / (1.0 + np.exp(-v))  # noqa: E731
    f = swish(depthwise_reference(x, kernel, bias, padding="same"))
    s = swish(f.mean(axis=(1, 2), keepdims=True) @ w1[0, 0] + b1)
    e = 1.0 / (1.0 + np.exp(-(s @ w2[0, 0] + b2)))
    np.testing.assert_allclose(model.predict(x), f * e, rtol=1e-4, atol=1e-5)
