"""Activation layers: ``Activation(name)`` and the parametrised ``ReLU``, ``LeakyReLU``, ``ELU``,
``ThresholdedReLU``, ``PReLU``, ``Softmax``. Each applies its function element-wise (softmax over
one or several axes) on the device."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..library.kernel_library import load_library
from ..plan import kinds
from ..plan.tensors import Vector
from .axes import axis_argument, resolve_axes, trailing_vector
from .base import Layer, numeric_weights, zeros
from .keras_config import KerasContext, keras_activation, shifted_axes, with_axis_shifted

__all__ = ["Activation", "ReLU", "LeakyReLU", "ELU", "ThresholdedReLU", "PReLU", "Softmax", "get_activation"]


def _finite(layer: str, label: str, value: Any) -> float:
    """``value`` as a float, or a ValueError naming the layer and the parameter."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{layer}: {label} must be a finite number, got {value!r}")
    return float(value)


def get_activation(activation: str | None) -> str:
    """Normalises an activation argument to a name the kernel library implements.

    Args:
        activation: ``None`` (linear) or a name such as ``"relu"``.

    Returns:
        The name (``"linear"`` for ``None``).

    Raises:
        ValueError: the kernel library has no kernel for it.
    """
    if activation is None:
        return "linear"
    known = ["linear"] + load_library().activations()
    if not isinstance(activation, str) or activation not in known:
        raise ValueError(f"unknown activation {activation!r}; supported: {', '.join(known)}")
    return activation


class Activation(Layer):
    """Applies an activation function to its input.

    Args:
        activation: the activation's name (``"relu"``, ``"sigmoid"``, ``"tanh"``, ``"softmax"``,
            ``"gelu"``, ...; ``malinn.load_library().activations()`` lists them), or ``None``.
        name: the layer's name.

    Raises:
        ValueError: the activation is unknown.
    """

    reusable_on_other_shapes = True

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "Activation":
        return cls(keras_activation(config.get("activation"), keras), name=keras.name)

    @classmethod
    def from_keras_time_distributed(cls, config: dict, keras: KerasContext) -> "Activation":
        return cls.from_keras_config(config, keras)  # element-wise: each time step as it is

    def __init__(self, activation: str | None, name: str | None = None):
        super().__init__(name)
        self.activation = get_activation(activation)
        self.params: dict = {}

    def lower(self, builder, x):
        return kinds.activation(builder, x, self.activation, self.params, what=self._what())

    def get_config(self) -> dict:
        return {**super().get_config(), "activation": self.activation}


class ReLU(Activation):
    """Keras's ReLU layer: ``max_value``-capped, ``negative_slope`` below ``threshold``.

    Args:
        max_value: the cap, or ``None``; must be >= 0.
        negative_slope: the slope below the threshold; must be >= 0.
        threshold: values at or below it are not passed through.
        name: the layer's name.

    Raises:
        ValueError: a negative ``max_value`` or ``negative_slope``, or a non-finite parameter.
    """

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "ReLU":
        max_value = config.get("max_value")
        return cls(
            max_value=None if max_value is None else float(max_value),
            negative_slope=float(config.get("negative_slope", 0.0) or 0.0),
            threshold=float(config.get("threshold", 0.0) or 0.0),
            name=keras.name,
        )

    def __init__(
        self,
        max_value: float | None = None,
        negative_slope: float = 0.0,
        threshold: float = 0.0,
        name: str | None = None,
    ):
        for label, value in (("negative_slope", negative_slope), ("threshold", threshold)) + (
            (("max_value", max_value),) if max_value is not None else ()
        ):
            _finite("ReLU", label, value)
        if (max_value is not None and max_value < 0) or negative_slope < 0:
            raise ValueError(f"ReLU: max_value and negative_slope must be >= 0, got {max_value!r}, {negative_slope!r}")
        plain = max_value is None and negative_slope == 0 and threshold == 0
        super().__init__("relu" if plain else "relu_general", name)
        self.max_value, self.negative_slope, self.threshold = max_value, float(negative_slope), float(threshold)
        if not plain:
            self.params = {
                "negative_slope": self.negative_slope,
                "max_value": float(max_value or 0.0),
                "threshold": self.threshold,
                "has_max_value": float(max_value is not None),
            }

    def get_config(self) -> dict:
        return {
            "name": self.name,
            "max_value": self.max_value,
            "negative_slope": self.negative_slope,
            "threshold": self.threshold,
        }


class LeakyReLU(Activation):
    """``x`` for ``x >= 0``, ``negative_slope * x`` below (Keras 3 default 0.3, Keras 2's ``alpha``).

    Raises:
        ValueError: ``negative_slope`` is not a finite number.
    """

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "LeakyReLU":  # Keras 2 names it alpha
        return cls(float(config.get("negative_slope", config.get("alpha", 0.3))), name=keras.name)

    def __init__(self, negative_slope: float = 0.3, name: str | None = None):
        slope = _finite("LeakyReLU", "negative_slope", negative_slope)
        super().__init__("leaky_relu", name)
        self.negative_slope = slope
        self.params = {"negative_slope": self.negative_slope}

    def get_config(self) -> dict:
        return {"name": self.name, "negative_slope": self.negative_slope}


class ELU(Activation):
    """``x`` for ``x > 0``, ``alpha * (exp(x) - 1)`` below.

    Raises:
        ValueError: ``alpha`` is not a finite number.
    """

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "ELU":
        return cls(float(config.get("alpha", 1.0)), name=keras.name)

    def __init__(self, alpha: float = 1.0, name: str | None = None):
        alpha = _finite("ELU", "alpha", alpha)
        super().__init__("elu", name)
        self.alpha = alpha
        self.params = {"alpha": self.alpha}

    def get_config(self) -> dict:
        return {"name": self.name, "alpha": self.alpha}


class ThresholdedReLU(Activation):
    """``x`` where ``x > theta``, else 0 (tf_keras's ThresholdedReLU).

    Raises:
        ValueError: ``theta`` is not a finite number.
    """

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "ThresholdedReLU":
        return cls(float(config.get("theta", 1.0)), name=keras.name)

    def __init__(self, theta: float = 1.0, name: str | None = None):
        theta = _finite("ThresholdedReLU", "theta", theta)
        super().__init__("relu_general", name)
        self.theta = theta
        self.params = {"negative_slope": 0.0, "max_value": 0.0, "threshold": theta, "has_max_value": 0.0}

    def get_config(self) -> dict:
        return {"name": self.name, "theta": self.theta}


class PReLU(Layer):
    """``x`` for ``x >= 0``, ``alpha * x`` below, with a learned ``alpha`` per element of the sample,
    shared along ``shared_axes`` (Keras's, 1-based: the batch axis is 0). As Keras, a negative axis
    ``a`` counts from the end of alpha's own shape less one (Keras sets ``alpha_shape[a - 1] = 1``):
    ``-1`` shares the sample's second-to-last axis.

    Args:
        shared_axes: the axes along which one alpha serves, or None.
        name: the layer's name.

    Raises:
        ValueError: ``shared_axes`` is not a list of sample axes.
    """

    weight_names = ("alpha",)

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "PReLU":
        return cls(shared_axes=config.get("shared_axes"), name=keras.name)

    @classmethod
    def from_keras_time_distributed(cls, config: dict, keras: KerasContext) -> "PReLU":
        """One alpha for every time step: shared along the time axis too."""
        shared = config.get("shared_axes") or []
        shared = [1] + shifted_axes(shared if isinstance(shared, list) else [shared])
        return cls.from_keras_config({**config, "shared_axes": shared}, keras)

    def from_keras_weights(self, weights: list) -> list:
        """A ``TimeDistributed`` PReLU's alpha, saved without the time axis, with it put back."""
        if weights and (1,) + tuple(weights[0].shape) == self.alpha_shape:
            return [weights[0].reshape(self.alpha_shape)]
        return list(weights)

    def __init__(self, shared_axes: Any = None, name: str | None = None):
        super().__init__(name)
        shared = () if shared_axes is None else axis_argument(shared_axes, f"PReLU {self.name!r}")
        self.shared_axes = tuple(shared) if isinstance(shared, tuple) else (shared,)
        self.alpha: np.ndarray | None = None

    @property
    def alpha_shape(self) -> tuple:
        """The sample's shape with 1 along each shared axis (Keras's alpha)."""
        keras = tuple(a if a > 0 else a - 1 for a in self.shared_axes)  # Keras's alpha_shape[a - 1] = 1
        sample = self._built_shape()
        shared = resolve_axes(keras, len(sample) + 1, f"PReLU {self.name!r}") if keras else ()
        return tuple(1 if i + 1 in shared else d for i, d in enumerate(sample))

    def build(self, input_shape: Any) -> None:
        super().build(input_shape)
        self.alpha = zeros(self.alpha_shape)

    def set_weights(self, weights: Any) -> None:
        """Sets ``[alpha]`` of :attr:`alpha_shape`.

        Raises:
            ValueError: the layer is not built, or the count or shape is wrong.
        """
        weights = numeric_weights(weights, self._what())
        if not self.built or len(weights) != 1 or weights[0].shape != self.alpha_shape:
            raise ValueError(
                f"PReLU {self.name!r} expects one alpha of shape "
                f"{self.alpha_shape if self.built else '(built layer)'}, got {[w.shape for w in weights]}"
            )
        self.alpha = weights[0].copy()
        self._weights_changed()

    def lower(self, builder, x):
        alpha, period = trailing_vector(self.alpha, self._built_shape(), self._what())
        return kinds.broadcast(
            builder,
            x,
            2,
            Vector(f"layer {self.name!r} alpha", alpha, self.device_copies),
            None,
            period,
            what=self._what(),
        )

    def get_config(self) -> dict:
        return {**super().get_config(), "shared_axes": list(self.shared_axes) or None}


class Softmax(Activation):
    """Softmax over ``axis``: the last axis by default (each sample's features, and each
    position's on multi-axis samples, normalised on their own), any other axis, or several axes
    at once (then computed as Keras does, ``exp(x - logsumexp(x))``).

    Args:
        axis: an axis or a list of axes (Keras's, the batch axis being 0).
        name: the layer's name.

    Raises:
        ValueError: ``axis`` is not an integer or a list of them, or names the batch axis.
    """

    reusable_on_other_shapes = False

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "Softmax":
        return cls(axis=config.get("axis", -1), name=keras.name)

    @classmethod
    def from_keras_time_distributed(cls, config: dict, keras: KerasContext) -> "Softmax":
        return cls.from_keras_config(with_axis_shifted(config), keras)

    def __init__(self, axis: int | tuple | list = -1, name: str | None = None):
        super().__init__("softmax", name)
        axis = axis_argument(axis, f"Softmax {self.name!r}")
        self.axis = axis[0] if isinstance(axis, tuple) and len(axis) == 1 else axis

    def build(self, input_shape: Any) -> None:
        super().build(input_shape)
        resolve_axes(self.axis, len(self._built_shape()) + 1, f"Softmax {self.name!r}")

    def lower(self, builder, x):
        axes = resolve_axes(self.axis, len(x.shape), f"Softmax {self.name!r}")
        if axes == (len(x.shape) - 1,):
            return kinds.activation(builder, x, "softmax", what=self._what())
        return kinds.normalize(
            builder, x, "softmax" if len(axes) == 1 else "softmax_logsumexp", axes, what=self._what()
        )

    def get_config(self) -> dict:
        return {"name": self.name, "axis": list(self.axis) if isinstance(self.axis, tuple) else self.axis}
