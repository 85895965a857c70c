"""``GroupNormalization``: the channels split into groups, each sample's group normalized over its
channels and every spatial position, then a per-channel ``gamma`` and ``beta``, as Keras's layer.

Lowered as a view of ``(batch, positions, groups, channels / groups)`` normalized over the
positions and each group's channels (:func:`malinn.plan.kinds.normalize`: the group axis moved
first and back), then the per-channel affine step (kernels/bias.cl's scale and shift)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..plan import kinds
from ..plan.tensors import Vector
from .base import Layer, numeric_weights, ones, zeros
from .keras_config import KerasContext, NotConvertible

__all__ = ["GroupNormalization"]


class GroupNormalization(Layer):
    """Group normalization over the last axis (channels last), as Keras's ``GroupNormalization``:
    ``(x - mean) / sqrt(variance + epsilon) * gamma + beta``, mean and variance per sample and group.

    Args:
        groups: how many groups the channels are split into (dividing the channels).
        axis: the channel axis: -1 (the last).
        epsilon: added to the variance, >= 0.
        center: whether the layer has ``beta``; scale: whether it has ``gamma``.
        name: the layer's name.

    Raises:
        ValueError: an argument is not what Keras accepts, or the channels are not a multiple of ``groups``.
    """

    reusable_on_other_shapes = True
    weight_names = ("gamma", "beta")

    def __init__(
        self,
        groups: int = 32,
        axis: int = -1,
        epsilon: float = 1e-3,
        center: bool = True,
        scale: bool = True,
        name: str | None = None,
    ):
        super().__init__(name)
        who = f"{type(self).__name__} {self.name!r}"
        if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1:
            raise ValueError(f"{who}: groups must be a positive integer, got {groups!r}")
        if axis != -1:
            raise ValueError(f"{who}: only axis=-1 (channels last) runs, got {axis!r}")
        if not isinstance(epsilon, (int, float)) or isinstance(epsilon, bool) or not 0 <= epsilon < float("inf"):
            raise ValueError(f"{who}: epsilon must be a number >= 0, got {epsilon!r}")
        self.groups, self.axis, self.epsilon = int(groups), -1, float(epsilon)
        self.center, self.scale = bool(center), bool(scale)
        self.gamma: np.ndarray | None = None
        self.beta: np.ndarray | None = None

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "GroupNormalization":
        """The layer of a Keras config; the channel axis given as -1 or as the last axis' index.

        Raises:
            NotConvertible: a channel axis other than the last.
        """
        axis = config.get("axis", -1)
        if axis not in (-1, keras.rank - 1):
            raise NotConvertible(f"over axis {axis} (malinn normalizes groups of the last axis)")
        return cls(
            groups=int(config.get("groups", 32)),
            epsilon=float(config.get("epsilon", 1e-3)),
            center=bool(config.get("center", True)),
            scale=bool(config.get("scale", True)),
            name=keras.name,
        )

    def build(self, input_shape: Any) -> None:
        """Creates ``gamma`` (ones) and ``beta`` (zeros), one per channel.

        Raises:
            ValueError: the channels are not a multiple of ``groups``.
        """
        channels = tuple(input_shape)[-1]
        if channels % self.groups:
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: {channels} channels are not a multiple of groups={self.groups}"
            )
        super().build(input_shape)
        self.gamma = ones((channels,)) if self.scale else None
        self.beta = zeros((channels,)) if self.center else None

    def set_weights(self, weights: Any) -> None:
        """Sets ``[gamma?, beta?]`` (as ``scale`` and ``center`` say), one value per channel.

        Raises:
            ValueError: the layer is not built, or the count or a shape is wrong.
        """
        weights = numeric_weights(weights, self._what())
        who = f"{type(self).__name__} {self.name!r}"
        if not self.built:
            raise ValueError(f"{who}: build the layer before setting its weights")
        shape = (self._built_shape()[-1],)
        if len(weights) != self.scale + self.center or any(w.shape != shape for w in weights):
            raise ValueError(
                f"{who} expects {self.scale + self.center} weight arrays of shape {shape}, got "
                f"{[w.shape for w in weights]}"
            )
        it = iter(weights)
        self.gamma = next(it).copy() if self.scale else None
        self.beta = next(it).copy() if self.center else None
        self._weights_changed()

    def lower(self, builder, x):
        shape = tuple(x.shape)  # a model input read once is reshaped in place (a view)
        channels, positions = shape[-1], math.prod(shape[1:-1])
        grouped = kinds.reshape(builder, x, (shape[0], positions, self.groups, channels // self.groups), self._what())
        axes = (1, 2, 3) if self.groups == 1 else (1, 3)
        y = kinds.normalize(builder, grouped, "layer", axes, self.epsilon, what=self._what())
        y = kinds.reshape(builder, y, shape, self._what())
        if not (self.scale or self.center):
            return y
        scale = self.gamma if self.scale else np.ones(channels, np.float32)
        shift = self.beta if self.center else np.zeros(channels, np.float32)
        return kinds.affine(
            builder,
            y,
            Vector(f"layer {self.name!r} gamma", scale, self.device_copies),
            Vector(f"layer {self.name!r} beta", shift, self.device_copies),
            self._what(),
        )

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "groups": self.groups,
            "axis": self.axis,
            "epsilon": self.epsilon,
            "center": self.center,
            "scale": self.scale,
        }
