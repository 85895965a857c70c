"""``read_keras(path)``: open any Keras model file and return a :class:`KerasModel`."""

from __future__ import annotations

import os

from malinn.errors import ConversionError

from .dense_variants import resolve_dense_variants
from .hdf5_util import is_hdf5_signature
from .keras3_zip import read_keras3_dir, read_keras3_zip
from .keras_h5 import read_keras_h5
from .model_spec import KerasModel
from .validate import check_model

_ZIP_SIGNATURES = (b"PK\x03\x04", b"PK\x05\x06")


def read_keras(path) -> KerasModel:
    """Read a Keras model file without TensorFlow.

    Accepts a Keras 3 ``.keras`` archive (or its unzipped directory), a Keras 3 legacy ``.h5``
    and a Keras 2 / tf_keras ``.h5``; the format is recognised from the file's bytes, not its
    name. The model must be Sequential or a Functional single chain.

    Nothing in the file is run: custom objects (a class, registered name or module that is not
    Keras's own) are refused by name (``provenance.py``). Declared sizes are checked before
    anything is read (``limits.py``). bfloat16 weights are widened to float32, LoRA merged into
    the Dense kernel; quantized Dense layers are refused (``dense_variants.py``).

    Raises :class:`malinn.errors.ConversionError`, naming the file and the cause, for anything
    wrong with the file: missing, empty, not a model, truncated, no config, missing weights,
    weights that contradict the config, a Functional graph that branches, custom objects,
    declared sizes over the limits, quantized Dense layers.
    """
    source = os.fsdecode(os.fspath(path))
    try:
        model = _read(source)
        resolve_dense_variants(model)
        check_model(model)
        return model
    except ConversionError:
        raise
    except Exception as exc:  # any h5py/zipfile/json failure on a bad file
        raise ConversionError(
            f"{source}: cannot read the file ({type(exc).__name__}: {exc})"
        ) from exc


def _read(source: str) -> KerasModel:
    if not os.path.exists(source):
        raise ConversionError(f"{source}: no such file")
    if os.path.isdir(source):
        if os.path.isfile(os.path.join(source, "config.json")):
            return read_keras3_dir(source)
        if os.path.isfile(os.path.join(source, "saved_model.pb")):
            raise ConversionError(
                f"{source}: is a TensorFlow SavedModel directory, which malinn does not read; "
                "save the model with model.save('model.keras') instead"
            )
        raise ConversionError(f"{source}: is a directory, not a Keras model file")
    try:
        with open(source, "rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise ConversionError(f"{source}: cannot open the file: {exc}") from exc
    if not head:
        raise ConversionError(f"{source}: the file is empty (0 bytes)")
    if head[:4] in _ZIP_SIGNATURES:
        return read_keras3_zip(source)
    if is_hdf5_signature(head) or _is_hdf5(source):
        return read_keras_h5(source)
    raise ConversionError(
        f"{source}: is not a Keras model file: neither a .keras zip archive nor an HDF5 file "
        f"(it starts with bytes {head!r})"
    )


def _is_hdf5(source: str) -> bool:
    """HDF5 files may start after a user block (512, 1024, ... bytes)."""
    try:
        import h5py

        return bool(h5py.is_hdf5(source))
    except Exception:
        return False
