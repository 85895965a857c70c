"""Activation layer: validation and values, also as a model's first layer."""

import numpy as np
import pytest

from helpers import activation, assert_close
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
