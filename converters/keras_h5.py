"""Reader of legacy HDF5 model files: Keras 3 ``model.save("m.h5")`` and Keras 2 / tf_keras.

On disk (both generations)::

    /                        attrs: keras_version, backend, model_config (JSON), [training_config]
    /model_weights           attrs: layer_names (or layer_names0, layer_names1, ... when split)
    /model_weights/<layer>   attrs: weight_names (or weight_names0, ...), e.g.
                             Keras 2: ["dense/kernel:0", "dense/bias:0"]
                             Keras 3: ["sequential/dense/kernel", "sequential/dense/bias"]
    /model_weights/<layer>/<weight name>   the datasets (the weight name is an HDF5 path)

``layer_names`` follows ``model.layers`` (a Functional model's InputLayer included). A nested
model has one group holding all its layers' weights; they are split among its layers by the
layer name inside each weight name.

Keras 2's ``model.save_weights("w.h5")`` writes the ``model_weights`` group's contents at the
root of a file of its own (no ``model_config``); :func:`read_weights_group` reads either, for the
split form (``split_forms.py``) as for whole files.
"""

from __future__ import annotations

import json

import h5py

from malinn.errors import ConversionError

from .chain import (
    INPUT_LAYER,
    LayerEntry,
    ModelNode,
    is_operation,
    iter_chain,
    iter_leaves,
    leaves_and_graph,
    named_leaves,
    parse_model,
)
from .dtypes import input_dtypes, variable_dtype
from .hdf5_util import read_json_attribute, read_str_list, read_weight, refuse_external_links, to_str
from .limits import MAX_JSON_BYTES, WeightBudget
from .model_spec import KerasLayer, KerasModel, version_major
from .provenance import check_keras_own


def _fail(source: str, message: str) -> ConversionError:
    return ConversionError(f"{source}: {message}")


def looks_keras3(config: dict) -> bool:
    """Guess the generation of a file without keras_version from its config schema."""
    text = json.dumps(config)
    return '"batch_shape"' in text or '"DTypePolicy"' in text or '"__keras_tensor__"' in text


def read_keras_h5(source: str) -> KerasModel:
    """Read a legacy ``.h5`` model file written by Keras 3 or Keras 2 / tf_keras."""
    try:
        f = h5py.File(source, "r")
    except (OSError, ValueError) as exc:
        raise _fail(source, f"is not a readable HDF5 file (truncated or corrupt?): {exc}") from exc
    with f:
        try:
            return _read_open_file(f, source)
        except ConversionError:
            raise
        except (KeyError, OSError, RuntimeError, ValueError, TypeError, UnicodeError) as exc:
            raise _fail(source, f"the HDF5 file is corrupt ({type(exc).__name__}: {exc})") from exc


def _read_open_file(f: h5py.File, source: str) -> KerasModel:
    if "model_config" not in f.attrs:
        if "layer_names" in f.attrs or "layer_names0" in f.attrs or ("layers" in f and "vars" in f):
            raise _fail(
                source,
                "holds weights only (written by save_weights), without the model's architecture; "
                "give the architecture JSON (model.to_json()) with it as the model and this file "
                "as its weights (malinn convert model.json --weights FILE, or "
                "malinn.load_model('model.json', weights=FILE)), or save the whole model with "
                "model.save('model.keras')",
            )
        if "model_weights" in f:
            raise _fail(source, "has no model_config attribute, so the model's layers are unknown")
        raise _fail(source, "is an HDF5 file but not a Keras model file (no model_config attribute)")
    refuse_external_links(f, source)
    config = read_json_attribute(f, "model_config", source, MAX_JSON_BYTES)
    if not isinstance(config, dict):
        raise _fail(source, "its model_config attribute is not a JSON object")

    version = None
    for holder in (f, f.get("model_weights")):
        if holder is not None and "keras_version" in holder.attrs:
            try:
                version = to_str(holder.attrs["keras_version"])
            except (TypeError, UnicodeDecodeError):
                version = None
            break
    major = version_major(version)
    if major is not None and major < 2:
        raise _fail(
            source,
            f"was written by Keras {version}; Keras 1 files are not read (load and re-save it with Keras 2 or 3)",
        )
    if major is None:
        fmt = "keras3-h5" if looks_keras3(config) else "keras2-h5"
    else:
        fmt = "keras3-h5" if major >= 3 else "keras2-h5"

    root = parse_model(config, source)
    check_keras_own(root, source)
    dtypes = input_dtypes(root, source)

    if "model_weights" not in f or not isinstance(f["model_weights"], h5py.Group):
        raise _fail(source, "has no model_weights group: the weights are missing")
    leaves, graph = leaves_and_graph(root, source)
    layers = read_weights_group(root, f["model_weights"], source, WeightBudget(root, source), leaves=leaves)
    return KerasModel(
        source=source,
        format=fmt,
        keras_version=version,
        input_shape=root.input_shape,
        layers=layers,
        name=root.name,
        model_class=root.class_name,
        graph=graph,
        input_dtypes=dtypes,
    )


def read_weights_group(
    root: ModelNode,
    group: h5py.Group,
    source: str,
    budget: WeightBudget,
    where: str = "model_weights",
    config: str = "the config",
    leaves: list | None = None,
) -> list[KerasLayer]:
    """Each leaf layer of ``root`` with its weights from a Keras 2-layout HDF5 group.

    Args:
        root: the model's structure (:func:`converters.chain.parse_model`).
        group: the group holding ``layer_names`` and a group per layer: ``model_weights`` of a
            legacy ``.h5`` model file, or the root of a ``save_weights`` ``.h5`` file.
        source: the file(s), for messages; budget: the :class:`~converters.limits.WeightBudget`.
        where: the group's name in messages; config: what holds the layers, in messages.
        leaves: the ``(leaf, trail, name)`` triples to read, in order (those of
            :func:`converters.chain.leaves_and_graph`); ``None``: ``root``'s chain.

    Returns:
        A :class:`KerasLayer` per leaf, named ``name``, in the order of ``leaves``.

    Raises:
        ConversionError: a layer of the config without an entry in the group or the reverse, a
            weight listed but missing, a dataset that cannot be read; two layers of one nested
            model with one name, which its weight names cannot tell apart.
    """
    layer_names = read_str_list(group, "layer_names", source, where)
    if layer_names is None:
        raise _fail(source, f"{where} has no layer_names attribute: the weights are missing")
    weights = _collect_weights(root, group, layer_names, source, budget, where, config)
    if leaves is None:
        leaves = named_leaves(list(iter_chain(root)))
    layers = []
    for leaf, _trail, name in leaves:
        names, arrays = weights.get(id(leaf), ([], []))
        layers.append(
            KerasLayer(
                class_name=leaf.class_name,
                name=name,
                config=leaf.config,
                weights=arrays,
                weight_names=names,
            )
        )
    return layers


def _group_datasets(group: h5py.Group, source: str, layer: str, parent: str) -> list[tuple[str, object]]:
    """``(weight name, h5py object)`` of a layer's group, in the order of ``weight_names``."""
    where = f"{parent}/{layer}"
    names = read_str_list(group, "weight_names", source, where)
    if names is None:
        raise _fail(source, f"{where} has no weight_names attribute")
    out = []
    for weight_name in names:
        if weight_name not in group:
            raise _fail(source, f"weight {weight_name!r} of layer {layer!r} is missing from {where}")
        out.append((weight_name, group[weight_name]))
    return out


def _read(
    datasets: list, layer: str, config: dict, source: str, budget: WeightBudget, parent: str
) -> tuple[list, list]:
    names = [name for name, _ in datasets]
    arrays = [
        read_weight(obj, source, f"{parent}/{layer}/{name}", budget, variable_dtype(config)) for name, obj in datasets
    ]
    return names, arrays


def _collect_weights(
    root: ModelNode,
    weights_group: h5py.Group,
    layer_names: list[str],
    source: str,
    budget: WeightBudget,
    where: str,
    config: str,
) -> dict:
    """``{id(leaf layer): (weight names, arrays)}`` for every leaf layer of the model: a layer of
    the top model from its own group, one of a nested model from that model's group."""
    out: dict[int, tuple[list, list]] = {}
    listed = set(layer_names)
    for member in root.members:
        if isinstance(member, LayerEntry) and member.class_name == INPUT_LAYER:
            continue
        if member.name not in listed and is_operation(member):
            out[id(member)] = ([], [])  # Keras 3 saves the layers' weights only; an operation has none
            continue
        if member.name not in listed:
            raise _fail(
                source,
                f"{where} has no entry for layer {member.name!r} ({member.class_name}) of "
                f"{config}: the weights do not match",
            )
        group = weights_group.get(member.name)
        if not isinstance(group, h5py.Group):
            raise _fail(source, f"{where}/{member.name} is missing: the weights are missing")
        datasets = _group_datasets(group, source, member.name, where)
        if isinstance(member, LayerEntry):
            out[id(member)] = _read(datasets, member.name, member.config, source, budget, where)
        else:
            leaves = list(iter_leaves(member))
            owned = _split_nested(member, leaves, datasets, source)
            for leaf in leaves:
                out[id(leaf)] = _read(owned[id(leaf)], member.name, leaf.config, source, budget, where)
    config_names = {m.name for m in root.members}
    for name in layer_names:
        if name in config_names:
            continue
        group = weights_group.get(name)
        if isinstance(group, h5py.Group):
            extra = read_str_list(group, "weight_names", source, f"{where}/{name}") or []
            if extra:
                raise _fail(
                    source,
                    f"{where} holds weights for layer {name!r}, which {config} does not have: the weights do not match",
                )
    return out


def _split_nested(model: ModelNode, leaves: list, datasets: list, source: str) -> dict:
    """Give each layer of a nested model the weights whose name contains its name
    (``{id(leaf): [(weight name, dataset), ...]}``): Keras names them ``dense/kernel:0``, the layer's
    name alone, whatever model inside ``model`` holds it."""
    by_name: dict[str, list] = {}
    for leaf in leaves:
        by_name.setdefault(leaf.name, []).append(leaf)
    out: dict = {id(leaf): [] for leaf in leaves}
    for weight_name, obj in datasets:
        parts = weight_name.split("/")[:-1]
        owner = next((p for p in reversed(parts) if p in by_name), None)
        if owner is None:
            raise _fail(
                source,
                f"weight {weight_name!r} of nested model {model.name!r} belongs to none of its "
                f"layers ({', '.join(by_name)})",
            )
        if len(by_name[owner]) > 1:
            raise _fail(
                source,
                f"weight {weight_name!r} of nested model {model.name!r} may belong to any of its "
                f"{len(by_name[owner])} layers named {owner!r} (the .h5 format names a nested layer's "
                "weights by the layer's name alone); save the model as .keras, which keeps them apart",
            )
        out[id(by_name[owner][0])].append((weight_name, obj))
    return out
