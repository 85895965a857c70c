"""Convolution layers, channels last as Keras: ``Conv1D``, ``Conv2D``, ``DepthwiseConv2D``,
``SeparableConv2D``.

Each lowers to the plan's convolution steps (:func:`malinn.plan.kinds.conv.conv`,
:func:`~malinn.plan.kinds.conv.depthwise`): the weights are re-laid once into the matrix the
kernels read (``COUT x KH*KW*CG``, or ``C*DM x KH*KW`` for a depthwise kernel) and uploaded in the
chosen kernel's layout; bias, activation and a folded BatchNormalization run in the kernel's
epilogue. A 1-D layer is the 2-D one on an image of height 1 (the same memory).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..library.precision import rounded
from ..plan import kinds
from ..plan.tensors import Vector, Weight
from .activation import get_activation
from .base import Layer, folded_affine, glorot_uniform, numeric_weights, write_weights, zeros
from .windows import as_tuple, output_size, spatial_of, window_defines

if TYPE_CHECKING:
    from ..library.kernel_library import KernelSpec
    from ..plan.builder import PlanBuilder
    from ..plan.tensors import Value

__all__ = ["Conv1D", "Conv2D", "DepthwiseConv2D", "SeparableConv2D"]

PADDINGS = ("valid", "same")


def _glorot(shape: tuple, fan_in: int, fan_out: int) -> np.ndarray:
    return glorot_uniform(shape, fan_in, fan_out)


class _Window(Layer):
    """What every convolution shares: rank, kernel size, strides, padding, dilation, activation, bias."""

    reusable_on_other_shapes = True

    rank = 2
    paddings: tuple[str, ...] = PADDINGS

    def __init__(
        self,
        kernel_size: int | Sequence[int],
        strides: int | Sequence[int] = 1,
        padding: str = "valid",
        dilation_rate: int | Sequence[int] = 1,
        activation: str | None = None,
        use_bias: bool = True,
        data_format: str | None = None,
        name: str | None = None,
    ):
        super().__init__(name)
        who = f"{type(self).__name__} {self.name!r}"
        self.kernel_size = as_tuple(kernel_size, self.rank, f"{who}: kernel_size")
        self.strides = as_tuple(strides, self.rank, f"{who}: strides")
        self.dilation_rate = as_tuple(dilation_rate, self.rank, f"{who}: dilation_rate")
        if padding not in self.paddings:
            raise ValueError(f"{who}: padding must be one of {self.paddings}, got {padding!r}")
        if data_format not in (None, "channels_last"):
            raise ValueError(f"{who}: only data_format='channels_last' runs, got {data_format!r}")
        self.padding = padding
        self.activation = get_activation(activation)
        self.use_bias = bool(use_bias)
        self.bias: np.ndarray | None = None

    # 2-D views of the 1-D and 2-D geometry
    def _hw(self, pair: Sequence[int]) -> tuple:
        return (1,) + tuple(pair) if self.rank == 1 else tuple(pair)

    def geometry(self, sample_shape: Sequence[int]) -> dict:
        """The window defines of this layer on one sample of ``sample_shape``."""
        h, w, _ = spatial_of(sample_shape)
        return window_defines(
            (h, w), self._hw(self.kernel_size), self._hw(self.strides), self._hw(self.dilation_rate), self.padding
        )

    def _spatial_output(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        return tuple(
            output_size(n, k, s, d, self.padding)
            for n, k, s, d in zip(shape[1:-1], self.kernel_size, self.strides, self.dilation_rate)
        )

    def _check_input(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        if len(shape) != self.rank + 2:
            raise ValueError(
                f"{type(self).__name__} {self.name!r} expects inputs of rank {self.rank + 2} "
                f"(batch, {'length' if self.rank == 1 else 'height, width'}, channels), got {shape}"
            )
        if 0 in self._spatial_output(shape):
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: kernel {self.kernel_size} with dilation "
                f"{self.dilation_rate} does not fit input {shape} with padding {self.padding!r}"
            )
        return shape

    def _vector(self, values: np.ndarray | None, what: str) -> Vector:
        return Vector(f"layer {self.name!r} {what}", values, self.device_copies)

    def save_own_variables(self, store: Any, target: KernelSpec) -> None:
        """The weights in Keras's shapes, each kernel rounded as ``target``'s precision keeps it on
        the device (the plan lowers a convolution's weights itself; the file holds only what the
        device will, as a Dense layer's does).

        Raises:
            ValueError: a weight the precision cannot hold (beyond float16's range, NaN in int8),
                named by the layer.
        """
        weights = self.weight_arrays()
        for index, (name, matrix) in self.kernel_matrices().items():
            kept = rounded(matrix, target.precision, f"{self._what()} {name}")
            weights[index] = kept.T.reshape(weights[index].shape)
        for i, weight in enumerate(weights):
            write_weights(store, str(i), weight)

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "kernel_size": self.kernel_size,
            "strides": self.strides,
            "padding": self.padding,
            "dilation_rate": self.dilation_rate,
            "activation": self.activation,
            "use_bias": self.use_bias,
        }


class Conv2D(_Window):
    """A 2-D convolution over ``(batch, height, width, channels)``, as Keras's ``Conv2D``.

    Args:
        filters: output channels, a positive integer (a multiple of ``groups``).
        kernel_size, strides, dilation_rate: an int or ``rank`` ints.
        padding: ``"valid"`` or ``"same"`` (``"causal"`` too for Conv1D).
        groups: input and output channels split into this many independent groups.
        activation: the activation's name, or ``None`` for linear.
        use_bias: whether the layer adds a bias per filter.
        name: the layer's name.

    Raises:
        ValueError: an argument is not what Keras accepts.
    """

    weight_names = ("kernel", "bias")
    #: Keras's arguments that change what it computes (Conv1D's too), as its config saves them
    keras_config_keys: tuple[str, ...] = (
        "filters",
        "kernel_size",
        "strides",
        "padding",
        "dilation_rate",
        "groups",
        "activation",
        "use_bias",
        "data_format",
    )

    def __init__(
        self,
        filters: int,
        kernel_size: int | Sequence[int],
        strides: int | Sequence[int] = 1,
        padding: str = "valid",
        dilation_rate: int | Sequence[int] = 1,
        groups: int = 1,
        activation: str | None = None,
        use_bias: bool = True,
        data_format: str | None = None,
        name: str | None = None,
    ):
        super().__init__(kernel_size, strides, padding, dilation_rate, activation, use_bias, data_format, name)
        who = f"{type(self).__name__} {self.name!r}"
        if isinstance(filters, bool) or not isinstance(filters, (int, np.integer)) or filters < 1:
            raise ValueError(f"{who}: filters must be a positive integer, got {filters!r}")
        if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1 or filters % groups:
            raise ValueError(f"{who}: groups must be a positive integer dividing filters ({filters}), got {groups!r}")
        self.filters, self.groups = int(filters), int(groups)
        self.kernel: np.ndarray | None = None

    def build(self, input_shape: Any) -> None:
        """Creates ``kernel`` (kernel_size + (channels / groups, filters)), Glorot-uniform, and a zero bias.

        Raises:
            ValueError: the input's rank is wrong, its channels are not a multiple of ``groups``, or
                the kernel does not fit it.
        """
        shape = self._check_input(input_shape)
        if shape[-1] % self.groups:
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: {shape[-1]} input channels are not a "
                f"multiple of groups={self.groups}"
            )
        super().build(shape)
        taps = int(np.prod(self.kernel_size))
        cg = shape[-1] // self.groups
        self.kernel = _glorot(self.kernel_size + (cg, self.filters), taps * cg, taps * self.filters)
        self.bias = zeros(self.filters) if self.use_bias else None

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = self._check_input(input_shape)
        return (shape[0],) + self._spatial_output(shape) + (self.filters,)

    def _kernel(self) -> np.ndarray:
        """``kernel`` of the built layer."""
        assert self.kernel is not None, f"{self._what()} is not built"
        return self.kernel

    def weight_matrix(self) -> np.ndarray:
        """``COUT x KH*KW*CG``: column ``(ky*KW + kx)*CG + c`` of row ``m`` is ``kernel[ky, kx, c, m]``."""
        return self._kernel().reshape(-1, self.filters).T

    def kernel_matrices(self) -> dict:
        return {0: ("kernel", self.weight_matrix())}

    #: the op kind's lowering function of the layer's step (Conv3D: kinds.conv3d)
    lowering: Callable[..., Value] = staticmethod(kinds.conv)

    def lowered_geometry(self, sample_shape: Sequence[int]) -> dict:
        """The defines :attr:`lowering` takes for one sample of ``sample_shape``."""
        return {**self.geometry(sample_shape), "GROUPS": self.groups}

    def lower(self, builder: PlanBuilder, x: Value) -> Value:
        weight = Weight(
            f"layer {self.name!r} kernel",
            (self.filters, self._kernel()[..., 0].size),
            self.weight_matrix,
            self.device_copies,
        )
        bias = self._vector(self.bias, "bias") if self.use_bias else None
        return self.lowering(
            builder,
            x,
            weight,
            self.lowered_geometry(x.shape[1:]),
            self.compute_output_shape(x.shape),
            bias,
            self.activation,
            what=self._what(),
        )

    def set_weights(self, weights: Any) -> None:
        """Sets ``[kernel, bias]`` (or ``[kernel]``) in Keras's shapes.

        Raises:
            ValueError: the count or a shape differs from the layer's.
        """
        weights = numeric_weights(weights, self._what())
        want = 1 + self.use_bias
        if len(weights) != want:
            raise ValueError(f"{type(self).__name__} {self.name!r} expects {want} weight arrays, got {len(weights)}")
        expected = self.kernel_size + ((self._built_shape()[-1] // self.groups) if self.built else None, self.filters)
        kernel = weights[0]
        if kernel.ndim != self.rank + 2 or any(e is not None and e != g for e, g in zip(expected, kernel.shape)):
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: kernel shape {kernel.shape} does not match {expected}"
            )
        if self.use_bias and weights[1].shape != (self.filters,):
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: bias shape {weights[1].shape} does not match ({self.filters},)"
            )
        if not self.built:
            raise ValueError(f"{type(self).__name__} {self.name!r}: build the layer before setting its weights")
        self.kernel = kernel.copy()
        self.bias = weights[1].copy() if self.use_bias else None
        self._weights_changed()

    def absorb_affine(self, scale: np.ndarray, shift: np.ndarray) -> bool:
        """Folds a following BatchNormalization into the kernel and bias (float64) when linear."""
        if self.activation != "linear" or not self.built:
            return False
        kernel, bias = folded_affine(self.kernel, self.bias if self.use_bias else None, scale, shift)
        self.use_bias = True
        self.set_weights([kernel, bias])
        return True

    def get_config(self) -> dict:
        return {**super().get_config(), "filters": self.filters, "groups": self.groups}


class Conv1D(Conv2D):
    """A 1-D convolution over ``(batch, length, channels)``, as Keras's ``Conv1D`` (``padding`` may
    also be ``"causal"``: zeros before the sequence only). Arguments as :class:`Conv2D`."""

    rank = 1
    paddings = PADDINGS + ("causal",)


class DepthwiseConv2D(_Window):
    """A depthwise 2-D convolution, as Keras's ``DepthwiseConv2D``: each input channel convolved with
    ``depth_multiplier`` kernels of its own; output channel ``c * depth_multiplier + j``.

    Args:
        kernel_size, strides, padding, dilation_rate, activation, use_bias, name: as :class:`Conv2D`.
        depth_multiplier: kernels per input channel, a positive integer.

    Raises:
        ValueError: an argument is not what Keras accepts.
    """

    weight_names: tuple[str, ...] = ("depthwise_kernel", "bias")
    keras_config_keys: tuple[str, ...] = (
        "kernel_size",
        "strides",
        "padding",
        "depth_multiplier",
        "dilation_rate",
        "activation",
        "use_bias",
        "data_format",
    )

    def __init__(
        self,
        kernel_size: int | Sequence[int],
        strides: int | Sequence[int] = 1,
        padding: str = "valid",
        depth_multiplier: int = 1,
        dilation_rate: int | Sequence[int] = 1,
        activation: str | None = None,
        use_bias: bool = True,
        data_format: str | None = None,
        name: str | None = None,
    ):
        super().__init__(kernel_size, strides, padding, dilation_rate, activation, use_bias, data_format, name)
        if (
            isinstance(depth_multiplier, bool)
            or not isinstance(depth_multiplier, (int, np.integer))
            or depth_multiplier < 1
        ):
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: depth_multiplier must be a positive integer, "
                f"got {depth_multiplier!r}"
            )
        self.depth_multiplier = int(depth_multiplier)
        self.depthwise_kernel: np.ndarray | None = None

    @property
    def out_channels(self) -> int:
        return self._built_shape()[-1] * self.depth_multiplier

    def build(self, input_shape: Any) -> None:
        shape = self._check_input(input_shape)
        super().build(shape)
        taps = int(np.prod(self.kernel_size))
        self.depthwise_kernel = _glorot(
            self.kernel_size + (shape[-1], self.depth_multiplier), taps, taps * self.depth_multiplier
        )
        self.bias = zeros(self.out_channels) if self.use_bias else None

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = self._check_input(input_shape)
        return (shape[0],) + self._spatial_output(shape) + (shape[-1] * self.depth_multiplier,)

    def depthwise_matrix(self) -> np.ndarray:
        """``C*DM x KH*KW``: row ``c*DM + j``, column ``ky*KW + kx`` is ``depthwise_kernel[ky, kx, c, j]``."""
        assert self.depthwise_kernel is not None, f"{self._what()} is not built"
        return self.depthwise_kernel.reshape(-1, self.out_channels).T

    def kernel_matrices(self) -> dict:
        return {0: ("depthwise kernel", self.depthwise_matrix())}

    def _lower_depthwise(self, builder: PlanBuilder, x: Value, bias: Vector | None, activation: str) -> Value:
        geometry = {**self.geometry(x.shape[1:]), "DM": self.depth_multiplier}
        weight = Weight(
            f"layer {self.name!r} depthwise kernel",
            (self.out_channels, int(np.prod(self.kernel_size))),
            self.depthwise_matrix,
            self.device_copies,
        )
        shape = self.compute_output_shape(x.shape)
        return kinds.depthwise(builder, x, weight, geometry, shape, bias, activation, what=self._what())

    def lower(self, builder: PlanBuilder, x: Value) -> Value:
        bias = self._vector(self.bias, "bias") if self.use_bias else None
        return self._lower_depthwise(builder, x, bias, self.activation)

    def _check_weights(self, weights: Any, shapes: list[tuple]) -> list:
        weights = numeric_weights(weights, self._what())
        if not self.built:
            raise ValueError(f"{type(self).__name__} {self.name!r}: build the layer before setting its weights")
        if [w.shape for w in weights] != shapes:
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: weight shapes {[w.shape for w in weights]} do not match {shapes}"
            )
        return weights

    def set_weights(self, weights: Any) -> None:
        """Sets ``[depthwise_kernel, bias]`` (or without bias) in Keras's shapes.

        Raises:
            ValueError: the layer is not built, or the count or a shape differs.
        """
        shapes = [self.kernel_size + (self._built_shape()[-1] if self.built else 0, self.depth_multiplier)]
        shapes += [(self.out_channels,)] if self.use_bias and self.built else []
        weights = self._check_weights(weights, shapes)
        self.depthwise_kernel = weights[0].copy()
        self.bias = weights[1].copy() if self.use_bias else None
        self._weights_changed()

    def absorb_affine(self, scale: np.ndarray, shift: np.ndarray) -> bool:
        """Folds a following BatchNormalization into the kernel and bias (float64) when linear."""
        if self.activation != "linear" or not self.built:
            return False
        kernel, bias = folded_affine(
            self.depthwise_kernel,
            self.bias if self.use_bias else None,
            scale,
            shift,
            np.asarray(scale).reshape(-1, self.depth_multiplier),
        )
        self.use_bias = True
        self.set_weights([kernel, bias])
        return True

    def get_config(self) -> dict:
        return {**super().get_config(), "depth_multiplier": self.depth_multiplier}


class SeparableConv2D(DepthwiseConv2D):
    """A depthwise convolution followed by a 1x1 convolution to ``filters`` channels, as Keras's
    ``SeparableConv2D`` (strides, padding and dilation apply to the depthwise step; the bias and
    activation to the result).

    Args:
        filters: output channels, a positive integer.
        others: as :class:`DepthwiseConv2D`.

    Raises:
        ValueError: an argument is not what Keras accepts.
    """

    weight_names = ("depthwise_kernel", "pointwise_kernel", "bias")
    keras_config_keys = (
        "filters",
        "kernel_size",
        "strides",
        "padding",
        "depth_multiplier",
        "dilation_rate",
        "activation",
        "use_bias",
        "data_format",
    )

    def __init__(
        self,
        filters: int,
        kernel_size: int | Sequence[int],
        strides: int | Sequence[int] = 1,
        padding: str = "valid",
        depth_multiplier: int = 1,
        dilation_rate: int | Sequence[int] = 1,
        activation: str | None = None,
        use_bias: bool = True,
        data_format: str | None = None,
        name: str | None = None,
    ):
        super().__init__(
            kernel_size, strides, padding, depth_multiplier, dilation_rate, activation, use_bias, data_format, name
        )
        if isinstance(filters, bool) or not isinstance(filters, (int, np.integer)) or filters < 1:
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: filters must be a positive integer, got {filters!r}"
            )
        self.filters = int(filters)
        self.pointwise_kernel: np.ndarray | None = None

    def build(self, input_shape: Any) -> None:
        super().build(input_shape)
        self.pointwise_kernel = _glorot((1, 1, self.out_channels, self.filters), self.out_channels, self.filters)
        self.bias = zeros(self.filters) if self.use_bias else None

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return super().compute_output_shape(input_shape)[:-1] + (self.filters,)

    def pointwise_matrix(self) -> np.ndarray:
        """``FILTERS x C*DM``: row ``f``, column ``o`` is ``pointwise_kernel[0, 0, o, f]``."""
        assert self.pointwise_kernel is not None, f"{self._what()} is not built"
        return self.pointwise_kernel.reshape(self.out_channels, self.filters).T

    def kernel_matrices(self) -> dict:
        return {0: ("depthwise kernel", self.depthwise_matrix()), 1: ("pointwise kernel", self.pointwise_matrix())}

    def lower(self, builder: PlanBuilder, x: Value) -> Value:
        mid = self._lower_depthwise(builder, x, None, "linear")
        weight = Weight(
            f"layer {self.name!r} pointwise kernel",
            (self.filters, self.out_channels),
            self.pointwise_matrix,
            self.device_copies,
        )
        bias = self._vector(self.bias, "bias") if self.use_bias else None
        return kinds.matmul(builder, mid, weight, bias, self.activation, what=self._what())

    def _lower_depthwise(self, builder: PlanBuilder, x: Value, bias: Vector | None, activation: str) -> Value:
        geometry = {**self.geometry(x.shape[1:]), "DM": self.depth_multiplier}
        weight = Weight(
            f"layer {self.name!r} depthwise kernel",
            (self.out_channels, int(np.prod(self.kernel_size))),
            self.depthwise_matrix,
            self.device_copies,
        )
        shape = DepthwiseConv2D.compute_output_shape(self, x.shape)
        return kinds.depthwise(builder, x, weight, geometry, shape, bias, activation, what=self._what())

    def set_weights(self, weights: Any) -> None:
        """Sets ``[depthwise_kernel, pointwise_kernel, bias]`` (or without bias) in Keras's shapes.

        Raises:
            ValueError: the layer is not built, or the count or a shape differs.
        """
        shapes = [
            self.kernel_size + (self._built_shape()[-1] if self.built else 0, self.depth_multiplier),
            (1, 1, self.out_channels if self.built else 0, self.filters),
        ]
        shapes += [(self.filters,)] if self.use_bias else []
        weights = self._check_weights(weights, shapes)
        self.depthwise_kernel, self.pointwise_kernel = weights[0].copy(), weights[1].copy()
        self.bias = weights[2].copy() if self.use_bias else None
        self._weights_changed()

    def absorb_affine(self, scale: np.ndarray, shift: np.ndarray) -> bool:
        """Folds a following BatchNormalization into the pointwise kernel and bias when linear."""
        if self.activation != "linear" or not self.built:
            return False
        kernel, bias = folded_affine(self.pointwise_kernel, self.bias if self.use_bias else None, scale, shift)
        self.use_bias = True
        self.set_weights([self.depthwise_kernel, kernel, bias])
        return True

    def get_config(self) -> dict:
        return {**super().get_config(), "filters": self.filters}
