"""Paddings: every buffer padded to what its producer and all its readers ask; the operands whose
columns a kernel couples (a matmul's right operand and result) padded alike."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...library.layout import round_up
from ..kinds.layout import RESHAPE
from ..tensors import storages_of

if TYPE_CHECKING:
    from ..recorder import Recorder

__all__ = ["resolve_paddings"]


def resolve_paddings(builder: Recorder) -> None:
    """Decides every storage's padded shape."""
    for step in builder.steps:
        slots = [(slot, x.storage) for slot, x in step.inputs.items()] + [("r", step.out.storage)]
        for slot, storage in slots:
            _, row_mult, col_mult = step.kind.wanted(step, slot)
            storage.row_mult = math.lcm(storage.row_mult, row_mult)
            storage.col_mult = math.lcm(storage.col_mult, col_mult)
        if step.kind.couples_columns:
            left, right = step.inputs["b"].storage.root(), step.out.storage.root()
            if left is not right:
                right.group = left
    _couple_reshapes(builder)
    groups: dict = {}
    storages = storages_of(builder.inputs, builder.steps)
    for storage in storages:
        # a kernel that takes any layout writes the layout's whole chunks too (a blocked layout
        # inherited from the producer's kernel)
        if storage.layout is not None:
            storage.row_mult = math.lcm(storage.row_mult, storage.layout.row_multiple)
            storage.col_mult = math.lcm(storage.col_mult, storage.layout.col_multiple)
        root = storage.root()
        col_mult, cols = groups.get(id(root), (1, 0))
        groups[id(root)] = (math.lcm(col_mult, storage.col_mult), max(cols, storage.cols))
    for storage in storages:
        col_mult, cols = groups[id(storage.root())]
        storage.padded = (round_up(storage.rows, storage.row_mult), round_up(storage.cols, col_mult))


def _couple_reshapes(builder: Recorder) -> None:
    """A reshape that keeps its input's matrix view in the same layout (a Reshape of the leading
    axes) pads its result as its input: so the result can be a view of the input's buffer
    (:func:`malinn.plan.passes.views.view_reshapes` needs equal leading dimensions) where the
    producer pads its rows more than the reader asks (a GPU gemv pads a layer's units to its
    work-group's rows). A matmul reading the result then reads the larger K: its weight copy is
    padded to it, with zeros."""
    for step in builder.steps:
        if step.kind is not RESHAPE:
            continue
        x, y = step.inputs["a"], step.out
        xs, ys = x.storage, y.storage
        if (x.rows, x.cols) != (y.rows, y.cols) or xs.layout is None or str(xs.layout) != str(ys.layout):
            continue
        xs.row_mult = ys.row_mult = math.lcm(xs.row_mult, ys.row_mult)
        if xs.root() is not ys.root():
            ys.root().group = xs.root()
