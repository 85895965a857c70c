"""Custom objects are refused by name, never read as the built-ins they are named like.

A Dense subclass registered as ``adv>Dense``, a Sequential subclass with its own ``call`` and an
activation registered as ``adv>relu`` each compute twice the built-in; Keras loads their files only
with that code. The zoo (tests/keras_zoo.py) saves each with Keras 3 and tf_keras, as ``.keras`` and
``.h5``; the other cases are configs written here (keras_files.py), one field changed at a time.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from keras_files import dense, dense_weights, keras_object, sequential, write_keras
from keras_zoo import CUSTOM_MODELS, FORMATS
from support import dense_forward

import malinn
from malinn import ConversionError
from malinn.converters import read_keras

CUSTOM_CASES = [pytest.param(fmt, key, id=f"{fmt}-{key}") for fmt in FORMATS for key in CUSTOM_MODELS]


def assert_refused(src, tmp_path, *fragments):
    """convert and load_model both raise ConversionError naming the file and ``fragments``;
    no file is written."""
    dst = tmp_path / "out.malinn"
    messages = []
    for attempt in (lambda: malinn.convert(src, dst), lambda: malinn.load_model(src)):
        with pytest.raises(ConversionError) as info:
            attempt()
        messages.append(str(info.value))
    assert not dst.exists()
    for message in messages:
        assert "\n" not in message and "custom code" in message, message
        for fragment in (src.name,) + fragments:
            assert fragment in message, f"{fragment!r} is not in: {message}"
    return messages[0]


@pytest.mark.parametrize("fmt,key", CUSTOM_CASES)
def test_custom_objects_named_like_builtins_are_refused(keras_zoo, tmp_path, fmt, key):
    """Before: the .keras files (and the .h5 Sequential subclass and activation) converted as the
    built-ins and computed half of Keras's result."""
    src = keras_zoo.path(fmt, key)
    assert_refused(src, tmp_path, *CUSTOM_MODELS[key])


@pytest.mark.parametrize("fmt", [pytest.param(f, id=f) for f in ("keras3-zip", "tf_keras-zip")])
def test_custom_dense_names_class_registered_name_and_module(keras_zoo, tmp_path, fmt):
    message = assert_refused(keras_zoo.path(fmt, "custom_dense"), tmp_path)
    assert "layer 'd_adv' (class 'Dense', registered as 'adv>Dense', module 'adv.layers')" in message
    assert "'d2'" not in message  # the built-in Dense beside it is not blamed
    message = assert_refused(keras_zoo.path(fmt, "custom_sequential"), tmp_path)
    assert "model 'doubled' (class 'AdvSequential', registered as 'adv>AdvSequential', module None)" in message


# ---------------------------------------------------------------------------------------------
# one field at a time, in configs written here (no Keras needed)

WIDTHS = (4, 3, 2)


def base_config():
    return sequential([dense("d0", 3, "relu", in_width=4), dense("d1", 2, in_width=3)], width=4)


def first_layer(config):
    return config["config"]["layers"][1]


def _set_activation(value):
    def edit(config):
        first_layer(config)["config"]["activation"] = value

    return edit


def _set_layer(**fields):
    def edit(config):
        first_layer(config).update(fields)

    return edit


def _set_model(**fields):
    def edit(config):
        config.update(fields)

    return edit


def _nest_in_custom_sequential(config):
    inner = sequential(config["config"]["layers"][1:], name="inner")
    inner.update(module=None, class_name="Doubling", registered_name="adv>Doubling")
    config["config"]["layers"][1:] = [inner]


def _custom_dtype_policy(config):
    first_layer(config)["config"]["dtype"] = keras_object(
        "adv.policies", "DTypePolicy", {"name": "float32"}, "adv>DTypePolicy"
    )


REFUSED = {
    "layer module of its own": (_set_layer(module="adv.layers"), ["layer 'd0'", "module 'adv.layers'"]),
    "layer module null (__main__)": (_set_layer(module=None), ["layer 'd0'", "module None"]),
    "layer module of a package named keras_*": (_set_layer(module="keras_hub.layers"), ["module 'keras_hub.layers'"]),
    "registered name in a keras module": (
        _set_layer(registered_name="adv>Dense"),
        ["layer 'd0'", "registered as 'adv>Dense'"],
    ),
    "registered class name, no module (.h5)": (_set_layer(class_name="adv>Dense", module=None), ["class 'adv>Dense'"]),
    "model subclass": (_set_model(class_name="Doubling"), ["model 'sequential'", "class 'Doubling'"]),
    "model module null": (_set_model(module=None), ["model 'sequential'", "module None"]),
    "nested custom model": (_nest_in_custom_sequential, ["model 'inner'", "registered as 'adv>Doubling'"]),
    "activation package>name": (_set_activation("adv>relu"), ["layer 'd0' activation ('adv>relu')"]),
    "activation dotted outside keras": (_set_activation("adv.relu"), ["('adv.relu')"]),
    "registered function": (
        _set_activation(keras_object("builtins", "function", "adv>relu", "function")),
        ["function 'adv>relu'"],
    ),
    "function of another module": (
        _set_activation(keras_object("adv.acts", "function", "relu", "relu")),
        ["function 'relu'", "module 'adv.acts'"],
    ),
    "lambda": (
        _set_activation({"class_name": "__lambda__", "config": {"value": ["abc", None, None]}}),
        ["a Python lambda"],
    ),
    "activation object of its own": (_set_activation(keras_object(None, "ReLU", {}, "adv>ReLU")), ["class 'ReLU'"]),
    "dtype policy of its own": (_custom_dtype_policy, ["layer 'd0' dtype", "module 'adv.policies'"]),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_each_kind_of_custom_object_is_refused(tmp_path, case):
    edit, fragments = REFUSED[case]
    config = base_config()
    edit(config)
    src = write_keras(tmp_path / "custom.keras", config, dense_weights(WIDTHS))
    with pytest.raises(ConversionError) as info:
        read_keras(src)
    message = str(info.value)
    assert "custom code" in message and "custom.keras" in message, message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} is not in: {message}"


def test_every_custom_object_is_named_in_one_message(tmp_path):
    config = base_config()
    first_layer(config)["module"] = "adv.layers"
    config["config"]["layers"][2]["config"]["activation"] = "adv>relu"
    src = write_keras(tmp_path / "two.keras", config, dense_weights(WIDTHS))
    with pytest.raises(ConversionError, match=r"layer 'd0' \(class 'Dense'.*; layer 'd1' activation"):
        read_keras(src)


ACCEPTED = {
    "keras.src module": _set_layer(module="keras.src.layers.core.dense"),
    "registered name equal to the class": _set_layer(registered_name="Dense"),
    "activation as Keras's public function": _set_activation(
        keras_object("keras.activations", "function", "relu", "relu")
    ),
    "activation as a built-in function name": _set_activation(keras_object("builtins", "function", "relu", "function")),
    "activation dotted inside keras": _set_activation("keras.activations.relu"),
    "custom initializer (training only)": lambda config: first_layer(config)["config"].update(
        kernel_initializer=keras_object("adv.init", "Mine", {}, "adv>Mine")
    ),
    "custom regularizer (training only)": lambda config: first_layer(config)["config"].update(
        kernel_regularizer=keras_object(None, "L3", {}, "adv>L3")
    ),
}


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_keras_own_objects_are_read(tmp_path, device, case):
    config = base_config()
    ACCEPTED[case](config)
    weights = dense_weights(WIDTHS)
    src = write_keras(tmp_path / "own.keras", config, weights)
    model = malinn.load_model(src)
    assert [layer.activation for layer in model.layers] == ["relu", "linear"]
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    want = dense_forward(x, [(weights[0][0], weights[0][1], "relu"), (weights[1][0], weights[1][1], "linear")])
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-5, atol=1e-5)


def test_an_activation_that_is_no_serialized_function_is_not_guessed(tmp_path):
    """``{"registered_name": "gelu"}`` is not something Keras writes or reads: not gelu."""
    config = base_config()
    first_layer(config)["config"]["activation"] = {"registered_name": "gelu"}
    src = write_keras(tmp_path / "odd.keras", config, dense_weights(WIDTHS))
    with pytest.raises(ConversionError, match="unsupported"):
        malinn.convert(src, tmp_path / "odd.malinn")


def test_the_base_config_itself_is_not_custom(tmp_path):
    """The configs above differ from a convertible one in the edited field only."""
    src = write_keras(tmp_path / "base.keras", copy.deepcopy(base_config()), dense_weights(WIDTHS))
    assert [layer.name for layer in read_keras(src).layers] == ["d0", "d1"]
