"""Heads: a small Dense layer after a matmul computed in that matmul's kernel (one launch fewer at
small batches; the first layer's result never exists in memory)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import LibraryError
from ...library.kernel_library import KernelSpec, load_library
from ...ops import elementwise_kernel
from ..kinds.matmul import MATMUL
from ..tensors import Head, Step, Value

if TYPE_CHECKING:
    from ...backends.base import Device
    from ..recorder import Recorder

__all__ = ["fuse_heads"]


def fuse_heads(builder: Recorder, outputs: list[Value]) -> None:
    """Where the library names a ``matmul_head`` kernel for the device (one whose source also runs
    the first matmul's kernel, in the same configuration), the first matmul's result is read by
    the head alone and is no output, the head fits the kernel (its units, the batch, its
    activation: softmax or one without parameters), and neither kernel was chosen with ``use``,
    the head is computed in the first matmul's kernel."""
    device = builder.device
    heads = load_library().default_specs("matmul_head", device.kind, device.backend)
    if not heads:
        return
    removed = set()
    for head in builder.steps:
        x = head.inputs.get("b")
        first = x.producer if x is not None else None
        if (
            x is None
            or head.kind is not MATMUL
            or first is None
            or first.kind is not MATMUL
            or id(first) in removed
            or head.explicit
            or first.explicit
            or first.head is not None
            or x in outputs
            or len(x.consumers) != 1
            or first.affine is not None
            or head.affine is not None
            or x.storage.view is not None
            or first.spec.precision != head.spec.precision
        ):
            continue
        spec = _head_kernel(heads, first, head, device)
        if spec is None:
            continue
        assert head.weight is not None, "a matmul step without a weight"
        first.spec, first.head = spec, Head(head.weight, head.bias, head.activation)
        first.layers += [layer for layer in head.layers if layer not in first.layers]
        first.what = f"{first.what} and {head.what}"
        first.out = head.out
        head.out.producer = first
        x.consumers.remove(head)
        removed.add(id(head))
    builder.steps = [step for step in builder.steps if id(step) not in removed]


def _head_kernel(heads: list[KernelSpec], first: Step, head: Step, device: Device) -> KernelSpec | None:
    """The first of ``heads`` that runs ``first``'s kernel in its configuration with ``head``
    computed in it, configured for the head, or ``None``."""
    assert first.weight is not None and head.weight is not None, "a matmul step without a weight"
    library = load_library()
    units = head.weight.shape[0]
    m, k = first.weight.shape
    activation = head.activation or "linear"
    if activation not in ("linear", "softmax") and (
        elementwise_kernel(activation) is None or library.activation_spec(activation).params
    ):
        return None
    for spec in heads:
        if (
            spec.source_path != first.spec.source_path
            or spec.function != first.spec.function
            or first.spec.precision not in spec.precisions
            or any(spec.matrices[x].layout != first.spec.matrices[x].layout for x in "ab")
            or spec.matrices["r"].layout != head.spec.matrices["r"].layout
        ):
            continue
        config = {k: v for k, v in first.spec.config.items() if k in spec.config and not k.startswith("HEAD")}
        config.update(
            HEAD_UNITS=units,
            HEAD_BIAS=int(head.bias is not None),
            HEAD_SOFTMAX=int(activation == "softmax"),
            HEAD_ACTIVATION="act_linear" if activation == "softmax" else f"act_{activation}",
        )
        try:
            configured = spec.configure(config)
        except LibraryError:
            continue  # more units than the kernel takes
        if configured.accepts(m, k, first.inputs["b"].cols, device=device) and configured.fits(device):
            return configured.in_precision(first.spec.precision)
    return None
