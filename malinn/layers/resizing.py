"""``Resizing``: images resized to a fixed height and width, as Keras's preprocessing layer computes
it at inference (TensorFlow's ``tf.image.resize`` without antialiasing: nearest, bilinear and bicubic
with half-pixel centres, and area; Keras 3 and tf_keras alike), by kernels/resize.cl."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..plan import kinds
from ..plan.kinds.resize import RESIZE_MODES
from .base import Layer
from .keras_config import KerasContext, NotConvertible

__all__ = ["Resizing", "REFUSED_INTERPOLATIONS", "interpolation_refusal"]

#: the interpolations Keras offers that malinn does not compute, each with what it is
REFUSED_INTERPOLATIONS = {
    "lanczos3": "a Lanczos kernel of radius 3, tf.image.resize's scale-and-translate resampler",
    "lanczos5": "a Lanczos kernel of radius 5, tf.image.resize's scale-and-translate resampler",
    "gaussian": "a Gaussian kernel, tf.image.resize's scale-and-translate resampler",
    "mitchellcubic": "the Mitchell-Netravali cubic, tf.image.resize's scale-and-translate resampler",
}


def interpolation_refusal(interpolation: Any) -> str:
    """Why malinn does not resize by ``interpolation``: what it is, and what malinn computes."""
    what = REFUSED_INTERPOLATIONS.get(interpolation, "not an interpolation Keras offers")
    return f"interpolation {interpolation!r} ({what}) is not computed: malinn resizes by {', '.join(RESIZE_MODES)}"


class Resizing(Layer):
    """Each image of ``(batch, height, width, channels)`` resized to ``(height, width)``, as
    Keras's ``Resizing``.

    Args:
        height, width: the output size, positive integers.
        interpolation: ``"bilinear"``, ``"nearest"``, ``"bicubic"`` (Keys' cubic with a = -0.5,
            TensorFlow's: the taps outside the image left out and the others reweighted) or
            ``"area"``; ``"lanczos3"``, ``"lanczos5"``, ``"gaussian"`` and ``"mitchellcubic"``
            are refused.
        crop_to_aspect_ratio, pad_to_aspect_ratio: False (malinn resizes the whole image).
        antialias: False (Keras's default).
        name: the layer's name.

    Raises:
        ValueError: an argument is not what Keras accepts, or one malinn does not compute.
    """

    reusable_on_other_shapes = True

    def __init__(
        self,
        height: int,
        width: int,
        interpolation: str = "bilinear",
        crop_to_aspect_ratio: bool = False,
        pad_to_aspect_ratio: bool = False,
        antialias: bool = False,
        data_format: str | None = None,
        name: str | None = None,
    ):
        super().__init__(name)
        who = f"{type(self).__name__} {self.name!r}"
        for value, what in ((height, "height"), (width, "width")):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{who}: {what} must be a positive integer, got {value!r}")
        if interpolation not in RESIZE_MODES:
            raise ValueError(f"{who}: {interpolation_refusal(interpolation)}")
        if crop_to_aspect_ratio or pad_to_aspect_ratio or antialias:
            raise ValueError(f"{who}: crop_to_aspect_ratio, pad_to_aspect_ratio and antialias are not computed")
        if data_format not in (None, "channels_last"):
            raise ValueError(f"{who}: only data_format='channels_last' runs, got {data_format!r}")
        self.height, self.width, self.interpolation = int(height), int(width), interpolation

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "Resizing":
        """The layer of a Keras ``Resizing`` config.

        Raises:
            NotConvertible: an interpolation, aspect-ratio option or antialiasing malinn does not compute.
        """
        interpolation = config.get("interpolation", "bilinear")
        if interpolation not in RESIZE_MODES:
            raise NotConvertible(f"with {interpolation_refusal(interpolation)}")
        for key in ("crop_to_aspect_ratio", "pad_to_aspect_ratio", "antialias"):
            if config.get(key):
                raise NotConvertible(f"with {key}=True (malinn resizes the whole image, without antialiasing)")
        return cls(
            config["height"], config["width"], interpolation, data_format=config.get("data_format"), name=keras.name
        )

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        if len(shape) != 4:
            raise ValueError(
                f"{type(self).__name__} {self.name!r} expects inputs of rank 4 (batch, height, width, "
                f"channels), got {shape}"
            )
        return (shape[0], self.height, self.width, shape[3])

    def build(self, input_shape: Any) -> None:
        self.compute_output_shape(input_shape)
        super().build(input_shape)

    def lower(self, builder, x):
        return kinds.resize(builder, x, (self.height, self.width), self.interpolation, self._what())

    def get_config(self) -> dict:
        return {**super().get_config(), "height": self.height, "width": self.width, "interpolation": self.interpolation}
