"""The Activation layer: applies an activation function element-wise (softmax over features)."""

from __future__ import annotations

from .. import ops
from ..device import get_device
from ..kernel_library import load_library
from .base import Layer

__all__ = ["Activation", "get_activation"]


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
            ``"linear"``).
        name: the layer's name.

    Raises:
        ValueError: the activation is unknown.
    """

    def __init__(self, activation, name: str | None = None):
        super().__init__(name)
        self.activation = get_activation(activation)

    def call(self, inputs):
        if inputs.buffer is None:  # the model's first layer: upload in the layout a Dense would read
            spec = ops.kernel_for("matmul")
            layout = spec.matrices["b"].layout
            inputs = inputs.in_layout(get_device(), layout, layout.padded_shape(*inputs.shape))
        return ops.activation(inputs, self.activation, what=f"layer {self.name!r}")

    def get_config(self) -> dict:
        return {**super().get_config(), "activation": self.activation}
