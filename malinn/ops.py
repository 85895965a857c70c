"""Operations and their performers (Rovder 5.2): matmul, bias addition, activation, re-layout.

Each op asks the kernel library for the codename chosen for the current device, reads the
kernel's restrictions, brings every operand into the layout and padding the kernel declares
(re-laying out on the device only when needed), launches, and returns the result in the
kernel's declared result layout. Which codename an op uses is one setting per device
(:func:`use`), defaulting to ``kernels/library.json``'s ``defaults`` for the device's kind.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from .device import Device, _cl, cl_status_name, get_device
from .errors import DeviceError, LibraryError
from .kernel_library import KernelSpec, load_library
from .matrix import DeviceMatrix, allocate

__all__ = ["use", "kernel_for", "matmul", "matmul_plan", "bias_add", "affine", "activation", "relayout",
           "upload_vector", "launch"]

_settings_lock = threading.Lock()
_settings: dict = {}   # device key -> {op: codename}


def use(op: str, codename: str, device: Device | None = None) -> None:
    """Chooses the kernel that ``op`` runs on ``device`` from now on.

    Args:
        op: ``"matmul"``, ``"bias"`` or ``"relayout"``.
        codename: a codename of the kernel library that implements ``op``.
        device: the device (default: the current one).

    Raises:
        LibraryError: ``codename`` is unknown or implements another op.
    """
    spec = load_library()[codename]
    if spec.op != op:
        raise LibraryError(f"kernel {codename!r} implements {spec.op!r}, not {op!r}")
    device = device or get_device()
    with _settings_lock:
        _settings.setdefault(device.key, {})[op] = codename


def kernel_for(op: str, device: Device | None = None) -> KernelSpec:
    """The kernel ``op`` uses on ``device``: the one set with :func:`use`, else the library default."""
    device = device or get_device()
    library = load_library()
    with _settings_lock:
        codename = _settings.get(device.key, {}).get(op)
    return library[codename or library.default(op, device.kind)]


def _round_up(value: int, multiple: int) -> int:
    return max(1, -(-value // multiple)) * multiple


def matmul_plan(spec: KernelSpec, m: int, k: int, n: int) -> dict:
    """Padded shapes of ``a`` (m x k), ``b`` (k x n) and ``r`` (m x n) for kernel ``spec``."""
    a, b, r = spec.matrices["a"], spec.matrices["b"], spec.matrices["r"]
    mp = _round_up(m, math.lcm(a.row_multiple, r.row_multiple, spec.scale[0]))
    kp = _round_up(k, math.lcm(a.col_multiple, b.row_multiple))
    np_ = _round_up(n, math.lcm(b.col_multiple, r.col_multiple, spec.scale[1]))
    return {"a": (mp, kp), "b": (kp, np_), "r": (mp, np_)}


def launch(spec: KernelSpec, device: Device, matrices: dict, vectors: dict | None = None,
           common: int = 0, what: str = "", params: dict | None = None):
    """Builds (memoised) and enqueues kernel ``spec`` on ``device``.

    Args:
        spec: the kernel.
        device: where to run it.
        matrices: argument name -> :class:`DeviceMatrix`, already in the declared layouts.
        vectors: argument name -> device buffer (e.g. ``bias``).
        common: the padded common dimension ``l`` of a matmul.
        what: who asked (a layer name), for error messages.
        params: values of the kernel's float parameters (the ``p`` letters), by name.

    Returns:
        The ``pyopencl.Event`` of the launch (``None`` when the range is empty).

    Raises:
        KernelBuildError: the program did not build.
        DeviceError: the launch failed; the message names the kernel, the sizes and the status.
    """
    cl = _cl()
    r = matrices["r"]
    a = matrices.get("a")
    values = {"l": common, "h": r.padded[0], "w": r.padded[1], "m": r.shape[0], "n": r.shape[1],
              "H": a.padded[0] if a is not None else 0, "W": a.padded[1] if a is not None else 0}
    scale = spec.scale if len(spec.ndrange) == 2 else spec.scale[1:]
    global_size = tuple(values[c] // s for c, s in zip(spec.ndrange, scale))
    if 0 in global_size:
        return None
    local_size = _local_size(spec.workgroup, global_size, device)
    source = spec.program_source({name: m.layout for name, m in matrices.items()})
    program = device.build(source, spec.options(), origin=f"{spec.source} ({spec.codename})")
    floats = iter(spec.param_values(params))
    args = [np.float32(next(floats)) if c == "p" else np.uint32(values[c]) for c in spec.arglist]
    for name in spec.buffers:
        args.append(matrices[name].buffer if name in matrices else (vectors or {})[name])
    with device._lock:  # a cl.Kernel's arguments are per object: build, set and enqueue together
        try:
            kernel = cl.Kernel(program, spec.function)
            kernel.set_args(*args)
            event = cl.enqueue_nd_range_kernel(device.queue, kernel, global_size, local_size)
        except cl.Error as exc:
            shapes = ", ".join(f"{k}={m.shape} as {m.layout} padded {m.padded}" for k, m in matrices.items())
            raise DeviceError(f"{what + ': ' if what else ''}kernel {spec.codename} failed on {device.name} "
                              f"({cl_status_name(exc)}); global {global_size}, local {local_size}; {shapes}") from exc
        device.counters["launches"] += 1
    r.invalidate_host()
    return event


def _local_size(preferred, global_size, device: Device):
    if not preferred:
        return None
    if math.prod(preferred) > device.max_work_group_size:
        return None
    for g, p, limit in zip(global_size, preferred, device.max_work_item_sizes):
        if p > limit or g % p:
            return None
    return tuple(preferred)


def matmul(a: DeviceMatrix, b: DeviceMatrix, spec: KernelSpec | None = None, device: Device | None = None,
           what: str = "matmul") -> DeviceMatrix:
    """``R = A x B`` on the device with kernel ``spec`` (default: the device's matmul setting).

    Args:
        a: the left operand (m x k), e.g. a Dense layer's ``W = kernel^T``.
        b: the right operand (k x n), e.g. the layer's input ``x^T``.
        spec: the kernel; operands that are not in its layouts are re-laid out first.
        device: where to run (default: ``b``'s device, else the current one).
        what: who asked, for error messages.

    Returns:
        ``R`` (m x n) in the kernel's result layout, on the device.

    Raises:
        ValueError: the inner dimensions differ.
    """
    device = device or b.device or get_device()
    spec = spec or kernel_for("matmul", device)
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"{what}: cannot multiply {a.shape} by {b.shape}: inner dimensions {k} and {k2} differ")
    plan = matmul_plan(spec, m, k, n)
    a = a.in_layout(device, spec.matrices["a"].layout, plan["a"])
    b = b.in_layout(device, spec.matrices["b"].layout, plan["b"])
    r = DeviceMatrix.empty(device, (m, n), spec.matrices["r"].layout, plan["r"], what=f"{what} result")
    launch(spec, device, {"a": a, "b": b, "r": r}, common=plan["a"][1], what=what)
    return r


def upload_vector(device: Device, values, what: str = "vector"):
    """Copies a 1-D float32 vector to a new device buffer."""
    cl = _cl()
    values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    buffer = allocate(device, values.nbytes, what)
    cl.enqueue_copy(device.queue, buffer, values, is_blocking=True)
    device.counters["uploads"] += 1
    return buffer


def bias_add(r: DeviceMatrix, bias_buffer, spec: KernelSpec | None = None, what: str = "bias") -> DeviceMatrix:
    """Adds a bias (one value per row of ``r``, already on the device) to ``r`` in place."""
    spec = spec or kernel_for("bias", r.device)
    launch(spec, r.device, {"r": r}, {"bias": bias_buffer}, what=what)
    return r


def affine(r: DeviceMatrix, scale_buffer, shift_buffer, spec: KernelSpec | None = None,
           what: str = "affine") -> DeviceMatrix:
    """``r = r * scale + shift`` per row (feature) of ``r``, in place; the vectors are on the device."""
    spec = spec or kernel_for("affine", r.device)
    launch(spec, r.device, {"r": r}, {"scale": scale_buffer, "shift": shift_buffer}, what=what)
    return r


def activation(r: DeviceMatrix, name: str, what: str = "activation", **params) -> DeviceMatrix:
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
    spec = load_library().activation_kernel(name)
    if spec is None:
        raise ValueError(f"{what}: no kernel computes activation {name!r}; "
                         f"available: {', '.join(['linear'] + load_library().activations())}")
    launch(spec, r.device, {"r": r}, what=what, params=params)
    return r


def relayout(m: DeviceMatrix, layout, padded, spec: KernelSpec | None = None) -> DeviceMatrix:
    """A copy of device matrix ``m`` in another layout and padding, made on the device."""
    spec = spec or kernel_for("relayout", m.device)
    r = DeviceMatrix.empty(m.device, m.shape, layout, padded, what="relayout")
    launch(spec, m.device, {"a": m, "r": r}, what=f"relayout to {r.layout}")
    return r
