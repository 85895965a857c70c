"""The dtypes a model's input may have, and the cast Keras applies to an input at the model's entry.

``keras.Input((4,), dtype="int32")`` makes Keras cast what predict is given to int32 before the
first layer, whose float32 computation then reads the cast values: 300.2 becomes 300 (toward
zero), -1.6 becomes 255 as uint8 (wrapped), anything not 0 becomes 1 as bool, a float16 input is
rounded to half. malinn computes in float32 and casts on the host, in predict's input conversion:
the cast is chosen once, when the model's input is made (:func:`input_cast`), and each call only
applies it. A float array is taken as float32 first, as Keras's predict takes it (a float64
2.9999999999 becomes 3.0, then 3). Values a type cannot hold (NaN, 1e10 as int32) convert as C's
conversion does on the host machine, as TensorFlow's cast does there too (on x86: NaN and values
beyond int32 become -2^31, a narrower type keeps the low bits, 300 -> 44 as int8; NumPy and
TensorFlow differ there only for uint32 and uint64 out of their range).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["INPUT_DTYPES", "input_cast", "input_dtype"]

#: the dtypes an input may have, by Keras's names; float32 and float64 need no cast (the values
#: as float32 are what the first layer reads)
INPUT_DTYPES = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
)
_NO_CAST = ("float32", "float64")


def input_dtype(dtype: Any, what: str = "Input") -> str:
    """The name of an input's dtype, as Keras writes it.

    Args:
        dtype: a name of :data:`INPUT_DTYPES`, a numpy dtype or scalar type (``np.int32``,
            ``bool``), or None (float32, Keras's default).
        what: what has the dtype, for the message (``"Input 'pixels'"``).

    Returns:
        One of :data:`INPUT_DTYPES`.

    Raises:
        ValueError: a dtype malinn cannot cast an input to (a string, a complex number, an unknown
            name), naming ``what``, the dtype and the supported ones.
    """
    if dtype is None:
        return "float32"
    name = dtype if isinstance(dtype, str) else None
    if isinstance(dtype, (type, np.dtype)):  # np.int32, bool, np.dtype("uint8")
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = None
    if name not in INPUT_DTYPES:
        raise ValueError(
            f"{what}: dtype {dtype!r} is not supported; an input may be one of "
            f"{', '.join(INPUT_DTYPES)} (Keras casts the input to it at the model's entry)"
        )
    return name


def input_cast(dtype: str) -> Callable[[np.ndarray], np.ndarray] | None:
    """The cast an input of ``dtype`` (a name of :data:`INPUT_DTYPES`) makes: a function from the
    array predict is given to the float32 values the first layer reads, or None where there is
    nothing to do (float32, float64)."""
    dtype = input_dtype(dtype)
    if dtype in _NO_CAST:
        return None
    if dtype == "bfloat16":
        return _as_float32_first(_round_to_bfloat16)
    target = np.dtype(dtype)

    def cast(x: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", over="ignore"):  # NaN, 1e10 as int32: C's conversion, as TensorFlow's
            return x.astype(target).astype(np.float32)

    return _as_float32_first(cast)


def _as_float32_first(cast: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    def first(x: np.ndarray) -> np.ndarray:
        if x.dtype.kind == "f" and x.dtype != np.float32:
            x = x.astype(np.float32)
        return cast(x)

    return first


def _round_to_bfloat16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (the upper 16 bits), to nearest with ties to even, as
    TensorFlow's cast; NaN stays NaN. Integers are taken as float32 first."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, rounded)
