"""Reader of Keras's split save form: the architecture in a JSON file, the weights in an HDF5 file.

Keras saves a model this way with ``open("model.json", "w").write(model.to_json())`` and
``model.save_weights(...)``:

* the JSON is ``{"class_name", "config", ...}`` of a Sequential, Functional or (Keras 2) Model, in
  either generation's dialect: Keras 2 writes ``keras_version`` and ``backend`` beside it, and its
  oldest Sequential configs are a bare list of layers; Keras 3 writes ``module`` and
  ``registered_name`` on every object and no version (``chain.py`` parses both);
* the weights file has Keras 2's layout (``model.save_weights("w.h5")`` by Keras 2 / tf_keras:
  ``layer_names`` / ``weight_names`` attributes and a group per layer, nested models as one
  group; read by :func:`converters.keras_h5.read_weights_group`) or Keras 3's
  (``model.save_weights("w.weights.h5")`` by Keras 3, and by tf_keras for that suffix:
  ``layers/<path>/vars/N``; read by :func:`converters.keras3_zip.read_weight_tree`). The layout
  is recognised from the file's contents, not its name.

The JSON decides the Keras generation (its ``keras_version``, else its schema); the weights file's
``keras_version`` is used only when the JSON has none and looks like Keras 2. Messages name both
files (``model.json + weights.h5: ...``) and, for a mismatch, the layer and which side lacks it.
"""

from __future__ import annotations

import json
import os

import h5py

from malinn.errors import ConversionError

from .chain import leaves_and_graph, parse_model
from .dtypes import input_dtypes
from .hdf5_util import refuse_external_links, to_str
from .keras3_zip import read_weight_tree
from .keras_h5 import looks_keras3, read_weights_group
from .limits import MAX_JSON_BYTES, WeightBudget, size_text
from .model_spec import KerasModel, version_major
from .provenance import check_keras_own


def read_architecture(path: str) -> dict:
    """The JSON object of an architecture file (``model.to_json()``), checked for size.

    Raises:
        ConversionError: over :data:`~converters.limits.MAX_JSON_BYTES`, not UTF-8 JSON, not an
            object with a ``class_name``.
    """
    size = os.path.getsize(path)
    if size > MAX_JSON_BYTES:
        raise ConversionError(
            f"{path}: the architecture JSON has {size_text(size)}, more than "
            f"malinn's limit for a JSON file ({size_text(MAX_JSON_BYTES)})"
        )
    with open(path, "rb") as fh:
        data = fh.read(MAX_JSON_BYTES + 1)  # the size above is 0 for what is not a regular file
    if len(data) > MAX_JSON_BYTES:
        raise ConversionError(
            f"{path}: the architecture JSON holds more than malinn's limit for a JSON file "
            f"({size_text(MAX_JSON_BYTES)})"
        )
    try:
        config = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: nested past json's depth
        raise ConversionError(f"{path}: is not valid JSON ({exc})") from exc
    if not isinstance(config, dict) or not isinstance(config.get("class_name"), str):
        raise ConversionError(
            f"{path}: is JSON but not a Keras model architecture (model.to_json() writes an "
            "object with class_name and config)"
        )
    return config


def read_split(architecture: str, weights: str) -> KerasModel:
    """Read a model saved as an architecture JSON plus a ``save_weights`` HDF5 file.

    Args:
        architecture: the JSON file ``model.to_json()`` wrote.
        weights: the HDF5 file ``model.save_weights()`` wrote (Keras 2 or Keras 3 layout).

    Returns:
        The :class:`KerasModel`, ``source`` naming both files, ``format`` ``"keras2-json"`` or
        ``"keras3-json"``, ``files`` the two paths.

    Raises:
        ConversionError: naming both files: the JSON is not a Keras architecture or has custom
            objects; the weights file is not HDF5, holds a whole model, or has no Keras weights;
            a layer of the JSON has no weights in the file, or the file weights for a layer the
            JSON does not have.
    """
    config = read_architecture(architecture)
    root = parse_model(config, architecture, where="the architecture JSON")
    check_keras_own(root, architecture)
    dtypes = input_dtypes(root, architecture)
    source = f"{architecture} + {weights}"
    name = os.path.basename(weights)
    side = f"the architecture {os.path.basename(architecture)}"
    try:
        f = h5py.File(weights, "r")
    except (OSError, ValueError) as exc:
        raise ConversionError(
            f"{weights}: is not a readable HDF5 weights file (save_weights writes HDF5): {exc}"
        ) from exc
    with f:
        refuse_external_links(f, weights)
        if "model_config" in f.attrs:
            raise ConversionError(
                f"{weights}: holds a whole Keras model (its own config and weights), not weights "
                "only: give it alone, without an architecture JSON"
            )
        budget = WeightBudget(root, source)
        leaves, graph = leaves_and_graph(root, source)
        if "layer_names" in f.attrs or "layer_names0" in f.attrs:
            layers = read_weights_group(root, f, source, budget, where=name, config=side, leaves=leaves)
            file_version = _attr_text(f, "keras_version")
        elif isinstance(f.get("layers"), h5py.Group) or isinstance(f.get("vars"), h5py.Group):
            layers = read_weight_tree(f, root, source, budget, member=name, config=side, leaves=leaves)
            file_version = None
        else:
            raise ConversionError(
                f"{weights}: is an HDF5 file without Keras weights (neither the layer_names "
                "attribute of a Keras 2 save_weights file nor the layers group of a Keras 3 one)"
            )
    version = config.get("keras_version") if isinstance(config.get("keras_version"), str) else None
    keras3 = looks_keras3(config) or "module" in config
    if version is None and not keras3:
        version = file_version
    major = version_major(version)
    keras2 = major == 2 if major is not None else not keras3
    if major is not None and major < 2:
        raise ConversionError(
            f"{architecture}: was written by Keras {version}; Keras 1 files are "
            "not read (load and re-save it with Keras 2 or 3)"
        )
    return KerasModel(
        source=source,
        format="keras2-json" if keras2 else "keras3-json",
        keras_version=version,
        input_shape=root.input_shape,
        layers=layers,
        name=root.name,
        model_class=root.class_name,
        files=(architecture, weights),
        graph=graph,
        input_dtypes=dtypes,
    )


def _attr_text(f: h5py.File, key: str) -> str | None:
    try:
        return to_str(f.attrs[key]) if key in f.attrs else None
    except (TypeError, UnicodeDecodeError):
        return None
