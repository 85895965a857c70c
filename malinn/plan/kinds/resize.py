"""Image resizing as TensorFlow's ``tf.image.resize`` without antialiasing (Keras ``Resizing``,
``UpSampling2D`` with an interpolation other than ``"nearest"``): one kernel (op ``resize`` of
kernels/library.json), its interpolation a define, reading the input in whatever layout its producer
wrote."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...choice.kernel_choice import choose
from ..tensor import format_shape
from ..tensors import Value
from .base import register
from .window import Window

if TYPE_CHECKING:
    from ..recorder import Recorder

__all__ = ["RESIZE", "RESIZE_MODES", "resize"]

#: Keras's interpolation -> the kernel's MODE (tf.image.resize's nearest, bilinear and bicubic with
#: half-pixel centres, and its area resize)
RESIZE_MODES = {"nearest": 0, "bilinear": 1, "bicubic": 2, "area": 3}


class Resize(Window):
    name = "resize"


RESIZE = register(Resize())


def resize(builder: Recorder, x: Value, size: Sequence[int], interpolation: str, what: str = "resize") -> Value:
    """``x`` (Keras ``(batch, H, W, C)``) resized to ``size`` = ``(height, width)`` by ``interpolation``
    (:data:`RESIZE_MODES`), with half-pixel centres as TensorFlow."""
    if len(x.shape) != 4:
        raise ValueError(f"{what}: resizing takes (batch, height, width, channels), not {format_shape(x.shape)}")
    (ih, iw), (oh, ow) = x.shape[1:3], (int(size[0]), int(size[1]))
    spec = choose("resize", builder.device).configure(
        {"IH": ih, "IW": iw, "OH": oh, "OW": ow, "MODE": RESIZE_MODES[interpolation]}
    )
    return builder.record(RESIZE, spec, (builder.batch, oh, ow, x.shape[3]), {"a": x}, what)
