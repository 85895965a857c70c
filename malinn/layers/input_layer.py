"""Symbolic tensors of a Functional graph, as in Keras: ``Input(shape)`` and ``layer(tensor)``.

``Input((8,), name="x")`` is a :class:`KerasTensor` with no producer; calling a layer on one
tensor (``Dense(4)(x)``) or on a list of them (``Add()([a, b])``) builds the layer for their shapes
and returns a new tensor whose :class:`Node` records the call. ``malinn.Functional(inputs,
outputs)`` walks the nodes back from its outputs. A layer called twice (a shared layer) has two
nodes and one set of weights.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Protocol

import numpy as np

from ..plan.tensor import format_shape
from .dtypes import input_cast, input_dtype


class CalledLayer(Protocol):
    """What calling a layer on tensors asks of it (every :class:`~malinn.layers.base.Layer` has it;
    declared here so that this module, below the layers, names no layer class)."""

    name: str
    built: bool

    def build(self, input_shape: Any) -> None: ...

    def check_reuse(self, input_shape: Any, how: str = ...) -> None: ...

    def compute_output_shape(self, input_shape: Any) -> Any: ...


__all__ = ["KerasTensor", "Node", "Input", "call_layer"]

_input_names = itertools.count()
_name_lock = threading.Lock()


class KerasTensor:
    """A symbolic tensor: Keras's shape (``None`` for the batch axis) and the call producing it.

    Attributes:
        shape: ``(None, d1, ...)``.
        node: the :class:`Node` that produced it, or ``None`` for a model input.
        name: the input's name (for an input), else the producing layer's name.
        dtype: an input's dtype (``"float32"``, ``"int32"``...: what predict casts it to first,
            :mod:`malinn.layers.dtypes`); ``"float32"`` for a layer's output.
        cast: the function that casts an input's values (None where there is nothing to cast),
            chosen once here.
    """

    def __init__(self, shape: tuple, node: "Node | None" = None, name: str = "", dtype: str = "float32"):
        self.shape: tuple[int | None, ...] = (None,) + tuple(int(d) for d in tuple(shape)[1:])
        self.node, self.name = node, name
        self.dtype, self.cast = dtype, input_cast(dtype)

    def __repr__(self) -> str:
        return f"<KerasTensor shape={format_shape(self.shape)} name={self.name!r}>"


class Node:
    """One call of a layer: its input tensors (a list when the layer was called on a list) and
    its output tensor."""

    def __init__(self, layer: CalledLayer, inputs: list, listed: bool):
        self.layer, self.inputs, self.listed = layer, list(inputs), listed
        #: every output tensor, in order (several for a layer returning a list: a recurrent
        #: layer's output and states); ``output`` is the first
        self.outputs: list[KerasTensor] = []

    @property
    def output(self) -> KerasTensor:
        """The call's (first) output tensor."""
        return self.outputs[0]

    def input_shapes(self) -> tuple | list[tuple]:
        """The shape(s) the layer was called with: a list for a listed call, else one shape."""
        shapes = [t.shape for t in self.inputs]
        return shapes if self.listed else shapes[0]


def Input(shape: Any, name: str | None = None, dtype: Any = None) -> KerasTensor:  # noqa: N802 (Keras's name)
    """A model input of one sample's ``shape`` (without the batch axis), as ``keras.Input``.

    Args:
        shape: one sample's shape, a tuple of positive integers (or one integer).
        name: the input's name, which ``predict`` takes a dict by (default: ``input_layer``,
            ``input_layer_1``, ... in order of creation).
        dtype: what ``predict`` casts the input to before the first layer, as Keras does:
            ``"float32"`` (the default, None), ``"float64"``, ``"float16"``, ``"bfloat16"``, an
            integer type (``"int32"``, ``"uint8"``...: toward zero, wrapped) or ``"bool"``; a
            name or a numpy type (:mod:`malinn.layers.dtypes`). The layers compute in float32 on the cast
            values.

    Returns:
        A :class:`KerasTensor` of shape ``(None,) + shape``.

    Raises:
        ValueError: a size is not a positive integer, ``name`` is not a non-empty string, or
            ``dtype`` is not one an input may have (a string, a complex number, an unknown name).
    """
    try:
        dims = tuple(shape)
    except TypeError:
        dims = (shape,)
    if not dims or any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1 for d in dims):
        raise ValueError(f"Input: shape must be a tuple of positive integers (no batch axis), got {shape!r}")
    if name is None:
        with _name_lock:
            i = next(_input_names)
        name = "input_layer" if i == 0 else f"input_layer_{i}"
    if not isinstance(name, str) or not name:
        raise ValueError(f"Input: name must be a non-empty string, got {name!r}")
    return KerasTensor((None,) + dims, name=name, dtype=input_dtype(dtype, f"Input {name!r}"))


def call_layer(layer: CalledLayer, inputs: Any) -> KerasTensor | list[KerasTensor]:
    """Calls ``layer`` on a tensor or a list of tensors: builds it for their shapes on its first
    call, checks them on later ones (a shared layer), and returns its output tensor.

    Raises:
        ValueError: an input is not a :class:`KerasTensor`, or a built layer receives a shape it
            was not built for.
    """
    listed = isinstance(inputs, (list, tuple))
    tensors = list(inputs) if listed else [inputs]
    if not tensors or not all(isinstance(t, KerasTensor) for t in tensors):
        raise ValueError(
            f"layer {layer.name!r}: call it on malinn.Input tensors (or the tensors layers return) "
            f"to build a Functional model; run arrays with model.predict"
        )
    shapes = [t.shape for t in tensors]
    given = shapes if listed else shapes[0]
    if not layer.built:
        layer.build(given)
    elif not listed:
        layer.check_reuse(given, "is called on")
    node = Node(layer, tensors, listed)
    shape: tuple | list = layer.compute_output_shape(given)  # a list where a layer has several outputs
    if isinstance(shape, list):  # several outputs (return_state): a list of tensors, as Keras returns
        node.outputs = [KerasTensor(s, node, name=layer.name) for s in shape]
        return node.outputs
    node.outputs = [KerasTensor(shape, node, name=layer.name)]
    return node.output
