"""Keras's recurrent layers: SimpleRNN, LSTM and GRU, computed on the device in two launches.

The input projection of every time step, ``x_t @ kernel + bias``, is one matmul over the
``(batch, steps, features)`` input; the recurrence over the steps is one launch of
kernels/recurrent.cl, one work-group per sample holding the state in local memory (one work item
per unit: a layer of more units than the device's largest work-group is refused by name). The
weights are Keras's, in its gate order (LSTM: i, f, c, o; GRU: z, r, h). Dropout and
recurrent dropout do nothing at inference; ``unroll`` computes the same; ``stateful`` models
(state carried from one predict call to the next) are refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..plan import kinds
from ..plan.tensor import format_shape
from ..plan.tensors import Vector, Weight
from .activation import get_activation
from .base import Layer, glorot_uniform, numeric_weights, zeros
from .keras_config import KerasContext, NotConvertible, keras_activation
from .masking import mask_of, with_mask

if TYPE_CHECKING:
    from ..plan.builder import PlanBuilder
    from ..plan.tensors import Value

__all__ = ["SimpleRNN", "LSTM", "GRU", "RECURRENT_ACTIVATIONS"]

#: activations the recurrence computes (element-wise, without parameters)
RECURRENT_ACTIVATIONS = (
    "linear",
    "relu",
    "relu6",
    "sigmoid",
    "tanh",
    "exponential",
    "softsign",
    "softplus",
    "swish",
    "hard_sigmoid",
    "hard_sigmoid_keras2",
    "hard_swish",
    "gelu",
    "selu",
    "mish",
)


def _activation(value: str | None, who: str) -> str:
    name = get_activation(value)
    if name not in RECURRENT_ACTIVATIONS:
        raise ValueError(
            f"{who}: the recurrence computes the activations {', '.join(RECURRENT_ACTIVATIONS)}, not {name!r}"
        )
    return name


class _Recurrent(Layer):
    """What SimpleRNN, LSTM and GRU share (Keras's ``RNN`` of one cell)."""

    weight_names = ("kernel", "recurrent_kernel", "bias")
    #: called on ``[x, mask]``, it takes the second as Keras's mask (a Keras 3 file's call with ``mask=``)
    keras_takes_mask = True
    #: the kernel's cell (malinn.plan.kinds.recurrent.CELLS) and gates per unit
    cell = ""
    gates = 1
    #: the Keras config keys that change nothing at inference
    _inference_only = ("dropout", "recurrent_dropout", "unroll")

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "_Recurrent":
        if config.get("stateful"):
            raise NotConvertible(
                "with stateful=True (its state carries over from one batch to the next; malinn "
                "runs each predict call from a zero state: save the model with stateful=False)"
            )
        if config.get("time_major"):
            raise NotConvertible("with time_major=True")
        kwargs: dict[str, Any] = {"activation": keras_activation(config.get("activation", "tanh"), keras)}
        if cls is not SimpleRNN:
            kwargs["recurrent_activation"] = keras_activation(config.get("recurrent_activation", "sigmoid"), keras)
        if cls is GRU:
            kwargs["reset_after"] = bool(config.get("reset_after", True))
        for key in ("units", "use_bias", "return_sequences", "return_state", "go_backwards"):
            if key in config:
                kwargs[key] = config[key]
        kwargs["zero_output_for_mask"] = bool(config.get("zero_output_for_mask", False))
        for name in ("activation", "recurrent_activation"):
            if name in kwargs and kwargs[name] not in RECURRENT_ACTIVATIONS:
                raise NotConvertible(f"with {name} {kwargs[name]!r}")
        return cls(name=keras.name, **kwargs)

    def __init__(
        self,
        units: int,
        activation: str = "tanh",
        recurrent_activation: str = "sigmoid",
        use_bias: bool = True,
        return_sequences: bool = False,
        return_state: bool = False,
        go_backwards: bool = False,
        zero_output_for_mask: bool = False,
        name: str | None = None,
    ):
        super().__init__(name)
        who = f"{type(self).__name__} layer {self.name!r}"
        if isinstance(units, bool) or not isinstance(units, (int, np.integer)) or units < 1:
            raise ValueError(f"{who}: units must be a positive integer, got {units!r}")
        self.units = int(units)
        self.activation = _activation(activation, who)
        self.recurrent_activation = _activation(recurrent_activation, who)
        self.use_bias = bool(use_bias)
        self.return_sequences = bool(return_sequences)
        self.return_state = bool(return_state)
        self.go_backwards = bool(go_backwards)
        self.zero_output_for_mask = bool(zero_output_for_mask)
        self.kernel: np.ndarray | None = None
        self.recurrent_kernel: np.ndarray | None = None
        self.bias: np.ndarray | None = None

    # ---------------------------------------------------------------- shapes and weights
    @property
    def state_count(self) -> int:
        """The states the layer returns with ``return_state`` (an LSTM's h and c; h)."""
        return 1

    def _bias_shape(self) -> tuple:
        return (self.gates * self.units,)

    def build(self, input_shape: Any) -> None:
        """Creates ``kernel`` (features, gates * units), ``recurrent_kernel`` (units, gates *
        units) and ``bias`` for inputs ``(batch, steps, features)`` (or ``[inputs, mask]``)."""
        super().build(self._without_mask(input_shape))
        if len(self._built_shape()) != 2:
            raise ValueError(
                f"{type(self).__name__} layer {self.name!r} takes inputs (batch, steps, features), "
                f"got {format_shape(input_shape)}"
            )
        features, width = self._built_shape()[-1], self.gates * self.units
        self.kernel = glorot_uniform((features, width), features, width)
        self.recurrent_kernel = glorot_uniform((self.units, width), self.units, width)
        self.bias = zeros(self._bias_shape()) if self.use_bias else None

    @staticmethod
    def _without_mask(input_shape):
        """The input's shape of a call on ``[inputs, mask]``, else ``input_shape``."""
        return input_shape[0] if isinstance(input_shape, list) else input_shape

    def compute_output_shape(self, input_shape):
        batch, steps = tuple(self._without_mask(input_shape))[:2]
        output = (batch, steps, self.units) if self.return_sequences else (batch, self.units)
        if self.return_state:
            return [output] + [(batch, self.units)] * self.state_count
        return output

    def set_weights(self, weights: Any) -> None:
        """Sets ``[kernel, recurrent_kernel, bias]`` (``bias`` only with ``use_bias``) in Keras's shapes.

        Raises:
            ValueError: the count or a shape differs from the layer's.
        """
        who = f"{type(self).__name__} layer {self.name!r}"
        weights = numeric_weights(weights, who)
        want = 2 + self.use_bias
        width = self.gates * self.units
        if len(weights) != want:
            raise ValueError(
                f"{who} expects {want} weight arrays (kernel, recurrent_kernel"
                f"{', bias' if self.use_bias else ''}), got {len(weights)}"
            )
        kernel, recurrent = weights[0], weights[1]
        features = self._built_shape()[-1] if self.built else (kernel.shape[0] if kernel.ndim == 2 else -1)
        expected = [(features, width), (self.units, width)] + ([self._bias_shape()] if self.use_bias else [])
        got = [w.shape for w in weights]
        if got != expected:
            raise ValueError(f"{who}: weights of shapes {got} do not match {expected}")
        if not self.built:
            Layer.build(self, (None, 1, features))
        self.kernel, self.recurrent_kernel = kernel, recurrent
        self.bias = weights[2] if self.use_bias else None
        self._weights_changed()

    # ---------------------------------------------------------------- lowering
    def _kernels(self) -> tuple[np.ndarray, np.ndarray]:
        """``kernel`` and ``recurrent_kernel`` of the built layer."""
        assert self.kernel is not None and self.recurrent_kernel is not None, f"{self._what()} is not built"
        return self.kernel, self.recurrent_kernel

    def _input_bias(self) -> np.ndarray | None:
        return self.bias

    def _recurrent_bias(self) -> np.ndarray | None:
        return None

    def lower(self, builder, x):
        return self.lower_recurrence(builder, x, self.zero_output_for_mask)

    def lower_recurrence(
        self, builder: PlanBuilder, x: Value | list[Value], zero_masked: bool, reverse_output: bool = False
    ) -> Any:
        """Records this layer on ``x`` (or ``[x, mask]``): its output, or ``[output, *states]`` with
        ``return_state``; a masked step's output is zero with ``zero_masked``; ``reverse_output``
        writes the sequence in the other order (a Bidirectional's backward layer)."""
        given_mask = None
        if isinstance(x, list):  # [inputs, mask]: a (batch, steps) mask, kept where not 0
            x, given_mask = x
        if len(x.shape) != 3:
            raise ValueError(f"{self._what()}: takes inputs (batch, steps, features), got {format_shape(x.shape)}")
        width = self.gates * self.units
        weight = Weight(
            f"{self._what()} kernel", (width, x.shape[-1]), lambda: self._kernels()[0].T, self.device_copies
        )
        input_bias = self._input_bias()
        bias = Vector(f"{self._what()} bias", input_bias, self.device_copies) if input_bias is not None else None
        xproj = kinds.matmul(builder, x, weight, bias, what=f"{self._what()} input projection")
        recurrent = Vector(f"{self._what()} recurrent kernel", self._kernels()[1], self.device_copies)
        recurrent_bias = self._recurrent_bias()
        rbias = (
            Vector(f"{self._what()} recurrent bias", recurrent_bias, self.device_copies)
            if recurrent_bias is not None
            else None
        )
        mask = given_mask if given_mask is not None else mask_of(builder, x)

        def run(sequences: bool, state: str = "h") -> Value:
            return kinds.recurrence(
                builder,
                xproj,
                self.units,
                self.cell,
                recurrent,
                rbias,
                self.activation,
                self.recurrent_activation,
                self.go_backwards,
                sequences,
                state,
                mask,
                zero_masked,
                reverse_output,
                what=self._what(),
            )

        output = run(self.return_sequences)
        if self.return_sequences:
            with_mask(builder, output, mask)
        if not self.return_state:
            return output
        states = [output if not self.return_sequences else run(False)]
        if self.state_count == 2:
            states.append(run(False, "c"))
        return [output] + states

    def get_config(self) -> dict:
        config = {
            **super().get_config(),
            "units": self.units,
            "activation": self.activation,
            "use_bias": self.use_bias,
            "return_sequences": self.return_sequences,
            "return_state": self.return_state,
            "go_backwards": self.go_backwards,
            "zero_output_for_mask": self.zero_output_for_mask,
        }
        if type(self) is not SimpleRNN:
            config["recurrent_activation"] = self.recurrent_activation
        return config


class SimpleRNN(_Recurrent):
    """A fully-connected recurrence, ``h_t = activation(x_t @ kernel + h_{t-1} @ recurrent_kernel
    + bias)`` (Keras's SimpleRNN).

    Args:
        units: the state's size, a positive integer.
        activation: the activation's name (default ``"tanh"``).
        use_bias: whether the layer adds a bias.
        return_sequences: return every step's output ``(batch, steps, units)``, not the last
            ``(batch, units)``.
        return_state: return the last state after the output (a list).
        go_backwards: run the steps from the last (the sequence returned in that order).
        zero_output_for_mask: a masked step outputs zeros, not the previous output.
        name: the layer's name.

    Raises:
        ValueError: ``units`` is not a positive integer or the activation is not one the recurrence
            computes (:data:`RECURRENT_ACTIVATIONS`).
    """

    cell, gates = "simple_rnn", 1

    def __init__(
        self,
        units: int,
        activation: str = "tanh",
        use_bias: bool = True,
        return_sequences: bool = False,
        return_state: bool = False,
        go_backwards: bool = False,
        zero_output_for_mask: bool = False,
        name: str | None = None,
    ):
        super().__init__(
            units,
            activation,
            "sigmoid",
            use_bias,
            return_sequences,
            return_state,
            go_backwards,
            zero_output_for_mask,
            name,
        )


class LSTM(_Recurrent):
    """Long short-term memory (Keras's LSTM): gates i, f, c, o in that order in every weight.

    Args:
        units, activation, use_bias, return_sequences, return_state, go_backwards,
        zero_output_for_mask, name: as :class:`SimpleRNN`.
        recurrent_activation: the gates' activation (default ``"sigmoid"``).

    Raises:
        ValueError: as :class:`SimpleRNN`.
    """

    cell, gates = "lstm", 4

    @property
    def state_count(self) -> int:
        return 2


class GRU(_Recurrent):
    """The gated recurrent unit (Keras's GRU): gates z, r, h in that order in every weight.

    Args:
        units, activation, recurrent_activation, use_bias, return_sequences, return_state,
        go_backwards, zero_output_for_mask, name: as :class:`LSTM`.
        reset_after: apply the reset gate after the recurrent matmul (Keras's default, with a
            separate recurrent bias: ``bias`` of shape (2, 3 * units)), else before it.

    Raises:
        ValueError: as :class:`SimpleRNN`.
    """

    gates = 3

    def __init__(
        self,
        units: int,
        activation: str = "tanh",
        recurrent_activation: str = "sigmoid",
        use_bias: bool = True,
        return_sequences: bool = False,
        return_state: bool = False,
        go_backwards: bool = False,
        reset_after: bool = True,
        zero_output_for_mask: bool = False,
        name: str | None = None,
    ):
        super().__init__(
            units,
            activation,
            recurrent_activation,
            use_bias,
            return_sequences,
            return_state,
            go_backwards,
            zero_output_for_mask,
            name,
        )
        self.reset_after = bool(reset_after)
        self.cell = "gru" if self.reset_after else "gru_reset_before"

    def _bias_shape(self) -> tuple:
        return (2, 3 * self.units) if self.reset_after else (3 * self.units,)

    def _input_bias(self) -> np.ndarray | None:
        return self.bias[0] if self.reset_after and self.bias is not None else self.bias

    def _recurrent_bias(self) -> np.ndarray | None:
        return self.bias[1] if self.reset_after and self.bias is not None else None

    def get_config(self) -> dict:
        return {**super().get_config(), "reset_after": self.reset_after}
