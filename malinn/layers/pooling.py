"""Pooling layers, channels last as Keras: ``MaxPooling1D/2D``, ``AveragePooling1D/2D``,
``GlobalMaxPooling1D/2D``, ``GlobalAveragePooling1D/2D``.

Each is one ``pool`` kernel (kernels/pool.cl) reading the input's matrix view in whatever layout its
producer wrote: a window of ``pool_size`` every ``strides`` pixels, taps outside the image left out
(TensorFlow's ``same`` pooling); a global pooling is the window of the whole image. A 1-D layer is
the 2-D one on an image of height 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..plan import kinds
from .base import Layer
from .masking import binary_mask, mask_of
from .windows import as_tuple, output_size, spatial_of, window_defines

__all__ = [
    "MaxPooling1D",
    "MaxPooling2D",
    "AveragePooling1D",
    "AveragePooling2D",
    "GlobalMaxPooling1D",
    "GlobalMaxPooling2D",
    "GlobalAveragePooling1D",
    "GlobalAveragePooling2D",
]


class _Pooling(Layer):
    """A window pooling of rank ``rank``; ``maximum`` True for the maximum, False for the mean.

    Args:
        pool_size: an int or ``rank`` ints.
        strides: an int, ``rank`` ints, or ``None`` (= ``pool_size``).
        padding: ``"valid"`` or ``"same"``.
        name: the layer's name.

    Raises:
        ValueError: an argument is not what Keras accepts.
    """

    reusable_on_other_shapes = True

    rank, maximum = 2, True

    #: Keras's arguments that change what it computes, as its config saves them
    keras_config_keys = ("pool_size", "strides", "padding", "data_format")

    def __init__(
        self,
        pool_size: int | Sequence[int] = 2,
        strides: int | Sequence[int] | None = None,
        padding: str = "valid",
        data_format: str | None = None,
        name: str | None = None,
    ):
        super().__init__(name)
        who = f"{type(self).__name__} {self.name!r}"
        self.pool_size = as_tuple(pool_size, self.rank, f"{who}: pool_size")
        self.strides = self.pool_size if strides is None else as_tuple(strides, self.rank, f"{who}: strides")
        if padding not in ("valid", "same"):
            raise ValueError(f"{who}: padding must be 'valid' or 'same', got {padding!r}")
        if data_format not in (None, "channels_last"):
            raise ValueError(f"{who}: only data_format='channels_last' runs, got {data_format!r}")
        self.padding = padding

    def _hw(self, pair: Sequence[int]) -> tuple:
        return (1,) + tuple(pair) if self.rank == 1 else tuple(pair)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        if len(shape) != self.rank + 2:
            raise ValueError(f"{type(self).__name__} {self.name!r} expects inputs of rank {self.rank + 2}, got {shape}")
        spatial = tuple(
            output_size(n, k, s, 1, self.padding) for n, k, s in zip(shape[1:-1], self.pool_size, self.strides)
        )
        if 0 in spatial:
            raise ValueError(f"{type(self).__name__} {self.name!r}: pool {self.pool_size} does not fit input {shape}")
        return (shape[0],) + spatial + (shape[-1],)

    def build(self, input_shape: Any) -> None:
        self.compute_output_shape(input_shape)
        super().build(input_shape)

    def lower(self, builder, x):
        h, w, _ = spatial_of(x.shape[1:])
        defines = window_defines((h, w), self._hw(self.pool_size), self._hw(self.strides), (1, 1), self.padding)
        del defines["DH"], defines["DW"]
        return kinds.pool(
            builder, x, {**defines, "MAXPOOL": int(self.maximum)}, self.compute_output_shape(x.shape), self._what()
        )

    def get_config(self) -> dict:
        return {**super().get_config(), "pool_size": self.pool_size, "strides": self.strides, "padding": self.padding}


class MaxPooling2D(_Pooling):
    """The maximum over each ``pool_size`` window, as Keras's ``MaxPooling2D``."""


class AveragePooling2D(_Pooling):
    """The mean over each ``pool_size`` window (taps inside the image), as Keras's ``AveragePooling2D``."""

    maximum = False


class MaxPooling1D(_Pooling):
    """The maximum over each ``pool_size`` window of a sequence, as Keras's ``MaxPooling1D``."""

    rank = 1


class AveragePooling1D(_Pooling):
    """The mean over each ``pool_size`` window of a sequence, as Keras's ``AveragePooling1D``."""

    rank, maximum = 1, False


class _GlobalPooling(Layer):
    """The maximum or mean over all positions of each channel.

    Args:
        keepdims: keep the spatial axes (as size 1), as Keras's ``keepdims``.
        name: the layer's name.
    """

    reusable_on_other_shapes = True

    rank, maximum = 2, True

    keras_config_keys = ("keepdims", "data_format")

    def __init__(self, keepdims: bool = False, data_format: str | None = None, name: str | None = None):
        super().__init__(name)
        if data_format not in (None, "channels_last"):
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: only data_format='channels_last' runs, got {data_format!r}"
            )
        self.keepdims = bool(keepdims)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        if len(shape) != self.rank + 2:
            raise ValueError(f"{type(self).__name__} {self.name!r} expects inputs of rank {self.rank + 2}, got {shape}")
        return (shape[0],) + ((1,) * self.rank if self.keepdims else ()) + (shape[-1],)

    def build(self, input_shape: Any) -> None:
        self.compute_output_shape(input_shape)
        super().build(input_shape)

    def lower(self, builder, x):
        h, w, _ = spatial_of(x.shape[1:])
        defines = window_defines((h, w), (h, w), (1, 1), (1, 1), "valid")
        del defines["DH"], defines["DW"]
        # Keras's GlobalMaxPooling is TensorFlow's reduce_max, where a NaN gives NaN (its MaxPooling,
        # max_pool, skips NaN: pool.cl's NAN_PROPAGATES)
        return kinds.pool(
            builder,
            x,
            {**defines, "MAXPOOL": int(self.maximum), "NAN_PROPAGATES": int(self.maximum)},
            self.compute_output_shape(x.shape),
            self._what(),
        )

    def get_config(self) -> dict:
        return {**super().get_config(), "keepdims": self.keepdims}


class GlobalMaxPooling2D(_GlobalPooling):
    """The maximum over height and width, as Keras's ``GlobalMaxPooling2D``."""


class GlobalAveragePooling2D(_GlobalPooling):
    """The mean over height and width, as Keras's ``GlobalAveragePooling2D``."""

    maximum = False


class GlobalMaxPooling1D(_GlobalPooling):
    """The maximum over the sequence, as Keras's ``GlobalMaxPooling1D``."""

    rank = 1


class GlobalAveragePooling1D(_GlobalPooling):
    """The mean over the sequence, as Keras's ``GlobalAveragePooling1D``; with a Keras mask (an
    ``Embedding(mask_zero=True)`` before it) the mean over the kept steps, NaN for a sample whose
    every step is masked (0 / 0, as Keras computes it)."""

    rank, maximum = 1, False
    #: called on ``[x, mask]``, it takes the second as Keras's mask (a Keras 3 file's call with ``mask=``)
    keras_takes_mask = True

    def build(self, input_shape: Any) -> None:
        super().build(input_shape[0] if isinstance(input_shape, list) else input_shape)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return super().compute_output_shape(input_shape[0] if isinstance(input_shape, list) else input_shape)

    def lower(self, builder, x):
        x, mask = x if isinstance(x, list) else (x, mask_of(builder, x))
        if mask is None:
            return super().lower(builder, x)
        kept = binary_mask(builder, mask)
        what = self._what()
        total = kinds.batch_dot(builder, kept, x, (1, 1), what=f"{what} masked sum")  # (batch, features)
        count = kinds.batch_dot(builder, kept, kept, (1, 1), what=f"{what} kept steps")  # (batch, 1)
        out = kinds.merge(builder, [total, count], "divide", what=f"{what} masked mean")
        return kinds.reshape(builder, out, self.compute_output_shape(x.shape), what=what) if self.keepdims else out
