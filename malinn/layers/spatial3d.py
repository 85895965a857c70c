"""Layers that move voxels without arithmetic, channels last as Keras: ``ZeroPadding3D``,
``Cropping3D``, ``UpSampling3D``.

Each is one ``spatial3d_copy`` kernel (kernels/spatial3d.cl) reading the input's matrix view in
whatever layout its producer wrote: output voxel ``(z, y, x)`` is input voxel ``((z + OZ) / UZ,
(y + OY) / UY, (x + OX) / UX)``, 0 outside the volume.
"""

from __future__ import annotations

from typing import Any

from ..plan import kinds
from .spatial import Cropping2D, UpSampling2D, ZeroPadding2D
from .volumes import volume_sizes

__all__ = ["ZeroPadding3D", "Cropping3D", "UpSampling3D"]


class _VolumeCopy:
    """The lowering of the layers below: one ``spatial3d_copy`` with the sizes and the layer's
    offsets and repeats (``_volume_defines``)."""

    def lower(self, builder, x):
        out = self.compute_output_shape(x.shape)  # type: ignore[attr-defined]  # a Layer's, in the classes below
        defines = {**volume_sizes(x.shape[1:4], out[1:4]), **self._volume_defines()}
        return kinds.spatial3d(builder, x, defines, out, self._what())  # type: ignore[attr-defined]

    def _volume_defines(self) -> dict:
        raise NotImplementedError


class ZeroPadding3D(_VolumeCopy, ZeroPadding2D):
    """Zeros around the volume, as Keras's ``ZeroPadding3D``.

    Args:
        padding: an int, 3 ints (the same before and after along depth, height, width), or
            ``((front, back), (top, bottom), (left, right))``.
        data_format: ``None`` or ``"channels_last"`` (``"channels_first"`` is refused by name).
        name: the layer's name.
    """

    rank = 3

    def __init__(self, padding: Any = (1, 1, 1), data_format: str | None = None, name: str | None = None):
        super().__init__(padding, data_format, name)

    def _volume_defines(self) -> dict:
        return {"OZ": -self.padding[0][0], "OY": -self.padding[1][0], "OX": -self.padding[2][0]}


class Cropping3D(_VolumeCopy, Cropping2D):
    """Voxels cut from the borders, as Keras's ``Cropping3D``.

    Args:
        cropping: an int, 3 ints, or ``((front, back), (top, bottom), (left, right))``.
        data_format: ``None`` or ``"channels_last"`` (``"channels_first"`` is refused by name).
        name: the layer's name.
    """

    rank = 3

    def __init__(
        self, cropping: Any = ((1, 1), (1, 1), (1, 1)), data_format: str | None = None, name: str | None = None
    ):
        super().__init__(cropping, data_format, name)

    def _volume_defines(self) -> dict:
        return {"OZ": self.cropping[0][0], "OY": self.cropping[1][0], "OX": self.cropping[2][0]}


class UpSampling3D(_VolumeCopy, UpSampling2D):
    """Each voxel repeated ``size`` times along depth, height and width, as Keras's
    ``UpSampling3D`` (nearest: Keras's only interpolation for volumes).

    Args:
        size: an int or 3 ints.
        data_format: ``None`` or ``"channels_last"`` (``"channels_first"`` is refused by name).
        name: the layer's name.

    Raises:
        ValueError: an argument is not what Keras accepts.
    """

    rank = 3
    keras_config_keys = ("size", "data_format")  # Keras's UpSampling3D has no interpolation

    def __init__(self, size: Any = (2, 2, 2), data_format: str | None = None, name: str | None = None):
        super().__init__(size, data_format, "nearest", name)

    def _volume_defines(self) -> dict:
        return dict(zip(("UZ", "UY", "UX"), self.size))

    def get_config(self) -> dict:
        config = super().get_config()
        del config["interpolation"]
        return config
