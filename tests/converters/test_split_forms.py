"""Keras's split save form: the architecture JSON of ``model.to_json()`` with the file of
``model.save_weights()``, written by Keras 3 (``.weights.h5``) and by tf_keras (Keras 2's ``.h5``
layout, and Keras 3's layout for ``.weights.h5``); TensorFlow's own formats refused with advice.

The zoo (tests/keras_zoo.py) writes every model it builds in each split form too. For every
model of the equivalence tests (every supported layer and activation) malinn must give Keras's
outputs from the pair, layer by layer; for every model of the zoo the pair must read as the
same layers and weights as the whole-model file, or fail the same way.
"""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest
from keras_zoo import SPLIT_FORMATS, SPLIT_READER_FORMAT, equivalence_models
from test_equivalence import assert_keras_close

import malinn
from malinn.converters import read_keras
from malinn.converters.to_malinn import supported_layers

#: The whole-model file each split form is compared with (same generation; Keras 3's .keras holds
#: a LoRA Dense's kernel merged by Keras, as its .weights.h5 does).
WHOLE = {"keras3-split": "keras3-zip", "tf_keras-split": "keras2-h5", "tf_keras-split-v3": "keras2-h5"}
SPLIT_PARAMS = [pytest.param(fmt, id=fmt) for fmt in SPLIT_FORMATS]


def split_cases():
    for fmt, (generation, _, _) in SPLIT_FORMATS.items():
        for key in equivalence_models(generation):
            yield pytest.param(fmt, key, id=f"{fmt}-{key}")


def conversion_error(*args, **kwargs) -> str:
    with pytest.raises(malinn.ConversionError) as info:
        malinn.load_model(*args, **kwargs)
    text = str(info.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def assert_mentions(text, *fragments):
    for fragment in fragments:
        assert str(fragment) in text, f"{fragment!r} not in: {text}"


# ---------------------------------------------------------------------------------------------
# equivalence with Keras


@pytest.mark.parametrize("fmt,key", list(split_cases()))
@pytest.mark.formats_once
def test_split_form_matches_keras(keras_zoo, device, fmt, key):
    architecture, weights = keras_zoo.split_paths(fmt, key)
    entry = keras_zoo.split_entry(fmt, key)
    data = keras_zoo.split_data(fmt, key)
    model = malinn.load_model(architecture, weights=weights)
    assert model.input_shape == (None,) + tuple(entry["input_shape"])
    assert model.source["file"] == str(architecture) and model.source["weights"] == str(weights)
    assert model.source["format"] == SPLIT_READER_FORMAT[fmt]
    for batch in entry["batch_sizes"]:
        assert_keras_close(model.predict(data["x"][:batch]), data["y"][:batch], f"{fmt} {key} batch {batch}")
    x = data["x"][:100]
    for layer, out in zip(model.layers, model.predict_layers(x)):
        last = layer.keras_names[-1]
        assert_keras_close(out, data[f"layer:{last}"][:100], f"{fmt} {key}: {layer.name!r} vs Keras {last!r}")


@pytest.mark.parametrize("fmt", SPLIT_PARAMS)
def test_every_zoo_model_reads_as_its_whole_file_does(keras_zoo, fmt):
    """Same layers and weights (bit for bit) as the generation's whole-model file, or the
    same refusal (custom objects, int8): one reader of each layout for both; a branching graph
    reads as the same graph."""
    generation = SPLIT_FORMATS[fmt][0]
    checked = refused = graphs = 0
    for model_key, entry in keras_zoo.models.items():
        if not model_key.startswith(generation + "/") or fmt not in entry.get("split", {}):
            continue
        key = entry["key"]
        architecture, weights = keras_zoo.split_paths(fmt, key)
        whole = keras_zoo.root / entry["files"][WHOLE[fmt]] if WHOLE[fmt] in entry["files"] else None
        try:
            want = read_keras(whole) if whole else None
        except malinn.ConversionError as exc:
            cause = str(exc).split(": ", 1)[1]
            with pytest.raises(malinn.ConversionError) as info:
                read_keras(architecture, weights=weights)
            # the same refusal (a JSON names a custom class more fully than a .h5 does)
            assert str(info.value).split(": ", 1)[1][:40] == cause[:40], (key, str(info.value), cause)
            refused += 1
            continue
        got = read_keras(architecture, weights=weights)
        assert got.format == SPLIT_READER_FORMAT[fmt] and got.files == (str(architecture), str(weights))
        assert got.source == f"{architecture} + {weights}"
        assert got.keras_major == keras_zoo.split_formats[fmt]["keras_major"]
        # Keras's own names (malinn's are paths through nested models where a name repeats: encoder/dense),
        # Keras 3 operators (x * 2.0) left out: they are not among Keras's layers
        names, keras = [l.name.rsplit("/", 1)[-1] for l in got.layers], [l["name"] for l in entry["layers"]]
        assert [n for n in names if n in keras] == keras and len(set(names) - set(keras)) == len(names) - len(keras), (
            key
        )
        assert tuple(got.input_shape or ()) == tuple(entry.get("input_shape") or ()), key
        if want is None:
            continue
        assert [(l.class_name, l.name) for l in got.layers] == [(l.class_name, l.name) for l in want.layers], key
        assert got.graph == want.graph, key
        graphs += got.graph is not None
        for mine, theirs in zip(got.layers, want.layers):
            if mine.class_name not in supported_layers():
                continue  # tf_keras keeps an LSTM's weights in a sub-object malinn does not read
            assert len(mine.weights) == len(theirs.weights), (key, mine.name)
            for a, b in zip(mine.weights, theirs.weights):
                np.testing.assert_array_equal(a, b, err_msg=f"{key} {mine.name}")
        checked += 1
    assert checked >= 30 and refused >= 3 and graphs >= 1, (checked, refused, graphs)


@pytest.mark.parametrize("key", ["noops", "batchnorm", "multiaxis", "relus", "tiny"])
def test_keras2_list_only_sequential_json(keras_zoo, device, tmp_path, key):
    """Keras 2.0-2.2 wrote a Sequential's config as the bare list of its layers, the input shape
    on the first one."""
    architecture, weights = keras_zoo.split_paths("tf_keras-split", key)
    config = json.loads(architecture.read_text())
    layers = config["config"]["layers"]
    if layers[0]["class_name"] == "InputLayer":
        shape = layers.pop(0)["config"]["batch_input_shape"]
        layers[0]["config"]["batch_input_shape"] = shape
    old = tmp_path / f"{key}_old.json"
    old.write_text(
        json.dumps({"class_name": "Sequential", "config": layers, "keras_version": "2.1.6", "backend": "tensorflow"})
    )
    data = keras_zoo.split_data("tf_keras-split", key)
    model = malinn.load_model(old, weights=weights)
    assert_keras_close(model.predict(data["x"]), data["y"], f"list-only Sequential {key}")


@pytest.mark.parametrize("fmt", ["tf_keras-split", "tf_keras-split-v3"])
def test_keras2_functional_saved_as_model(keras_zoo, tmp_path, fmt):
    """Keras 2 before 2.4 named a Functional model's class Model in its JSON."""
    architecture, weights = keras_zoo.split_paths(fmt, "chain")
    config = json.loads(architecture.read_text())
    assert config["class_name"] == "Functional"
    config["class_name"] = "Model"
    renamed = tmp_path / "chain_model.json"
    renamed.write_text(json.dumps(config))
    got, want = read_keras(renamed, weights=weights), read_keras(architecture, weights=weights)
    assert got.model_class == "Model" and [l.name for l in got.layers] == ["f_gelu", "f_drop", "f_out"]
    for a, b in zip(got.layers, want.layers):
        for x, y in zip(a.weights, b.weights):
            np.testing.assert_array_equal(x, y)


def test_keras3_json_with_keras2_weights_follows_the_json(keras_zoo, device):
    """The JSON decides the generation (hard_sigmoid differs); weights of either layout fit."""
    architecture, _ = keras_zoo.split_paths("keras3-split", "act_hard_sigmoid")
    _, weights = keras_zoo.split_paths("tf_keras-split", "act_hard_sigmoid")
    model = read_keras(architecture, weights=weights)
    assert model.keras_major == 3 and model.format == "keras3-json"
    tf_arch, _ = keras_zoo.split_paths("tf_keras-split", "act_hard_sigmoid")
    assert read_keras(tf_arch, weights=weights).keras_major == 2


# ---------------------------------------------------------------------------------------------
# one side missing, the two sides not matching


@pytest.mark.parametrize("fmt", SPLIT_PARAMS)
def test_json_without_weights(keras_zoo, fmt):
    architecture, _ = keras_zoo.split_paths(fmt, "tiny")
    text = conversion_error(architecture)
    assert_mentions(text, architecture, "architecture (JSON) without weights", "--weights", "weights=")


@pytest.mark.parametrize("fmt", SPLIT_PARAMS)
def test_weights_without_architecture(keras_zoo, fmt):
    _, weights = keras_zoo.split_paths(fmt, "tiny")
    text = conversion_error(weights)
    assert_mentions(text, weights, "weights only", "architecture JSON", "--weights")


def edited_json(architecture, tmp_path, edit):
    config = json.loads(architecture.read_text())
    edit(config["config"]["layers"])
    path = tmp_path / architecture.name
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("fmt", SPLIT_PARAMS)
def test_layer_in_the_json_without_weights_in_the_file(keras_zoo, tmp_path, fmt):
    architecture, weights = keras_zoo.split_paths(fmt, "tiny")

    def add_layer(layers):
        extra = json.loads(json.dumps(layers[-1]))
        extra["config"]["name"] = "extra"
        extra["config"]["units"] = 2
        layers.append(extra)

    text = conversion_error(edited_json(architecture, tmp_path, add_layer), weights=weights)
    assert_mentions(text, "'extra' (Dense)", weights.name, "tiny.json", "do not match")


@pytest.mark.parametrize("fmt", SPLIT_PARAMS)
def test_weights_in_the_file_for_a_layer_the_json_lacks(keras_zoo, tmp_path, fmt):
    architecture, weights = keras_zoo.split_paths(fmt, "tiny")
    text = conversion_error(edited_json(architecture, tmp_path, lambda layers: layers.pop()), weights=weights)
    assert_mentions(text, weights.name, "tiny.json", "does not have", "do not match")
    if fmt != "tf_keras-split-v3":  # tf_keras writes no layer names into Keras 3's layout
        assert_mentions(text, "'d1'")


@pytest.mark.parametrize("fmt", SPLIT_PARAMS)
def test_shape_that_differs(keras_zoo, tmp_path, fmt):
    architecture, weights = keras_zoo.split_paths(fmt, "tiny")

    def shrink(layers):
        dense = next(layer for layer in layers if layer["config"].get("name") == "d13")
        dense["config"]["units"] = 12

    edited = edited_json(architecture, tmp_path, shrink)
    text = conversion_error(edited, weights=weights)
    assert_mentions(text, f"{edited} + {weights}", "'d13'", "(3, 13)", "units=12")


@pytest.mark.parametrize("fmt", ["tf_keras-split", "keras3-split"])
def test_renamed_layer(keras_zoo, tmp_path, fmt):
    """A layer renamed in the JSON: Keras 2's layout is matched by name, Keras 3's by its label."""
    architecture, weights = keras_zoo.split_paths(fmt, "tiny")

    def rename(layers):
        next(layer for layer in layers if layer["config"].get("name") == "d1")["config"]["name"] = "renamed"

    text = conversion_error(edited_json(architecture, tmp_path, rename), weights=weights)
    assert_mentions(text, "'renamed'", weights.name, "tiny.json", "do not match")


def test_weights_dataset_missing(keras_zoo, tmp_path):
    architecture, weights = keras_zoo.split_paths("tf_keras-split", "tiny")
    broken = tmp_path / weights.name
    shutil.copy(weights, broken)
    with h5py.File(broken, "r+") as f:
        del f["d13/d13/bias:0"]
    assert_mentions(conversion_error(architecture, weights=broken), "'d13/bias:0'", "missing", broken)


def test_pair_given_the_wrong_way_round_or_with_a_whole_model(keras_zoo):
    architecture, weights = keras_zoo.split_paths("keras3-split", "tiny")
    whole_h5, whole_keras = keras_zoo.path("keras3-h5", "tiny"), keras_zoo.path("keras3-zip", "tiny")
    assert_mentions(conversion_error(weights, weights=architecture), weights, "not a JSON file", "architecture JSON")
    assert_mentions(conversion_error(whole_keras, weights=weights), whole_keras, "not a JSON file", "given alone")
    assert_mentions(conversion_error(architecture, weights=whole_h5), whole_h5, "whole Keras model", "give it alone")
    assert_mentions(conversion_error(architecture, weights=whole_keras), whole_keras, "HDF5")


def test_json_that_is_not_an_architecture(tmp_path, keras_zoo):
    _, weights = keras_zoo.split_paths("keras3-split", "tiny")
    for text, fragment in [
        ('{"layers": []}', "not a Keras model architecture"),
        ("{nope", "not valid JSON"),
        ('{"class_name": "Dense", "config": {"units": 3}}', "neither a Sequential"),
        ('{"class_name": "Sequential", "config": {"layers": 7}}', "'layers' that is not a list"),
    ]:
        path = tmp_path / "odd.json"
        path.write_text(text)
        assert_mentions(conversion_error(path, weights=weights), path, fragment)
        assert_mentions(conversion_error(path), path, fragment)
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    assert_mentions(conversion_error(path, weights=weights), path, "JSON, but not an object", "architecture JSON")


def test_weights_file_that_is_not_keras_weights(tmp_path, keras_zoo):
    architecture, _ = keras_zoo.split_paths("keras3-split", "tiny")
    plain = tmp_path / "data.h5"
    with h5py.File(plain, "w") as f:
        f["x"] = np.arange(3.0)
    assert_mentions(conversion_error(architecture, weights=plain), plain, "without Keras weights")
    noise = tmp_path / "noise.h5"
    noise.write_bytes(np.random.default_rng(3).bytes(2048))
    assert_mentions(conversion_error(architecture, weights=noise), noise, "not a readable HDF5 weights file")
    assert_mentions(conversion_error(architecture, weights=tmp_path / "nowhere.h5"), "nowhere.h5", "no such file")


def test_malinn_file_with_weights(keras_zoo, tmp_path):
    architecture, weights = keras_zoo.split_paths("keras3-split", "tiny")
    dst = malinn.convert(architecture, tmp_path / "tiny.malinn", target="cpu", weights=weights)
    assert_mentions(conversion_error(dst, weights=weights), dst, "malinn model file", "without weights")


def test_convert_round_trip_and_source_protection(keras_zoo, device, tmp_path):
    architecture, weights = keras_zoo.split_paths("tf_keras-split", "batchnorm")
    direct = malinn.load_model(architecture, weights=weights)
    x = keras_zoo.split_data("tf_keras-split", "batchnorm")["x"]
    dst = malinn.convert(architecture, tmp_path / "bn.malinn", weights=weights)
    np.testing.assert_array_equal(malinn.load_model(dst).predict(x), direct.predict(x))
    copy = tmp_path / weights.name
    shutil.copy(weights, copy)
    with pytest.raises(malinn.ConversionError, match="is the source file"):
        malinn.convert(architecture, copy, weights=copy)
    with pytest.raises(malinn.ConversionError, match="is the source file"):
        direct.save(weights)
    with h5py.File(copy, "r") as f:
        assert "layer_names" in f.attrs  # untouched


# ---------------------------------------------------------------------------------------------
# TensorFlow's own formats, anywhere


def tensorflow_file(keras_zoo, kind):
    relative = keras_zoo.manifest.get("tensorflow_files", {}).get(kind)
    if relative is None:
        pytest.skip(f"the zoo has no TensorFlow {kind} (see tests/keras_zoo.py's output)")
    return keras_zoo.root / relative


@pytest.mark.parametrize(
    "kind,fragment",
    [("savedmodel", "SavedModel directory"), ("tflite", "TensorFlow Lite"), ("checkpoint", "TensorFlow checkpoint")],
)
def test_tensorflow_formats_are_refused_with_advice_anywhere(keras_zoo, kind, fragment):
    path = tensorflow_file(keras_zoo, kind)
    architecture, weights = keras_zoo.split_paths("keras3-split", "tiny")
    for args, kwargs in [((path,), {}), ((path,), {"weights": weights}), ((architecture,), {"weights": path})]:
        text = conversion_error(*args, **kwargs)
        assert_mentions(text, path, fragment, "model.save('model.keras')")


def test_savedmodel_graph_file_and_checkpoint_parts(keras_zoo, tmp_path):
    saved = tensorflow_file(keras_zoo, "savedmodel")
    assert_mentions(conversion_error(saved / "saved_model.pb"), "SavedModel", "model.save('model.keras')")
    checkpoint = tensorflow_file(keras_zoo, "checkpoint")
    index = checkpoint.with_name(checkpoint.name + ".index")
    data = next(checkpoint.parent.glob(checkpoint.name + ".data-*"))
    assert index.is_file()
    for part in (index, data):
        assert_mentions(conversion_error(part), part, "TensorFlow checkpoint", "model.save('model.keras')")
    renamed = tmp_path / "tiny.index"  # a name alone proves nothing: a Keras file under it reads
    shutil.copy(keras_zoo.path("keras3-h5", "tiny"), renamed)
    assert [l.name for l in read_keras(renamed).layers] == ["d13", "d1"]


# ---------------------------------------------------------------------------------------------
# the command line: convert, predict and verify take --weights


def cli(*args):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "malinn.cli", *map(str, args)], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("fmt", SPLIT_PARAMS)
def test_cli_convert_and_predict_with_weights(keras_zoo, tmp_path, fmt):
    architecture, weights = keras_zoo.split_paths(fmt, "relus")
    data = keras_zoo.split_data(fmt, "relus")
    np.save(tmp_path / "x.npy", data["x"])
    out = cli("convert", architecture, "--weights", weights, "-o", tmp_path / "m.malinn", "--target", "cpu")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"{architecture} + {weights} -> {tmp_path / 'm.malinn'}: ")
    for model, extra in [(tmp_path / "m.malinn", []), (architecture, ["--weights", weights])]:
        out = cli("predict", model, tmp_path / "x.npy", "-o", tmp_path / "y.npy", *extra)
        assert out.returncode == 0, out.stderr
        assert_keras_close(np.load(tmp_path / "y.npy"), data["y"], f"malinn predict {model.name} {extra}")


@pytest.mark.parametrize("fmt", SPLIT_PARAMS)
def test_cli_verify_with_weights(keras_zoo, fmt):
    architecture, weights = keras_zoo.split_paths(fmt, "batchnorm")
    out = cli("verify", architecture, "--weights", weights)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"verify {architecture} + {weights} on ")
    assert any(line.startswith("(model output) ") for line in lines) and lines[-1].startswith("OK: worst rel error")


def test_cli_errors_name_what_is_missing(keras_zoo, tmp_path):
    architecture, weights = keras_zoo.split_paths("keras3-split", "tiny")
    for args, fragments in [
        (("convert", architecture, "-o", tmp_path / "m.malinn"), ["without weights", "--weights"]),
        (("convert", weights, "-o", tmp_path / "m.malinn"), ["weights only", "--weights"]),
        (("predict", architecture, tmp_path / "x.npy"), ["without weights", "--weights"]),
        (("convert", architecture, "--weights", weights, "-o", weights), ["is the source file"]),
    ]:
        out = cli(*args)
        assert out.returncode == 1 and out.stderr.startswith("malinn: error: "), out.stderr
        assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr
        assert_mentions(out.stderr, *fragments)
    assert not (tmp_path / "m.malinn").exists()
    with h5py.File(weights, "r") as f:
        assert "layers" in f  # the weights file is untouched


@pytest.mark.parametrize("command", ["convert", "predict", "verify"])
def test_cli_help_lists_weights(command):
    out = cli(command, "--help")
    assert out.returncode == 0 and "--weights" in out.stdout and "save_weights" in out.stdout
