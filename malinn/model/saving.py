"""malinn model files: a model's configuration plus weights already laid out for a target kernel.

A malinn model file is HDF5 (read on the board with h5py alone):

* root attributes: ``malinn_format = "malinn-model"``, ``format_version`` (1; 2 for a file whose
  weights are stored in a reduced precision, 3 for one whose input has a dtype other than float32
  (predict casts to it first), either of which an older malinn must refuse), ``precision``
  (``fp32``, ``fp16-storage``, ``fp16`` or ``int8-weights``: the model's weight precision),
  ``malinn_version``, ``target`` (the matmul codename whose layouts the weights are in) and
  ``target_defines`` (its configuration, JSON), ``config`` (JSON: the model's class, its layers and
  their configs, the input's ``input_dtype`` (Sequential) or each input's ``dtype`` (Functional)
  where it is not float32: a file without one is float32), ``source`` (JSON: the Keras file, its
  format and Keras version, when converted);
* group ``layers/<index>``, one per layer, holding what the layer's ``save_own_variables`` writes:
  for a Dense, dataset ``kernel_laid_out`` (``W = kernel^T`` as the flat buffer the target kernel
  reads, in the precision: float32, float16, or int8 with dataset ``kernel_scales``; attributes
  ``layout``, ``padded``, ``shape`` and ``precision``) and ``bias``; for a
  BatchNormalization, its four vectors.

Classes are found by name in :mod:`malinn.registry`. Loading uploads a laid-out kernel as it is
when the plan's kernel reads that layout and padding, and re-lays it out on the host only when it
wants another. Files are written to a temporary file beside the destination and renamed into
place, so a failure leaves no partial file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

import numpy as np

from ..backends.selection import get_device
from ..choice.kernel_choice import REDUCED_PRECISION_BACKENDS, choose, in_precision
from ..converters import read_keras
from ..converters.hdf5_util import read_json_attribute, read_weight, refuse_external_links
from ..converters.limits import MAX_JSON_BYTES, WeightBudget
from ..converters.to_malinn import to_model
from ..errors import ConversionError, LibraryError, MalinnError
from ..io.files import HDF5Sink, signals_held, write_file
from ..layers.base import placeholders, weights_to_be_loaded
from ..library.kernel_library import DEFAULT_PRECISION, load_library
from ..library.precision import check_precision
from ..registry import lookup
from ..version import __version__

if TYPE_CHECKING:
    from ..layers.base import Layer
    from ..library.kernel_spec import KernelSpec

__all__ = ["save_model", "load_model", "convert", "is_malinn_file", "resolve_target", "FORMAT_VERSION"]

FORMAT_NAME = "malinn-model"
FORMAT_VERSION = 3
#: the version written for fp32 weights, which malinn 0.1 reads too
FORMAT_VERSION_FP32 = 1
#: the version written for weights in a reduced precision
FORMAT_VERSION_PRECISION = 2

#: a path as the public functions take it
PathLike = str | bytes | os.PathLike


class SavedModel(Protocol):
    """What writing a model file reads of a model (:class:`~malinn.model.model.PlannedModel`)."""

    name: str
    layers: list[Layer]
    source: dict | None

    @property
    def built(self) -> bool: ...

    @property
    def precision(self) -> str: ...

    def get_config(self) -> dict: ...


def _backend_target(target: object) -> tuple[str, str] | tuple[None, None]:
    """``(backend, device kind)`` of a target naming a backend's device kind (``gl``: ``("gl", "gpu")``,
    ``opencl:cpu``), else ``(None, None)``."""
    backend, _, kind = str(target).partition(":")
    if backend in ("opencl", "gl", "gles3") and kind in ("", "gpu", "cpu", "accelerator"):
        return backend, kind or "gpu"
    return None, None


def resolve_target(target: str | None = None, precision: str = DEFAULT_PRECISION) -> KernelSpec:
    """The matmul kernel for ``target``: a codename, a device kind (``gpu``, ``cpu``,
    ``accelerator``, or one of a backend: ``gl``, ``gl:gpu``, ``gl:cpu``, ``opencl:cpu``), or None
    (the current device's: its chosen kernel, or its kind's default where the chosen one, a tuned
    winner say, cannot read weights in ``precision``).

    Returns:
        A :class:`~malinn.library.kernel_library.KernelSpec` (with the configuration the target uses).

    Raises:
        ConversionError: ``target`` is neither a matmul codename nor ``gpu``/``cpu``/``accelerator``.
    """
    library = load_library()
    if target is None:
        device = get_device()
        spec = choose("matmul", device)
        if precision in spec.precisions:
            return spec
        return library.default_spec("matmul", device.kind, device.backend)
    if target in ("gpu", "cpu", "accelerator"):  # the kind's default, or its first kernel that reads the precision
        return _in_precision_or_fp32(library.default_spec("matmul", target), precision, target, "opencl")
    backend, kind = _backend_target(target)
    if backend is not None and kind is not None:  # both or neither
        return _in_precision_or_fp32(library.default_spec("matmul", kind, backend), precision, kind, backend)
    if target in library and library[target].op == "matmul":
        return library[target]
    raise ConversionError(
        f"unknown target {getattr(target, 'name', target)!r}; use gpu, cpu, accelerator (or gl, gl:cpu, gles3, ...) or a matmul kernel: "
        f"{', '.join(library.codenames('matmul'))}"
    )


def _in_precision_or_fp32(spec: KernelSpec, precision: str, kind: str, backend: str) -> KernelSpec:
    """A device kind's default ``spec``, or (where it reads fp32 only) the kind's first kernel that
    reads ``precision``, returned in fp32 as :func:`resolve_target` returns every target (the
    caller puts it in the precision); ``spec`` where no kernel of the backend reads it (the caller
    refuses the precision)."""
    if precision == DEFAULT_PRECISION or precision in spec.precisions:
        return spec
    try:
        found = in_precision(spec, precision, kind, backend)
    except LibraryError:
        return spec
    return found.in_precision(DEFAULT_PRECISION)


def save_model(model: SavedModel, path: str | os.PathLike, target: str | None = None, overwrite: bool = False) -> Path:
    """Writes ``model`` as a malinn model file with weights laid out for ``target``.

    The file is written by :func:`malinn.io.files.write_file`: atomically, a symlink is followed,
    a character device or FIFO is written through, modes are kept.

    Args:
        model: a built model (:class:`~malinn.Sequential` or :class:`~malinn.Functional`).
        path: the destination file.
        target: a matmul codename, a device kind (``gpu``, ``cpu``, ``accelerator``) or one of a
            backend (``gl``, ``gl:cpu``, ``gles3``, ``opencl:cpu``, ...) (default: the current
            device's kernel).
        overwrite: allow ``path`` to be the Keras file the model was converted from.

    Returns:
        The path written.

    Raises:
        ConversionError: the model is not built, the target is unknown, ``path`` is the model's
            source file (without ``overwrite``), or the file cannot be written (nothing is left
            behind).
        DeviceError: ``target`` is None and there is no working device.
    """
    origin = getattr(model, "source", None) or {}
    return _save(model, path, target, source=(origin.get("file"), origin.get("weights")), overwrite=overwrite)


def _save(
    model: SavedModel,
    path: str | os.PathLike,
    target: str | None,
    source: tuple[PathLike | None, PathLike | None],
    overwrite: bool,
) -> Path:
    import h5py

    if not model.built:
        raise ConversionError(f"{path}: model {model.name!r} is not built; call build(input_shape) or predict first")
    precision = model.precision
    spec = resolve_target(target, precision)
    backend, _ = _backend_target(target)
    if precision != DEFAULT_PRECISION and backend is not None and backend not in REDUCED_PRECISION_BACKENDS:
        raise ConversionError(
            f"{path}: target {target} is an OpenGL device's, which runs fp32 weights only; "
            f"{precision} runs on OpenCL devices (targets gpu, cpu)"
        )
    if precision not in spec.precisions:
        supporting = [c for c in load_library().codenames("matmul") if precision in load_library()[c].precisions]
        raise ConversionError(
            f"{path}: target {spec.codename} reads fp32 weights only, not {precision}; "
            f"targets for {precision}: gpu, cpu, {', '.join(supporting)}"
        )
    spec = spec.in_precision(precision)
    config = {"class_name": type(model).__name__, **model.get_config()}
    for entry, layer in zip(config["layers"], model.layers):
        entry["keras_names"] = list(layer.keras_names)

    def write(tmp: IO[bytes]) -> None:
        sink = HDF5Sink(tmp)  # HDF5 never meets a failed write (a full disk): it closes the file whole
        # nor a signal's exception inside its writes (through the sink's Python methods): acted on after
        with signals_held(), h5py.File(sink, "w") as f:
            f.attrs["malinn_format"] = FORMAT_NAME
            f.attrs["format_version"] = (
                FORMAT_VERSION
                if _casts_an_input(config)
                else FORMAT_VERSION_PRECISION
                if precision != "fp32"
                else FORMAT_VERSION_FP32
            )
            f.attrs["malinn_version"] = __version__
            f.attrs["precision"] = precision
            f.attrs["target"] = spec.codename
            f.attrs["target_defines"] = json.dumps(spec.config)
            f.attrs["config"] = json.dumps(config)
            f.attrs["source"] = json.dumps(getattr(model, "source", None))
            group = f.create_group("layers")
            for i, layer in enumerate(model.layers):
                if sink.failed:  # the file cannot be written: add nothing more to what HDF5 keeps in memory
                    break
                g = group.create_group(str(i))
                g.attrs["name"] = layer.name
                try:
                    layer.save_own_variables(g, spec)
                except ValueError as exc:  # weights the precision cannot hold: named by the layer
                    raise ConversionError(f"{path}: {exc}") from None
        sink.check()  # the first failed write, now that HDF5 has closed every object of the file

    try:
        return write_file(path, write, source=source, overwrite_source=overwrite)
    except ConversionError:
        raise
    except MalinnError as exc:
        raise ConversionError(str(exc)) from None
    except (OSError, ValueError, TypeError) as exc:
        raise ConversionError(f"{path}: cannot write the model file ({exc})") from None


def _casts_an_input(config: dict) -> bool:
    """Whether a model's config gives an input a dtype other than float32: an older malinn, which
    would not cast it, must refuse the file (its format version)."""
    return "input_dtype" in config or any("dtype" in entry for entry in config.get("inputs", []))


def is_malinn_file(path: PathLike) -> bool:
    """Whether ``path`` is an HDF5 file marked as a malinn model."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            return f.attrs.get("malinn_format") in (FORMAT_NAME, FORMAT_NAME.encode())
    except Exception:
        return False


def _read_malinn(path: Path) -> Any:
    import h5py

    source = str(path)
    with h5py.File(path, "r") as f:
        refuse_external_links(f, source)
        try:
            version = int(f.attrs["format_version"])
        except (KeyError, TypeError, ValueError):
            raise ConversionError(f"{path}: has no format version (damaged malinn model file)") from None
        if version > FORMAT_VERSION:
            raise ConversionError(
                f"{path}: format version {version} was written by a newer malinn "
                f"(this one reads up to {FORMAT_VERSION})"
            )
        if version < 1:
            raise ConversionError(f"{path}: format version {version} is no malinn format (damaged file)")
        damaged = f"{path} (a damaged malinn model file)"  # how the checks below name it
        config = read_json_attribute(f, "config", damaged, MAX_JSON_BYTES)
        origin = read_json_attribute(f, "source", damaged, MAX_JSON_BYTES) if "source" in f.attrs else None
        json.dumps(config, ensure_ascii=False).encode("utf-8")  # text that is not UTF-8: damaged
        origin = _provenance(origin)
        if not isinstance(config, dict) or not isinstance(config.get("layers"), list):
            raise ConversionError(f"{path}: its config lists no layers (damaged malinn model file)")
        try:
            model_class = lookup("model", config.get("class_name", "Sequential"))
            layers = [lookup("layer", entry["class_name"]) for entry in config["layers"]]
        except KeyError as exc:
            raise ConversionError(f"{path}: {exc.args[0]}") from None
        made = []
        for cls, entry in zip(layers, config["layers"]):
            layer = cls.from_config(entry["config"])
            layer.keras_names = tuple(entry.get("keras_names", ()))
            made.append(layer)
        with weights_to_be_loaded():  # every weight is read from the file below: no random draw first
            model = model_class.from_layers(config, made, precision=str(f.attrs.get("precision", "fp32")))
        budget = WeightBudget(None, damaged)
        for i, (layer, entry) in enumerate(zip(made, config["layers"])):
            checked = _CheckedGroup(f["layers"][str(i)], damaged, f"layers/{i}", budget)
            elementwise = entry.get("elementwise") and len(model.input_shapes[0]) > 1
            group = _untiled(checked, model.input_shape[-1]) if elementwise else checked
            layer.load_own_variables(group)
            if placeholders(layer):  # a weight the layer has that its group did not give
                raise ConversionError(
                    f"{damaged}: layers/{i} holds no {', '.join(placeholders(layer))} for layer {layer.name!r}"
                )
    model.source = origin
    return model


def _provenance(origin: object) -> dict | None:
    """The ``source`` a model file records (the Keras file it came from), as a dict whose texts are
    valid Unicode or a file's name: provenance only, it never makes a model unloadable. A file name
    of bytes that are not UTF-8 (``model\xff.keras``) is kept as Python holds such a name (the
    bytes as surrogates: ``os.fsencode`` gives them back, and a save beside it still finds the
    file); any other text that is not valid Unicode is shown with backslash escapes; anything but a
    JSON object is no provenance (None)."""
    if not isinstance(origin, dict):
        return None

    def text(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            value.encode("utf-8", "surrogateescape")  # valid, or a file name's undecodable bytes
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")

    return {text(key): text(value) for key, value in origin.items()}


class _CheckedGroup:
    """A layer's group of a malinn model file as its ``load_own_variables`` reads it (``store[name]``,
    ``name in store``, ``len``, iteration): each dataset is read through the Keras readers' checks
    (numeric, its data in this file, within the file's weight budget and the bytes it stores)."""

    def __init__(self, group: Any, source: str, where: str, budget: WeightBudget):
        self.group, self.source, self.where, self.budget = group, source, where, budget

    def __getitem__(self, name: str) -> _CheckedGroup | _CheckedDataset:
        item = self.group[name]
        where = f"{self.where}/{name}"
        if hasattr(item, "keys"):
            return _CheckedGroup(item, self.source, where, self.budget)
        return _CheckedDataset(item, self.source, where, self.budget)

    def __contains__(self, name: object) -> bool:
        return name in self.group

    def __len__(self) -> int:
        return len(self.group)

    def __iter__(self) -> Iterator[str]:
        return iter(self.group)


class _CheckedDataset:
    """One weight dataset: ``[()]`` reads it through :func:`~malinn.converters.hdf5_util.read_weight`
    (as float32); ``attrs`` are its attributes."""

    def __init__(self, dataset: Any, source: str, where: str, budget: WeightBudget):
        self.dataset, self.source, self.where, self.budget = dataset, source, where, budget
        self.attrs = dataset.attrs

    def __getitem__(self, key: object) -> np.ndarray:
        if key != ():
            raise ConversionError(f"{self.source}: {self.where} is read whole, not by {key!r}")
        return read_weight(self.dataset, self.source, self.where, self.budget)


def _untiled(group: _CheckedGroup, channels: int) -> dict:
    """A malinn 0.1 file's BatchNormalization on multi-axis samples held its vectors tiled over the
    flattened sample; the layer now works on the last axis, whose values are the first ones."""
    untiled = {}
    for name in group:
        dataset = group[name]
        assert isinstance(dataset, _CheckedDataset), f"{group.where}/{name} is a group, not a vector"
        untiled[name] = np.asarray(dataset[()])[:channels]
    return untiled


def load_model(path: PathLike, weights: PathLike | None = None, precision: str | None = None) -> Any:
    """Loads a model from a malinn model file, a Keras file, or a Keras architecture and its weights.

    Args:
        path: a malinn model file, a Keras 3 ``.keras`` archive, a Keras 3 / Keras 2 ``.h5``, or
            (with ``weights``) the architecture JSON of ``model.to_json()``.
        weights: the weights file of ``model.save_weights()`` (Keras 2 ``.h5`` or Keras 3
            ``.weights.h5``) for the architecture JSON ``path``; None for a whole model file.
        precision: the weights' precision on the device: ``fp32``, ``fp16-storage``, ``fp16`` or
            ``int8-weights`` (default: the precision the malinn file records; fp32 for a Keras
            file, also for a Keras int8-quantized one, whose weights are then its int8 values
            times their scales, in float32).

    Returns:
        A built :class:`~malinn.Sequential` (a Keras Sequential or a Functional chain) or
        :class:`~malinn.Functional` (any other graph) with its weights.

    Raises:
        ConversionError: the file is missing, not a model, damaged, or holds unsupported layers;
            an architecture JSON without weights, weights without an architecture, or a pair that
            does not match; an empty path; the message names the file(s) and the cause.
        ValueError: ``precision`` is unknown.
        TypeError: ``path`` or ``weights`` is not a path (str, bytes or os.PathLike).
    """
    if precision is not None:
        check_precision(precision)
    model = _load_model(_as_path(path, "path"), None if weights is None else _as_path(weights, "weights"))
    if precision is not None:
        model.precision = precision
    return model


def _as_path(value: PathLike, what: str) -> Path:
    """``value`` (str, bytes or os.PathLike) as a Path, or a TypeError naming ``what``; an empty
    path is a ConversionError (``Path("")`` is the current folder)."""
    try:
        text = os.fsdecode(value)
    except TypeError:
        raise TypeError(
            f"{what} must be a file path (str, bytes or os.PathLike), got {type(value).__name__} {value!r}"
        ) from None
    if not text:
        raise ConversionError(f"{what} is an empty path; give the file")
    return Path(text)


def _load_model(path: Path, weights: Path | None) -> Any:
    if path.is_file() and is_malinn_file(path):
        if weights is not None:
            raise ConversionError(
                f"{path}: is a malinn model file, which holds its weights; load it without weights ({weights})"
            )
        try:
            return _read_malinn(path)
        except (ConversionError, LibraryError):  # the kernel library's own error is not the file's
            raise
        except Exception as exc:  # damaged file: h5py, KeyError, JSON, shape errors
            raise ConversionError(f"{path}: damaged malinn model file ({type(exc).__name__}: {exc})") from None
    return to_model(read_keras(path, weights=weights))


def convert(
    src: PathLike,
    dst: str | os.PathLike,
    target: str | None = None,
    overwrite: bool = False,
    weights: PathLike | None = None,
    precision: str | None = None,
) -> Path:
    """Converts a Keras file, or a Keras architecture and its weights, into a malinn model file for ``target``.

    Args:
        src: the Keras ``.keras`` / ``.h5`` file, or (with ``weights``) the architecture JSON of
            ``model.to_json()``.
        dst: the malinn model file to write (atomically: on failure no file is left).
        target: a matmul codename, a device kind (``gpu``, ``cpu``, ``accelerator``) or one of a
            backend (``gl``, ``gl:cpu``, ``gles3``, ``opencl:cpu``, ...) (default: the kernel the
            current device would choose).
        overwrite: allow ``dst`` to be ``src`` or ``weights`` (same file, also through links);
            without it that is refused.
        weights: the ``model.save_weights()`` file for the architecture JSON ``src``.
        precision: the weights' precision, stored in ``dst`` (default: ``src``'s; see
            :func:`load_model`).

    Returns:
        The path of ``dst``.

    Raises:
        ConversionError: ``src`` (and ``weights``) cannot be read or converted, ``dst`` is a
            source file (without ``overwrite``), or ``dst`` cannot be written.
        ValueError: ``precision`` is unknown.
        DeviceError: ``target`` is None and there is no working device.
        TypeError: ``src`` or ``weights`` is not a path (str, bytes or os.PathLike).
    """
    return _save(
        load_model(src, weights=weights, precision=precision), dst, target, source=(src, weights), overwrite=overwrite
    )
