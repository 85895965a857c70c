"""The single-input layers (activations, normalizations, reshaping, rescaling) against numpy on odd shapes (sizes 1, 3, 5, 13, 1001), each as
a model's first layer (the input in Keras's order) and after a Dense (the tensor in the matmul
kernel's layout: the default one, and Morton's blocked C_4_2_C), on every working device."""

import numpy as np
import pytest
from support import assert_close

from malinn import Sequential, ops
from malinn.layers import (
    BatchNormalization,
    Dense,
    Identity,
    LayerNormalization,
    Normalization,
    Permute,
    PReLU,
    RepeatVector,
    Rescaling,
    Reshape,
    Softmax,
    ThresholdedReLU,
    UnitNormalization,
)

pytestmark = pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)

SHAPES = [(1, 1), (3, 5, 13), (13, 1, 5), (1001,), (5, 3, 1, 13)]
MATMULS = [None, "morton_4_2"]


def softmax(x, axes):
    z = np.exp(x - x.max(axis=axes, keepdims=True))
    return z / z.sum(axis=axes, keepdims=True)


def run(device, layer, shape, reference, rng, matmul=None, batch=7, scale=3.0):
    """``layer`` first and after a Dense (random weights) on ``batch`` samples of ``shape``;
    ``reference(x, layer)`` in float64."""
    if matmul is not None:
        ops.use("matmul", matmul, device)
    x = (rng.standard_normal((batch,) + shape) * scale).astype(np.float32)
    first = Sequential([layer])
    first.build((None,) + shape)
    for w_layer in first.layers:
        randomize(w_layer, rng)
    assert_close(first.predict(x), reference(x.astype(np.float64), layer))
    dense = Dense(shape[-1])
    model = Sequential([dense, type(layer).from_config(layer.get_config())])
    model.build((None,) + shape)
    model.layers[1].set_weights(layer.get_weights())
    limit = np.sqrt(6.0 / (2 * shape[-1]))  # Keras's glorot_uniform, from the test's seeded generator
    dense.set_weights(
        [rng.uniform(-limit, limit, (shape[-1], shape[-1])).astype(np.float32), np.zeros(shape[-1], np.float32)]
    )
    kernel, bias = dense.get_weights()
    h = x.astype(np.float64) @ kernel + bias
    assert_close(model.predict(x), reference(h, model.layers[1]))


def randomize(layer, rng):
    weights = layer.get_weights()
    if weights:
        layer.set_weights(
            [
                np.abs(rng.standard_normal(w.shape)).astype(np.float32) + 0.5
                if i == len(weights) - 1 and isinstance(layer, BatchNormalization)
                else rng.standard_normal(w.shape).astype(np.float32)
                for i, w in enumerate(weights)
            ]
        )


def axes_of(axis, rank):
    axis = axis if isinstance(axis, (list, tuple)) else [axis]
    return tuple(sorted(a % rank for a in axis))


@pytest.mark.parametrize("matmul", MATMULS)
@pytest.mark.parametrize("shape", SHAPES)
def test_softmax_over_any_axes(device, shape, matmul, rng):
    rank = len(shape) + 1
    for axis in sorted({-1, 1, rank - 2 or 1, (1, rank - 1)}, key=str):
        if len(set(axes_of(axis, rank))) != (len(axis) if isinstance(axis, tuple) else 1):
            continue
        run(
            device,
            Softmax(axis=list(axis) if isinstance(axis, tuple) else axis),
            shape,
            lambda x, layer, axis=axis: softmax(x, axes_of(axis, rank)),
            rng,
            matmul,
        )


@pytest.mark.parametrize("matmul", MATMULS)
@pytest.mark.parametrize("shape", SHAPES)
def test_batch_normalization_on_any_axis(device, shape, matmul, rng):
    rank = len(shape) + 1
    for axis in sorted({1, -1, rank - 2 or 1}):

        def reference(x, layer, axis=axis):
            gamma, beta, mean, var = (w.astype(np.float64) for w in layer.get_weights())
            where = [1] * rank
            where[axis % rank] = -1
            return (x - mean.reshape(where)) / np.sqrt(var.reshape(where) + 1e-3) * gamma.reshape(where) + beta.reshape(
                where
            )

        run(device, BatchNormalization(axis=axis), shape, reference, rng, matmul)


@pytest.mark.parametrize("matmul", MATMULS)
@pytest.mark.parametrize("shape", SHAPES)
def test_layer_and_unit_normalization_over_any_axes(device, shape, matmul, rng):
    rank = len(shape) + 1
    choices = {(-1,), (1,), tuple(range(1, rank))} | ({(1, rank - 1)} if rank > 3 else set())
    for axes in sorted(choices):

        def layer_norm(x, layer, axes=axes):
            a = axes_of(axes, rank)
            mean, var = x.mean(axis=a, keepdims=True), x.var(axis=a, keepdims=True)
            where = [x.shape[i] if i in a else 1 for i in range(rank)]
            gamma, beta = (w.astype(np.float64).reshape(where) for w in layer.get_weights())
            return (x - mean) / np.sqrt(var + 1e-3) * gamma + beta

        run(device, LayerNormalization(axis=list(axes)), shape, layer_norm, rng, matmul)

        def unit(x, layer, axes=axes):
            return x / np.maximum(np.sqrt((x * x).sum(axis=axes_of(axes, rank), keepdims=True)), 1e-12)

        run(device, UnitNormalization(axis=list(axes)), shape, unit, rng, matmul)


@pytest.mark.parametrize("matmul", MATMULS)
@pytest.mark.parametrize("shape", SHAPES)
def test_prelu_thresholded_relu_rescaling_normalization(device, shape, matmul, rng):
    rank = len(shape) + 1

    def prelu(x, layer):
        return np.where(x < 0, layer.alpha.astype(np.float64) * x, x)

    for shared in (None, [1], [rank - 1], list(range(1, rank))):
        run(device, PReLU(shared_axes=shared), shape, prelu, rng, matmul)
    run(device, ThresholdedReLU(0.7), shape, lambda x, layer: np.where(x > 0.7, x, 0.0), rng, matmul)
    scale = rng.standard_normal(shape[-1])
    run(device, Rescaling(scale, 0.25), shape, lambda x, layer: x * scale + 0.25, rng, matmul)
    column = rng.standard_normal(shape[:1] + (1,) * (len(shape) - 1))
    run(device, Rescaling(column), shape, lambda x, layer: x * column, rng, matmul)
    for axis in (-1, 1, None):
        layer = Normalization(axis=axis)
        layer.build((None,) + shape)
        mean = rng.standard_normal(layer.stat_shape) * 100
        var = rng.random(layer.stat_shape) + 0.5
        layer.set_weights([mean, var])
        where = [d if (axis is not None and i % rank == axis % rank) else 1 for i, d in enumerate((1,) + shape)]

        def reference(x, _, m=mean.reshape(where), v=var.reshape(where)):
            return (x - m) / np.sqrt(v)

        x = (rng.standard_normal((7,) + shape) * 3 + mean.reshape(where)[0]).astype(np.float32)
        model = Sequential([layer])
        assert_close(model.predict(x), reference(x.astype(np.float64), layer))
        # the same statistics given to the constructor, as Keras takes them: no weights, the config holds them
        given = Normalization.from_config(Normalization(axis=axis, mean=mean, variance=var).get_config())
        model = Sequential([given])
        assert_close(model.predict(x), reference(x.astype(np.float64), layer))
        assert given.get_weights() == [] and model.count_params() == 0
        with pytest.raises(ValueError, match="has no weights, got 2"):
            given.set_weights([mean, var])
    with pytest.raises(ValueError, match="give both mean and variance, or neither"):
        Normalization(variance=[1.0])


@pytest.mark.parametrize("matmul", MATMULS)
@pytest.mark.parametrize("shape", SHAPES)
def test_reshape_permute_repeat_identity(device, shape, matmul, rng):
    rank = len(shape) + 1
    size = int(np.prod(shape))
    run(device, Reshape((-1,)), shape, lambda x, layer: x.reshape(x.shape[0], -1), rng, matmul)
    run(device, Reshape((shape[-1], -1)), shape, lambda x, layer: x.reshape(x.shape[0], shape[-1], -1), rng, matmul)
    for dims in {tuple(range(rank - 1, 0, -1)), tuple([rank - 1] + list(range(1, rank - 1)))}:
        run(device, Permute(dims), shape, lambda x, layer, dims=dims: x.transpose((0,) + dims), rng, matmul)
    run(device, Identity(), shape, lambda x, layer: x, rng, matmul)
    run(device, RepeatVector(3), (size,), lambda x, layer: np.repeat(x[:, None, :], 3, axis=1), rng, matmul)


def test_new_layers_refuse_what_keras_refuses():
    with pytest.raises(ValueError, match="batch axis"):
        Sequential([Softmax(axis=0)]).build((None, 3))
    with pytest.raises(ValueError, match="out of range"):
        Sequential([LayerNormalization(axis=3)]).build((None, 3, 4))
    with pytest.raises(ValueError, match="cannot be reshaped"):
        Sequential([Reshape((5, -1))]).build((None, 3, 4))
    with pytest.raises(ValueError, match="not an order"):
        Permute((1, 1))
    with pytest.raises(ValueError, match=r"\(batch, features\)"):
        Sequential([RepeatVector(2)]).build((None, 3, 4))
    with pytest.raises(ValueError, match="theta must be a finite number"):
        ThresholdedReLU(float("nan"))


@pytest.mark.parametrize("matmul", MATMULS)
def test_flatten_of_a_blocked_layout_pads_whole_chunks(device, matmul, rng):
    """A reshape (or any any-layout kernel) writing the matmul's blocked layout (C_4_2_C) pads its
    result to whole chunks; before, Dense -> Flatten on (3, 5, 13) samples with Morton's kernel was wrong."""
    if matmul is not None:
        ops.use("matmul", matmul, device)
    from malinn.layers import Flatten

    model = Sequential([Dense(13), Flatten()])
    model.build((None, 3, 5, 13))
    x = rng.standard_normal((7, 3, 5, 13)).astype(np.float32)
    kernel, bias = model.layers[0].get_weights()
    assert_close(model.predict(x), (x.astype(np.float64) @ kernel + bias).reshape(7, -1))


def test_long_softmax_and_layer_normalization_sums_round_little(device, rng):
    """Their sums run in blocks of 64 terms: summed one by one, a softmax over 16000 features was
    1.9e-5 off float64 per element and a LayerNormalization over 4096 features around 100 was off
    by 1.3e-4 (1.9e-5 and 4.4e-5 against Keras were measured, beyond its 1e-5)."""
    x = (rng.standard_normal((17, 16000)) * 3).astype(np.float32)
    model = Sequential([Softmax()])
    model.build((None, 16000))
    want = softmax(x.astype(np.float64), 1)
    assert np.max(np.abs(model.predict(x) - want) / want) < 6e-6
    x = (100.0 + rng.standard_normal((17, 4096))).astype(np.float32)
    model = Sequential([LayerNormalization()])
    model.build((None, 4096))
    xd = x.astype(np.float64)
    want = (xd - xd.mean(axis=1, keepdims=True)) / np.sqrt(xd.var(axis=1, keepdims=True) + 1e-3)
    assert np.max(np.abs(model.predict(x) - want)) < 5e-5


@pytest.mark.parametrize("features", [1, 3, 13, 1001, 4096])
def test_layer_normalization_of_constant_offset_and_huge_samples_is_exact(device, features, rng):
    """x - mean is (x - first) - (mean - first): a constant sample gives beta bit for bit (its
    values summed as they were, 16 x 1e10 had a mean one rounding step off and the variance
    1024^2: -1 x gamma + beta), rms_scaling x / sqrt(epsilon) x gamma; an offset sample (1e4 +
    noise) and one far from zero (-5e5 + noise) come within 1e-5 of float64 (a float32 mean rounds
    by 5e-4 there: 0.015 at noise 0.01); 3e38 does not overflow the sums. Over a run of axes too."""
    constants = np.array([1e10, -1e10, 65504, 3e4, 1e4, 1.0, 0.0, 1e-30, 1e38, 3e38, -3e38], np.float32)
    noise = rng.standard_normal((4, features)) * np.array([[1e-2], [1.0], [100.0], [3.0]])
    x = np.concatenate(
        [np.repeat(constants[:, None], features, axis=1), noise + np.array([[1e4], [1e4], [1e4], [-5e5]])]
    ).astype(np.float32)
    k = len(constants)
    gamma, beta = rng.standard_normal((2, features)).astype(np.float32)
    for rms in (False, True):
        for shape, axis in (((features,), -1), ((features, 1), [1, 2])):
            layer = LayerNormalization(axis=axis, rms_scaling=rms)
            model = Sequential([layer])
            model.build((None,) + shape)
            layer.set_weights([w.reshape(layer.param_shape) for w in ([gamma] if rms else [gamma, beta])])
            y = model.predict(x.reshape((-1,) + shape)).reshape(x.shape)
            xd = x.astype(np.float64)
            inv = gamma / np.sqrt(xd.var(axis=1, keepdims=True) + 1e-3)
            want = xd * inv if rms else (xd - xd.mean(axis=1, keepdims=True)) * inv + beta
            what = f"{features} features, rms_scaling={rms}, axis={axis}"
            if rms:
                with np.errstate(over="ignore"):
                    np.testing.assert_allclose(y[:k], want[:k].astype(np.float32), rtol=1e-6, err_msg=what)
            else:
                np.testing.assert_array_equal(y[:k], np.broadcast_to(beta, (k, features)), err_msg=what)
            assert_close(y[k:], want[k:], rtol=1e-5)

    """Keras: [nan, 1, 2, 3] -> all NaN. The floor of the sum of squares (fmax) dropped the NaN sum,
    so the other elements came out multiplied by 1e12: plausible, finite and wrong."""
    model = Sequential([UnitNormalization()])
    model.build((None, 4))
    got = model.predict(np.array([[np.nan, 1, 2, 3], [0, 3, 4, 0]], np.float32))
    assert np.isnan(got[0]).all()
    np.testing.assert_allclose(got[1], [0, 0.6, 0.8, 0], rtol=1e-6)


def test_prelu_negative_shared_axes_and_layer_normalization_axes_are_keras_s(device, rng):
    """Keras sets alpha_shape[a - 1] = 1 for each shared axis a, so -1 shares the sample's
    second-to-last axis (malinn shared the last: wrong values silently on a square sample, a
    refusal of Keras's alpha otherwise); Keras sorts LayerNormalization's axes before sizing gamma
    (malinn sized it in the order given and read it sorted: gamma applied to the wrong positions)."""
    prelu = PReLU(shared_axes=[-1])
    model = Sequential([prelu])
    model.build((None, 4, 5))
    assert prelu.alpha_shape == (1, 5)
    alpha = rng.standard_normal((1, 5)).astype(np.float32)
    prelu.set_weights([alpha])
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    assert_close(model.predict(x), np.where(x < 0, alpha * x, x))
    ln = LayerNormalization(axis=[2, 1])
    model = Sequential([ln])
    model.build((None, 3, 4, 5))
    assert ln.param_shape == (3, 4)
    gamma, beta = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2))
    ln.set_weights([gamma, beta])
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    xd = x.astype(np.float64)
    mean, var = xd.mean(axis=(1, 2), keepdims=True), xd.var(axis=(1, 2), keepdims=True)
    assert_close(model.predict(x), (xd - mean) / np.sqrt(var + 1e-3) * gamma[..., None] + beta[..., None])
