"""Reading the input arrays a user hands to the command line: ``.npy``, ``.npz`` and ``.csv`` files.

Every file is checked before its data is read: the ``.npy`` header (format, a numeric dtype, the
declared size against the bytes the file really has), the ``.npz`` members, the ``.csv`` rows.
Pickled objects are never loaded. Each problem becomes one :class:`~malinn.errors.MalinnError`
that names the file and what is wrong with it.
"""

from __future__ import annotations

import math
import os
import stat
import zipfile
from pathlib import Path
from typing import IO

import numpy as np

from ..errors import MalinnError

__all__ = ["read_input_array", "SUFFIXES"]

#: The file kinds accepted as input arrays.
SUFFIXES = (".npy", ".npz", ".csv")

_NUMERIC_KINDS = "biuf"  # bool, signed, unsigned, float


def read_input_array(
    path: str | os.PathLike, key: str | None = None, sample_shape: tuple[int, ...] | None = None
) -> np.ndarray:
    """Reads a batch of input samples from a ``.npy``, ``.npz`` or ``.csv`` file.

    Args:
        path: the file. ``.npy``: one array. ``.npz``: the array named ``key``, or its only array.
            ``.csv``: numbers separated by commas, one sample per row, an optional header row
            (skipped when it is not numeric).
        key: for a ``.npz``, the name of the array to use.
        sample_shape: the model's input shape without the batch axis; a ``.csv``'s rows are
            reshaped to it.

    Returns:
        A float32 array of shape ``(samples, ...)``.

    Raises:
        MalinnError: the file is missing, of another kind, empty, truncated, damaged, not numeric,
            holds no samples, or (``.npz``) ``key`` is missing or needed.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise MalinnError(f"{path} is not an input array file: expected .npy, .npz or .csv")
    if key is not None and suffix != ".npz":
        raise MalinnError(f"{path}: --key chooses an array in a .npz file; a {suffix} file holds one")
    if not path.exists():
        raise MalinnError(f"{path}: no such file")
    if path.is_dir():
        raise MalinnError(f"{path} is a folder, not an input array file")
    try:
        if suffix == ".npy":
            with open(path, "rb") as f:
                array = _read_npy(f, os.fstat(f.fileno()).st_size if _is_regular(f) else None, str(path))
        elif suffix == ".npz":
            array = _read_npz(path, key)
        else:
            array = _read_csv(path, sample_shape)
    except OSError as exc:
        raise MalinnError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if array.ndim == 0:
        raise MalinnError(f"{path}: holds a single number; expected an array of samples (batch, ...)")
    if array.shape[0] == 0:
        raise MalinnError(f"{path}: holds no samples (shape {array.shape})")
    return array.astype(np.float32, copy=False)


def _is_regular(f: IO[bytes]) -> bool:
    return stat.S_ISREG(os.fstat(f.fileno()).st_mode)


def _read_npy(f: IO[bytes], size: int | None, name: str) -> np.ndarray:
    """Reads one .npy stream after checking its header; ``size``: the stream's length if known."""
    fmt = np.lib.format
    magic = f.read(6)
    if not magic:
        raise MalinnError(f"{name} is empty")
    if magic != b"\x93NUMPY":
        raise MalinnError(f"{name} is not a .npy file (it does not start with numpy's .npy header)")
    version = tuple(f.read(2))
    readers = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}
    if version not in readers:
        raise MalinnError(
            f"{name}: .npy format version {'.'.join(map(str, version)) or '(missing)'} "
            "is not read here (1.0 and 2.0 are; 3.0 only stores records, not numbers)"
        )
    try:
        shape, fortran, dtype = readers[version](f)
    except (ValueError, SyntaxError, EOFError, OSError, TypeError) as exc:
        raise MalinnError(f"{name}: damaged .npy header ({_first_line(exc)})") from None
    if dtype.hasobject or dtype.kind not in _NUMERIC_KINDS or dtype.fields is not None:
        raise MalinnError(f"{name}: holds {_describe(dtype)}, not numbers")
    if any(d < 0 for d in shape):
        raise MalinnError(f"{name}: damaged .npy header (shape {shape} has a negative size)")
    count = math.prod(shape)  # Python's integers: numpy's int64 product wrapped to 0 for (2**32, 2**32)
    nbytes = count * dtype.itemsize
    offset = f.tell()
    if nbytes > 1 << 62:  # more than any file holds (and than a read can be asked for)
        raise MalinnError(f"{name}: damaged .npy header (shape {shape} of {dtype}: {nbytes} bytes of data)")
    if size is not None and size - offset < nbytes:
        raise MalinnError(
            f"{name}: truncated: the header declares shape {shape} of {dtype} ({nbytes} bytes of data), "
            f"the file has {max(0, size - offset)}"
        )
    data = f.read(nbytes)
    if len(data) < nbytes:
        raise MalinnError(
            f"{name}: truncated: the header declares shape {shape} of {dtype} ({nbytes} bytes of data), "
            f"the file has {len(data)}"
        )
    array = np.frombuffer(data, dtype=dtype, count=count)
    return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)


def _read_npz(path: Path, key: str | None) -> np.ndarray:
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise MalinnError(
            f"{path} is not a .npz file (not a zip archive)" if path.stat().st_size else f"{path} is empty"
        ) from None
    with archive:
        members = {info.filename[:-4]: info for info in archive.infolist() if info.filename.endswith(".npy")}
        names = ", ".join(sorted(members)) or "none"
        if key is None:
            if not members:
                raise MalinnError(f"{path} holds no arrays")
            if len(members) > 1:
                raise MalinnError(f"{path} holds {len(members)} arrays ({names}); choose one with --key NAME")
            key = next(iter(members))
        elif key not in members:
            raise MalinnError(f"{path} has no array {key!r}; it holds: {names}")
        info = members[key]
        try:
            with archive.open(info) as f:
                return _read_npy(f, info.file_size, f"{path}[{key}]")
        except (zipfile.BadZipFile, EOFError, ValueError) as exc:  # CRC errors, a damaged stream
            raise MalinnError(f"{path}[{key}]: damaged member ({_first_line(exc)})") from None


def _read_csv(path: Path, sample_shape: tuple[int, ...] | None) -> np.ndarray:
    raw = path.read_bytes()
    if not raw.strip():
        raise MalinnError(f"{path} is empty")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise MalinnError(f"{path} is not a text file (not UTF-8): expected comma-separated numbers") from None
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    for number, line in lines[:2]:  # numbers separated otherwise would read as a header, then a bad row
        separator = _other_separator(line)
        if separator is not None:
            raise MalinnError(
                f"{path}: line {number} holds numbers separated by {separator}; malinn reads "
                f"comma-separated values (one sample per row)"
            )
    if lines and not any(_is_number(cell) for cell in lines[0][1].split(",")):
        lines = lines[1:]  # a header row: no cell of it a number (a row with some numbers is data)
    if not lines:
        raise MalinnError(
            f"{path}: holds a header but no rows of numbers (the values must be plain numbers "
            "separated by commas, one sample per row: no quotes, no other separator)"
        )
    width = lines[0][1].count(",") + 1
    for number, line in lines:
        if line.count(",") + 1 != width:
            count = line.count(",") + 1
            raise MalinnError(
                f"{path}: line {number} has {count} value{'s' * (count != 1)}, line {lines[0][0]} has {width}"
            )
    try:  # cell by cell: a fixed-width string array of every cell was as wide as the longest one
        values: np.ndarray = np.array(
            [float(cell) for _, line in lines for cell in line.split(",")], np.float32
        ).reshape(len(lines), width)
    except ValueError:
        number, line = next((n, line) for n, line in lines if not _numeric_row(line))
        bad = next(cell for cell in line.split(",") if not _is_number(cell))
        raise MalinnError(f"{path}: line {number}: {bad.strip()[:40]!r} is not a number") from None
    if sample_shape is not None:
        sample_shape = tuple(int(d) for d in sample_shape)
        if int(np.prod(sample_shape)) != width:
            raise MalinnError(
                f"{path}: rows of {width} values do not fit the model's input shape "
                f"{sample_shape} ({int(np.prod(sample_shape))} values per sample)"
            )
        values = values.reshape((len(lines),) + sample_shape)
    return values


def _other_separator(line: str) -> str | None:
    """The name of the separator other than a comma (semicolon, tab, spaces) that splits ``line``
    into two or more numbers where commas do not, or None."""
    if "," in line:
        return None
    for separator, name in ((";", "semicolons"), ("\t", "tabs"), (None, "spaces")):
        cells = line.split(separator)
        if len(cells) > 1 and all(_is_number(cell) for cell in cells if cell.strip() or separator is None):
            return name
    return None


def _numeric_row(line: str) -> bool:
    return all(_is_number(cell) for cell in line.split(","))


def _is_number(cell: str) -> bool:
    try:
        float(cell)
        return True
    except ValueError:
        return False


def _describe(dtype: np.dtype) -> str:
    if dtype.hasobject:
        return "Python objects (dtype object)"
    if dtype.fields is not None:
        return f"records with fields {', '.join(dtype.names or ())}"
    names = {"U": "text", "S": "bytes", "c": "complex numbers", "M": "dates", "m": "time spans", "V": "raw bytes"}
    return f"{names.get(dtype.kind, 'values')} (dtype {dtype})"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
