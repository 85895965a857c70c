"""Reader of the Keras 3 native format: a ``.keras`` zip archive (or the same files unzipped).

On disk::

    metadata.json       {"keras_version": "3.15.1", "date_saved": ...}
    config.json         {"module", "class_name": "Sequential" | "Functional", "config": {...}}
    model.weights.h5    layers/<path>/vars/0, 1, ...   (one dataset per variable, in order)
    assets/<path>/vocabulary.txt   a lookup layer's adapted (or file) vocabulary, one token a line

``<path>`` is not the layer's name: it is ``snake_case(class name)`` made unique with ``_1``,
``_2``... in the order of ``model.layers`` (Sequential: without InputLayer; Functional: with
it), e.g. ``layers/dense``, ``layers/dense_1``, ``layers/batch_normalization``; a nested model
adds ``layers/sequential/layers/dense``. Recent Keras 3 versions also write the layer's name as
the ``name`` attribute of each ``vars`` group, which is used to confirm (or find) the match.
tf_keras (Keras 2) writes the same layout, without the ``name`` attributes.

Keras 3's ``model.save_weights("w.weights.h5")`` (and tf_keras's, for that suffix) writes the
same layout as ``model.weights.h5`` in a file of its own; :func:`read_weight_tree` reads either,
for the split form (``split_forms.py``) as for archives.

A lookup layer whose config holds no vocabulary (``IntegerLookup`` adapted, or given a file) has it
in ``assets/<path>/vocabulary.txt``, the mask and OOV tokens first, as its ``get_vocabulary()``
lists them: the reader puts those tokens in its config's ``vocabulary`` (integers where every line
is one), as Keras's ``load_assets`` sets them.

Each member's declared size is checked before it is read (``limits.py``); ``model.weights.h5`` is
read in place or through a temporary file, never whole into memory (``zip_member.py``).
"""

from __future__ import annotations

import json
import os
import stat
import zipfile
import zlib
from collections.abc import Callable
from typing import Any

import h5py

from malinn.errors import ConversionError

from .chain import ModelNode, is_operation, iter_chain, leaves_and_graph, named_leaves, parse_model
from .dtypes import input_dtypes, variable_dtype
from .hdf5_util import read_weight, refuse_external_links, to_str
from .limits import MAX_JSON_BYTES, WeightBudget, check_member, member_limit, size_text
from .model_spec import KerasLayer, KerasModel
from .naming import unique_saving_names
from .provenance import check_keras_own
from .zip_member import open_member

CONFIG = "config.json"
METADATA = "metadata.json"
WEIGHTS = "model.weights.h5"
WEIGHTS_NPZ = "model.weights.npz"
#: the asset a lookup layer saves its vocabulary in, under ``assets/<its path>/``
VOCABULARY = "vocabulary.txt"
#: the variable of a lookup layer in ``"tf_idf"`` mode (Keras's IndexLookup saves it by name)
IDF_WEIGHTS = "idf_weights"


def _fail(source: str, message: str) -> ConversionError:
    return ConversionError(f"{source}: {message}")


def _load_json(data: bytes, source: str, member: str) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: nested past json's depth
        raise _fail(source, f"{member} is not valid JSON: {exc}") from exc


def read_keras3_zip(source: str) -> KerasModel:
    """Read a ``.keras`` archive, checking each member's declared size before reading it."""
    try:
        archive = zipfile.ZipFile(source, "r")
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise _fail(source, f"is not a readable zip archive (truncated or corrupt?): {exc}") from exc
    with archive:
        names = set(archive.namelist())

        def read_json(member: str) -> Any:
            info = archive.getinfo(member)
            check_member(info, MAX_JSON_BYTES, "malinn's limit for a JSON member", source)
            try:
                data = archive.read(info)
            except (
                zipfile.BadZipFile,
                OSError,
                ValueError,
                EOFError,
                RuntimeError,
                NotImplementedError,
                zlib.error,
            ) as exc:
                raise _fail(source, f"cannot read {member} from the archive: {exc}") from exc
            return _load_json(data, source, member)

        if CONFIG not in names:
            raise _fail(source, f"is a zip archive without {CONFIG}: not a Keras .keras file")
        config = read_json(CONFIG)
        metadata = read_json(METADATA) if METADATA in names else None
        if WEIGHTS not in names:
            if WEIGHTS_NPZ in names:
                raise _fail(source, f"stores its weights as {WEIGHTS_NPZ}, which malinn does not read")
            raise _fail(source, f"has no {WEIGHTS} in the archive: the weights are missing")
        root, version = _parse(source, config, metadata)
        info = archive.getinfo(WEIGHTS)
        check_member(info, *member_limit(root), source)

        def read_asset(member: str) -> bytes | None:
            if member not in names:
                return None
            asset = archive.getinfo(member)
            check_member(asset, MAX_JSON_BYTES, "malinn's limit for an asset", source)
            try:
                return archive.read(asset)
            except (zipfile.BadZipFile, OSError, ValueError, EOFError, RuntimeError, zlib.error) as exc:
                raise _fail(source, f"cannot read {member} from the archive: {exc}") from exc

        with open_member(source, archive, info) as weights_file:
            return _build(source, root, version, weights_file, with_vocabulary(read_asset))


def read_keras3_dir(source: str) -> KerasModel:
    """Read an unzipped ``.keras`` model (``model.save(path, zipped=False)``)."""

    def path(member):
        """The member's file, refused where it is a link leading out of the folder (another file of
        this machine read as the model's: /etc/passwd as its config)."""
        inside = os.path.join(source, member)
        if os.path.lexists(inside) and os.path.dirname(os.path.realpath(inside)) != os.path.realpath(source):
            raise _fail(
                source,
                f"{member} is a link to {os.path.realpath(inside)}, outside the model's folder; "
                "malinn reads the folder's own files",
            )
        kind = file_kind(inside)
        if kind not in ("a regular file", None):  # a FIFO would block the read for good
            raise _fail(source, f"{member} is {kind}, not a regular file; a Keras model's folder holds files")
        return inside

    def read_json(member: str) -> Any:
        size = os.path.getsize(path(member))
        if size > MAX_JSON_BYTES:
            raise _fail(
                source,
                f"{member} has {size_text(size)}, more than malinn's limit for a "
                f"JSON member ({size_text(MAX_JSON_BYTES)})",
            )
        with open(path(member), "rb") as fh:
            return _load_json(fh.read(), source, member)

    if not os.path.isfile(path(CONFIG)):
        raise _fail(source, f"is a directory without {CONFIG}: not a Keras model")
    config = read_json(CONFIG)
    metadata = read_json(METADATA) if os.path.isfile(path(METADATA)) else None
    if not os.path.isfile(path(WEIGHTS)):
        raise _fail(source, f"has no {WEIGHTS}: the weights are missing")

    def read_asset(member: str) -> bytes | None:
        inside, folder = os.path.join(source, member), os.path.realpath(source)
        if not os.path.lexists(inside):
            return None
        if os.path.commonpath([os.path.realpath(inside), folder]) != folder:
            raise _fail(source, f"{member} is a link to {os.path.realpath(inside)}, outside the model's folder")
        if file_kind(inside) != "a regular file" or os.path.getsize(inside) > MAX_JSON_BYTES:
            raise _fail(source, f"{member} is not a regular file within malinn's limit for an asset")
        with open(inside, "rb") as fh:
            return fh.read()

    root, version = _parse(source, config, metadata)
    return _build(source, root, version, path(WEIGHTS), with_vocabulary(read_asset))


def file_kind(path: str) -> str | None:
    """What ``path`` is (``"a regular file"``, ``"a directory"``, ``"a FIFO"``, ``"a socket"``, ``"a
    character device"``, ``"a block device"``; a link: what it leads to), or None where nothing is."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    for test, kind in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return kind
    return "neither a file nor a folder"


def _parse(source: str, config: Any, metadata: Any) -> tuple[ModelNode, str | None]:
    """The model's structure (custom objects refused) and the Keras version that wrote it."""
    version = None
    if isinstance(metadata, dict) and isinstance(metadata.get("keras_version"), str):
        version = metadata["keras_version"]
    elif metadata is not None and not isinstance(metadata, dict):
        raise _fail(source, f"{METADATA} is not a JSON object")
    root = parse_model(config, source, where=CONFIG)
    check_keras_own(root, source)
    return root, version


def with_vocabulary(read_asset: Callable[[str], bytes | None]) -> Callable[[str, Any], Any]:
    """``(layer path, config) -> config``: a lookup layer's config (``"vocabulary": None``) with the
    tokens of its ``assets/<path>/vocabulary.txt`` (read by ``read_asset``, None where there is none)
    as its vocabulary; any other config as it is."""

    def config_with_assets(layer_path: str, config: Any) -> Any:
        if not isinstance(config, dict) or "vocabulary" not in config or config["vocabulary"] is not None:
            return config
        data = read_asset(f"assets/{layer_path}/{VOCABULARY}")
        if data is None:
            return config
        lines = data.decode("utf-8", errors="replace").splitlines()
        while lines and lines[-1] == "":
            lines.pop()
        try:
            tokens: list = [int(line) for line in lines]
        except ValueError:  # string tokens (StringLookup's), which the layer refuses
            tokens = lines
        return {**config, "vocabulary": tokens}

    return config_with_assets


def _build(
    source: str, root: ModelNode, version: str | None, weights_file: Any, assets: Callable | None = None
) -> KerasModel:
    dtypes = input_dtypes(root, source)
    try:
        h5 = h5py.File(weights_file, "r")
    except (OSError, ValueError) as exc:
        raise _fail(source, f"{WEIGHTS} is not a readable HDF5 file (truncated or corrupt?): {exc}") from exc
    with h5:
        try:
            refuse_external_links(h5, source)
            leaves, graph = leaves_and_graph(root, source)
            layers = read_weight_tree(h5, root, source, WeightBudget(root, source), leaves=leaves, assets=assets)
        except ConversionError:
            raise
        except (KeyError, OSError, RuntimeError, ValueError, TypeError, UnicodeError) as exc:
            raise _fail(source, f"{WEIGHTS} is corrupt ({type(exc).__name__}: {exc})") from exc
    return KerasModel(
        source=source,
        format="keras3-zip",
        keras_version=version,
        input_shape=root.input_shape,
        layers=layers,
        name=root.name,
        model_class=root.class_name,
        graph=graph,
        input_dtypes=dtypes,
    )


#: layers that wrap another one; Keras 3 saves the wrapped layer's variables under ``<wrapper>/layer/vars``
WRAPPERS = ("TimeDistributed",)
#: where Keras 3 saves a recurrent layer's variables under its own group (its cell's; a
#: Bidirectional's forward layer's, then its backward layer's)
CELL_PATHS = ("cell", "forward_layer/cell", "backward_layer/cell")
#: where MultiHeadAttention's variables are: its projections' (query, key, value, output, in its weights'
#: order; Keras 3 names them query_dense, tf_keras's .keras _query_dense)
ATTENTION_PATHS = tuple(f"{prefix}{part}_dense" for part in ("query", "key", "value", "output") for prefix in ("", "_"))


def read_weight_tree(
    h5: h5py.File,
    root: ModelNode,
    source: str,
    budget: WeightBudget,
    member: str = WEIGHTS,
    config: str = "the config",
    leaves: list | None = None,
    assets: Callable[[str, Any], Any] | None = None,
) -> list[KerasLayer]:
    """Each leaf layer of ``root`` with its variables from a Keras 3-layout HDF5 file.

    Args:
        h5: ``model.weights.h5`` of a ``.keras`` archive, or a ``save_weights("w.weights.h5")``
            file (the same layout).
        root: the model's structure (:func:`converters.chain.parse_model`).
        source: the file(s), for messages; budget: the :class:`~converters.limits.WeightBudget`.
        member: the weights file's name in messages; config: what holds the layers, in messages.
        leaves: the ``(leaf, trail, name)`` triples to read, in order (those of
            :func:`converters.chain.leaves_and_graph`); ``None``: ``root``'s chain.
        assets: ``(layer path, config) -> config`` adding what a layer keeps in the archive's
            assets (:func:`with_vocabulary`); None: the configs as they are.

    Returns:
        A :class:`KerasLayer` per leaf, named ``name``, in the order of ``leaves``. The variables
        are found by the leaf's trail through the nested models, so layers of two nested models
        with one name each get their own.

    Raises:
        ConversionError: variables not numbered 0, 1, ...; a ``vars`` group labelled with another
            layer's name; no group for a layer of ``config`` (Keras writes one for every layer,
            an empty ``vars`` for one without weights), or weights for a layer it does not have.
    """
    layers, claimed = [], set()
    memo: dict = {}
    for leaf, trail, name in named_leaves(list(iter_chain(root))) if leaves is None else leaves:
        group_path, group = _find_vars(h5, trail, leaf.name, source, member, config, memo)
        if leaf.class_name in WRAPPERS and (group is None or not len(group)):
            claimed.add(group_path.rsplit("/", 1)[0])  # the wrapper's own (empty) group
            group_path = group_path[: -len("vars")] + "layer/vars"  # the wrapped layer's own variables
            group = h5.get(group_path) if isinstance(h5.get(group_path), h5py.Group) else None
        names, arrays = [], []
        layer_path = group_path.rsplit("/", 1)[0]
        groups = [(group_path, group)]
        if group is not None and not len(group):  # a recurrent layer's variables are its cell's
            groups += [
                (f"{layer_path}/{sub}/vars", h5[f"{layer_path}/{sub}/vars"])
                for sub in CELL_PATHS + ATTENTION_PATHS
                if isinstance(h5.get(f"{layer_path}/{sub}/vars"), h5py.Group)
            ]
        if group is None and h5.get(layer_path) is None and not is_operation(leaf):
            raise _fail(
                source,
                f"{member} has no weights for layer {leaf.name!r} ({leaf.class_name}) of {config} "
                f"(Keras would keep them in {layer_path}): the weights do not match",
            )
        for group_path, group in groups if group is not None else []:
            assert group is not None  # the layer's group, then its cell's (each an h5py.Group)
            claimed.add(group_path.rsplit("/", 1)[0])
            keys = list(group.keys())
            if keys == [IDF_WEIGHTS]:  # a lookup layer's one variable, which Keras saves by its name
                order = keys
            else:
                try:
                    order = sorted(keys, key=int)
                except ValueError:
                    raise _fail(
                        source,
                        f"{member}: {group_path} holds {keys}, not variables named 0, 1, ...",
                    ) from None
                if [int(k) for k in order] != list(range(len(order))):
                    raise _fail(source, f"{member}: {group_path} has variables {order}, with gaps")
            for key in order:
                where = f"{member}:{group_path}/{key}"
                names.append(f"{group_path}/{key}")
                arrays.append(read_weight(group[key], source, where, budget, variable_dtype(leaf.config)))
        layers.append(
            KerasLayer(
                class_name=leaf.class_name,
                name=name,
                config=leaf.config if assets is None else assets(layer_path, leaf.config),
                weights=arrays,
                weight_names=names,
            )
        )
    _check_unclaimed(h5, root, "", claimed, source, member, config)
    return layers


def _holds_data(obj: Any) -> bool:
    """Whether ``obj`` is a dataset or a group with one somewhere below it (walked with a list, each
    group once: groups nested thousands deep, or linked into a cycle, end the walk too)."""
    pending, seen = [obj], set()
    while pending:
        obj = pending.pop()
        if isinstance(obj, h5py.Dataset):
            return True
        if isinstance(obj, h5py.Group) and obj.id not in seen:
            seen.add(obj.id)
            pending.extend(obj[key] for key in obj)
    return False


def _check_unclaimed(
    h5: h5py.File, model: ModelNode, prefix: str, claimed: set, source: str, member: str, config: str
) -> None:
    """Refuse weights under ``layers/`` that belong to no layer of the config."""
    layers = h5.get(f"{prefix}layers")
    if not isinstance(layers, h5py.Group):
        return
    known = {name: m for name, m in zip(_saving_names(model), model.members) if name is not None}
    for key in layers:
        path = f"{prefix}layers/{key}"
        owner = known.get(key)
        if isinstance(owner, ModelNode):
            _check_unclaimed(h5, owner, path + "/", claimed, source, member, config)
        elif owner is None and path not in claimed and _holds_data(layers[key]):
            vars_group = layers[key].get("vars") if isinstance(layers[key], h5py.Group) else None
            label = _vars_name(vars_group)
            what = f" of layer {label!r}" if label else ""
            raise _fail(
                source,
                f"{member}: {path} holds weights{what}, which {config} does not have (its layers "
                f"are saved as {', '.join(known) or 'nothing'}): the weights do not match",
            )


def _vars_name(group: h5py.Group) -> str | None:
    if group is None or "name" not in group.attrs:
        return None
    try:
        return to_str(group.attrs["name"])
    except (TypeError, UnicodeDecodeError):
        return None


def _find_vars(
    h5: h5py.File, trail: tuple, layer_name: str, source: str, member: str, config: str, memo: dict | None = None
) -> tuple[str, h5py.Group | None]:
    """The ``vars`` group holding a layer's variables, or ``(path, None)`` if there is none.

    ``memo`` keeps, across the layers of one file, each model's saving names and each folder's
    ``vars`` labels (found once each: per layer, a model of thousands of layers took minutes)."""
    memo = {} if memo is None else memo
    prefix = ""
    for model, index in trail:
        names = memo.get(("names", id(model)))
        if names is None:
            names = memo[("names", id(model))] = _saving_names(model)
        prefix = f"{prefix}layers/{names[index]}/"
    path = prefix + "vars"
    group = h5.get(path)
    if group is not None and not isinstance(group, h5py.Group):
        group = None
    written = _vars_name(group)
    if group is not None and (written is None or written == layer_name):
        return path, group
    # Paths disagree with the config order: look for the vars group Keras labelled by name.
    parent_path = prefix.rstrip("/").rsplit("/", 1)[0]
    labels = memo.get(("labels", parent_path))
    if labels is None:
        labels = memo[("labels", parent_path)] = _vars_labels(h5, parent_path)
    if layer_name in labels:
        return labels[layer_name]
    if group is not None:
        raise _fail(
            source,
            f"{member}: {path} holds the weights of layer {written!r}, not of {layer_name!r} of "
            f"{config}, and no weights are labelled with that name: the weights do not match",
        )
    return path, None


def _vars_labels(h5: h5py.File, parent_path: str) -> dict:
    """``{layer name Keras labelled a vars group with: (path, group)}`` for the folders under
    ``parent_path`` (the first of a name, as a search in folder order finds it)."""
    parent = h5.get(parent_path) if parent_path else None
    labels: dict = {}
    if isinstance(parent, h5py.Group):
        for key in parent:
            candidate = parent[key].get("vars") if isinstance(parent[key], h5py.Group) else None
            label = _vars_name(candidate) if isinstance(candidate, h5py.Group) else None
            if label is not None and label not in labels:
                labels[label] = (f"{parent_path}/{key}/vars", candidate)
    return labels


def _saving_names(model: ModelNode) -> list:
    """Each member's path component under ``layers/`` (None for a Keras 3 operation: Keras numbers
    the model's layers alone, so ``a + b`` before a ``layers.Add`` leaves it ``add``, not ``add_1``)."""
    layers = iter(unique_saving_names([m.class_name for m in model.members if not is_operation(m)]))
    return [None if is_operation(m) else next(layers) for m in model.members]
