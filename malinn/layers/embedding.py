"""The Embedding layer: each integer index replaced by its row of a table (Keras's Embedding)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..plan import kinds
from ..plan.tensors import Vector
from .base import Layer, glorot_uniform, numeric_weights
from .keras_config import KerasContext, NotConvertible
from .lookup import EXACT_TOKENS
from .masking import with_mask, with_mask_maker

if TYPE_CHECKING:
    from ..plan.builder import PlanBuilder
    from ..plan.tensors import Value

__all__ = ["Embedding"]


def _positive(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


class Embedding(Layer):
    """Turns indices into dense vectors: ``embeddings[x]`` for integer ``x`` (Keras's Embedding).

    malinn's inputs are float32: an index is the value truncated toward zero, as Keras's cast to
    int32 makes it. A negative index from ``-input_dim`` reads from the end (Keras 3's ``take``);
    an index outside the table, which TensorFlow on a CPU refuses with an error, gives NaN in
    every feature of its output (a device cannot raise; the NaN shows it downstream).

    Args:
        input_dim: the vocabulary's size, a positive integer.
        output_dim: the size of each vector, a positive integer.
        mask_zero: whether index 0 is padding: the layers after it that take Keras's mask (the
            recurrent layers) skip those steps.
        name: the layer's name.

    Raises:
        ValueError: a size is not a positive integer, or ``input_dim`` is beyond 2^24, where float32
            indices are no longer exact (an index would read another row).
    """

    weight_names = ("embeddings",)
    reusable_on_other_shapes = True

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "Embedding":
        if config.get("lora_rank"):
            raise NotConvertible(f"with lora_rank {config['lora_rank']} (merge the LoRA weights before saving)")
        return cls(
            config["input_dim"], config["output_dim"], mask_zero=bool(config.get("mask_zero", False)), name=keras.name
        )

    def __init__(self, input_dim: int, output_dim: int, mask_zero: bool = False, name: str | None = None):
        super().__init__(name)
        self.input_dim = _positive(input_dim, f"Embedding layer {self.name!r}: input_dim")
        if self.input_dim > EXACT_TOKENS:
            raise ValueError(
                f"Embedding layer {self.name!r}: input_dim {self.input_dim:,} is beyond 2^24 "
                f"({EXACT_TOKENS:,}): malinn's inputs are float32, whose integers are exact only up to "
                f"2^24, so a larger index would read another row"
            )
        self.output_dim = _positive(output_dim, f"Embedding layer {self.name!r}: output_dim")
        self.mask_zero = bool(mask_zero)
        self.embeddings: np.ndarray | None = None

    def build(self, input_shape: Any) -> None:
        """Creates ``embeddings`` (input_dim, output_dim)."""
        super().build(input_shape)
        self.embeddings = glorot_uniform((self.input_dim, self.output_dim), self.input_dim, self.output_dim)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return tuple(input_shape) + (self.output_dim,)

    def check_reuse(self, input_shape: Sequence[int | None], how: str = "receives") -> None:
        """An Embedding reads indices of any shape: its table does not depend on it."""

    def lower(self, builder: PlanBuilder, x: Value) -> Value:
        table = Vector(f"layer {self.name!r} embeddings", self.embeddings, self.device_copies)
        out = kinds.gather(builder, x, table, self.input_dim, self.output_dim, what=self._what())
        # Keras's mask (x != 0) is the indices themselves: the recurrent kernel keeps non-zero entries
        if not (self.mask_zero and len(x.shape) == 2):
            return out

        def ones_where_kept() -> Value:  # the 0/1 mask a masked average multiplies by: a table of 0 then 1s
            table = Vector(
                f"layer {self.name!r} mask",
                np.r_[0.0, np.ones(self.input_dim - 1)].astype(np.float32),
                self.device_copies,
            )
            kept = kinds.gather(builder, x, table, self.input_dim, 1, what=f"{self._what()} mask")
            return kinds.reshape(builder, kept, x.shape, what=f"{self._what()} mask")

        with_mask_maker(builder, x, ones_where_kept)
        return with_mask(builder, out, x)

    def set_weights(self, weights: Any) -> None:
        """Sets ``[embeddings]`` of shape (input_dim, output_dim).

        Raises:
            ValueError: the count or the shape differs.
        """
        weights = numeric_weights(weights, f"Embedding layer {self.name!r}")
        if len(weights) != 1 or weights[0].shape != (self.input_dim, self.output_dim):
            raise ValueError(
                f"Embedding layer {self.name!r} expects one array of shape "
                f"({self.input_dim}, {self.output_dim}), got {[w.shape for w in weights]}"
            )
        if not self.built:
            Layer.build(self, (None, 1))
        self.embeddings = weights[0]
        self._weights_changed()

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "input_dim": self.input_dim,
            "output_dim": self.output_dim,
            "mask_zero": self.mask_zero,
        }
