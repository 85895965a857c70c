"""read_keras: the Keras file readers, on files written by Keras 3 and tf_keras (Keras 2).

The first half needs no TensorFlow: it writes files with h5py/zipfile that mirror what Keras
writes (checked against tf_keras/Keras by the second half) and corrupts them. The second half
reads the files of the Keras zoo (tests/keras_zoo.py: small models built in Keras 3 and tf_keras,
saved in every format, in a process of their own: TensorFlow and PoCL cannot share one) and
checks the readers return the same layers, configs and weights as ``get_weights()``, bit for bit.
This file never imports tensorflow, keras or tf_keras.
"""

from __future__ import annotations

import ast
import io
import json
import os
import pathlib
import zipfile

import h5py
import numpy as np
import pytest

from malinn.converters import KerasLayer, KerasModel, read_keras
from malinn.errors import ConversionError

CONVERTERS = pathlib.Path(__file__).resolve().parents[2] / "converters"

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:.*(HDF5 file|not yet been built|input_shape).*:UserWarning"),
]


# ---------------------------------------------------------------------------------------------
# shared steps


def assert_conversion_error(path, *fragments):
    """read_keras(path) raises ConversionError naming the file and each fragment."""
    with pytest.raises(ConversionError) as info:
        read_keras(path)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert os.path.basename(str(path)) in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def rewrite_zip(src, dst, drop=(), replace=None):
    """Copy the zip ``src`` to ``dst`` without the members in ``drop``, replacing some."""
    replace = replace or {}
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            if name in drop:
                continue
            zout.writestr(name, replace.get(name, zin.read(name)))
    return dst


def reshape_dataset(h5file, path, shape):
    """Replace the dataset at ``path`` with one of another shape (same name, same place)."""
    with h5py.File(h5file, "r+") as f:
        del f[path]
        f.create_dataset(path, data=np.ones(shape, dtype=np.float32))


def zip_member_edit(src, dst, member, edit, tmp_path):
    """Apply ``edit(h5path)`` to the HDF5 member of a zip, writing the result to ``dst``."""
    inner = tmp_path / f"{os.path.basename(str(dst))}.inner.h5"
    with zipfile.ZipFile(src) as z:
        inner.write_bytes(z.read(member))
    edit(inner)
    return rewrite_zip(src, dst, replace={member: inner.read_bytes()})


def truncate(src, dst, fraction=0.5):
    data = pathlib.Path(src).read_bytes()
    pathlib.Path(dst).write_bytes(data[: int(len(data) * fraction)])
    return dst


def initializer(cls="Zeros"):
    return {"module": "keras.initializers", "class_name": cls, "config": {}, "registered_name": None}


# ---------------------------------------------------------------------------------------------
# files written without Keras, mirroring what tf_keras 2.21 and Keras 3.15 write


def keras2_dense(name, units, activation, input_shape=None):
    cfg = {
        "name": name,
        "trainable": True,
        "dtype": "float32",
        "units": units,
        "activation": activation,
        "use_bias": True,
        "kernel_initializer": {
            "module": "keras.initializers",
            "class_name": "GlorotUniform",
            "config": {"seed": None},
            "registered_name": None,
        },
        "bias_initializer": initializer(),
        "kernel_regularizer": None,
        "bias_regularizer": None,
        "activity_regularizer": None,
        "kernel_constraint": None,
        "bias_constraint": None,
    }
    if input_shape is not None:
        cfg["batch_input_shape"] = [None, *input_shape]
    return {"class_name": "Dense", "config": cfg}


def write_keras2_h5(
    path,
    widths=(6, 3, 1),
    split_layer_names=False,
    split_weight_names=False,
    layer_name_length=0,
    seed=0,
    keras22=False,
):
    """A tf_keras-style Sequential of Dense layers, as ``model.save("m.h5")`` writes it.

    With ``split_*`` the attribute is written as ``name0``, ``name1`` fixed-length byte arrays,
    as tf_keras's ``save_attributes_to_hdf5_group`` does when a list exceeds 64 KiB.
    """
    rng = np.random.default_rng(seed)
    pad = "x" * layer_name_length
    names = [f"dense{pad}" if i == 0 else f"dense_{i}{pad}" for i in range(len(widths) - 1)]
    activations = ["relu", "hard_sigmoid", "softmax", "tanh"]
    layers = [
        {
            "class_name": "InputLayer",
            "config": {
                "batch_input_shape": [None, widths[0]],
                "dtype": "float32",
                "sparse": False,
                "ragged": False,
                "name": f"{names[0]}_input",
                "optional": False,
            },
        }
    ]
    weights = {}
    for i, name in enumerate(names):
        layers.append(
            keras2_dense(name, widths[i + 1], activations[i % 4], input_shape=(widths[0],) if i == 0 else None)
        )
        kernel = rng.standard_normal((widths[i], widths[i + 1])).astype(np.float32)
        bias = rng.standard_normal(widths[i + 1]).astype(np.float32)
        weights[name] = [(f"{name}/kernel:0", kernel), (f"{name}/bias:0", bias)]
    config = {"class_name": "Sequential", "config": {"name": "sequential", "layers": layers}}
    if keras22:
        # Keras 2.0-2.2: a Sequential's config is the bare list of layers, no InputLayer, and
        # attributes are byte strings.
        config = {"class_name": "Sequential", "config": layers[1:]}
    with h5py.File(path, "w") as f:
        f.attrs["backend"] = "tensorflow"
        f.attrs["keras_version"] = b"2.2.4" if keras22 else "2.21.0"
        f.attrs["model_config"] = json.dumps(config).encode() if keras22 else json.dumps(config)
        group = f.create_group("model_weights")
        group.attrs["backend"] = "tensorflow"
        group.attrs["keras_version"] = "2.21.0"
        encoded = [n.encode("utf8") for n in names]
        if split_layer_names:
            for i, chunk in enumerate(np.array_split(np.asarray(encoded), 2)):
                group.attrs[f"layer_names{i}"] = chunk
        else:
            group.attrs["layer_names"] = encoded
        for name in names:
            layer_group = group.create_group(name)
            weight_names = [w.encode("utf8") for w, _ in weights[name]]
            if split_weight_names:
                layer_group.attrs["weight_names0"] = np.asarray(weight_names[:1])
                layer_group.attrs["weight_names1"] = np.asarray(weight_names[1:])
            else:
                layer_group.attrs["weight_names"] = weight_names
            for weight_name, value in weights[name]:
                layer_group.create_dataset(weight_name, data=value)
        top = group.create_group("top_level_model_weights")
        top.attrs["weight_names"] = np.array([], dtype=np.float64)
    return names, {n: [v for _, v in weights[n]] for n in names}


def write_keras3_zip(path, widths=(5, 4, 2), seed=0, config_text=None, with_weights=True, swap_paths=False):
    """A Keras 3 ``.keras`` archive of a Sequential of Dense layers.

    ``swap_paths`` stores the first two layers under each other's paths (their ``vars`` groups
    still labelled with their own names), as a file whose layer order changed would.
    """
    rng = np.random.default_rng(seed)
    layers = [
        {
            "module": "keras.layers",
            "class_name": "InputLayer",
            "config": {
                "batch_shape": [None, widths[0]],
                "dtype": "float32",
                "sparse": False,
                "ragged": False,
                "name": "input_layer",
                "optional": False,
            },
            "registered_name": None,
        }
    ]
    weights = {}
    for i in range(len(widths) - 1):
        name = "dense" if i == 0 else f"dense_{i}"
        layers.append(
            {
                "module": "keras.layers",
                "class_name": "Dense",
                "config": {
                    "name": name,
                    "trainable": True,
                    "units": widths[i + 1],
                    "activation": "relu",
                    "use_bias": True,
                    "kernel_initializer": initializer("GlorotUniform"),
                    "bias_initializer": initializer(),
                },
                "registered_name": None,
                "build_config": {"input_shape": [None, widths[i]]},
            }
        )
        weights[name] = [
            rng.standard_normal((widths[i], widths[i + 1])).astype(np.float32),
            rng.standard_normal(widths[i + 1]).astype(np.float32),
        ]
    config = {
        "module": "keras",
        "class_name": "Sequential",
        "config": {"name": "sequential", "trainable": True, "layers": layers, "build_input_shape": [None, widths[0]]},
        "registered_name": None,
    }
    buffer = io.BytesIO()
    paths = {name: name for name in weights}
    if swap_paths:
        paths["dense"], paths["dense_1"] = "dense_1", "dense"
    with h5py.File(buffer, "w") as f:
        f.create_group("vars").attrs["name"] = "sequential"
        for name, values in weights.items():
            group = f.create_group(f"layers/{paths[name]}/vars")
            group.attrs["name"] = name
            for i, value in enumerate(values):
                group.create_dataset(str(i), data=value)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("metadata.json", json.dumps({"keras_version": "3.15.1", "date_saved": "2026-01-01@00:00:00"}))
        z.writestr("config.json", config_text if config_text is not None else json.dumps(config))
        if with_weights:
            z.writestr("model.weights.h5", buffer.getvalue())
    return weights


# ---------------------------------------------------------------------------------------------
# without TensorFlow


def test_no_tensorflow_or_keras_import_in_converters():
    for source in sorted(CONVERTERS.glob("*.py")):
        tree = ast.parse(source.read_text(), filename=str(source))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""] if node.level == 0 else []
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                assert top not in {"tensorflow", "keras", "tf_keras"}, f"{source.name}: {module}"


@pytest.mark.parametrize("split_layer_names,split_weight_names", [(False, False), (True, False), (True, True)])
def test_keras2_h5_mirror_and_split_attributes(tmp_path, split_layer_names, split_weight_names):
    path = tmp_path / "k2.h5"
    names, weights = write_keras2_h5(
        path, widths=(6, 1, 3, 13), split_layer_names=split_layer_names, split_weight_names=split_weight_names
    )
    model = read_keras(path)
    assert isinstance(model, KerasModel)
    assert model.source == str(path)
    assert model.format == "keras2-h5"
    assert model.keras_version == "2.21.0" and model.keras_major == 2
    assert model.input_shape == (6,)
    assert [layer.name for layer in model.layers] == names
    assert all(isinstance(layer, KerasLayer) for layer in model.layers)
    assert [layer.config["units"] for layer in model.layers] == [1, 3, 13]
    assert [layer.config["activation"] for layer in model.layers] == ["relu", "hard_sigmoid", "softmax"]
    for layer in model.layers:
        assert len(layer.weights) == 2
        for got, want in zip(layer.weights, weights[layer.name]):
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, want)


def test_keras2_h5_long_layer_names_split(tmp_path):
    """Names long enough that tf_keras would split layer_names into chunks."""
    path = tmp_path / "long.h5"
    names, _ = write_keras2_h5(path, widths=(4, 3, 2, 2), split_layer_names=True, layer_name_length=30000)
    assert [layer.name for layer in read_keras(path).layers] == names


def test_keras3_zip_mirror(tmp_path):
    path = tmp_path / "k3.keras"
    weights = write_keras3_zip(path, widths=(5, 13, 1))
    model = read_keras(path)
    assert model.format == "keras3-zip" and model.keras_version == "3.15.1"
    assert model.keras_major == 3
    assert model.input_shape == (5,)
    assert [(layer.class_name, layer.name) for layer in model.layers] == [("Dense", "dense"), ("Dense", "dense_1")]
    for layer in model.layers:
        for got, want in zip(layer.weights, weights[layer.name]):
            np.testing.assert_array_equal(got, want)


def test_keras22_list_config(tmp_path):
    path = tmp_path / "old.h5"
    names, weights = write_keras2_h5(path, widths=(6, 3, 1), keras22=True)
    model = read_keras(path)
    assert model.format == "keras2-h5" and model.keras_version == "2.2.4"
    assert model.input_shape == (6,)
    assert [layer.name for layer in model.layers] == names
    for layer in model.layers:
        for got, want in zip(layer.weights, weights[layer.name]):
            np.testing.assert_array_equal(got, want)


def test_keras3_zip_vars_found_by_name_when_paths_disagree(tmp_path):
    path = tmp_path / "swapped.keras"
    weights = write_keras3_zip(path, widths=(5, 3, 3, 2), swap_paths=True)
    model = read_keras(path)
    for layer in model.layers:
        for got, want in zip(layer.weights, weights[layer.name]):
            np.testing.assert_array_equal(got, want)


def test_accepts_pathlike_and_str(tmp_path):
    path = tmp_path / "k3.keras"
    write_keras3_zip(path)
    assert read_keras(str(path)).source == str(path)
    assert read_keras(path).source == str(path)


@pytest.mark.parametrize("name", ["empty.h5", "empty.keras"])
def test_empty_file(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"")
    assert_conversion_error(path, "empty")


def test_random_bytes(tmp_path):
    path = tmp_path / "random.h5"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    assert_conversion_error(path, "not a Keras model file")


def test_missing_file(tmp_path):
    assert_conversion_error(tmp_path / "nowhere.keras", "no such file")


def test_directory_that_is_not_a_model(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    assert_conversion_error(folder, "directory")


def test_truncated_h5(tmp_path):
    good = tmp_path / "good.h5"
    write_keras2_h5(good, widths=(64, 64, 64))
    assert_conversion_error(truncate(good, tmp_path / "truncated.h5"), "HDF5")


def test_truncated_zip(tmp_path):
    good = tmp_path / "good.keras"
    write_keras3_zip(good, widths=(64, 64, 64))
    assert_conversion_error(truncate(good, tmp_path / "truncated.keras"))


def test_zip_that_is_not_a_keras_archive(tmp_path):
    path = tmp_path / "other.keras"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("hello.txt", "hi")
    assert_conversion_error(path, "config.json")


def test_zip_config_not_json(tmp_path):
    path = tmp_path / "badjson.keras"
    write_keras3_zip(path, config_text="{this is not json")
    assert_conversion_error(path, "config.json", "not valid JSON")


def test_zip_without_weights(tmp_path):
    path = tmp_path / "noweights.keras"
    write_keras3_zip(path, with_weights=False)
    assert_conversion_error(path, "model.weights.h5")


def test_zip_weights_not_hdf5(tmp_path):
    good = tmp_path / "good.keras"
    write_keras3_zip(good)
    bad = rewrite_zip(
        good, tmp_path / "badweights.keras", replace={"model.weights.h5": b"\x89HDF\r\n\x1a\n" + b"\0" * 20}
    )
    assert_conversion_error(bad, "model.weights.h5")


def test_zip_kernel_shape_changed(tmp_path):
    good = tmp_path / "good.keras"
    write_keras3_zip(good, widths=(5, 4, 2))
    bad = zip_member_edit(
        good,
        tmp_path / "reshaped.keras",
        "model.weights.h5",
        lambda p: reshape_dataset(p, "layers/dense_1/vars/0", (4, 3)),
        tmp_path,
    )
    assert_conversion_error(bad, "'dense_1'", "units=2")


def test_h5_kernel_shape_changed(tmp_path):
    path = tmp_path / "reshaped.h5"
    write_keras2_h5(path, widths=(6, 3, 1))
    reshape_dataset(path, "model_weights/dense/dense/kernel:0", (6, 4))
    assert_conversion_error(path, "'dense'", "units=3")


def test_h5_in_features_do_not_chain(tmp_path):
    path = tmp_path / "infeatures.h5"
    write_keras2_h5(path, widths=(6, 3, 1))
    reshape_dataset(path, "model_weights/dense_1/dense_1/kernel:0", (5, 1))
    assert_conversion_error(path, "'dense_1'", "takes 5 features", "gives 3")


def test_h5_bias_missing(tmp_path):
    path = tmp_path / "nobias.h5"
    write_keras2_h5(path, widths=(6, 3, 1))
    with h5py.File(path, "r+") as f:
        del f["model_weights/dense/dense/bias:0"]
    assert_conversion_error(path, "'dense/bias:0'", "missing")


def test_h5_without_model_config(tmp_path):
    path = tmp_path / "weights_only.h5"
    write_keras2_h5(path)
    with h5py.File(path, "r+") as f:
        del f.attrs["model_config"]
    assert_conversion_error(path, "model_config")


def test_h5_model_config_not_json(tmp_path):
    path = tmp_path / "badconfig.h5"
    write_keras2_h5(path)
    with h5py.File(path, "r+") as f:
        f.attrs["model_config"] = "{nope"
    assert_conversion_error(path, "model_config", "JSON")


def test_h5_without_model_weights(tmp_path):
    path = tmp_path / "noweights.h5"
    write_keras2_h5(path)
    with h5py.File(path, "r+") as f:
        del f["model_weights"]
    assert_conversion_error(path, "model_weights")


def test_plain_hdf5_is_not_a_model(tmp_path):
    path = tmp_path / "data.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(3)
    assert_conversion_error(path, "not a Keras model file")


# ---------------------------------------------------------------------------------------------
# files written by Keras 3 and tf_keras (the zoo: tests/keras_zoo.py)

KEYS = (
    "units",
    "activation",
    "use_bias",
    "center",
    "scale",
    "epsilon",
    "max_value",
    "negative_slope",
    "threshold",
    "alpha",
    "rate",
    "axis",
)


def plain(value):
    """A config value as JSON would hold it (tf_keras puts numpy scalars in get_config)."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def same_value(got, want):
    want = plain(want)
    if isinstance(want, float) and isinstance(got, (int, float)):
        return got == pytest.approx(want, rel=1e-6)
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(same_value(g, w) for g, w in zip(got, want))
    return got == want


def reference(zoo, fmt, key):
    """[(class name, name, get_config(), get_weights())] of the Keras model's leaf layers."""
    entry = zoo.require(fmt, key)
    return [
        (layer["class_name"], layer["name"], layer["config"], weights)
        for layer, weights in zip(entry["layers"], zoo.weights(fmt, key))
    ]


#: (format id in the zoo, KerasModel.format, Keras generation)
CASES = [
    pytest.param("keras3-zip", "keras3-zip", 3, id="keras3-zip"),
    pytest.param("keras3-h5", "keras3-h5", 3, id="keras3-h5"),
    pytest.param("keras2-h5", "keras2-h5", 2, id="keras2-h5"),
    pytest.param("tf_keras-zip", "keras3-zip", 2, id="tf_keras-zip"),
]
ZIP_FORMATS = [pytest.param("keras3-zip", id="keras3"), pytest.param("tf_keras-zip", id="tf_keras")]
H5_FORMATS = [pytest.param("keras3-h5", id="keras3"), pytest.param("keras2-h5", id="tf_keras")]


def check_against_reference(model, ref):
    assert [(layer.class_name, layer.name) for layer in model.layers] == [(cls, name) for cls, name, _, _ in ref]
    for layer, (_, _, config, weights) in zip(model.layers, ref):
        for key in KEYS:
            if key in config and key != "axis":
                assert same_value(layer.config.get(key), config[key]), (layer.name, key)
        assert len(layer.weights) == len(weights), layer.name
        for got, want in zip(layer.weights, weights):
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, want)


def test_zoo_reference_is_real(keras_zoo):
    """The reference weights are the randomized ones (a zoo of zeros would prove nothing)."""
    ref = reference(keras_zoo, "keras3-zip", "zoo")
    bn = next(w for cls, name, _, w in ref if name == "bn_full")
    assert len(bn) == 4 and all(np.abs(w).max() > 0.1 for w in bn)
    assert not np.allclose(bn[2], 0) and not np.allclose(bn[3], 1)


@pytest.mark.parametrize("fmt,reader_format,major", CASES)
def test_zoo(keras_zoo, fmt, reader_format, major):
    version = keras_zoo.require(fmt)["keras_version"]
    model = read_keras(keras_zoo.path(fmt, "zoo"))
    assert model.format == reader_format
    assert model.keras_version == version and model.keras_major == major
    assert model.input_shape == (4, 7)
    assert model.model_class == "Sequential" and model.name == "zoo"
    check_against_reference(model, reference(keras_zoo, fmt, "zoo"))
    by_name = {layer.name: layer for layer in model.layers}
    assert by_name["d13"].config["units"] == 13 and by_name["d13"].config["activation"] == "relu"
    assert by_name["d1"].config["units"] == 1
    assert by_name["act_hs"].config["activation"] == "hard_sigmoid"
    # BatchNormalization drops gamma without scale and beta without center.
    assert [len(by_name[n].weights) for n in ("bn_full", "bn_nocenter", "bn_noscale", "bn_bare")] == [4, 3, 3, 2]
    assert len(by_name["d13_nobias"].weights) == 1
    # Keras 2 and Keras 3 name LeakyReLU's slope differently; the config is kept as written.
    slope_key = "negative_slope" if major == 3 else "alpha"
    assert by_name["leaky"].config[slope_key] == pytest.approx(0.2)


@pytest.mark.parametrize("fmt,reader_format,major", CASES)
def test_functional_chain(keras_zoo, fmt, reader_format, major):
    model = read_keras(keras_zoo.path(fmt, "chain"))
    assert model.format == reader_format
    assert model.model_class == "Functional"
    assert model.input_shape == (5,)
    check_against_reference(model, reference(keras_zoo, fmt, "chain"))
    assert model.layers[0].config["activation"] == "gelu"


@pytest.mark.parametrize("fmt,reader_format,major", CASES)
def test_functional_branch_is_read_as_a_graph(keras_zoo, fmt, reader_format, major):
    model = read_keras(keras_zoo.path(fmt, "branch"))
    check_against_reference(model, reference(keras_zoo, fmt, "branch"))
    graph = model.graph
    assert [(name, shape) for _, name, shape in graph.inputs] == [("bx", (5,))]
    assert [(c.layer, c.listed) for c in graph.calls] == [("left", False), ("right", False), ("add", True)]
    left, right, add = graph.calls
    assert left.inputs == right.inputs == [graph.inputs[0][0]]
    assert add.inputs == [left.output, right.output] and graph.outputs == [add.output]
    assert not graph.is_chain()


@pytest.mark.parametrize("fmt,reader_format,major", CASES)
def test_nested_sequential_is_flattened(keras_zoo, fmt, reader_format, major):
    model = read_keras(keras_zoo.path(fmt, "nested"))
    assert [layer.name for layer in model.layers] == ["outer_a", "inner_a", "inner_b", "outer_b"]
    check_against_reference(model, reference(keras_zoo, fmt, "nested"))


@pytest.mark.parametrize("key", ["zoo", "chain", "nested"])
def test_keras3_zip_without_vars_names(keras_zoo, tmp_path, key):
    """Older Keras 3 versions do not label vars groups: the paths alone must find the weights."""

    def strip(h5path):
        with h5py.File(h5path, "r+") as f:
            groups = []
            f.visititems(lambda name, obj: groups.append(obj) if isinstance(obj, h5py.Group) else None)
            for group in groups + [f]:
                if "name" in group.attrs:
                    del group.attrs["name"]

    path = zip_member_edit(
        keras_zoo.path("keras3-zip", key), tmp_path / f"{key}_nonames.keras", "model.weights.h5", strip, tmp_path
    )
    check_against_reference(read_keras(path), reference(keras_zoo, "keras3-zip", key))


@pytest.mark.parametrize("fmt", H5_FORMATS)
def test_split_layer_names_written_by_keras(keras_zoo, fmt):
    path = keras_zoo.path(fmt, "split")
    with h5py.File(path, "r") as f:
        attrs = f["model_weights"].attrs
        assert "layer_names" not in attrs and "layer_names1" in attrs
    model = read_keras(path)
    assert len(model.layers) == 71
    assert model.layers[0].name == "first" and model.layers[-1].name.startswith("drop_69_")
    np.testing.assert_array_equal(model.layers[0].weights[0], keras_zoo.weights(fmt, "split")[0][0])


@pytest.mark.parametrize("fmt", H5_FORMATS)
def test_weights_only_file(keras_zoo, fmt):
    assert_conversion_error(keras_zoo.path(fmt, "weights_only"), "weights only")


def test_unzipped_keras_directory(keras_zoo):
    version = keras_zoo.require("keras3-zip")["keras_version"]
    model = read_keras(keras_zoo.path("keras3-zip", "unzipped"))
    assert model.format == "keras3-zip" and model.keras_version == version
    assert model.input_shape == (3,)
    check_against_reference(model, reference(keras_zoo, "keras3-zip", "unzipped"))


def test_unbuilt_model_has_no_weights(keras_zoo):
    assert_conversion_error(keras_zoo.path("keras3-zip", "unbuilt"), "'lonely'", "the file has 0")


@pytest.mark.parametrize("fmt,reader_format,major", CASES)
def test_truncated(keras_zoo, tmp_path, fmt, reader_format, major):
    path = keras_zoo.path(fmt, "zoo")
    assert_conversion_error(truncate(path, tmp_path / f"cut{path.suffix}", 0.6))


@pytest.mark.parametrize("fmt", ZIP_FORMATS)
def test_keras_zip_corrupted_members(keras_zoo, tmp_path, fmt):
    good = keras_zoo.path(fmt, "zoo")
    assert_conversion_error(
        rewrite_zip(good, tmp_path / "noweights.keras", drop={"model.weights.h5"}), "model.weights.h5"
    )
    assert_conversion_error(
        rewrite_zip(good, tmp_path / "badjson.keras", replace={"config.json": b'{"class_name": '}),
        "config.json",
        "not valid JSON",
    )
    assert_conversion_error(rewrite_zip(good, tmp_path / "noconfig.keras", drop={"config.json"}), "config.json")
    reshaped = zip_member_edit(
        good,
        tmp_path / "reshaped.keras",
        "model.weights.h5",
        lambda p: reshape_dataset(p, "layers/dense/vars/0", (28, 12)),
        tmp_path,
    )
    assert_conversion_error(reshaped, "'d13'", "units=13")


@pytest.mark.parametrize("fmt", H5_FORMATS)
def test_h5_weight_shape_changed(keras_zoo, tmp_path, fmt):
    source = keras_zoo.path(fmt, "zoo")
    path = tmp_path / "reshaped.h5"
    path.write_bytes(source.read_bytes())
    with h5py.File(path, "r") as f:
        group = f["model_weights/d3"]
        kernel_name = next(
            n for n in (x.decode() if isinstance(x, bytes) else x for x in group.attrs["weight_names"]) if "kernel" in n
        )
    reshape_dataset(path, f"model_weights/d3/{kernel_name}", (13, 4))
    assert_conversion_error(path, "'d3'", "units=3")

    path2 = tmp_path / "bn.h5"
    path2.write_bytes(source.read_bytes())
    with h5py.File(path2, "r+") as f:
        group = f["model_weights/bn_full"]
        names = [x.decode() if isinstance(x, bytes) else x for x in group.attrs["weight_names"]]
        group.attrs["weight_names"] = [n.encode() for n in names[:-1]]
    assert_conversion_error(path2, "'bn_full'", "expected 4 weight arrays")
