"""Keras model files of thousands of layers, written without Keras (json, h5py, zipfile) in every
form malinn reads, for the tests of loading time and depth: Keras builds and saves such a model
far too slowly (and its own graph walks recurse past Python's limit at 1,000 layers).

The model: ``Input((4,)) -> Dense(3) -> Activation x n``, then, for a graph (``graph=True``), an
``Add`` of the Dense's output and the last Activation's (not a chain: the converter makes a
Functional of it); else the chain itself (a Sequential). ``write(path, form, n, graph)`` writes one
form; :data:`FORMS` lists them. ``nested_sequential(depth)`` is a config of Sequentials nested
``depth`` deep around one Dense.
"""

from __future__ import annotations

import io
import json
import zipfile

import h5py
import numpy as np

from malinn.converters.naming import unique_saving_names

#: every form: Keras 3's .keras and legacy .h5, tf_keras's .h5, each generation's architecture JSON
#: with its save_weights file
FORMS = ("keras3-zip", "keras3-h5", "keras2-h5", "keras3-json", "keras2-json")

KERNEL = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
BIAS = np.array([0.5, -0.5, 0.25], np.float32)


def _object(module, class_name, config):
    return {"module": module, "class_name": class_name, "config": config, "registered_name": None}


def _keras3_ref(name, width=3):
    return {
        "class_name": "__keras_tensor__",
        "config": {"shape": [None, width], "dtype": "float32", "keras_history": [name, 0, 0]},
    }


def layer_specs(n: int, graph: bool) -> list:
    """``[(class name, name, config extras, inputs)]`` of the model, the InputLayer first."""
    specs = [
        ("InputLayer", "input_layer", {}, []),
        ("Dense", "dense", {"units": 3, "activation": "linear", "use_bias": True}, ["input_layer"]),
    ]
    previous = "dense"
    for i in range(n):
        specs.append(("Activation", f"act_{i}", {"activation": "relu"}, [previous]))
        previous = f"act_{i}"
    if graph:
        specs.append(("Add", "add", {}, ["dense", previous]))
    return specs


def keras3_config(n: int, graph: bool) -> dict:
    """The model's config as Keras 3 writes it (``config.json``, ``model_config``, ``to_json()``)."""
    layers = []
    for class_name, name, extra, inputs in layer_specs(n, graph):
        if class_name == "InputLayer":
            entry = _object(
                "keras.layers",
                "InputLayer",
                {"batch_shape": [None, 4], "dtype": "float32", "sparse": False, "ragged": False, "name": name},
            )
            entry.update(name=name, inbound_nodes=[])
        else:
            entry = _object("keras.layers", class_name, {"name": name, "trainable": True, "dtype": "float32", **extra})
            width = 4 if class_name == "Dense" else 3
            refs = [_keras3_ref(i, width) for i in inputs]
            entry.update(name=name, inbound_nodes=[{"args": [refs] if class_name == "Add" else refs, "kwargs": {}}])
            if class_name == "Dense":
                entry["build_config"] = {"input_shape": [None, 4]}
        layers.append(entry)
    last = layers[-1]["name"]
    return _object(
        "keras.src.models.functional",
        "Functional",
        {
            "name": "functional",
            "trainable": True,
            "layers": layers,
            "input_layers": [["input_layer", 0, 0]],
            "output_layers": [[last, 0, 0]],
        },
    )


def keras2_config(n: int, graph: bool) -> dict:
    """The model's config as tf_keras writes it (``model_config``, ``to_json()``)."""
    layers = []
    for class_name, name, extra, inputs in layer_specs(n, graph):
        if class_name == "InputLayer":
            config = {
                "batch_input_shape": [None, 4],
                "dtype": "float32",
                "sparse": False,
                "ragged": False,
                "name": name,
            }
            nodes = []
        else:
            config = {"name": name, "trainable": True, "dtype": "float32", **extra}
            nodes = [[[i, 0, 0, {}] for i in inputs]]
        layers.append({"class_name": class_name, "config": config, "name": name, "inbound_nodes": nodes})
    return {
        "class_name": "Functional",
        "config": {
            "name": "model",
            "layers": layers,
            "input_layers": [["input_layer", 0, 0]],
            "output_layers": [[layers[-1]["name"], 0, 0]],
        },
        "keras_version": "2.15.0",
        "backend": "tensorflow",
    }


def _keras3_weight_tree(f, n: int, graph: bool) -> None:
    """``model.weights.h5``'s layout: ``layers/<saving name>/vars/<i>``."""
    specs = layer_specs(n, graph)
    f.create_group("vars")
    for (class_name, name, _, _), path in zip(specs, unique_saving_names([s[0] for s in specs])):
        group = f.create_group(f"layers/{path}/vars")
        group.attrs["name"] = name
        if class_name == "Dense":
            group.create_dataset("0", data=KERNEL)
            group.create_dataset("1", data=BIAS)


def _set_names(attrs, key: str, names: list) -> None:
    """A list of names as Keras writes it: in chunks ``key0``, ``key1``... when one would pass 64 KiB."""
    encoded = np.array([name.encode() for name in names])
    if encoded.nbytes < 60000:
        attrs[key] = encoded
        return
    for i, chunk in enumerate(np.array_split(encoded, -(-encoded.nbytes // 60000))):
        attrs[f"{key}{i}"] = chunk


def _keras2_weight_groups(group, n: int, graph: bool, keras3: bool) -> None:
    """``model_weights`` (or a Keras 2 ``save_weights`` file's root): a group per layer."""
    specs = layer_specs(n, graph)
    _set_names(group.attrs, "layer_names", [s[1] for s in specs])
    group.attrs["backend"] = "tensorflow"
    group.attrs["keras_version"] = "3.15.1" if keras3 else "2.15.0"
    for class_name, name, _, _ in specs:
        g = group.create_group(name)
        if class_name == "Dense":
            names = [f"{name}/kernel", f"{name}/bias"] if keras3 else [f"{name}/kernel:0", f"{name}/bias:0"]
            g.attrs["weight_names"] = np.array([w.encode() for w in names])
            g.create_dataset(names[0], data=KERNEL)
            g.create_dataset(names[1], data=BIAS)
        else:
            g.attrs["weight_names"] = np.array([], dtype=np.float64)


def write(path, form: str, n: int, graph: bool = True) -> tuple:
    """Writes the model of ``n`` Activation layers in ``form`` at ``path`` (a JSON form also writes
    ``path`` + ``.weights.h5``); returns ``(model, weights)``, the paths to give ``load_model``."""
    path = str(path)
    if form == "keras3-zip":
        buffer = io.BytesIO()
        with h5py.File(buffer, "w") as f:
            _keras3_weight_tree(f, n, graph)
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("metadata.json", json.dumps({"keras_version": "3.15.1"}))
            z.writestr("config.json", json.dumps(keras3_config(n, graph)))
            z.writestr("model.weights.h5", buffer.getvalue())
        return path, None
    if form in ("keras3-h5", "keras2-h5"):
        keras3 = form == "keras3-h5"
        with h5py.File(path, "w") as f:
            f.attrs["keras_version"] = "3.15.1" if keras3 else "2.15.0"
            f.attrs["backend"] = "tensorflow"
            f.attrs["model_config"] = json.dumps(keras3_config(n, graph) if keras3 else keras2_config(n, graph))
            _keras2_weight_groups(f.create_group("model_weights"), n, graph, keras3)
        return path, None
    weights = path + ".weights.h5"
    with open(path, "w") as fh:
        json.dump(keras3_config(n, graph) if form == "keras3-json" else keras2_config(n, graph), fh)
    with h5py.File(weights, "w") as f:
        if form == "keras3-json":
            _keras3_weight_tree(f, n, graph)
        else:
            _keras2_weight_groups(f, n, graph, keras3=False)
    return path, weights


def expected(x: np.ndarray, graph: bool = True) -> np.ndarray:
    """What the model computes (relu is idempotent: any number of Activations is one)."""
    h = x.astype(np.float64) @ KERNEL + BIAS
    return h + np.maximum(h, 0) if graph else np.maximum(h, 0)


def nested_sequential(depth: int) -> dict:
    """A Keras 3 config of Sequentials nested ``depth`` deep, the innermost holding one Dense."""
    inner = _object(
        "keras.layers",
        "Dense",
        {"name": "dense", "trainable": True, "dtype": "float32", "units": 3, "activation": "linear", "use_bias": True},
    )
    inner["build_config"] = {"input_shape": [None, 4]}
    model = _object("keras", "Sequential", {"name": f"sequential_{depth}", "trainable": True, "layers": [inner]})
    for level in range(depth - 1, 0, -1):
        model = _object("keras", "Sequential", {"name": f"sequential_{level}", "trainable": True, "layers": [model]})
    model["config"]["layers"].insert(
        0,
        _object(
            "keras.layers",
            "InputLayer",
            {"batch_shape": [None, 4], "dtype": "float32", "sparse": False, "ragged": False, "name": "input_layer"},
        ),
    )
    return model
