"""Attention layers, as Keras's ``MultiHeadAttention``, ``Attention`` and ``AdditiveAttention``.

Each is called on several tensors (``mha(query, value, key=None, attention_mask=None)``,
``Attention()([query, value])``); the call's inputs and options are recorded on the layer
(:attr:`call_inputs`, ``use_causal_mask``), so a Functional model holds one listed call. The
scores, mask, softmax over the keys and the value product run in one fused kernel
(:func:`malinn.plan.kinds.attention`, kernels/attention.cl); MultiHeadAttention's projections are
matmuls around it (the key and value projections one matmul where the key is the value).

What a masked key does follows the Keras that saved the model (``mask_mode``): Keras 3 gives it the
lowest score (a query whose every key is masked averages the values), or, with ``dropout`` set,
-1e9 and a zero weight (such a query's output is the output projection's bias); tf_keras adds
``(1 - mask) * -1e9`` to the score.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..plan import kinds
from ..plan.kinds.attention import MASK_MODES
from ..plan.tensor import format_shape
from ..plan.tensors import Vector, Weight
from .base import Layer, glorot_uniform, numeric_weights, ones, zeros
from .input_layer import KerasTensor, call_layer
from .keras_config import KerasContext, NotConvertible
from .masking import binary_mask, mask_of, with_mask

if TYPE_CHECKING:
    from ..plan.builder import PlanBuilder
    from ..plan.tensors import Value

__all__ = ["MultiHeadAttention", "Attention", "AdditiveAttention"]

_MHA_ROLES = ("query", "value", "key", "attention_mask")
_ATTENTION_ROLES = ("query", "value", "key", "query_mask", "value_mask")


def _positive(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def _roles(given: Iterable[str], allowed: tuple[str, ...], who: str) -> tuple[str, ...]:
    roles = tuple(given)
    if roles[:2] != ("query", "value") or len(set(roles)) != len(roles) or not set(roles) <= set(allowed):
        raise ValueError(
            f"{who}: call_inputs must begin with 'query', 'value' and name each of {allowed} at most "
            f"once, got {list(roles)!r}"
        )
    return roles


class _AttentionBase(Layer):
    """What the attention layers share: the call's inputs by role and the causal option."""

    allowed_roles: tuple[str, ...] = ()

    def __init__(self, name: str | None, call_inputs: Iterable[str], use_causal_mask: bool):
        super().__init__(name)
        self.call_inputs = _roles(call_inputs, self.allowed_roles, f"{type(self).__name__} {self.name!r}")
        self.use_causal_mask = bool(use_causal_mask)

    def _shapes(self, input_shape: Any) -> dict[str, tuple]:
        """``{role: shape}`` of a list of shapes in :attr:`call_inputs`'s order."""
        who = f"{type(self).__name__} {self.name!r}"
        if (
            not isinstance(input_shape, (list, tuple))
            or len(input_shape) != len(self.call_inputs)
            or not all(isinstance(s, (list, tuple)) for s in input_shape)
        ):
            raise ValueError(
                f"{who} takes {len(self.call_inputs)} inputs ({', '.join(self.call_inputs)}), got {input_shape!r}"
            )
        shapes = {role: tuple(s) for role, s in zip(self.call_inputs, input_shape)}
        for role in ("query", "value", "key"):
            if role in shapes and len(shapes[role]) != 3:
                raise ValueError(
                    f"{who}: malinn attends over the sequence axis of (batch, sequence, features) "
                    f"inputs; its {role} has shape {format_shape(shapes[role])}"
                )
        key = shapes.get("key", shapes["value"])
        if key[1] != shapes["value"][1]:
            raise ValueError(
                f"{who}: key {format_shape(key)} and value {format_shape(shapes['value'])} differ in sequence length"
            )
        return shapes

    def _record_call(self, tensors: dict[str, Any], use_causal_mask: bool | None) -> KerasTensor:
        roles = tuple(role for role in self.allowed_roles if tensors.get(role) is not None)
        if self.built and roles != self.call_inputs:
            raise ValueError(
                f"{type(self).__name__} {self.name!r} was called with {', '.join(self.call_inputs)}; "
                f"a later call must give the same inputs, not {', '.join(roles)}"
            )
        if use_causal_mask is not None:
            if self.built and bool(use_causal_mask) != self.use_causal_mask:
                raise ValueError(f"{type(self).__name__} {self.name!r}: every call must take the same use_causal_mask")
            self.use_causal_mask = bool(use_causal_mask)
        self.call_inputs = roles
        if self.built:
            self.compute_output_shape([tensors[r].shape for r in roles])  # checks the shapes
            if [tensors[r].shape[1:] for r in roles] != [tuple(s) for s in self.input_shapes]:
                raise ValueError(
                    f"{type(self).__name__} {self.name!r} was built for inputs of shapes "
                    f"{self.input_shapes}, not {[tensors[r].shape[1:] for r in roles]}"
                )
        output = call_layer(self, [tensors[r] for r in roles])
        assert isinstance(output, KerasTensor), f"{self._what()} has one output"
        return output

    #: a Keras call's argument (its position, ``"0.1"`` the second tensor of a list, or its keyword)
    #: -> the input's role
    keras_arguments: dict = {}

    def keras_call(self, tensors: dict, options: dict) -> KerasTensor:
        """The layer called as a Keras file's node calls it: ``tensors`` by the argument each was
        passed as (``"0"``, ``"key"``, ``"mask.1"``: :attr:`keras_arguments`), ``options`` the call's
        other arguments (``use_causal_mask``).

        Raises:
            ValueError: an argument malinn does not compute (``return_attention_scores``, a mask
                Keras derives from an input's own mask).
        """
        who = f"{type(self).__name__} {self.name!r}"
        if options.get("return_attention_scores"):
            raise ValueError(f"{who}: called with return_attention_scores=True (malinn returns the output alone)")
        unknown = sorted(a for a in tensors if a not in self.keras_arguments)
        if unknown:
            raise ValueError(
                f"{who}: called with tensors as {', '.join(unknown)}; malinn takes "
                f"{', '.join(sorted(set(self.keras_arguments.values())))}"
            )
        return self._record_call(
            {self.keras_arguments[a]: t for a, t in tensors.items()}, options.get("use_causal_mask")
        )

    @staticmethod
    def _keras_mask(builder: PlanBuilder, values: list[Value]) -> Value | None:
        """The Keras mask of ``values`` together (a step kept where each one's mask keeps it: the
        masks of a value and a key), or None where none has one."""
        masks = [m for m in (mask_of(builder, v) for v in values) if m is not None]
        if not masks or all(m is masks[0] for m in masks):
            return masks[0] if masks else None
        return kinds.merge(builder, [binary_mask(builder, m) for m in masks], "multiply", what="attention masks")

    @staticmethod
    def _column(builder: PlanBuilder, x: Value, what: str) -> Value:
        """A ``(batch, T)`` mask as one feature, ``(batch, T, 1)``."""
        return kinds.reshape(builder, x, x.shape[:2] + (1,), what=what) if len(x.shape) == 2 else x

    def build(self, input_shape: Any) -> None:
        shapes = self._shapes(input_shape)
        self.compute_output_shape(input_shape)
        self.input_shapes = [s[1:] for s in (shapes[r] for r in self.call_inputs)]
        self.input_shape = None
        self.built = True
        self._weights_changed()

    def get_config(self) -> dict:
        return {**super().get_config(), "call_inputs": list(self.call_inputs), "use_causal_mask": self.use_causal_mask}


class MultiHeadAttention(_AttentionBase):
    """Keras's multi-head attention over the sequence axis of ``(batch, sequence, features)`` inputs.

    Called as Keras's: ``mha(query, value, key=None, attention_mask=None, use_causal_mask=False)``
    (the key defaults to the value; ``attention_mask`` a ``(batch, Tq, Tv)`` tensor, non-zero where
    query t may attend to key j). Dropout does nothing at inference.

    Args:
        num_heads: the number of heads.
        key_dim: each head's query and key size.
        value_dim: each head's value size (default ``key_dim``).
        dropout: Keras's attention dropout (nothing at inference; with Keras 3 it picks what a fully
            masked query computes: ``mask_mode``).
        use_bias: whether the projections add biases.
        output_shape: the output's last axis (an integer or a 1-tuple; default the query's features).
        attention_axes: None or ``(1,)``: the sequence axis (the only one malinn attends over).
        use_causal_mask: query t attends to keys 0..t only (the call's option, kept by the layer).
        mask_mode: what a masked key's score becomes: ``"lowest"`` (Keras 3), ``"zeroed"`` (Keras 3
            with dropout), ``"added"`` (tf_keras); see the module.
        call_inputs: the roles of the inputs a listed call gives, in order (set by calling it).
        name: the layer's name.

    Raises:
        ValueError: a size that is not a positive integer, attention axes other than the sequence's,
            an unknown ``mask_mode``.
    """

    allowed_roles = _MHA_ROLES
    keras_arguments = {"0": "query", "1": "value", "2": "key", **{role: role for role in _MHA_ROLES}}
    weight_names = (
        "query_kernel",
        "query_bias",
        "key_kernel",
        "key_bias",
        "value_kernel",
        "value_bias",
        "output_kernel",
        "output_bias",
    )

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "MultiHeadAttention":
        if config.get("use_gate"):
            raise NotConvertible("with use_gate=True")
        if config.get("sliding_window") is not None:
            raise NotConvertible(f"with sliding_window={config['sliding_window']}")
        axes = config.get("attention_axes")
        if axes is not None and list(np.atleast_1d(axes)) not in ([1], [-2]):
            raise NotConvertible(f"with attention_axes={axes} (malinn attends over the sequence axis, 1)")
        shape = config.get("output_shape")
        if isinstance(shape, (list, tuple)) and len(shape) != 1:
            raise NotConvertible(f"with output_shape={shape} (malinn takes one output axis)")
        dropout = float(config.get("dropout") or 0.0)
        mode = "added" if keras.keras_major < 3 else ("zeroed" if dropout > 0 else "lowest")
        return cls(
            int(config["num_heads"]),
            int(config["key_dim"]),
            value_dim=config.get("value_dim"),
            dropout=dropout,
            use_bias=bool(config.get("use_bias", True)),
            output_shape=shape,
            mask_mode=mode,
            name=keras.name,
        )

    def __init__(
        self,
        num_heads: int,
        key_dim: int,
        value_dim: int | None = None,
        dropout: float = 0.0,
        use_bias: bool = True,
        output_shape: int | Sequence[int] | None = None,
        attention_axes: int | Sequence[int] | None = None,
        use_causal_mask: bool = False,
        mask_mode: str = "lowest",
        call_inputs: Iterable[str] = ("query", "value"),
        name: str | None = None,
    ):
        super().__init__(name, call_inputs, use_causal_mask)
        who = f"MultiHeadAttention {self.name!r}"
        self.num_heads = _positive(num_heads, f"{who}: num_heads")
        self.key_dim = _positive(key_dim, f"{who}: key_dim")
        self.value_dim = _positive(value_dim if value_dim is not None else key_dim, f"{who}: value_dim")
        if isinstance(output_shape, (list, tuple)):
            if len(output_shape) != 1:
                raise ValueError(f"{who}: output_shape must be an integer or a 1-tuple, got {output_shape!r}")
            output_shape = output_shape[0]
        self.output_size = None if output_shape is None else _positive(output_shape, f"{who}: output_shape")
        if attention_axes is not None and list(np.atleast_1d(attention_axes)) not in ([1], [-2]):
            raise ValueError(
                f"{who}: malinn attends over the sequence axis (attention_axes None or (1,)), not {attention_axes!r}"
            )
        if mask_mode not in MASK_MODES:
            raise ValueError(f"{who}: mask_mode must be one of {sorted(MASK_MODES)}, got {mask_mode!r}")
        self.dropout, self.use_bias, self.mask_mode = float(dropout), bool(use_bias), mask_mode
        for weight in self.weight_names:
            setattr(self, weight, None)

    def __call__(
        self,
        query: KerasTensor,
        value: KerasTensor | None = None,
        key: KerasTensor | None = None,
        attention_mask: KerasTensor | None = None,
        use_causal_mask: bool | None = None,
    ) -> KerasTensor:
        """Calls the layer on symbolic tensors, as Keras's ``mha(query, value, key, attention_mask)``.

        Returns:
            The output :class:`~malinn.layers.input_layer.KerasTensor` ``(None, Tq, output features)``.

        Raises:
            ValueError: a tensor is missing or its shape does not fit.
        """
        if value is None:
            raise ValueError(f"MultiHeadAttention {self.name!r} takes a query and a value")
        return self._record_call(
            {"query": query, "value": value, "key": key, "attention_mask": attention_mask}, use_causal_mask
        )

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shapes = self._shapes(input_shape)
        query, value = shapes["query"], shapes["value"]
        mask = shapes.get("attention_mask")
        if mask is not None and tuple(mask[1:]) != (query[1], value[1]):
            raise ValueError(
                f"MultiHeadAttention {self.name!r}: attention_mask {format_shape(mask)} is not "
                f"{format_shape((None, query[1], value[1]))} (batch, query length, value length)"
            )
        return (None, query[1], self.output_size or query[2])

    def build(self, input_shape: Any) -> None:
        """Creates the projections' kernels in Keras's shapes: ``query_kernel`` (query features, heads,
        key_dim), key and value likewise, ``output_kernel`` (heads, value_dim, output features)."""
        super().build(input_shape)
        shapes = self._shapes(input_shape)
        dq, dv = shapes["query"][2], shapes["value"][2]
        dk = shapes.get("key", shapes["value"])[2]
        heads, kd, vd = self.num_heads, self.key_dim, self.value_dim
        out = self.output_size or dq
        self.query_kernel = glorot_uniform((dq, heads, kd), dq, heads * kd)
        self.key_kernel = glorot_uniform((dk, heads, kd), dk, heads * kd)
        self.value_kernel = glorot_uniform((dv, heads, vd), dv, heads * vd)
        self.output_kernel = glorot_uniform((heads, vd, out), heads * vd, out)
        if self.use_bias:
            self.query_bias, self.key_bias = zeros((heads, kd)), zeros((heads, kd))
            self.value_bias, self.output_bias = zeros((heads, vd)), zeros(out)

    def set_weights(self, weights: Any) -> None:
        """Sets the weights in Keras's order: query kernel and bias, key, value, output.

        Raises:
            ValueError: the count or a shape differs from the layer's (built first).
        """
        weights = numeric_weights(weights, f"MultiHeadAttention {self.name!r}")
        names = [n for n in self.weight_names if getattr(self, n) is not None]
        if not self.built or len(weights) != len(names):
            raise ValueError(
                f"MultiHeadAttention {self.name!r} expects {len(names)} weight arrays "
                f"({', '.join(names)}) once built, got {len(weights)}"
            )
        for name, w in zip(names, weights):
            if w.shape != getattr(self, name).shape:
                raise ValueError(
                    f"MultiHeadAttention {self.name!r}: {name} has shape {getattr(self, name).shape}, got {w.shape}"
                )
        for name, w in zip(names, weights):
            setattr(self, name, w)
        self._weights_changed()

    def _projection(self, prefix: str) -> tuple:
        kernel = getattr(self, f"{prefix}_kernel")
        bias = getattr(self, f"{prefix}_bias")
        matrix = kernel.reshape(kernel.shape[0], -1).T if prefix != "output" else kernel.reshape(-1, kernel.shape[-1]).T
        return matrix, (bias.reshape(-1) if bias is not None else None)

    def _matmul(self, builder: PlanBuilder, x: Value, parts: list[str], label: str) -> Value:
        """One matmul of ``x`` by the projections ``parts`` stacked (their outputs side by side)."""
        matrices = [self._projection(p) for p in parts]
        host = (lambda: matrices[0][0]) if len(parts) == 1 else (lambda: np.concatenate([m for m, _ in matrices]))
        rows = sum(m.shape[0] for m, _ in matrices)
        # each weight its own dict of device copies (a copy is found by device, layout and padding alone)
        copies = self.device_copies.setdefault(label, {})
        weight = Weight(f"layer {self.name!r} {label} kernel", (rows, matrices[0][0].shape[1]), host, copies)
        bias = None
        if self.use_bias:
            bias = Vector(
                f"layer {self.name!r} {label} bias", np.concatenate([b for _, b in matrices]), self.device_copies
            )
        return kinds.matmul(builder, x, weight, bias, what=f"{self._what()} {label}")

    def lower(self, builder: PlanBuilder, xs: list[Value]) -> Value:
        given = dict(zip(self.call_inputs, xs))
        query, value = given["query"], given["value"]
        key = given.get("key", value)
        what = self._what()
        heads, kd, vd = self.num_heads, self.key_dim, self.value_dim
        # Keras's masks of the inputs join the attention mask: a masked query attends to no key
        query_mask = self._keras_mask(builder, [query])
        value_mask = self._keras_mask(builder, [value] if key is value else [value, key])
        queries = self._matmul(builder, query, ["query"], "query")
        if key is value:
            keys, value_row = self._matmul(builder, value, ["key", "value"], "key and value"), heads * kd
        else:
            keys = kinds.concat(
                builder,
                [self._matmul(builder, key, ["key"], "key"), self._matmul(builder, value, ["value"], "value")],
                -1,
                what=what,
            )
            value_row = heads * kd
        mask = given.get("attention_mask")
        extra = ([mask] if mask is not None else []) + (
            [self._column(builder, query_mask, what)] if query_mask is not None else []
        )
        if extra:
            queries = kinds.concat(builder, [queries] + extra, -1, what=what)
        if value_mask is not None:
            keys = kinds.concat(builder, [keys, self._column(builder, value_mask, what)], -1, what=what)
        out = kinds.attention(
            builder,
            queries,
            keys,
            heads=heads,
            key_dim=kd,
            value_dim=vd,
            value_row=value_row,
            attention_mask=mask is not None,
            query_mask="keys" if query_mask is not None else False,
            value_mask=value_mask is not None,
            causal=self.use_causal_mask,
            mode=self.mask_mode,
            score="dot",
            scale=1.0 / np.sqrt(float(kd)),
            what=what,
        )
        return with_mask(builder, self._matmul(builder, out, ["output"], "output"), query_mask)

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "key_dim": self.key_dim,
            "value_dim": self.value_dim,
            "dropout": self.dropout,
            "use_bias": self.use_bias,
            "output_shape": self.output_size,
            "mask_mode": self.mask_mode,
        }


class _DenseAttention(_AttentionBase):
    """Keras's single-head attention layers: called on ``[query, value]`` or ``[query, value,
    key]`` (the key defaults to the value), with ``mask=[query_mask, value_mask]`` optional."""

    allowed_roles = _ATTENTION_ROLES
    keras_arguments = {
        f"{prefix}.{i}": role for prefix in ("0", "inputs") for i, role in enumerate(("query", "value", "key"))
    }
    keras_arguments.update(
        {f"{prefix}.{i}": role for prefix in ("1", "mask") for i, role in enumerate(_ATTENTION_ROLES[3:])}
    )
    score = "dot"

    def __call__(
        self,
        inputs: Sequence[KerasTensor],
        mask: Sequence[KerasTensor | None] | None = None,
        use_causal_mask: bool | None = None,
    ) -> KerasTensor:
        """Calls the layer on ``[query, value]`` or ``[query, value, key]`` symbolic tensors, with
        ``mask=[query_mask, value_mask]`` ((batch, T) tensors, non-zero where a step counts; either None).

        Raises:
            ValueError: not two or three tensors, or shapes that do not fit.
        """
        if not isinstance(inputs, (list, tuple)) or len(inputs) not in (2, 3):
            raise ValueError(f"{type(self).__name__} {self.name!r} takes [query, value] or [query, value, key]")
        masks = list(mask) if isinstance(mask, (list, tuple)) else [None, None]
        tensors = {
            "query": inputs[0],
            "value": inputs[1],
            "key": inputs[2] if len(inputs) > 2 else None,
            "query_mask": masks[0],
            "value_mask": masks[1] if len(masks) > 1 else None,
        }
        return self._record_call(tensors, use_causal_mask)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shapes = self._shapes(input_shape)
        query, value = shapes["query"], shapes["value"]
        key = shapes.get("key", value)
        if query[2] != key[2]:
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: query {format_shape(query)} and key "
                f"{format_shape(key)} differ in features"
            )
        for role, length in (("query_mask", query[1]), ("value_mask", value[1])):
            if role in shapes and tuple(shapes[role][1:]) not in ((length,), (length, 1)):
                raise ValueError(
                    f"{type(self).__name__} {self.name!r}: {role} {format_shape(shapes[role])} is not "
                    f"{format_shape((None, length))}"
                )
        return (None, query[1], value[2])

    def _scores(self) -> dict:
        return {}

    def lower(self, builder: PlanBuilder, xs: list[Value]) -> Value:
        given = dict(zip(self.call_inputs, xs))
        query, value = given["query"], given["value"]
        key = given.get("key", value)
        what = self._what()
        features = query.shape[2]
        # masks given to the call, else Keras's masks of the query and the value (an Embedding's)
        query_mask = given.get("query_mask", self._keras_mask(builder, [query]))
        value_mask = given.get("value_mask", self._keras_mask(builder, [value]))
        queries = query
        if query_mask is not None:
            queries = kinds.concat(builder, [query, self._column(builder, query_mask, what)], -1, what=what)
        parts, value_row = ([key], 0) if key is value else ([key, value], features)
        if value_mask is not None:
            parts.append(self._column(builder, value_mask, what))
        keys = parts[0] if len(parts) == 1 else kinds.concat(builder, parts, -1, what=what)
        out = kinds.attention(
            builder,
            queries,
            keys,
            heads=1,
            key_dim=features,
            value_dim=value.shape[2],
            value_row=value_row,
            query_mask=query_mask is not None,
            value_mask=value_mask is not None,
            causal=self.use_causal_mask,
            mode="added",
            score=self.score,
            what=what,
            **self._scores(),
        )
        return (
            with_mask(builder, out, query_mask if len(query_mask.shape) == 2 else None)
            if query_mask is not None
            else out
        )


class Attention(_DenseAttention):
    """Keras's dot-product (Luong) attention: ``softmax(scale * query . key) @ value``, or with
    ``score_mode="concat"`` scores ``concat_score_weight * sum tanh(scale * (query + key))``.

    Args:
        use_scale: whether a learned scalar ``scale`` multiplies the scores.
        score_mode: ``"dot"`` or ``"concat"``.
        dropout: nothing at inference.
        use_causal_mask: query t attends to keys 0..t only (tf_keras's ``causal``).
        call_inputs: the roles of the inputs a listed call gives, in order (set by calling it).
        name: the layer's name.

    Raises:
        ValueError: an unknown ``score_mode``.
    """

    weight_names = ("scale", "concat_score_weight")

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "Attention":
        return cls(
            use_scale=bool(config.get("use_scale", False)),
            score_mode=config.get("score_mode", "dot"),
            dropout=float(config.get("dropout") or 0.0),
            use_causal_mask=bool(config.get("causal", False)),
            name=keras.name,
        )

    def __init__(
        self,
        use_scale: bool = False,
        score_mode: str = "dot",
        dropout: float = 0.0,
        use_causal_mask: bool = False,
        call_inputs: Iterable[str] = ("query", "value"),
        name: str | None = None,
    ):
        super().__init__(name, call_inputs, use_causal_mask)
        if score_mode not in ("dot", "concat"):
            raise ValueError(f"Attention {self.name!r}: score_mode must be 'dot' or 'concat', got {score_mode!r}")
        self.use_scale, self.score_mode, self.dropout = bool(use_scale), score_mode, float(dropout)
        self.score = score_mode
        self.scale: np.ndarray | None = None
        self.concat_score_weight: np.ndarray | None = None

    def build(self, input_shape: Any) -> None:
        super().build(input_shape)
        self.scale = ones(()) if self.use_scale else None
        self.concat_score_weight = ones(()) if self.score_mode == "concat" else None

    def set_weights(self, weights: Any) -> None:
        """Sets ``[scale]`` (with ``use_scale``) then ``[concat_score_weight]`` (``concat``), scalars.

        Raises:
            ValueError: the count or a shape differs.
        """
        weights = numeric_weights(weights, f"Attention {self.name!r}")
        names = [n for n, on in (("scale", self.use_scale), ("concat_score_weight", self.score_mode == "concat")) if on]
        if len(weights) != len(names) or any(w.size != 1 for w in weights):
            raise ValueError(
                f"Attention {self.name!r} expects {len(names)} scalar weights ({', '.join(names)}), "
                f"got {[w.shape for w in weights]}"
            )
        for name, w in zip(names, weights):
            setattr(self, name, w.reshape(()))
        self._weights_changed()

    def _scores(self) -> dict:
        scale = float(self.scale) if self.scale is not None else 1.0
        weight = float(self.concat_score_weight) if self.concat_score_weight is not None else 1.0
        return {"scale": scale, "concat_weight": weight}

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "use_scale": self.use_scale,
            "score_mode": self.score_mode,
            "dropout": self.dropout,
        }


class AdditiveAttention(_DenseAttention):
    """Keras's additive (Bahdanau) attention: scores ``sum scale * tanh(query + key)`` over the
    features (``scale`` a learned vector with ``use_scale``, else 1), softmax, times the value.

    Args:
        use_scale: whether a learned per-feature ``scale`` multiplies the tanh terms.
        dropout: nothing at inference.
        use_causal_mask: query t attends to keys 0..t only (tf_keras's ``causal``).
        call_inputs: the roles of the inputs a listed call gives, in order (set by calling it).
        name: the layer's name.
    """

    weight_names = ("scale",)
    score = "additive"

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "AdditiveAttention":
        return cls(
            use_scale=bool(config.get("use_scale", True)),
            dropout=float(config.get("dropout") or 0.0),
            use_causal_mask=bool(config.get("causal", False)),
            name=keras.name,
        )

    def __init__(
        self,
        use_scale: bool = True,
        dropout: float = 0.0,
        use_causal_mask: bool = False,
        call_inputs: Iterable[str] = ("query", "value"),
        name: str | None = None,
    ):
        super().__init__(name, call_inputs, use_causal_mask)
        self.use_scale, self.dropout = bool(use_scale), float(dropout)
        self.scale: np.ndarray | None = None

    def build(self, input_shape: Any) -> None:
        super().build(input_shape)
        self.scale = glorot_uniform((self._shapes(input_shape)["query"][2],), 1, 1) if self.use_scale else None

    def set_weights(self, weights: Any) -> None:
        """Sets ``[scale]`` (features,) with ``use_scale``, else nothing.

        Raises:
            ValueError: the count or the shape differs.
        """
        weights = numeric_weights(weights, f"AdditiveAttention {self.name!r}")
        want: list[tuple] = [self.scale.shape] if self.use_scale and self.scale is not None else []
        if [w.shape for w in weights] != want:
            raise ValueError(
                f"AdditiveAttention {self.name!r} expects weights of shapes {want}, got {[w.shape for w in weights]}"
            )
        if want:
            self.scale = weights[0]
        self._weights_changed()

    def _scores(self) -> dict:
        if self.scale is None:
            return {}
        return {"score_vector": Vector(f"layer {self.name!r} scale", self.scale, self.device_copies)}

    def get_config(self) -> dict:
        return {**super().get_config(), "use_scale": self.use_scale, "dropout": self.dropout}
