"""keras.applications' scale layers: ConvNeXt's ``LayerScale`` (``x * gamma``, a learned scale per
channel) and InceptionResNetV2's ``CustomScaleLayer`` (``x + y * scale`` of its two inputs)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..plan import kinds
from ..plan.tensors import Vector
from .base import Layer, numeric_weights, ones
from .keras_config import KerasContext, NotConvertible
from .merging import _ElementwiseMerge

__all__ = ["LayerScale", "CustomScaleLayer"]


def _number(who: str, label: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{who}: {label} must be a finite number, got {value!r}")
    return float(value)


class LayerScale(Layer):
    """ConvNeXt's LayerScale: its input times ``gamma``, one learned value per channel (the last axis).

    Weights: ``[gamma]`` of shape ``(projection_dim,)``, initially ``init_values``.

    Args:
        init_values: gamma's initial value.
        projection_dim: the number of channels (the input's last axis).
        name: the layer's name.

    Raises:
        ValueError: ``init_values`` is not a finite number or ``projection_dim`` not a positive integer.
    """

    weight_names = ("gamma",)

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "LayerScale":
        return cls(config.get("init_values", 1e-6), config.get("projection_dim"), name=keras.name)  # type: ignore[arg-type]  # __init__ checks it

    def __init__(self, init_values: float, projection_dim: int, name: str | None = None):
        super().__init__(name)
        self.init_values = _number(f"LayerScale {self.name!r}", "init_values", init_values)
        if isinstance(projection_dim, bool) or not isinstance(projection_dim, int) or projection_dim < 1:
            raise ValueError(
                f"LayerScale {self.name!r}: projection_dim must be a positive integer, got {projection_dim!r}"
            )
        self.projection_dim = projection_dim
        self.gamma: np.ndarray | None = None

    def build(self, input_shape: Any) -> None:
        super().build(input_shape)
        if self._built_shape()[-1] != self.projection_dim:
            raise ValueError(
                f"LayerScale {self.name!r}: inputs of shape {tuple(input_shape)} have "
                f"{self._built_shape()[-1]} channels, not projection_dim {self.projection_dim}"
            )
        gamma = ones(self.projection_dim)
        self.gamma = gamma if not gamma.flags.writeable else gamma * self.init_values  # a placeholder as it is

    def set_weights(self, weights: Any) -> None:
        """Sets ``[gamma]`` of shape ``(projection_dim,)``.

        Raises:
            ValueError: the layer is not built, or the count or shape is wrong.
        """
        weights = numeric_weights(weights, self._what())
        if not self.built or len(weights) != 1 or weights[0].shape != (self.projection_dim,):
            raise ValueError(
                f"LayerScale {self.name!r} expects one gamma of shape ({self.projection_dim},), got "
                f"{[w.shape for w in weights]}"
            )
        self.gamma = weights[0]
        self._weights_changed()

    def feature_affine(self) -> tuple:
        """``(scale, shift)`` per feature of the last axis: gamma and zeros (a Dense before folds it)."""
        assert self.gamma is not None, f"{self._what()} is not built"
        return np.array(self.gamma, np.float32), np.zeros(self.projection_dim, np.float32)

    def lower(self, builder, x):
        scale, shift = self.feature_affine()
        return kinds.affine(
            builder,
            x,
            Vector(f"layer {self.name!r} gamma", scale, self.device_copies),
            Vector(f"layer {self.name!r} zero", shift, self.device_copies),
            what=self._what(),
        )

    def get_config(self) -> dict:
        return {**super().get_config(), "init_values": self.init_values, "projection_dim": self.projection_dim}


class CustomScaleLayer(_ElementwiseMerge):
    """InceptionResNetV2's CustomScaleLayer: ``x + y * scale`` of its two inputs ``[x, y]``.

    tf_keras writes it in ``.h5`` files as ``Custom>CustomScaleLayer`` (keras.applications registers
    it under the package ``Custom``); that exact name, with this config, is read as this layer.

    Args:
        scale: the factor of the second input.
        name: the layer's name.

    Raises:
        ValueError: ``scale`` is not a finite number.
    """

    count = 2
    keras_aliases = ("Custom>CustomScaleLayer",)
    # Layer declares tuple | None; _ElementwiseMerge's () is inferred as tuple[()]
    keras_config_keys = None  # type: ignore[assignment]
    #: the keys of keras.applications' config (any other is another layer of the same name)
    KERAS_KEYS = frozenset({"name", "trainable", "dtype", "scale"})

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "CustomScaleLayer":
        extra = sorted(set(config) - cls.KERAS_KEYS)
        if extra or "scale" not in config:
            raise NotConvertible(f"with the config keys {sorted(config)}, not keras.applications' (scale)")
        return cls(config["scale"], name=keras.name)

    def __init__(self, scale: float, name: str | None = None):
        super().__init__(name)
        self.scale = _number(f"CustomScaleLayer {self.name!r}", "scale", scale)

    def lower(self, builder, xs):
        x, y = xs
        rows = y.shape[-1]
        scale = Vector(f"layer {self.name!r} scale", np.full(rows, self.scale, np.float32), self.device_copies)
        zero = Vector(f"layer {self.name!r} zero", np.zeros(rows, np.float32), self.device_copies)
        return kinds.merge(
            builder, [x, kinds.affine(builder, y, scale, zero, what=self._what())], "add", what=self._what()
        )

    def get_config(self) -> dict:
        return {**super().get_config(), "scale": self.scale}
