"""Keras's preprocessing layers that compute on numbers: ``Rescaling`` (``x * scale + offset``) and
``Normalization`` (``(x - mean) / sqrt(variance)`` with the stored statistics)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..plan import kinds
from ..plan.tensors import Vector
from .axes import axis_argument, broadcast_shape, resolve_axes, trailing_vector
from .base import Layer, numeric_weights, ones, zeros
from .keras_config import KerasContext, with_axis_shifted

if TYPE_CHECKING:
    from ..plan.builder import PlanBuilder
    from ..plan.tensors import Value

__all__ = ["Rescaling", "Normalization"]

#: Keras's backend.epsilon(): Normalization divides by at least this
EPSILON = 1e-7


def _vectors(layer: Layer, pairs: Iterable[tuple[str, Any]], sample: tuple) -> tuple:
    """``Vector``s of the trailing-axes expansion of each ``(label, values)`` and their period."""
    out, period = [], 1
    for label, values in pairs:
        vector, period = trailing_vector(values, sample, layer._what())
        out.append(Vector(f"layer {layer.name!r} {label}", vector, layer.device_copies))
    return out, period


def _lower_affine(layer: Layer, builder: PlanBuilder, x: Value, form: int, scale: Any, shift: Any) -> Value:
    """``x * scale + shift`` (form 0) or ``(x + shift) * scale`` (form 1), the parameters broadcast
    against the sample: the fusable per-feature affine step where form 0 varies only along the last axis."""
    scale, shift = np.broadcast_arrays(np.asarray(scale, np.float64), np.asarray(shift, np.float64))
    (s, t), period = _vectors(layer, (("scale", scale), ("shift", shift)), layer._built_shape())
    if form == 0 and period == 1:
        return kinds.affine(builder, x, s, t, what=layer._what())
    return kinds.broadcast(builder, x, form, s, t, period, what=layer._what())


def _per_feature(values: Any, features: int) -> np.ndarray | None:
    """``values`` as one value per feature of the last axis, or None where they vary along another."""
    values = np.asarray(values, np.float64)
    if values.size in (1, features) and all(d == 1 for d in values.shape[:-1]):
        return np.broadcast_to(values.reshape(-1), (features,)).copy()
    return None


class Rescaling(Layer):
    """``x * scale + offset`` (Keras's Rescaling), ``scale`` and ``offset`` numbers or arrays that
    broadcast against a sample.

    Raises:
        ValueError: ``scale`` or ``offset`` is not finite.
    """

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "Rescaling":
        return cls(config.get("scale", 1.0), config.get("offset", 0.0), name=keras.name)

    def __init__(self, scale: Any, offset: Any = 0.0, name: str | None = None):
        super().__init__(name)
        self.scale, self.offset = (np.asarray(v, np.float64) for v in (scale, offset))
        if not (np.isfinite(self.scale).all() and np.isfinite(self.offset).all()):
            raise ValueError(f"Rescaling {self.name!r}: scale and offset must be finite, got {scale!r}, {offset!r}")

    def build(self, input_shape: Any) -> None:
        super().build(input_shape)
        for values in (self.scale, self.offset):
            trailing_vector(values, self._built_shape(), self._what())

    def feature_affine(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(scale, shift)`` per feature of the last axis, or None where they vary along another."""
        s, t = (_per_feature(v, self._built_shape()[-1]) for v in (self.scale, self.offset))
        return None if s is None or t is None else (s.astype(np.float32), t.astype(np.float32))

    def lower(self, builder: PlanBuilder, x: Value) -> Value:
        return _lower_affine(self, builder, x, 0, self.scale, self.offset)

    def get_config(self) -> dict:
        return {**super().get_config(), "scale": self.scale.tolist(), "offset": self.offset.tolist()}


class Normalization(Layer):
    """``(x - mean) / max(sqrt(variance), 1e-7)`` (Keras's Normalization), the statistics per index of
    ``axis`` (the kept axes); ``invert=True`` gives ``mean + x * max(sqrt(variance), 1e-7)``.

    Weights: ``[mean, variance, count]``, mean and variance of the kept axes' sizes (Keras's, for
    statistics set after it is built: an adapted layer's); none where ``mean`` and ``variance`` are
    given (Keras's too: they are then part of the config, and the layer counts no parameters).

    Args:
        axis: the kept axis or axes (Keras's, the batch axis being 0), or None for one mean.
        mean: the mean, as Keras takes it: of the kept axes' sizes, or anything that broadcasts to
            the sample's shape with 1 on the reduced axes; with ``variance``, or neither.
        variance: the variance, likewise.
        invert: undo the normalization instead.
        name: the layer's name.

    Raises:
        ValueError: a bad axis, or one of ``mean`` and ``variance`` without the other, or not numeric.
    """

    weight_names: tuple[str, ...] = ("mean", "variance", "count")

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "Normalization":
        given = config.get("mean") is not None and not keras.has_weights  # statistics in the config, as Keras's
        return cls(
            axis=config.get("axis", -1),
            invert=bool(config.get("invert", False)),
            mean=config["mean"] if given else None,
            variance=config["variance"] if given else None,
            name=keras.name,
        )

    @classmethod
    def from_keras_time_distributed(cls, config: dict, keras: KerasContext) -> "Normalization":
        return cls.from_keras_config(with_axis_shifted(config), keras)

    def __init__(
        self, axis: Any = -1, mean: Any = None, variance: Any = None, invert: bool = False, name: str | None = None
    ):
        super().__init__(name)
        self.axis = (
            None if axis is None or axis == () or axis == [] else axis_argument(axis, f"Normalization {self.name!r}")
        )
        self.invert = bool(invert)
        if (mean is None) != (variance is None):
            raise ValueError(
                f"Normalization {self.name!r}: give both mean and variance, or neither (got only "
                f"{'mean' if variance is None else 'variance'})"
            )
        #: the statistics given to the constructor (Keras's config), else None
        self.given = None if mean is None else tuple(numeric_weights([mean, variance], f"Normalization {self.name!r}"))
        if self.given is not None:
            self.weight_names = ()
        self.mean: np.ndarray | None = None
        self.variance: np.ndarray | None = None
        self.count = np.zeros((), np.float32)

    def _kept(self) -> tuple:
        if self.axis is None:
            return ()
        return resolve_axes(self.axis, len(self._built_shape()) + 1, f"Normalization {self.name!r}")

    @property
    def stat_shape(self) -> tuple:
        """mean's and variance's shape: the kept axes' sizes, in axis order."""
        shape = self._built_shape()
        return tuple(shape[a - 1] for a in self._kept())

    def build(self, input_shape: Any) -> None:
        super().build(input_shape)
        if self.given is not None:
            self.mean, self.variance = self._statistics(self.given)
            for array in (self.mean, self.variance):
                array.flags.writeable = False
        else:
            self.mean, self.variance = zeros(self.stat_shape), ones(self.stat_shape)

    def _statistics(self, arrays: Iterable[np.ndarray]) -> list:
        """``[mean, variance]`` of :attr:`stat_shape` from arrays in either of Keras's forms.

        Raises:
            ValueError: an array fits neither.
        """
        where = broadcast_shape(self._built_shape(), self._kept())
        stats = []
        squeezed = tuple(d for d in self.stat_shape if d != 1)
        for w in arrays:
            if tuple(d for d in w.shape if d != 1) == squeezed:  # the same values, axes of 1 aside
                stats.append(w.reshape(self.stat_shape).copy())
                continue
            try:
                stats.append(np.broadcast_to(w, where).reshape(self.stat_shape).copy())
            except ValueError:
                raise ValueError(
                    f"Normalization {self.name!r}: statistics of shape {w.shape} do not fit {self.stat_shape}"
                ) from None
        return stats

    def set_weights(self, weights: Iterable[Any]) -> None:
        """Sets ``[mean, variance]`` or ``[mean, variance, count]``: mean and variance of
        :attr:`stat_shape`, or anything that broadcasts to the sample's shape with 1 on the reduced
        axes (what Keras accepts as the ``mean`` and ``variance`` arguments). A layer given its
        statistics in the constructor has no weights (``[]`` only, as Keras's).

        Raises:
            ValueError: the layer is not built, or the count or a shape is wrong.
        """
        if self.given is not None:
            return Layer.set_weights(self, weights)
        weights = numeric_weights(weights, f"Normalization {self.name!r}")
        if not self.built or len(weights) not in (2, 3):
            raise ValueError(
                f"Normalization {self.name!r} expects [mean, variance(, count)] of a built layer, "
                f"got {len(weights)} arrays"
            )
        self.mean, self.variance = self._statistics(weights[:2])
        if len(weights) == 3 and weights[2].size != 1:
            raise ValueError(
                f"Normalization {self.name!r}: count must be one number, got an array of shape {weights[2].shape}"
            )
        self.count = weights[2].reshape(()).copy() if len(weights) == 3 else np.zeros((), np.float32)
        self._weights_changed()

    def _scale_shift(self) -> tuple[np.ndarray, np.ndarray]:
        """The statistics as broadcastable ``(divisor, mean)`` in float64."""
        where = broadcast_shape(self._built_shape(), self._kept())
        assert self.mean is not None and self.variance is not None, f"{self._what()} is not built"
        mean = self.mean.astype(np.float64).reshape(where)
        divisor = np.maximum(np.sqrt(self.variance.astype(np.float64)), EPSILON).reshape(where)
        return divisor, mean

    def feature_affine(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(scale, shift)`` per feature of the last axis (``x / d - mean / d``), or None."""
        divisor, mean = self._scale_shift()
        features = self._built_shape()[-1]
        d, m = _per_feature(divisor, features), _per_feature(mean, features)
        if d is None or m is None:
            return None
        return (d if self.invert else 1.0 / d).astype(np.float32), (m if self.invert else -m / d).astype(np.float32)

    def lower(self, builder: PlanBuilder, x: Value) -> Value:
        divisor, mean = self._scale_shift()
        if self.invert:
            return _lower_affine(self, builder, x, 0, divisor, mean)
        return _lower_affine(self, builder, x, 1, 1.0 / divisor, -mean)

    def get_config(self) -> dict:
        axis = list(self.axis) if isinstance(self.axis, tuple) else self.axis
        given = {} if self.given is None else {"mean": self.given[0].tolist(), "variance": self.given[1].tolist()}
        return {**super().get_config(), "axis": axis, **given, "invert": self.invert}
