"""The operations Keras 3 writes into a Functional model's file to compute the masks it hands to
the layers that read one: ``not_equal(x, value)`` and ``any(..., axis=-1)`` (an Embedding's or a
Masking layer's mask), ``logical_or`` and ``logical_and`` (the masks of a merge). Each computes
Keras's booleans as 1.0 (true) and 0.0 (false), so that a recurrent or attention layer given the
result as its mask skips the steps Keras skips.
"""

from __future__ import annotations

from typing import Any

from ..plan import kinds
from .base import Layer
from .keras_config import KerasContext, NotConvertible
from .merging import Maximum, Minimum

__all__ = ["NotEqual", "AnyOperation", "LogicalOr", "LogicalAnd", "not_equal_layer"]


def _zero_ones(builder) -> dict:
    """The values of this plan that hold 0.0 and 1.0 only (by id: the value kept alive)."""
    found = builder.__dict__.get("keras_booleans")
    if found is None:
        found = builder.__dict__["keras_booleans"] = {}
    return found


def _boolean(builder, value):
    """Records ``value`` as one of 0.0 and 1.0 only; returns it."""
    _zero_ones(builder)[id(value)] = value
    return value


def _as_boolean(builder, x, what: str):
    """``x`` as Keras's cast to bool: 1.0 where it is not 0 (NaN too), else 0.0."""
    if _zero_ones(builder).get(id(x)) is x:
        return x
    column = kinds.reshape(builder, x, tuple(x.shape) + (1,), what=what)
    return _boolean(builder, kinds.any_not_equal(builder, column, 0.0, shape=x.shape, what=what))


class NotEqual(Layer):
    """``x != value`` element by element, as 1.0 and 0.0 (Keras 3's ``not_equal`` of a tensor and
    a number: NaN differs from everything).

    Args:
        value: the number each element is compared with.
        name: the layer's name.

    Raises:
        ValueError: ``value`` is not a number.
    """

    reusable_on_other_shapes = True

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "NotEqual":
        raise NotConvertible("of two tensors (malinn compares a tensor with a number)")

    def __init__(self, value: float = 0.0, name: str | None = None):
        super().__init__(name)
        try:
            self.value = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"NotEqual {self.name!r}: value must be a number, got {value!r}") from None

    def lower(self, builder, x):
        column = kinds.reshape(builder, x, tuple(x.shape) + (1,), what=self._what())
        return _boolean(builder, kinds.any_not_equal(builder, column, self.value, shape=x.shape, what=self._what()))

    def get_config(self) -> dict:
        return {**super().get_config(), "value": self.value}


def not_equal_layer(constant: Any, first: bool, keras: KerasContext) -> NotEqual:
    """The layer of Keras 3's ``not_equal`` of a tensor and the number ``constant`` (either order).

    Raises:
        NotConvertible: the constant is not one number.
    """
    if isinstance(constant, (list, dict)):
        raise NotConvertible("with an array operand (malinn compares a tensor with a number)")
    try:
        return NotEqual(constant, name=keras.name)
    except ValueError as exc:
        raise NotConvertible(f"({str(exc).split(': ', 1)[-1]})") from None


class AnyOperation(Layer):
    """Whether any element along the last axis is not 0 (Keras 3's ``any(x, axis=-1)``), as 1.0
    and 0.0; the axis dropped, or kept as 1 with ``keepdims``.

    Args:
        axis: the axis reduced: the last (-1, or its index counted from the batch axis).
        keepdims: keep it as an axis of 1.
        name: the layer's name.

    Raises:
        ValueError: ``axis`` is not an integer.
    """

    keras_aliases = ("Any",)
    reusable_on_other_shapes = True

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "AnyOperation":
        axis = config.get("axis")
        if not isinstance(axis, int) or isinstance(axis, bool):
            raise NotConvertible(f"over the axes {axis!r} (malinn reduces the last axis only)")
        return cls(axis, keepdims=bool(config.get("keepdims", False)), name=keras.name)

    def __init__(self, axis: int = -1, keepdims: bool = False, name: str | None = None):
        super().__init__(name)
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise ValueError(f"AnyOperation {self.name!r}: axis must be an integer, got {axis!r}")
        self.axis, self.keepdims = axis, bool(keepdims)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        if len(shape) < 3 or self.axis not in (-1, len(shape) - 1):
            raise ValueError(
                f"AnyOperation {self.name!r}: malinn reduces the last axis of inputs of rank 3 or more, "
                f"not axis {self.axis} of {shape}"
            )
        return shape[:-1] + ((1,) if self.keepdims else ())

    def lower(self, builder, x):
        shape = tuple(x.shape[:-1]) + ((1,) if self.keepdims else ())
        return _boolean(builder, kinds.any_not_equal(builder, x, 0.0, shape=shape, what=self._what()))

    def get_config(self) -> dict:
        return {**super().get_config(), "axis": self.axis, "keepdims": self.keepdims}


class LogicalOr(Maximum):
    """Keras 3's ``logical_or`` of two tensors (each true where not 0), as 1.0 and 0.0."""

    def lower(self, builder, xs):
        xs = [_as_boolean(builder, x, self._what()) for x in xs]
        return _boolean(builder, super().lower(builder, xs))


class LogicalAnd(Minimum):
    """Keras 3's ``logical_and`` of two tensors (each true where not 0), as 1.0 and 0.0."""

    def lower(self, builder, xs):
        xs = [_as_boolean(builder, x, self._what()) for x in xs]
        return _boolean(builder, super().lower(builder, xs))
