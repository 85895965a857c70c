"""``CategoryEncoding``: integer features as one-hot, multi-hot or count vectors (Keras's
preprocessing layer), by kernels/category_encoding.cl."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..plan import kinds
from ..plan.kinds.encoding import ENCODING_MODES, encoded_shape
from ..plan.tensor import format_shape
from .base import Layer
from .keras_config import KerasContext, NotConvertible

if TYPE_CHECKING:
    from ..plan.builder import PlanBuilder
    from ..plan.tensors import Value

__all__ = ["CategoryEncoding", "encoding_mode", "check_encoded_rank"]

#: what a dense output says where Keras would return a SparseTensor
SPARSE_REFUSAL = "sparse=True (a SparseTensor output) is not computed: malinn's outputs are dense arrays"


def encoding_mode(output_mode: Any, who: str) -> str:
    """Keras's ``output_mode`` of an encoding, its old name ``"binary"`` read as ``"multi_hot"``.

    Raises:
        ValueError: not one of ``"one_hot"``, ``"multi_hot"``, ``"count"``.
    """
    mode = "multi_hot" if output_mode == "binary" else output_mode
    if mode not in ENCODING_MODES:
        raise ValueError(f"{who}: output_mode must be one of {', '.join(ENCODING_MODES)}, got {output_mode!r}")
    return mode


def check_encoded_rank(input_shape: Sequence[int | None], mode: str, who: str) -> None:
    """Checks that inputs of ``input_shape`` (batch axis first) can be encoded as ``mode``: a one-hot
    of indices of any shape, multi-hot and count vectors of samples ``(batch, k)`` (Keras encodes no
    more: tf_keras refuses them, Keras 3's count sums another axis).

    Raises:
        ValueError: the shape cannot be.
    """
    shape = tuple(input_shape)
    if len(shape) < 2:
        raise ValueError(f"{who} expects inputs with a batch axis and a sample axis, got {format_shape(shape)}")
    if mode != "one_hot" and len(shape) != 2:
        raise ValueError(
            f"{who}: {mode} encodes samples of shape (batch, k), as Keras does; got inputs of shape "
            f"{format_shape(shape)} (reshape them to (batch, k) first)"
        )


class CategoryEncoding(Layer):
    """Integer indices as one-hot, multi-hot or count vectors of ``num_tokens`` (Keras's
    ``CategoryEncoding``).

    Indices arrive as float32 and are truncated toward zero, as Keras's cast to an integer. Keras
    raises for some indices outside ``[0, num_tokens)``; a device cannot, so malinn computes what
    Keras 3 computes where it does not raise and NaN where it does: a one-hot of such an index is
    zeros (as ``tf.one_hot``), multi-hot and count leave out an index ``>= num_tokens`` (as
    ``tf.math.bincount``), and a negative index gives NaN in every token of its sample (tf_keras
    raises for all of these; Keras 3 for the negative ones).

    Args:
        num_tokens: the number of tokens, a positive integer.
        output_mode: ``"one_hot"`` (each index a vector: ``(batch, k)`` gives ``(batch, k,
            num_tokens)``, ``(batch, 1)`` gives ``(batch, num_tokens)``), ``"multi_hot"`` (each
            sample ``(batch, k)`` a vector of which tokens it holds) or ``"count"`` (how many
            times); ``"binary"`` is ``"multi_hot"``.
        sparse: False (malinn's outputs are dense).
        name: the layer's name.

    Raises:
        ValueError: an argument Keras refuses, or ``sparse=True``.
    """

    reusable_on_other_shapes = True

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "CategoryEncoding":
        """The layer of a Keras ``CategoryEncoding`` config (tf_keras's ``max_tokens`` read as
        ``num_tokens``).

        Raises:
            NotConvertible: ``sparse=True``.
        """
        if config.get("sparse"):
            raise NotConvertible(f"with {SPARSE_REFUSAL}")
        tokens = config.get("num_tokens", config.get("max_tokens"))
        return cls(tokens, config.get("output_mode", "multi_hot"), name=keras.name)

    def __init__(
        self, num_tokens: Any = None, output_mode: Any = "multi_hot", sparse: bool = False, name: str | None = None
    ):
        super().__init__(name)
        who = f"CategoryEncoding {self.name!r}"
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, np.integer)) or num_tokens < 1:
            raise ValueError(f"{who}: num_tokens must be a positive integer, got {num_tokens!r}")
        if sparse:
            raise ValueError(f"{who}: {SPARSE_REFUSAL}")
        self.num_tokens, self.output_mode = int(num_tokens), encoding_mode(output_mode, who)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        if isinstance(input_shape, list):  # a call with count_weights: a second input
            raise ValueError(
                f"CategoryEncoding {self.name!r}: count_weights (a second input, {len(input_shape)} inputs "
                f"given) is not computed: malinn counts each index once"
            )
        check_encoded_rank(input_shape, self.output_mode, f"CategoryEncoding {self.name!r}")
        return encoded_shape(input_shape, self.num_tokens, self.output_mode)

    def build(self, input_shape: Any) -> None:
        self.compute_output_shape(input_shape)
        super().build(input_shape)

    def check_reuse(self, input_shape: Any, how: str = "receives") -> None:
        """A CategoryEncoding encodes indices of any shape it accepts: it has no weights."""
        self.compute_output_shape(input_shape)

    def lower(self, builder: PlanBuilder, x: Value) -> Value:
        return kinds.category_encoding(builder, x, self.num_tokens, self.output_mode, self._what())

    def get_config(self) -> dict:
        return {**super().get_config(), "num_tokens": self.num_tokens, "output_mode": self.output_mode}
