"""The single-input layers (activations, normalizations, reshaping, rescaling) against Keras with large inputs, and where they fold.

The zoo's SINGLE_INPUT_LAYER_MODELS (tests/keras_zoo.py) run in tests/converters/test_equivalence.py on inputs
in [-1, 1] at batch 1, 7 and 100, layer by layer and through a malinn file; here the same models
take inputs far outside [-1, 1] (``x_large``: standard deviation 30 to 100, or raw tabular
features such as a year or an income), and the layers that fold into a Dense are checked to.
"""

from __future__ import annotations

import pytest
from keras_zoo import FORMATS, single_input_layer_models
from test_equivalence import assert_keras_close, group_of, load

import malinn

CASES = [
    pytest.param(fmt, key, id=f"{fmt}-{key}")
    for fmt, (generation, _) in FORMATS.items()
    for key in single_input_layer_models(generation)
]


@pytest.mark.parametrize("fmt,key", CASES)
def test_large_inputs_match_keras(keras_zoo, device, fmt, key):
    data = keras_zoo.data(fmt, key)
    model = load(keras_zoo, fmt, key)
    for batch in (1, 7, 100):
        assert_keras_close(
            model.predict(data["x_large"][:batch]), data["y_large"][:batch], f"{fmt} {key} large inputs, batch {batch}"
        )


@pytest.mark.parametrize("fmt", [pytest.param(f, id=f) for f in FORMATS])
def test_affine_layers_fold_into_a_neighbouring_dense(keras_zoo, fmt):
    """A last-axis BatchNormalization or Rescaling after a linear Dense folds into it; a pure scale
    before a Dense folds into that one; a Normalization of raw inputs (a shift) does not."""
    model = load(keras_zoo, fmt, "batchnorm_axes")
    assert isinstance(group_of(model, "bn3_folded"), malinn.layers.Dense)
    assert isinstance(group_of(model, "bn1"), malinn.layers.BatchNormalization)
    model = load(keras_zoo, fmt, "preprocessing")
    assert group_of(model, "resc_scale").keras_names == ("d3", "resc_scale")
    assert isinstance(group_of(model, "norm"), malinn.layers.Normalization)
    model = load(keras_zoo, fmt, "dense_nd")
    assert group_of(model, "resc_first").keras_names == ("resc_first", "d13")


@pytest.mark.parametrize("fmt", [pytest.param(f, id=f) for f in FORMATS])
def test_time_distributed_becomes_the_layer_itself(keras_zoo, fmt):
    model = load(keras_zoo, fmt, "timedistributed")
    kinds = {layer.keras_names[0]: type(layer).__name__ for layer in model.layers}
    assert kinds["td_flat"] == "Reshape" and kinds["td_dense"] == "Dense" and kinds["td_softmax"] == "Softmax"
    assert model.output_shape == (None, 2)


@pytest.mark.parametrize("fmt", [pytest.param(f, id=f) for f in FORMATS])
def test_a_normalization_has_the_weights_keras_gives_it(keras_zoo, fmt):
    """An adapted Normalization holds [mean, variance, count]; one given its statistics in the
    constructor holds none, as Keras's (they are its config): it counted 2n + 1 parameters, and
    Keras's get_weights() could not be set on the model."""
    seen = set()
    for key in ("preprocessing", "normalization_axes"):
        entry = keras_zoo.require(fmt, key)
        model = load(keras_zoo, fmt, key)
        for keras_layer in entry["layers"]:
            if keras_layer["class_name"] != "Normalization":
                continue
            layer = group_of(model, keras_layer["name"])
            if isinstance(layer, malinn.layers.Normalization):  # else folded into a Dense
                assert len(layer.get_weights()) == keras_layer["n_weights"], keras_layer["name"]
                assert layer.count_params() == sum(w.size for w in layer.get_weights())
                seen.add(keras_layer["n_weights"])
        assert layer is not None
    assert seen == {0, 3}  # both kinds met
