"""Keras's operators as layers: a tensor and a constant (``ConstantOperation``: Keras 3 saves
``x + 3`` as an operation whose node holds the 3), the division of two tensors (``Divide``), the
activation functions called as operations (``OperatorActivation``: ``keras.ops.relu6(x)``), and
tf_keras's ``TFOpLambda`` (``tf.math.multiply(x, 2.0)``, ``tf.nn.relu6(x)``), converted into them.

A constant operand becomes per-element affine steps (``x * scale + shift``, fused into the kernel
before where it can), exact for every operator but ``divide``, which multiplies by the constant's
reciprocal (within an ulp of Keras's quotient), and ``maximum``/``minimum`` with a constant other
than 0, which shift around a ReLU (``relu(x - c) + c``: within an ulp of the larger of ``x`` and ``c``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..plan import kinds
from ..plan.tensor import format_shape
from ..plan.tensors import Vector
from .activation import ELU, Activation, LeakyReLU, Softmax
from .axes import trailing_vector
from .base import Layer
from .keras_config import KerasContext, NotConvertible
from .mask_operations import not_equal_layer
from .merging import Add, Maximum, Minimum, Multiply, Subtract, _ElementwiseMerge

__all__ = [
    "ConstantOperation",
    "Divide",
    "OperatorActivation",
    "operator_layer",
    "OPERATIONS",
    "TF_OPERATORS",
    "TF_ACTIVATIONS",
]

#: Keras 3's operation classes (keras.src.ops.numpy) of a tensor and a constant -> the operator
OPERATIONS = {
    "Add": "add",
    "Subtract": "subtract",
    "Multiply": "multiply",
    "Divide": "divide",
    "TrueDivide": "divide",
    "Maximum": "maximum",
    "Minimum": "minimum",
}
#: tf_keras's TFOpLambda functions of two operands -> the operator
TF_OPERATORS = {
    "__operators__.add": "add",
    "math.add": "add",
    "math.subtract": "subtract",
    "math.multiply": "multiply",
    "math.truediv": "divide",
    "math.divide": "divide",
    "math.maximum": "maximum",
    "math.minimum": "minimum",
}
#: tf_keras's TFOpLambda functions of one tensor -> malinn's activation
TF_ACTIVATIONS = {
    "nn.relu": "relu",
    "nn.relu6": "relu6",
    "math.sigmoid": "sigmoid",
    "nn.sigmoid": "sigmoid",
    "math.tanh": "tanh",
    "nn.tanh": "tanh",
    "nn.silu": "swish",
    "nn.swish": "swish",
    "nn.gelu": "gelu",
    "nn.softmax": "softmax",
    "math.softmax": "softmax",
    "nn.elu": "elu",
    "nn.selu": "selu",
    "math.softplus": "softplus",
    "nn.softplus": "softplus",
    "nn.softsign": "softsign",
    "math.softsign": "softsign",
    "math.exp": "exponential",
    "nn.leaky_relu": "leaky_relu",
}
#: Keras 3's activation operations (keras.src.ops.nn and numpy) -> malinn's activation
OPERATION_ACTIVATIONS = {
    "Relu": "relu",
    "Relu6": "relu6",
    "Sigmoid": "sigmoid",
    "HardSigmoid": "hard_sigmoid",
    "Silu": "swish",
    "Tanh": "tanh",
    "Gelu": "gelu",
    "Elu": "elu",
    "Selu": "selu",
    "Softplus": "softplus",
    "Softsign": "softsign",
    "HardSilu": "hard_swish",
    "Exp": "exponential",
    "LeakyRelu": "leaky_relu",
}
_MERGES = {"add": Add, "subtract": Subtract, "multiply": Multiply, "maximum": Maximum, "minimum": Minimum}


class Divide(_ElementwiseMerge):
    """The first input divided by the second (exactly two inputs; Keras 3's ``a / b``, saved as the
    operation ``TrueDivide``)."""

    op, count = "divide", 2
    keras_aliases = ("TrueDivide",)


class ConstantOperation(Layer):
    """``x <op> constant`` (or ``constant <op> x``), the constant a number or an array that
    broadcasts against a sample without growing it: Keras 3's ``x + 3``, ``x * np.array(...)``.

    Args:
        op: ``"add"``, ``"subtract"``, ``"multiply"``, ``"divide"``, ``"maximum"`` or ``"minimum"``.
        constant: the constant operand (float32, as Keras casts it).
        constant_first: the constant is the first operand (``2 - x``).
        name: the layer's name.

    Raises:
        ValueError: an unknown ``op``, a constant that is not finite numbers, ``constant / x``, or a
            division by zero.
    """

    OPS = ("add", "subtract", "multiply", "divide", "maximum", "minimum")
    keras_aliases = ("TFOpLambda",)
    reusable_on_other_shapes = False

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> Layer:
        """A TFOpLambda called on tensors alone: the merge or activation its function is."""
        return operator_layer(config, {}, keras)

    def __init__(self, op: str, constant: Any, constant_first: bool = False, name: str | None = None):
        super().__init__(name)
        who = f"ConstantOperation {self.name!r}"
        if op not in self.OPS:
            raise ValueError(f"{who}: op must be one of {', '.join(self.OPS)}, got {op!r}")
        try:
            value = np.asarray(constant, np.float64).astype(np.float32)
        except (TypeError, ValueError):
            raise ValueError(f"{who}: the constant must be a number or an array of numbers, got {constant!r}") from None
        if not np.isfinite(value).all():
            raise ValueError(f"{who}: the constant must be finite, got {constant!r}")
        if op == "divide" and (constant_first or (value == 0).any()):
            raise ValueError(
                f"{who}: malinn divides by a nonzero constant only, not "
                f"{'a constant by a tensor' if constant_first else 'by zero'}"
            )
        self.op, self.constant, self.constant_first = op, value, bool(constant_first)

    def build(self, input_shape: Any) -> None:
        super().build(input_shape)
        self.compute_output_shape(input_shape)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        sample = tuple(input_shape)[1:]
        try:
            grown = np.broadcast_shapes((1,) + sample, self.constant.shape)
        except ValueError:
            grown = None
        if grown is None or len(grown) > 1 + len(sample) or tuple(grown[1:]) != sample or grown[0] != 1:
            raise ValueError(
                f"ConstantOperation {self.name!r}: a constant of shape {self.constant.shape} does not "
                f"broadcast to inputs of shape {format_shape(tuple(input_shape))} without growing them"
            )
        return tuple(input_shape)

    def _steps(self) -> list:
        """``(scale, shift)`` pairs and ``"relu"`` in the order they compute the operation."""
        c = self.constant.astype(np.float64)
        zero = np.zeros_like(c)
        if self.op == "add":
            return [(1.0 + zero, c)]
        if self.op == "subtract":
            return [(-1.0 + zero, c)] if self.constant_first else [(1.0 + zero, -c)]
        if self.op == "multiply":
            return [(c, zero)]
        if self.op == "divide":
            return [(1.0 / c, zero)]
        if self.op == "maximum":  # relu(x - c) + c
            return ["relu"] if not c.any() else [(1.0 + zero, -c), "relu", (1.0 + zero, c)]
        return [(-1.0 + zero, c), "relu", (-1.0 + zero, c)]  # minimum: c - relu(c - x)

    def lower(self, builder, x):
        assert self.input_shape is not None, f"{self._what()} is not built"
        for i, step in enumerate(self._steps()):
            if step == "relu":
                x = kinds.activation(builder, x, "relu", what=self._what())
                continue
            (scale, period), (shift, _) = (trailing_vector(v, self.input_shape, self._what()) for v in step)
            s, t = (
                Vector(f"layer {self.name!r} {label} {i}", v, self.device_copies)
                for label, v in (("scale", scale), ("shift", shift))
            )
            x = (
                kinds.affine(builder, x, s, t, what=self._what())
                if period == 1
                else kinds.broadcast(builder, x, 0, s, t, period, what=self._what())
            )
        return x

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "op": self.op,
            "constant": self.constant.tolist(),
            "constant_first": self.constant_first,
        }


class OperatorActivation(Activation):
    """An activation function Keras 3 saves as an operation (``keras.ops.relu6(x)``: the class
    ``Relu6`` of ``keras.src.ops.nn``), the same as the Activation layer of that function."""

    keras_aliases = tuple(OPERATION_ACTIVATIONS)

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> Activation:
        name = OPERATION_ACTIVATIONS[keras.class_name]
        if name == "elu":
            return ELU(float(config.get("alpha", 1.0)), name=keras.name)
        if name == "leaky_relu":
            return LeakyReLU(float(config.get("negative_slope", 0.2)), name=keras.name)
        if name == "gelu" and config.get("approximate", True):  # keras.ops.gelu approximates by default
            name = "gelu_tanh"
        return cls(name, name=keras.name)


def operator_layer(config: dict, operand: dict, keras: KerasContext) -> Layer:
    """The layer that computes a Keras 3 operation called with a constant operand, or a tf_keras
    ``TFOpLambda`` call (``operand``: :func:`malinn.converters.chain.operator_arguments`'s
    ``{"constant", "first", "options"}``, empty for a call of tensors alone).

    Raises:
        NotConvertible: an operator or function malinn does not compute, or arguments it does not take.
    """
    constant, first, options = operand.get("constant"), bool(operand.get("first")), dict(operand.get("options") or {})
    if keras.class_name == "TFOpLambda":
        return _tf_operator(str(config.get("function")), constant, first, options, keras)
    if keras.class_name == "NotEqual" and constant is not None:  # a Keras 3 mask: not_equal(x, value)
        return not_equal_layer(constant, first, keras)
    op = OPERATIONS.get(keras.class_name)
    if op is None or constant is None:
        raise NotConvertible(
            f"with a constant operand ({_shown(constant)}): malinn computes "
            f"{', '.join(sorted(set(OPERATIONS.values())))} of a tensor and a constant"
        )
    return _constant_operation(op, constant, first, keras)


def _shown(constant: Any) -> str:
    return "an array" if isinstance(constant, list) else repr(constant)


def _constant_operation(op: str, constant: Any, first: bool, keras: KerasContext) -> Layer:
    if op == "divide" and first:
        raise NotConvertible(f"dividing a constant ({_shown(constant)}) by a tensor: malinn divides by a constant only")
    try:
        return ConstantOperation(op, constant, first, name=keras.name)
    except ValueError as exc:
        raise NotConvertible(f"({str(exc).split(': ', 1)[-1]})") from None


def _tf_operator(function: str, constant: Any, first: bool, options: dict, keras: KerasContext) -> Layer:
    """The layer of tf_keras's TFOpLambda of ``function`` (``"math.multiply"``)."""
    if function in TF_OPERATORS:
        op = TF_OPERATORS[function]
        if options:
            raise NotConvertible(f"(tf.{function}) with the arguments {sorted(options)}, which malinn does not take")
        if constant is not None:
            return _constant_operation(op, constant, first, keras)
        if first:
            raise NotConvertible(f"(tf.{function}) of a constant malinn does not read")
        return Divide(name=keras.name) if op == "divide" else _MERGES[op](name=keras.name)
    if function in TF_ACTIVATIONS and constant is None and not first:
        name = TF_ACTIVATIONS[function]
        taken = {"softmax": {"axis"}, "gelu": {"approximate"}, "leaky_relu": {"alpha"}}.get(name, set())
        if set(options) - taken:
            raise NotConvertible(
                f"(tf.{function}) with the arguments {sorted(set(options) - taken)}, which malinn does not take"
            )
        if name == "softmax":
            axis = options.get("axis", -1)
            return Softmax(axis=axis if axis is not None else -1, name=keras.name)
        if name == "leaky_relu":
            return LeakyReLU(float(options.get("alpha", 0.2)), name=keras.name)
        if name == "gelu" and options.get("approximate", False):  # tf.nn.gelu is exact by default
            name = "gelu_tanh"
        return Activation(name, name=keras.name)
    raise NotConvertible(
        f"(tf.{function}): malinn computes tf_keras's operators {', '.join(sorted(TF_OPERATORS))} (of two tensors "
        f"or a tensor and a constant) and the activations {', '.join(sorted(TF_ACTIVATIONS))}; a Keras 3 save of "
        "the model may convert (Keras 3 writes the operation as a layer or an operation malinn reads)"
    )
