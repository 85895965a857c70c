"""Keras's convolutional LSTM layers, channels last: ``ConvLSTM1D``, ``ConvLSTM2D`` and ``ConvLSTM3D``.

An LSTM whose input and recurrent transformations are convolutions (Keras's ``ConvLSTMCell``):
per step, with the gates in Keras's order i, f, c, o,

    z = conv(x_t, kernel) + bias + conv(h, recurrent_kernel)
    c = RACT(z_f) * c + RACT(z_i) * ACT(z_c),   h = RACT(z_o) * ACT(c)

the input convolution with the layer's strides, padding and dilation, the recurrent one ``'same'``
with stride 1 (as Keras's). On the device the input convolution of every step is one convolution
over ``batch * steps`` images (volumes: one Conv3D); then each step is its recurrent convolution (none at the first step,
where ``h`` is zero) and two launches of the gate kernel, the new ``c`` then the new ``h``, all
recorded once in the plan (:mod:`malinn.plan.kinds.conv_lstm`). Dropout and recurrent dropout do
nothing at inference; ``stateful`` models are refused by name. The ``gl``
backend runs the gates from kernels/gl/conv_lstm_gates.comp; ``gles3`` devices have no gate kernel
and refuse the layer by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..plan import kinds
from ..plan.tensor import format_shape
from ..plan.tensors import Vector, Weight
from .activation import get_activation
from .base import Layer, glorot_uniform, numeric_weights, zeros
from .keras_config import SIZE_KEYS, KerasContext, NotConvertible, keras_activation
from .recurrent import RECURRENT_ACTIVATIONS
from .volumes import volume_defines
from .windows import as_tuple, output_size, window_defines

if TYPE_CHECKING:
    from ..plan.builder import PlanBuilder
    from ..plan.tensors import Value

__all__ = ["ConvLSTM1D", "ConvLSTM2D", "ConvLSTM3D"]

#: the gates of a step, in Keras's order (i, f, c, o)
GATES = 4


def _activation(value: str | None, who: str) -> str:
    name = get_activation(value)
    if name not in RECURRENT_ACTIVATIONS:
        raise ValueError(f"{who}: the gates compute the activations {', '.join(RECURRENT_ACTIVATIONS)}, not {name!r}")
    return name


class _ConvLSTM(Layer):
    """What ConvLSTM1D, ConvLSTM2D and ConvLSTM3D share (Keras's ``ConvLSTM`` of rank 1, 2 or 3)."""

    weight_names = ("kernel", "recurrent_kernel", "bias")
    rank = 2

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "_ConvLSTM":
        if config.get("stateful"):
            raise NotConvertible(
                "with stateful=True (its state carries over from one batch to the next; malinn "
                "runs each predict call from a zero state: save the model with stateful=False)"
            )
        if config.get("data_format") not in (None, "channels_last"):
            raise NotConvertible(f"with data_format={config['data_format']!r} (malinn runs channels_last)")
        kwargs: dict[str, Any] = {
            "activation": keras_activation(config.get("activation", "tanh"), keras),
            "recurrent_activation": keras_activation(config.get("recurrent_activation", "sigmoid"), keras),
        }
        for name in ("activation", "recurrent_activation"):
            if kwargs[name] not in RECURRENT_ACTIVATIONS:
                raise NotConvertible(f"with {name} {kwargs[name]!r}")
        for key in (
            "filters",
            "kernel_size",
            "strides",
            "padding",
            "dilation_rate",
            "use_bias",
            "unit_forget_bias",
            "return_sequences",
            "return_state",
            "go_backwards",
        ):
            if key in config:
                value = config[key]
                kwargs[key] = tuple(value) if key in SIZE_KEYS and isinstance(value, list) else value
        return cls(name=keras.name, **kwargs)

    def __init__(
        self,
        filters: int,
        kernel_size: int | Sequence[int],
        strides: int | Sequence[int] = 1,
        padding: str = "valid",
        data_format: str | None = None,
        dilation_rate: int | Sequence[int] = 1,
        activation: str = "tanh",
        recurrent_activation: str = "sigmoid",
        use_bias: bool = True,
        unit_forget_bias: bool = True,
        return_sequences: bool = False,
        return_state: bool = False,
        go_backwards: bool = False,
        name: str | None = None,
    ):
        super().__init__(name)
        who = f"{type(self).__name__} layer {self.name!r}"
        if isinstance(filters, bool) or not isinstance(filters, (int, np.integer)) or filters < 1:
            raise ValueError(f"{who}: filters must be a positive integer, got {filters!r}")
        self.filters = int(filters)
        self.kernel_size = as_tuple(kernel_size, self.rank, f"{who}: kernel_size")
        self.strides = as_tuple(strides, self.rank, f"{who}: strides")
        self.dilation_rate = as_tuple(dilation_rate, self.rank, f"{who}: dilation_rate")
        if max(self.strides) > 1 and max(self.dilation_rate) > 1:
            raise ValueError(
                f"{who}: strides > 1 and dilation_rate > 1 cannot be combined (Keras refuses them too), "
                f"got strides={self.strides} and dilation_rate={self.dilation_rate}"
            )
        padding = padding.lower() if isinstance(padding, str) else padding
        if padding not in ("valid", "same"):
            raise ValueError(f"{who}: padding must be 'valid' or 'same', got {padding!r}")
        if data_format not in (None, "channels_last"):
            raise ValueError(f"{who}: only data_format='channels_last' runs, got {data_format!r}")
        self.padding = padding
        self.activation = _activation(activation, who)
        self.recurrent_activation = _activation(recurrent_activation, who)
        self.use_bias = bool(use_bias)
        self.unit_forget_bias = bool(unit_forget_bias)
        self.return_sequences = bool(return_sequences)
        self.return_state = bool(return_state)
        self.go_backwards = bool(go_backwards)
        self.kernel: np.ndarray | None = None
        self.recurrent_kernel: np.ndarray | None = None
        self.bias: np.ndarray | None = None
        self._recurrent_copies: dict = {}

    # ---------------------------------------------------------------- shapes and weights
    def _check_input(self, input_shape: Sequence[int | None]) -> tuple:
        shape = tuple(input_shape)
        if len(shape) != self.rank + 3:
            axes = {1: "length", 2: "height, width", 3: "depth, height, width"}[self.rank]
            raise ValueError(
                f"{type(self).__name__} layer {self.name!r} takes inputs (batch, steps, {axes}, channels), "
                f"got {format_shape(shape)}"
            )
        if shape[1] is not None and shape[1] < 1:
            raise ValueError(f"{type(self).__name__} layer {self.name!r}: no time steps in {format_shape(shape)}")
        if 0 in self._spatial_output(shape):
            raise ValueError(
                f"{type(self).__name__} layer {self.name!r}: kernel {self.kernel_size} with dilation "
                f"{self.dilation_rate} does not fit input {format_shape(shape)} with padding {self.padding!r}"
            )
        return shape

    def _spatial_output(self, shape: tuple) -> tuple:
        return tuple(
            output_size(n, k, s, d, self.padding)
            for n, k, s, d in zip(shape[2:-1], self.kernel_size, self.strides, self.dilation_rate)
        )

    def build(self, input_shape: Any) -> None:
        """Creates ``kernel`` (kernel_size + (channels, 4 * filters)), ``recurrent_kernel``
        (kernel_size + (filters, 4 * filters)), Glorot-uniform, and ``bias`` (4 * filters: zeros,
        the forget gate's ones with ``unit_forget_bias``) for inputs ``(batch, steps, ...,
        channels)``.

        Raises:
            ValueError: the input's rank is wrong or the kernel does not fit it.
        """
        shape = self._check_input(input_shape)
        super().build(shape)
        taps, width = int(np.prod(self.kernel_size)), GATES * self.filters
        self.kernel = glorot_uniform(self.kernel_size + (shape[-1], width), taps * shape[-1], taps * width)
        self.recurrent_kernel = glorot_uniform(
            self.kernel_size + (self.filters, width), taps * self.filters, taps * width
        )
        if self.use_bias:
            bias = zeros(width).copy()
            if self.unit_forget_bias:
                bias[self.filters : 2 * self.filters] = 1.0
            self.bias = bias
        else:
            self.bias = None

    @property
    def state_count(self) -> int:
        """The states the layer returns with ``return_state``: h and c."""
        return 2

    def compute_output_shape(self, input_shape):
        shape = self._check_input(input_shape)
        state = (shape[0],) + self._spatial_output(shape) + (self.filters,)
        output = (shape[0], shape[1]) + state[1:] if self.return_sequences else state
        return [output, state, state] if self.return_state else output

    def set_weights(self, weights: Any) -> None:
        """Sets ``[kernel, recurrent_kernel, bias]`` (``bias`` only with ``use_bias``) in Keras's shapes.

        Raises:
            ValueError: the layer is not built, or the count or a shape differs from the layer's.
        """
        who = f"{type(self).__name__} layer {self.name!r}"
        weights = numeric_weights(weights, who)
        if not self.built:
            raise ValueError(f"{who}: build the layer before setting its weights")
        width = GATES * self.filters
        expected = [self.kernel_size + (self._built_shape()[-1], width), self.kernel_size + (self.filters, width)]
        expected += [(width,)] if self.use_bias else []
        got = [w.shape for w in weights]
        if got != expected:
            raise ValueError(f"{who}: weights of shapes {got} do not match {expected}")
        self.kernel, self.recurrent_kernel = weights[0].copy(), weights[1].copy()
        self.bias = weights[2].copy() if self.use_bias else None
        self._weights_changed()

    def _kernels(self) -> tuple[np.ndarray, np.ndarray]:
        """``kernel`` and ``recurrent_kernel`` of the built layer."""
        assert self.kernel is not None and self.recurrent_kernel is not None, f"{self._what()} is not built"
        return self.kernel, self.recurrent_kernel

    def _matrix(self, kernel: np.ndarray) -> np.ndarray:
        """``4 * filters x KH*KW*C``: column ``(ky*KW + kx)*C + c`` of row ``m`` is ``kernel[ky, kx, c, m]``
        (the convolution kernels' weight matrix)."""
        return kernel.reshape(-1, GATES * self.filters).T

    # ---------------------------------------------------------------- lowering
    def _weights_changed(self) -> None:
        super()._weights_changed()
        # the recurrent kernel's device copies apart from the kernel's: a weight's copies are found
        # by device, layout and padding, which the two share where the kernels pad them alike
        self._recurrent_copies = {}

    def _hw(self, pair: Sequence[int]) -> tuple:
        return (1,) + tuple(pair) if self.rank == 1 else tuple(pair)

    def _input_conv(self, builder: PlanBuilder, x: Value, kernel: Weight, bias: Vector | None, what: str) -> Value:
        """The input convolution of every step: ``(batch, steps, ..., 4 * filters)``, bias added."""
        shape = tuple(x.shape)
        geometry = window_defines(
            self._hw(shape[2:-1]),
            self._hw(self.kernel_size),
            self._hw(self.strides),
            self._hw(self.dilation_rate),
            self.padding,
        )
        out_shape = (builder.batch, shape[1]) + self._spatial_output(shape) + (GATES * self.filters,)
        return kinds.images_conv(builder, x, kernel, geometry, builder.batch * shape[1], out_shape, bias, what)

    def _recurrent_geometry(self, spatial: tuple) -> dict:
        """The recurrent convolution's window defines on the state ``spatial``: ``'same'``, stride 1."""
        return window_defines(self._hw(spatial), self._hw(self.kernel_size), (1, 1), (1, 1), "same")

    #: the lowering of the recurrent convolution (:func:`malinn.plan.kinds.conv_lstm.conv_lstm_recurrence`'s ``convolve``)
    recurrent_lowering: Callable[..., Value] = staticmethod(kinds.conv)

    def lower(self, builder, x):
        shape = self._check_input(x.shape)
        width = GATES * self.filters
        what = self._what()
        spatial = self._spatial_output(shape)
        kernel = Weight(
            f"{what} kernel",
            (width, int(np.prod(self.kernel_size)) * shape[-1]),
            lambda: self._matrix(self._kernels()[0]),
            self.device_copies,
        )
        bias = Vector(f"{what} bias", self.bias, self.device_copies) if self.use_bias else None
        xconv = self._input_conv(builder, x, kernel, bias, f"{what} input conv")
        recurrent = Weight(
            f"{what} recurrent kernel",
            (width, int(np.prod(self.kernel_size)) * self.filters),
            lambda: self._matrix(self._kernels()[1]),
            self._recurrent_copies,
        )
        output, h, c = kinds.conv_lstm_recurrence(
            builder,
            xconv,
            recurrent,
            self._recurrent_geometry(spatial),
            self.filters,
            self.activation,
            self.recurrent_activation,
            self.go_backwards,
            self.return_sequences,
            what,
            convolve=self.recurrent_lowering,
        )
        return [output, h, c] if self.return_state else output

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "filters": self.filters,
            "kernel_size": self.kernel_size,
            "strides": self.strides,
            "padding": self.padding,
            "dilation_rate": self.dilation_rate,
            "activation": self.activation,
            "recurrent_activation": self.recurrent_activation,
            "use_bias": self.use_bias,
            "unit_forget_bias": self.unit_forget_bias,
            "return_sequences": self.return_sequences,
            "return_state": self.return_state,
            "go_backwards": self.go_backwards,
        }


class ConvLSTM2D(_ConvLSTM):
    """A 2-D convolutional LSTM over ``(batch, steps, height, width, channels)``, as Keras's
    ``ConvLSTM2D`` (gates i, f, c, o in that order in every weight).

    Args:
        filters: the state's channels, a positive integer.
        kernel_size, strides, dilation_rate: an int or ``rank`` ints (strides and dilation of the
            input convolution; not both above 1).
        padding: ``"valid"`` or ``"same"`` (the input convolution's; the recurrent one is ``"same"``).
        data_format: ``None`` or ``"channels_last"``.
        activation: the activation's name (default ``"tanh"``).
        recurrent_activation: the gates' activation (default ``"sigmoid"``).
        use_bias: whether the layer adds a bias.
        unit_forget_bias: a new layer's forget-gate bias starts at 1 (only the initial weights).
        return_sequences: return every step's output ``(batch, steps, ..., filters)``, not the last.
        return_state: return the last ``h`` and ``c`` after the output (a list).
        go_backwards: run the steps from the last (the sequence returned in that order).
        name: the layer's name.

    Raises:
        ValueError: an argument is not what Keras accepts, or an activation the recurrence does not
            compute (:data:`malinn.layers.recurrent.RECURRENT_ACTIVATIONS`).
    """

    rank = 2


class ConvLSTM1D(_ConvLSTM):
    """A 1-D convolutional LSTM over ``(batch, steps, length, channels)``, as Keras's ``ConvLSTM1D``.
    Arguments as :class:`ConvLSTM2D`."""

    rank = 1


class ConvLSTM3D(_ConvLSTM):
    """A 3-D convolutional LSTM over ``(batch, steps, depth, height, width, channels)``, as Keras's
    ``ConvLSTM3D``: the input convolution of every step one Conv3D over ``batch * steps`` volumes
    (kernels/conv3d.cl), each step's recurrent one a Conv3D (``'same'``, stride 1). Arguments as
    :class:`ConvLSTM2D`, sizes of 3 ints."""

    rank = 3

    def _input_conv(self, builder: PlanBuilder, x: Value, kernel: Weight, bias: Vector | None, what: str) -> Value:
        shape = tuple(x.shape)
        geometry = volume_defines(shape[2:-1], self.kernel_size, self.strides, self.dilation_rate, self.padding)
        geometry.update(CG=shape[-1], MG=GATES * self.filters)
        out_shape = (builder.batch, shape[1]) + self._spatial_output(shape) + (GATES * self.filters,)
        return kinds.conv3d(builder, x, kernel, geometry, out_shape, bias, what=what)

    def _recurrent_geometry(self, spatial: tuple) -> dict:
        geometry = volume_defines(spatial, self.kernel_size, (1, 1, 1), (1, 1, 1), "same")
        return {**geometry, "CG": self.filters, "MG": GATES * self.filters}

    recurrent_lowering = staticmethod(kinds.conv3d)
