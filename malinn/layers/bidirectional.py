"""Keras's Bidirectional wrapper: a recurrent layer run over the sequence forward and backward.

The forward and the backward layer (by default the wrapped layer's copy with ``go_backwards``)
each run as their own recurrence (malinn.layers.recurrent); the backward layer's sequence is
written in the input's order by its kernel (Keras flips it back), and the two are merged
(``merge_mode``). As in Keras, both layers output zeros at masked steps when they return
sequences (Keras forces ``zero_output_for_mask = return_sequences`` on them).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from ..plan import kinds
from ..plan.tensor import format_shape
from ..registry import lookup
from .base import Layer
from .keras_config import KerasContext, NotConvertible
from .masking import mask_of, with_mask
from .recurrent import _Recurrent

__all__ = ["Bidirectional", "MERGE_MODES"]

#: Keras's merge modes (None: the two outputs returned apart)
MERGE_MODES = ("concat", "sum", "mul", "ave", None)


def _layer_from(config: object, keras: KerasContext, who: str, prefix: str) -> _Recurrent:
    """The recurrent layer a Keras ``{"class_name", "config"}`` stands for, named ``prefix`` + its
    name (as Keras names a Bidirectional's layers)."""
    if not isinstance(config, dict) or not isinstance(config.get("class_name"), str):
        raise NotConvertible("without a recurrent layer in its config")
    class_name = config["class_name"]
    try:
        cls = lookup("keras", class_name)
    except KeyError:
        raise NotConvertible(f"of {class_name} ({who}: malinn runs Bidirectional of SimpleRNN, LSTM and GRU)") from None
    if not (isinstance(cls, type) and issubclass(cls, _Recurrent)) or class_name in cls.keras_refused:
        raise NotConvertible(f"of {class_name} ({who}: malinn runs Bidirectional of SimpleRNN, LSTM and GRU)")
    inner = dict(config.get("config") or {})
    name = str(inner.get("name") or class_name.lower())
    return cls.from_keras_config(inner, replace(keras, class_name=class_name, name=prefix + name.removeprefix(prefix)))


class Bidirectional(Layer):
    """Runs a recurrent layer forward and a copy backward over the sequence and merges their
    outputs (Keras's Bidirectional).

    Args:
        layer: the forward layer, a :class:`~malinn.layers.SimpleRNN`, :class:`~malinn.layers.LSTM`
            or :class:`~malinn.layers.GRU`.
        merge_mode: ``"concat"`` (default), ``"sum"``, ``"mul"``, ``"ave"``, or None (the forward
            and the backward outputs returned apart, a list).
        backward_layer: the backward layer; default: ``layer``'s copy with ``go_backwards``
            the other way and its own weights.
        name: the layer's name.

    Raises:
        ValueError: ``layer`` is not recurrent, ``merge_mode`` is not one of :data:`MERGE_MODES`,
            or the two layers differ in ``return_sequences`` / ``return_state`` or run the same way.
    """

    #: called on ``[x, mask]``, it takes the second as Keras's mask (a Keras 3 file's call with ``mask=``)
    keras_takes_mask = True

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "Bidirectional":
        who = f"Bidirectional {keras.name!r}"
        forward = _layer_from(config.get("layer"), keras, f"{who} layer", "forward_")
        backward = None
        if config.get("backward_layer") is not None:
            backward = _layer_from(config["backward_layer"], keras, f"{who} backward_layer", "backward_")
        merge_mode = config.get("merge_mode", "concat")
        if merge_mode not in MERGE_MODES:
            raise NotConvertible(f"with merge_mode {merge_mode!r}")
        return cls(forward, merge_mode=merge_mode, backward_layer=backward, name=keras.name)

    def __init__(
        self,
        layer: Layer,
        merge_mode: str | None = "concat",
        backward_layer: Layer | None = None,
        name: str | None = None,
    ):
        super().__init__(name)
        who = f"Bidirectional layer {self.name!r}"
        if not isinstance(layer, _Recurrent):
            raise ValueError(f"{who}: wraps a SimpleRNN, LSTM or GRU layer, got {type(layer).__name__}")
        if merge_mode not in MERGE_MODES:
            raise ValueError(f"{who}: merge_mode must be one of {MERGE_MODES}, got {merge_mode!r}")
        if backward_layer is None:
            config = layer.get_config()
            config.update(name=f"backward_{layer.name.removeprefix('forward_')}", go_backwards=not layer.go_backwards)
            backward_layer = type(layer).from_config(config)
        if not isinstance(backward_layer, _Recurrent):  # a copy of layer is one
            raise ValueError(
                f"{who}: backward_layer must be a SimpleRNN, LSTM or GRU layer, got {type(backward_layer).__name__}"
            )
        for option in ("return_sequences", "return_state"):
            if getattr(layer, option) != getattr(backward_layer, option):
                raise ValueError(
                    f"{who}: the forward and the backward layer differ in {option} "
                    f"({getattr(layer, option)} and {getattr(backward_layer, option)})"
                )
        if layer.go_backwards == backward_layer.go_backwards:
            raise ValueError(f"{who}: the forward and the backward layer both have go_backwards={layer.go_backwards}")
        if layer.state_count != backward_layer.state_count:
            raise ValueError(
                f"{who}: the forward ({type(layer).__name__}) and the backward layer "
                f"({type(backward_layer).__name__}) return different states"
            )
        self.forward_layer, self.backward_layer = layer, backward_layer
        self.merge_mode = merge_mode
        self.return_sequences, self.return_state = layer.return_sequences, layer.return_state

    # ---------------------------------------------------------------- shapes and weights
    def build(self, input_shape: Any) -> None:
        """Builds the forward and the backward layer for inputs ``(batch, steps, features)``."""
        shape = input_shape[0] if isinstance(input_shape, list) else input_shape
        super().build(shape)
        self.forward_layer.build(shape)
        self.backward_layer.build(shape)

    def compute_output_shape(self, input_shape):
        shape = input_shape[0] if isinstance(input_shape, list) else input_shape
        forward = self.forward_layer.compute_output_shape(shape)
        backward = self.backward_layer.compute_output_shape(shape)
        output, states = (forward[0], forward[1:]) if self.return_state else (forward, [])
        back_output, back_states = (backward[0], backward[1:]) if self.return_state else (backward, [])
        if self.merge_mode is None:
            outputs = [tuple(output), tuple(back_output)]
        elif self.merge_mode == "concat":
            outputs = [tuple(output[:-1]) + (output[-1] + back_output[-1],)]
        else:
            outputs = [tuple(output)]
        if not self.return_state and len(outputs) == 1:
            return outputs[0]
        return outputs + [tuple(s) for s in list(states) + list(back_states)]

    def weight_arrays(self) -> list:
        """The forward layer's weights, then the backward layer's (Keras's order)."""
        return self.forward_layer.weight_arrays() + self.backward_layer.weight_arrays() if self.built else []

    def set_weights(self, weights: Any) -> None:
        """Sets the forward layer's weights, then the backward layer's (Keras's order).

        Raises:
            ValueError: the count or a shape differs from the layers'.
        """
        weights = list(weights)
        half = 2 + self.forward_layer.use_bias
        want = half + 2 + self.backward_layer.use_bias
        if len(weights) != want:
            raise ValueError(
                f"Bidirectional layer {self.name!r} expects {want} weight arrays (the forward layer's, "
                f"then the backward layer's), got {len(weights)}"
            )
        self.forward_layer.set_weights(weights[:half])
        self.backward_layer.set_weights(weights[half:])
        if not self.built:
            Layer.build(self, (None,) + self.forward_layer._built_shape())
        self._weights_changed()

    def count_params(self) -> int:
        return self.forward_layer.count_params() + self.backward_layer.count_params()

    # ---------------------------------------------------------------- lowering
    def lower(self, builder, x):
        sequence = x[0] if isinstance(x, list) else x
        if len(sequence.shape) != 3:
            raise ValueError(
                f"{self._what()}: takes inputs (batch, steps, features), got {format_shape(sequence.shape)}"
            )
        mask = x[1] if isinstance(x, list) else mask_of(builder, sequence)
        given = [sequence, mask] if mask is not None else sequence
        zero = self.return_sequences  # Keras forces zero_output_for_mask = return_sequences on both
        forward = self.forward_layer.lower_recurrence(builder, given, zero)
        backward = self.backward_layer.lower_recurrence(builder, given, zero, reverse_output=True)
        forward, states = (forward[0], forward[1:]) if self.return_state else (forward, [])
        backward, back_states = (backward[0], backward[1:]) if self.return_state else (backward, [])
        what = self._what()
        if self.merge_mode is None:
            outputs = [forward, backward]
        elif self.merge_mode == "concat":
            outputs = [kinds.concat(builder, [forward, backward], len(forward.shape) - 1, what=f"{what} concat")]
        else:
            op = {"sum": "add", "mul": "multiply", "ave": "average"}[self.merge_mode]
            outputs = [kinds.merge(builder, [forward, backward], op, what=f"{what} {self.merge_mode}")]
        if self.return_sequences:
            for output in outputs:
                with_mask(builder, output, mask)
        if not self.return_state and len(outputs) == 1:
            return outputs[0]
        return outputs + list(states) + list(back_states)

    def get_config(self) -> dict:
        def serialize(layer: Layer) -> dict:
            return {"class_name": type(layer).__name__, "config": layer.get_config()}

        return {
            **super().get_config(),
            "layer": serialize(self.forward_layer),
            "merge_mode": self.merge_mode,
            "backward_layer": serialize(self.backward_layer),
        }

    @classmethod
    def from_config(cls, config: dict) -> "Bidirectional":
        config = copy.deepcopy(config)

        def deserialize(item: Layer | dict | None) -> Layer | None:
            if item is None or isinstance(item, Layer):
                return item
            return lookup("layer", item["class_name"]).from_config(item["config"])

        config["layer"] = deserialize(config["layer"])
        config["backward_layer"] = deserialize(config.get("backward_layer"))
        return cls(**config)
