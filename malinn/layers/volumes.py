"""Sliding-window geometry over volumes, shared by the 3-D convolutions, pooling and the pixel-moving
3-D layers: a layer sees its input ``(batch, D, H, W, C)`` through the matrix view ``C x
(batch*D*H*W)`` (:mod:`malinn.plan.tensor`); its kernels (kernels/volume.clh) take the sizes
``ID IH IW OD OH OW``, window ``KD KH KW``, strides ``SD SH SW``, dilation ``DD DH DW`` and the
padding before the first voxel ``PF PT PL`` (front, top, left), which :func:`volume_defines`
computes the way TensorFlow does (``same``: half the total padding before, rounded down)."""

from __future__ import annotations

from collections.abc import Sequence

from .windows import output_size, padding_before

__all__ = ["volume_defines", "volume_sizes"]

#: the define names per axis (depth, height, width)
SIZE_IN, SIZE_OUT = ("ID", "IH", "IW"), ("OD", "OH", "OW")
WINDOW, STRIDES, DILATION, BEFORE = ("KD", "KH", "KW"), ("SD", "SH", "SW"), ("DD", "DH", "DW"), ("PF", "PT", "PL")


def volume_sizes(dhw_in: Sequence[int], dhw_out: Sequence[int]) -> dict:
    """The size defines of a volume ``dhw_in`` mapped to ``dhw_out`` (strides 1, no padding)."""
    return {
        **dict(zip(SIZE_IN, (int(n) for n in dhw_in))),
        **dict(zip(SIZE_OUT, (int(n) for n in dhw_out))),
        **dict.fromkeys(STRIDES, 1),
        **dict.fromkeys(BEFORE, 0),
    }


def volume_defines(
    dhw_in: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilation: Sequence[int],
    padding: str,
) -> dict:
    """The geometry defines of a window over a ``(D, H, W)`` volume (see the module docstring)."""
    axes = list(zip(dhw_in, kernel, strides, dilation))
    return {
        **dict(zip(SIZE_IN, (int(n) for n in dhw_in))),
        **dict(zip(SIZE_OUT, (output_size(n, k, s, d, padding) for n, k, s, d in axes))),
        **dict(zip(WINDOW, (int(k) for k in kernel))),
        **dict(zip(STRIDES, (int(s) for s in strides))),
        **dict(zip(DILATION, (int(d) for d in dilation))),
        **dict(zip(BEFORE, (padding_before(n, k, s, d, padding) for n, k, s, d in axes))),
    }
