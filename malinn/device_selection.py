"""Which devices work, and which one malinn runs on (Rovder 4.2-4.3).

Devices come from the backends (``malinn/backends/``; OpenCL today), each already probed: a tiny
kernel built, ran and returned the right answer. The current device is chosen by
``malinn.set_device(...)``, else the ``MALINN_DEVICE`` environment variable, else the first working
GPU, else the first working CPU.
"""

from __future__ import annotations

import os
import threading

from .backends import opencl
from .backends.base import Device
from .errors import DeviceError

__all__ = ["Device", "devices", "get_device", "set_device"]

#: backend name -> its discovery function; the order is the order of devices()
BACKENDS = {"opencl": opencl.discover}

_registry_lock = threading.RLock()
_devices: list | None = None
_current: Device | None = None


def devices(refresh: bool = False) -> list:
    """Lists the working devices of every backend.

    Each device has been probed: a tiny kernel built and ran on it. Broken platforms and devices
    are skipped with a warning.

    Args:
        refresh: enumerate again instead of returning the cached list.

    Returns:
        A list of :class:`Device`, backend by backend, in platform then device order.
    """
    global _devices, _current
    with _registry_lock:
        if _devices is None or refresh:
            _devices = [d for discover in BACKENDS.values() for d in discover()]
            _current = None
        return list(_devices)


def match(spec: str, candidates: list) -> Device:
    """The first of ``candidates`` that ``spec`` names (a kind, ``P:D``, or part of a name).

    Raises:
        DeviceError: none matches; the message lists the working devices.
    """
    spec = spec.strip()
    low = spec.lower()
    if low in ("gpu", "cpu", "accelerator"):
        for d in candidates:
            if d.kind == low:
                return d
        raise DeviceError(f"no working {low.upper()} device; working devices: {listing(candidates)}")
    if ":" in spec and all(p.strip().isdigit() for p in spec.split(":", 1)):
        want = tuple(int(p) for p in spec.split(":", 1))
        for d in candidates:
            if tuple(d.index) == want:
                return d
        raise DeviceError(f"no working device at platform:device {spec}; working devices: {listing(candidates)}")
    for d in candidates:
        if low and (low in d.name.lower() or low in d.platform.lower()):
            return d
    raise DeviceError(f"no working device matches {spec!r}; working devices: {listing(candidates)}")


def listing(candidates: list) -> str:
    """``"0:0 name (GPU); ..."`` for error messages."""
    return "; ".join(f"{d.index[0]}:{d.index[1]} {d.name} ({d.type})" for d in candidates) or "none"


def set_device(spec: "str | Device") -> Device:
    """Chooses the device that models run on from now on.

    Args:
        spec: a :class:`Device`, ``"gpu"``, ``"cpu"``, ``"accelerator"``, ``"P:D"`` (platform and
            device indices) or a substring of the device or platform name.

    Returns:
        The chosen :class:`Device`.

    Raises:
        DeviceError: nothing working matches ``spec``.
    """
    global _current
    with _registry_lock:
        candidates = devices()
        if isinstance(spec, Device):
            if spec not in candidates:
                raise DeviceError(f"{spec.name} is not one of the working devices: {listing(candidates)}")
            _current = spec
        elif isinstance(spec, str):
            _current = match(spec, candidates)
        else:
            raise DeviceError(f"set_device expects a Device or a string, got {type(spec).__name__}")
        return _current


def get_device() -> Device:
    """The current device: the one set, else ``MALINN_DEVICE``'s choice, else the first GPU, else CPU.

    Raises:
        DeviceError: no working device exists, or ``MALINN_DEVICE`` matches none.
    """
    global _current
    with _registry_lock:
        if _current is not None:
            return _current
        candidates = devices()
        if not candidates and opencl.skipped_for_tensorflow():
            raise DeviceError(f"no working OpenCL device: PoCL was skipped because {opencl.TENSORFLOW_HINT}")
        if not candidates:
            raise DeviceError("no working OpenCL device was found; install an OpenCL driver "
                              "(on Debian: apt-get install pocl-opencl-icd) and see `malinn devices`")
        env = os.environ.get("MALINN_DEVICE", "").strip()
        if env:
            try:
                _current = match(env, candidates)
            except DeviceError as exc:
                raise DeviceError(f"MALINN_DEVICE={env!r}: {exc}") from None
        else:
            _current = next((d for d in candidates if d.kind == "gpu"),
                            next((d for d in candidates if d.kind == "cpu"), candidates[0]))
        return _current
