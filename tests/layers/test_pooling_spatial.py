"""Pooling and pixel-moving layers vs numpy on every working device, fed by a convolution (so they
read a kernel's layout and padding, not only the uploaded input) and straight from the input."""

import numpy as np
import pytest
from support import pool2d_reference

import malinn
from malinn.layers import (
    AveragePooling1D,
    AveragePooling2D,
    Conv2D,
    Cropping1D,
    Cropping2D,
    GlobalAveragePooling1D,
    GlobalAveragePooling2D,
    GlobalMaxPooling1D,
    GlobalMaxPooling2D,
    MaxPooling1D,
    MaxPooling2D,
    UpSampling1D,
    UpSampling2D,
    ZeroPadding1D,
    ZeroPadding2D,
)

pytestmark = pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)


def _predict(layers, x):
    model = malinn.Sequential(layers)
    model.build((None,) + x.shape[1:])
    return model.predict(x)


@pytest.mark.parametrize("cls, mode", [(MaxPooling2D, "max"), (AveragePooling2D, "avg")])
@pytest.mark.parametrize(
    "shape, pool, strides, padding",
    [
        ((13, 13, 3), (2, 2), None, "valid"),
        ((5, 31, 13), (3, 3), (2, 2), "same"),
        ((1, 5, 64), (1, 2), None, "same"),
        ((31, 5, 1), (3, 2), (1, 3), "valid"),
        ((5, 5, 3), (5, 5), None, "same"),
    ],
)
def test_pooling_2d(device, rng, cls, mode, shape, pool, strides, padding):
    x = rng.standard_normal((7,) + shape).astype(np.float32)
    want = pool2d_reference(x, pool, strides or pool, padding, mode)
    np.testing.assert_allclose(_predict([cls(pool, strides, padding)], x), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cls, mode", [(MaxPooling1D, "max"), (AveragePooling1D, "avg")])
@pytest.mark.parametrize("padding", ["valid", "same"])
def test_pooling_1d(device, rng, cls, mode, padding):
    x = rng.standard_normal((7, 13, 3)).astype(np.float32)
    want = pool2d_reference(x[:, None], (1, 3), (1, 2), padding, mode)[:, 0]
    np.testing.assert_allclose(_predict([cls(3, 2, padding)], x), want, rtol=1e-6, atol=1e-6)


def test_global_pooling(device, rng):
    x = rng.standard_normal((7, 5, 13, 3)).astype(np.float32)
    np.testing.assert_allclose(_predict([GlobalAveragePooling2D()], x), x.mean(axis=(1, 2)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_predict([GlobalMaxPooling2D(keepdims=True)], x), x.max(axis=(1, 2), keepdims=True))
    s = x[:, 0]
    np.testing.assert_allclose(_predict([GlobalAveragePooling1D()], s), s.mean(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_predict([GlobalMaxPooling1D()], s), s.max(axis=1))


def test_nan_and_infinities_pool_as_in_tensorflow(device):
    """TensorFlow's max_pool (MaxPooling) skips NaN and starts from the lowest float (Keras 3.15 on
    TensorFlow 2.x: a window of NaN and -inf gives -3.4028235e38); its reduce_max (GlobalMaxPooling)
    gives NaN; a mean with a NaN is NaN."""
    nan, inf, low = np.nan, np.inf, -np.finfo(np.float32).max
    x = np.array([[[nan, -inf, inf, -1.0], [0.5, 2.0, 7.0, nan]]], np.float32)[..., None]  # (1, 2, 4, 1)
    np.testing.assert_array_equal(_predict([MaxPooling2D((1, 2))], x)[..., 0], [[[low, inf], [2.0, 7.0]]])
    np.testing.assert_array_equal(_predict([GlobalMaxPooling2D()], x), [[nan]])
    np.testing.assert_array_equal(_predict([GlobalMaxPooling2D()], np.where(np.isnan(x), 1.0, x)), [[inf]])
    np.testing.assert_array_equal(_predict([AveragePooling2D((1, 2))], x)[..., 0], [[[nan, inf], [1.25, nan]]])


def test_pooling_after_a_convolution_reads_its_layout(device, rng):
    conv = Conv2D(13, 3, padding="same", activation="relu")
    conv.build((None, 13, 13, 3))
    x = rng.standard_normal((7, 13, 13, 3)).astype(np.float32)
    y = _predict([conv], x)
    for layer, want in [
        (MaxPooling2D(2), pool2d_reference(y, (2, 2), (2, 2), "valid", "max")),
        (GlobalAveragePooling2D(), y.mean(axis=(1, 2))),
        (ZeroPadding2D(((1, 2), (0, 3))), np.pad(y, ((0, 0), (1, 2), (0, 3), (0, 0)))),
    ]:
        conv2 = Conv2D(13, 3, padding="same", activation="relu")
        conv2.build((None, 13, 13, 3))
        conv2.set_weights(conv.get_weights())
        np.testing.assert_allclose(_predict([conv2, layer], x), want, rtol=1e-5, atol=1e-5)


def test_padding_cropping_upsampling(device, rng):
    x = rng.standard_normal((7, 5, 13, 3)).astype(np.float32)
    cases = [
        (ZeroPadding2D(2), np.pad(x, ((0, 0), (2, 2), (2, 2), (0, 0)))),
        (ZeroPadding2D((1, 3)), np.pad(x, ((0, 0), (1, 1), (3, 3), (0, 0)))),
        (Cropping2D(((1, 2), (3, 4))), x[:, 1:-2, 3:-4]),
        (Cropping2D(2), x[:, 2:-2, 2:-2]),
        (UpSampling2D((2, 3)), x.repeat(2, axis=1).repeat(3, axis=2)),
        (ZeroPadding1D((1, 2)), np.pad(x[:, 0], ((0, 0), (1, 2), (0, 0)))),
        (Cropping1D((2, 3)), x[:, 0, 2:-3]),
        (UpSampling1D(3), x[:, 0].repeat(3, axis=1)),
    ]
    for layer, want in cases:
        given = x[:, 0] if layer.rank == 1 else x
        np.testing.assert_array_equal(_predict([layer], given), want, err_msg=type(layer).__name__)


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda: MaxPooling2D(0), "pool_size must be a positive integer"),
        (lambda: AveragePooling2D(2, padding="causal"), "padding must be 'valid' or 'same'"),
        (lambda: ZeroPadding2D(-1), "must be integers >= 0"),
        (lambda: ZeroPadding2D((1, 2, 3)), "2 pairs"),
        (lambda: UpSampling2D(2, interpolation="lanczos3"), "interpolation 'lanczos3' .a Lanczos kernel"),
        (lambda: Cropping2D(((1, 2, 3), (0, 0))), "2 pairs"),
    ],
)
def test_arguments_are_checked(bad, message):
    with pytest.raises(ValueError, match=message):
        bad()


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="leaves nothing"):
        Cropping2D(3).build((None, 5, 13, 3))
    with pytest.raises(ValueError, match="does not fit"):
        MaxPooling2D(6).build((None, 5, 13, 3))
    with pytest.raises(ValueError, match="expects inputs of rank 4"):
        GlobalMaxPooling2D().build((None, 5, 3))
    assert MaxPooling2D(2, padding="same").compute_output_shape((None, 5, 13, 3)) == (None, 3, 7, 3)
    assert UpSampling1D(2).compute_output_shape((None, 5, 3)) == (None, 10, 3)
