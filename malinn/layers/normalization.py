"""Normalization layers at inference: ``BatchNormalization`` (a per-feature affine step on any axis),
``LayerNormalization`` and ``UnitNormalization`` (one kernel each, over any axes)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..plan import kinds
from ..plan.tensors import Vector
from .axes import axis_argument, broadcast_shape, resolve_axes, trailing_vector
from .base import Layer, numeric_weights, ones, write_weights, zeros
from .keras_config import KerasContext, with_axis_shifted

if TYPE_CHECKING:
    from ..library.kernel_library import KernelSpec
    from ..plan.builder import PlanBuilder
    from ..plan.tensors import Value

__all__ = ["BatchNormalization", "LayerNormalization", "UnitNormalization"]


class BatchNormalization(Layer):
    """``gamma * (x - moving_mean) / sqrt(moving_variance + epsilon) + beta`` per feature of ``axis``.

    At conversion a BatchNormalization on the last axis right after a linear Dense is folded into
    that Dense's weights; the plan fuses one after an activated Dense into that Dense's kernel
    where the kernel can; others run as one scale-and-shift kernel (on another axis: the
    ``broadcast`` kernel, the per-feature values repeated over the axes after it).

    Args:
        axis: the features' axis (Keras's, the batch axis being 0; default the last).
        epsilon: added to the variance, >= 0 (0 as Keras takes it: a zero variance then gives inf or NaN).
        center: whether the layer has ``beta``.
        scale: whether the layer has ``gamma``.
        name: the layer's name.

    Raises:
        ValueError: ``epsilon`` is not a positive number.
    """

    weight_names = ("gamma", "beta", "moving_mean", "moving_variance")

    #: called with training=True, Keras normalizes by the batch's own statistics
    keras_training_dependent = ("BatchNormalization",)

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "BatchNormalization":
        return cls(
            epsilon=float(config.get("epsilon", 1e-3)),
            center=bool(config.get("center", True)),
            scale=bool(config.get("scale", True)),
            axis=config.get("axis", -1),
            name=keras.name,
        )

    @classmethod
    def from_keras_time_distributed(cls, config: dict, keras: KerasContext) -> "BatchNormalization":
        return cls.from_keras_config(with_axis_shifted(config), keras)

    def __init__(
        self, epsilon: float = 1e-3, center: bool = True, scale: bool = True, axis: Any = -1, name: str | None = None
    ):
        super().__init__(name)
        axis = axis_argument(axis, f"BatchNormalization {self.name!r}")
        if isinstance(axis, tuple) and len(axis) != 1:
            raise ValueError(f"BatchNormalization {self.name!r}: one features axis, not {list(axis)}")
        self.axis = axis[0] if isinstance(axis, tuple) else axis
        if not isinstance(epsilon, (int, float)) or isinstance(epsilon, bool) or not 0 <= epsilon < float("inf"):
            raise ValueError(
                f"BatchNormalization {self.name!r}: epsilon must be a number >= 0 (Keras's), got {epsilon!r}"
            )
        self.epsilon, self.center, self.scale = float(epsilon), bool(center), bool(scale)
        self.gamma: np.ndarray | None = None
        self.beta: np.ndarray | None = None
        self.moving_mean: np.ndarray | None = None
        self.moving_variance: np.ndarray | None = None

    @property
    def features(self) -> int | None:
        return None if self.input_shape is None else self.input_shape[self._axis() - 1]

    def _axis(self) -> int:
        """The features' axis, positive (the batch axis is 0), for the built input."""
        return resolve_axes(self.axis, len(self._built_shape()) + 1, f"BatchNormalization {self.name!r}")[0]

    @property
    def on_last_axis(self) -> bool:
        return self.input_shape is not None and self._axis() == len(self.input_shape)

    def _features(self) -> int:
        """:attr:`features` of the built layer."""
        return self._built_shape()[self._axis() - 1]

    def build(self, input_shape: Any) -> None:
        super().build(input_shape)
        features = self._features()
        self.gamma = ones(features) if self.scale else None
        self.beta = zeros(features) if self.center else None
        self.moving_mean, self.moving_variance = zeros(features), ones(features)

    def set_weights(self, weights: Iterable[Any]) -> None:
        """Sets ``[gamma?, beta?, moving_mean, moving_variance]`` (gamma/beta as scale/center say).

        Raises:
            ValueError: the count or a shape is wrong.
        """
        weights = numeric_weights(weights, self._what())
        want = self.scale + self.center + 2
        if len(weights) != want:
            raise ValueError(f"BatchNormalization {self.name!r} expects {want} weight arrays, got {len(weights)}")
        dim = weights[-1].shape[0] if weights[-1].ndim == 1 else None
        if dim is None or any(w.shape != (dim,) for w in weights) or (self.built and dim != self.features):
            raise ValueError(
                f"BatchNormalization {self.name!r}: weight shapes {[w.shape for w in weights]} "
                f"are not all ({self.features if self.built else 'features'},)"
            )
        if not self.built:
            Layer.build(self, (None, dim))
        it = iter(weights)
        self.gamma = next(it).copy() if self.scale else None
        self.beta = next(it).copy() if self.center else None
        self.moving_mean, self.moving_variance = next(it).copy(), next(it).copy()
        self._weights_changed()

    def scale_shift(self) -> tuple[np.ndarray, np.ndarray]:
        """The folded per-feature ``(scale, shift)``: ``y = x * scale + shift``, computed in float64."""
        assert self.moving_mean is not None and self.moving_variance is not None, f"{self._what()} is not built"
        gamma = self.gamma.astype(np.float64) if self.gamma is not None and self.scale else 1.0
        beta = self.beta.astype(np.float64) if self.beta is not None and self.center else 0.0
        with np.errstate(divide="ignore", invalid="ignore"):  # epsilon 0 and a zero variance: inf, as Keras's rsqrt
            s = gamma / np.sqrt(self.moving_variance.astype(np.float64) + self.epsilon)
        shift = beta - self.moving_mean.astype(np.float64) * s
        features = self._features()
        return (
            np.broadcast_to(s, (features,)).astype(np.float32),
            np.broadcast_to(shift, (features,)).astype(np.float32),
        )

    def feature_affine(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(scale, shift)`` per feature of the last axis (what a Dense before it can absorb), or None."""
        return self.scale_shift() if self.on_last_axis else None

    def lower(self, builder: PlanBuilder, x: Value) -> Value:
        if x.shape[self._axis()] != self.features:
            raise ValueError(
                f"BatchNormalization {self.name!r} was built for {self.features} features on axis "
                f"{self._axis()}, but receives shape {x.shape}"
            )
        s, t = self.scale_shift()
        if not self.on_last_axis:
            where = broadcast_shape(self._built_shape(), (self._axis(),))
            (scale, period), (shift, _) = (
                trailing_vector(v.reshape(where), self._built_shape(), self._what()) for v in (s, t)
            )
            return kinds.broadcast(
                builder,
                x,
                0,
                Vector(f"layer {self.name!r} scale", scale, self.device_copies),
                Vector(f"layer {self.name!r} shift", shift, self.device_copies),
                period,
                what=self._what(),
            )
        return kinds.affine(
            builder,
            x,
            Vector(f"layer {self.name!r} scale", s, self.device_copies),
            Vector(f"layer {self.name!r} shift", t, self.device_copies),
            what=self._what(),
        )

    def save_own_variables(self, store: Any, target: KernelSpec) -> None:
        for name in ("gamma", "beta", "moving_mean", "moving_variance"):
            value = getattr(self, name)
            if value is not None:
                write_weights(store, name, value)

    def load_own_variables(self, store: Any) -> None:
        self.set_weights(
            [
                np.asarray(store[n][()], np.float32)
                for n in ("gamma", "beta", "moving_mean", "moving_variance")
                if n in store
            ]
        )

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "epsilon": self.epsilon,
            "center": self.center,
            "scale": self.scale,
            "axis": self.axis,
        }


class LayerNormalization(Layer):
    """Keras's LayerNormalization: each sample normalized over ``axis`` (one or several axes) to
    mean 0 and variance 1, then ``* gamma + beta``; one kernel (kernels/normalize_axes.cl).

    Computed as ``inv = rsqrt(variance + epsilon) * gamma``, ``(x - mean) * inv + beta``, the
    variance as the mean squared deviation, ``x - mean`` as ``(x - x0) - (mean - x0)`` (``x0`` the
    group's first element): a constant sample gives beta exactly, an offset one (1e4 + noise) keeps
    its noise's precision, and values near the largest float do not overflow the sums. Keras 3
    writes ``x * inv + (beta - mean * inv)`` (tf_keras's fused kernel subtracts first, as here):
    equal within float32 rounding, but its two products cancel far from zero (a constant 1e10 gives
    0 there for beta). ``rms_scaling=True`` gives ``x * rsqrt(variance + epsilon) * gamma`` (no
    centering, no beta), as Keras 3 does.

    Args:
        axis: the axis or axes (Keras's, the batch axis being 0); default the last.
        epsilon: added to the variance, >= 0 (0 as Keras takes it: a zero variance then gives inf or NaN).
        center: whether the layer has ``beta``; scale: whether it has ``gamma``.
        rms_scaling: Keras 3's RMS scaling (implies no ``beta``, and ``gamma`` whatever ``scale``
            says, as Keras 3 builds it).
        name: the layer's name.

    Raises:
        ValueError: a bad axis or an epsilon that is not a number >= 0.
    """

    weight_names = ("gamma", "beta")

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "LayerNormalization":
        return cls(
            axis=config.get("axis", -1),
            epsilon=float(config.get("epsilon", 1e-3)),
            center=bool(config.get("center", True)),
            scale=bool(config.get("scale", True)),
            rms_scaling=bool(config.get("rms_scaling", False)),
            name=keras.name,
        )

    @classmethod
    def from_keras_time_distributed(cls, config: dict, keras: KerasContext) -> "LayerNormalization":
        return cls.from_keras_config(with_axis_shifted(config), keras)

    def __init__(
        self,
        axis: Any = -1,
        epsilon: float = 1e-3,
        center: bool = True,
        scale: bool = True,
        rms_scaling: bool = False,
        name: str | None = None,
    ):
        super().__init__(name)
        self.axis = axis_argument(axis, f"LayerNormalization {self.name!r}")
        if not isinstance(epsilon, (int, float)) or isinstance(epsilon, bool) or not 0 <= epsilon < float("inf"):
            raise ValueError(
                f"LayerNormalization {self.name!r}: epsilon must be a number >= 0 (Keras's), got {epsilon!r}"
            )
        self.epsilon, self.rms_scaling = float(epsilon), bool(rms_scaling)
        self.center, self.scale = bool(center) and not self.rms_scaling, bool(scale) or self.rms_scaling
        self.gamma: np.ndarray | None = None
        self.beta: np.ndarray | None = None

    def _axes(self) -> tuple:
        return resolve_axes(self.axis, len(self._built_shape()) + 1, f"LayerNormalization {self.name!r}")

    @property
    def param_shape(self) -> tuple:
        """gamma's and beta's shape: the sizes of the axes, ``axis`` sorted as Keras sorts it (the
        numbers as given: ``[2, 1]`` is ``(size 1, size 2)``, ``[1, -1]`` is ``(size -1, size 1)``);
        their values are read in the axes' order in the tensor, as Keras reshapes them."""
        items = tuple(sorted(self.axis)) if isinstance(self.axis, tuple) else (self.axis,)
        shape = self._built_shape()
        rank = len(shape) + 1
        return tuple(shape[(a + rank if a < 0 else a) - 1] for a in items)

    def build(self, input_shape: Any) -> None:
        super().build(input_shape)
        shape = (self._axes(), self.param_shape)[1]
        self.gamma = ones(shape) if self.scale else None
        self.beta = zeros(shape) if self.center else None

    def set_weights(self, weights: Iterable[Any]) -> None:
        """Sets ``[gamma?, beta?]`` (as ``scale`` and ``center`` say), each of :attr:`param_shape`.

        Raises:
            ValueError: the layer is not built, or the count or a shape is wrong.
        """
        weights = numeric_weights(weights, self._what())
        if not self.built:
            raise ValueError(f"LayerNormalization {self.name!r}: build the layer before setting its weights")
        if len(weights) != self.scale + self.center or any(w.shape != self.param_shape for w in weights):
            raise ValueError(
                f"LayerNormalization {self.name!r} expects {self.scale + self.center} weight arrays of "
                f"shape {self.param_shape}, got {[w.shape for w in weights]}"
            )
        it = iter(weights)
        self.gamma = next(it).copy() if self.scale else None
        self.beta = next(it).copy() if self.center else None
        self._weights_changed()

    def lower(self, builder: PlanBuilder, x: Value) -> Value:
        gamma, beta = (
            None if w is None else Vector(f"layer {self.name!r} {label}", w.reshape(-1), self.device_copies)
            for label, w in (("gamma", self.gamma), ("beta", self.beta))
        )
        return kinds.normalize(
            builder,
            x,
            "rms" if self.rms_scaling else "layer",
            self._axes(),
            self.epsilon,
            gamma,
            beta,
            what=self._what(),
        )

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "axis": list(self.axis) if isinstance(self.axis, tuple) else self.axis,
            "epsilon": self.epsilon,
            "center": self.center,
            "scale": self.scale,
            "rms_scaling": self.rms_scaling,
        }


class UnitNormalization(Layer):
    """Keras's UnitNormalization: each sample divided by its L2 norm over ``axis``,
    ``x / max(norm, epsilon)``; one kernel (kernels/normalize_axes.cl).

    Args:
        axis: the axis or axes (Keras's, the batch axis being 0); default the last.
        epsilon: the smallest norm divided by (Keras 3: 1e-12; tf_keras: 1e-6, the square root
            of the 1e-12 it puts under the root).
        name: the layer's name.

    Raises:
        ValueError: a bad axis or an epsilon that is not a number >= 0.
    """

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "UnitNormalization":
        # Keras 3: x / max(norm, 1e-12); tf_keras: x * rsqrt(max(norm^2, 1e-12)); neither saves it
        return cls(axis=config.get("axis", -1), epsilon=1e-12 if keras.keras_major >= 3 else 1e-6, name=keras.name)

    @classmethod
    def from_keras_time_distributed(cls, config: dict, keras: KerasContext) -> "UnitNormalization":
        return cls.from_keras_config(with_axis_shifted(config), keras)

    def __init__(self, axis: Any = -1, epsilon: float = 1e-12, name: str | None = None):
        super().__init__(name)
        self.axis = axis_argument(axis, f"UnitNormalization {self.name!r}")
        if not isinstance(epsilon, (int, float)) or isinstance(epsilon, bool) or not epsilon > 0:
            raise ValueError(f"UnitNormalization {self.name!r}: epsilon must be a positive number, got {epsilon!r}")
        self.epsilon = float(epsilon)

    def build(self, input_shape: Any) -> None:
        super().build(input_shape)
        resolve_axes(self.axis, len(self._built_shape()) + 1, f"UnitNormalization {self.name!r}")

    def lower(self, builder: PlanBuilder, x: Value) -> Value:
        axes = resolve_axes(self.axis, len(x.shape), f"UnitNormalization {self.name!r}")
        return kinds.normalize(builder, x, "unit", axes, self.epsilon**2, what=self._what())

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "axis": list(self.axis) if isinstance(self.axis, tuple) else self.axis,
            "epsilon": self.epsilon,
        }
