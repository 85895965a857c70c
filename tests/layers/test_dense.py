"""Dense: validation, weights in Keras's shapes, config."""

import numpy as np
import pytest

from malinn.layers import Dense

pytestmark = pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)


@pytest.mark.parametrize("units", [0, -3, 2.5, "10", None, True])
def test_units_must_be_a_positive_integer(units):
    with pytest.raises(ValueError, match="units must be a positive integer"):
        Dense(units)


def test_unknown_activation_lists_the_supported_ones():
    with pytest.raises(ValueError, match="unknown activation 'swish2'.*relu"):
        Dense(3, activation="swish2")


def test_build_makes_keras_shaped_weights():
    layer = Dense(5, activation="relu")
    layer.build((None, 3))
    kernel, bias = layer.get_weights()
    assert kernel.shape == (3, 5) and bias.shape == (5,) and kernel.dtype == np.float32
    assert np.abs(kernel).max() <= np.sqrt(6 / 8) and not bias.any()
    assert layer.count_params() == 20


def test_set_weights_checks_count_and_shapes():
    layer = Dense(4, use_bias=False)
    layer.set_weights([np.ones((7, 4))])
    assert layer.built and layer.input_dim == 7 and len(layer.get_weights()) == 1
    with pytest.raises(ValueError, match="expects 1 weight arrays"):
        layer.set_weights([np.ones((7, 4)), np.ones(4)])
    with pytest.raises(ValueError, match=r"kernel shape \(6, 4\) does not match \(7, 4\)"):
        layer.set_weights([np.ones((6, 4))])
    biased = Dense(4)
    with pytest.raises(ValueError, match=r"bias shape \(3,\) does not match \(4,\)"):
        biased.set_weights([np.ones((2, 4)), np.ones(3)])


def test_config_round_trips():
    layer = Dense(3, activation="tanh", use_bias=False, name="head")
    config = layer.get_config()
    assert config == {"name": "head", "units": 3, "activation": "tanh", "use_bias": False}
    assert Dense.from_config(config).get_config() == config


def test_names_are_unique_and_validated():
    assert Dense(1).name != Dense(1).name
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        Dense(1, name="")
