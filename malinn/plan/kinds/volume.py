"""Ops over volumes (Keras's 3-D layers on ``(batch, depth, height, width, channels)``), one direct
kernel each: a convolution (kernels/conv3d.cl: each output element sums its window), a transposed
convolution (kernels/conv3d_transpose.cl: each output voxel sums the input voxels and taps that map
onto it), both with bias, activation and a folded affine step in their epilogue; a pooling
(kernels/pool3d.cl) and the padding, cropping and upsampling copy (kernels/spatial3d.cl). The
sizes, strides and padding are kernel arguments (kernels/volume.clh), so layers that differ only
in them share one program."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...choice.kernel_choice import choose
from ..tensors import Value, Vector, Weight
from .base import register
from .conv import Conv, conv_step, in_weight_precision
from .matmul import matmul
from .window import Window

if TYPE_CHECKING:
    from ..recorder import Recorder

__all__ = [
    "CONV3D",
    "CONV3D_TRANSPOSE",
    "POOL3D",
    "SPATIAL3D",
    "conv3d",
    "conv3d_transpose",
    "pool3d",
    "spatial3d",
]


class Conv3D(Conv):
    """Reads the input ``b`` as it is and the layer's ``COUT x KD*KH*KW*CG`` weights as ``a``."""

    name = "conv3d"


class ConvTranspose3D(Conv):
    """Reads the input ``b`` as it is and the layer's ``COUT x KD*KH*KW*CIN`` weights as ``a``."""

    name = "conv3d_transpose"


class Pool3D(Window):
    name = "pool3d"


class Spatial3D(Window):
    name = "spatial3d"


CONV3D = register(Conv3D())
CONV3D_TRANSPOSE = register(ConvTranspose3D())
POOL3D = register(Pool3D())
SPATIAL3D = register(Spatial3D())

#: the volume's sizes, strides and padding (kernels/volume.clh), without which a step has no geometry
VOLUME = ("ID", "IH", "IW", "OD", "OH", "OW")


def _batched(builder: Recorder, out_shape: Sequence[int]) -> tuple:
    return (builder.batch,) + tuple(out_shape[1:])


def conv3d(
    builder: Recorder,
    x: Value,
    weight: Weight,
    geometry: dict,
    out_shape: Sequence[int],
    bias: Vector | None = None,
    activation: str = "linear",
    params: dict | None = None,
    what: str = "conv3d",
) -> Value:
    """The 3-D convolution of ``x`` (Keras ``(batch, D, H, W, CIN)``) by ``weight`` (``COUT x
    KD*KH*KW*CG``, column ``((kz*KH + ky)*KW + kx)*CG + c``), then bias and activation.

    ``geometry`` holds the defines of kernels/conv3d.cl: the sizes ``ID IH IW OD OH OW``, window
    ``KD KH KW``, strides ``SD SH SW``, dilation ``DD DH DW``, padding before ``PF PT PL``, and ``CG``
    / ``MG`` the input and output channels per group. A 1x1x1 convolution with stride 1 and one
    group is a plain matmul on the input's matrix view (no kernel of its own)."""
    g = dict(geometry)
    missing = [k for k in VOLUME if k not in g]
    if missing:
        raise ValueError(f"{what}: the geometry lacks {missing}")
    pointwise = all(g.get(k, 1) == 1 for k in ("KD", "KH", "KW", "SD", "SH", "SW"))
    if pointwise and g.get("CG", x.rows) == x.rows and (g["ID"], g["IH"], g["IW"]) == (g["OD"], g["OH"], g["OW"]):
        return matmul(builder, x, weight, bias, activation, params, what)
    spec = in_weight_precision(builder, choose("conv3d", builder.device).configure(g))
    return conv_step(builder, spec, x, weight, _batched(builder, out_shape), bias, activation, params, what, CONV3D)


def conv3d_transpose(
    builder: Recorder,
    x: Value,
    weight: Weight,
    geometry: dict,
    out_shape: Sequence[int],
    bias: Vector | None = None,
    activation: str = "linear",
    params: dict | None = None,
    what: str = "conv3d_transpose",
) -> Value:
    """The 3-D transposed convolution of ``x`` (Keras ``(batch, D, H, W, CIN)``) by ``weight``
    (``COUT x KD*KH*KW*CIN``, column ``((kz*KH + ky)*KW + kx)*CIN + c``), then bias and activation.
    ``geometry`` holds the defines of kernels/conv3d_transpose.cl: as :func:`conv3d`'s, with ``PF
    PT PL`` the voxels removed from the front, top and left of the full output and ``CIN``."""
    spec = in_weight_precision(builder, choose("conv3d_transpose", builder.device).configure(geometry))
    out = _batched(builder, out_shape)
    return conv_step(builder, spec, x, weight, out, bias, activation, params, what, CONV3D_TRANSPOSE)


def pool3d(builder: Recorder, x: Value, defines: dict, out_shape: Sequence[int], what: str = "pool3d") -> Value:
    """A pooling of ``x`` over volumes (kernels/pool3d.cl) configured with ``defines`` (the sizes,
    the window ``KD KH KW``, strides, padding and ``MAXPOOL``)."""
    spec = choose("pool3d", builder.device).configure(defines)
    return builder.record(POOL3D, spec, _batched(builder, out_shape), {"a": x}, what)


def spatial3d(builder: Recorder, x: Value, defines: dict, out_shape: Sequence[int], what: str = "spatial3d") -> Value:
    """Padding, cropping or upsampling of ``x`` over volumes (kernels/spatial3d.cl) configured with
    ``defines`` (the sizes, offsets ``OZ OY OX`` and repeats ``UZ UY UX``)."""
    spec = choose("spatial3d", builder.device).configure(defines)
    return builder.record(SPATIAL3D, spec, _batched(builder, out_shape), {"a": x}, what)
