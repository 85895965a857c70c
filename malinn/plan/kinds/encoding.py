"""Integer features turned into indices and vectors, as Keras's preprocessing layers: IntegerLookup's
lookup of each token in a vocabulary (kernels/integer_lookup.cl) and CategoryEncoding's one-hot,
multi-hot and count vectors (kernels/category_encoding.cl), which IntegerLookup's encoded outputs
run too."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...choice.kernel_choice import choose
from ..tensors import Value, Vector
from .base import OpKind, register

if TYPE_CHECKING:
    from ..recorder import Recorder

__all__ = ["ENCODING", "LOOKUP", "ENCODING_MODES", "encoded_shape", "category_encoding", "integer_lookup"]

#: Keras's output_mode -> the encoding kernel's MODE
ENCODING_MODES = {"one_hot": 0, "multi_hot": 1, "count": 2}


class Encoding(OpKind):
    """Reads the index tensor ``a``, writes a new result of one row per token."""

    name = "encoding"
    shape_generic = True


class Lookup(OpKind):
    """Reads the token tensor ``a`` and the sorted vocabulary (``step.vectors``: ``scale`` the tokens,
    ``shift`` their indices), writes a new result of ``a``'s shape."""

    name = "lookup"
    shape_generic = True


ENCODING, LOOKUP = register(Encoding()), register(Lookup())


def encoded_shape(shape: Sequence[int | None], num_tokens: int, mode: str) -> tuple:
    """The shape of the encoding of indices of ``shape`` (batch axis first), as Keras's
    CategoryEncoding: a one-hot adds an axis of ``num_tokens`` (in place of a last axis of 1), multi-hot
    and count replace the last axis."""
    shape = tuple(shape)
    if mode == "one_hot" and shape[-1] != 1:
        return shape + (int(num_tokens),)
    return shape[:-1] + (int(num_tokens),)


def category_encoding(
    builder: Recorder, x: Value, num_tokens: int, mode: str, what: str = "category encoding"
) -> Value:
    """``x``'s indices (float32, truncated) encoded over ``num_tokens`` as ``mode`` (one of
    :data:`ENCODING_MODES`): a result of :func:`encoded_shape`."""
    spec = choose("encoding", builder.device).configure({"MODE": ENCODING_MODES[mode]})
    out_shape = encoded_shape((builder.batch,) + tuple(x.shape[1:]), num_tokens, mode)
    return builder.record(ENCODING, spec, out_shape, {"a": x}, what)


def integer_lookup(
    builder: Recorder, x: Value, tokens: Vector, indices: Vector, defines: dict, what: str = "integer lookup"
) -> Value:
    """Each token of ``x`` replaced by its index: ``tokens`` the vocabulary sorted ascending,
    ``indices`` each one's index, ``defines`` the kernel's ``VOCAB``, ``OOV``, ``OOV_START``,
    ``MASKING``, ``MASK_TOKEN`` and ``MASK_INDEX`` (kernels/integer_lookup.cl)."""
    spec = choose("lookup", builder.device).configure(dict(defines))
    return builder.record(
        LOOKUP, spec, (builder.batch,) + tuple(x.shape[1:]), {"a": x}, what, vectors={"scale": tokens, "shift": indices}
    )
