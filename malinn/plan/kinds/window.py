"""Steps that read a window of their input for each result element into a new tensor: pooling
(kernels/pool.cl), the spatial layers (padding, cropping, upsampling: kernels/spatial.cl) and a
convolution's ``im2col`` patch matrix."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...choice.kernel_choice import choose
from ..tensors import Value
from .base import OpKind, register

if TYPE_CHECKING:
    from ..recorder import Recorder

__all__ = ["POOL", "SPATIAL", "IM2COL", "pool", "spatial"]


class Window(OpKind):
    """Reads operand ``a``, writes a new result (its kernel's restrictions on both)."""


class Pool(Window):
    name = "pool"


class Spatial(Window):
    name = "spatial"


class Im2col(Window):
    name = "im2col"


POOL, SPATIAL, IM2COL = (register(kind()) for kind in (Pool, Spatial, Im2col))


def _window_step(builder: Recorder, kind: OpKind, x: Value, defines: dict, out_shape: tuple, what: str) -> Value:
    # the first of the explicit choice and the library's defaults for the device that the layer's
    # geometry configures: a global pooling's kernels (kernels/global_pool.cl) refuse other windows
    spec = choose(kind.name, builder.device, defines=defines)
    return builder.record(kind, spec, (builder.batch,) + tuple(out_shape[1:]), {"a": x}, what)


def pool(builder: Recorder, x: Value, defines: dict, out_shape: tuple, what: str = "pool") -> Value:
    """A pooling of ``x`` (kernels/pool.cl; a global one on a GPU kernels/global_pool.cl) configured with
    ``defines`` (the window and ``MAXPOOL``)."""
    return _window_step(builder, POOL, x, defines, out_shape, what)


def spatial(builder: Recorder, x: Value, defines: dict, out_shape: tuple, what: str = "spatial") -> Value:
    """Padding, cropping or upsampling of ``x`` (kernels/spatial.cl) configured with ``defines``."""
    return _window_step(builder, SPATIAL, x, defines, out_shape, what)
