"""Fused attention: scores, mask, softmax over the keys and the value product in one launch
(kernels/attention.cl), the score matrix never stored. MultiHeadAttention lowers to its projections
(matmuls), this step and the output projection; Attention and AdditiveAttention to this step alone.

The step reads two tensors: ``a`` the queries (rows: each head's projected query, then the
attention mask's keys, then the query mask) and ``b`` the keys (rows: each head's keys, the values
unless they are the keys, then the value mask), one column per query and per key; the layer
concatenates what it needs along the last axis first (a Dense may write its slice of that buffer
itself: a view).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...choice.kernel_choice import choose
from ..tensor import format_shape
from ..tensors import Step, Value, Vector
from .base import OpKind, register

if TYPE_CHECKING:
    from ..recorder import Recorder

__all__ = ["ATTENTION", "attention", "MASK_MODES", "SCORES"]

#: what a masked key's score becomes, as each Keras computes it (kernels/attention.cl MODE)
MASK_MODES = {"lowest": 0, "zeroed": 1, "added": 2}
#: how a query and a key make a score (kernels/attention.cl SCORE)
SCORES = {"dot": 0, "concat": 1, "additive": 2}
#: Keras 3's lowest score for a masked key in float32 (its dot_product_attention: -0.7 * 3.38953e38)
_LOWEST = float(np.float32(3.38953e38 * -0.7))


def _literal(value: float) -> str:
    """A float32 value as an OpenCL C literal that reads back exactly."""
    return f"{float(np.float32(value)):.9e}f"


class Attention(OpKind):
    name = "attention"
    shape_generic = True

    def fused(self, step: Step) -> list:
        found = ["scores", "softmax"]
        if (
            step.spec.config.get("AMASK")
            or step.spec.config.get("VMASK")
            or step.spec.config.get("CAUSAL")
            or step.spec.config.get("QMASK") == 2
        ):
            found.insert(1, "mask")
        return found


ATTENTION = register(Attention())


def attention(
    builder: Recorder,
    queries: Value,
    keys: Value,
    *,
    heads: int,
    key_dim: int,
    value_dim: int,
    value_row: int,
    attention_mask: bool = False,
    query_mask: bool | str = False,
    value_mask: bool = False,
    causal: bool = False,
    mode: str = "lowest",
    score: str = "dot",
    scale: float = 1.0,
    concat_weight: float = 1.0,
    score_vector: Vector | None = None,
    what: str = "attention",
) -> Value:
    """The attention output ``(batch, Tq, heads * value_dim)`` of ``queries`` (batch, Tq, rows: see the
    module) over ``keys`` (batch, Tv, rows).

    Args:
        heads, key_dim, value_dim: the heads and each head's query/key and value sizes.
        value_row: the row of ``keys`` where the values begin (0: the keys are the values).
        attention_mask: ``queries`` holds a (Tq, Tv) mask after the queries (rows heads * key_dim ...).
        query_mask: ``queries``'s last row is a query mask: a masked query's output is 0 (True), or
            its every key is masked (``"keys"``: MultiHeadAttention's).
        value_mask: ``keys``'s last row is a value mask.
        causal: query t attends only to keys j <= t.
        mode: a masked key's score: ``lowest`` (Keras 3's dot_product_attention), ``zeroed``
            (-1e9 and its weight zeroed: Keras 3's masked Softmax), ``added`` (+ (1 - m) * -1e9:
            tf_keras's Softmax, the Attention layers).
        score: ``dot`` (times ``scale``), ``concat`` (``concat_weight * sum tanh(scale * (q + k))``)
            or ``additive`` (``sum score_vector * tanh(q + k)``).

    Raises:
        ValueError: the shapes do not hold what the arguments say.
    """
    if len(queries.shape) != 3 or len(keys.shape) != 3 or queries.shape[0] != keys.shape[0]:
        raise ValueError(
            f"{what}: attention takes queries and keys of shape (batch, sequence, features), got "
            f"{format_shape(queries.shape)} and {format_shape(keys.shape)}"
        )
    tq, tv = queries.shape[1], keys.shape[1]
    a_rows = heads * key_dim + (tv if attention_mask else 0) + int(bool(query_mask))
    b_rows = max(heads * key_dim, value_row + heads * value_dim) + int(value_mask)
    if queries.rows != a_rows or keys.rows != b_rows:
        raise ValueError(
            f"{what}: attention expects {a_rows} query rows and {b_rows} key rows, got "
            f"{format_shape(queries.shape)} and {format_shape(keys.shape)}"
        )
    defines = {
        "NH": heads,
        "KD": key_dim,
        "VD": value_dim,
        "TQ": tq,
        "TS": tv,
        "VROW": value_row,
        "AMASK": int(attention_mask),
        "QMASK": 2 if query_mask == "keys" else int(bool(query_mask)),
        "QMROW": a_rows - 1,
        "VMASK": int(value_mask),
        "VMROW": b_rows - 1,
        "CAUSAL": int(causal),
        "MODE": MASK_MODES[mode],
        "SCORE": SCORES[score],
        "USE_VECTOR": int(score_vector is not None),
        "SCALE": _literal(scale),
        "CW": _literal(concat_weight),
        "LARGE_NEG": _literal(_LOWEST),
    }
    spec = choose("attention", builder.device, defines=defines)  # the first kernel these defines fit
    vectors = {"scale": score_vector} if score_vector is not None else {}
    return builder.record(
        ATTENTION, spec, (builder.batch, tq, heads * value_dim), {"a": queries, "b": keys}, what, vectors=vectors
    )
