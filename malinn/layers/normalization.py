"""BatchNormalization at inference: a per-feature affine step ``x * scale + shift`` on the last axis."""

from __future__ import annotations

import numpy as np

from ..plan import Vector
from .base import Layer

__all__ = ["BatchNormalization"]


class BatchNormalization(Layer):
    """``gamma * (x - moving_mean) / sqrt(moving_variance + epsilon) + beta`` per feature (last axis).

    At conversion a BatchNormalization right after a linear Dense is folded into that Dense's
    weights; the plan fuses one after an activated Dense into that Dense's kernel where the kernel
    can; others run as one scale-and-shift kernel.

    Args:
        epsilon: added to the variance, > 0.
        center: whether the layer has ``beta``.
        scale: whether the layer has ``gamma``.
        name: the layer's name.

    Raises:
        ValueError: ``epsilon`` is not a positive number.
    """

    def __init__(self, epsilon=1e-3, center: bool = True, scale: bool = True, name: str | None = None):
        super().__init__(name)
        if not isinstance(epsilon, (int, float)) or isinstance(epsilon, bool) or not epsilon > 0:
            raise ValueError(f"BatchNormalization {self.name!r}: epsilon must be a positive number, got {epsilon!r}")
        self.epsilon, self.center, self.scale = float(epsilon), bool(center), bool(scale)
        self.gamma = self.beta = self.moving_mean = self.moving_variance = None

    @property
    def features(self) -> int | None:
        return None if self.input_shape is None else self.input_shape[-1]

    def build(self, input_shape) -> None:
        super().build(input_shape)
        ones, zeros = np.ones(self.features, np.float32), np.zeros(self.features, np.float32)
        self.gamma, self.beta = (ones if self.scale else None), (zeros if self.center else None)
        self.moving_mean, self.moving_variance = zeros.copy(), ones.copy()

    def get_weights(self) -> list:
        if not self.built:
            return []
        return [w.copy() for w in (self.gamma, self.beta, self.moving_mean, self.moving_variance) if w is not None]

    def set_weights(self, weights) -> None:
        """Sets ``[gamma?, beta?, moving_mean, moving_variance]`` (gamma/beta as scale/center say).

        Raises:
            ValueError: the count or a shape is wrong.
        """
        weights = [np.asarray(w, dtype=np.float32) for w in weights]
        want = self.scale + self.center + 2
        if len(weights) != want:
            raise ValueError(f"BatchNormalization {self.name!r} expects {want} weight arrays, got {len(weights)}")
        dim = weights[-1].shape[0] if weights[-1].ndim == 1 else None
        if dim is None or any(w.shape != (dim,) for w in weights) or (self.built and dim != self.features):
            raise ValueError(f"BatchNormalization {self.name!r}: weight shapes {[w.shape for w in weights]} "
                             f"are not all ({self.features if self.built else 'features'},)")
        if not self.built:
            Layer.build(self, (None, dim))
        it = iter(weights)
        self.gamma = next(it).copy() if self.scale else None
        self.beta = next(it).copy() if self.center else None
        self.moving_mean, self.moving_variance = next(it).copy(), next(it).copy()
        self._weights_changed()

    def scale_shift(self) -> tuple[np.ndarray, np.ndarray]:
        """The folded per-feature ``(scale, shift)``: ``y = x * scale + shift``, computed in float64."""
        gamma = self.gamma.astype(np.float64) if self.scale else 1.0
        beta = self.beta.astype(np.float64) if self.center else 0.0
        s = gamma / np.sqrt(self.moving_variance.astype(np.float64) + self.epsilon)
        shift = beta - self.moving_mean.astype(np.float64) * s
        return (np.broadcast_to(s, (self.features,)).astype(np.float32),
                np.broadcast_to(shift, (self.features,)).astype(np.float32))

    def lower(self, builder, x):
        if x.rows != self.features:
            raise ValueError(f"BatchNormalization {self.name!r} was built for {self.features} features on the last "
                             f"axis, but receives shape {x.shape}")
        s, t = self.scale_shift()
        return builder.affine(x, Vector(f"layer {self.name!r} scale", s, self.device_copies),
                              Vector(f"layer {self.name!r} shift", t, self.device_copies), what=self._what())

    def save_own_variables(self, store, target) -> None:
        for name in ("gamma", "beta", "moving_mean", "moving_variance"):
            value = getattr(self, name)
            if value is not None:
                store.create_dataset(name, data=value)

    def load_own_variables(self, store) -> None:
        self.set_weights([np.asarray(store[n][()], np.float32) for n in
                          ("gamma", "beta", "moving_mean", "moving_variance") if n in store])

    def get_config(self) -> dict:
        return {**super().get_config(), "epsilon": self.epsilon, "center": self.center, "scale": self.scale}
