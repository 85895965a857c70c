"""Keras's 3-D layers (Conv3D, Conv3DTranspose, MaxPooling3D, AveragePooling3D, GlobalMaxPooling3D,
GlobalAveragePooling3D, ZeroPadding3D, Cropping3D, UpSampling3D) against their numpy definitions
(tests/layers/volumetric_reference.py) on every device: volumes of 1, 3 and 13 voxels a side, one
channel, batch 1, strides, dilation, groups, both paddings, output_padding, keepdims, activations,
and one larger volume; and converted from Keras 3 and tf_keras files (.keras and .h5), equal to
Keras's own predict within 1e-5 x max(1, |y|): the models of tests/layers/volumetric_zoo.py (a video
classifier, a 3-D U-Net block, odd shapes), built in a process of their own once per test run."""

from pathlib import Path

import numpy as np
import pytest
from conftest import built_zoo
from support import rounded_kernel
from volumetric_reference import conv3d_reference, layer_reference
from volumetric_zoo import BATCHES, GENERATIONS, GRAPHS, MODELS, SUFFIXES

import malinn
from malinn.layers import (
    AveragePooling3D,
    Conv3D,
    Conv3DTranspose,
    Cropping3D,
    GlobalAveragePooling3D,
    GlobalMaxPooling3D,
    MaxPooling3D,
    UpSampling3D,
    ZeroPadding3D,
)


def _run(layers, shape, batch, rng):
    """A Sequential of ``layers`` on ``(batch,) + shape`` with random weights: (malinn's output,
    numpy's, the model)."""
    model = malinn.Sequential(layers)
    model.build((None,) + tuple(shape))
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.5 for w in model.get_weights()])
    x = rng.standard_normal((batch,) + tuple(shape)).astype(np.float32)
    want = x.astype(np.float64)
    for layer in model.layers:
        want = layer_reference(layer, want)
    return model.predict(x), want, model


def _close(got, want):
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))


#: (D, H, W, C, filters, kernel, strides, dilation, padding, groups, use_bias, activation, batch)
CONV_CASES = [
    (1, 1, 1, 1, 1, 1, 1, 1, "valid", 1, True, None, 1),  # a matmul: one voxel, one channel
    (1, 1, 1, 1, 1, 3, 1, 1, "same", 1, True, "relu", 1),  # the window all padding but its centre
    (3, 3, 3, 1, 2, 3, 1, 1, "valid", 1, False, "tanh", 1),
    (13, 3, 1, 1, 3, (3, 2, 1), (2, 1, 1), 1, "valid", 1, True, "elu", 3),
    (3, 13, 5, 2, 4, (2, 3, 3), (1, 3, 2), 1, "same", 1, True, "leaky_relu", 2),
    (5, 6, 4, 2, 3, 2, 1, (2, 1, 3), "same", 1, True, "swish", 1),
    (3, 4, 5, 4, 6, 3, (1, 2, 1), 1, "same", 2, True, "sigmoid", 2),
    (4, 3, 3, 6, 3, (1, 2, 2), 1, 1, "valid", 3, False, None, 1),
    (2, 3, 4, 5, 7, 1, 1, 1, "valid", 1, True, "selu", 2),  # pointwise: a matmul
    (1, 3, 13, 3, 2, (1, 1, 3), (1, 1, 2), 1, "same", 1, True, "hard_sigmoid", 3),
]


@pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "-".join(map(str, c)))
def test_conv3d_matches_the_definition(device, rng, case):
    d, h, w, c, filters, k, s, dil, padding, groups, use_bias, act, batch = case
    layer = Conv3D(filters, k, s, padding, dil, groups, act, use_bias)
    got, want, _ = _run([layer], (d, h, w, c), batch, rng)
    assert got.shape == layer.compute_output_shape((batch, d, h, w, c))
    _close(got, want)


#: (D, H, W, C, filters, kernel, strides, dilation, padding, output_padding, use_bias, activation, batch)
TRANSPOSE_CASES = [
    (1, 1, 1, 1, 1, 1, 1, 1, "valid", None, True, None, 1),
    (1, 1, 1, 1, 2, 3, 2, 1, "same", None, True, "relu", 1),
    (3, 3, 3, 1, 2, 3, 2, 1, "valid", None, False, "tanh", 1),
    (13, 3, 1, 1, 3, (3, 2, 1), (2, 3, 1), 1, "same", (1, 2, 0), True, None, 3),
    (3, 2, 4, 3, 2, (2, 3, 2), (3, 2, 2), 1, "valid", (2, 1, 1), True, "elu", 2),
    (3, 4, 3, 2, 3, 3, 1, (2, 1, 2), "same", None, True, "sigmoid", 1),
    (2, 3, 2, 4, 5, 4, (2, 3, 2), 1, "same", 1, True, "softplus", 2),
]


@pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)
@pytest.mark.parametrize("case", TRANSPOSE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_conv3d_transpose_matches_the_definition(device, rng, case):
    d, h, w, c, filters, k, s, dil, padding, output_padding, use_bias, act, batch = case
    layer = Conv3DTranspose(filters, k, s, padding, output_padding, dil, act, use_bias)
    got, want, _ = _run([layer], (d, h, w, c), batch, rng)
    assert got.shape == layer.compute_output_shape((batch, d, h, w, c))
    _close(got, want)


#: (layer, input shape, batch)
MOVING_CASES = [
    (lambda: MaxPooling3D(1), (1, 1, 1, 1), 1),
    (lambda: MaxPooling3D(padding="same"), (1, 1, 1, 1), 1),
    (lambda: MaxPooling3D(), (3, 3, 3, 1), 1),
    (lambda: MaxPooling3D((3, 2, 1), (2, 1, 1)), (13, 3, 1, 2), 3),
    (lambda: MaxPooling3D(3, 2, "same"), (13, 5, 4, 3), 2),
    (lambda: AveragePooling3D(), (3, 3, 3, 1), 1),
    (lambda: AveragePooling3D((2, 3, 2), (1, 2, 3), "same"), (3, 13, 5, 2), 2),
    (lambda: AveragePooling3D(3, 1, "same"), (1, 3, 13, 1), 1),
    (lambda: GlobalMaxPooling3D(), (1, 1, 1, 1), 1),
    (lambda: GlobalMaxPooling3D(keepdims=True), (3, 13, 2, 3), 2),
    (lambda: GlobalAveragePooling3D(), (13, 3, 3, 1), 3),
    (lambda: GlobalAveragePooling3D(keepdims=True), (1, 1, 1, 2), 1),
    (lambda: ZeroPadding3D(), (1, 1, 1, 1), 1),
    (lambda: ZeroPadding3D(((0, 2), (1, 0), (3, 1))), (3, 13, 2, 3), 2),
    (lambda: ZeroPadding3D((1, 0, 2)), (13, 1, 3, 1), 1),
    (lambda: Cropping3D(), (3, 3, 3, 1), 1),
    (lambda: Cropping3D(((2, 1), (0, 3), (1, 0))), (13, 5, 3, 2), 3),
    (lambda: Cropping3D(0), (1, 1, 1, 1), 1),
    (lambda: UpSampling3D(), (1, 1, 1, 1), 1),
    (lambda: UpSampling3D((3, 1, 2)), (3, 13, 2, 2), 2),
    (lambda: UpSampling3D(1), (13, 3, 1, 1), 1),
]


@pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)
@pytest.mark.parametrize("case", range(len(MOVING_CASES)))
def test_pooling_padding_cropping_upsampling_match_the_definition(device, rng, case):
    make, shape, batch = MOVING_CASES[case]
    layer = make()
    got, want, _ = _run([layer], shape, batch, rng)
    assert got.shape == layer.compute_output_shape((batch,) + shape)
    _close(got, want)


@pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)
def test_a_larger_volume_through_every_layer(device, rng):
    """Every layer in one chain on a 8 x 12 x 13 volume of 8 channels, batch 2: the kernels' column
    splits past one work-group, several images."""
    layers = [
        Conv3D(16, 3, padding="same", activation="relu"),
        MaxPooling3D(2, padding="same"),
        Conv3D(8, (3, 2, 3), strides=(1, 2, 1), groups=4, activation="tanh"),
        Conv3DTranspose(6, 3, strides=2, padding="same", output_padding=(1, 0, 1)),
        ZeroPadding3D(((1, 0), (0, 2), (1, 1))),
        AveragePooling3D(3, 2, "same"),
        UpSampling3D((1, 2, 2)),
        Cropping3D(((0, 1), (2, 1), (1, 2))),
        GlobalAveragePooling3D(),
    ]
    got, want, _ = _run(layers, (8, 12, 13, 8), 2, rng)
    _close(got, want)


@pytest.mark.parametrize("precision", ["fp16-storage", "int8-weights"])
def test_the_convolutions_read_their_weights_in_the_plans_precision(device, rng, precision):
    conv, transpose = Conv3D(5, 3, padding="same", activation="relu"), Conv3DTranspose(3, 2, strides=2)
    model = malinn.Sequential([conv, transpose], precision=precision)
    model.build((None, 3, 4, 5, 3))
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in model.get_weights()])
    x = rng.standard_normal((2, 3, 4, 5, 3)).astype(np.float32)
    hidden = np.maximum(
        conv3d_reference(x, rounded_kernel(conv.kernel, precision), conv.bias, (1, 1, 1), (1, 1, 1), "same"), 0
    )
    matrix = rounded_kernel(transpose.weight_matrix().T, precision).T  # the matrix the device holds
    kernel = np.moveaxis(matrix.reshape((3, 2, 2, 2, 5)), 0, -2)
    from volumetric_reference import conv3d_transpose_reference

    want = conv3d_transpose_reference(hidden, kernel, transpose.bias, (2, 2, 2), (1, 1, 1), "valid", None)
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Conv3D(2, 3, data_format="channels_first"), "only data_format='channels_last' runs"),
        (lambda: Conv3DTranspose(2, 3, data_format="channels_first"), "only data_format='channels_last' runs"),
        (lambda: MaxPooling3D(data_format="channels_first"), "only data_format='channels_last' runs"),
        (lambda: GlobalAveragePooling3D(data_format="channels_first"), "only data_format='channels_last' runs"),
        (lambda: UpSampling3D(data_format="channels_first"), "only data_format='channels_last' runs"),
        (lambda: ZeroPadding3D(data_format="channels_first"), "only data_format='channels_last' runs"),
        (lambda: Cropping3D(data_format="channels_first"), "only data_format='channels_last' runs"),
        (lambda: Conv3D(2, (3, 3)), "kernel_size must be a positive integer or 3 of them"),
        (lambda: Conv3D(3, 3, groups=2), "groups must be a positive integer dividing filters"),
        (lambda: Conv3DTranspose(2, 3, strides=2, output_padding=2), "must be below the strides"),
        (lambda: MaxPooling3D(padding="causal"), "padding must be 'valid' or 'same'"),
        (lambda: UpSampling3D((2, 2)), "size must be a positive integer or 3 of them"),
        (lambda: ZeroPadding3D((1, 2)), "padding must be an int, 3 ints or 3 pairs"),
    ],
)
def test_the_arguments_keras_refuses_are_refused_by_name(make, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


@pytest.mark.parametrize(
    "layer, shape, message",
    [
        (Conv3D(2, 3), (None, 4, 4, 3), "expects inputs of rank 5 (batch, depth, height, width, channels)"),
        (Conv3DTranspose(2, 3), (None, 4, 4, 4, 4, 3), "expects inputs of rank 5"),
        (Conv3D(2, 3), (None, 2, 4, 4, 3), "does not fit input"),
        (Conv3D(4, 3, groups=2), (None, 4, 4, 4, 3), "3 input channels are not a multiple of groups=2"),
        (MaxPooling3D(), (None, 4, 4, 3), "expects inputs of rank 5"),
        (MaxPooling3D(3), (None, 2, 4, 4, 3), "does not fit input"),
        (Cropping3D(2), (None, 4, 3, 5, 1), "leaves nothing of input"),
    ],
)
def test_a_wrong_input_is_refused_naming_the_layer_and_shape(layer, shape, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        layer.build(shape)
    assert repr(layer.name) in str(error.value)


def test_a_saved_model_reads_back_with_the_same_predictions(tmp_path, rng):
    layers = [
        Conv3D(3, 2, padding="same", groups=1, activation="relu"),
        Conv3DTranspose(2, 2, strides=(1, 2, 1), output_padding=(0, 1, 0)),
        MaxPooling3D((1, 2, 2)),
        ZeroPadding3D(1),
        Cropping3D(((1, 0), (0, 1), (1, 1))),
        UpSampling3D((2, 1, 1)),
        GlobalMaxPooling3D(keepdims=True),
    ]
    got, want, model = _run(layers, (3, 4, 3, 2), 2, rng)
    _close(got, want)
    path = tmp_path / "volumes.malinn"
    model.save(str(path))
    again = malinn.load_model(str(path))
    x = rng.standard_normal((2, 3, 4, 3, 2)).astype(np.float32)
    np.testing.assert_array_equal(again.predict(x), model.predict(x))


ZOO = Path(__file__).with_name("volumetric_zoo.py")


@pytest.fixture(scope="session")
def volumetric_zoo(tmp_path_factory) -> Path:
    """The zoo's folder, built once per test run (every xdist worker reads the one built)."""
    return built_zoo(tmp_path_factory, ZOO)


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("key", list(MODELS) + list(GRAPHS))
def test_converted_model_equals_keras(device, volumetric_zoo, key, generation, suffix):
    model = malinn.load_model(str(volumetric_zoo / generation / f"{key}{suffix}"))
    data = np.load(volumetric_zoo / generation / f"{key}.npz")
    for batch in BATCHES:
        want = data[f"y{batch}"]
        got = model.predict(data[f"x{batch}"])
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())))
