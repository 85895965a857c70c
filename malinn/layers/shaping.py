"""Layers that change a tensor's shape, not its values: ``Flatten``."""

from __future__ import annotations

import math

from .base import Layer

__all__ = ["Flatten"]


class Flatten(Layer):
    """Flattens each sample to one axis in Keras's order (row-major, channels last)."""

    def compute_output_shape(self, input_shape) -> tuple:
        shape = tuple(input_shape)
        return (shape[0], math.prod(shape[1:]))

    def lower(self, builder, x):
        return builder.reshape(x, self.compute_output_shape(x.shape), what=self._what())
