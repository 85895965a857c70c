"""Transposed convolutions (Keras ``Conv1DTranspose``, ``Conv2DTranspose``): one direct kernel
(op ``conv_transpose`` of kernels/library.json) per layer, each output pixel summing the input
pixels and kernel taps that map onto it, with bias, activation and a folded affine step in its
epilogue."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...choice.kernel_choice import choose
from ..tensors import Value, Vector, Weight
from .base import register
from .conv import Conv, conv_step, in_weight_precision

if TYPE_CHECKING:
    from ..recorder import Recorder

__all__ = ["CONV_TRANSPOSE", "conv_transpose"]


class ConvTranspose(Conv):
    """Reads the input ``b`` as it is and the layer's ``COUT x KH*KW*CIN`` weights as ``a``."""

    name = "conv_transpose"


CONV_TRANSPOSE = register(ConvTranspose())


def conv_transpose(
    builder: Recorder,
    x: Value,
    weight: Weight,
    geometry: dict,
    out_shape: Sequence[int],
    bias: Vector | None = None,
    activation: str = "linear",
    params: dict | None = None,
    what: str = "conv_transpose",
) -> Value:
    """The transposed convolution of ``x`` (Keras ``(batch, H, W, CIN)``) by ``weight`` (``COUT x
    KH*KW*CIN``, column ``(ky*KW + kx)*CIN + c``), then bias and activation. ``geometry`` holds the
    window defines of the ``conv_transpose`` kernel: the input and output sizes, strides, dilation,
    ``PT`` / ``PL`` the padding removed from the top and left of the full output, and ``CIN``."""
    out_shape = (builder.batch,) + tuple(out_shape[1:])
    spec = in_weight_precision(builder, choose("conv_transpose", builder.device).configure(geometry))
    return conv_step(builder, spec, x, weight, out_shape, bias, activation, params, what, kind=CONV_TRANSPOSE)
