"""Pooling over volumes, channels last as Keras: ``MaxPooling3D``, ``AveragePooling3D``,
``GlobalMaxPooling3D``, ``GlobalAveragePooling3D``.

A window pooling is one ``pool3d`` kernel (kernels/pool3d.cl) reading the input's matrix view in
whatever layout its producer wrote: a window of ``pool_size`` every ``strides`` voxels, taps outside
the volume left out (TensorFlow's ``same`` pooling). A global pooling is the 2-D global pooling
(kernels/pool.cl) of the same memory seen as images of height ``depth * height``: the matrix view
``C x (batch*D*H*W)`` is the same, and the window is every voxel of a sample.
"""

from __future__ import annotations

from ..plan import kinds
from .pooling import AveragePooling2D, GlobalAveragePooling2D, GlobalMaxPooling2D, MaxPooling2D
from .volumes import volume_defines
from .windows import window_defines

__all__ = ["MaxPooling3D", "AveragePooling3D", "GlobalMaxPooling3D", "GlobalAveragePooling3D"]


class _WindowOverVolume:
    """The lowering of a window pooling over volumes: one ``pool3d`` kernel."""

    pool_size: tuple
    strides: tuple
    padding: str
    maximum: bool

    def lower(self, builder, x):
        defines = volume_defines(x.shape[1:4], self.pool_size, self.strides, (1, 1, 1), self.padding)
        for dilation in ("DD", "DH", "DW"):
            del defines[dilation]
        return kinds.pool3d(
            builder,
            x,
            {**defines, "MAXPOOL": int(self.maximum)},
            self.compute_output_shape(x.shape),  # type: ignore[attr-defined]  # a Layer's, in the classes below
            self._what(),  # type: ignore[attr-defined]
        )


class MaxPooling3D(_WindowOverVolume, MaxPooling2D):
    """The maximum over each ``pool_size`` window of a volume, as Keras's ``MaxPooling3D``.

    Args:
        pool_size: an int or 3 ints.
        strides: an int, 3 ints, or ``None`` (= ``pool_size``).
        padding: ``"valid"`` or ``"same"``.
        data_format: ``None`` or ``"channels_last"`` (``"channels_first"`` is refused by name).
        name: the layer's name.

    Raises:
        ValueError: an argument is not what Keras accepts.
    """

    rank = 3


class AveragePooling3D(_WindowOverVolume, AveragePooling2D):
    """The mean over each ``pool_size`` window of a volume (taps inside it), as Keras's
    ``AveragePooling3D``. Arguments as :class:`MaxPooling3D`."""

    rank = 3


class _OverVolume:
    """The lowering of a global pooling over every voxel of a sample: the 2-D global pooling
    (kernels/pool.cl) of images of height ``depth * height`` (the same matrix view, so no copy); a
    maximum gives NaN where a voxel is NaN, as TensorFlow's reduce_max (pool.cl's NAN_PROPAGATES)."""

    maximum: bool

    def lower(self, builder, x):
        d, h, w, _ = x.shape[1:]
        defines = window_defines((d * h, w), (d * h, w), (1, 1), (1, 1), "valid")
        del defines["DH"], defines["DW"]
        maximum = int(self.maximum)
        return kinds.pool(
            builder,
            x,
            {**defines, "MAXPOOL": maximum, "NAN_PROPAGATES": maximum},
            self.compute_output_shape(x.shape),  # type: ignore[attr-defined]  # a Layer's, in the classes below
            self._what(),  # type: ignore[attr-defined]
        )


class GlobalMaxPooling3D(_OverVolume, GlobalMaxPooling2D):
    """The maximum over depth, height and width (a NaN gives NaN, as TensorFlow's reduce_max), as
    Keras's ``GlobalMaxPooling3D``.

    Args:
        keepdims: keep the spatial axes (as size 1), as Keras's ``keepdims``.
        data_format: ``None`` or ``"channels_last"`` (``"channels_first"`` is refused by name).
        name: the layer's name.
    """

    rank = 3


class GlobalAveragePooling3D(_OverVolume, GlobalAveragePooling2D):
    """The mean over depth, height and width, as Keras's ``GlobalAveragePooling3D``. Arguments as
    :class:`GlobalMaxPooling3D`."""

    rank = 3
