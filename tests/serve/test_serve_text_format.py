"""TensorFlow Serving's config files in protocol buffers' text format: the reader's values, lists
and refusals (with their line and column), the model config and batching parameters files read to
what their JSON forms give, and a server started from them answering as Keras does."""

from __future__ import annotations

import json
import math

import pytest
from serving import ServerProcess, close, metric

from malinn.serve.config import BatchingParameters, ConfigError, read_batching_file, read_config_file
from malinn.serve.text_format import TextFormatError, read_text_format

MODEL_CONFIG = """# TensorFlow Serving's models.config
model_config_list {
  config {
    name: 'digits'
    base_path: "digits"
    model_platform: 'tensorflow'
    model_version_policy { specific { versions: 3 versions: 1 } }
    version_labels { key: 'stable' value: 3 }
    version_labels: < key: "canary", value: 1 >
  }
  config: { name: "camera", base_path: 'camera', model_version_policy: { all: {} } };
}
"""

BATCHING = """max_batch_size { value: 16 }
batch_timeout_micros { value: 500 }
max_enqueued_batches { value: 1000 }
num_batch_threads { value: 8 }
allowed_batch_sizes: 4
allowed_batch_sizes: 16
pad_variable_length_inputs: true
"""


def test_scalars_messages_and_repeated_fields_read_as_python_values():
    text = (
        "s: 'a\\'b' \"c\\n\" 'd\\101\\x42'  i: -12 h: 0x1F o: 010 f: 2.5e1 g: 1.5f t: true n: false\n"
        "e: ENUM_NAME  x: -inf  m { r: 1 r: [2, 3] }  m2: < k: 'v' >  # a comment: 1\n"
        "r: [] ; q {}"
    )
    got = read_text_format(text, frozenset({"r"}))
    assert got.pop("x") == -math.inf
    assert got == {
        "s": "a'bc\ndAB",
        "i": -12,
        "h": 31,
        "o": 8,
        "f": 25.0,
        "g": 1.5,
        "t": True,
        "n": False,
        "e": "ENUM_NAME",
        "m": {"r": [1, 2, 3]},
        "m2": {"k": "v"},
        "r": [],
        "q": {},
    }
    assert isinstance(got["i"], int) and isinstance(got["f"], float)


@pytest.mark.parametrize(
    "text, words",
    [
        ("a {\n  b: 1\n", ["line 3, column 1", "expected '}'"]),
        ("a: 1\na: 2", ["line 2, column 1", "'a' is given twice"]),
        ("a: [1, 2]", ["'a' is given a list"]),
        ("a b", ["line 1, column 3", "expected ':' or '{'"]),
        ("a: 09", ["'09' is not a number"]),
        ("}", ["expected a field's name"]),
        ("a: 'open\n", ["line 1, column 4", "a string not closed"]),
        ("a: [1 2]", ["expected ',' or ']'"]),
        ("a: @", ["unexpected '@'"]),
        ("a:", ["unexpected end"]),
        ("a { b: 1 >", ["expected a field's name, got '>'"]),
    ],
)
def test_text_that_is_not_the_format_is_refused_naming_where(text, words):
    with pytest.raises(TextFormatError) as raised:
        read_text_format(text)
    for word in words:
        assert word in str(raised.value), (word, str(raised.value))


def test_a_text_format_model_config_reads_as_its_json_form(tmp_path):
    (tmp_path / "digits" / "3").mkdir(parents=True)
    (tmp_path / "camera").mkdir()
    text, as_json = tmp_path / "models.config", tmp_path / "models.json"
    text.write_text(MODEL_CONFIG)
    entry = {"model_platform": "tensorflow", "model_version_policy": {"specific": {"versions": [3, 1]}}}
    as_json.write_text(
        json.dumps(
            {
                "model_config_list": {
                    "config": [
                        {
                            "name": "digits",
                            "base_path": "digits",
                            **entry,
                            "version_labels": {"stable": 3, "canary": 1},
                        },
                        {"name": "camera", "base_path": "camera", "model_version_policy": {"all": {}}},
                    ]
                }
            }
        )
    )
    read = read_config_file(text, BatchingParameters())
    assert read == read_config_file(as_json, BatchingParameters())
    digits, camera = read.models
    assert digits.policy == ("specific", (1, 3)) and digits.labels == {"stable": 3, "canary": 1}
    assert digits.base_path == tmp_path / "digits" and camera.policy == ("all", None)


def test_a_tensorflow_serving_batching_file_sets_the_batching_parameters(tmp_path):
    path = tmp_path / "batching.config"
    path.write_text(BATCHING)
    got = read_batching_file(path, BatchingParameters(max_batch_size=64, batch_timeout_micros=7))
    assert got == BatchingParameters(
        max_batch_size=16, batch_timeout_micros=500, max_enqueued_batches=1000, allowed_batch_sizes=(4, 16)
    )
    (tmp_path / "batching.json").write_text(json.dumps({"max_batch_size": {"value": 8}, "allowed_batch_sizes": [2, 8]}))
    assert read_batching_file(tmp_path / "batching.json", got) == BatchingParameters(
        max_batch_size=8, batch_timeout_micros=500, max_enqueued_batches=1000, allowed_batch_sizes=(2, 8)
    )


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("models.config", "model_config_list {\n  config { name: 'a' base_path: '.' }\n", ["line 3", "expected '}'"]),
        (
            "models.config",
            "model_config_list { config { name: 'a' base_path: '.' logging_config {} } }",
            ["unknown key", "logging_config"],
        ),
        (
            "models.config",
            "model_config_list { config { name: 'a' base_path: '.' version_labels { key: 'x' } } }",
            ["version_labels entry", "a value"],
        ),
        ("models.config", "model_config_list { }", ["non-empty list"]),
        ("batching.config", "num_batch_threads { value: 0 }", ["num_batch_threads", "a positive integer"]),
        (
            "batching.config",
            "max_execution_batch_size { value: 8 }",
            ["unknown batching parameter", "max_execution_batch_size"],
        ),
        ("batching.config", "max_batch_size { value: 16 } max_batch_size { value: 8 }", ["line 1", "given twice"]),
    ],
)
def test_a_bad_text_format_file_is_refused_naming_the_file_and_the_entry(tmp_path, name, text, words):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        if name.startswith("batching"):
            read_batching_file(path, BatchingParameters())
        else:
            read_config_file(path, BatchingParameters())
    for word in words + [str(path)]:
        assert word in str(raised.value), (word, str(raised.value))


def test_a_server_started_from_tensorflow_servings_files_answers_as_keras(tmp_path, keras_models):
    x, y = next(iter(keras_models.x("mlp").values())), next(iter(keras_models.y("mlp").values()))
    config, batching = tmp_path / "models.config", tmp_path / "batching.config"
    config.write_text(
        f"model_config_list {{ config {{ name: 'mlp' base_path: '{keras_models.path('mlp')}' "
        "model_platform: 'tensorflow' version_labels { key: 'stable' value: 1 } } }"
    )
    batching.write_text(BATCHING)
    server = ServerProcess(
        "--model-config-file", str(config), "--batching-parameters-file", str(batching), "--parse-workers", "0"
    ).wait_ready()
    try:
        status, answer = server.predict("mlp", {"instances": x[:5].tolist()})
        assert status == 200, answer
        close(answer["predictions"], y[:5])
        status, answer = server.request("POST", "/v1/models/mlp/labels/stable:predict", {"instances": x[5:6].tolist()})
        assert status == 200, answer
        close(answer["predictions"], y[5:6])
        # the batching file's allowed sizes (4, 16): 5 samples ran padded to 16, one to 4
        assert metric(server.metrics(), "malinn_serve_padded_samples_total", model="mlp", version="1") == 11 + 3
    finally:
        assert server.stop() == 0, "\n".join(server.stderr)
