"""The kernel library's ``precisions`` table: how a kernel's weights are stored and summed, read and checked."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import LibraryError

__all__ = ["DEFAULT_PRECISION", "WEIGHT_OPS", "WEIGHTS_HEADER", "Precision", "parse_precisions"]

#: the precision every kernel supports and every model runs in unless asked otherwise
DEFAULT_PRECISION = "fp32"
#: the ops whose kernels read a layer's weights, and so may read them in a reduced precision
WEIGHT_OPS = ("matmul", "matmul_head", "conv", "depthwise", "conv_transpose", "conv3d", "conv3d_transpose")
#: the header that reads weights in each precision (LOAD_W): a kernel listing a reduced one includes it
WEIGHTS_HEADER = "weights.clh"


@dataclass(frozen=True)
class Precision:
    """One entry of the library's ``precisions`` table: how a matmul's weights are stored and summed."""

    name: str
    description: str
    weight_bytes: int  # bytes per stored weight: 4, 2 or 1
    defines: tuple  # (("WEIGHT_BITS", "16"), ...) that switch a kernel to it
    extension: str | None = None  # the device extension it needs (cl_khr_fp16), or None
    row_scales: bool = False  # int8: one float scale per row of A follows the values

    def weights_nbytes(self, rows: int, cols: int, scales: int) -> int:
        """Bytes of a ``rows x cols`` weight buffer in this precision with ``scales`` row scales."""
        values = self.weight_bytes * rows * cols
        return (-(-values // 4) * 4 + 4 * scales) if self.row_scales else values


def parse_precisions(path: Path, table: Any) -> dict:
    """The ``precisions`` table as :class:`Precision` objects (``fp32`` alone where there is none)."""
    if table is None:
        table = {DEFAULT_PRECISION: {"description": "float", "weight_bytes": 4, "defines": {}}}
    if not isinstance(table, dict) or DEFAULT_PRECISION not in table:
        raise LibraryError(
            f"{path}: field 'precisions': expected an object of name: precision, with {DEFAULT_PRECISION!r}"
        )
    found = {}
    for name, entry in table.items():
        field = f"{path}: field 'precisions.{name}'"
        if not isinstance(entry, dict):
            raise LibraryError(f"{field}: expected an object")
        defines = entry.get("defines", {})
        if not isinstance(defines, dict) or not all(
            re.fullmatch(r"[A-Za-z_]\w*", str(k)) and re.fullmatch(r"[\w.+-]+", str(v)) for k, v in defines.items()
        ):
            raise LibraryError(f"{field}.defines: expected an object of NAME: simple value")
        if entry.get("weight_bytes") not in (1, 2, 4):
            raise LibraryError(f"{field}.weight_bytes: expected 1, 2 or 4, got {entry.get('weight_bytes')!r}")
        extension = entry.get("extension")
        if extension is not None and not isinstance(extension, str):
            raise LibraryError(f"{field}.extension: expected an extension name")
        found[name] = Precision(
            name,
            str(entry.get("description", "")),
            entry["weight_bytes"],
            tuple((str(k), str(v)) for k, v in defines.items()),
            extension,
            bool(entry.get("row_scales", False)),
        )
    return found
