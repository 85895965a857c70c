"""An Input's dtype, as Keras applies it: a cast at the model's entry.

``Dense`` of ones on [0.7, -1.6, 2.5, 300.2] after ``Input(dtype="int32")`` is 301 in Keras (the
input truncated toward zero first); malinn gave 301.8, and took "int8", "string" or "nonsense"
without a word. The zoo's ``input_<dtype>`` models (tests/keras_zoo.py: Keras 3 ``.keras`` and
tf_keras ``.h5``, a Dense of the identity after the Input) and its two-input graph give Keras's
own predict; the refusals are checked on Keras 3 archives written here (tests/converters/keras_files.py).
"""

from __future__ import annotations

import copy
import json

import h5py
import numpy as np
import pytest
from keras_files import dense, dense_weights, keras_object, sequential, write_keras
from keras_zoo import INPUT_DTYPES

import malinn
from malinn import ConversionError

#: one file per Keras generation
ZOO_FORMATS = ("keras3-zip", "keras2-h5")


def assert_like_keras(got, want, what):
    """Equal to Keras's output bit for bit where Keras's is exact (each output is one cast value
    through a Dense of the identity), NaN where Keras has NaN."""
    np.testing.assert_array_equal(got, want, err_msg=what)


@pytest.mark.parametrize("fmt", ZOO_FORMATS)
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
def test_an_inputs_dtype_is_cast_to_as_keras_casts_it(keras_zoo, device, fmt, dtype):
    """int32 truncates toward zero (300.2 -> 300, NaN and 1e10 -> -2^31), uint8 wraps (-1.6 ->
    255, 300.2 -> 44), bool is 1 for anything not 0 (NaN too), float16 and bfloat16 round (1e10 ->
    inf as float16); a second call (the plan kept, no check repeated) casts again."""
    data = keras_zoo.data(fmt, f"input_{dtype}")
    model = malinn.load_model(keras_zoo.path(fmt, f"input_{dtype}"))
    for call in range(2):
        assert_like_keras(model.predict(data["x"]), data["y"], f"{fmt} input_{dtype}, call {call}")
    assert_like_keras(model.predict(data["x"].astype(np.float64)), data["y"], f"{fmt} input_{dtype}, float64 given")


@pytest.mark.parametrize("fmt", ZOO_FORMATS)
def test_each_input_of_a_graph_is_cast_to_its_own_dtype(keras_zoo, device, fmt):
    data = keras_zoo.data(fmt, "input_dtypes_graph")
    model = malinn.load_model(keras_zoo.path(fmt, "input_dtypes_graph"))
    assert isinstance(model, malinn.Functional)
    assert [t.dtype for t in model.inputs] == ["int32", "uint8"]
    assert_like_keras(model.predict([data["x_a"], data["x_b"]]), data["y"], f"{fmt} input_dtypes_graph")
    assert_like_keras(model.predict({"a_int32": data["x_a"], "b_uint8": data["x_b"]}), data["y"], "by name")


@pytest.mark.parametrize("fmt", ZOO_FORMATS)
def test_a_converted_file_carries_the_input_dtype(keras_zoo, device, tmp_path, fmt):
    """The malinn file records the dtype (format version 3: a malinn that would not cast refuses
    it) and predicts as the Keras file does; a float32 model's file stays version 1 without one."""
    for key, dtype in (("input_uint8", "uint8"), ("input_dtypes_graph", None)):
        data = keras_zoo.data(fmt, key)
        x = data["x"] if dtype else [data["x_a"], data["x_b"]]
        dst = malinn.convert(keras_zoo.path(fmt, key), tmp_path / f"{key}.malinn", target="cpu")
        with h5py.File(dst, "r") as f:
            config = json.loads(f.attrs["config"])
            assert f.attrs["format_version"] == 3
        if dtype:
            assert config["input_dtype"] == dtype
        else:
            assert [entry["dtype"] for entry in config["inputs"]] == ["int32", "uint8"]
        assert_like_keras(malinn.load_model(dst).predict(x), data["y"], f"{fmt} {key} through a malinn file")
    dst = malinn.convert(keras_zoo.path(fmt, "input_float64"), tmp_path / "float64.malinn", target="cpu")
    with h5py.File(dst, "r") as f:
        assert json.loads(f.attrs["config"])["input_dtype"] == "float64" and f.attrs["format_version"] == 3


def test_a_file_without_an_input_dtype_is_float32(device, tmp_path):
    """Files written before the dtype was recorded have none: float32, no cast."""
    model = malinn.Sequential([malinn.Input((4,), dtype="int32"), malinn.layers.Dense(1, use_bias=False)])
    model.layers[0].set_weights([np.ones((4, 1), np.float32)])
    path = model.save(tmp_path / "m.malinn", target="cpu")
    with h5py.File(path, "r+") as f:
        config = json.loads(f.attrs["config"])
        del config["input_dtype"]
        f.attrs["config"] = json.dumps(config)
        f.attrs["format_version"] = 1
    x = np.array([[0.7, -1.6, 2.5, 300.2]], np.float32)
    np.testing.assert_allclose(malinn.load_model(path).predict(x), [[301.8]], rtol=1e-6)
    np.testing.assert_array_equal(model.predict(x), [[301.0]])


# ---------------------------------------------------------------------------- refusals


def with_input_dtype(dtype):
    config = sequential([dense("d0", 3, in_width=4)], width=4)
    config["config"]["layers"][0]["config"]["dtype"] = dtype
    return config


@pytest.mark.parametrize(
    "dtype", ["string", "nonsense", "complex64", "float8_e4m3fn", 5, keras_object("keras", "DTypePolicy", {})]
)
def test_an_input_dtype_malinn_cannot_cast_to_is_refused_by_name(tmp_path, dtype):
    src = write_keras(tmp_path / "m.keras", with_input_dtype(dtype), dense_weights([4, 3]))
    with pytest.raises(ConversionError) as info:
        malinn.load_model(src)
    message = str(info.value)
    for fragment in (
        "m.keras",
        "input 'input_layer'",
        f"dtype {dtype!r} is not supported",
        "int32, int64, uint8",
        "bool",
    ):
        assert fragment in message, message


@pytest.mark.parametrize("policy", ["int8", "int32", "string", "nonsense", "complex64", "bool"])
def test_a_layers_dtype_policy_malinn_does_not_compute_is_refused_by_name(tmp_path, policy):
    """Keras 3 writes a policy as DTypePolicy {"name": ...}, tf_keras as a plain name: both named."""
    config = sequential([dense("d0", 3, in_width=4), dense("d1", 2, dtype=policy)], width=4)
    config["config"]["layers"][1]["config"]["dtype"] = keras_object("keras", "DTypePolicy", {"name": policy})
    src = write_keras(tmp_path / "m.keras", config, dense_weights([4, 3, 2]))
    with pytest.raises(ConversionError) as info:
        malinn.convert(src, tmp_path / "m.malinn", target="cpu")
    message = str(info.value)
    for fragment in (
        "m.keras",
        "layer 'd1' (Dense)",
        f"dtype policy {policy!r}",
        "float32, float64, float16",
        "mixed_bfloat16",
        "int8-quantized",
    ):
        assert fragment in message, message
    assert not (tmp_path / "m.malinn").exists()


@pytest.mark.parametrize("policy", ["float32", "float64", "mixed_float16", "bfloat16"])
def test_the_float_policies_are_read(tmp_path, device, policy):
    config = sequential([dense("d0", 3, in_width=4, dtype=policy)], width=4)
    weights = dense_weights([4, 3])
    model = malinn.load_model(write_keras(tmp_path / "m.keras", config, weights))
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(model.predict(x), x @ weights[0][0] + weights[0][1], rtol=1e-5, atol=1e-5)


def test_a_nested_models_input_dtype_is_refused(tmp_path):
    """Keras casts a nested model's input to its dtype in the middle of the graph; malinn casts the
    model's own inputs only, and says so."""
    inner = sequential([dense("d0", 3, in_width=4)], name="inner", width=4)
    inner["config"]["layers"][0]["config"]["dtype"] = "int32"
    outer = sequential([copy.deepcopy(inner), dense("d1", 2, in_width=3)], name="outer", width=4)
    src = write_keras(tmp_path / "m.keras", outer, dense_weights([4, 3, 2]))
    with pytest.raises(
        ConversionError,
        match=r"input 'input_layer' of the nested model 'inner' has dtype 'int32'.*"
        r"give the outer model's Input that dtype",
    ):
        malinn.load_model(src)
