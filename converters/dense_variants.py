"""Keras 3's variants of Dense in a file: LoRA merged into the kernel, int8 kernels read, other
quantized kernels refused.

LoRA (``layer.enable_lora(rank, lora_alpha)``; config ``lora_rank``, ``lora_alpha``, which
defaults to the rank): Keras computes with the kernel
``kernel + (lora_alpha / lora_rank) * lora_kernel_a @ lora_kernel_b`` (``Dense.kernel`` in
keras/src/layers/core/dense.py), ``lora_kernel_a`` of shape (in, rank), ``lora_kernel_b`` of shape
(rank, units). A ``.keras`` archive holds that merged kernel already (``Dense.save_own_variables``):
it reads as a plain Dense. A legacy ``.h5`` holds the four variables in the order of
``layer.weights`` (``bias, lora_kernel_a, lora_kernel_b, kernel``): they are told apart by name
and merged here, in float64, into ``[kernel, bias]``.

An int8-quantized Dense (``model.quantize("int8")``) holds ``kernel`` (int8, (in, units)),
``kernel_scale`` (float32, (units,)) and ``bias``; Keras's weights are ``kernel / kernel_scale``
(per output channel, symmetric). It reads as a Dense with those float weights and keeps the int8
form, ``quantized = (kernel^T, 1 / kernel_scale)``, which malinn's ``int8-weights`` precision
uploads as it is (``malinn.library.precision``). Keras computes such a layer with its inputs quantized to
int8 as well; malinn keeps them float (it is the more exact of the two: ``malinn verify`` shows
the difference). An int8 Dense with LoRA (a QLoRA fine-tune) reads the same where the file holds
its factors merged into the int8 kernel and its scale, as a ``.keras`` archive does
(``Dense.save_own_variables``). Other modes (int4, float8, GPTQ) are refused by name.
"""

from __future__ import annotations

import numpy as np

from malinn.errors import ConversionError

from .dtypes import quantization_mode
from .model_spec import KerasLayer, KerasModel

_LORA_ROLES = ("kernel", "bias", "lora_kernel_a", "lora_kernel_b")
_INT8_ROLES = ("kernel", "bias", "kernel_scale")


def resolve_dense_variants(model: KerasModel) -> None:
    """Merge LoRA into each LoRA Dense's kernel and read int8 Dense layers, in place; refuse
    other quantized Dense layers.

    Raises:
        ConversionError: a Dense quantized in another mode than int8; a LoRA or int8 Dense whose
            variables cannot be told apart or whose shapes do not fit (an int8 Dense with LoRA
            reads where the file holds the factors merged, as a ``.keras`` archive does).
    """
    for layer in model.layers:
        if layer.class_name != "Dense":
            continue
        mode = quantization_mode(layer.config)
        if mode == "int8":  # with LoRA too, where the file holds the factors merged (a .keras archive)
            _read_int8(model.source, layer)
            continue
        if mode is not None:
            raise ConversionError(
                f"{model.source}: layer {layer.name!r}: {mode}-quantized Dense (Keras 3 quantize) "
                "is not supported (malinn reads int8-quantized Dense layers); save the float model"
            )
        if layer.config.get("lora_rank"):
            _merge_lora(model.source, layer)


def _role(weight_name: str) -> str:
    """``"lora/d/lora_kernel_a"`` or ``"d/lora_kernel_a:0"`` -> ``"lora_kernel_a"``."""
    return weight_name.rsplit("/", 1)[-1].split(":", 1)[0]


def _merge_lora(source: str, layer: KerasLayer) -> None:
    cfg = layer.config
    rank, alpha = cfg.get("lora_rank"), cfg.get("lora_alpha")
    alpha = rank if alpha is None else alpha
    where = f"{source}: layer {layer.name!r}: LoRA Dense (lora_rank={rank!r}, lora_alpha={alpha!r})"
    if (
        not isinstance(rank, int)
        or isinstance(rank, bool)
        or rank < 1
        or isinstance(alpha, bool)
        or not isinstance(alpha, (int, float))
        or not np.isfinite(alpha)
    ):
        raise ConversionError(f"{where}: lora_rank must be a positive integer and lora_alpha a number")
    use_bias = cfg.get("use_bias", True) is not False
    if len(layer.weights) == (2 if use_bias else 1):
        return  # a .keras archive: Keras saved the merged kernel
    roles = {_role(name): i for i, name in enumerate(layer.weight_names)}
    wanted = [r for r in _LORA_ROLES if use_bias or r != "bias"]
    if sorted(roles) != sorted(wanted) or len(roles) != len(layer.weights):
        raise ConversionError(
            f"{where}: the file has {len(layer.weights)} weight arrays named "
            f"{', '.join(layer.weight_names) or 'nothing'}; expected {', '.join(wanted)}"
        )
    kernel, a, b = (layer.weights[roles[r]] for r in ("kernel", "lora_kernel_a", "lora_kernel_b"))
    if kernel.ndim != 2 or a.shape != (kernel.shape[0], rank) or b.shape != (rank, kernel.shape[1]):
        raise ConversionError(
            f"{where}: kernel {kernel.shape}, lora_kernel_a {a.shape} and lora_kernel_b {b.shape} "
            f"do not fit: expected (in, units), (in, {rank}) and ({rank}, units)"
        )
    merged = kernel.astype(np.float64) + (alpha / rank) * (a.astype(np.float64) @ b.astype(np.float64))
    weights = [merged.astype(np.float32)]
    names = [f"{layer.weight_names[roles['kernel']]} + LoRA"]
    if use_bias:
        weights.append(layer.weights[roles["bias"]])
        names.append(layer.weight_names[roles["bias"]])
    layer.weights, layer.weight_names = weights, names


def _read_int8(source: str, layer: KerasLayer) -> None:
    """``kernel``, ``kernel_scale``, ``bias`` -> float ``[kernel / kernel_scale, bias]`` and the int8
    form in ``layer.quantized``."""
    use_bias = layer.config.get("use_bias", True) is not False
    where = f"{source}: layer {layer.name!r}: int8-quantized Dense"
    roles = {_role(name): i for i, name in enumerate(layer.weight_names)}
    wanted = [r for r in _INT8_ROLES if use_bias or r != "bias"]
    if len(layer.weights) == len(wanted) and all(_role(n).isdigit() for n in layer.weight_names):
        roles = {r: i for i, r in enumerate(wanted)}  # a .keras archive: vars/0.. as Dense.save_own_variables
    if sorted(roles) != sorted(wanted) or len(roles) != len(layer.weights):
        lora = (
            " (with LoRA, malinn reads the factors merged into the kernel, as a .keras archive holds them: "
            "save the model as .keras)"
            if layer.config.get("lora_rank")
            else ""
        )
        raise ConversionError(
            f"{where}: the file has {len(layer.weights)} weight arrays named "
            f"{', '.join(layer.weight_names) or 'nothing'}; expected {', '.join(wanted)}{lora}"
        )
    q, scale = layer.weights[roles["kernel"]], layer.weights[roles["kernel_scale"]]
    if q.ndim != 2 or scale.shape != (q.shape[1],):
        raise ConversionError(
            f"{where}: kernel {q.shape} and kernel_scale {scale.shape} do not fit: expected (in, units) and (units,)"
        )
    if not (
        np.all(np.isfinite(scale)) and np.all(scale != 0) and np.all(np.abs(q) <= 127) and np.array_equal(q, np.rint(q))
    ):
        raise ConversionError(f"{where}: the kernel is not int8 values with finite non-zero scales")
    weights = [(q.astype(np.float64) / scale.astype(np.float64)).astype(np.float32)]
    names = [f"{layer.weight_names[roles['kernel']]} / kernel_scale"]
    if use_bias:
        weights.append(layer.weights[roles["bias"]])
        names.append(layer.weight_names[roles["bias"]])
    layer.weights, layer.weight_names = weights, names
    layer.quantized = (np.ascontiguousarray(q.T).astype(np.int8), (1.0 / scale.astype(np.float64)).astype(np.float32))
