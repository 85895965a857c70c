"""Tensors: Keras's logical shape (batch first) and the matrix a kernel sees.

A Keras array of shape ``(batch, d1, ..., dk)`` is, in memory (row-major), the matrix
``x^T`` of ``dk`` rows and ``batch * d1 * ... * d(k-1)`` columns in column-major order: element
``(row, col)`` is flat index ``col * dk + row``. malinn keeps every tensor on the device as that
matrix view (the thesis's "features x batch" orientation, with the last axis as features), in a
layout and padding its kernels declare. So a Dense layer is ``R = W x I`` on any rank (Keras
applies it to the last axis), element-wise layers and a last-axis softmax or BatchNormalization
work column by column, and a reshape keeps the flat order and changes only the view.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from ..library.layout import Layout, parse_layout

__all__ = ["matrix_view", "keras_order", "format_shape"]


def matrix_view(shape: Iterable[int]) -> tuple[int, int]:
    """``(rows, cols)`` of the matrix view of a tensor of Keras ``shape`` (batch first)."""
    shape = tuple(int(d) for d in shape)
    return shape[-1], math.prod(shape[:-1])


def keras_order(layout: "Layout | str", rows: int, cols: int, padded: Sequence[int]) -> bool:
    """Whether a buffer in ``layout`` with ``padded`` shape holds the logical ``rows x cols``
    matrix view in Keras's memory order: each column's values contiguous, in order, the columns
    as many floats apart as the rows are padded to (a plan stages it whole, padding included, so
    it is uploaded and downloaded with one plain copy)."""
    layout = parse_layout(layout)
    if str(layout) == "C":
        return True
    if str(layout) == "R":
        return padded[1] == 1 and cols == 1
    return False


def format_shape(shape: Iterable[Any]) -> str:
    """``(None, 28, 28)`` for Keras-style messages and summaries (``None`` for the batch axis)."""
    dims = ["None"] + [str(int(d)) for d in tuple(shape)[1:]]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
