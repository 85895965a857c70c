"""Activation layer: validation and values, also as a model's first layer."""

import numpy as np
import pytest
from support import activation, assert_close

from malinn import Sequential
from malinn.layers import Activation, Dense


def test_unknown_activation():
    with pytest.raises(ValueError, match="unknown activation 'nope'"):
        Activation("nope")


def test_none_is_linear():
    assert Activation(None).activation == "linear"


@pytest.mark.parametrize("name", ["relu", "sigmoid", "tanh", "softmax", "linear"])
def test_activation_layer_first_and_after_dense(device, name, rng):
    x = rng.standard_normal((7, 13)).astype(np.float32)
    first = Sequential([Activation(name)])
    assert_close(first.predict(x), activation(name, x.astype(np.float64), axis=-1))
    model = Sequential([Dense(5), Activation(name)])
    model.build((None, 13))
    kernel, bias = model.get_weights()
    assert_close(model.predict(x), activation(name, x.astype(np.float64) @ kernel + bias, axis=-1))


from malinn.layers import ELU, LeakyReLU, ReLU, Softmax  # noqa: E402

pytestmark = pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)


@pytest.mark.parametrize(
    "layer, reference",
    [
        (lambda: ReLU(), lambda x: np.maximum(x, 0)),
        (lambda: ReLU(max_value=1.5), lambda x: np.clip(x, 0, 1.5)),
        (
            lambda: ReLU(negative_slope=0.1, threshold=0.5),
            lambda x: np.where(x > 0.5, x, 0) - 0.1 * np.maximum(0.5 - x, 0),
        ),
        (
            lambda: ReLU(max_value=2.0, negative_slope=0.2, threshold=-1.0),
            lambda x: np.clip(np.where(x > -1, x, 0), 0, 2) - 0.2 * np.maximum(-1 - x, 0),
        ),
        (lambda: LeakyReLU(0.3), lambda x: np.where(x < 0, 0.3 * x, x)),
        (lambda: ELU(0.7), lambda x: np.where(x > 0, x, 0.7 * np.expm1(x))),
        (lambda: Softmax(), lambda x: activation("softmax", x, axis=-1)),
    ],
)
def test_parametrised_activation_layers(device, layer, reference, rng):
    x = (rng.standard_normal((9, 13)) * 3).astype(np.float32)
    assert_close(Sequential([layer()]).predict(x), reference(x.astype(np.float64)))


@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda: ReLU(max_value=-1), "must be >= 0"),
        (lambda: ReLU(negative_slope=-0.1), "must be >= 0"),
        (lambda: ReLU(threshold=float("nan")), "finite"),
        (lambda: LeakyReLU("a"), "finite number"),
        (lambda: ELU(None), "finite number"),
        (lambda: Softmax(axis="last"), "axis must be an integer"),
    ],
)
def test_parametrised_layers_validate(make, fragment):
    with pytest.raises(ValueError, match=fragment):
        make()


def test_gelu_tanh_is_zero_far_below_zero_and_x_far_above(device):
    """Keras's approximate GELU at large magnitudes: -0 and x (PoCL's tanh of -1e4 left a 6e-8
    that x multiplied: -3e-4 at -1e4, -3e22 at -1e30)."""
    x = np.array([[-1e30, -1e6, -1e4, -100.0, 0.0, 100.0, 1e4, 1e30]], np.float32)
    got = Sequential([Activation("gelu_tanh")]).predict(x)
    np.testing.assert_array_equal(got[0, :5], 0.0)
    np.testing.assert_array_equal(got[0, 5:], x[0, 5:])
