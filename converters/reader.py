"""``read_keras(path, weights=None)``: open any Keras model file (or an architecture JSON and its
weights file) and return a :class:`KerasModel`; refuse TensorFlow's own formats with advice."""

from __future__ import annotations

import glob
import os
import re
import stat
import zipfile
from typing import BinaryIO

from malinn.errors import ConversionError

from .batchnorm_variants import resolve_batchnorm_variants
from .chain import parse_model
from .dense_variants import resolve_dense_variants
from .hdf5_util import is_hdf5_signature
from .keras3_zip import file_kind, read_keras3_dir, read_keras3_zip
from .keras_h5 import read_keras_h5
from .model_spec import KerasModel
from .split_forms import read_architecture, read_split
from .validate import check_model

_ZIP_SIGNATURES = (b"PK\x03\x04", b"PK\x05\x06")
_RESAVE = (
    "re-save the Keras model with model.save('model.keras') instead (or its architecture "
    "with model.to_json() and its weights with model.save_weights('model.weights.h5'))"
)


def read_keras(path: str | os.PathLike, weights: str | os.PathLike | None = None) -> KerasModel:
    """Read a Keras model file, or an architecture JSON and its weights file, without TensorFlow.

    Accepts a Keras 3 ``.keras`` archive (or its unzipped directory), a Keras 3 legacy ``.h5``
    and a Keras 2 / tf_keras ``.h5``; the format is recognised from the file's bytes, not its
    name. With ``weights``, ``path`` is the JSON of ``model.to_json()`` and ``weights`` the file
    of ``model.save_weights()``, Keras 2 or Keras 3 (``split_forms.py``). The model is
    Sequential or Functional, of any graph shape, nested models included.

    Nothing in the file is run: custom objects (a class, registered name or module that is not
    Keras's own) are refused by name (``provenance.py``). Declared sizes are checked before
    anything is read (``limits.py``). bfloat16 weights are widened to float32, LoRA merged into
    the Dense kernel, a Keras int8-quantized Dense read as its int8 values and scales
    (``dense_variants.py``).

    Raises :class:`malinn.errors.ConversionError`, naming the file and the cause, for anything
    wrong with the file: missing, empty, not a model, truncated, no config, missing weights,
    weights that contradict the config, custom objects, declared sizes over the limits, a
    quantization Keras names but malinn does not read; an architecture JSON without weights,
    weights without an architecture, a layer on one side of the pair only; a TensorFlow
    SavedModel, checkpoint or ``.tflite`` file (with how to re-save it from Keras).
    """
    source = os.fsdecode(os.fspath(path))
    weights_source = None if weights is None else os.fsdecode(os.fspath(weights))
    try:
        if weights_source is None:
            model = _read(source)
        else:
            model = _read_pair(source, weights_source)
        resolve_dense_variants(model)
        resolve_batchnorm_variants(model)
        check_model(model)
        return model
    except ConversionError:
        raise
    except Exception as exc:  # any h5py/zipfile/json failure on a bad file
        label = source if weights_source is None else f"{source} + {weights_source}"
        raise ConversionError(f"{label}: cannot read the file ({type(exc).__name__}: {exc})") from exc


def _read(source: str) -> KerasModel:
    head = _head(source)
    if os.path.isdir(source):
        if os.path.lexists(os.path.join(source, "config.json")):  # read_keras3_dir names one that is no file
            return read_keras3_dir(source)
        raise ConversionError(f"{source}: is a directory, not a Keras model file")
    zip_file, hdf5_file = head[:4] in _ZIP_SIGNATURES, is_hdf5_signature(head) or _is_hdf5(source)
    if zip_file and hdf5_file and not is_hdf5_signature(head) and _weights_member_is_the_hdf5(source):
        hdf5_file = False  # a .keras archive whose stored weights happen to begin where HDF5 looks for a superblock
    if zip_file and hdf5_file or hdf5_file and _opens_as_zip(source):
        # read as one and loaded by Keras (malinn verify) as the other: a model malinn never saw would run
        raise ConversionError(
            f"{source}: is both a zip archive and an HDF5 file; a Keras model file is one of them (save it again)"
        )
    if zip_file:
        return read_keras3_zip(source)
    if hdf5_file:
        return read_keras_h5(source)
    if _is_json(head):
        # a clear message when it is not a Keras architecture, else: the weights are missing
        parse_model(read_architecture(source), source, where="the architecture JSON")
        raise ConversionError(
            f"{source}: is a model architecture (JSON) without weights; give the weights file "
            "(model.save_weights) with it: malinn convert MODEL.json --weights WEIGHTS.h5, or "
            "malinn.load_model('MODEL.json', weights='WEIGHTS.h5')"
        )
    raise ConversionError(
        f"{source}: is not a Keras model file: neither a .keras zip archive nor an HDF5 file "
        f"(it starts with bytes {head[:8]!r})"
    )


def _read_pair(architecture: str, weights: str) -> KerasModel:
    head = _head(architecture)
    _head(weights)
    if os.path.isdir(architecture) or not _is_json(head):
        what = (
            "a directory"
            if os.path.isdir(architecture)
            else "JSON, but not an object"
            if _is_json_value(head)
            else "not a JSON file"
        )
        raise ConversionError(
            f"{architecture}: is {what}; with weights ({weights}) the model must be the "
            "architecture JSON of model.to_json() (a whole .keras or .h5 model is given alone)"
        )
    if os.path.isdir(weights):
        raise ConversionError(f"{weights}: is a directory, not a weights file (model.save_weights)")
    return read_split(architecture, weights)


def _head(source: str) -> bytes:
    """The first bytes of ``source`` (b"" for a directory), after refusing what is not Keras's.

    Raises:
        ConversionError: missing, empty, a TensorFlow SavedModel, checkpoint or TFLite file.
    """
    if not os.path.exists(source):
        if os.path.isfile(source + ".index"):
            raise ConversionError(
                f"{source}: is a TensorFlow checkpoint ({source}.index, "
                f"{source}.data-...), which malinn does not read; {_RESAVE}"
            )
        raise ConversionError(f"{source}: no such file")
    if os.path.isdir(source):
        if os.path.isfile(os.path.join(source, "saved_model.pb")):
            raise ConversionError(
                f"{source}: is a TensorFlow SavedModel directory, which malinn does not read; {_RESAVE}"
            )
        return b""
    name = os.path.basename(source)
    if name == "saved_model.pb":
        raise ConversionError(
            f"{source}: is the graph of a TensorFlow SavedModel, which malinn does not read; {_RESAVE}"
        )
    if re.fullmatch(r".+\.data-\d+-of-\d+", name) or (
        name.endswith(".index") and glob.glob(glob.escape(source[: -len(".index")]) + ".data-*")
    ):
        raise ConversionError(f"{source}: is part of a TensorFlow checkpoint, which malinn does not read; {_RESAVE}")
    if not stat.S_ISREG(os.stat(source).st_mode):  # a FIFO would block open() for good, a device read forever
        raise ConversionError(f"{source}: is {file_kind(source)}, not a regular file; give the model file")
    try:
        with open(source, "rb") as fh:
            head = fh.read(16)
    except OSError as exc:
        raise ConversionError(f"{source}: cannot open the file: {exc}") from exc
    if not head:
        raise ConversionError(f"{source}: the file is empty (0 bytes)")
    if head[4:8] == b"TFL3":
        raise ConversionError(f"{source}: is a TensorFlow Lite model (.tflite), which malinn does not read; {_RESAVE}")
    return head


def _json_start(head: bytes) -> bytes:
    """The first character of a file that starts with ``head``, past a BOM and white space."""
    return head.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")[:1]


def _is_json(head: bytes) -> bool:
    """Whether a file that starts with ``head`` holds a JSON object."""
    return _json_start(head) == b"{"


def _is_json_value(head: bytes) -> bool:
    """Whether a file that starts with ``head`` looks like JSON of another kind (an array, a string)."""
    return _json_start(head) in (b"[", b'"')


def _opens_as_zip(source: str) -> bool:
    """Whether a zip archive with members ends ``source`` (its central directory read whole: four bytes
    of weights that happen to spell a zip's end record are not one)."""
    try:
        with zipfile.ZipFile(source) as archive:
            return bool(archive.namelist())
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError):
        return False


def _weights_member_is_the_hdf5(source: str) -> bool:
    """Whether the HDF5 file that ``source`` also reads as is exactly its stored ``model.weights.h5``
    member: Keras stores that member uncompressed, and where its data begins at a multiple of 512
    bytes HDF5 takes the archive before it for a user block. Such a file is a .keras archive and
    nothing else (its HDF5 view is the weights, with no model in them)."""
    try:
        with zipfile.ZipFile(source) as archive:
            info = archive.getinfo("model.weights.h5")
            if info.compress_type != zipfile.ZIP_STORED:
                return False
        with open(source, "rb") as f:
            f.seek(info.header_offset)
            local = f.read(30)
            if len(local) != 30 or local[:4] != b"PK\x03\x04":
                return False
            start = (
                info.header_offset
                + 30
                + int.from_bytes(local[26:28], "little")
                + int.from_bytes(local[28:30], "little")
            )
            f.seek(start)
            return is_hdf5_signature(f.read(8)) and start % 512 == 0 and not _hdf5_before(f, start)
    except (KeyError, zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError):
        return False


def _hdf5_before(f: BinaryIO, end: int) -> bool:
    """Whether an HDF5 superblock starts at 0, 512, 1024, 2048... before ``end`` (where HDF5 looks first)."""
    offset = 0
    while offset < end:
        f.seek(offset)
        if is_hdf5_signature(f.read(8)):
            return True
        offset = 512 if offset == 0 else 2 * offset
    return False


def _is_hdf5(source: str) -> bool:
    """HDF5 files may start after a user block (512, 1024, ... bytes)."""
    try:
        import h5py

        return bool(h5py.is_hdf5(source))
    except Exception:
        return False
