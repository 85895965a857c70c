"""Weights in a reduced precision: what each precision stores, and the float32 matrix it stands for.

The precisions are the kernel library's ``precisions`` table (``fp32``, ``fp16-storage``, ``fp16``,
``int8-weights``; docs/KERNELS.md). A weight matrix ``W`` (units x inputs, a Dense layer's
``kernel^T``) is stored as:

* ``fp32``: float32;
* ``fp16-storage`` and ``fp16``: float16 (round to nearest even, as ``vstore_half`` does);
* ``int8-weights``: per row (output channel) symmetric int8, ``W[i, :] ~ q[i, :] * scale[i]`` with
  ``scale[i] = max|W[i, :]| / 127`` (1 for an all-zero row) and ``q = round(W / scale)`` in
  ``[-127, 127]``; the device buffer holds the laid-out values, then, at the next multiple of 4
  bytes, the float32 scales of the logical rows (``kernels/weights.clh``).

:func:`effective` gives the float32 matrix a kernel multiplies by in a precision (the numpy
reference of the tests and of ``malinn verify``'s explanation); :func:`device_bytes` the bytes a
kernel reads.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from ..errors import LayoutError
from .kernel_library import DEFAULT_PRECISION, load_library
from .layout import Layout

__all__ = ["check_precision", "quantize_int8", "effective", "rounded", "flushed", "device_bytes", "DEFAULT_PRECISION"]


def check_precision(precision: object) -> str:
    """``precision`` if the kernel library knows it (``None`` is ``fp32``).

    Raises:
        ValueError: an unknown name; the message lists the known ones.
    """
    if precision is None:
        return DEFAULT_PRECISION
    return load_library().precision(str(precision)).name


def quantize_int8(w: ArrayLike, what: str = "the weights") -> tuple:
    """Per-row symmetric int8 quantization of ``w`` (rows = output channels).

    Args:
        w: the weights (rows x cols).
        what: who holds them, for the error (``layer 'dense'``).

    Returns:
        ``(q, scales)``: an int8 array of ``w``'s shape and one float32 scale per row, with
        ``w[i, j] ~ q[i, j] * scales[i]``.

    Raises:
        ValueError: ``w`` holds a NaN or an infinity, which no scale represents.
    """
    w = np.asarray(w, np.float32)
    bad = int(np.count_nonzero(~np.isfinite(w)))
    if bad:
        raise ValueError(
            f"{what}: {bad} of its weights are NaN or infinite; int8-weights cannot scale them "
            "(keep this model in fp32)"
        )
    top = np.max(np.abs(w), axis=1) if w.shape[1] else np.zeros(w.shape[0], np.float32)
    # at least the smallest float32: a row of tiny values (below ~2e-43) must not get a scale of 0
    scales = np.where(
        top > 0, np.maximum(top.astype(np.float64) / 127.0, np.finfo(np.float32).smallest_subnormal), 1.0
    ).astype(np.float32)
    q = np.clip(np.rint(w.astype(np.float64) / scales[:, None]), -127, 127).astype(np.int8)
    return q, scales


def effective(w: ArrayLike | None, precision: str, quantized: tuple | None = None) -> np.ndarray:
    """The float32 matrix a kernel multiplies by when ``w`` is stored in ``precision``.

    Args:
        w: the weights (rows x cols); None where ``quantized`` is given for ``int8-weights``.
        precision: a precision name.
        quantized: ``(q, scales)`` to use for ``int8-weights`` instead of quantizing ``w``.
    """
    w = np.asarray(w, np.float32)
    if load_library().precision(precision).weight_bytes == 2:
        return w.astype(np.float16).astype(np.float32)
    if precision == "int8-weights":
        q, scales = quantized if quantized is not None else quantize_int8(w)
        return (q.astype(np.float32) * scales[:, None]).astype(np.float32)
    return w


def rounded(w: ArrayLike, precision: str, what: str = "the weights") -> np.ndarray:
    """``w`` as ``precision`` keeps it, in float32 (:func:`effective`), refused where the precision
    cannot hold it (as :func:`device_bytes` refuses it): what a model file in ``precision`` stores
    of weights that the plan lowers to the precision itself (a convolution's).

    Args:
        w: the weights (rows = output channels, x cols).
        what: who holds them, for the errors (``layer 'conv2d' kernel``).

    Raises:
        ValueError: a finite weight beyond float16's range in a half precision; a NaN or infinite
            weight in int8-weights. The message names ``what``.
    """
    spec = load_library().precision(precision)
    w = np.asarray(w, np.float32)
    if spec.row_scales:
        return effective(w, precision, quantize_int8(w, what))
    if spec.weight_bytes == 2:
        return _half(w, precision, what).astype(np.float32)
    return w


def flushed(w: ArrayLike, precision: str) -> int:
    """How many non-zero weights of ``w`` ``precision`` stores as 0: in a half precision those below
    float16's smallest (about 6e-8); none in the others (int8's rounding to 0 is its scale's step)."""
    if load_library().precision(precision).weight_bytes != 2:
        return 0
    w = np.asarray(w, np.float32)
    return int(np.count_nonzero((w != 0) & (w.astype(np.float16) == 0)))


def _half(values: np.ndarray, precision: str, what: str) -> np.ndarray:
    """``values`` (float32) as float16, refusing a finite value that would become an infinity."""
    with np.errstate(over="ignore"):
        half = values.astype(np.float16)
    lost = np.isinf(half) & np.isfinite(values)
    if lost.any():
        raise ValueError(
            f"{what}: {int(lost.sum())} of its weights are beyond float16's range (the largest, "
            f"{float(np.max(np.abs(values[lost]))):.6g}, against 65504) and would be stored as "
            f"infinities in {precision}; keep this model in fp32, or use int8-weights (scaled "
            "per unit)"
        )
    return half


def device_bytes(
    w: ArrayLike,
    precision: str,
    layout: Layout,
    padded: tuple[int, int],
    quantized: tuple | None = None,
    what: str = "the weights",
) -> np.ndarray:
    """``w`` laid out in ``layout`` and ``padded`` as a kernel in ``precision`` reads it.

    Args:
        what: who holds the weights, for the errors (``layer 'dense'``).

    Returns:
        A flat array to upload as it is: float32, float16, or (int8) uint8 bytes holding the
        values and then, at the next multiple of 4 bytes, the float32 row scales.

    Raises:
        LayoutError: ``w`` does not fit ``padded``.
        ValueError: a finite weight beyond float16's range (it would be stored as an infinity) in a
            half precision; a NaN or infinite weight in int8-weights. The message names ``what``.
    """
    spec = load_library().precision(precision)
    if spec.row_scales:
        q, scales = quantized if quantized is not None else quantize_int8(w, what)
        values = layout.pack(q.astype(np.float32), padded).astype(np.int8)
        out = np.zeros(spec.weights_nbytes(padded[0], padded[1], len(scales)), np.uint8)
        out[: values.size] = values.view(np.uint8)
        start = -(-values.size // 4) * 4
        out[start:] = np.ascontiguousarray(scales, np.float32).view(np.uint8)
        return out
    flat = layout.pack(np.asarray(w, np.float32), padded)
    if spec.weight_bytes == 2:
        return _half(flat, precision, what)
    if spec.weight_bytes != 4:
        raise LayoutError(f"precision {precision!r}: no packing for {spec.weight_bytes}-byte weights")
    return flat
