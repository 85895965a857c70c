"""Layers that move pixels without arithmetic, channels last as Keras: ``ZeroPadding1D/2D``,
``Cropping1D/2D``, ``UpSampling1D/2D`` (nearest).

Each is one ``spatial_copy`` kernel (kernels/spatial.cl) reading the input's matrix view in whatever
layout its producer wrote: output pixel ``(y, x)`` is input pixel ``((y + OY) / UY, (x + OX) / UX)``,
0 outside the image. A 1-D layer is the 2-D one on an image of height 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..plan import kinds
from ..plan.kinds.resize import RESIZE_MODES
from .base import Layer
from .resizing import interpolation_refusal
from .windows import as_tuple, spatial_of

__all__ = ["ZeroPadding1D", "ZeroPadding2D", "Cropping1D", "Cropping2D", "UpSampling1D", "UpSampling2D"]


def _amounts(value: Any, rank: int, who: str, what: str) -> tuple:
    """Keras's padding/cropping argument as ``((before, after),) * rank`` of ints >= 0.

    Raises:
        ValueError: anything Keras would not accept.
    """

    def count(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{who}: {what} must be integers >= 0, got {value!r}")
        return int(v)

    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return ((count(value),) * 2,) * rank
    try:
        items = list(value)
    except TypeError:
        raise ValueError(f"{who}: {what} must be an int, {rank} ints or {rank} pairs, got {value!r}") from None
    if rank == 1 and len(items) == 2 and all(not isinstance(i, (list, tuple)) for i in items):
        return ((count(items[0]), count(items[1])),)
    if len(items) != rank:
        raise ValueError(f"{who}: {what} must be an int, {rank} ints or {rank} pairs, got {value!r}")
    pairs = []
    for item in items:
        if isinstance(item, (list, tuple)):
            if len(item) != 2:
                raise ValueError(f"{who}: {what} must be an int, {rank} ints or {rank} pairs, got {value!r}")
            pairs.append((count(item[0]), count(item[1])))
        else:
            pairs.append((count(item),) * 2)
    return tuple(pairs)


class _Spatial(Layer):
    """A ``spatial_copy`` of rank ``rank``; subclasses give the output size and the defines."""

    reusable_on_other_shapes = True

    rank = 2

    def __init__(self, data_format: str | None = None, name: str | None = None):
        super().__init__(name)
        if data_format not in (None, "channels_last"):
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: only data_format='channels_last' runs, got {data_format!r}"
            )

    def _check(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        if len(shape) != self.rank + 2:
            raise ValueError(f"{type(self).__name__} {self.name!r} expects inputs of rank {self.rank + 2}, got {shape}")
        return shape

    def _full(self, pairs: Any) -> tuple:
        """Per-axis values for the (height, width) of the 2-D view."""
        return ((0, 0),) + tuple(pairs) if self.rank == 1 else tuple(pairs)

    def _out(self, n: int, axis: int) -> int:
        """The output size along spatial axis ``axis`` of input size ``n``."""
        raise NotImplementedError

    def _defines(self) -> dict:
        """The ``spatial_copy`` defines beyond the sizes (offsets ``OY``/``OX``, factors ``UY``/``UX``)."""
        raise NotImplementedError

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = self._check(input_shape)
        spatial = tuple(self._out(n, axis) for axis, n in enumerate(shape[1:-1]))
        if min(spatial) < 1:
            raise ValueError(f"{type(self).__name__} {self.name!r} leaves nothing of input {shape}")
        return (shape[0],) + spatial + (shape[-1],)

    def build(self, input_shape: Any) -> None:
        self.compute_output_shape(input_shape)
        super().build(input_shape)

    def lower(self, builder, x):
        h, w, _ = spatial_of(x.shape[1:])
        out = self.compute_output_shape(x.shape)
        oh, ow = spatial_of(out[1:])[:2]
        return kinds.spatial(builder, x, {"IH": h, "IW": w, "OH": oh, "OW": ow, **self._defines()}, out, self._what())


class ZeroPadding2D(_Spatial):
    """Zeros around the image, as Keras's ``ZeroPadding2D``.

    Args:
        padding: an int, ``(rows, cols)``, or ``((top, bottom), (left, right))``.
        name: the layer's name.
    """

    #: Keras's arguments that change what it computes (ZeroPadding1D's too), as its config saves them
    keras_config_keys = ("padding", "data_format")

    def __init__(self, padding: Any = 1, data_format: str | None = None, name: str | None = None):
        super().__init__(data_format, name)
        self.padding = _amounts(padding, self.rank, f"{type(self).__name__} {self.name!r}", "padding")

    def _out(self, n: int, axis: int) -> int:
        return n + sum(self.padding[axis])

    def _defines(self) -> dict:
        (top, _), (left, _) = self._full(self.padding)
        return {"OY": -top, "OX": -left}

    def get_config(self) -> dict:
        return {**super().get_config(), "padding": self.padding}


class ZeroPadding1D(ZeroPadding2D):
    """Zeros before and after a sequence, as Keras's ``ZeroPadding1D`` (``padding``: int or pair)."""

    rank = 1


class Cropping2D(_Spatial):
    """Pixels cut from the borders, as Keras's ``Cropping2D``.

    Args:
        cropping: an int, ``(rows, cols)``, or ``((top, bottom), (left, right))``.
        name: the layer's name.
    """

    keras_config_keys: tuple | None = ("cropping", "data_format")

    def __init__(self, cropping: Any = ((0, 0), (0, 0)), data_format: str | None = None, name: str | None = None):
        super().__init__(data_format, name)
        self.cropping = _amounts(cropping, self.rank, f"{type(self).__name__} {self.name!r}", "cropping")

    def _out(self, n: int, axis: int) -> int:
        return n - sum(self.cropping[axis])

    def _defines(self) -> dict:
        (top, _), (left, _) = self._full(self.cropping)
        return {"OY": top, "OX": left}

    def get_config(self) -> dict:
        return {**super().get_config(), "cropping": self.cropping}


class Cropping1D(Cropping2D):
    """Steps cut from both ends of a sequence, as Keras's ``Cropping1D`` (``cropping``: int or pair)."""

    rank = 1

    keras_config_keys = ("cropping",)  # Keras's Cropping1D has no data_format

    def __init__(self, cropping: Any = (1, 1), data_format: str | None = None, name: str | None = None):
        super().__init__(cropping, data_format, name)


class UpSampling2D(_Spatial):
    """Each pixel repeated ``size`` times along height and width, as Keras's ``UpSampling2D``
    (``interpolation`` ``"nearest"``, or ``"bilinear"``, ``"bicubic"``, ``"area"`` as ``tf.image.resize``).

    Args:
        size: an int or ``(rows, cols)``.
        name: the layer's name.
    """

    keras_config_keys: tuple | None = ("size", "data_format", "interpolation")

    def __init__(
        self, size: Any = 2, data_format: str | None = None, interpolation: str = "nearest", name: str | None = None
    ):
        super().__init__(data_format, name)
        if interpolation not in RESIZE_MODES:  # all but nearest: kernels/resize.cl, as tf.image.resize
            raise ValueError(f"{type(self).__name__} {self.name!r}: {interpolation_refusal(interpolation)}")
        self.size = as_tuple(size, self.rank, f"{type(self).__name__} {self.name!r}: size")
        self.interpolation = interpolation

    def _out(self, n: int, axis: int) -> int:
        return n * self.size[axis]

    def _defines(self) -> dict:
        uy, ux = ((1,) + self.size) if self.rank == 1 else self.size
        return {"UY": uy, "UX": ux}

    def lower(self, builder, x):
        if self.interpolation == "nearest":
            return super().lower(builder, x)
        return kinds.resize(builder, x, self.compute_output_shape(x.shape)[1:3], self.interpolation, self._what())

    def get_config(self) -> dict:
        return {**super().get_config(), "size": self.size, "interpolation": self.interpolation}


class UpSampling1D(UpSampling2D):
    """Each step repeated ``size`` times, as Keras's ``UpSampling1D``."""

    rank = 1
    keras_config_keys = ("size",)  # Keras's UpSampling1D has neither data_format nor interpolation
