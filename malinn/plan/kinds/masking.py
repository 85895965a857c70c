"""Keras's Masking test as a step: whether each position of a tensor holds anything but a mask
value along its last axis (kernels/masking.cl), 1.0 (kept) or 0.0 (masked)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...choice.kernel_choice import choose
from ..tensor import format_shape
from ..tensors import Value
from .base import OpKind, register

if TYPE_CHECKING:
    from ..recorder import Recorder

__all__ = ["MASKING", "any_not_equal"]


class Masking(OpKind):
    """Reads ``a``, writes a new result of one element per position of ``a``'s other axes."""

    name = "masking"
    shape_generic = True


MASKING = register(Masking())


def any_not_equal(
    builder: Recorder, x: Value, mask_value: float, shape: tuple | None = None, what: str = "masking"
) -> Value:
    """``any(x != mask_value, axis=-1)`` as 1.0 / 0.0: Keras's Masking's mask (NaN differs from
    everything). The result has ``shape`` (default: ``x``'s shape with the last axis of size 1, the
    ``keepdims`` form), which must hold one element per position of ``x``'s other axes."""
    shape = tuple(shape) if shape is not None else tuple(x.shape[:-1]) + (1,)
    if len(x.shape) < 2 or math.prod(shape) != math.prod(x.shape[:-1]):
        raise ValueError(f"{what}: cannot write the mask of {format_shape(x.shape)} as {format_shape(shape)}")
    spec = choose("masking", builder.device)
    return builder.record(MASKING, spec, shape, {"a": x}, what, params={"mask_value": float(mask_value)})
