"""Activation layers: ``Activation(name)`` and the parametrised ``ReLU``, ``LeakyReLU``, ``ELU``,
``Softmax``. Each applies its function element-wise (softmax over the features) on the device."""

from __future__ import annotations

import math

from ..kernel_library import load_library
from .base import Layer

__all__ = ["Activation", "ReLU", "LeakyReLU", "ELU", "Softmax", "get_activation"]


def _finite(layer: str, label: str, value) -> float:
    """``value`` as a float, or a ValueError naming the layer and the parameter."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{layer}: {label} must be a finite number, got {value!r}")
    return float(value)


def get_activation(activation) -> str:
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

    def __init__(self, activation, name: str | None = None):
        super().__init__(name)
        self.activation = get_activation(activation)
        self.params: dict = {}

    def lower(self, builder, x):
        return builder.activation(x, self.activation, self.params, what=self._what())

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

    def __init__(self, max_value=None, negative_slope=0.0, threshold=0.0, name: str | None = None):
        for label, value in (("negative_slope", negative_slope), ("threshold", threshold)) + (
                (("max_value", max_value),) if max_value is not None else ()):
            _finite("ReLU", label, value)
        if (max_value is not None and max_value < 0) or negative_slope < 0:
            raise ValueError(f"ReLU: max_value and negative_slope must be >= 0, got {max_value!r}, {negative_slope!r}")
        plain = max_value is None and negative_slope == 0 and threshold == 0
        super().__init__("relu" if plain else "relu_general", name)
        self.max_value, self.negative_slope, self.threshold = max_value, float(negative_slope), float(threshold)
        if not plain:
            self.params = {"negative_slope": self.negative_slope, "max_value": float(max_value or 0.0),
                           "threshold": self.threshold, "has_max_value": float(max_value is not None)}

    def get_config(self) -> dict:
        return {"name": self.name, "max_value": self.max_value, "negative_slope": self.negative_slope,
                "threshold": self.threshold}


class LeakyReLU(Activation):
    """``x`` for ``x >= 0``, ``negative_slope * x`` below (Keras 3 default 0.3, Keras 2's ``alpha``).

    Raises:
        ValueError: ``negative_slope`` is not a finite number.
    """

    def __init__(self, negative_slope=0.3, name: str | None = None):
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

    def __init__(self, alpha=1.0, name: str | None = None):
        alpha = _finite("ELU", "alpha", alpha)
        super().__init__("elu", name)
        self.alpha = alpha
        self.params = {"alpha": self.alpha}

    def get_config(self) -> dict:
        return {"name": self.name, "alpha": self.alpha}


class Softmax(Activation):
    """Softmax over the last axis (``axis=-1``), each sample's features (and each position's, on
    multi-axis samples) normalised on their own.

    Raises:
        ValueError: another axis is asked for.
    """

    def __init__(self, axis=-1, name: str | None = None):
        axis = axis[0] if isinstance(axis, (list, tuple)) and len(axis) == 1 else axis
        if isinstance(axis, bool) or not isinstance(axis, int) or axis == 0 or axis < -1:
            raise ValueError(f"Softmax: malinn computes softmax over the last axis (axis=-1), not axis={axis!r}")
        super().__init__("softmax", name)
        self.axis = axis

    def build(self, input_shape) -> None:
        if self.axis not in (-1, len(tuple(input_shape)) - 1):
            raise ValueError(f"Softmax {self.name!r}: malinn computes softmax over the last axis (axis=-1), "
                             f"not axis={self.axis} of inputs of rank {len(tuple(input_shape))}")
        super().build(input_shape)

    def get_config(self) -> dict:
        return {"name": self.name, "axis": -1}
