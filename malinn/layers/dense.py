"""The Dense layer: ``y = activation(x @ kernel + bias)``, run as ``R = W x I + b`` (Rovder 5.3.2)."""

from __future__ import annotations

import numpy as np

from .. import ops
from ..matrix import DeviceMatrix
from .activation import get_activation
from .base import Layer

__all__ = ["Dense"]


class Dense(Layer):
    """A fully-connected layer.

    Keras computes ``x @ kernel + bias`` with ``x`` (batch, in) and ``kernel`` (in, units); malinn
    computes ``W x I`` with ``W = kernel^T`` and ``I = x^T``, which is the same memory read in
    another layout, so nothing is transposed on the device.

    Args:
        units: the number of output features, a positive integer.
        activation: the activation's name, or ``None`` for linear.
        use_bias: whether the layer adds a bias vector.
        name: the layer's name.

    Raises:
        ValueError: ``units`` is not a positive integer or ``activation`` is unknown.
    """

    def __init__(self, units, activation=None, use_bias: bool = True, name: str | None = None):
        super().__init__(name)
        if isinstance(units, bool) or not isinstance(units, (int, np.integer)) or units < 1:
            raise ValueError(f"Dense layer {self.name!r}: units must be a positive integer, got {units!r}")
        self.units = int(units)
        self.activation = get_activation(activation)
        self.use_bias = bool(use_bias)
        self.kernel: np.ndarray | None = None
        self.bias: np.ndarray | None = None
        #: (layout, padded, flat) of W as a malinn model file stored it, uploaded as is when it fits
        self.prepacked = None
        self._device_cache: dict = {}

    def build(self, input_dim: int) -> None:
        """Creates ``kernel`` (input_dim, units) with Glorot-uniform values and a zero ``bias``."""
        super().build(input_dim)
        limit = np.sqrt(6.0 / (self.input_dim + self.units))
        self.kernel = np.random.default_rng().uniform(-limit, limit, (self.input_dim, self.units)).astype(np.float32)
        self.bias = np.zeros(self.units, dtype=np.float32) if self.use_bias else None
        self._device_cache.clear()

    def output_dim(self, input_dim: int) -> int:
        return self.units

    def get_weights(self) -> list:
        if not self.built:
            return []
        return [self.kernel.copy()] + ([self.bias.copy()] if self.use_bias else [])

    def set_weights(self, weights) -> None:
        """Sets ``[kernel, bias]`` (or ``[kernel]`` without bias) in Keras's shapes.

        Raises:
            ValueError: the count or a shape differs from the layer's.
        """
        weights = [np.asarray(w) for w in weights]
        want = 1 + self.use_bias
        if len(weights) != want:
            raise ValueError(f"Dense layer {self.name!r} expects {want} weight arrays "
                             f"(kernel{', bias' if self.use_bias else ''}), got {len(weights)}")
        kernel = weights[0]
        if kernel.ndim != 2 or kernel.shape[1] != self.units or (self.built and kernel.shape[0] != self.input_dim):
            expected = (self.input_dim if self.built else "in", self.units)
            raise ValueError(f"Dense layer {self.name!r}: kernel shape {kernel.shape} does not match {expected}")
        if self.use_bias and weights[1].shape != (self.units,):
            raise ValueError(f"Dense layer {self.name!r}: bias shape {weights[1].shape} does not match ({self.units},)")
        if not self.built:
            Layer.build(self, kernel.shape[0])
        self.kernel = kernel.astype(np.float32, copy=True)
        self.bias = weights[1].astype(np.float32, copy=True) if self.use_bias else None
        self.prepacked = None
        self._device_cache.clear()

    def _on_device(self, device, spec, plan):
        """``W = kernel^T`` in the kernel's left layout and the bias buffer, uploaded once per device/kernel."""
        key = (device.key, spec.codename, plan["a"])
        cached = self._device_cache.get(key)
        if cached is None:
            layout, what = spec.matrices["a"].layout, f"layer {self.name!r} kernel"
            if self.prepacked is not None and self.prepacked[:2] == (layout, plan["a"]):
                w = DeviceMatrix.upload_flat(device, self.prepacked[2], (self.units, self.input_dim), layout,
                                             plan["a"], what)
            else:
                w = DeviceMatrix.upload(device, self.kernel.T, layout, plan["a"], what=what)
            b = ops.upload_vector(device, self.bias, f"layer {self.name!r} bias") if self.use_bias else None
            cached = self._device_cache[key] = (w, b)
        return cached

    def call(self, inputs: DeviceMatrix) -> DeviceMatrix:
        from ..device import get_device

        device = inputs.device or get_device()
        spec = ops.kernel_for("matmul", device, (self.units, self.input_dim, inputs.shape[1]))
        plan = ops.matmul_plan(spec, self.units, self.input_dim, inputs.shape[1])
        w, b = self._on_device(device, spec, plan)
        # one launch when the kernel has a fused epilogue, else matmul, bias and activation kernels
        return ops.matmul(w, inputs, spec, device, what=f"layer {self.name!r}", bias=b, activation=self.activation)

    def get_config(self) -> dict:
        return {**super().get_config(), "units": self.units, "activation": self.activation,
                "use_bias": self.use_bias}
