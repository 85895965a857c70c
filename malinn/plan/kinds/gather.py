"""Gathering rows of a table by index: Keras's Embedding (kernels/embedding.cl)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...choice.kernel_choice import choose
from ..tensors import Value, Vector
from .base import OpKind, register

if TYPE_CHECKING:
    from ..recorder import Recorder

__all__ = ["GATHER", "gather"]


class Gather(OpKind):
    """Reads the index tensor ``a`` and the table (``step.vectors["scale"]``), writes a new result."""

    name = "gather"
    shape_generic = True


GATHER = register(Gather())


def gather(
    builder: Recorder, x: Value, table: Vector, input_dim: int, output_dim: int, what: str = "embedding"
) -> Value:
    """The rows of ``table`` (``input_dim x output_dim`` floats, row-major) that the indices ``x``
    (float32 values of any shape, truncated as Keras casts them) name: the result has ``x``'s shape
    with ``output_dim`` added as the last axis."""
    spec = choose("gather", builder.device).configure({"INPUT_DIM": int(input_dim), "OUTPUT_DIM": int(output_dim)})
    return builder.record(GATHER, spec, tuple(x.shape) + (int(output_dim),), {"a": x}, what, vectors={"scale": table})
