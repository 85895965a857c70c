"""Layers that change a tensor's shape, not its values: ``Flatten``, ``Reshape``, ``Permute``,
``RepeatVector``, ``Identity``."""

from __future__ import annotations

import math
from typing import Any

from ..plan import kinds
from .base import Layer
from .keras_config import KerasContext, NotConvertible

__all__ = ["Flatten", "Reshape", "Permute", "RepeatVector", "Identity"]

#: Keras's random augmentation layers: each returns its input unchanged at inference, in Keras 3 and
#: in tf_keras (tests/graph_zoo.py's "augmented" model runs every one the installed Keras has and
#: compares), so :class:`Identity` stands for them as for Dropout. RandomCrop is not one: tf_keras crops
#: at inference.
KERAS_AUGMENTATIONS = (
    "RandomFlip",
    "RandomRotation",
    "RandomZoom",
    "RandomTranslation",
    "RandomContrast",
    "RandomBrightness",
    "RandomHeight",
    "RandomWidth",
    "RandomColorDegeneration",
    "RandomColorJitter",
    "RandomElasticTransform",
    "RandomErasing",
    "RandomGaussianBlur",
    "RandomGrayscale",
    "RandomHue",
    "RandomInvert",
    "RandomPerspective",
    "RandomPosterization",
    "RandomSaturation",
    "RandomSharpness",
    "RandomShear",
    "AugMix",
    "CutMix",
    "MixUp",
    "RandAugment",
    "Solarization",
)
#: Keras's layers that compute nothing at inference besides the augmentations (regularizers, noise)
KERAS_INFERENCE_NO_OPS = (
    "Dropout",
    "SpatialDropout1D",
    "SpatialDropout2D",
    "SpatialDropout3D",
    "GaussianNoise",
    "GaussianDropout",
    "AlphaDropout",
    "ActivityRegularization",
    "InputLayer",
)


def _int_tuple(value: Any, who: str, label: str, minimum: int) -> tuple:
    items: tuple | None
    try:
        items = tuple(value)
    except TypeError:
        items = None
    if not items or any(isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in items):
        raise ValueError(f"{who}: {label} must be a non-empty list of integers >= {minimum}, got {value!r}")
    return items


class Flatten(Layer):
    """Flattens each sample to one axis in Keras's order (row-major, channels last)."""

    reusable_on_other_shapes = True

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "Flatten":
        if keras.rank > 2 and config.get("data_format", "channels_last") == "channels_first":
            raise NotConvertible("with data_format='channels_first'")
        return cls(name=keras.name)

    @classmethod
    def from_keras_time_distributed(cls, config: dict, keras: KerasContext) -> "Reshape":
        return Reshape([keras.input_shape[1], -1], name=keras.name)  # each time step flattened

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        return (shape[0], math.prod(shape[1:]))

    def lower(self, builder, x):
        return kinds.reshape(builder, x, self.compute_output_shape(x.shape), what=self._what())


class Reshape(Layer):
    """Each sample reshaped to ``target_shape`` in Keras's (row-major) order; one size may be -1.

    Args:
        target_shape: the sample's new shape (without the batch axis).
        name: the layer's name.

    Raises:
        ValueError: ``target_shape`` is not a list of positive sizes with at most one -1, or does
            not hold the input's values.
    """

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "Reshape":
        return cls(list(config.get("target_shape") or []), name=keras.name)

    @classmethod
    def from_keras_time_distributed(cls, config: dict, keras: KerasContext) -> "Reshape":
        target = [keras.input_shape[1]] + list(config.get("target_shape", []))  # the time axis kept
        return cls.from_keras_config({**config, "target_shape": target}, keras)

    def __init__(self, target_shape: Any, name: str | None = None):
        super().__init__(name)
        self.target_shape = _int_tuple(target_shape, f"Reshape {self.name!r}", "target_shape", -1)
        if 0 in self.target_shape or self.target_shape.count(-1) > 1:
            raise ValueError(f"Reshape {self.name!r}: target_shape {list(target_shape)} has a 0 or more than one -1")

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        size, known = math.prod(shape[1:]), math.prod(d for d in self.target_shape if d != -1)
        target = tuple(size // known if d == -1 else d for d in self.target_shape)
        if size % known or math.prod(target) != size:
            raise ValueError(
                f"Reshape {self.name!r}: samples of shape {shape[1:]} ({size} values) cannot be "
                f"reshaped to {self.target_shape}"
            )
        return (shape[0],) + target

    def build(self, input_shape: Any) -> None:
        super().build(input_shape)
        self.compute_output_shape(input_shape)

    def lower(self, builder, x):
        return kinds.reshape(builder, x, self.compute_output_shape(x.shape), what=self._what())

    def get_config(self) -> dict:
        return {**super().get_config(), "target_shape": list(self.target_shape)}


class Permute(Layer):
    """The sample's axes reordered: ``dims`` lists, for each output axis, the input axis (1-based,
    as Keras: the batch axis stays first).

    Raises:
        ValueError: ``dims`` is not an order of 1..rank.
    """

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "Permute":
        return cls(list(config.get("dims") or []), name=keras.name)

    @classmethod
    def from_keras_time_distributed(cls, config: dict, keras: KerasContext) -> "Permute":
        dims = [1] + [d + 1 for d in config.get("dims", [])]  # the time axis kept first
        return cls.from_keras_config({**config, "dims": dims}, keras)

    def __init__(self, dims: Any, name: str | None = None):
        super().__init__(name)
        self.dims = _int_tuple(dims, f"Permute {self.name!r}", "dims", 1)
        if sorted(self.dims) != list(range(1, len(self.dims) + 1)):
            raise ValueError(f"Permute {self.name!r}: dims {list(dims)} is not an order of 1..{len(self.dims)}")

    def build(self, input_shape: Any) -> None:
        super().build(input_shape)
        if len(self._built_shape()) != len(self.dims):
            raise ValueError(
                f"Permute {self.name!r}: dims {list(self.dims)} do not fit samples of shape {self.input_shape}"
            )

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        return (shape[0],) + tuple(shape[d] for d in self.dims)

    def lower(self, builder, x):
        return kinds.permute(builder, x, self.dims, what=self._what())

    def get_config(self) -> dict:
        return {**super().get_config(), "dims": list(self.dims)}


class RepeatVector(Layer):
    """Each sample of ``(batch, features)`` repeated ``n`` times: ``(batch, n, features)``.

    Raises:
        ValueError: ``n`` is not a positive integer, or the input is not 2-D.
    """

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "RepeatVector":
        return cls(int(config["n"]), name=keras.name)

    def __init__(self, n: int, name: str | None = None):
        super().__init__(name)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"RepeatVector {self.name!r}: n must be a positive integer, got {n!r}")
        self.n = n

    def build(self, input_shape: Any) -> None:
        super().build(input_shape)
        if len(self._built_shape()) != 1:
            raise ValueError(
                f"RepeatVector {self.name!r} takes inputs of shape (batch, features), not {(None,) + self._built_shape()}"
            )

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        return (shape[0], self.n) + shape[1:]

    def lower(self, builder, x):
        return kinds.repeat(builder, x, self.n, what=self._what())

    def get_config(self) -> dict:
        return {**super().get_config(), "n": self.n}


class Identity(Layer):
    """Returns its input (Keras's Identity). It stands for the Keras layers that compute nothing at
    inference (Dropout and its kind, the random augmentations), which the converter drops: it makes
    one only for a model of nothing else, or for a ``TimeDistributed`` of one."""

    reusable_on_other_shapes = True

    keras_aliases = KERAS_INFERENCE_NO_OPS + KERAS_AUGMENTATIONS
    keras_no_op = True
    #: the noise and the augmentations: random in a call with training=True
    keras_training_dependent = tuple(
        name for name in keras_aliases if name not in ("InputLayer", "ActivityRegularization")
    )
    keras_refused = {
        "RandomCrop": "(tf_keras crops and resizes at inference, Keras 3 returns the input: crop the "
        "images before predict and save the model without it)"
    }

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "Identity":
        return cls(name=keras.name)

    @classmethod
    def from_keras_time_distributed(cls, config: dict, keras: KerasContext) -> "Identity":
        return cls(name=keras.name)

    def lower(self, builder, x):
        return x
