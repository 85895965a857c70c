"""Fusion: an in-place step that alone reads a kernel's result goes into that kernel (a bias,
activation or affine step into a matmul's or convolution's epilogue, a softmax into a matmul that
holds each sample's features, an element-wise activation into a merge)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..tensors import Value

if TYPE_CHECKING:
    from ..recorder import Recorder

__all__ = ["fuse_epilogues"]


def fuse_epilogues(builder: Recorder, outputs: list[Value]) -> None:
    """Folds each in-place step into the step before it where that step's kind absorbs it
    (:meth:`malinn.plan.kinds.base.OpKind.absorb`): the in-place step disappears and its result is
    the producer's."""
    keep = []
    for step in builder.steps:
        x = step.inputs.get("b")
        producer = x.producer if x is not None else None
        if (
            step.in_place
            and x is not None
            and producer is not None
            and len(x.consumers) == 1
            and x not in outputs
            and producer.kind.absorb(producer, step, builder.device)
        ):
            producer.layers += [layer for layer in step.layers if layer not in producer.layers]
            producer.out = step.out
            step.out.producer = producer
            continue
        keep.append(step)
    builder.steps = keep
