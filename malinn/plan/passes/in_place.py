"""In-place safety: an in-place step whose input is read again later (or downloaded) works on a
copy, or, where its kind can, in its other operand's buffer instead."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..kinds.layout import relayout_step
from ..tensors import Step, Storage, Value

if TYPE_CHECKING:
    from ..recorder import Recorder

__all__ = ["protect_in_place", "share_storage"]


def protect_in_place(builder: Recorder, outputs: list[Value]) -> None:
    """Gives each in-place step whose input ``b`` is read after it, or is an output, a buffer of
    its own: its operands exchanged where that frees it (:func:`_swap_operands`), else a copy."""
    steps = []
    for i, step in enumerate(builder.steps):
        if step.in_place:
            x = step.inputs["b"]
            later = any(builder.steps.index(c) > i for c in x.consumers if c is not step and c in builder.steps)
            if (later or x in outputs) and _swap_operands(builder, step, i, outputs):
                x, later = step.inputs["b"], False
            if later or x in outputs:
                copy = relayout_step(builder.device, x, None, step.what)
                steps.append(copy)
                x.consumers.remove(step)
                step.inputs["b"] = copy.out
                copy.out.consumers.append(step)
                step.out.storage = copy.out.storage
                share_storage(step.out, copy.out.storage)
        steps.append(step)
    builder.steps = steps


def _swap_operands(builder: Recorder, step: Step, index: int, outputs: list[Value]) -> bool:
    """A step whose in-place operand is read again works in its other operand's buffer instead,
    where its kind can exchange them (:meth:`OpKind.swapped`), that operand has the result's shape
    and nothing reads it after the step (no copy)."""
    spec = step.kind.swapped(step)
    if spec is None:
        return False
    b, a = step.inputs["b"], step.inputs["a"]
    if a.shape != b.shape or a in outputs or a.storage is b.storage:
        return False
    if any(builder.steps.index(c) > index for c in a.consumers if c is not step and c in builder.steps):
        return False
    step.inputs["b"], step.inputs["a"] = a, b
    step.spec = spec
    share_storage(step.out, a.storage)
    return True


def share_storage(value: Value, storage: Storage) -> None:
    """Points every in-place successor of ``value`` at ``storage`` too (walked with a list, not by
    recursion: a chain of thousands of in-place layers has no depth limit)."""
    pending = [value]
    while pending:
        value = pending.pop()
        value.storage = storage
        pending.extend(
            consumer.out
            for consumer in reversed(value.consumers)
            if consumer.in_place and consumer.inputs.get("b") is value and consumer.out is not value
        )
