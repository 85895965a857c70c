"""Keras's axis arguments and per-element parameters, as the layers that take them need them.

``resolve_axes`` turns an ``axis`` argument (an int or a list, negative counting from the end, the
batch axis being 0) into sorted positive axes; ``trailing_vector`` turns parameters that broadcast
against a sample (a PReLU's alpha, a Normalization's mean) into the vector and period the
``broadcast`` kernel reads (:func:`malinn.plan.kinds.normalization.broadcast`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["resolve_axes", "axis_argument", "trailing_vector", "broadcast_shape"]


def axis_argument(axis: Any, who: str) -> int | tuple:
    """``axis`` checked to be an int or a non-empty list/tuple of ints; returned as an int or a tuple.

    Raises:
        ValueError: anything else.
    """
    items = list(axis) if isinstance(axis, (list, tuple)) else [axis]
    if not items or any(isinstance(a, bool) or not isinstance(a, (int, np.integer)) for a in items):
        raise ValueError(f"{who}: axis must be an integer or a list of integers, got {axis!r}")
    items = [int(a) for a in items]
    return tuple(items) if isinstance(axis, (list, tuple)) else items[0]


def resolve_axes(axis: int | tuple | list, rank: int, who: str) -> tuple:
    """The sorted positive axes ``axis`` names in inputs of ``rank`` axes (the batch axis included).

    Raises:
        ValueError: an axis is out of range, repeated, or the batch axis.
    """
    items = list(axis) if isinstance(axis, (list, tuple)) else [axis]
    resolved = [a + rank if a < 0 else a for a in items]
    if any(not 0 <= a < rank for a in resolved) or len(set(resolved)) < len(resolved):
        raise ValueError(f"{who}: axis {axis!r} is out of range for inputs of rank {rank}")
    if 0 in resolved:
        raise ValueError(f"{who}: axis {axis!r} is the batch axis; malinn normalizes within each sample")
    return tuple(sorted(resolved))


def broadcast_shape(sample: tuple, axes: tuple) -> tuple:
    """The sample's shape with every axis not in ``axes`` (1-based, as :func:`resolve_axes` gives)
    set to 1: how Keras broadcasts per-axis parameters."""
    return tuple(d if i + 1 in axes else 1 for i, d in enumerate(sample))


def trailing_vector(values: Any, sample: tuple, who: str) -> tuple:
    """``values`` (broadcastable to ``sample``, right-aligned as numpy does) as the vector of their
    values over the sample's trailing axes from the first one they vary along, row-major, and the
    number of matrix-view columns that vector spans.

    Returns:
        ``(vector float32, period_cols)``: element ``(row, col)`` of the tensor's matrix view takes
        ``vector[(col % period_cols) * sample[-1] + row]``.

    Raises:
        ValueError: ``values`` does not broadcast to ``sample``.
    """
    values = np.asarray(values, np.float64)
    if values.ndim > len(sample):
        values = (
            values.reshape(values.shape[values.ndim - len(sample) :])
            if math.prod(values.shape[: values.ndim - len(sample)]) == 1
            else values
        )
    padded = (1,) * (len(sample) - values.ndim) + values.shape
    if len(padded) != len(sample) or any(p not in (1, d) for p, d in zip(padded, sample)):
        raise ValueError(f"{who}: parameters of shape {values.shape} do not broadcast to samples of shape {sample}")
    values = values.reshape(padded)
    varying = [i for i, p in enumerate(padded) if p != 1]
    first = min(varying[0] if varying else len(sample) - 1, len(sample) - 1)
    vector = np.broadcast_to(values[(0,) * first], sample[first:]).reshape(-1)
    return np.ascontiguousarray(vector, np.float32), math.prod(sample[first:-1])
