"""Transposed convolutions, channels last as Keras: ``Conv2DTranspose``, ``Conv1DTranspose``.

Keras scatters each input pixel ``i`` through kernel tap ``k`` to output pixel ``i*S + k*D - P``
(``P`` the padding it removes before the first pixel); the plan gathers instead, one direct kernel
(kernels/conv_transpose.cl) in which each output pixel sums the input pixels and taps that map
onto it, with bias and activation in its epilogue. The weights are re-laid once into the
``COUT x KH*KW*CIN`` matrix it reads. A 1-D layer is the 2-D one on an image of height 1.
The output size and padding follow TensorFlow's ``conv_transpose`` with the output shape Keras
computes (``output_padding`` added after the last pixel).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..library.precision import rounded
from ..plan import kinds
from ..plan.tensors import Weight
from .base import folded_affine, glorot_uniform, numeric_weights, write_weights, zeros
from .convolution import _Window
from .windows import spatial_of

if TYPE_CHECKING:
    from ..library.kernel_library import KernelSpec
    from ..plan.builder import PlanBuilder
    from ..plan.tensors import Value

__all__ = ["Conv2DTranspose", "Conv1DTranspose", "transposed_length", "transposed_padding"]


def transposed_length(
    size: int, kernel: int, stride: int, dilation: int, padding: str, output_padding: int | None
) -> int:
    """The output length of a transposed convolution along one axis, as Keras computes it."""
    span = (kernel - 1) * dilation + 1
    if output_padding is None:
        return size * stride + max(span - stride, 0) if padding == "valid" else size * stride
    pad = span // 2 if padding == "same" else 0
    return (size - 1) * stride + span - 2 * pad + output_padding


def transposed_padding(size: int, out: int, kernel: int, stride: int, dilation: int, padding: str) -> int:
    """The pixels removed before the first output pixel (TensorFlow's padding of the convolution
    whose gradient this is: half the total for ``same``, rounded down; none for ``valid``)."""
    if padding != "same":
        return 0
    span = (kernel - 1) * dilation + 1
    return max((size - 1) * stride + span - out, 0) // 2


class Conv2DTranspose(_Window):
    """A 2-D transposed convolution over ``(batch, height, width, channels)``, as Keras's
    ``Conv2DTranspose``.

    Args:
        filters: output channels, a positive integer.
        kernel_size, strides, dilation_rate: an int or ``rank`` ints.
        padding: ``"valid"`` or ``"same"``.
        output_padding: ``None`` or an int or ``rank`` ints >= 0, each below its stride: pixels
            added after the last along each axis.
        activation: the activation's name, or ``None`` for linear.
        use_bias: whether the layer adds a bias per filter.
        name: the layer's name.

    Raises:
        ValueError: an argument is not what Keras accepts.
    """

    weight_names = ("kernel", "bias")
    #: Keras's arguments that change what it computes (Conv1DTranspose's too), as its config saves them
    keras_config_keys = (
        "filters",
        "kernel_size",
        "strides",
        "padding",
        "output_padding",
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
        output_padding: int | Sequence[int] | None = None,
        dilation_rate: int | Sequence[int] = 1,
        activation: Any = None,
        use_bias: bool = True,
        data_format: str | None = None,
        name: str | None = None,
    ):
        super().__init__(kernel_size, strides, padding, dilation_rate, activation, use_bias, data_format, name)
        who = f"{type(self).__name__} {self.name!r}"
        if isinstance(filters, bool) or not isinstance(filters, (int, np.integer)) or filters < 1:
            raise ValueError(f"{who}: filters must be a positive integer, got {filters!r}")
        self.filters = int(filters)
        if output_padding is not None:
            values = (
                (output_padding,) * self.rank
                if isinstance(output_padding, (int, np.integer))
                else tuple(output_padding)
            )
            if len(values) != self.rank or any(
                isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0 for v in values
            ):
                raise ValueError(
                    f"{who}: output_padding must be None or {self.rank} integers >= 0, got {output_padding!r}"
                )
            if any(p >= s for p, s in zip(values, self.strides)):
                raise ValueError(f"{who}: output_padding {values} must be below the strides {self.strides}")
            output_padding = tuple(int(v) for v in values)
        self.output_padding: tuple | None = output_padding
        self.kernel: np.ndarray | None = None

    def _pads(self) -> tuple:
        return self.output_padding if self.output_padding is not None else (None,) * self.rank

    def _spatial_output(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        return tuple(
            transposed_length(n, k, s, d, self.padding, p)
            for n, k, s, d, p in zip(shape[1:-1], self.kernel_size, self.strides, self.dilation_rate, self._pads())
        )

    def geometry(self, sample_shape: Sequence[int]) -> dict:
        """The defines of kernels/conv_transpose.cl on one sample of ``sample_shape``."""
        h, w, c = spatial_of(sample_shape)
        (oh, ow) = self._hw(self._spatial_output((None,) + tuple(sample_shape)))
        (kh, kw), (sh, sw), (dh, dw) = self._hw(self.kernel_size), self._hw(self.strides), self._hw(self.dilation_rate)
        return {
            "IH": h,
            "IW": w,
            "OH": oh,
            "OW": ow,
            "KH": kh,
            "KW": kw,
            "SH": sh,
            "SW": sw,
            "DH": dh,
            "DW": dw,
            "PT": transposed_padding(h, oh, kh, sh, dh, self.padding),
            "PL": transposed_padding(w, ow, kw, sw, dw, self.padding),
            "CIN": c,
        }

    def build(self, input_shape: Any) -> None:
        """Creates ``kernel`` (kernel_size + (filters, channels)), Glorot-uniform, and a zero bias.

        Raises:
            ValueError: the input's rank is wrong.
        """
        shape = self._check_input(input_shape)
        super().build(shape)
        taps = int(np.prod(self.kernel_size))
        self.kernel = glorot_uniform(
            self.kernel_size + (self.filters, shape[-1]), taps * self.filters, taps * shape[-1]
        )
        self.bias = zeros(self.filters) if self.use_bias else None

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = self._check_input(input_shape)
        return (shape[0],) + self._spatial_output(shape) + (self.filters,)

    def _kernel(self) -> np.ndarray:
        """``kernel`` of the built layer."""
        assert self.kernel is not None, f"{self._what()} is not built"
        return self.kernel

    def weight_matrix(self) -> np.ndarray:
        """``COUT x KH*KW*CIN``: column ``(ky*KW + kx)*CIN + c`` of row ``m`` is ``kernel[ky, kx, m, c]``."""
        return np.moveaxis(self._kernel(), -2, 0).reshape(self.filters, -1)

    def kernel_matrices(self) -> dict:
        return {0: ("kernel", self.weight_matrix())}

    def save_own_variables(self, store: Any, target: KernelSpec) -> None:
        """The weights in Keras's shapes, the kernel rounded as ``target``'s precision keeps it on
        the device (as :meth:`Conv2D.save_own_variables`).

        Raises:
            ValueError: a weight the precision cannot hold, named by the layer.
        """
        weights = self.weight_arrays()
        kept = rounded(self.weight_matrix(), target.precision, f"{self._what()} kernel")
        shape = self._kernel().shape
        weights[0] = np.moveaxis(kept.reshape((self.filters,) + shape[:-2] + (shape[-1],)), 0, -2)
        for i, weight in enumerate(weights):
            write_weights(store, str(i), weight)

    #: the op kind's lowering function of the layer's step (Conv3DTranspose: kinds.conv3d_transpose)
    lowering: Callable[..., Value] = staticmethod(kinds.conv_transpose)

    def lower(self, builder: PlanBuilder, x: Value) -> Value:
        weight = Weight(
            f"layer {self.name!r} kernel",
            (self.filters, self._kernel()[..., 0, :].size),
            self.weight_matrix,
            self.device_copies,
        )
        bias = self._vector(self.bias, "bias") if self.use_bias else None
        return self.lowering(
            builder,
            x,
            weight,
            self.geometry(x.shape[1:]),
            self.compute_output_shape(x.shape),
            bias,
            self.activation,
            what=self._what(),
        )

    def set_weights(self, weights: Iterable[Any]) -> None:
        """Sets ``[kernel, bias]`` (or ``[kernel]``) in Keras's shapes.

        Raises:
            ValueError: the layer is not built, or the count or a shape differs from the layer's.
        """
        weights = numeric_weights(weights, self._what())
        who = f"{type(self).__name__} {self.name!r}"
        if not self.built:
            raise ValueError(f"{who}: build the layer before setting its weights")
        shapes = [self.kernel_size + (self.filters, self._built_shape()[-1])] + [(self.filters,)] * self.use_bias
        if [w.shape for w in weights] != shapes:
            raise ValueError(f"{who}: weight shapes {[w.shape for w in weights]} do not match {shapes}")
        self.kernel = weights[0].copy()
        self.bias = weights[1].copy() if self.use_bias else None
        self._weights_changed()

    def absorb_affine(self, scale: np.ndarray, shift: np.ndarray) -> bool:
        """Folds a following BatchNormalization into the kernel and bias (float64) when linear."""
        if self.activation != "linear" or not self.built:
            return False
        kernel, bias = folded_affine(
            self._kernel(), self.bias if self.use_bias else None, scale, shift, np.asarray(scale, np.float64)[:, None]
        )
        self.use_bias = True
        self.set_weights([kernel, bias])
        return True

    def get_config(self) -> dict:
        return {**super().get_config(), "filters": self.filters, "output_padding": self.output_padding}


class Conv1DTranspose(Conv2DTranspose):
    """A 1-D transposed convolution over ``(batch, length, channels)``, as Keras's
    ``Conv1DTranspose``. Arguments as :class:`Conv2DTranspose`."""

    rank = 1
