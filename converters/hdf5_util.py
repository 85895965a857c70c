"""Functions for reading Keras's HDF5 files with h5py."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from malinn.errors import ConversionError

from .dtypes import is_bfloat16_storage, widen_bfloat16

if TYPE_CHECKING:
    from .limits import WeightBudget


def to_str(value: Any) -> str:
    """An HDF5 string attribute (``str``, ``bytes`` or ``numpy.bytes_``) as ``str``."""
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value[()]
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode("utf-8")
    if isinstance(value, str):
        return value
    raise TypeError(f"expected a string, got {type(value).__name__}")


def read_str_list(group: h5py.Group, name: str, source: str, where: str) -> list[str] | None:
    """The list attribute ``name`` of ``group``, or None when absent.

    Keras writes lists too large for one HDF5 object header (64 KiB) as ``name0``,
    ``name1``, ... (``save_attributes_to_hdf5_group``); they are joined back here.
    """
    attrs = group.attrs
    if name in attrs:
        chunks = [attrs[name]]
    elif f"{name}0" in attrs:
        chunks = []
        index = 0
        while f"{name}{index}" in attrs:
            chunks.append(attrs[f"{name}{index}"])
            index += 1
    else:
        return None
    out: list[str] = []
    for chunk in chunks:
        values = np.asarray(chunk)
        if values.ndim == 0:
            values = values.reshape(1)
        if values.size == 0:
            continue
        for value in values.ravel():
            try:
                out.append(to_str(value))
            except (TypeError, UnicodeDecodeError) as exc:
                raise ConversionError(
                    f"{source}: attribute {name!r} of {where} holds {value!r}, not names ({exc})"
                ) from exc
    return out


def refuse_external_links(f: h5py.File, source: str) -> None:
    """Refuses an HDF5 file with an external link anywhere in it: h5py would follow it into another
    file on this machine (another user's model, or a FIFO that blocks the read for good).

    Raises:
        ConversionError: naming the link's place in the file.
    """
    found: list = []

    def visit(name, info):
        if info.type == h5py.h5l.TYPE_EXTERNAL:
            found.append(name.decode(errors="replace") if isinstance(name, bytes) else str(name))
            return 1  # stops the walk
        return None

    try:
        f.id.links.visit(visit, info=True)
    except (RuntimeError, ValueError, OSError) as exc:
        raise ConversionError(f"{source}: cannot list its HDF5 links (damaged?): {exc}") from exc
    if found:
        raise ConversionError(
            f"{source}: {found[0]} is an external link into another file, which malinn does not "
            "follow (a model file holds its own data)"
        )


def read_json_attribute(obj: h5py.HLObject, name: str, source: str, limit: int) -> Any:
    """The JSON text of attribute ``name``, parsed where it is within ``limit`` bytes (a text read
    from the file is no larger than the file; parsed, a JSON text takes many times its size).

    Raises:
        ConversionError: missing, larger than ``limit`` bytes, or not JSON.
    """
    if name not in obj.attrs:
        raise ConversionError(f"{source}: has no {name!r} attribute (not a model file, or damaged)")
    try:
        text = to_str(obj.attrs[name])
    except (OSError, ValueError, TypeError, UnicodeError) as exc:
        raise ConversionError(f"{source}: cannot read its {name!r} attribute: {exc}") from None
    if len(text) > limit:
        raise ConversionError(
            f"{source}: its {name!r} attribute holds {len(text)} characters, more than malinn "
            f"reads for a model's configuration ({limit})"
        )
    try:
        return json.loads(text)
    except (ValueError, TypeError, UnicodeError, RecursionError) as exc:
        raise ConversionError(f"{source}: its {name!r} attribute is not JSON: {exc}") from None


def read_weight(
    dataset: h5py.Dataset,
    source: str,
    where: str,
    budget: WeightBudget | None = None,
    variable_dtype: str | None = None,
) -> np.ndarray:
    """A weight dataset as a C-contiguous float32 array.

    Args:
        dataset: the h5py object at the weight's path.
        source, where: the file and the weight's path, for messages.
        budget: a :class:`converters.limits.WeightBudget` that counts the dataset before it is read.
        variable_dtype: the dtype the layer's config gives its variables (``"bfloat16"`` makes a
            2-byte opaque dataset read as bfloat16, widened to float32 exactly).

    Raises:
        ConversionError: not a numeric dataset, data in another file, over the budget, unreadable.
    """
    if not isinstance(dataset, h5py.Dataset):
        raise ConversionError(f"{source}: {where} is a group, not a weight array")
    bfloat16 = is_bfloat16_storage(dataset.dtype)
    if bfloat16 and variable_dtype != "bfloat16":
        raise ConversionError(
            f"{source}: weight {where} has a 2-byte opaque type ({dataset.dtype}), which Keras "
            f"writes for bfloat16, but its layer's dtype is {variable_dtype!r}, not bfloat16"
        )
    if not bfloat16 and dataset.dtype.kind not in "fiub":
        raise ConversionError(f"{source}: weight {where} has dtype {dataset.dtype}, not a numeric array")
    if dataset.external or dataset.is_virtual:
        raise ConversionError(
            f"{source}: weight {where} keeps its data in other files (an external or virtual "
            "HDF5 dataset), which malinn does not follow"
        )
    if budget is not None:
        budget.take(dataset, where)
    try:
        data = dataset[()]
    except (OSError, ValueError, RuntimeError) as exc:
        raise ConversionError(f"{source}: cannot read weight {where}: {exc}") from exc
    if bfloat16:
        return widen_bfloat16(np.asarray(data))
    return np.ascontiguousarray(np.asarray(data, dtype=np.float32))


def is_hdf5_signature(head: bytes) -> bool:
    return head[:8] == b"\x89HDF\r\n\x1a\n"
