"""Eager ops (Rovder 5.2): matmul, bias, affine step, activation, re-layout, one launch at a time.

Each op asks for the kernel chosen for the device (:mod:`malinn.choice.kernel_choice`), brings every
operand into the layout and padding the kernel declares (re-laying out on the device when needed),
binds and launches it, and returns the result in the kernel's result layout. A model does not run
through these: its plan (:mod:`malinn.plan.plan`) decides all of that once and keeps the launches. The
ops serve tests, the tuner and users who multiply matrices by hand.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .backends.base import BoundLaunch, Device
from .backends.selection import get_device
from .choice.kernel_call import bind
from .choice.kernel_choice import choose, holding_columns, use
from .choice.matrix import DeviceMatrix
from .errors import LayoutError
from .library.kernel_library import EPILOGUE_DEFINES, KernelSpec, load_library
from .library.layout import Layout, parse_layout

__all__ = [
    "use",
    "kernel_for",
    "matmul",
    "matmul_plan",
    "bias_add",
    "affine",
    "activation",
    "relayout",
    "reshape",
    "to_layout",
    "upload_vector",
    "launch",
    "enqueue",
    "with_epilogue",
    "elementwise_kernel",
]


def kernel_for(
    op: str, device: Device | None = None, shape: tuple | None = None, activation: str | None = None
) -> KernelSpec:
    """The kernel ``op`` uses on ``device`` (for a matmul, for ``shape = (m, k, n)`` followed by
    ``activation``); see :func:`malinn.choice.kernel_choice.choose`."""
    return choose(op, device, shape, activation)


def matmul_plan(spec: KernelSpec, m: int, k: int, n: int) -> dict:
    """Padded shapes of ``a`` (m x k), ``b`` (k x n) and ``r`` (m x n) for kernel ``spec``."""
    return spec.padded_shapes(m, k, n)


def launch(
    spec: KernelSpec,
    device: Device,
    matrices: dict,
    vectors: dict | None = None,
    what: str = "",
    params: dict | None = None,
) -> Any:
    """Binds kernel ``spec`` to its arguments and enqueues it once.

    Returns:
        The backend's event of the launch (``None`` when the range is empty).

    Raises:
        KernelBuildError: the program did not build.
        DeviceError: the launch failed; the message names the kernel, the sizes and the status.
    """
    return enqueue(bind(spec, device, matrices, vectors, params, what), device, matrices["r"])


def enqueue(bound: BoundLaunch | None, device: Device, result: DeviceMatrix) -> Any:
    """Enqueues a launch bound before (:func:`~malinn.choice.kernel_call.bind`) once, under the
    device's lock, its ``result``'s host copy marked stale.

    Returns:
        The backend's event of the launch (``None`` where ``bound`` is: an empty range).
    """
    result.invalidate_host()
    if bound is None:
        return None
    with device.lock:
        return bound()


def to_layout(matrix: DeviceMatrix, device: Device, layout: Layout | str, padded: tuple) -> DeviceMatrix:
    """``matrix`` on ``device`` in ``layout`` with ``padded`` shape.

    Returns ``matrix`` when it already is; uploads straight into the layout when only the host copy
    exists; otherwise re-lays out on the device (no host round trip).
    """
    layout, padded = parse_layout(layout), tuple(padded)
    if matrix.matches(device, layout, padded):
        return matrix
    if matrix.buffer is None or matrix.device is not device:
        return DeviceMatrix.upload(device, matrix.numpy(), layout, padded)
    return relayout(matrix, layout, padded)


def matmul(
    a: DeviceMatrix,
    b: DeviceMatrix,
    spec: KernelSpec | None = None,
    device: Device | None = None,
    what: str = "matmul",
    bias: Any = None,
    activation: str = "linear",
    params: dict | None = None,
    affine: tuple[Any, Any] | None = None,
) -> DeviceMatrix:
    """``R = affine(activation(A x B + bias))`` on the device, in one launch when the kernel can fuse.

    Args:
        a: the left operand (m x k), e.g. a Dense layer's ``W = kernel^T``. Already on the device
            in the kernel's layout it is used as it is, also when padded more than the kernel
            needs (one weight buffer serves several kernels); otherwise it is re-laid out.
        b: the right operand (k x n), e.g. the layer's input ``x^T``.
        spec: the kernel (default: the device's choice for this shape); operands that are not in
            its layouts are re-laid out first.
        device: where to run (default: ``b``'s device, else the current one).
        what: who asked, for error messages.
        bias: a device vector of ``m`` values added to every column, or ``None``.
        activation: applied after the bias. Fused into the kernel's final write when its epilogue
            can (element-wise activations; ``softmax`` where a work-group holds whole columns, in
            the first configuration of the kernel that does), else run as its own kernels.
        params: the activation's parameters.
        affine: ``(scale, shift)``, device vectors of ``m`` values: ``R = R * scale + shift`` per
            row after the activation (a BatchNormalization after an activated Dense), or ``None``.

    Returns:
        ``R`` (m x n) in the kernel's result layout, on the device.

    Raises:
        ValueError: the inner dimensions differ.
    """
    device = device or b.device or get_device()
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"{what}: cannot multiply {a.shape} by {b.shape}: inner dimensions {k} and {k2} differ")
    spec = spec or kernel_for("matmul", device, (m, k, n), activation=activation)
    spec, fused = with_epilogue(spec, (m, k, n), device, bias is not None, activation, affine is not None)
    plan = matmul_plan(spec, m, k, n)
    a = _left_operand(a, device, spec.matrices["a"], plan["a"])
    b = to_layout(b, device, spec.matrices["b"].layout, plan["b"])
    r = DeviceMatrix.empty(device, (m, n), spec.matrices["r"].layout, plan["r"], what=f"{what} result")
    vectors = {}
    if "bias" in fused:
        vectors["bias"] = bias
    if "affine" in fused and affine is not None:
        vectors["scale"], vectors["shift"] = affine
    launch(spec, device, {"a": a, "b": b, "r": r}, vectors, what=what, params=params if "activation" in fused else None)
    if bias is not None and "bias" not in fused:
        bias_add(r, bias, what=what)
    if not {"activation", "softmax"} & set(fused):
        activation_op(r, activation, what=what, **(params or {}))
    if affine is not None and "affine" not in fused:
        affine_op(r, *affine, what=what)
    return r


def _left_operand(a: DeviceMatrix, device: Device, restriction: Any, need: tuple) -> DeviceMatrix:
    """``a`` as the kernel reads it: as it is when it lies on ``device`` in the kernel's layout,
    padded at least to ``need`` with the kernel's alignments (kernels index A with its own padded
    shape), else re-laid out (or uploaded) to exactly ``need``."""
    if (
        a.buffer is not None
        and a.device is device
        and a.layout == restriction.layout
        and a.padded is not None
        and a.padded[0] >= need[0]
        and a.padded[1] >= need[1]
        and a.padded[0] % restriction.row_multiple == 0
        and a.padded[1] % restriction.col_multiple == 0
    ):
        return a
    return to_layout(a, device, restriction.layout, need)


def with_epilogue(
    spec: KernelSpec, shape: tuple, device: Device, bias: bool, activation: str | None, affine: bool
) -> tuple:
    """``spec`` configured to fuse the longest prefix of bias, activation, affine (in that order)
    that its epilogue can, and the names of the fused steps (``softmax`` for a fused softmax).

    Returns:
        ``(spec, fused)``; the spec's float parameters take the activation's names and defaults.
    """
    steps = (
        (["bias"] if bias else [])
        + ([] if activation in (None, "linear") else ["softmax" if activation == "softmax" else "activation"])
        + (["affine"] if affine else [])
    )
    fused, defines = [], {}
    for step in steps:
        kernel = elementwise_kernel(activation) if step == "activation" else None
        if step == "softmax":
            holding = holding_columns(spec, shape, device)
            if holding is None:
                break
            spec = holding
        elif step not in spec.epilogue or (step == "activation" and kernel is None):
            break
        fused.append(step)
        defines[EPILOGUE_DEFINES[step]] = dict(kernel.defines)["ACTIVATION"] if kernel is not None else 1
    spec = spec.configure(defines) if defines else spec
    if "activation" in fused:
        act = elementwise_kernel(activation)
        if act is not None and act.params:
            spec = dataclasses.replace(spec, params=act.params)
    return spec, tuple(fused)


def elementwise_kernel(activation: str | None) -> KernelSpec | None:
    """The element-wise activation kernel of ``activation`` (whose formula an epilogue can apply),
    or ``None`` (softmax needs a whole column; an unknown name has no kernel)."""
    act = load_library().activation_kernel(activation) if activation not in (None, "linear") else None
    return act if act is not None and act.source == "activation.cl" else None


def _device(m: DeviceMatrix) -> Device:
    """The device ``m`` lies on.

    Raises:
        LayoutError: ``m`` is on the host only (upload it first: :meth:`DeviceMatrix.upload`).
    """
    if m.device is None:
        raise LayoutError(f"a {m.shape[0]}x{m.shape[1]} matrix on the host only; upload it to a device first")
    return m.device


def upload_vector(device: Device, values: Any, what: str = "vector") -> Any:
    """Copies a 1-D float32 vector to a new device buffer."""
    values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    buffer = device.alloc(values.nbytes, what)
    with device.lock:
        device.upload(buffer, values, blocking=True, what=f"{what} ({values.size} values)")
    return buffer


def bias_add(r: DeviceMatrix, bias_buffer: Any, spec: KernelSpec | None = None, what: str = "bias") -> DeviceMatrix:
    """Adds a bias (one value per row of ``r``, already on the device) to ``r`` in place."""
    spec = spec or kernel_for("bias", r.device)
    launch(spec, _device(r), {"r": r}, {"bias": bias_buffer}, what=what)
    return r


def affine(
    r: DeviceMatrix, scale_buffer: Any, shift_buffer: Any, spec: KernelSpec | None = None, what: str = "affine"
) -> DeviceMatrix:
    """``r = r * scale + shift`` per row (feature) of ``r``, in place; the vectors are on the device."""
    spec = spec or kernel_for("affine", r.device)
    launch(spec, _device(r), {"r": r}, {"scale": scale_buffer, "shift": shift_buffer}, what=what)
    return r


def activation(r: DeviceMatrix, name: str, what: str = "activation", **params: float) -> DeviceMatrix:
    """Applies activation ``name`` to ``r`` in place (``linear`` launches nothing).

    Args:
        r: the matrix (features x batch), on a device.
        name: an activation the kernel library computes (e.g. ``"relu"``, ``"elu"``).
        what: who asked, for error messages.
        **params: the activation's parameters (e.g. ``alpha=1.0`` for ``elu``).

    Raises:
        ValueError: the kernel library has no kernel for ``name``.
    """
    if name in (None, "linear"):
        return r
    launch(load_library().activation_spec(name, what), _device(r), {"r": r}, what=what, params=params)
    return r


activation_op = activation
affine_op = affine


def reshape(
    m: DeviceMatrix, shape: tuple, layout: Layout | str, padded: tuple, spec: KernelSpec | None = None
) -> DeviceMatrix:
    """Device matrix ``m`` as another matrix view of the same tensor (flat order ``col * rows + row``
    kept): ``shape`` rows x cols, in ``layout`` with ``padded`` shape, made on the device.

    Raises:
        ValueError: ``shape`` holds another number of elements.
    """
    if shape[0] * shape[1] != m.shape[0] * m.shape[1]:
        raise ValueError(f"cannot view a {m.shape[0]}x{m.shape[1]} matrix as {shape[0]}x{shape[1]}")
    spec = spec or kernel_for("reshape", m.device)
    r = DeviceMatrix.empty(_device(m), shape, layout, padded, what="reshape")
    launch(spec, _device(m), {"a": m, "r": r}, what=f"reshape to {shape[0]}x{shape[1]}")
    return r


def relayout(m: DeviceMatrix, layout: Layout | str, padded: tuple, spec: KernelSpec | None = None) -> DeviceMatrix:
    """A copy of device matrix ``m`` in another layout and padding, made on the device."""
    spec = spec or kernel_for("relayout", m.device)
    r = DeviceMatrix.empty(_device(m), m.shape, layout, padded, what="relayout")
    launch(spec, _device(m), {"a": m, "r": r}, what=f"relayout to {r.layout}")
    return r
