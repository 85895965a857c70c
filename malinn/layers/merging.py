"""Merge layers: several inputs, one output, as Keras's ``Add``, ``Subtract``, ``Multiply``,
``Average``, ``Maximum``, ``Minimum``, ``Concatenate`` and ``Dot``.

They are called on a list of tensors in a Functional model (``Add()([a, b])``); ``build`` and
``compute_output_shape`` take a list of shapes and ``lower`` a list of plan values. The element-wise
ones broadcast as Keras does (a sample of lower rank gains axes of 1 after the batch axis, then axes
of 1 stretch) and run as one in-place kernel per further input; Concatenate writes each input into
its slice of one buffer (or its Dense writes it there: a view, :meth:`PlanBuilder.compile`); Dot is
one kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from ..plan import kinds
from ..plan.tensor import format_shape
from ..plan.tensors import broadcast_shape
from .base import Layer
from .keras_config import KerasContext

_M = TypeVar("_M", bound="_MultiInput")

__all__ = ["Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum", "Concatenate", "Dot"]


def _shapes(layer: Layer, input_shape: Any, count: int | None = None) -> list:
    """``input_shape`` as a list of shapes (batch axis first), or a ValueError naming the layer."""
    if (
        not isinstance(input_shape, (list, tuple))
        or not input_shape
        or not all(isinstance(s, (list, tuple)) and len(s) >= 2 for s in input_shape)
    ):
        raise ValueError(f"{type(layer).__name__} {layer.name!r} takes a list of inputs, got {input_shape!r}")
    shapes = [tuple(s) for s in input_shape]
    if count is not None and len(shapes) != count or len(shapes) < 2:
        want = f"exactly {count}" if count is not None else "at least 2"
        raise ValueError(f"{type(layer).__name__} {layer.name!r} takes {want} inputs, got {len(shapes)}")
    return shapes


class _MultiInput(Layer):
    """A layer of several inputs: ``input_shapes`` holds each one's sample shape once built.

    ``keras_mask_merge`` says how Keras merges its inputs' masks (:mod:`malinn.layers.masking`):
    ``"and"`` (tf_keras: the masks present ANDed) or ``"or"`` (Keras 3: ORed where every input has
    one), set from the Keras generation of a converted file and kept in its config.
    """

    count: int | None = None  # the number of inputs it takes, where fixed
    keras_mask_merge = "and"

    def __init__(self, name: str | None = None):
        super().__init__(name)
        self.input_shapes: list | None = None

    def build(self, input_shape: Any) -> None:
        shapes = _shapes(self, input_shape, self.count)
        self.compute_output_shape(shapes)  # validates
        self.input_shapes = [s[1:] for s in shapes]
        self.input_shape = None
        self.built = True
        self._weights_changed()

    def _mask_merge_of(self: _M, keras: KerasContext) -> _M:
        """This layer with the mask rule of the Keras generation that saved it; returns it."""
        self.keras_mask_merge = "or" if keras.keras_major >= 3 else "and"
        return self

    def get_config(self) -> dict:
        config = super().get_config()
        if self.keras_mask_merge != "and":
            config["keras_mask_merge"] = self.keras_mask_merge
        return config

    @classmethod
    def from_config(cls, config: dict) -> "Layer":
        config = dict(config)
        rule = config.pop("keras_mask_merge", "and")
        if rule not in ("and", "or"):
            raise ValueError(f"{cls.__name__}: keras_mask_merge must be 'and' or 'or', got {rule!r}")
        layer = cls(**config)
        layer.keras_mask_merge = rule
        return layer


class _ElementwiseMerge(_MultiInput):
    """An element-wise merge of two or more inputs of broadcastable shapes."""

    op = ""
    keras_config_keys = ()  # Keras's config holds nothing else that changes what it computes

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> Layer:
        return cls(name=keras.name)._mask_merge_of(keras)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shapes = _shapes(self, input_shape, self.count)
        return (None,) + broadcast_shape([(1,) + tuple(s[1:]) for s in shapes], f"{type(self).__name__} {self.name!r}")[
            1:
        ]

    def lower(self, builder, xs):
        return kinds.merge(builder, list(xs), self.op, what=self._what())


class Add(_ElementwiseMerge):
    """The sum of its inputs."""

    op = "add"


class Subtract(_ElementwiseMerge):
    """The first input minus the second (exactly two inputs)."""

    op, count = "subtract", 2


class Multiply(_ElementwiseMerge):
    """The product of its inputs."""

    op = "multiply"


class Average(_ElementwiseMerge):
    """The mean of its inputs (their sum divided by their number, as Keras computes it)."""

    op = "average"


class Maximum(_ElementwiseMerge):
    """The element-wise maximum of its inputs."""

    op = "maximum"


class Minimum(_ElementwiseMerge):
    """The element-wise minimum of its inputs."""

    op = "minimum"


class Concatenate(_MultiInput):
    """Its inputs joined along ``axis`` (any axis but the batch axis; the others must agree).

    Args:
        axis: the axis (negative counts from the last, as in Keras; default -1).
        name: the layer's name.

    Raises:
        ValueError: ``axis`` is not an integer.
    """

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "Concatenate":
        return cls(axis=int(config.get("axis", -1)), name=keras.name)._mask_merge_of(keras)

    def __init__(self, axis: int = -1, name: str | None = None):
        super().__init__(name)
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise ValueError(f"Concatenate {self.name!r}: axis must be an integer, got {axis!r}")
        self.axis = axis

    def _axis(self, rank: int) -> int:
        axis = self.axis + rank if self.axis < 0 else self.axis
        if not 1 <= axis < rank:
            raise ValueError(
                f"Concatenate {self.name!r}: axis {self.axis} is not a sample axis of inputs of rank {rank}"
            )
        return axis

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shapes = _shapes(self, input_shape)
        rank = len(shapes[0])
        axis = self._axis(rank)
        if any(
            len(s) != rank or s[1:axis] + s[axis + 1 :] != shapes[0][1:axis] + shapes[0][axis + 1 :] for s in shapes
        ):
            raise ValueError(
                f"Concatenate {self.name!r}: inputs of shapes "
                f"{', '.join(format_shape(s) for s in shapes)} differ off axis {self.axis}"
            )
        return (None,) + tuple(shapes[0][1:axis]) + (sum(s[axis] for s in shapes),) + tuple(shapes[0][axis + 1 :])

    def lower(self, builder, xs):
        return kinds.concat(builder, list(xs), self._axis(len(xs[0].shape)), what=self._what())

    def get_config(self) -> dict:
        return {**super().get_config(), "axis": self.axis}


class Dot(_MultiInput):
    """Keras's ``Dot``: the dot product of two inputs (rank 2 or 3, batch first) along ``axes``,
    sample by sample (``batch_dot``).

    Args:
        axes: one axis for both inputs, or a pair (negative counts from the last).
        normalize: L2-normalise both inputs along the axes first.
        epsilon: the least norm ``normalize`` divides by (Keras 3: 1e-7; tf_keras's l2_normalize:
            1e-6, the root of its 1e-12 on the squares).
        name: the layer's name.

    Raises:
        ValueError: ``axes`` is not an integer or a pair of them.
    """

    count = 2

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "Dot":
        axes: Any = config.get("axes")
        axes = [int(a) for a in axes] if isinstance(axes, (list, tuple)) else int(axes)
        # the least norm normalize divides by: Keras 3's epsilon; tf_keras's l2_normalize floors the squares at 1e-12
        return cls(
            axes,
            normalize=bool(config.get("normalize", False)),
            epsilon=1e-7 if keras.keras_major >= 3 else 1e-6,
            name=keras.name,
        )

    def __init__(
        self, axes: int | Sequence[int], normalize: bool = False, epsilon: float = 1e-7, name: str | None = None
    ):
        super().__init__(name)
        pair = tuple(axes) if isinstance(axes, (list, tuple)) else (axes, axes)
        if len(pair) != 2 or any(isinstance(a, bool) or not isinstance(a, int) for a in pair):
            raise ValueError(f"Dot {self.name!r}: axes must be an integer or a pair of integers, got {axes!r}")
        self.axes, self.normalize, self.epsilon = axes, bool(normalize), float(epsilon)

    def _axes(self, shapes: Sequence[tuple]) -> tuple:
        pair = tuple(self.axes) if isinstance(self.axes, (list, tuple)) else (self.axes, self.axes)
        return tuple(a % len(s) if a < 0 else a for a, s in zip(pair, shapes))

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shapes = _shapes(self, input_shape, 2)
        ax, ay = self._axes(shapes)
        x, y = shapes
        if not (2 <= len(x) <= 3 and 2 <= len(y) <= 3) or not (1 <= ax < len(x) and 1 <= ay < len(y)) or x[ax] != y[ay]:
            raise ValueError(
                f"Dot {self.name!r}: malinn takes the dot product of inputs of rank 2 or 3 along axes "
                f"of equal size, not {format_shape(x)} and {format_shape(y)} along axes {[ax, ay]}"
            )
        out = [d for i, d in enumerate(x[1:], 1) if i != ax] + [d for i, d in enumerate(y[1:], 1) if i != ay]
        return (None,) + tuple(out or [1])

    def lower(self, builder, xs):
        x, y = xs
        return kinds.batch_dot(
            builder, x, y, self._axes([x.shape, y.shape]), self.normalize, self.epsilon**2, what=self._what()
        )

    def get_config(self) -> dict:
        axes = list(self.axes) if isinstance(self.axes, (list, tuple)) else self.axes
        return {**super().get_config(), "axes": axes, "normalize": self.normalize, "epsilon": self.epsilon}
