"""The operations Keras 3 writes into a Functional model's file to compute the masks it hands to
the layers that read one: ``not_equal(x, value)`` and ``any(..., axis=-1)`` (an Embedding's or a
Masking layer's mask), ``logical_or`` and ``logical_and`` (the masks of a merge), and what a
Concatenate's mask is made of: ``expand_dims(mask, -1)``, ``zeros_like(x, dtype="bool")`` (ORed with
it: the mask broadcast over the input's features), ``ones_like(x, dtype="bool")`` (the mask of an
input without one), their concatenation and ``any`` over the last axis. Each computes Keras's
booleans as 1.0 (true) and 0.0 (false), so that a recurrent or attention layer given the result as
its mask skips the steps Keras skips.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..plan import kinds
from ..plan.tensors import Vector
from .base import Layer
from .keras_config import KerasContext, NotConvertible
from .merging import Maximum, Minimum

if TYPE_CHECKING:
    from ..plan.builder import PlanBuilder
    from ..plan.recorder import Recorder
    from ..plan.tensors import Value

__all__ = [
    "NotEqual",
    "AnyOperation",
    "LogicalOr",
    "LogicalAnd",
    "ExpandDims",
    "ZerosLike",
    "OnesLike",
    "not_equal_layer",
]


def _zero_ones(builder: Recorder) -> dict:
    """The values of this plan that hold 0.0 and 1.0 only (by id: the value kept alive)."""
    found = builder.__dict__.get("keras_booleans")
    if found is None:
        found = builder.__dict__["keras_booleans"] = {}
    return found


def _boolean(builder: Recorder, value: Value) -> Value:
    """Records ``value`` as one of 0.0 and 1.0 only; returns it."""
    _zero_ones(builder)[id(value)] = value
    return value


def _as_boolean(builder: Recorder, x: Value, what: str) -> Value:
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

    def lower(self, builder: PlanBuilder, x: Value) -> Value:
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

    def lower(self, builder: PlanBuilder, x: Value) -> Value:
        shape = tuple(x.shape[:-1]) + ((1,) if self.keepdims else ())
        return _boolean(builder, kinds.any_not_equal(builder, x, 0.0, shape=shape, what=self._what()))

    def get_config(self) -> dict:
        return {**super().get_config(), "axis": self.axis, "keepdims": self.keepdims}


class LogicalOr(Maximum):
    """Keras 3's ``logical_or`` of two tensors (each true where not 0), as 1.0 and 0.0."""

    def lower(self, builder: PlanBuilder, xs: list) -> Value:
        xs = [_as_boolean(builder, x, self._what()) for x in xs]
        return _boolean(builder, super().lower(builder, xs))


class LogicalAnd(Minimum):
    """Keras 3's ``logical_and`` of two tensors (each true where not 0), as 1.0 and 0.0."""

    def lower(self, builder: PlanBuilder, xs: list) -> Value:
        xs = [_as_boolean(builder, x, self._what()) for x in xs]
        return _boolean(builder, super().lower(builder, xs))


class ExpandDims(Layer):
    """Keras 3's ``expand_dims(x, axis)``: an axis of size 1 inserted (the values unchanged; a mask
    stays a mask).

    Args:
        axis: where the new axis goes, counted from the batch axis (negative from after the last):
            any place after the batch axis.
        name: the layer's name.

    Raises:
        ValueError: ``axis`` is not an integer.
    """

    reusable_on_other_shapes = True

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "ExpandDims":
        axis = config.get("axis")
        if not isinstance(axis, int) or isinstance(axis, bool):
            raise NotConvertible(f"over the axes {axis!r} (malinn inserts one axis)")
        return cls(axis, name=keras.name)

    def __init__(self, axis: int = -1, name: str | None = None):
        super().__init__(name)
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise ValueError(f"ExpandDims {self.name!r}: axis must be an integer, got {axis!r}")
        self.axis = axis

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        axis = self.axis + len(shape) + 1 if self.axis < 0 else self.axis
        if not 1 <= axis <= len(shape):
            raise ValueError(
                f"ExpandDims {self.name!r}: axis {self.axis} is not after the batch axis of inputs of shape {shape}"
            )
        return shape[:axis] + (1,) + shape[axis:]

    def lower(self, builder: PlanBuilder, x: Value) -> Value:
        out = kinds.reshape(builder, x, self.compute_output_shape(x.shape), what=self._what())
        return _boolean(builder, out) if _zero_ones(builder).get(id(x)) is x else out

    def get_config(self) -> dict:
        return {**super().get_config(), "axis": self.axis}


class ZerosLike(Layer):
    """Keras 3's ``zeros_like(x)``: a tensor of ``x``'s shape holding 0.0 (Keras's ``False`` where
    its ``dtype`` is ``"bool"``: a Concatenate's mask ORs a mask with it to broadcast the mask over
    the input's features).

    Computed from ``x`` whatever it holds (NaN and infinities too): whether each element differs
    from 0, then times 0 plus :attr:`fill` (two small steps).

    Args:
        dtype: ``None``, ``"bool"`` or a float dtype (malinn holds every one as float32).
        name: the layer's name.
    """

    fill = 0.0
    #: the dtypes of Keras's config that are its output's, not a policy of float variables
    keras_output_dtypes = ("bool",)
    reusable_on_other_shapes = True

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "ZerosLike":
        dtype = config.get("dtype")
        return cls(dtype if isinstance(dtype, str) else None, name=keras.name)

    def __init__(self, dtype: str | None = None, name: str | None = None):
        super().__init__(name)
        self.dtype = dtype

    def lower(self, builder: PlanBuilder, x: Value) -> Value:
        what = self._what()
        column = kinds.reshape(builder, x, tuple(x.shape) + (1,), what=what)
        known = kinds.any_not_equal(builder, column, 0.0, shape=x.shape, what=what)  # 0 or 1, never NaN
        width = x.shape[-1]
        scale = Vector(f"{what} scale", np.zeros(width), self.device_copies)
        shift = Vector(f"{what} fill", np.full(width, self.fill), self.device_copies)
        return _boolean(builder, kinds.affine(builder, known, scale, shift, what=what))

    def get_config(self) -> dict:
        return {**super().get_config(), "dtype": self.dtype}


class OnesLike(ZerosLike):
    """Keras 3's ``ones_like(x)``: a tensor of ``x``'s shape holding 1.0 (``True`` with ``dtype``
    ``"bool"``: the mask a Concatenate gives an input without one). Arguments as :class:`ZerosLike`."""

    fill = 1.0
