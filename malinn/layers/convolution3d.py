"""Convolutions over volumes, channels last as Keras: ``Conv3D``, ``Conv3DTranspose``.

Each is one direct kernel (:func:`malinn.plan.kinds.volume.conv3d`, kernels/conv3d.cl: each output
element sums its window; :func:`~malinn.plan.kinds.volume.conv3d_transpose`,
kernels/conv3d_transpose.cl: each output voxel sums the input voxels and taps that map onto it),
with bias, activation and a folded BatchNormalization in its epilogue; the weights are re-laid once
into the matrix the kernel reads (``COUT x KD*KH*KW*CG``). A 1x1x1 ``Conv3D`` with stride 1 is a
plain matmul on the input. Padding follows TensorFlow (``same``: half the total before, rounded
down); the transposed convolution's output size and padding follow its ``conv3d_transpose`` with
the output shape Keras computes (``output_padding`` added after the last voxel), as the 2-D
layers do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..plan import kinds
from .convolution import Conv2D
from .convolution_transpose import Conv2DTranspose, transposed_padding
from .volumes import volume_defines

__all__ = ["Conv3D", "Conv3DTranspose"]


def _check_volume(layer: Conv3D | Conv3DTranspose, input_shape: Any) -> tuple:
    """``input_shape`` as a tuple, checked to be ``(batch, depth, height, width, channels)``.

    Raises:
        ValueError: its rank is not 5.
    """
    shape = tuple(input_shape)
    if len(shape) != 5:
        raise ValueError(
            f"{type(layer).__name__} {layer.name!r} expects inputs of rank 5 "
            f"(batch, depth, height, width, channels), got {shape}"
        )
    return shape


class Conv3D(Conv2D):
    """A 3-D convolution over ``(batch, depth, height, width, channels)``, as Keras's ``Conv3D``.

    Args:
        filters: output channels, a positive integer (a multiple of ``groups``).
        kernel_size, strides, dilation_rate: an int or 3 ints.
        padding: ``"valid"`` or ``"same"``.
        groups: input and output channels split into this many independent groups.
        activation: the activation's name, or ``None`` for linear.
        use_bias: whether the layer adds a bias per filter.
        data_format: ``None`` or ``"channels_last"`` (``"channels_first"`` is refused by name).
        name: the layer's name.

    Raises:
        ValueError: an argument is not what Keras accepts.
    """

    rank = 3

    def _check_input(self, input_shape: Any) -> tuple:
        return super()._check_input(_check_volume(self, input_shape))

    def geometry(self, sample_shape: Sequence[int]) -> dict:
        """The defines of kernels/conv3d.cl on one sample of ``sample_shape`` ``(D, H, W, C)``."""
        *dhw, channels = sample_shape
        return {
            **volume_defines(dhw, self.kernel_size, self.strides, self.dilation_rate, self.padding),
            "CG": channels // self.groups,
            "MG": self.filters // self.groups,
        }

    lowering = staticmethod(kinds.conv3d)

    def lowered_geometry(self, sample_shape: Sequence[int]) -> dict:
        return self.geometry(sample_shape)  # the groups are in it (CG, MG)


class Conv3DTranspose(Conv2DTranspose):
    """A 3-D transposed convolution over ``(batch, depth, height, width, channels)``, as Keras's
    ``Conv3DTranspose``.

    Args:
        filters: output channels, a positive integer.
        kernel_size, strides, dilation_rate: an int or 3 ints.
        padding: ``"valid"`` or ``"same"``.
        output_padding: ``None`` or an int or 3 ints >= 0, each below its stride: voxels added
            after the last along each axis.
        activation: the activation's name, or ``None`` for linear.
        use_bias: whether the layer adds a bias per filter.
        data_format: ``None`` or ``"channels_last"`` (``"channels_first"`` is refused by name).
        name: the layer's name.

    Raises:
        ValueError: an argument is not what Keras accepts.
    """

    rank = 3

    def _check_input(self, input_shape: Any) -> tuple:
        return super()._check_input(_check_volume(self, input_shape))

    def geometry(self, sample_shape: Sequence[int]) -> dict:
        """The defines of kernels/conv3d_transpose.cl on one sample of ``sample_shape`` ``(D, H, W, C)``."""
        *dhw, channels = sample_shape
        out = self._spatial_output((None,) + tuple(sample_shape))
        axes = list(zip(dhw, out, self.kernel_size, self.strides, self.dilation_rate))
        defines = volume_defines(dhw, self.kernel_size, self.strides, self.dilation_rate, "valid")
        defines.update(zip(("OD", "OH", "OW"), out))
        defines.update(
            zip(("PF", "PT", "PL"), (transposed_padding(n, o, k, s, d, self.padding) for n, o, k, s, d in axes))
        )
        return {**defines, "CIN": channels}

    lowering = staticmethod(kinds.conv3d_transpose)
