"""``malinn.Input(shape, dtype=...)``: predict casts the input to it first, as Keras does
(malinn/layers/dtypes.py; the values are Keras's, tests/converters/test_input_dtypes.py compares with
Keras itself)."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

import malinn
from malinn import ConversionError, Functional, Input, Sequential
from malinn.layers import Add, Dense
from malinn.layers.dtypes import INPUT_DTYPES, input_cast, input_dtype

X = np.array([[0.7, -1.6, 2.5, 300.2]], np.float32)


def ones_model(dtype, functional=False):
    dense = Dense(1, use_bias=False)
    if functional:
        x = Input((4,), dtype=dtype)
        model = Functional(x, dense(x))
    else:
        model = Sequential([Input((4,), dtype=dtype), dense])
    dense.set_weights([np.ones((4, 1), np.float32)])
    return model


@pytest.mark.parametrize("functional", [False, True], ids=["sequential", "functional"])
@pytest.mark.parametrize(
    "dtype, want",
    [
        ("int32", 301.0),
        ("uint8", 301.0),
        (np.uint8, 301.0),
        ("bool", 4.0),
        (bool, 4.0),
        ("int8", 45.0),
        ("float16", 301.8505859375),
        (None, 301.8),
    ],
)
def test_a_dense_of_ones_reads_the_input_cast_to_its_dtype(device, dtype, want, functional):
    """int32: 0 - 1 + 2 + 300; uint8: 0 + 255 + 2 + 44 (wrapped); bool: 4 ones; int8: 0 - 1 + 2 +
    44 (300 wraps); float16: the values rounded to half (0.7002 - 1.5996 + 2.5 + 300.25). Twice:
    the second call takes the kept plan and casts again."""
    model = ones_model(dtype, functional)
    for _ in range(2):
        np.testing.assert_allclose(model.predict(X), [[want]], rtol=1e-6)


def test_each_input_of_a_graph_is_cast_to_its_own_dtype(device):
    a, b = Input((4,), name="a", dtype="int32"), Input((4,), name="b")
    model = Functional([a, b], Add()([a, b]))
    np.testing.assert_array_equal(model.predict([X, X]), np.float32([[0.7, -2.6, 4.5, 600.2]]))
    assert [t.dtype for t in model.inputs] == ["int32", "float32"]


def test_an_integer_array_is_cast_from_its_own_values_and_a_float64_one_as_float32_first(device):
    """Keras's predict takes a float64 array as float32 (2.9999999999 is 3.0, then 3) and casts
    an int64 one as it is (2^40 + 3 wraps to 3 as int32)."""
    model = ones_model("int32")
    np.testing.assert_array_equal(model.predict(np.array([[2.9999999999, 0, 0, 0]])), [[3.0]])
    np.testing.assert_array_equal(model.predict(np.array([[2**40 + 3, 0, 0, 0]], np.int64)), [[3.0]])


def test_bfloat16_rounds_to_nearest_even_and_keeps_nan_and_infinities():
    cast = input_cast("bfloat16")
    x = np.array([1.00390625, 1.01171875, 0.69921875, 300.2, np.nan, np.inf, -np.inf, 3.4e38, -0.0], np.float32)
    got = cast(x)
    np.testing.assert_array_equal(got, [1.0, 1.015625, 0.69921875, 300.0, np.nan, np.inf, -np.inf, np.inf, -0.0])
    assert got.dtype == np.float32 and np.signbit(got[-1])


def test_every_input_dtype_casts_to_float32_and_float32_and_float64_need_none():
    x = np.array([[-1.6, 300.2, np.nan, 1e10]], np.float32)
    for dtype in INPUT_DTYPES:
        cast = input_cast(dtype)
        if dtype in ("float32", "float64"):
            assert cast is None
        else:
            assert cast(x).dtype == np.float32 and cast(x).shape == x.shape
    np.testing.assert_array_equal(input_cast("int16")(x), [[-1, 300, 0, 0]])  # NaN and 1e10: C's conversion on x86


@pytest.mark.parametrize("dtype", ["string", "nonsense", "float", "complex64", np.complex64, object, 5, "int4"])
def test_an_input_dtype_that_cannot_be_cast_to_is_refused_by_name(dtype):
    with pytest.raises(ValueError) as info:
        Input((4,), name="pixels", dtype=dtype)
    message = str(info.value)
    assert f"Input 'pixels': dtype {dtype!r} is not supported" in message, message
    assert "float32, float64, float16, bfloat16, int8" in message and "bool" in message, message


def test_numpy_types_and_names_are_keras_s_names():
    assert [input_dtype(d) for d in (np.int32, np.dtype("uint16"), bool, np.float16, None, "bfloat16")] == [
        "int32",
        "uint16",
        "bool",
        "float16",
        "float32",
        "bfloat16",
    ]


def test_a_saved_model_keeps_its_input_dtype(device, tmp_path):
    for functional in (False, True):
        path = ones_model("uint8", functional).save(tmp_path / f"m{functional}.malinn", target="cpu")
        with h5py.File(path, "r") as f:
            assert f.attrs["format_version"] == 3
        np.testing.assert_array_equal(malinn.load_model(path).predict(X), [[301.0]])
    path = ones_model(None).save(tmp_path / "float.malinn", target="cpu")
    with h5py.File(path, "r") as f:
        assert f.attrs["format_version"] == 1 and "input_dtype" not in json.loads(f.attrs["config"])


def test_a_file_giving_an_input_a_dtype_it_cannot_have_is_refused(device, tmp_path):
    path = ones_model("int32").save(tmp_path / "m.malinn", target="cpu")
    with h5py.File(path, "r+") as f:
        config = json.loads(f.attrs["config"])
        config["input_dtype"] = "string"
        f.attrs["config"] = json.dumps(config)
    with pytest.raises(
        ConversionError,
        match=r"m.malinn.*Sequential 'sequential'.s input: dtype 'string' is not "
        r"supported",
    ):
        malinn.load_model(path)
