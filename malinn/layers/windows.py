"""Sliding-window geometry shared by convolutions and pooling: Keras's sizes, strides, paddings.

A window layer sees its input ``(batch, H, W, C)`` (2-D) or ``(batch, L, C)`` (1-D, run as
``H = 1``) through the matrix view ``C x (batch*H*W)`` (:mod:`malinn.plan.tensor`); its kernels take the
geometry as compile-time defines (``IH``, ``IW``, ``OH``, ``OW``, ``KH``, ``KW``, ``SH``, ``SW``,
``DH``, ``DW``, ``PT``, ``PL``), which :func:`window_defines` computes the way TensorFlow does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["as_tuple", "output_size", "padding_before", "window_defines", "spatial_of"]


def as_tuple(value: Any, rank: int, what: str) -> tuple:
    """``value`` (an int or a sequence of ``rank`` ints, each >= 1) as a tuple of ``rank`` ints.

    Raises:
        ValueError: anything else.
    """
    values = (value,) * rank if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else value
    try:
        values = tuple(values)
    except TypeError:
        values = ()
    if len(values) != rank or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 for v in values):
        raise ValueError(f"{what} must be a positive integer or {rank} of them, got {value!r}")
    return tuple(int(v) for v in values)


def output_size(size: int, kernel: int, stride: int, dilation: int, padding: str) -> int:
    """The output length along one axis (``padding`` ``valid``, ``same`` or ``causal``), as Keras."""
    span = (kernel - 1) * dilation + 1
    if padding in ("same", "causal"):
        return -(-size // stride)
    return max(0, (size - span) // stride + 1)


def padding_before(size: int, kernel: int, stride: int, dilation: int, padding: str) -> int:
    """Zeros TensorFlow puts before the first pixel along one axis (``same``: half the total,
    rounded down; ``causal``: the whole span; ``valid``: none)."""
    span = (kernel - 1) * dilation + 1
    if padding == "causal":
        return span - 1
    if padding == "same":
        out = -(-size // stride)
        return max((out - 1) * stride + span - size, 0) // 2
    return 0


def spatial_of(sample_shape: Sequence[int]) -> tuple:
    """``(H, W, C)`` of one sample: ``(H, W, C)`` as it is, ``(L, C)`` as ``(1, L, C)``."""
    shape = tuple(sample_shape)
    return shape if len(shape) == 3 else (1,) + shape


def window_defines(
    hw_in: Sequence[int], kernel: Sequence[int], strides: Sequence[int], dilation: Sequence[int], padding: str
) -> dict:
    """The geometry defines of a window over an ``(H, W)`` image (see the module docstring)."""
    (ih, iw), (kh, kw), (sh, sw), (dh, dw) = hw_in, kernel, strides, dilation
    return {
        "IH": ih,
        "IW": iw,
        "OH": output_size(ih, kh, sh, dh, padding),
        "OW": output_size(iw, kw, sw, dw, padding),
        "KH": kh,
        "KW": kw,
        "SH": sh,
        "SW": sw,
        "DH": dh,
        "DW": dw,
        "PT": padding_before(ih, kh, sh, dh, padding),
        "PL": padding_before(iw, kw, sw, dw, padding),
    }
