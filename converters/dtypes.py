"""The dtypes a layer's config gives its variables, and bfloat16 weights widened to float32.

A layer's ``dtype`` in a config is a policy name (``"float32"``, ``"bfloat16"``,
``"mixed_bfloat16"``) or, in Keras 3, a serialized policy: ``DTypePolicy`` /
``FloatDTypePolicy`` ``{"name": ...}``, or a quantized one (``QuantizedDTypePolicy``,
``QuantizedFloat8DTypePolicy``, ``GPTQDTypePolicy``...) ``{"mode": "int8", "source_name":
"float32"}`` (older Keras 3: ``{"name": "int8_from_float32"}``). tf_keras writes ``{"class_name":
"Policy", "config": {"name": "mixed_float16"}}``. A ``mixed_*`` policy keeps its variables in
float32.

A model's InputLayer has a ``dtype`` too (``"float32"``, ``"int32"``, ``"uint8"``, ``"bool"``...):
Keras casts what predict is given to it at the model's entry (:mod:`malinn.layers.dtypes`), and
:func:`input_dtypes` reads it. A layer's policy must be one malinn computes (in float32): a float
one, or a quantized one that ``dense_variants.py`` reads or refuses (:func:`policy_problem`).

h5py has no bfloat16: Keras 3 and tf_keras write bfloat16 variables as a 2-byte HDF5 opaque type
without a tag (numpy sees ``|V2``), so such a dataset is read as bfloat16 when its layer's variables
are bfloat16 by the config, and refused otherwise. bfloat16 is the upper half of a float32's bits:
widening shifts the 16 bits up, exactly (little-endian bytes, as every writer of these files
stores them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from malinn.errors import ConversionError
from malinn.layers.dtypes import input_dtype

from .chain import INPUT_LAYER, SEQUENTIAL, LayerEntry, ModelNode

_FLOAT_POLICIES = frozenset({"DTypePolicy", "FloatDTypePolicy", "Policy"})
#: the dtype policies of a layer that malinn computes, in float32 (Keras's float ones)
FLOAT_POLICIES = ("float32", "float64", "float16", "bfloat16", "mixed_float16", "mixed_bfloat16")


def policy_name(dtype: Any) -> str | None:
    """The policy name of a config's ``dtype`` value (``"int8_from_float32"`` for quantized ones)."""
    if isinstance(dtype, str):
        return dtype
    if isinstance(dtype, dict):
        config = dtype.get("config")
        if isinstance(config, dict):
            if isinstance(config.get("name"), str):
                return config["name"]
            if isinstance(config.get("mode"), str):
                source = config.get("source_name")
                return f"{config['mode']}_from_{source if isinstance(source, str) else 'float32'}"
    return None


def variable_dtype(config: dict) -> str | None:
    """The dtype of a layer's (float) variables by its config, or None when it does not say."""
    name = policy_name(config.get("dtype"))
    if name is None:
        return None
    if name.startswith("mixed_"):
        return "float32"
    return name.split("_from_", 1)[1] if "_from_" in name else name


def quantization_mode(config: dict) -> str | None:
    """``"int8"``, ``"int4"``, ``"float8"``, ``"gptq"``... for a layer Keras 3 quantized, else None."""
    dtype = config.get("dtype")
    name = policy_name(dtype)
    if name is not None and "_from_" in name:
        return name.split("_from_", 1)[0]
    class_name = dtype.get("class_name") if isinstance(dtype, dict) else None
    if isinstance(class_name, str) and class_name.endswith("DTypePolicy") and class_name not in _FLOAT_POLICIES:
        return class_name[: -len("DTypePolicy")].lower() or "quantized"
    quantization = config.get("quantization_config")
    if quantization is not None:
        kind = quantization.get("class_name") if isinstance(quantization, dict) else None
        if isinstance(kind, str) and kind.endswith("QuantizationConfig"):
            return kind[: -len("QuantizationConfig")].lower() or "quantized"
        return "quantized"
    return None


def is_bfloat16_storage(dtype: np.dtype) -> bool:
    """A 2-byte opaque HDF5 type: how Keras stores bfloat16."""
    return dtype.kind == "V" and dtype.itemsize == 2 and dtype.fields is None


def widen_bfloat16(raw: np.ndarray) -> np.ndarray:
    """bfloat16 values (2-byte items) as float32, exactly."""
    bits = np.ascontiguousarray(raw).view("<u2").astype(np.uint32) << 16
    return bits.view(np.float32)


def policy_problem(config: dict) -> str | None:
    """What is wrong with a layer's dtype policy for malinn (``"dtype policy 'int8'"``), or None
    for none, a float one (:data:`FLOAT_POLICIES`) or a quantized one (``int8_from_float32``, which
    ``dense_variants.py`` reads or refuses by its mode)."""
    dtype = config.get("dtype")
    if dtype is None:
        return None
    name = policy_name(dtype)
    if name in FLOAT_POLICIES or (name is not None and "_from_" in name):
        return None
    if name in ("int32", "int64") and config.get("output_mode") == "int" and "vocabulary" in config:
        return None  # tf_keras's lookup layers take their indices' dtype as their own: malinn's are whole floats
    return f"dtype policy {name!r}" if name is not None else f"dtype {dtype!r}, which names no policy"


def input_dtypes(root: ModelNode, source: str) -> tuple[str, ...]:
    """The dtype of each input of the top model (its InputLayer's, ``"float32"`` where the config
    gives none), in the order of its inputs (a Functional's ``inputs``; a Sequential's one).

    Raises:
        ConversionError: an input's dtype is not one malinn casts to (naming the input, the dtype
            and those it supports); a nested model's input has a dtype other than float32 or
            float64 (Keras casts there too, in the middle of the graph: malinn casts the model's
            own inputs only).
    """

    def dtype_of(name: str, config: dict, model: ModelNode) -> str:
        raw = config.get("dtype")
        try:  # a value that names no dtype (a number, a policy without a name) is refused as it is
            return input_dtype(
                raw if raw is None or policy_name(raw) is None else policy_name(raw),
                f"input {name!r} of model {model.name!r}",
            )
        except ValueError as exc:
            raise ConversionError(f"{source}: {exc}") from None

    def nested(model: ModelNode) -> None:
        for member in model.members:
            if isinstance(member, ModelNode):
                for name, config in _input_layers(member):
                    dtype = dtype_of(name, config, member)
                    if dtype not in ("float32", "float64"):
                        raise ConversionError(
                            f"{source}: input {name!r} of the nested model {member.name!r} has dtype {dtype!r}, "
                            "which Keras casts to inside the model; malinn casts the model's own inputs only: give "
                            "the outer model's Input that dtype, or the nested one float32"
                        )
                nested(member)

    nested(root)
    found = _input_layers(root)
    if root.kind == SEQUENTIAL:
        return (dtype_of(*found[0], root),) if found else ("float32",)
    by_name = dict(found)
    return tuple(dtype_of(name, by_name.get(name, {}), root) for name in root.inputs)


def _input_layers(model: ModelNode) -> list[tuple[str, dict]]:
    """``[(name, config), ...]`` of a model's own InputLayers: a Functional's members; a
    Sequential's (which leaves them out of its members) from its config's layers, the first one."""
    if model.kind != SEQUENTIAL:
        return [(m.name, m.config) for m in model.members if isinstance(m, LayerEntry) and m.class_name == INPUT_LAYER]
    for entry in model.config.get("layers") or []:
        if isinstance(entry, dict) and entry.get("class_name") == INPUT_LAYER:
            given = entry.get("config")
            config = given if isinstance(given, dict) else {}
            named = config.get("name")
            name = named if isinstance(named, str) else str(entry.get("name", "input"))
            return [(name, config)]
    return []
