"""What a layer class reads when it converts itself from a Keras layer's saved config.

A malinn layer class declares the Keras layers it stands for (:class:`malinn.layers.Layer`):

* its own class name, and any other Keras class name in ``keras_aliases`` (Keras 2 and Keras 3
  spellings, the inference no-ops that :class:`~malinn.layers.Identity` stands for);
* how a config becomes an instance: the config keys its constructor takes as they are
  (``keras_config_keys``), or its own ``from_keras_config(config, keras)`` where values need
  mapping (an activation's name, a Keras 2 key, an epsilon that differs between Keras 2 and 3);
* ``from_keras_time_distributed`` where Keras's ``TimeDistributed`` of it is that layer (its axes
  shifted) on the wider input.

Both read a :class:`KerasContext` (the Keras class, the name, the Keras generation, the input shape)
and raise :class:`NotConvertible` for a config no malinn layer computes; the converter
(:mod:`malinn.converters.to_malinn`) collects those into one error. Nothing here reads a file.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "KerasContext",
    "NotConvertible",
    "SUPPORTED_ACTIVATIONS",
    "activation_name",
    "keras_activation",
    "shifted_axes",
    "with_axis_shifted",
]


class NotConvertible(Exception):
    """A Keras layer config that no malinn layer computes. The message says why, as it follows the
    layer's class and name in the converter's list (``with activation 'log_softmax'``; empty where
    the class alone says it)."""


@dataclass(frozen=True)
class KerasContext:
    """What a layer's conversion reads besides the config.

    Attributes:
        class_name: the Keras class the config is of (one of the class's own name and aliases).
        name: the name the malinn layer takes (the Keras layer's, or its path through nested models).
        keras_major: 2 or 3: the Keras generation whose definitions the config follows (they differ:
            ``hard_sigmoid``, ``UnitNormalization``'s and ``Dot``'s epsilon).
        input_shape: the shape the layer is called on, batch axis first (``None`` for an axis not
            known: after a layer that was not converted).
        has_weights: whether the file holds weights for the layer.
    """

    class_name: str
    name: str
    keras_major: int = 3
    input_shape: tuple = (None, None)
    has_weights: bool = False

    @property
    def rank(self) -> int:
        """The rank of the input, the batch axis counted."""
        return len(self.input_shape)

    def of(self, class_name: str) -> "KerasContext":
        """The same context for a layer of another Keras class (the layer a wrapper holds)."""
        return replace(self, class_name=class_name)


#: Keras activation names -> malinn's (Keras 2 and 3 spell some differently).
SUPPORTED_ACTIVATIONS = {
    "linear": "linear",
    "relu": "relu",
    "relu6": "relu6",
    "sigmoid": "sigmoid",
    "tanh": "tanh",
    "softmax": "softmax",
    "softmax_v2": "softmax",
    "elu": "elu",
    "selu": "selu",
    "softplus": "softplus",
    "softsign": "softsign",
    "swish": "swish",
    "silu": "swish",
    "gelu": "gelu",
    "exponential": "exponential",
    "leaky_relu": "leaky_relu",
    "hard_sigmoid": "hard_sigmoid",
    "hard_silu": "hard_swish",
    "hard_swish": "hard_swish",
    "mish": "mish",
}

#: config keys holding Keras sizes, saved as JSON lists and given to the layers as tuples
SIZE_KEYS = ("kernel_size", "strides", "dilation_rate", "pool_size", "size")


def activation_name(value: Any) -> str | None:
    """The activation's name from a config value: a string, or Keras 3's serialized dict."""
    if value is None:
        return "linear"
    if isinstance(value, str):
        return value.rsplit(".", 1)[-1]
    if isinstance(value, dict):  # the reader has refused custom functions and classes
        if value.get("class_name") == "function" and isinstance(value.get("config"), str):
            return value["config"].rsplit(".", 1)[-1]
        if isinstance(value.get("class_name"), str):  # an activation object (a layer class)
            return value["class_name"]
    return None


def keras_activation(value: Any, keras: KerasContext) -> str:
    """malinn's name for the Keras activation of a config value.

    Raises:
        NotConvertible: malinn has no kernel for it.
    """
    name = activation_name(value)
    mapped = SUPPORTED_ACTIVATIONS.get(name) if name is not None else None
    if mapped is None:
        raise NotConvertible(f"with activation {activation_name(value)!r}")
    if mapped == "hard_sigmoid" and keras.keras_major == 2:
        return "hard_sigmoid_keras2"  # Keras 2: clip(0.2 x + 0.5, 0, 1); Keras 3: relu6(x + 3) / 6
    return mapped


def shifted_axes(axis):
    """A ``TimeDistributed`` inner layer's axis on the outer input: non-negative axes move by one
    (Keras applies the layer to each time step, axis 1 of the outer input)."""
    if isinstance(axis, (list, tuple)):
        return [shifted_axes(a) for a in axis]
    return axis + 1 if isinstance(axis, int) and not isinstance(axis, bool) and axis >= 0 else axis


def with_axis_shifted(config: dict, key: str = "axis") -> dict:
    """``config`` with its ``key`` axis (where it has one) shifted by :func:`shifted_axes`."""
    config = dict(config)
    if config.get(key) is not None:
        config[key] = shifted_axes(config[key])
    return config
