"""The dtypes a layer's config gives its variables, and bfloat16 weights widened to float32.

A layer's ``dtype`` in a config is a policy name (``"float32"``, ``"bfloat16"``,
``"mixed_bfloat16"``) or, in Keras 3, a serialized policy: ``DTypePolicy`` /
``FloatDTypePolicy`` ``{"name": ...}``, or a quantized one (``QuantizedDTypePolicy``,
``QuantizedFloat8DTypePolicy``, ``GPTQDTypePolicy``...) ``{"mode": "int8", "source_name":
"float32"}`` (older Keras 3: ``{"name": "int8_from_float32"}``). tf_keras writes ``{"class_name":
"Policy", "config": {"name": "mixed_float16"}}``. A ``mixed_*`` policy keeps its variables in
float32.

h5py has no bfloat16: Keras 3 and tf_keras write bfloat16 variables as a 2-byte HDF5 opaque type
without a tag (numpy sees ``|V2``), so such a dataset is read as bfloat16 when its layer's variables
are bfloat16 by the config, and refused otherwise. bfloat16 is the upper half of a float32's bits:
widening shifts the 16 bits up, exactly (little-endian bytes, as every writer of these files
stores them).
"""

from __future__ import annotations

import numpy as np

_FLOAT_POLICIES = frozenset({"DTypePolicy", "FloatDTypePolicy", "Policy"})


def policy_name(dtype) -> str | None:
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
