"""Layers that change a tensor's shape, not its values: ``Flatten``, ``Reshape``, ``Permute``,
``RepeatVector``, ``Identity``."""

from __future__ import annotations

import math

from ..plan import kinds
from .base import Layer

__all__ = ["Flatten", "Reshape", "Permute", "RepeatVector", "Identity"]


def _int_tuple(value, who: str, label: str, minimum: int) -> tuple:
    try:
        items = tuple(value)
    except TypeError:
        items = None
    if not items or any(isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in items):
        raise ValueError(f"{who}: {label} must be a non-empty list of integers >= {minimum}, got {value!r}")
    return items


class Flatten(Layer):
    """Flattens each sample to one axis in Keras's order (row-major, channels last)."""

    reusable_on_other_shapes = True

    def compute_output_shape(self, input_shape) -> tuple:
        shape = tuple(input_shape)
        return (shape[0], math.prod(shape[1:]))

    def lower(self, builder, x):
        return kinds.reshape(builder, x, self.compute_output_shape(x.shape), what=self._what())


class Reshape(Layer):
    """Each sample reshaped to ``target_shape`` in Keras's (row-major) order; one size may be -1.

    Args:
        target_shape: the sample's new shape (without the batch axis).
        name: the layer's name.

    Raises:
        ValueError: ``target_shape`` is not a list of positive sizes with at most one -1, or does
            not hold the input's values.
    """

    def __init__(self, target_shape, name: str | None = None):
        super().__init__(name)
        self.target_shape = _int_tuple(target_shape, f"Reshape {self.name!r}", "target_shape", -1)
        if 0 in self.target_shape or self.target_shape.count(-1) > 1:
            raise ValueError(f"Reshape {self.name!r}: target_shape {list(target_shape)} has a 0 or more than one -1")

    def compute_output_shape(self, input_shape) -> tuple:
        shape = tuple(input_shape)
        size, known = math.prod(shape[1:]), math.prod(d for d in self.target_shape if d != -1)
        target = tuple(size // known if d == -1 else d for d in self.target_shape)
        if size % known or math.prod(target) != size:
            raise ValueError(f"Reshape {self.name!r}: samples of shape {shape[1:]} ({size} values) cannot be "
                             f"reshaped to {self.target_shape}")
        return (shape[0],) + target

    def build(self, input_shape) -> None:
        super().build(input_shape)
        self.compute_output_shape(input_shape)

    def lower(self, builder, x):
        return kinds.reshape(builder, x, self.compute_output_shape(x.shape), what=self._what())

    def get_config(self) -> dict:
        return {**super().get_config(), "target_shape": list(self.target_shape)}


class Permute(Layer):
    """The sample's axes reordered: ``dims`` lists, for each output axis, the input axis (1-based,
    as Keras: the batch axis stays first).

    Raises:
        ValueError: ``dims`` is not an order of 1..rank.
    """

    def __init__(self, dims, name: str | None = None):
        super().__init__(name)
        self.dims = _int_tuple(dims, f"Permute {self.name!r}", "dims", 1)
        if sorted(self.dims) != list(range(1, len(self.dims) + 1)):
            raise ValueError(f"Permute {self.name!r}: dims {list(dims)} is not an order of 1..{len(self.dims)}")

    def build(self, input_shape) -> None:
        super().build(input_shape)
        if len(self.input_shape) != len(self.dims):
            raise ValueError(f"Permute {self.name!r}: dims {list(self.dims)} do not fit samples of shape "
                             f"{self.input_shape}")

    def compute_output_shape(self, input_shape) -> tuple:
        shape = tuple(input_shape)
        return (shape[0],) + tuple(shape[d] for d in self.dims)

    def lower(self, builder, x):
        return kinds.permute(builder, x, self.dims, what=self._what())

    def get_config(self) -> dict:
        return {**super().get_config(), "dims": list(self.dims)}


class RepeatVector(Layer):
    """Each sample of ``(batch, features)`` repeated ``n`` times: ``(batch, n, features)``.

    Raises:
        ValueError: ``n`` is not a positive integer, or the input is not 2-D.
    """

    def __init__(self, n, name: str | None = None):
        super().__init__(name)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"RepeatVector {self.name!r}: n must be a positive integer, got {n!r}")
        self.n = n

    def build(self, input_shape) -> None:
        super().build(input_shape)
        if len(self.input_shape) != 1:
            raise ValueError(f"RepeatVector {self.name!r} takes inputs of shape (batch, features), "
                             f"not {(None,) + self.input_shape}")

    def compute_output_shape(self, input_shape) -> tuple:
        shape = tuple(input_shape)
        return (shape[0], self.n) + shape[1:]

    def lower(self, builder, x):
        return kinds.repeat(builder, x, self.n, what=self._what())

    def get_config(self) -> dict:
        return {**super().get_config(), "n": self.n}


class Identity(Layer):
    """Returns its input (Keras's Identity; the converter also uses it for a model of inference
    no-ops only)."""

    reusable_on_other_shapes = True

    def lower(self, builder, x):
        return x
