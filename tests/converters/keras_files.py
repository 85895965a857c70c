"""Keras 3 ``.keras`` archives written without Keras (json, h5py, zipfile), laid out as Keras 3.15
writes them, for tests that need a config or a weights file Keras would not write.

``sequential(layers)`` is a model config; ``dense(...)`` and ``input_layer(...)`` its entries;
``write_keras(path, config, weights)`` the archive, each layer's variables under
``layers/<snake_case(class)>[_N]/vars/<i>``.
"""

from __future__ import annotations

import io
import json
import zipfile

import h5py
import numpy as np

from malinn.converters.naming import unique_saving_names


def keras_object(module, class_name, config=None, registered_name=None):
    return {
        "module": module,
        "class_name": class_name,
        "config": config if config is not None else {},
        "registered_name": registered_name,
    }


def input_layer(width):
    return keras_object(
        "keras.layers",
        "InputLayer",
        {
            "batch_shape": [None, width],
            "dtype": "float32",
            "sparse": False,
            "ragged": False,
            "name": "input_layer",
            "optional": False,
        },
    )


def dense(name, units, activation="linear", in_width=None, use_bias=True, **config):
    entry = keras_object(
        "keras.layers",
        "Dense",
        {
            "name": name,
            "trainable": True,
            "dtype": keras_object("keras", "DTypePolicy", {"name": "float32"}),
            "units": units,
            "activation": activation,
            "use_bias": use_bias,
            "kernel_initializer": keras_object("keras.initializers", "GlorotUniform", {"seed": None}),
            "bias_initializer": keras_object("keras.initializers", "Zeros"),
            "kernel_regularizer": None,
            "bias_regularizer": None,
            "kernel_constraint": None,
            "bias_constraint": None,
            **config,
        },
    )
    if in_width is not None:
        entry["build_config"] = {"input_shape": [None, in_width]}
    return entry


def sequential(layers, name="sequential", width=None):
    """A Sequential config; ``width`` adds an InputLayer in front."""
    members = ([input_layer(width)] if width is not None else []) + list(layers)
    return keras_object("keras", "Sequential", {"name": name, "trainable": True, "layers": members})


def dense_weights(widths, seed=0):
    """Random kernel and bias of a chain of Dense layers ``widths[0] -> widths[1] -> ...``."""
    rng = np.random.default_rng(seed)
    return [
        [rng.standard_normal((a, b)).astype(np.float32), rng.standard_normal(b).astype(np.float32)]
        for a, b in zip(widths[:-1], widths[1:])
    ]


def weights_h5(class_names, weights) -> bytes:
    """``model.weights.h5``: ``weights[i]`` (a list of arrays) for the i-th layer of ``class_names``."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        f.create_group("vars")
        for path, arrays in zip(unique_saving_names(class_names), weights):
            group = f.create_group(f"layers/{path}/vars")
            for i, array in enumerate(arrays):
                group.create_dataset(str(i), data=array)
    return buffer.getvalue()


def write_keras(path, config, weights=None, weights_member=None, compression=zipfile.ZIP_STORED):
    """A ``.keras`` archive of ``config``, with ``weights`` (see :func:`weights_h5`, one list per
    non-Input layer of the top Sequential) or the raw ``weights_member`` bytes."""
    if weights_member is None:
        layers = [entry for entry in config["config"]["layers"] if entry["class_name"] != "InputLayer"]
        weights_member = weights_h5([entry["class_name"] for entry in layers], weights or [])
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        z.writestr("metadata.json", json.dumps({"keras_version": "3.15.1", "date_saved": "2026-01-01@00:00:00"}))
        z.writestr("config.json", json.dumps(config))
        z.writestr("model.weights.h5", weights_member)
    return path
