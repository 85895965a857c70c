"""Which devices work, and which one malinn runs on (Rovder 4.2-4.3).

Devices come from the backends (``malinn/backends/``: OpenCL, and OpenGL where moderngl is
installed), each already probed: a tiny kernel built, ran and returned the right answer (once per
device and driver: a passed probe is cached, :func:`malinn.backends.opencl.probe_key`). The current
device is chosen by ``malinn.set_device(...)``, else the ``MALINN_DEVICE`` environment variable,
else the first working OpenCL GPU, else the first working OpenGL GPU, else the first working CPU.
``set_device`` also takes a list (``["0:0", "0:1"]``): ``predict`` then spreads its batches over
those devices (:func:`get_devices`), and everything else runs on the first (:func:`get_device`).

Start-up probes no more than that choice needs: :func:`get_device` without a setting probes the
OpenCL GPUs in order up to the first that works (no context on any other device); only when none
works, or when a device is named, or :func:`devices` is asked, is every device probed (the probes
already made are reused, so a device is probed once per process and stays the same object).
"""

from __future__ import annotations

import importlib.util
import os
import threading
from typing import Callable

from ..environment import check_switches
from ..errors import DeviceError
from . import gl_feedback, opencl, opengl
from .base import Device

__all__ = ["Device", "devices", "get_device", "get_devices", "resolve_devices", "set_device"]

#: backend name -> its discovery function; the order is the order of devices()
BACKENDS: dict[str, Callable[..., list]] = {
    "opencl": opencl.discover,
    "gl": opengl.discover,
    gl_feedback.BACKEND: gl_feedback.discover,
}
#: the backends whose discovery reads the devices found before it (OpenGL's: after any OpenCL GPU)
_AFTER_OTHERS = ("gl", gl_feedback.BACKEND)

_registry_lock = threading.RLock()
_devices: list | None = None
_current: Device | None = None
_current_list: tuple | None = None  # the devices set_device was given as a list (predict spreads over them)
_probed: dict = {}  # OpenCL (platform, device) -> Device, or None where its probe failed (this discovery)


def devices(refresh: bool = False) -> list:
    """Lists the working devices of every backend.

    Each device has been probed: a tiny kernel built and ran on it (in this process, or in an
    earlier one with the same device and driver: the probe cache). Broken platforms and devices
    are skipped with a warning.

    Args:
        refresh: enumerate again instead of returning the cached list.

    Returns:
        A list of :class:`Device`, backend by backend, in platform then device order.

    Raises:
        SettingError: a switch (``MALINN_GL``, ``MALINN_BINARY_CACHE``, ...) holds a value malinn
            does not read (:mod:`malinn.environment`).
    """
    global _devices, _current, _current_list
    with _registry_lock:
        if _devices is None or refresh:
            check_switches()
            if refresh:
                _probed.clear()
            _devices = []
            for name, discover in BACKENDS.items():
                _devices += discover(list(_devices)) if name in _AFTER_OTHERS else discover(_probed)
            _current = None
            _current_list = None
        return list(_devices)


def match(spec: str, candidates: list) -> Device:
    """The first of ``candidates`` that ``spec`` names (a kind, ``P:D``, or part of a name), or,
    with a backend's name before it (``gl``, ``gl:gpu``, ``gl:0``, ``gl:llvmpipe``,
    ``opencl:cpu``), the first of that backend's devices that the rest names (a GPU first).

    Raises:
        DeviceError: none matches; the message lists the working devices.
    """
    spec = spec.strip()
    low = spec.lower()
    backend, _, rest = low.partition(":")
    if backend in BACKENDS:
        mine = [d for d in candidates if d.backend == backend]
        if not mine and backend in _AFTER_OTHERS and candidates is _devices:
            mine = _discover_gl_on_request(backend)
        if not mine:
            hint = (
                "; the OpenGL backends need moderngl, which is not installed: pip install 'malinn[gl]'"
                if backend in _AFTER_OTHERS and importlib.util.find_spec("moderngl") is None
                else ""
            )
            raise DeviceError(f"no working {backend} device; working devices: {listing(candidates)}{hint}")
        if not rest:
            return next((d for d in mine if d.kind == "gpu"), mine[0])
        if rest.isdigit():
            for d in mine:
                if str(d.index[-1]) == rest:
                    return d
            raise DeviceError(f"no working device {spec}; working devices: {listing(candidates)}")
        return match(spec.split(":", 1)[1], mine)
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


def _discover_gl_on_request(backend: str = "gl") -> list:
    """The OpenGL devices of ``backend`` (``gl``, ``gles3``), looked for now that they are asked for
    by name (a discovery where an OpenCL GPU works leaves Mesa unloaded:
    :func:`malinn.backends.opengl.wanted`)."""
    with _registry_lock:
        known = _known()
        found = [d for d in known if d.backend == backend] or BACKENDS[backend](list(known), force=True)
        known.extend(d for d in found if d not in known)
        return found


def _known() -> list:
    """The list of the devices discovery found, itself (not a copy: :func:`match` tells a search of
    all of them by it, and the OpenGL devices asked for by name are added to it)."""
    if _devices is None:
        devices()
    assert _devices is not None  # devices() made it
    return _devices


def listing(candidates: list) -> str:
    """``"0:0 name (GPU); ..."`` for error messages."""
    return "; ".join(f"{d.index[0]}:{d.index[1]} {d.name} ({d.type})" for d in candidates) or "none"


def set_device(spec: "str | Device | list | tuple") -> "Device | list":
    """Chooses the device that models run on from now on, or several devices that ``predict``
    spreads its batches over.

    Args:
        spec: a :class:`Device`, ``"gpu"``, ``"cpu"``, ``"accelerator"``, ``"P:D"`` (platform and
            device indices) or a substring of the device or platform name; or, with a backend's
            name (``opencl``, ``gl``, ``gles3``) before it, one of that backend's devices: the
            backend alone (``"gl"``: its first GPU, else its first device), ``"gl:N"`` (its device
            N), or ``"gl:"`` followed by any form above (``"gl:cpu"``, ``"gl:llvmpipe"``,
            ``"opencl:cpu"``). Naming ``gl`` or ``gles3`` looks for OpenGL devices that a plain
            discovery left unloaded. Or a list of any of these (``["0:0", "0:1"]``: every GPU of a
            host): ``predict`` runs a plan on each and spreads its batches over them (a device
            listed twice gets two plans); every other use (``max_batch``, ``summary``, ``ops``)
            takes the first.

    Returns:
        The chosen :class:`Device`, or for a list the list of chosen devices.

    Raises:
        DeviceError: nothing working matches ``spec`` (or one of the list's), or the list is empty.
    """
    global _current, _current_list
    with _registry_lock:
        if isinstance(spec, (list, tuple)):
            chosen = resolve_devices(spec)
            _current, _current_list = chosen[0], (tuple(chosen) if len(chosen) > 1 else None)
            return list(chosen)
        candidates = devices()
        if isinstance(spec, Device):
            if spec not in candidates:
                raise DeviceError(f"{spec.name} is not one of the working devices: {listing(candidates)}")
            _current = spec
        elif isinstance(spec, str):
            _current = match(spec, _known())
        else:
            raise DeviceError(f"set_device expects a Device, a string or a list of them, got {type(spec).__name__}")
        _current_list = None
        return _current


def resolve_devices(specs: "str | Device | list | tuple") -> list:
    """The devices a list of specs names (each as :func:`set_device` takes one), in order; a device
    named twice is listed twice.

    Raises:
        DeviceError: the list is empty, or an entry matches no working device (the message names it).
    """
    if isinstance(specs, (str, Device)):
        specs = [specs]
    specs = list(specs)
    if not specs:
        raise DeviceError("an empty list of devices; name at least one (a Device, gpu, cpu, P:D, ...)")
    with _registry_lock:
        candidates = devices()
        chosen = []
        for i, spec in enumerate(specs):
            if isinstance(spec, Device):
                if spec not in candidates:
                    raise DeviceError(
                        f"device {i} of the list, {spec.name}, is not one of the working devices: {listing(candidates)}"
                    )
                chosen.append(spec)
            elif isinstance(spec, str):
                try:
                    chosen.append(match(spec, _known()))
                except DeviceError as exc:
                    raise DeviceError(f"device {i} of the list, {spec!r}: {exc}") from None
            else:
                raise DeviceError(f"device {i} of the list is a {type(spec).__name__}; expected a Device or a string")
        return chosen


def get_devices() -> list:
    """The devices ``predict`` spreads its batches over: the list given to :func:`set_device`, else
    the current device alone (:func:`get_device`).

    Raises:
        DeviceError, SettingError: as :func:`get_device`.
    """
    listed = _current_list
    return list(listed) if listed is not None else [get_device()]


def get_device() -> Device:
    """The current device: the one set, else ``MALINN_DEVICE``'s choice, else the first GPU, else CPU.

    Raises:
        DeviceError: no working device exists, or ``MALINN_DEVICE`` matches none.
        SettingError: a switch holds a value malinn does not read (:mod:`malinn.environment`).
    """
    global _current
    with _registry_lock:
        if _current is not None:
            return _current
        if _devices is None and not os.environ.get("MALINN_DEVICE", "").strip():
            check_switches()
            gpu = opencl.first_gpu(_probed)  # the first choice, without probing anything else
            if gpu is not None:
                _current = gpu
                return _current
        candidates = devices()
        if not candidates and opencl.skipped_for_tensorflow():
            raise DeviceError(f"no working OpenCL device: PoCL was skipped because {opencl.TENSORFLOW_HINT}")
        if not candidates:
            raise DeviceError(
                "no working OpenCL or OpenGL device was found; install an OpenCL driver "
                "(on Debian: apt-get install pocl-opencl-icd), or an OpenGL ES 3.1 driver and "
                "`pip install malinn[gl]`, and see `malinn devices`"
            )
        env = os.environ.get("MALINN_DEVICE", "").strip()
        if env:
            try:
                _current = match(env, _known())
            except DeviceError as exc:
                raise DeviceError(f"MALINN_DEVICE={env!r}: {exc}") from None
        else:
            _current = next(
                (d for d in candidates if d.kind == "gpu"),  # OpenCL's first: BACKENDS order
                next((d for d in candidates if d.kind == "cpu"), candidates[0]),
            )
        return _current
