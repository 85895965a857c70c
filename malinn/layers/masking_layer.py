"""Keras's Masking layer: the time steps whose every feature equals a mask value are masked."""

from __future__ import annotations

import math
from typing import Any

from ..plan import kinds
from ..plan.tensor import format_shape
from .base import Layer
from .keras_config import KerasContext, NotConvertible
from .masking import with_pending_mask

__all__ = ["Masking"]


class Masking(Layer):
    """Masks the positions whose every feature equals ``mask_value`` (Keras's Masking).

    The output is the input where any feature of a position (the last axis) differs from
    ``mask_value``, else 0 (``inputs * any(inputs != mask_value, axis=-1, keepdims=True)``). Its
    Keras mask, ``any(inputs != mask_value, axis=-1)``, reaches the layers that read one (the
    recurrent layers, Bidirectional, the attention layers, GlobalAveragePooling1D) as an
    Embedding's does. On inputs of rank 2 the mask (one per sample) reaches no layer malinn runs;
    on inputs of rank 4 or more it has the axes between the batch and the features and passes on
    only to outputs it fits (a ``TimeDistributed(Dense)``), as in Keras.

    Args:
        mask_value: the value that marks a masked position (a finite number; NaN masks nothing,
            as it equals nothing).
        name: the layer's name.

    Raises:
        ValueError: ``mask_value`` is not a number, or is infinite.
    """

    reusable_on_other_shapes = True
    keras_passes_mask = False  # it computes a mask of its own

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "Masking":
        value = config.get("mask_value", 0.0)
        if isinstance(value, dict):  # Keras 3 serializes an array-like value as an object
            raise NotConvertible(f"with the mask value {value.get('class_name', 'object')} (malinn takes a number)")
        try:
            return cls(value, name=keras.name)
        except ValueError as exc:
            raise NotConvertible(f"({str(exc).split(': ', 1)[-1]})") from None

    @classmethod
    def from_keras_time_distributed(cls, config: dict, keras: KerasContext) -> "Masking":
        """``TimeDistributed(Masking)`` is Masking on the wider input: the same output and mask."""
        return cls.from_keras_config(config, keras)

    def __init__(self, mask_value: float = 0.0, name: str | None = None):
        super().__init__(name)
        if isinstance(mask_value, bool) or not isinstance(mask_value, (int, float)):
            try:
                mask_value = float(mask_value)  # a numpy scalar
            except (TypeError, ValueError):
                raise ValueError(f"Masking {self.name!r}: mask_value must be a number, got {mask_value!r}") from None
        if math.isinf(mask_value):
            raise ValueError(
                f"Masking {self.name!r}: mask_value must be finite, got {mask_value!r} (a masked position "
                "of infinities times 0 is NaN in tf_keras, 0 in Keras 3)"
            )
        self.mask_value = float(mask_value)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        if len(shape) < 2:
            raise ValueError(f"Masking {self.name!r}: takes inputs of rank 2 or more, got {format_shape(shape)}")
        return shape

    def lower(self, builder, x):
        what = self._what()
        kept = kinds.any_not_equal(builder, x, self.mask_value, what=f"{what} mask")  # (batch, ..., 1)
        out = kinds.merge(builder, [x, kept], "multiply", what=what)
        if len(x.shape) >= 3:  # Keras's mask: the positions of the axes before the features
            shape = tuple(x.shape[:-1])
            with_pending_mask(builder, out, shape, lambda: kinds.reshape(builder, kept, shape, what=f"{what} mask"))
        return out

    def get_config(self) -> dict:
        return {**super().get_config(), "mask_value": self.mask_value}
