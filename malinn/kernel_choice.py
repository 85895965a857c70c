"""Which kernel an op runs on a device: an explicit choice, else the tuner's, else the library's.

For a matmul of shape ``(m, k, n)`` (units x inputs x batch) the order is:

1. the choice made with :func:`use` for this device;
2. the tuning database's winner for this device (for this very shape when ``malinn tune --model``
   timed it, else its general winner);
3. the library's ``defaults`` for the device's kind;

and when the chosen kernel's ``preconditions`` do not hold for the shape (a small batch, say), the
library's ``matmul_fallback`` for the device's kind. The plan asks once per layer and batch bucket;
``predict`` never asks.
"""

from __future__ import annotations

import threading

from .backends.base import Device
from .device_selection import devices, get_device
from .errors import LibraryError
from .kernel_library import KernelSpec, load_library
from .tuning_db import tuned_choice, version as tuning_version

__all__ = ["use", "forget", "choose", "holding_columns", "explicit_choice", "epoch"]

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
        op: ``"matmul"``, ``"bias"``, ``"affine"`` or ``"relayout"``.
        codename: a codename of the kernel library that implements ``op``.
        device: the device (default: the current one).
        config: defines for a configurable kernel (e.g. ``{"MWG": 128}``); default: the entry's.

    Raises:
        LibraryError: ``codename`` is unknown, implements another op, or ``config`` does not fit it.
    """
    spec = load_library()[codename]
    if spec.op != op:
        raise LibraryError(f"kernel {codename!r} implements {spec.op!r}, not {op!r}")
    spec.configure(config)
    device = device or get_device()
    with _lock:
        _choices(device)[op] = (codename, dict(config or {}))
        _epoch[0] += 1


def forget(device: Device | None = None) -> None:
    """Drops the choices made with :func:`use` (on ``device``, or on every device when ``None``)."""
    with _lock:
        for d in ([device] if device is not None else devices()):
            _choices(d).clear()
        _epoch[0] += 1


def explicit_choice(op: str, device: Device):
    """``(codename, defines)`` set with :func:`use` for ``op`` on ``device``, or ``None``."""
    with _lock:
        return _choices(device).get(op)


def choose(op: str, device: Device | None = None, shape: tuple | None = None,
           activation: str | None = None) -> KernelSpec:
    """The kernel ``op`` uses on ``device`` (for a matmul, for the product ``shape = (m, k, n)``).

    A matmul whose choice's preconditions do not hold for ``shape`` takes the first of the
    library's ``matmul_fallback`` kernels for the device's kind whose preconditions hold (the last
    one listed, if none). A matmul followed by ``activation="softmax"`` that the choice cannot fuse,
    unless :func:`use` set the choice, takes the library's ``matmul_softmax`` kernel where it reads
    and writes the same layouts and holds the shape's columns (see :func:`holding_columns`).

    Returns:
        The configured :class:`~malinn.kernel_library.KernelSpec`.
    """
    device = device or get_device()
    library = load_library()
    chosen = explicit_choice(op, device)
    explicit = chosen is not None
    if chosen is None and op == "matmul":
        chosen = tuned_choice(device, shape)
    spec = library[chosen[0]].configure(chosen[1]) if chosen else library.default_spec(op, device.kind, device.backend)
    if shape is not None and op == "matmul" and not spec.accepts(*shape, device=device):
        fallbacks = library.default_specs("matmul_fallback", device.kind, device.backend)
        spec = next((f for f in fallbacks if f.accepts(*shape, device=device)), fallbacks[-1])
    if activation == "softmax" and shape is not None and op == "matmul" and not explicit \
            and holding_columns(spec, shape, device) is None:
        for candidate in library.default_specs("matmul_softmax", device.kind, device.backend):
            same_layouts = all(candidate.matrices[x].layout == spec.matrices[x].layout for x in "br")
            holding = holding_columns(candidate, shape, device) if same_layouts else None
            if holding is not None:
                return holding
    return spec


def holding_columns(spec: KernelSpec, shape: tuple, device: Device | None = None) -> KernelSpec | None:
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
