"""BatchNormalization as its own layer, and Flatten with multi-axis inputs."""

import numpy as np
import pytest
from support import assert_close

from malinn import Sequential
from malinn.layers import Activation, BatchNormalization, Dense, Flatten, LayerNormalization

pytestmark = pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)


def bn_reference(x, gamma, beta, mean, var, eps):
    return gamma * (x - mean) / np.sqrt(var + eps) + beta


@pytest.mark.parametrize("center, scale", [(True, True), (False, True), (True, False), (False, False)])
def test_batch_normalization_matches_its_formula(device, center, scale, rng):
    layer = BatchNormalization(epsilon=1e-3, center=center, scale=scale)
    gamma, beta, mean = rng.standard_normal((3, 13)).astype(np.float32)
    var = rng.random(13).astype(np.float32) + 0.1
    weights = ([gamma] if scale else []) + ([beta] if center else []) + [mean, var]
    model = Sequential([Dense(13, activation="relu"), layer])
    model.build((None, 5))
    layer.set_weights(weights)
    x = rng.standard_normal((7, 5)).astype(np.float32)
    kernel, bias = model.layers[0].get_weights()
    h = np.maximum(x.astype(np.float64) @ kernel + bias, 0)
    want = bn_reference(h, gamma if scale else 1.0, beta if center else 0.0, mean, var, 1e-3)
    assert_close(model.predict(x), want)
    assert len(layer.get_weights()) == len(weights)


def test_an_epsilon_of_zero_is_taken_as_keras_takes_it(device):
    """Keras accepts epsilon=0 (malinn refused it): a zero variance then gives inf, as Keras's rsqrt."""
    bn = BatchNormalization(epsilon=0)
    ln = LayerNormalization(epsilon=0.0)
    model = Sequential([bn, ln])
    model.build((None, 4))
    bn.set_weights(
        [
            np.ones(4, np.float32),
            np.zeros(4, np.float32),
            np.zeros(4, np.float32),
            np.array([4, 1, 0.25, 1], np.float32),
        ]
    )
    y = model.predict(np.array([[1, 2, 3, 4]], np.float32))
    h = np.array([0.5, 2, 6, 4])
    want = (h - h.mean()) / h.std()
    np.testing.assert_allclose(y[0], want, rtol=1e-5)


def test_batch_normalization_validates():
    with pytest.raises(ValueError, match=r"epsilon must be a number >= 0 \(Keras's\), got -1"):
        BatchNormalization(epsilon=-1)
    with pytest.raises(ValueError, match="epsilon must be a number >= 0"):
        LayerNormalization(epsilon=float("nan"))
    layer = BatchNormalization()
    with pytest.raises(ValueError, match="expects 4 weight arrays, got 3"):
        layer.set_weights([np.ones(3)] * 3)
    with pytest.raises(ValueError, match="are not all"):
        layer.set_weights([np.ones(3), np.ones(3), np.ones(3), np.ones(4)])


def test_flatten_takes_multi_axis_samples_in_keras_order(device, rng):
    model = Sequential([Activation("relu"), Flatten(), Dense(3)])
    x = rng.standard_normal((4, 5, 7)).astype(np.float32)
    y = model.predict(x)
    kernel, bias = model.layers[2].get_weights()
    assert model.input_shape == (None, 5, 7) and kernel.shape == (35, 3)
    assert_close(y, np.maximum(x, 0).reshape(4, 35).astype(np.float64) @ kernel + bias)
    with pytest.raises(ValueError, match=r"expected shape \(None, 5, 7\), found shape \(4, 35\)"):
        model.predict(x.reshape(4, 35))
    assert "(None, 5, 7)" in model.summary(print_fn=lambda s: None)


def test_dense_on_multi_axis_input_acts_on_the_last_axis_as_in_keras(device, rng):
    model = Sequential([Dense(3), Flatten()])
    model.build((None, 5, 7))
    kernel, bias = model.layers[0].get_weights()
    assert kernel.shape == (7, 3) and model.output_shape == (None, 15)
    x = rng.standard_normal((4, 5, 7)).astype(np.float32)
    assert_close(model.predict(x), (x.astype(np.float64) @ kernel + bias).reshape(4, 15))
