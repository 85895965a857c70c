"""Conv2DTranspose and Conv1DTranspose vs the numpy definition (each input pixel scattered through
each kernel tap to ``i*S + k*D - P``), on every device, over odd shapes, strides, dilations, both
paddings, output_padding, batch 1 and 3, and in the reduced weight precisions."""

import numpy as np
import pytest
from support import activation, rounded_kernel
from upsampling_references import conv_transpose_reference

import malinn
from malinn.layers import Conv1DTranspose, Conv2DTranspose

pytestmark = pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)


#: (H, W, C, filters, kernel, strides, dilation, padding, output_padding, use_bias, batch)
CASES = [
    (1, 1, 1, 1, 1, 1, 1, "valid", None, True, 1),
    (5, 4, 3, 2, 3, 2, 1, "same", None, True, 3),
    (3, 5, 13, 3, (2, 3), (3, 2), 1, "valid", (1, 1), True, 3),
    (4, 4, 2, 5, 3, 1, 2, "same", None, False, 1),
    (4, 3, 2, 5, 4, (2, 3), 1, "same", (1, 2), True, 3),
    (2, 7, 5, 13, 1, 3, 1, "valid", None, True, 1),
    (3, 3, 4, 1, 5, 2, 1, "same", 1, True, 3),
]


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_conv2d_transpose_matches_the_definition(device, rng, case):
    h, w, c, filters, k, s, d, padding, output_padding, use_bias, batch = case
    layer = Conv2DTranspose(
        filters, k, s, padding, output_padding, d, activation="elu" if filters % 2 else "linear", use_bias=use_bias
    )
    model = malinn.Sequential([layer])
    model.build((None, h, w, c))
    layer.set_weights([rng.standard_normal(v.shape).astype(np.float32) for v in layer.get_weights()])
    x = rng.standard_normal((batch, h, w, c)).astype(np.float32)
    op = None if output_padding is None else _pair(output_padding)
    want = activation(
        layer.activation, conv_transpose_reference(x, layer.kernel, layer.bias, _pair(s), _pair(d), padding, op)
    )
    got = model.predict(x)
    assert got.shape == want.shape == layer.compute_output_shape((batch, h, w, c))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("padding", ["valid", "same"])
def test_conv1d_transpose_matches_the_definition(device, rng, padding):
    layer = Conv1DTranspose(3, 3, strides=2, padding=padding, output_padding=1, activation="tanh")
    model = malinn.Sequential([layer])
    model.build((None, 7, 5))
    layer.set_weights([rng.standard_normal(v.shape).astype(np.float32) for v in layer.get_weights()])
    x = rng.standard_normal((3, 7, 5)).astype(np.float32)
    # the 2-D definition on images of height 1 (a 1-tap kernel along the height, no padding there)
    want = np.tanh(
        conv_transpose_reference(x[:, None], layer.kernel[None], layer.bias, (1, 2), (1, 1), padding, (0, 1))[:, 0]
    )
    got = model.predict(x)
    assert got.shape == want.shape == layer.compute_output_shape((3, 7, 5))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("precision", ["fp16-storage", "int8-weights"])
def test_conv2d_transpose_reads_its_weights_in_the_plans_precision(device, rng, precision):
    layer = Conv2DTranspose(5, 3, strides=2, padding="same", activation="relu")
    model = malinn.Sequential([layer], precision=precision)
    model.build((None, 4, 5, 3))
    layer.set_weights([rng.standard_normal(v.shape).astype(np.float32) for v in layer.get_weights()])
    x = rng.standard_normal((2, 4, 5, 3)).astype(np.float32)
    matrix = rounded_kernel(layer.weight_matrix().T, precision).T  # the matrix the device holds
    kernel = np.moveaxis(matrix.reshape((5, 3, 3, 3)), 0, -2)
    want = np.maximum(conv_transpose_reference(x, kernel, layer.bias, (2, 2), (1, 1), "same", None), 0)
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_the_arguments_keras_refuses_are_refused():
    with pytest.raises(ValueError, match="output_padding"):
        Conv2DTranspose(2, 3, strides=2, output_padding=2)
    with pytest.raises(ValueError, match="padding"):
        Conv2DTranspose(2, 3, padding="causal")
    with pytest.raises(ValueError, match="rank 4"):
        malinn.Sequential([Conv2DTranspose(2, 3)]).build((None, 5, 3))
