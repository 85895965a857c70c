"""Keras's masks in a plan: which time steps of a sequence the layers after it skip.

Keras computes a mask beside a layer's output (``Embedding(mask_zero=True)``: the indices that
are not 0) and hands it to the layers that take one (recurrent layers skip masked steps; a
recurrent layer returning sequences passes it on). In a plan a mask is a :class:`Value` of
shape ``(batch, steps)`` whose non-zero entries mark the steps kept, recorded beside the value it
masks (:func:`with_mask`) and read by the layers that take one (:func:`mask_of`); the Embedding's
mask is its index tensor itself (an index is kept where it is not 0). Inference no-ops (Dropout)
pass the same value on, and so its mask.
"""

from __future__ import annotations

__all__ = ["mask_of", "with_mask", "carry_mask", "binary_mask", "with_mask_maker", "MASK_PASSING", "MASK_MERGING"]


def _masks(builder) -> dict:
    masks = builder.__dict__.get("keras_masks")
    if masks is None:
        masks = builder.__dict__["keras_masks"] = {}
    return masks


def with_mask(builder, value, mask):
    """Records ``mask`` (a ``(batch, steps)`` value, or None) as ``value``'s Keras mask; returns ``value``."""
    if mask is not None:
        _masks(builder)[id(value)] = (value, mask)
    return value


def mask_of(builder, value):
    """``value``'s Keras mask (a ``(batch, steps)`` value), or None where it has none."""
    found = _masks(builder).get(id(value))
    return found[1] if found is not None and found[0] is value else None


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
#: merges: their output's mask is their inputs' where every input has the same one (Keras 3 ORs
#: the masks, tf_keras ANDs them: equal masks give the same mask either way)
MASK_MERGING = frozenset({"Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum"})


def carry_mask(builder, layer, given, value):
    """Records the mask Keras gives ``value``, the output ``layer`` computed from ``given``, where
    the layer hands its input's mask on (:data:`MASK_PASSING`, a layer with ``keras_passes_mask``
    set: a ``TimeDistributed`` one) and has not recorded a mask of its own; returns ``value``."""
    if isinstance(value, list) or mask_of(builder, value) is not None:
        return value
    name = type(layer).__name__
    if isinstance(given, list):
        if name not in MASK_MERGING:
            return value
        masks = [mask_of(builder, x) for x in given]
        mask = masks[0] if masks and all(m is not None and m is masks[0] for m in masks) else None
    elif getattr(layer, "keras_passes_mask", name in MASK_PASSING):
        mask = mask_of(builder, given)
    else:
        return value
    if mask is not None and tuple(value.shape[:2]) == tuple(mask.shape):
        with_mask(builder, value, mask)
    return value


def with_mask_maker(builder, mask, make) -> None:
    """Records ``make()`` as the way to compute ``mask``'s 0/1 form (an Embedding's mask is its
    indices: kept where not 0), called once by the first :func:`binary_mask` that needs it."""
    _masks(builder)[("binary", id(mask))] = (mask, make)


def binary_mask(builder, mask):
    """``mask`` as a ``(batch, steps)`` value of 1 (kept) and 0 (masked): the layers that sum over
    the kept steps multiply by it (a mask without a maker recorded is such a value already)."""
    found = _masks(builder).get(("binary", id(mask)))
    if found is None or found[0] is not mask:
        return mask
    made = found[1]()
    _masks(builder)[("binary", id(mask))] = (mask, lambda: made)
    return made
