"""Layers of nested models that share a name: a saved model loaded and wrapped with a new head
(transfer learning), where Keras names the new Dense ``dense`` beside the encoder's own ``dense``.

Keras keeps layer names unique per model, not across the models nested in it; malinn tells such
layers apart by their path through the nested models (``encoder/dense``), keeps a name used once
as it is, and reads each layer's weights from its own place in every format: ``.keras`` and Keras 3
``.h5``, tf_keras ``.h5`` and ``.keras``, and the JSON + weights split forms. The models come from
tests/keras_zoo.py (``nested_names``: a chain; ``nested_names_graph``: the same names at three
depths of a graph whose nested model is called twice).
"""

from __future__ import annotations

import json

import h5py
import pytest
from keras_zoo import SPLIT_FORMATS
from test_equivalence import assert_keras_close

import malinn
from malinn.converters import read_keras

WHOLE_FORMATS = ["keras3-zip", "keras3-h5", "keras2-h5", "tf_keras-zip"]
#: the zoo model -> malinn's names of its leaf layers, in the order Keras lists them
NAMES = {
    "nested_names": ["encoder/dense", "dense_1", "dense"],
    "nested_names_graph": ["dense", "mid/deep/dense", "mid/dense_1", "add", "cat", "dense_1"],
}
CASES = [pytest.param(fmt, key, id=f"{fmt}-{key}") for fmt in WHOLE_FORMATS + list(SPLIT_FORMATS) for key in NAMES]


def load(zoo, fmt, key, reader=malinn.load_model):
    """``reader`` on the zoo's files of ``key`` in ``fmt`` (a whole file or a split form), with
    the entry and data of that generation."""
    if fmt in SPLIT_FORMATS:
        architecture, weights = zoo.split_paths(fmt, key)
        return reader(architecture, weights=weights), zoo.split_entry(fmt, key), zoo.split_data(fmt, key)
    return reader(zoo.path(fmt, key)), zoo.require(fmt, key), zoo.data(fmt, key)


@pytest.mark.parametrize("fmt,key", CASES)
def test_layers_sharing_a_name_read_their_own_weights(keras_zoo, fmt, key):
    model, entry, _ = load(keras_zoo, fmt, key, read_keras)
    assert [layer.name for layer in model.layers] == NAMES[key]
    assert [layer.name.rsplit("/", 1)[-1] for layer in model.layers] == [layer["name"] for layer in entry["layers"]]
    generation_fmt = (
        fmt if fmt in WHOLE_FORMATS else {"keras3": "keras3-zip", "tf_keras": "keras2-h5"}[SPLIT_FORMATS[fmt][0]]
    )
    for layer, weights in zip(model.layers, keras_zoo.weights(generation_fmt, key)):
        assert len(layer.weights) == len(weights), layer.name
        for got, want in zip(layer.weights, weights):
            assert got.shape == want.shape and (got == want).all(), layer.name


@pytest.mark.parametrize("fmt,key", CASES)
@pytest.mark.formats_once
def test_layers_sharing_a_name_predict_as_keras(keras_zoo, device, tmp_path, fmt, key):
    model, _, data = load(keras_zoo, fmt, key)
    assert [layer.name for layer in model.layers] == NAMES[key]
    for batch in (1, 7, 100):
        assert_keras_close(model.predict(data["x"][:batch]), data["y"][:batch], f"{fmt} {key} batch {batch}")
    saved = malinn.load_model(model.save(tmp_path / "m.malinn"))
    assert [layer.name for layer in saved.layers] == [layer.name for layer in model.layers]
    assert (saved.predict(data["x"]) == model.predict(data["x"])).all()


@pytest.mark.parametrize("fmt", ["keras3-h5", "keras2-h5"])
def test_h5_refuses_two_layers_of_one_name_in_one_nested_model(keras_zoo, tmp_path, fmt):
    """A legacy .h5 names a nested layer's weights by the layer's name alone (``dense/kernel``): two
    layers of one nested model with one name cannot be told apart there (Keras itself cannot write
    such a file); the message says so and names the .keras format, which keeps them apart."""
    path = tmp_path / "clash.h5"
    path.write_bytes(keras_zoo.path(fmt, "nested_names_graph").read_bytes())
    with h5py.File(path, "r+") as f:
        config = json.loads(f.attrs["model_config"])
        mid = next(layer for layer in config["config"]["layers"] if layer["config"].get("name") == "mid")

        def renamed(value):  # mid's own 'dense_1' (and the references to it) named 'dense'
            if isinstance(value, dict):
                return {k: renamed(v) for k, v in value.items()}
            if isinstance(value, list):
                return [renamed(v) for v in value]
            return "dense" if value == "dense_1" else value

        mid["config"] = renamed(mid["config"])
        f.attrs["model_config"] = json.dumps(config)
    with pytest.raises(malinn.ConversionError) as info:
        read_keras(path)
    message = str(info.value)
    assert str(path) in message and "nested model 'mid'" in message and "layers named 'dense'" in message, message
    assert ".keras" in message, message
