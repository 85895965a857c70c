"""The device layer (Rovder 4.2-4.3): OpenCL platforms, devices, contexts, queues and programs.

A device counts as working only after a tiny kernel has built and run on it and returned the right
answer; a broken platform or device is skipped with a warning that says why (PoCL too when
TensorFlow is loaded in the process: the two cannot share one). The current device is
chosen by ``malinn.set_device(...)``, else the ``MALINN_DEVICE`` environment variable, else the
first working GPU, else the first working CPU.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass, field

import numpy as np

from .cache import read_entry, write_entry
from .errors import DeviceError, KernelBuildError

__all__ = ["Device", "devices", "get_device", "set_device", "cl_status_name", "tensorflow_loaded",
           "TENSORFLOW_HINT"]

_PROBE_SOURCE = """
__kernel void malinn_probe(__global const float *x, __global float *y) {
    size_t i = get_global_id(0);
    y[i] = 2.0f * x[i] + 1.0f;
}
"""


def _cl():
    import pyopencl as cl  # imported lazily so that `import malinn` never fails for lack of a driver

    return cl


def cl_status_name(error: Exception) -> str:
    """The OpenCL status name (e.g. ``CL_OUT_OF_RESOURCES``) carried by a pyopencl error."""
    cl = _cl()
    try:
        code = int(error.code)
    except Exception:
        code = None
    if code is not None:
        for name in dir(cl.status_code):
            if not name.startswith("_") and getattr(cl.status_code, name) == code:
                return f"CL_{name}"
        return f"OpenCL status {code}"
    return type(error).__name__


@dataclass(eq=False)
class Device:
    """One working OpenCL device with its context, profiling queue and program cache.

    Attributes:
        index: ``(platform_index, device_index)`` as the OpenCL ICD loader enumerates them.
        name, platform, vendor, type: as the driver reports them (type is ``"GPU"``, ``"CPU"``, ...).
        compute_units, global_memory, max_allocation, max_work_group_size, opencl_c_version,
        driver_version: the driver's figures (memory in bytes).
        host_unified_memory: whether the device shares memory with the host (Mali, Adreno, CPUs).
    """

    index: tuple[int, int]
    name: str
    platform: str
    vendor: str
    type: str
    compute_units: int
    global_memory: int
    max_allocation: int
    max_work_group_size: int
    max_work_item_sizes: tuple[int, ...]
    local_memory: int
    image_support: bool
    image2d_max_size: tuple[int, int]
    opencl_c_version: str
    driver_version: str
    host_unified_memory: bool
    cl_device: object = field(repr=False)
    context: object = field(repr=False, default=None)
    queue: object = field(repr=False, default=None)
    counters: dict = field(repr=False, default_factory=lambda: {"uploads": 0, "downloads": 0, "launches": 0, "builds": 0})
    _programs: dict = field(repr=False, default_factory=dict)
    _lock: threading.RLock = field(repr=False, default_factory=threading.RLock)

    @property
    def key(self) -> str:
        """A stable string naming this device and its driver (for caches and settings)."""
        return f"{self.platform}|{self.name}|{self.driver_version}"

    @property
    def kind(self) -> str:
        """``"gpu"``, ``"cpu"`` or ``"accelerator"``: the class used to pick default kernels."""
        return "gpu" if "GPU" in self.type else "cpu" if "CPU" in self.type else "accelerator"

    def describe(self) -> dict:
        """The device's figures as a plain dict (what ``malinn devices`` prints)."""
        return {
            "index": f"{self.index[0]}:{self.index[1]}",
            "name": self.name,
            "platform": self.platform,
            "type": self.type,
            "compute_units": self.compute_units,
            "global_memory_mib": self.global_memory // 2**20,
            "max_allocation_mib": self.max_allocation // 2**20,
            "opencl_c_version": self.opencl_c_version,
        }

    def __str__(self) -> str:
        d = self.describe()
        return (f"[{d['index']}] {self.name} ({self.type}, {self.platform}): {self.compute_units} compute units, "
                f"{d['global_memory_mib']} MiB global memory, {d['max_allocation_mib']} MiB max allocation, "
                f"{self.opencl_c_version}")

    # ---------------------------------------------------------------- programs
    def build(self, source: str, options: tuple[str, ...] = (), origin: str = "<source>"):
        """Builds (once) and returns an OpenCL program for this device.

        Programs are memoised per (source, options), so asking twice costs nothing, and their
        binaries are cached on disk (:mod:`malinn.cache` kind ``programs``, keyed by source, options,
        platform, device, vendor and driver; ``MALINN_BINARY_CACHE=0`` turns that off), so a new
        process does not recompile. A cached binary reaches the driver only after the cache has
        checked its length, checksum and key; a damaged one is discarded and rebuilt.

        Args:
            source: OpenCL C source text.
            options: compiler options, e.g. ``("-DTILE=4",)``.
            origin: where the source came from, for error messages.

        Returns:
            A built ``pyopencl.Program``.

        Raises:
            KernelBuildError: the build failed; the message has the build log and the options. Or
                this is a PoCL device and TensorFlow is loaded (PoCL would crash the process).
        """
        cl = _cl()
        if "Portable Computing Language" in self.platform and tensorflow_loaded():
            raise KernelBuildError(f"building {origin} for {self.name}: {TENSORFLOW_HINT}")
        key = hashlib.sha256(source.encode() + b"\0" + "\0".join(options).encode()).hexdigest()
        with self._lock:
            program = self._programs.get(key)
            if program is not None:
                return program
            program = self._from_binary_cache(source, options)
            if program is not None:
                self._programs[key] = program
                return program
            try:
                program = cl.Program(self.context, source).build(options=list(options))
            except cl.Error as exc:
                raise KernelBuildError(
                    f"building {origin} for {self.name} failed ({cl_status_name(exc)})\n"
                    f"options: {' '.join(options) or '(none)'}\nbuild log:\n{exc}") from exc
            self._programs[key] = program
            self.counters["builds"] += 1
            self._to_binary_cache(source, options, program)
            return program

    # ---------------------------------------------------------------- binary cache
    def _binary_key(self, source: str, options) -> dict | None:
        """The full key of a program binary in the cache (``None`` when ``MALINN_BINARY_CACHE=0``)."""
        if os.environ.get("MALINN_BINARY_CACHE", "1") == "0":
            return None
        return {"source_sha256": hashlib.sha256(source.encode()).hexdigest(), "options": list(options),
                "device": self.name, "vendor": self.vendor, "driver": self.driver_version, "platform": self.platform}

    def _from_binary_cache(self, source: str, options):
        """The program from its cached binary, or ``None``; the cache checks the entry before the driver sees it."""
        key = self._binary_key(source, options)
        binary = read_entry("programs", key) if key is not None else None
        if not binary:
            return None
        cl = _cl()
        try:
            program = cl.Program(self.context, [self.cl_device], [binary]).build(options=list(options))
        except Exception:  # a binary the driver no longer takes: rebuild from source (and overwrite it)
            return None
        self.counters["binary_hits"] = self.counters.get("binary_hits", 0) + 1
        return program

    def _to_binary_cache(self, source: str, options, program) -> None:
        key = self._binary_key(source, options)
        if key is None:
            return
        try:
            binary = program.get_info(_cl().program_info.BINARIES)[0]
        except Exception:  # a driver without program binaries: nothing to cache
            return
        if binary:
            write_entry("programs", key, bytes(binary))


_registry_lock = threading.RLock()
_devices: list[Device] | None = None
_current: Device | None = None


def _probe(cl, platform, cl_device, index) -> Device:
    """Creates a context and queue on ``cl_device`` and runs the probe kernel; raises on failure."""
    context = cl.Context([cl_device])
    queue = cl.CommandQueue(context, cl_device, properties=cl.command_queue_properties.PROFILING_ENABLE)
    x = np.arange(16, dtype=np.float32)
    y = np.empty_like(x)
    mf = cl.mem_flags
    xb = cl.Buffer(context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
    yb = cl.Buffer(context, mf.WRITE_ONLY, y.nbytes)
    program = cl.Program(context, _PROBE_SOURCE).build()
    program.malinn_probe(queue, (16,), None, xb, yb)
    cl.enqueue_copy(queue, y, yb)
    queue.finish()
    if not np.array_equal(y, 2 * x + 1):
        raise DeviceError("the probe kernel ran but returned wrong values")
    d = cl_device
    version = d.opencl_c_version if hasattr(d, "opencl_c_version") else d.version
    try:
        unified = bool(d.host_unified_memory)
    except Exception:  # removed from OpenCL 3.0 headers on some drivers
        unified = d.type & cl.device_type.CPU != 0
    device = Device(
        index=index, name=d.name.strip(), platform=platform.name.strip(), vendor=d.vendor.strip(),
        type=_type_name(cl, d.type), compute_units=d.max_compute_units,
        global_memory=d.global_mem_size, max_allocation=d.max_mem_alloc_size,
        max_work_group_size=d.max_work_group_size, max_work_item_sizes=tuple(d.max_work_item_sizes), local_memory=d.local_mem_size,
        image_support=bool(d.image_support),
        image2d_max_size=(d.image2d_max_width, d.image2d_max_height) if d.image_support else (0, 0),
        opencl_c_version=version.strip(), driver_version=d.driver_version.strip(),
        host_unified_memory=unified, cl_device=d, context=context, queue=queue)
    device._programs[hashlib.sha256(_PROBE_SOURCE.encode() + b"\0").hexdigest()] = program
    return device


def _type_name(cl, bits: int) -> str:
    for name in ("GPU", "CPU", "ACCELERATOR", "CUSTOM"):
        if bits & getattr(cl.device_type, name, 0):
            return name
    return cl.device_type.to_string(bits)


def _enumerate() -> list[Device]:
    global _skipped_for_tensorflow
    _skipped_for_tensorflow = False
    try:
        cl = _cl()
    except ImportError as exc:  # pragma: no cover - pyopencl is a dependency
        warnings.warn(f"malinn: pyopencl cannot be imported ({exc}); no OpenCL device is usable", stacklevel=3)
        return []
    found: list[Device] = []
    tensorflow = tensorflow_loaded()
    try:
        if tensorflow and not _icd_loader_without_pocl(lambda: cl.get_platforms()):
            return []
        platforms = cl.get_platforms()
    except Exception as exc:
        warnings.warn(f"malinn: no OpenCL platform could be listed ({cl_status_name(exc)}: {exc}); "
                      "install an OpenCL driver (e.g. Debian's pocl-opencl-icd)", stacklevel=3)
        return []
    for pi, platform in enumerate(platforms):
        if tensorflow and _is_pocl(platform):  # PoCL was loaded before TensorFlow: its launches would crash
            _skip_pocl_for_tensorflow(f"OpenCL platform {pi} ({_safe_name(platform)})")
            continue
        try:
            cl_devices = platform.get_devices()
        except Exception as exc:
            warnings.warn(f"malinn: skipping OpenCL platform {pi} ({_safe_name(platform)}): its devices cannot be "
                          f"listed ({cl_status_name(exc)}: {exc})", stacklevel=3)
            continue
        for di, cl_device in enumerate(cl_devices):
            try:
                found.append(_probe(cl, platform, cl_device, (pi, di)))
            except Exception as exc:
                warnings.warn(f"malinn: skipping OpenCL device {pi}:{di} ({_safe_name(cl_device)} on "
                              f"{_safe_name(platform)}): the probe kernel failed ({cl_status_name(exc)}: {exc})",
                              stacklevel=3)
    return found


# ---------------------------------------------------------------- TensorFlow and PoCL
TENSORFLOW_HINT = ("TensorFlow is loaded in this process, and PoCL cannot share a process with it (their LLVMs "
                   "clash and PoCL crashes); run TensorFlow in another process (as `malinn verify` does)")
_skipped_for_tensorflow = False


def _mapped(*fragments: str) -> bool:
    """Whether a shared object whose path holds one of ``fragments`` is mapped into this process."""
    try:
        with open("/proc/self/maps") as maps:
            return any(fragment in line for line in maps for fragment in fragments)
    except OSError:   # not Linux
        return False


def tensorflow_loaded() -> bool:
    """Whether TensorFlow (and with it TensorFlow's LLVM) is loaded in this process."""
    return "tensorflow" in sys.modules or _mapped("libtensorflow", "_pywrap_tensorflow")


def _is_pocl(platform) -> bool:
    return "Portable Computing Language" in _safe_name(platform) or "pocl" in _safe_attr(platform, "vendor").lower()


def _safe_attr(obj, name: str) -> str:
    try:
        return str(getattr(obj, name))
    except Exception:
        return ""


def _skip_pocl_for_tensorflow(what: str) -> None:
    global _skipped_for_tensorflow
    _skipped_for_tensorflow = True
    warnings.warn(f"malinn: skipping {what}: {TENSORFLOW_HINT}", stacklevel=4)


def _icd_loader_without_pocl(start_loader) -> bool:
    """Starts the OpenCL ICD loader with PoCL hidden from it; returns whether any other driver is left.

    Loading PoCL's library beside TensorFlow's LLVM crashes the process, so it must not be loaded at
    all: the loader reads its list of drivers once, on its first call, from ``OCL_ICD_VENDORS``
    (else ``/etc/OpenCL/vendors``) and ``OCL_ICD_FILENAMES``; those are pointed, for that first call
    only, at the registered drivers other than PoCL. When PoCL is already loaded (it was used before
    TensorFlow came), the loader is already started and the platform loop skips PoCL instead.
    """
    if _mapped("libpocl"):
        return True
    vendors = os.environ.get("OCL_ICD_VENDORS") or "/etc/OpenCL/vendors"
    if os.path.isdir(vendors):
        icds = [os.path.join(vendors, n) for n in sorted(os.listdir(vendors)) if n.endswith(".icd")]
    else:
        icds = [vendors] if os.path.isfile(vendors) else []
    libraries = {}
    for icd in icds:
        try:
            with open(icd) as f:
                libraries[icd] = f.read().strip()
        except OSError:
            pass
    filenames = [f for f in os.environ.get("OCL_ICD_FILENAMES", "").split(os.pathsep) if f]
    pocl = [icd for icd, library in libraries.items() if "pocl" in os.path.basename(library).lower()]
    pocl += [f for f in filenames if "pocl" in os.path.basename(f).lower()]
    if not pocl:
        return True
    _skip_pocl_for_tensorflow("the PoCL OpenCL driver")
    others = {icd: library for icd, library in libraries.items() if icd not in pocl}
    other_files = [f for f in filenames if f not in pocl]
    if not others and not other_files:
        return False
    saved = {name: os.environ.get(name) for name in ("OCL_ICD_VENDORS", "OCL_ICD_FILENAMES")}
    with tempfile.TemporaryDirectory(prefix="malinn-icd-") as folder:
        for icd, library in others.items():
            with open(os.path.join(folder, os.path.basename(icd)), "w") as f:
                f.write(library + "\n")
        os.environ["OCL_ICD_VENDORS"] = folder
        os.environ["OCL_ICD_FILENAMES"] = os.pathsep.join(other_files)
        try:
            start_loader()
        except Exception:  # the caller lists the platforms again and reports what fails
            pass
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    return True


def _safe_name(obj) -> str:
    try:
        return obj.name.strip()
    except Exception:
        return "unnamed"


def devices(refresh: bool = False) -> list[Device]:
    """Lists the working OpenCL devices.

    Each device has been probed: a tiny kernel built and ran on it. Broken platforms and devices
    are skipped with a warning.

    Args:
        refresh: enumerate again instead of returning the cached list.

    Returns:
        A list of :class:`Device`, in platform then device order.
    """
    global _devices, _current
    with _registry_lock:
        if _devices is None or refresh:
            _devices = _enumerate()
            _current = None
        return list(_devices)


def _match(spec: str, candidates: list[Device]) -> Device:
    spec = spec.strip()
    low = spec.lower()
    if low in ("gpu", "cpu", "accelerator"):
        for d in candidates:
            if d.kind == low:
                return d
        raise DeviceError(f"no working {low.upper()} device; working devices: {_listing(candidates)}")
    if ":" in spec and all(p.strip().isdigit() for p in spec.split(":", 1)):
        want = tuple(int(p) for p in spec.split(":", 1))
        for d in candidates:
            if d.index == want:
                return d
        raise DeviceError(f"no working device at platform:device {spec}; working devices: {_listing(candidates)}")
    for d in candidates:
        if low in d.name.lower() or low in d.platform.lower():
            return d
    raise DeviceError(f"no working device matches {spec!r}; working devices: {_listing(candidates)}")


def _listing(candidates: list[Device]) -> str:
    return "; ".join(f"{d.index[0]}:{d.index[1]} {d.name} ({d.type})" for d in candidates) or "none"


def set_device(spec: "str | Device") -> Device:
    """Chooses the device that layers and models run on from now on.

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
                raise DeviceError(f"{spec.name} is not one of the working devices: {_listing(candidates)}")
            _current = spec
        elif isinstance(spec, str):
            _current = _match(spec, candidates)
        else:
            raise DeviceError(f"set_device expects a Device or a string, got {type(spec).__name__}")
        return _current


def get_device() -> Device:
    """The current device: the one set, else ``MALINN_DEVICE``'s choice, else the first GPU, else CPU.

    Raises:
        DeviceError: no working OpenCL device exists, or ``MALINN_DEVICE`` matches none.
    """
    global _current
    with _registry_lock:
        if _current is not None:
            return _current
        candidates = devices()
        if not candidates and _skipped_for_tensorflow:
            raise DeviceError(f"no working OpenCL device: PoCL was skipped because {TENSORFLOW_HINT}")
        if not candidates:
            raise DeviceError("no working OpenCL device was found; install an OpenCL driver "
                              "(on Debian: apt-get install pocl-opencl-icd) and see `malinn devices`")
        env = os.environ.get("MALINN_DEVICE", "").strip()
        if env:
            try:
                _current = _match(env, candidates)
            except DeviceError as exc:
                raise DeviceError(f"MALINN_DEVICE={env!r}: {exc}") from None
        else:
            _current = next((d for d in candidates if d.kind == "gpu"),
                            next((d for d in candidates if d.kind == "cpu"), candidates[0]))
        return _current
