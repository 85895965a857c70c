"""Layouts: each tensor is in its producer's layout (the inputs in Keras's own order); a reader of
another layout gets a re-layout step; outputs end in Keras's order."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...library.layout import parse_layout, round_up
from ..kinds.layout import relayout_step
from ..tensor import keras_order
from ..tensors import C, Step, Value, may_alias

if TYPE_CHECKING:
    from ...library.layout import Layout
    from ..recorder import Recorder

__all__ = ["relayout_inputs", "unalias", "download_ready"]


def relayout_inputs(builder: Recorder) -> list[tuple[Step, str, Layout]]:
    """Decides each result's layout and gives readers of another layout a re-layout step. Returns
    the readers that take an R buffer for C (or the reverse) while it has one column: ``[(step,
    slot, layout)]`` (:func:`unalias` checks them once the paddings are known)."""
    steps, relaid, aliases = [], {}, []
    for step in builder.steps:
        for slot, x in list(step.inputs.items()):
            layout, row_mult, col_mult = step.kind.wanted(step, slot)
            storage = x.storage
            alias = layout is not None and storage.layout != layout and may_alias(storage, layout, x, col_mult)
            if not (layout is None or storage.layout == layout or alias):
                key = (id(x), str(layout), row_mult)
                if key not in relaid:
                    copy = relayout_step(builder.device, x, layout, step.what)
                    steps.append(copy)
                    relaid[key] = copy.out
                x.consumers.remove(step)
                step.inputs[slot] = relaid[key]
                relaid[key].consumers.append(step)
            elif alias:
                aliases.append((step, slot, layout))  # R and C are one memory while there is one column
        if step.out.storage.layout is None:
            layout = step.kind.wanted(step, "r")[0] or _readers_layout(step.out)
            step.out.storage.layout = (
                layout if layout is not None else step.inputs["b" if "b" in step.inputs else "a"].storage.layout
            )
        steps.append(step)
    builder.steps = steps
    return aliases


def _readers_layout(value: Value) -> Layout | None:
    """The one layout every reader of ``value`` that asks for one wants (a result in any layout is
    then written in it, saving a re-layout), or None."""
    wanted = {
        str(reader.kind.wanted(reader, slot)[0])
        for reader in value.consumers
        for slot, x in reader.inputs.items()
        if x is value and reader.kind.wanted(reader, slot)[0] is not None
    }
    return parse_layout(wanted.pop()) if len(wanted) == 1 else None


def unalias(builder: Recorder, aliases: list[tuple[Step, str, Layout]]) -> None:
    """Readers that took a plain R buffer for C (or the reverse) get a re-layout step where the
    buffer was padded to more than one column after all."""
    for step, slot, layout in aliases:
        x = step.inputs[slot]
        if x.storage.padded_size[1] == 1:
            continue
        _, row_mult, _ = step.kind.wanted(step, slot)
        copy = relayout_step(builder.device, x, layout, step.what)
        copy.out.storage.padded = (round_up(x.rows, row_mult), x.storage.padded_size[1])
        x.consumers.remove(step)
        step.inputs[slot] = copy.out
        copy.out.consumers.append(step)
        builder.steps.insert(builder.steps.index(step), copy)


def download_ready(builder: Recorder, outputs: list[Value]) -> list[Value]:
    """Outputs whose buffers are not in Keras's order get a last re-layout step into it; returns
    the values to download."""
    result = []
    for value in outputs:
        storage = value.storage
        assert storage.layout is not None, "an output's layout is read before the layouts pass decided it"
        if not keras_order(storage.layout, value.rows, value.cols, storage.padded_size):
            step = relayout_step(builder.device, value, C, value.name or "output")
            step.out.storage.padded = (value.rows, value.cols)
            builder.steps.append(step)
            value = step.out
        result.append(value)
    return result
