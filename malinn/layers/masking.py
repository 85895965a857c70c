"""Keras's masks in a plan: which time steps of a sequence the layers after it skip.

Keras computes a mask beside a layer's output (``Embedding(mask_zero=True)``: the indices that
are not 0) and hands it to the layers that take one (recurrent layers skip masked steps; a
recurrent layer returning sequences passes it on). In a plan a mask is a :class:`Value` of
shape ``(batch, steps)`` whose non-zero entries mark the steps kept, recorded beside the value it
masks (:func:`with_mask`) and read by the layers that take one (:func:`mask_of`); the Embedding's
mask is its index tensor itself (an index is kept where it is not 0); the Masking layer's is a
0/1 value. Inference no-ops (Dropout) pass the same value on, and so its mask.

A merge of inputs of different masks (two Embeddings added, a Masking branch concatenated with an
Embedding one) gets the logical AND of the masks its inputs have (tf_keras's rule; an input without
one counts as all kept), computed by a multiply of their 0/1 forms only where a layer reads it
(a mask recorded as pending: :func:`with_pending_mask`). Keras 3 writes the masks it merges into
its files as operations (``LogicalOr`` and the like), which the layers of
:mod:`malinn.layers.mask_operations` compute.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ..plan import kinds
from ..plan.tensor import format_shape
from ..plan.tensors import Vector

if TYPE_CHECKING:
    from ..plan.recorder import Recorder
    from ..plan.tensors import Value
    from .base import Layer

#: what a layer gives: a value, or a list of them
_Output = TypeVar("_Output", bound="Value | list")

__all__ = [
    "mask_of",
    "with_mask",
    "with_pending_mask",
    "carry_mask",
    "binary_mask",
    "with_mask_maker",
    "MASK_PASSING",
    "MASK_MERGING",
]


def _masks(builder: Recorder) -> dict:
    masks = builder.__dict__.get("keras_masks")
    if masks is None:
        masks = builder.__dict__["keras_masks"] = {}
    return masks


def with_mask(builder: Recorder, value: Value, mask: Value | _Pending | None) -> Value:
    """Records ``mask`` (a ``(batch, steps)`` value, or None) as ``value``'s Keras mask; returns ``value``."""
    if mask is not None:
        _masks(builder)[id(value)] = (value, mask)
    return value


class _Pending:
    """A mask whose steps are recorded only when a layer reads it: its shape and the function that
    records them (called once)."""

    def __init__(self, shape: tuple, make: Callable[[], Value]):
        self.shape, self._make = tuple(shape), make
        self._value: Value | None = None

    def value(self) -> Value:
        if self._value is None:
            self._value = self._make()
        return self._value


def with_pending_mask(builder: Recorder, value: Value, shape: tuple, make: Callable[[], Value]) -> Value:
    """Records as ``value``'s Keras mask the value of ``shape`` that ``make()`` records the steps of,
    called by the first :func:`mask_of` that asks for it (none where no layer reads it); returns
    ``value``."""
    return with_mask(builder, value, _Pending(shape, make))


def _mask_entry(builder: Recorder, value: Value) -> Value | _Pending | None:
    """``value``'s mask as recorded (a value or a pending one), or None."""
    found = _masks(builder).get(id(value))
    return found[1] if found is not None and found[0] is value else None


def mask_of(builder: Recorder, value: Value) -> Value | None:
    """``value``'s Keras mask (a ``(batch, steps)`` value), or None where it has none."""
    mask = _mask_entry(builder, value)
    return mask.value() if isinstance(mask, _Pending) else mask


#: malinn's layers Keras hands its input's mask through unchanged (``supports_masking`` without a
#: mask of their own): a mask from an Embedding reaches a recurrent layer or a pooling after them
MASK_PASSING = frozenset(
    {
        "Dense",
        "Activation",
        "ReLU",
        "LeakyReLU",
        "ELU",
        "PReLU",
        "LayerNormalization",
        "BatchNormalization",
        "UnitNormalization",
        "Rescaling",
        "Normalization",
        "Identity",
    }
)
#: merges: their output's mask is the logical AND of their inputs' (tf_keras's rule: an input
#: without one counts as all kept; equal masks give that mask, as in Keras 3, which ORs them)
MASK_MERGING = frozenset({"Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum", "Concatenate"})


def carry_mask(builder: Recorder, layer: Layer, given: Value | list, value: _Output) -> _Output:
    """Records the mask Keras gives ``value``, the output ``layer`` computed from ``given``, where
    the layer hands its input's mask on (:data:`MASK_PASSING`, a layer with ``keras_passes_mask``
    set: a ``TimeDistributed`` one) or merges its inputs' (:data:`MASK_MERGING`) and has not
    recorded a mask of its own; returns ``value``.

    Raises:
        ValueError: a mask of more than the ``(batch, steps)`` axes (a Masking layer's on inputs of
            rank 4 or more) that Keras hands on to an output it does not fit.
    """
    if isinstance(value, list) or _mask_entry(builder, value) is not None:
        return value
    name = type(layer).__name__
    if isinstance(given, list):
        if name not in MASK_MERGING:
            return value
        mask = _merged_mask(builder, layer, given, value)
    elif getattr(layer, "keras_passes_mask", name in MASK_PASSING):
        mask = _mask_entry(builder, given)
    else:
        return value
    if mask is None:
        return value
    if tuple(value.shape[: len(mask.shape)]) == tuple(mask.shape):
        with_mask(builder, value, mask)
    elif len(mask.shape) > 2:
        raise ValueError(
            f"{type(layer).__name__} {layer.name!r}: Keras hands its input's mask of shape "
            f"{format_shape(mask.shape)} on to its output of shape {format_shape(value.shape)}, which "
            "malinn does not compute (it carries a mask to the layers that read one where the mask is "
            "(batch, steps), or the leading axes of the output)"
        )
    return value


def _merged_mask(builder: Recorder, layer: Any, given: list, value: Value) -> Value | _Pending | None:
    """The mask of a merge's output, pending until a layer reads it, by the layer's
    ``keras_mask_merge`` rule: ``"and"`` (tf_keras, the default) ANDs the masks present (an input
    without one counts as all kept), ``"or"`` (Keras 3) ORs them where every input has one (else
    none: Keras 3's Concatenate then gives an all-kept mask, which masks nothing). A Concatenate
    along the steps joins the masks, all kept for an input without one (as both Kerases: tf_keras
    where that input has one feature, else it refuses the model). None where no input has a mask,
    or where Keras's merged mask is not the output's leading axes."""
    masks = [_mask_entry(builder, x) for x in given]
    present = [m for m in masks if m is not None]
    rule = getattr(layer, "keras_mask_merge", "and")
    rank = len(value.shape)
    what = f"{layer._what()} mask"
    if present and type(layer).__name__ == "Concatenate" and layer.axis % rank != rank - 1:
        if layer.axis % rank != 1 or any(len(m.shape) != 2 for m in present) or rank < 3:
            return None
        # along the steps: the masks joined, all kept for an input without one (both Kerases)
        return _Pending(
            tuple(value.shape[:2]),
            lambda: kinds.concat(
                builder,
                [
                    binary_mask(builder, _value(m))
                    if m is not None
                    else _all_kept(builder, x, layer.device_copies, what)
                    for m, x in zip(masks, given)
                ],
                1,
                what=what,
            ),
        )
    if not present or (rule == "or" and len(present) != len(masks)):
        return None
    shape = tuple(value.shape[: len(present[0].shape)])
    distinct: list = []
    for m in present:
        if tuple(m.shape) != shape:
            return None
        if not any(m is d for d in distinct):
            distinct.append(m)
    if len(distinct) == 1:
        return distinct[0]
    op = "maximum" if rule == "or" else "multiply"  # on 0/1 masks: OR, AND
    return _Pending(
        shape, lambda: kinds.merge(builder, [binary_mask(builder, _value(m)) for m in distinct], op, what=what)
    )


def _all_kept(builder: Recorder, x: Value, copies: dict, what: str) -> Value:
    """A ``(batch, steps)`` mask of 1.0 for ``x`` ``(batch, steps, ...)``: whether each step differs
    from 0 anywhere (0 or 1, whatever ``x`` holds), times 0 plus 1 (``copies``: the layer's device
    copies, which hold the constants)."""
    batch, steps = x.shape[:2]
    flat = x
    if len(x.shape) != 3:
        flat = kinds.reshape(builder, x, (batch, steps, math.prod(x.shape[2:])), what=what)
    known = kinds.any_not_equal(builder, flat, 0.0, shape=(batch, steps), what=what)
    scale, ones = Vector(f"{what} scale", np.zeros(steps), copies), Vector(f"{what} ones", np.ones(steps), copies)
    return kinds.affine(builder, known, scale, ones, what)


def _value(mask: Value | _Pending) -> Value:
    return mask.value() if isinstance(mask, _Pending) else mask


def with_mask_maker(builder: Recorder, mask: Value, make: Callable[[], Value]) -> None:
    """Records ``make()`` as the way to compute ``mask``'s 0/1 form (an Embedding's mask is its
    indices: kept where not 0), called once by the first :func:`binary_mask` that needs it."""
    _masks(builder)[("binary", id(mask))] = (mask, make)


def binary_mask(builder: Recorder, mask: Value) -> Value:
    """``mask`` as a ``(batch, steps)`` value of 1 (kept) and 0 (masked): the layers that sum over
    the kept steps multiply by it (a mask without a maker recorded is such a value already)."""
    found = _masks(builder).get(("binary", id(mask)))
    if found is None or found[0] is not mask:
        return mask
    made = found[1]()
    _masks(builder)[("binary", id(mask))] = (mask, lambda: made)
    return made
