"""Steps that move values without arithmetic: a re-layout between the kernels' layouts, a Reshape
(often a free view: :mod:`malinn.plan.passes.views`), a Permute, a RepeatVector."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...choice.kernel_choice import choose
from ...library.layout import Layout
from ..tensor import format_shape, matrix_view
from ..tensors import Step, Storage, Value
from .base import OpKind, register

if TYPE_CHECKING:
    from ...backends.base import Device
    from ..recorder import Recorder

__all__ = ["RELAYOUT", "RESHAPE", "PERMUTE", "REPEAT", "relayout_step", "reshape", "permute", "repeat"]


class Move(OpKind):
    """Reads operand ``a``, writes a new result (its kernel's restrictions on both)."""


class Relayout(Move):
    name = "relayout"


class Reshape(Move):
    name = "reshape"


class Permute(Move):
    name = "permute"


class Repeat(Move):
    name = "repeat"


RELAYOUT, RESHAPE, PERMUTE, REPEAT = (register(kind()) for kind in (Relayout, Reshape, Permute, Repeat))


def relayout_step(device: Device, x: Value, layout: Layout | None, what: str) -> Step:
    """A step copying ``x`` into a new storage in ``layout`` (None: decided like any result); the
    caller puts it among the plan's steps."""
    out = Value(x.shape, Storage(x.rows, x.cols, layout), name=f"{what} (re-laid out)")
    step = Step(RELAYOUT, choose("relayout", device), out, {"a": x}, what)
    out.producer = step
    x.consumers.append(step)
    return step


def reshape(builder: Recorder, x: Value, shape: tuple, what: str = "reshape") -> Value:
    """``x`` with another Keras shape of the same size (flat order kept)."""
    shape = (builder.batch,) + tuple(int(d) for d in shape[1:])
    if math.prod(shape) != math.prod(x.shape):
        raise ValueError(f"{what}: cannot reshape {format_shape(x.shape)} to {format_shape(shape)}")
    if shape == x.shape:
        return x
    if builder.read_once(x):
        # the input is uploaded in Keras's order and read by nothing else: a view is free
        x.shape = shape
        x.storage.rows, x.storage.cols = matrix_view(shape)
        return x
    return builder.record(RESHAPE, choose("reshape", builder.device), shape, {"a": x}, what)


def permute(builder: Recorder, x: Value, dims: Sequence[int], what: str = "permute") -> Value:
    """``x`` with its sample axes in the order ``dims`` (Keras's ``Permute(dims)``: 1-based, the
    batch axis stays first), copied by kernels/permute.cl."""
    dims = tuple(int(d) for d in dims)
    rank = len(x.shape)
    if sorted(dims) != list(range(1, rank)):
        raise ValueError(f"{what}: {dims} is not an order of the sample axes of {format_shape(x.shape)}")
    if dims == tuple(range(1, rank)):
        return x
    if rank - 1 > 8:
        raise ValueError(f"{what}: malinn permutes samples of at most 8 axes, not {rank - 1}")
    shape = (x.shape[0],) + tuple(x.shape[d] for d in dims)
    defines = {"NAX": rank - 1, "SAMPLE": math.prod(x.shape[1:])}
    for k, d in enumerate(dims):
        defines.update(
            {f"ODIM{k}": shape[k + 1], f"OSTR{k}": math.prod(shape[k + 2 :]), f"ISTR{k}": math.prod(x.shape[d + 1 :])}
        )
    return builder.record(PERMUTE, choose("permute", builder.device).configure(defines), shape, {"a": x}, what)


def repeat(builder: Recorder, x: Value, times: int, what: str = "repeat") -> Value:
    """``x`` of shape ``(batch, features)`` repeated into ``(batch, times, features)`` (Keras's
    ``RepeatVector``), by kernels/repeat.cl."""
    if len(x.shape) != 2:
        raise ValueError(f"{what}: RepeatVector takes (batch, features), not {format_shape(x.shape)}")
    return builder.record(
        REPEAT, choose("repeat", builder.device), (x.shape[0], int(times), x.shape[1]), {"a": x}, what
    )
