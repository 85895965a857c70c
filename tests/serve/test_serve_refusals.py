"""What a predict body the model cannot take is answered, word for word, and what the config file
of docs/SERVING.md reads as: a wrong shape names the input's dtype, an integer input refuses values
beyond its dtype's range (cast, they would wrap round), a refusal names a JSON value with its
article and a number as JSON writes it, and a model's own max_batch_size under inherited
allowed_batch_sizes is refused saying where they came from."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import malinn
from malinn.layers import Dense, Embedding, Flatten
from malinn.serve.config import BatchingParameters, ConfigError, read_config_file
from malinn.serve.payload import BadRequest, parse_predict
from malinn.serve.signature import Signature

SERVING_MD = Path(__file__).resolve().parents[2] / "docs" / "SERVING.md"


@pytest.fixture(scope="module")
def floats() -> Signature:
    model = malinn.Sequential([Dense(3)], name="tiny")
    model.build((None, 4))
    return Signature(model)


@pytest.fixture(scope="module")
def ids() -> Signature:
    tokens = malinn.Input((3,), name="ids", dtype="int32")
    model = malinn.Model(tokens, Dense(2)(Flatten()(Embedding(10, 4)(tokens))))
    return Signature(model)


def refusal(body, signature: Signature) -> str:
    with pytest.raises(BadRequest) as raised:
        parse_predict(body if isinstance(body, bytes) else json.dumps(body).encode(), signature)
    return str(raised.value)


def test_a_wrong_shape_names_the_input_its_dtype_and_both_shapes(floats, ids):
    name = floats.input_names[0]
    assert refusal({"instances": [[1, 2, 3]]}, floats) == (
        f"input {name!r} (DT_FLOAT): expected shape (None, 4), got (1, 3)"
    )
    assert refusal({"inputs": [1, 2, 3, 4]}, floats) == (
        f"input {name!r} (DT_FLOAT): expected shape (None, 4), got (4,) (the batch axis first: a list of samples)"
    )
    assert refusal({"instances": [[1, 2]]}, ids) == "input 'ids' (DT_INT32): expected shape (None, 3), got (1, 2)"


def test_a_fraction_for_an_integer_input_is_named_as_json_writes_it(ids):
    assert refusal({"instances": [[1, 2.5, 3]]}, ids) == (
        "input 'ids' (DT_INT32, shape (None, 3)): expected integers, got 2.5"
    )


@pytest.mark.parametrize(
    "row, bad",
    [
        ([1, 2**40, 3], "1099511627776"),
        ([1, -(2**31) - 1, 3], "-2147483649"),
        ([1, 2**31, 3], "2147483648"),
        ([1, 3e9, 3], "3000000000.0"),
        ("[1, Infinity, 3]", "inf"),
    ],
)
def test_an_integer_beyond_the_inputs_dtype_is_refused(ids, row, bad):
    body = ('{"instances": [' + (row if isinstance(row, str) else json.dumps(row)) + "]}").encode()
    assert refusal(body, ids) == (
        f"input 'ids' (DT_INT32, shape (None, 3)): {bad} is out of the range of int32 (-2147483648 to 2147483647)"
    )


def test_the_integers_at_the_ends_of_the_range_are_taken(ids):
    parsed = parse_predict(json.dumps({"inputs": [[2**31 - 1, -(2**31), 0], [7, 8, 9]]}).encode(), ids)
    assert parsed.samples == 2 and parsed.columnar
    np.testing.assert_array_equal(
        parsed.arrays[0], np.array([[2**31 - 1, -(2**31), 0], [7, 8, 9]], np.float64).astype(np.float32)
    )


def test_a_refusal_names_a_json_value_with_its_article(floats):
    name = floats.input_names[0]
    assert refusal({"instances": {"x": [[1, 2, 3, 4]]}}, floats) == (
        "'instances' must be a list of samples, got an object"
    )
    assert refusal(b'"text"', floats) == (
        "the request body must be a JSON object with 'instances' or 'inputs', got a string"
    )
    assert refusal({"instances": [{"x": [1, 2, 3, 4]}, None]}, floats) == (
        "instances[1] is null, the first an object: give every sample as an object of the inputs by name"
    )
    assert refusal({"inputs": {"x": 5}}, floats) == (
        f"input {name!r} (DT_FLOAT, shape (None, 4)): expected a list of samples in 'inputs', got a number"
    )


def test_the_config_file_of_the_docs_reads_as_it_says(tmp_path):
    text = SERVING_MD.read_text().split("## Config file", 1)[1]
    document = json.loads(re.search(r"```json\n(.*?)```", text, re.S)[1])
    (tmp_path / "digits" / "3").mkdir(parents=True)
    (tmp_path / "camera").mkdir()
    (tmp_path / "camera" / "mobilenet.malinn").write_bytes(b"")
    path = tmp_path / "models.json"
    path.write_text(json.dumps(document))
    (digits, camera), batching, parse_workers = read_config_file(path, BatchingParameters())
    assert parse_workers == 4
    assert batching == BatchingParameters(max_batch_size=32, allowed_batch_sizes=(1, 4, 16, 32))
    assert digits.name == "digits" and digits.base_path == tmp_path / "digits" and digits.labels == {"stable": 3}
    assert digits.batching == BatchingParameters(max_batch_size=16, allowed_batch_sizes=(1, 4, 16))
    assert digits.batching.sizes() == (1, 4, 16) and digits.policy == ("latest", 1)
    assert camera.batching == batching and camera.precision == "fp16-storage"


def test_a_models_max_batch_size_under_inherited_allowed_sizes_says_where_they_came_from(tmp_path):
    (tmp_path / "m").mkdir()
    path = tmp_path / "models.json"
    path.write_text(
        json.dumps(
            {
                "model_config_list": [{"name": "m", "base_path": "m", "batching_parameters": {"max_batch_size": 16}}],
                "batching_parameters": {"max_batch_size": 32, "allowed_batch_sizes": [1, 4, 16, 32]},
            }
        )
    )
    with pytest.raises(ConfigError) as raised:
        read_config_file(path, BatchingParameters())
    assert str(raised.value) == (
        f"config file {str(path)!r}, model_config_list[0] ('m'): max_batch_size 16 does not end the "
        f"allowed_batch_sizes [1, 4, 16, 32] it inherits (from the file's batching_parameters or "
        f"--allowed-batch-sizes); give it its own allowed_batch_sizes, the last equal to max_batch_size"
    )
