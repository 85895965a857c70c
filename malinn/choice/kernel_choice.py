"""Which kernel an op runs on a device: an explicit choice, else the tuner's, else the library's.

For a matmul of shape ``(m, k, n)`` (units x inputs x batch) the order is:

1. the choice made with :func:`use` for this device;
2. the tuning database's winner for this device (for this very shape when ``malinn tune --model``
   timed it, else its general winner);
3. the library's ``defaults`` for the device's kind;

and when the chosen kernel's ``preconditions`` do not hold for the shape (a small batch, say), the
library's ``matmul_fallback`` for the device's kind. The plan asks once per layer and batch bucket;
``predict`` never asks.

A matmul in a weight precision other than fp32 (``int8-weights``, ...) asks the tuning database for
that precision's winners, takes the library's defaults and fallbacks that serve the precision (an
entry with ``"precisions"`` serves those only: a configuration for half or int8 weights listed before
the fp32 one), and ends in a kernel whose entry lists the precision: the choice above if
it does, else the first fallback, default or library kernel that does and accepts the shape. A
precision that needs a device extension (``fp16``: cl_khr_fp16) is refused on a device without it.
"""

from __future__ import annotations

import threading
from typing import Any

from ..backends.base import Device
from ..backends.selection import devices, get_device
from ..errors import BackendError, DeviceError, LibraryError
from ..library.kernel_library import DEFAULT_PRECISION, KernelSpec, load_library
from .tuning_db import tuned_choice
from .tuning_db import version as tuning_version

__all__ = ["use", "forget", "choose", "in_precision", "untuned_matmul", "holding_columns", "explicit_choice", "epoch"]

_lock = threading.Lock()
_epoch = [0]


def epoch() -> int:
    """A number that changes whenever a choice changes (plans made before are then stale)."""
    return _epoch[0] + tuning_version()


def _choices(device: Device) -> dict:
    return device.cache.setdefault("kernel_choice", {})


def use(op: str, codename: str, device: Device | None = None, config: dict | None = None) -> None:
    """Chooses the kernel that ``op`` runs on ``device`` from now on.

    Args:
        op: an op of the kernel library (``kernels/library.json``'s ``op`` field) that the plan
            chooses a kernel for: ``"matmul"``, ``"bias"``, ``"affine"``, ``"relayout"``,
            ``"reshape"``, ``"broadcast"``, ``"normalize"``, ``"permute"``, ``"repeat"``,
            ``"merge"``, ``"concat"``, ``"dot"``, ``"conv"`` or ``"im2col"`` (a convolution
            layer's algorithm; ``"im2col"`` for ungrouped layers only), ``"depthwise"``,
            ``"pool"`` or ``"spatial"``. An ``"activation"`` kernel is chosen by the activation's
            name and a ``"matmul_head"`` one by the plan, so a choice for either has no effect.
        codename: a codename of the kernel library that implements ``op``.
        device: the device (default: the current one).
        config: defines for a configurable kernel (e.g. ``{"MWG": 128}``); default: the entry's.

    Raises:
        LibraryError: ``codename`` is unknown, implements another op, or ``config`` does not fit it.
        DeviceError: the device cannot launch that configuration (its work-group or local memory).
        ValueError: ``device`` is not a malinn device (a name such as ``"gpu"``: see ``set_device``).
    """
    spec = load_library()[codename]
    if spec.op != op:
        raise LibraryError(f"kernel {codename!r} implements {spec.op!r}, not {op!r}")
    configured = spec.configure(config)
    if device is not None and not isinstance(device, Device):
        raise ValueError(
            f"use: device must be a malinn device (malinn.devices(), malinn.get_device()), got "
            f"{device!r}; malinn.set_device({device!r}) makes it the current one"
        )
    device = device or get_device()
    limit = configured.launch_limit(device)
    if limit:  # else every layer would fall back to another kernel, without a word
        raise DeviceError(
            f"use: kernel {codename!r} in {'configuration ' + str(config) if config else 'its defaults'} "
            f"{limit}: choose a configuration within the device's limits (its candidates: "
            f"docs/KERNELS.md) or another kernel"
        )
    with _lock:
        _choices(device)[op] = (codename, dict(config or {}))
        _epoch[0] += 1


def forget(device: Device | None = None) -> None:
    """Drops the choices made with :func:`use` (on ``device``, or on every device when ``None``)."""
    with _lock:
        for d in [device] if device is not None else devices():
            _choices(d).clear()
        _epoch[0] += 1


def explicit_choice(op: str, device: Device) -> Any:
    """``(codename, defines)`` set with :func:`use` for ``op`` on ``device``, or ``None``."""
    with _lock:
        return _choices(device).get(op)


def choose(
    op: str,
    device: Device | None = None,
    shape: tuple | None = None,
    activation: str | None = None,
    precision: str = DEFAULT_PRECISION,
    defines: dict | None = None,
) -> KernelSpec:
    """The kernel ``op`` uses on ``device`` (for a matmul, for the product ``shape = (m, k, n)``).

    Without an explicit or tuned choice, a matmul takes the first of the library's defaults for the
    device's kind whose preconditions hold for ``shape`` (a list there orders variants for skinny
    and small products before the general one). A matmul whose choice's preconditions do not hold
    for ``shape`` takes the first of the library's ``matmul_fallback`` kernels for the device's kind whose preconditions hold (the last
    one listed, if none). A matmul followed by ``activation="softmax"`` that the choice cannot fuse,
    unless :func:`use` set the choice, takes the library's ``matmul_softmax`` kernel where it reads
    and writes the same layouts and holds the shape's columns (see :func:`holding_columns`).

    Another op given a layer's ``defines`` takes the first of the explicit choice and the library's
    defaults for the device's kind (a list there orders variants) that those defines configure
    within its ``constraints`` and that the device can launch (its work-group and ``local_bytes``):
    a tiled kernel bounded in head size or local memory gives way to the general one.

    Returns:
        The configured :class:`~malinn.library.kernel_library.KernelSpec` (for a matmul, in ``precision``;
        for another op, configured with ``defines``).

    Raises:
        DeviceError: ``precision`` needs an extension the device lacks.
        BackendError: ``precision`` is reduced and the device's backend reads fp32 weights only.
        LibraryError: no kernel for the device's kind reads the weights in ``precision``; or, for
            another op, ``defines`` fit none of its kernels (the last one's error).
        ValueError: ``precision`` is unknown.
    """
    device = device or get_device()
    library = load_library()
    if op == "matmul" and precision != DEFAULT_PRECISION:
        check_precision(precision, device)
        spec = _choose_matmul(library, device, shape, activation, precision)
        return in_precision(spec, precision, device.kind, device.backend, shape, device)
    if op == "matmul":
        return _choose_matmul(library, device, shape, activation)
    return _choose(library, op, device) if defines is None else _choose_configured(library, op, device, defines)


#: the backends whose plans run the reduced weight precisions (the others' read fp32 weights only)
REDUCED_PRECISION_BACKENDS = ("opencl",)


def check_precision(name: str, device: Device) -> None:
    """Checks that ``device`` runs weight precision ``name``.

    Args:
        name: a precision of kernels/library.json (``fp32``, ``fp16-storage``, ``fp16``, ``int8-weights``).
        device: the device.

    Raises:
        BackendError: a reduced precision on a backend whose kernels read fp32 weights only.
        DeviceError: ``name`` needs an extension the device lacks (``fp16``: cl_khr_fp16).
        ValueError: ``name`` is unknown.
    """
    if name == DEFAULT_PRECISION:
        return
    precision = load_library().precision(name)
    if device.backend not in REDUCED_PRECISION_BACKENDS:
        raise BackendError(
            f"precision {precision.name!r} runs on OpenCL devices; {device.name} is a {device.backend} "
            f"device, whose kernels read fp32 weights only: use fp32 there"
        )
    extension = precision.extension
    if extension and extension not in getattr(device, "extensions", ()):
        raise DeviceError(
            f"precision {precision.name!r} computes in half and needs {extension}, which {device.name} "
            f"does not offer; use fp16-storage (half weights, float arithmetic: every device)"
        )


def in_precision(
    spec: KernelSpec,
    precision: str,
    kind: str,
    backend: str = "opencl",
    shape: tuple[int, int, int] | None = None,
    device: Device | None = None,
) -> KernelSpec:
    """``spec`` in ``precision`` where its entry supports it, else the first matmul kernel that does
    (the fallbacks of the device kind ``kind`` on ``backend``, its defaults, then the library's
    matmul kernels in order) and accepts ``shape`` (a product ``(m, k, n)`` on ``device``; None:
    any).

    Raises:
        LibraryError: no matmul kernel supports ``precision`` (for ``shape``).
    """
    if precision in spec.precisions:
        return spec.in_precision(precision)
    library = load_library()
    others = (
        library.default_specs("matmul_fallback", kind, backend, precision)
        + library.default_specs("matmul", kind, backend, precision)
        + [library[c] for c in library.codenames("matmul", backend)]
    )
    for other in others:
        if precision not in other.precisions:
            continue
        if shape is None or other.accepts(*shape, device=device):
            return other.in_precision(precision)
        for config in other.configurations(device):  # e.g. a gemv whose NB holds the batch
            if other.configure(config).accepts(*shape, device=device):
                return other.configure(config).in_precision(precision)
    raise LibraryError(
        f"{library.path}: no matmul kernel supports precision {precision!r}"
        + (f" for a {shape[0]}x{shape[1]}x{shape[2]} product" if shape else "")
    )


def _choose(library: Any, op: str, device: Device) -> KernelSpec:
    chosen = explicit_choice(op, device)
    return library[chosen[0]].configure(chosen[1]) if chosen else library.default_spec(op, device.kind, device.backend)


def _choose_configured(library: Any, op: str, device: Device, defines: dict) -> KernelSpec:
    """The first of the explicit choice and the defaults that ``defines`` configure within its
    constraints and that ``device`` can launch; else the last, configured (which raises why not)."""
    chosen = explicit_choice(op, device)
    specs = [library[chosen[0]].configure(chosen[1])] if chosen else []
    specs += library.default_specs(op, device.kind, device.backend)
    for spec in specs:
        try:
            configured = spec.configure(defines)
        except LibraryError:
            continue
        if configured.fits(device):
            return configured
    return specs[-1].configure(defines)


def _choose_matmul(
    library: Any,
    device: Device,
    shape: tuple[int, int, int] | None,
    activation: str | None,
    precision: str = DEFAULT_PRECISION,
) -> KernelSpec:
    chosen = explicit_choice("matmul", device)
    explicit = chosen is not None
    if chosen is None:
        chosen = tuned_choice(device, shape, precision)
    spec = library[chosen[0]].configure(chosen[1]) if chosen else _default_matmul(library, device, shape, precision)
    if shape is not None and not spec.accepts(*shape, device=device):
        spec = _fallback(library, device, shape, precision)
    if activation == "softmax" and shape is not None and not explicit and holding_columns(spec, shape, device) is None:
        candidates = [
            c
            for c in library.default_specs("matmul_softmax", device.kind, device.backend)
            if all(c.matrices[x].layout == spec.matrices[x].layout for x in "br")
        ]
        # the table's configurations in order, then any configuration of theirs that holds the columns
        holding = next((c for c in candidates if c.accepts(*shape, device=device)), None) or next(
            filter(None, (holding_columns(c, shape, device) for c in candidates)), None
        )
        if holding is not None:
            return holding
    return spec


def _default_matmul(library: Any, device: Device, shape: tuple[int, int, int] | None, precision: str) -> KernelSpec:
    """The first of the device kind's defaults whose preconditions the product meets (the first,
    for no product)."""
    defaults = library.default_specs("matmul", device.kind, device.backend, precision)
    return next((d for d in defaults if shape is None or d.accepts(*shape, device=device)), defaults[0])


def _fallback(library: Any, device: Device, shape: tuple[int, int, int], precision: str) -> KernelSpec:
    fallbacks = library.default_specs("matmul_fallback", device.kind, device.backend, precision)
    return next((f for f in fallbacks if f.accepts(*shape, device=device)), fallbacks[-1])


def untuned_matmul(device: Device, shape: tuple[int, int, int], precision: str = DEFAULT_PRECISION) -> KernelSpec:
    """The matmul kernel the library chooses for the product ``shape`` with no explicit choice and
    no tuned winner (its defaults, then its fallbacks), in fp32's configuration (what a tuner
    times first for that shape)."""
    library = load_library()
    spec = _default_matmul(library, device, shape, precision)
    return spec if spec.accepts(*shape, device=device) else _fallback(library, device, shape, precision)


def holding_columns(spec: KernelSpec, shape: tuple[int, int, int], device: Device | None = None) -> KernelSpec | None:
    """``spec`` in the first of its configurations that can fuse a softmax for a product of
    ``shape`` (its preconditions hold: a work-group holds whole columns), or ``None``."""
    if "softmax" not in spec.epilogue:
        return None
    if spec.accepts(*shape, device=device):
        return spec
    for config in spec.configurations(device):
        configured = spec.configure(config)
        if configured.accepts(*shape, device=device):
            return configured
    return None
