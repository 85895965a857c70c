"""The OpenCL backend: the only module of malinn that imports pyopencl.

It discovers and probes OpenCL devices (a tiny kernel must build, run and return the right values
before a device counts as working; a broken platform or device is skipped with a warning that says
why), and gives each one the :class:`~malinn.backends.base.Device` interface: buffers, uploads and
downloads (mapped in place on devices that share memory with the host), programs built once per
device with their binaries cached on disk, kernel arguments bound once, and layout index macros in
OpenCL C.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import struct
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..environment import switch
from ..errors import DeviceError, KernelBuildError, SettingError
from ..io.cache import DamagedEntry, build_lock, in_use, read_entry, users_died, write_entry
from ..library.layout import Layout
from ..version import __version__
from .base import ALLOCATION_HINT, BoundLaunch, Device, size_text

__all__ = ["OpenCLDevice", "discover", "first_gpu", "status_name", "zero_copy_enabled", "tensorflow_loaded",
           "skipped_for_tensorflow", "TENSORFLOW_HINT"]

_logger = logging.getLogger(__name__)

_PROBE_SOURCE = """
__kernel void malinn_probe(__global const float *x, __global float *y) {
    size_t i = get_global_id(0);
    y[i] = 2.0f * x[i] + 1.0f;
}
"""


def _cl():
    import pyopencl as cl  # imported on first use so that `import malinn` never fails for lack of a driver

    return cl


def _driver_caches_builds(cl_device) -> bool:
    """Whether ``cl_device``'s driver caches builds from source itself (pyopencl knows NVIDIA's and
    PoCL's); asked once, when the device is probed."""
    from pyopencl.characterize import has_src_build_cache  # pyopencl on first use, as in _cl()

    return bool(has_src_build_cache(cl_device))


def status_name(error: Exception) -> str:
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


def _defined_names(options) -> set:
    """The macro names compiler ``options`` define or undefine (``-DNAME``, ``-DNAME=V``, ``-D NAME=V``,
    ``-UNAME``)."""
    names, tokens = set(), list(options)
    for i, token in enumerate(tokens):
        if token in ("-D", "-U") and i + 1 < len(tokens):
            token = token + tokens[i + 1]
        if token[:2] in ("-D", "-U") and len(token) > 2:
            names.add(token[2:].split("=", 1)[0])
    return names


def _build_quietly(raw, cl_device, options: list) -> str:
    """Builds pyopencl's underlying program ``raw`` for ``cl_device``; returns the build log.

    pyopencl's ``Program.build`` turns any non-empty log into a ``CompilerWarning``, and NVIDIA's
    driver (580) logs a line for every kernel, "-w" or not ("Function f is a kernel, so overriding
    noinline attribute"): a warning on every build that a user can neither act on nor silence but
    with a process-wide warnings filter, which is not thread-safe. The underlying build call
    (``_build``, which pyopencl's own ``build`` wraps) warns of nothing; the caller keeps the log.

    Raises:
        pyopencl.Error: the build failed (its log: :func:`_build_log`).
    """
    cl = _cl()
    # the options pyopencl's build adds (its include folder; a define on Oclgrind) too: a driver
    # caches builds by their options (PoCL's kernel cache), and these are the ones it has seen
    options_bytes, _ = cl.Program._process_build_options(raw.get_info(cl.program_info.CONTEXT), options)
    raw._build(options=options_bytes, devices=[cl_device])
    return _build_log(raw, cl_device)


def _wrapped(raw, source: str | None):
    """pyopencl's ``Program`` around its built underlying program ``raw``, with the ``_source``
    attribute its ``Kernel`` reads: without it the lookup falls through to a kernel of that name, a
    failed clCreateKernel (which Oclgrind's API check reports)."""
    program = _cl().Program(raw)
    program._source = source
    return program


_LOG_PLACE = re.compile(r"^(\S+?):(\d+):(?:\d+:)?", re.M)


def _with_files(log: str, source: str) -> str:
    """``log`` with each place a compiler names in the joined program (``<kernel>:64:`` on NVIDIA,
    which ignores ``#line``; a temporary file's name elsewhere) followed by the kernel file and line
    it is (``[activation.cl:22]``), from the ``#line 1 "file"`` markers the library puts before
    each file (:meth:`~malinn.library.kernel_library.KernelSpec.program_source`)."""
    marks = [(i + 1, name) for i, line in enumerate(source.splitlines())
             for name in re.findall(r'^#line 1 "([^"]+)"$', line)]
    if not marks:
        return log
    names = {name for _, name in marks}

    def place(match):
        if match.group(1) in names:   # the driver honoured #line
            return match.group(0)
        line = int(match.group(2))
        found = [(start, name) for start, name in marks if start < line]
        return f"{match.group(0)} [{found[-1][1]}:{line - found[-1][0]}]" if found else match.group(0)

    return _LOG_PLACE.sub(place, log)


def _build_log(raw, cl_device) -> str:
    """The build log of pyopencl's underlying program ``raw`` for ``cl_device``, stripped."""
    cl = _cl()
    try:
        return (raw.get_build_info(cl_device, cl.program_build_info.LOG) or "").strip()
    except cl.Error:
        return ""


#: the magic numbers of LLVM bitcode, raw and in its wrapper
_BITCODE_MAGICS = (b"BC\xc0\xde", b"\xde\xc0\x17\x0b")
_POCL_MAGIC = b"poclbin\0"


def pocl_binary_problem(binary: bytes) -> str | None:
    """What makes a PoCL program binary incomplete, or ``None`` for a whole one.

    PoCL's binary (``lib/CL/pocl_binary.c``: format versions 6-11, PoCL 1.x-7.x) is a header, the
    files of the program's folder in PoCL's kernel cache (its ``program.bc``, the program's LLVM
    bitcode, above all) and a record per kernel. PoCL serialises that folder as it finds it on disk:
    a build of the same program in another process that replaces ``program.bc`` at that moment
    (PoCL 3.1 removes the old file before renaming the new one in) leaves a binary without it, and
    PoCL aborts the process that loads it (``pocl_binary_get_kernels_metadata: Assertion 'len > 0'``).
    So a binary reaches PoCL only when its ``program.bc`` is there and is bitcode, every file and
    kernel record is whole and the records end where the binary does. A format version this does not
    know passes on the magic and a kernel count.
    """
    data = memoryview(binary)
    if len(data) < 32 or bytes(data[:8]) != _POCL_MAGIC:
        return "not a PoCL binary (no 'poclbin' magic)"
    version, kernels = struct.unpack_from("<II", data, 16)
    flags = struct.unpack_from("<Q", data, 24)[0]
    if kernels == 0:
        return "a PoCL binary of no kernel"
    if not 6 <= version <= 11:
        return None
    try:
        if version <= 8:   # program.bc's path and contents right after the header and the build hash
            files, offset = _pocl_files(data, 32 + 41, 1)
        else:              # root entries, each its size and then its files
            entries, offset = struct.unpack_from("<I", data, 32)[0], 36 + 41
            if version >= 10 and flags & 2:   # the size of the program's scope variables
                offset += 8
            files = {}
            for _ in range(entries):
                size = struct.unpack_from("<Q", data, offset)[0]
                if size == 0:   # the folder's file was missing when PoCL serialised it
                    return (f"a PoCL binary whose root entry at byte {offset} is empty (its program.bc, the "
                            f"program's LLVM bitcode, was missing when PoCL wrote it): PoCL would abort loading it")
                if offset + 8 + size > len(data):
                    return f"a PoCL binary cut short in its root entry at byte {offset}"
                found, end = _pocl_files(data[:offset + 8 + size], offset + 8, None)
                if end != offset + 8 + size:
                    return f"a PoCL binary whose root entry at byte {offset} does not end with its files"
                files.update(found)
                offset = end
        bitcode = files.get("/program.bc")
        if bitcode is None:
            return "a PoCL binary without its program.bc (the program's LLVM bitcode): PoCL would abort loading it"
        if bytes(bitcode[:4]) not in _BITCODE_MAGICS:
            return (f"a PoCL binary whose program.bc is {'empty' if not len(bitcode) else 'not LLVM bitcode'}: "
                    f"PoCL would abort loading it")
        for index in range(kernels):
            size = struct.unpack_from("<Q", data, offset)[0]
            if size < 24 or offset + size > len(data):
                return f"a PoCL binary whose kernel record {index + 1} of {kernels} is cut (at byte {offset})"
            offset += size
    except struct.error:
        return "a PoCL binary cut short"
    if offset != len(data):
        return f"a PoCL binary with {len(data) - offset} bytes after its {kernels} kernel records"
    return None


def _pocl_files(data: memoryview, offset: int, count: int | None):
    """PoCL's serialised files from ``offset``: ``count`` of them, or (None) up to the end of
    ``data``; returns ({path: contents}, the offset after them). A file is its path's length (4
    bytes), the path, its contents' length (4 bytes) and the contents."""
    files = {}
    while (count is None and offset < len(data)) or (count is not None and len(files) < count):
        n = struct.unpack_from("<I", data, offset)[0]
        path = bytes(data[offset + 4:offset + 4 + n]).decode("utf-8", "replace")
        if n == 0 or offset + 4 + n > len(data):
            raise struct.error("a file without a path")
        offset += 4 + n
        n = struct.unpack_from("<I", data, offset)[0]
        if offset + 4 + n > len(data):
            raise struct.error("a file cut short")
        files[path] = data[offset + 4:offset + 4 + n]
        offset += 4 + n
    return files, offset


#: CL_BUILD_SUCCESS, a program's build status once built (pyopencl names no such constant)
_CL_BUILD_SUCCESS = 0
#: C comments, for telling programs apart as a compiler's preprocessor does
_COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def _kernel_names(program) -> list:
    """The kernel names of a built program, sorted (``[]`` where the driver does not say: OpenCL 1.1)."""
    try:
        return sorted(filter(None, program.get_info(_cl().program_info.KERNEL_NAMES).split(";")))
    except Exception:
        return []


def zero_copy_enabled(device: Device) -> bool:
    """Whether buffers on ``device`` are host memory mapped in place of copied.

    True on devices that share memory with the host (Mali, Adreno, CPUs), unless
    ``MALINN_ZERO_COPY=0``: buffers are then allocated with ``CL_MEM_ALLOC_HOST_PTR`` and filled
    and read through ``clEnqueueMapBuffer``, so no second copy of the data is made.
    """
    return device.host_unified_memory and switch("MALINN_ZERO_COPY", True)


#: the platform name PoCL reports (its CPU device here)
POCL_PLATFORM = "Portable Computing Language"
#: staging arrays below this size stay in pageable memory (see :meth:`OpenCLDevice.host_array`)
PINNED_MIN_BYTES = 64 * 1024
#: from this size, an unpadded input is uploaded from the caller's array: the driver's own pipelined
#: staging of pageable memory beats a host copy into page-locked memory and its DMA (H200: 1.2 MB in
#: 112 us against 134 us; 0.3 MB in 53 us against 48 us: benchmarks/results/transfers_nvidia_h200.json)
DIRECT_MIN_BYTES = 1024 * 1024
#: added to every build's options: a build that succeeded may still have compiler warnings, about
#: the driver's own headers (PoCL on a CPU without AVX-512, of its float16 built-ins); "-w" keeps
#: PoCL's compiler from printing "3 warnings generated" on stderr. Part of a cached binary's key: one
#: built without it by an earlier malinn is not found (PoCL would print its warnings again)
QUIET_BUILD_OPTIONS = ("-w",)


@dataclass(eq=False)
class OpenCLDevice(Device):
    """An OpenCL device with its context and one in-order profiling queue."""

    cl_device: object = field(repr=False, default=None)
    context: object = field(repr=False, default=None)
    queue: object = field(repr=False, default=None)
    #: whether the driver caches builds from source itself (NVIDIA's, PoCL), decided by the probe:
    #: such builds go around pyopencl's own cache of builds (see :meth:`_build_from_source`)
    driver_caches_builds: bool = False
    #: held while a program is built (not ``lock``: another model's predict enqueues meanwhile;
    #: OpenCL's build calls are thread-safe beside a queue's)
    build_lock: threading.Lock = field(repr=False, default_factory=threading.Lock)

    @property
    def extensions(self) -> tuple:
        """The extensions the driver reports for the device."""
        return tuple(self.cl_device.extensions.split()) if self.cl_device is not None else ()

    # ---------------------------------------------------------------- memory
    def alloc(self, nbytes: int, what: str):
        cl = _cl()
        if nbytes > self.max_allocation:
            raise DeviceError(f"{what}: {size_text(nbytes)} exceeds the largest single allocation of "
                              f"{self.name} ({size_text(self.max_allocation)}){ALLOCATION_HINT}")
        flags = cl.mem_flags.READ_WRITE | (cl.mem_flags.ALLOC_HOST_PTR if zero_copy_enabled(self) else 0)
        try:
            return cl.Buffer(self.context, flags, max(int(nbytes), 4))
        except cl.Error as exc:
            raise DeviceError(f"{what}: allocating {size_text(nbytes)} on {self.name} failed "
                              f"({status_name(exc)})") from exc

    def upload(self, buffer, array, blocking: bool = True, what: str = "data", mapped: bool | None = None):
        event = self._transfer(buffer, array, True, blocking, mapped, f"uploading {what} ({array.nbytes} bytes) to")
        self.counters["uploads"] += 1
        return event

    def download(self, buffer, out, blocking: bool = True, what: str = "data", mapped: bool | None = None) -> None:
        self._transfer(buffer, out, False, blocking, mapped, f"downloading {what} ({out.nbytes} bytes) from")
        self.counters["downloads"] += 1

    def _transfer(self, buffer, host, to_device: bool, blocking: bool, mapped, what: str):
        """One copy between ``buffer`` and ``host``: through a mapping on host-unified devices when
        blocking (unless ``mapped`` says otherwise), else a plain copy. Returns a non-blocking copy's
        event (pyopencl's, which waits for the copy when it is freed: the caller holds it until a
        later blocking transfer), else None."""
        cl = _cl()
        try:
            if blocking and (zero_copy_enabled(self) if mapped is None else mapped):
                flags = cl.map_flags.WRITE_INVALIDATE_REGION if to_device else cl.map_flags.READ
                view, _ = cl.enqueue_map_buffer(self.queue, buffer, flags, 0, (host.size,), host.dtype,
                                                is_blocking=True)
                try:
                    if to_device:
                        view[...] = host.reshape(-1)
                    else:
                        host.reshape(-1)[...] = view
                finally:
                    view.base.release(self.queue)
                self.counters["zero_copy"] += 1
                return None
            event = cl.enqueue_copy(self.queue, *((buffer, host) if to_device else (host, buffer)), is_blocking=blocking)
            return None if blocking else event
        except cl.Error as exc:
            raise DeviceError(f"{what} {self.name} failed ({status_name(exc)})") from exc

    def host_array(self, shape, what: str = "staging") -> np.ndarray:
        """Page-locked memory on a discrete GPU: a ``CL_MEM_ALLOC_HOST_PTR`` buffer mapped once for
        good (NVIDIA's OpenCL guide: the driver then copies it by DMA, with no staging copy of its
        own); plain memory where the device shares the host's, for less than
        :data:`PINNED_MIN_BYTES` (the driver copies a small pageable array as fast, without a DMA
        setup), or with ``MALINN_PINNED=0``."""
        nbytes = 4 * int(np.prod(shape))
        if not self._pinned(nbytes):
            return np.zeros(shape, np.float32)
        cl = _cl()
        try:
            buffer = cl.Buffer(self.context, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, max(nbytes, 4))
            view, _ = cl.enqueue_map_buffer(self.queue, buffer, cl.map_flags.READ | cl.map_flags.WRITE, 0,
                                            tuple(shape), np.float32, is_blocking=True)
        except cl.Error as exc:
            raise DeviceError(f"{what}: allocating {size_text(nbytes)} of page-locked host memory for "
                              f"{self.name} failed ({status_name(exc)})") from exc
        view[...] = 0
        return view          # the mapping keeps the buffer alive as long as the array

    def stages_input(self, nbytes: int) -> bool:
        """True where :meth:`host_array` gives page-locked memory and the input is below
        :data:`DIRECT_MIN_BYTES`."""
        return self._pinned(nbytes) and nbytes < DIRECT_MIN_BYTES

    def _pinned(self, nbytes: int) -> bool:
        return not (self.host_unified_memory or nbytes < PINNED_MIN_BYTES
                    or not switch("MALINN_PINNED", True))

    def fill_zero(self, buffer, nbytes: int, what: str = "buffer") -> None:
        cl = _cl()
        try:   # a copy of zeros: Oclgrind 21.10 takes a clEnqueueFillBuffer'ed buffer for uninitialised
            cl.enqueue_copy(self.queue, buffer, np.zeros(int(nbytes) // 4, np.float32), is_blocking=True)
        except cl.Error as exc:
            raise DeviceError(f"clearing {what} ({nbytes} bytes) on {self.name} failed ({status_name(exc)})") from exc

    def image_from(self, buffer, width: int, height: int, what: str = "image"):
        cl = _cl()
        if not self.image_support or width > self.image2d_max_size[0] or height > self.image2d_max_size[1]:
            raise DeviceError(f"{what}: {self.name} cannot hold a {width}x{height} image "
                              f"(image support {self.image_support}, limit {self.image2d_max_size})")
        try:
            image = cl.create_image(self.context, cl.mem_flags.READ_ONLY,
                                    cl.ImageFormat(cl.channel_order.RGBA, cl.channel_type.FLOAT),
                                    shape=(width, height))
            cl.enqueue_copy(self.queue, image, buffer, offset=0, origin=(0, 0), region=(width, height))
        except cl.Error as exc:
            raise DeviceError(f"{what}: making a {width}x{height} image on {self.name} failed "
                              f"({status_name(exc)})") from exc
        return image

    def finish(self) -> None:
        cl = _cl()
        try:
            self.queue.finish()
        except cl.Error as exc:
            raise DeviceError(f"{self.name} failed while finishing its queue ({status_name(exc)})") from exc

    # ---------------------------------------------------------------- programs
    def compile(self, source: str, options: tuple = (), origin: str = "<source>"):
        """Builds (once) and returns an OpenCL program for this device.

        Programs are memoised per (source, options and ``MALINN_CL_OPTIONS``) in the device's cache,
        and their binaries are cached on disk (``<cache dir>/programs``, keyed by source, options,
        device and driver, each
        entry verified before it reaches the driver; ``MALINN_BINARY_CACHE=0`` turns that off), so a
        new process does not recompile. A binary is stored only once it is known to load
        (:meth:`_to_binary`), and processes sharing the cache build a program one at a time
        (:func:`~malinn.io.cache.build_lock`): the first builds and stores it, the others load it.

        Raises:
            KernelBuildError: the build failed; the message has the build log and the options.
        """
        if self.is_pocl and tensorflow_loaded():
            raise KernelBuildError(f"building {origin} for {self.name}: {TENSORFLOW_HINT}")
        extra = self.extra_build_options()
        clash = sorted(_defined_names(extra) & _defined_names(options))
        if clash:   # the launch is sized for the kernel's own value: another would compute wrong results
            raise SettingError(f"MALINN_CL_OPTIONS={' '.join(extra)!r} sets {', '.join(clash)}, which {origin} takes "
                               f"from its configuration (its launch is sized for it); choose a configuration with "
                               f"malinn.ops.use(op, codename, config=...) or malinn tune instead")
        options = tuple(options) + extra + self.compiler_defines + QUIET_BUILD_OPTIONS
        digest = hashlib.sha256(source.encode() + b"\0" + "\0".join(options).encode()).hexdigest()
        programs = self.cache.setdefault("programs", {})
        with self.build_lock:
            program = programs.get(digest)
            if program is not None:
                return program
            key = self._binary_key(source, options)
            # of several processes building this program at once, one builds and stores it and the
            # others load it: PoCL's builds of one program in two processes at once race in its
            # kernel cache (a failed build, or a binary without its program.bc)
            with (build_lock("programs", self._build_lock_name(source, options))
                  if key is not None or self.is_pocl else contextlib.nullcontext()):
                program = self._from_binary(key, options)
                if program is None:
                    program = self._build_from_source(source, options, origin)
                    self.count("builds")
                    self._to_binary(key, program)
            programs[digest] = program
            return program

    def _build_from_source(self, source: str, options: tuple, origin: str):
        """A program built from ``source`` with ``options``: quietly (:func:`_build_quietly`)
        where the driver caches builds from source itself (NVIDIA's, PoCL: pyopencl builds them
        uncached too); elsewhere through pyopencl's ``build`` and its cache of builds (Oclgrind's, a
        board's driver), which may warn of a non-empty log.

        Raises:
            KernelBuildError: the build failed; the message has the build log and the options.
        """
        cl = _cl()
        raw = cl._cl._Program(self.context, source) if self.driver_caches_builds else None
        try:
            if raw is None:
                return cl.Program(self.context, source).build(options=list(options))
            log = _build_quietly(raw, self.cl_device, list(options))
        except cl.Error as exc:
            log = _with_files(_build_log(raw, self.cl_device) if raw is not None else str(exc), source)
            raise KernelBuildError(f"building {origin} for {self.name} failed ({status_name(exc)})\n"
                                   f"options: {' '.join(options) or '(none)'}\nbuild log:\n{log}") from exc
        if log:
            _logger.debug("building %s for %s: the compiler said:\n%s", origin, self.name, log)
        return _wrapped(raw, source)

    @property
    def is_pocl(self) -> bool:
        """Whether this is a PoCL device (the CPU here): its compiler is an LLVM that clashes with
        TensorFlow's in one process, and it compiles a kernel again for each work-group size."""
        return POCL_PLATFORM in self.platform

    @property
    def compiler_defines(self) -> tuple:
        """Defines naming the compiler that builds this device's programs, for what OpenCL C 1.2 cannot
        say portably (kernels/device_fence.clh): ``-DNVIDIA_OPENCL=1`` on NVIDIA's platform, whose
        compiler takes PTX inline assembly (its ``mem_fence`` orders memory for the work-group only)."""
        return ("-DNVIDIA_OPENCL=1",) if "NVIDIA" in self.platform.upper() else ()

    def extra_build_options(self) -> tuple:
        """``MALINN_CL_OPTIONS``: OpenCL compiler options (space-separated) added to every build, for
        example ``-cl-opt-disable`` to tell a driver's optimiser from a kernel's arithmetic, or to
        build many programs fast (the test suite's kernel grids on PoCL: tests/conftest.py)."""
        return tuple(os.environ.get("MALINN_CL_OPTIONS", "").split())

    def _binary_key(self, source: str, options) -> dict | None:
        """The full key of a program binary in the cache (``None`` when ``MALINN_BINARY_CACHE=0``)."""
        if not switch("MALINN_BINARY_CACHE", True):
            return None
        return {"source_sha256": hashlib.sha256(source.encode()).hexdigest(), "options": list(options),
                "device": self.name, "vendor": self.vendor, "driver": self.driver_version, "platform": self.platform}

    def _build_lock_name(self, source: str, options) -> str:
        """What names a program to :func:`~malinn.io.cache.build_lock`: the device, the options and the
        source without its comments and spacing, as PoCL's kernel cache tells programs apart (by
        the preprocessed source): two library entries of one source and configuration are one
        program there."""
        text = " ".join(_COMMENTS.sub(" ", source).split())
        return "\0".join([self.platform, self.name, self.driver_version, *options, text])

    def _from_binary(self, key, options):
        """The program loaded from its binary in the cache, or ``None`` (absent, damaged, refused).

        Besides the entry's own checks, a binary for PoCL must pass :func:`pocl_binary_problem`
        before the driver sees it, and is marked in use while the driver loads it
        (:func:`~malinn.io.cache.in_use`): a driver that still crashes on it costs this process only,
        the next one discards it."""
        if key is None:
            return None
        binary = read_entry("programs", key, check=self._check_stored_binary)
        if binary is None:
            return None
        cl = _cl()
        try:
            with in_use("programs", key):
                raw = cl._cl._Program(self.context, [self.cl_device], [binary])
                _build_quietly(raw, self.cl_device, list(options))
            program = _wrapped(raw, None)
        except Exception:  # the driver refuses a verified binary (a driver update): rebuild from source
            return None
        self.count("binary_hits")
        return program

    def _check_stored_binary(self, binary: bytes) -> None:
        """Raises :class:`~malinn.io.cache.DamagedEntry` for a stored binary the driver would crash on
        (one stored by an earlier malinn, before binaries were checked when stored)."""
        problem = pocl_binary_problem(binary) if self.is_pocl else (None if binary else "an empty binary")
        if problem:
            raise DamagedEntry(problem)

    def _to_binary(self, key, program) -> None:
        """Stores ``program``'s binary under ``key`` once it is known to load: the driver's build
        succeeded, the binary is not empty, its bytes pass :func:`pocl_binary_problem` on PoCL, and
        a new program made from it in this process builds and has the same kernels. A binary that
        fails is not stored (the next process builds the program again), nor one whose check a
        process died in before (the driver crashes on its own binaries of this program)."""
        if key is None or users_died("programs", key):
            return
        binary, problem = self._loadable_binary(program, key)
        if problem:
            _logger.debug("not caching a binary for %s: %s", self.name, problem)
            return
        write_entry("programs", key, binary)

    def _loadable_binary(self, program, key) -> tuple:
        """``(binary, None)``, or ``(binary or None, why it would not load in another process)``."""
        cl = _cl()
        try:
            status = program.get_build_info(self.cl_device, cl.program_build_info.STATUS)
            binary = bytes(program.get_info(cl.program_info.BINARIES)[0])
        except Exception as exc:   # a driver without binaries: caching is optional
            return None, f"the driver gives no binary ({exc})"
        return binary, self._binary_problem(binary, status, _kernel_names(program), key)

    def _binary_problem(self, binary: bytes, status, kernels: list, key) -> str | None:
        cl = _cl()
        if status != _CL_BUILD_SUCCESS:
            return f"the driver's build status is {status}, not success"
        if not binary:
            return "the driver's binary is empty"
        if self.is_pocl:
            problem = pocl_binary_problem(binary)
            if problem:
                return problem
        try:
            with in_use("programs", key):   # a crash in here is remembered: the next process stores none
                raw = cl._cl._Program(self.context, [self.cl_device], [binary])
                _build_quietly(raw, self.cl_device, list(key["options"]))
                again = raw.get_build_info(self.cl_device, cl.program_build_info.STATUS)
                loaded = _kernel_names(raw)
        except Exception as exc:   # caching is optional: never a reason for a build to fail
            return f"the driver refuses its own binary ({status_name(exc)})"
        if again != _CL_BUILD_SUCCESS:
            return f"the driver's build of its own binary has status {again}"
        if loaded != kernels:
            return f"the binary's kernels are {loaded}, the program's {kernels}"
        return None

    def render_index(self, layout: Layout, name: str) -> str:
        return opencl_index_macro(layout, name)

    # ---------------------------------------------------------------- launches
    def bind(self, program, function: str, args: list, global_size: tuple, local_size, what: str = "",
             name: str | None = None):
        cl = _cl()
        global_size = tuple(int(g) for g in global_size)
        local_size = tuple(int(v) for v in local_size) if local_size else None
        try:
            kernel = cl.Kernel(program, function)
            kernel.set_args(*args)
        except cl.Error as exc:
            raise DeviceError(f"{what + ': ' if what else ''}setting the arguments of kernel {function} on "
                              f"{self.name} failed ({status_name(exc)})") from exc
        bound = BoundLaunch(name or function, global_size, local_size, kernel, None, what,
                            held=[a for a in args if not isinstance(a, np.generic)])
        bound.enqueue = lambda: self._enqueue_one(bound)
        return bound

    def _enqueue_one(self, launch: BoundLaunch):
        try:
            event = _cl().enqueue_nd_range_kernel(self.queue, launch.handle, launch.global_size, launch.local_size)
        except _cl().Error as exc:
            raise self._launch_error(launch, exc) from exc
        self.counters["launches"] += 1
        return event

    def launch_all(self, launches: list) -> None:
        cl = _cl()
        enqueue, queue = cl.enqueue_nd_range_kernel, self.queue
        for launch in launches:
            try:
                enqueue(queue, launch.handle, launch.global_size, launch.local_size)
            except cl.Error as exc:
                raise self._launch_error(launch, exc) from exc
        self.counters["launches"] += len(launches)

    def run_pass(self, uploads: list, launches: list, downloads: list) -> None:
        """:meth:`Device.run_pass` as pyopencl's calls alone (plain copies, the upload events held
        until the blocking download): what a plain pyopencl program does, the messages of
        :meth:`upload`, :meth:`launch_all` and :meth:`download` made only on a failure."""
        cl = _cl()
        copy, enqueue, queue = cl.enqueue_copy, cl.enqueue_nd_range_kernel, self.queue
        in_flight, doing = [], None
        try:
            for doing in uploads:
                in_flight.append(copy(queue, doing[0], doing[1], is_blocking=False))
            doing = None
            for doing in launches:
                enqueue(queue, doing.handle, doing.global_size, doing.local_size)
            doing = None
            for doing in downloads:
                copy(queue, doing[1], doing[0], is_blocking=True)
        except cl.Error as exc:
            if isinstance(doing, BoundLaunch):
                raise self._launch_error(doing, exc) from exc
            where = "uploading the input" if any(doing is u for u in uploads) else "downloading the output"
            raise DeviceError(f"{where} ({doing[1].nbytes} bytes) {'to' if where[0] == 'u' else 'from'} {self.name} "
                              f"failed ({status_name(exc)})") from exc
        counters = self.counters
        counters["uploads"] += len(uploads)
        counters["launches"] += len(launches)
        counters["downloads"] += len(downloads)
        del in_flight   # complete: the blocking download after them returned

    def _launch_error(self, launch: BoundLaunch, exc) -> DeviceError:
        return DeviceError(f"{launch.what + ': ' if launch.what else ''}kernel {launch.function} failed on "
                           f"{self.name} ({status_name(exc)}); global {launch.global_size}, local {launch.local_size}")


def opencl_index_macro(layout: Layout, name: str) -> str:
    """An OpenCL C macro ``name(r, c, prows, pcols)`` computing :meth:`Layout.index` on the device.

    ``prows`` and ``pcols`` are the padded shape, known only at launch time; the chunk sizes are
    literals, so one built program serves every matrix size.
    """
    body = layout.index_expression(row="((size_t)(R_))", col="((size_t)(C_))")
    return f"#define {name}(R_, C_, P_R, P_C) ((size_t)({body}))"


# -------------------------------------------------------------------- TensorFlow and PoCL
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
    return POCL_PLATFORM in _safe_name(platform) or "pocl" in _safe_attr(platform, "vendor").lower()


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


def skipped_for_tensorflow() -> bool:
    """Whether the last discovery skipped PoCL because TensorFlow is loaded."""
    return _skipped_for_tensorflow


# -------------------------------------------------------------------- discovery
#: what the probes of this process did: ``run`` (the probe kernel ran and passed), ``cached`` (skipped:
#: this device and driver passed it before, :func:`probe_key`)
probe_stats = {"run": 0, "cached": 0}


def probe_key(device: OpenCLDevice) -> dict | None:
    """The key of ``device``'s probe result in the cache (kind ``probes``), ``None`` when
    ``MALINN_PROBE_CACHE=0``: the device's identity (platform, name, vendor, driver version), its
    OpenCL C version, the probe kernel's source and malinn's version. A driver update changes the
    key, so the probe kernel runs again."""
    if not switch("MALINN_PROBE_CACHE", True):
        return None
    return {"identity": device.identity, "opencl_c": device.opencl_c_version, "malinn": __version__,
            "probe_sha256": hashlib.sha256(_PROBE_SOURCE.encode()).hexdigest()}


def probe(cl, platform, cl_device, index) -> OpenCLDevice:
    """Creates a context and queue on ``cl_device`` and runs the probe kernel; raises on failure.

    The probe program goes through :meth:`OpenCLDevice.compile`, so its binary is cached like any
    kernel's and a new process does not compile it again (the device counters start at zero after).
    A device whose driver passed the probe before (same device, driver and malinn: a ``probes``
    entry in the cache folder, :func:`probe_key`) gets its context and queue but no probe kernel:
    a new process starts without building, uploading or launching anything.
    """
    context = cl.Context([cl_device])
    queue = cl.CommandQueue(context, cl_device, properties=cl.command_queue_properties.PROFILING_ENABLE)
    d = cl_device
    version = d.opencl_c_version if hasattr(d, "opencl_c_version") else d.version
    try:
        unified = bool(d.host_unified_memory)
    except Exception:  # removed from OpenCL 3.0 headers on some drivers
        unified = d.type & cl.device_type.CPU != 0
    device = OpenCLDevice(
        backend="opencl", index=index, name=d.name.strip(), platform=platform.name.strip(), vendor=d.vendor.strip(),
        type=_type_name(cl, d.type), compute_units=d.max_compute_units,
        global_memory=d.global_mem_size, max_allocation=d.max_mem_alloc_size,
        max_work_group_size=d.max_work_group_size, max_work_item_sizes=tuple(d.max_work_item_sizes),
        local_memory=d.local_mem_size, image_support=bool(d.image_support),
        image2d_max_size=(d.image2d_max_width, d.image2d_max_height) if d.image_support else (0, 0),
        opencl_c_version=version.strip(), driver_version=d.driver_version.strip(),
        host_unified_memory=unified, cl_device=d, context=context, queue=queue,
        driver_caches_builds=_driver_caches_builds(d))
    key = probe_key(device)
    if key is not None and read_entry("probes", key) == _PROBE_PASSED:
        probe_stats["cached"] += 1
        return device
    x = np.arange(16, dtype=np.float32)
    y = np.empty_like(x)
    xb, yb = device.alloc(x.nbytes, "probe input"), device.alloc(y.nbytes, "probe output")
    program = device.compile(_PROBE_SOURCE, origin="the probe kernel")
    device.upload(xb, x, mapped=False)
    device.bind(program, "malinn_probe", [xb, yb], (16,), None, what="probe")()
    device.download(yb, y, mapped=False)
    if not np.array_equal(y, 2 * x + 1):
        raise DeviceError("the probe kernel ran but returned wrong values")
    device.counters.update({key: 0 for key in device.counters})
    probe_stats["run"] += 1
    if key is not None:
        write_entry("probes", key, _PROBE_PASSED)
    return device


_PROBE_PASSED = b"passed"


def _type_name(cl, bits: int) -> str:
    for name in ("GPU", "CPU", "ACCELERATOR", "CUSTOM"):
        if bits & getattr(cl.device_type, name, 0):
            return name
    return cl.device_type.to_string(bits)


def _safe_name(obj) -> str:
    try:
        return obj.name.strip()
    except Exception:
        return "unnamed"


def _probe_or_warn(cl, platform, cl_device, index, known: dict | None):
    """The probed device at ``index`` (``None``: its probe failed, with a warning), reusing ``known``'s
    result for that index where there is one and recording the new one there."""
    if known is not None and index in known:
        return known[index]
    try:
        device = probe(cl, platform, cl_device, index)
    except Exception as exc:
        warnings.warn(f"malinn: skipping OpenCL device {index[0]}:{index[1]} ({_safe_name(cl_device)} on "
                      f"{_safe_name(platform)}): the probe kernel failed ({status_name(exc)}: {exc})",
                      stacklevel=4)
        device = None
    if known is not None:
        known[index] = device
    return device


def first_gpu(known: dict) -> OpenCLDevice | None:
    """The first working OpenCL GPU in platform then device order, probing only GPUs, and only up to
    it: the default choice of a new process, without a context on every other device.

    Args:
        known: ``{(platform, device): Device or None}``, the probes made so far (read and filled,
            so that a later :func:`discover` with it probes no device twice).

    Returns:
        The device, or ``None`` where no GPU works, TensorFlow is loaded (the full discovery then
        decides, hiding PoCL) or the platforms cannot be listed (the full discovery reports it).
    """
    if tensorflow_loaded():
        return None
    try:
        cl = _cl()
        platforms = cl.get_platforms()
    except Exception:
        return None
    for pi, platform in enumerate(platforms):
        try:
            cl_devices = platform.get_devices()
        except Exception:
            continue
        for di, cl_device in enumerate(cl_devices):
            try:
                gpu = bool(cl_device.type & cl.device_type.GPU)
            except Exception:
                gpu = True    # the probe decides, and warns
            if gpu:
                device = _probe_or_warn(cl, platform, cl_device, (pi, di), known)
                if device is not None and device.kind == "gpu":
                    return device
    return None


def discover(known: dict | None = None) -> list:
    """Every working OpenCL device, probed, in platform then device order (warnings for the rest).

    PoCL is skipped, never loaded, when TensorFlow is loaded in the process (the two cannot share one).

    Args:
        known: ``{(platform, device): Device or None}`` of probes already made in this process
            (:func:`first_gpu`): those devices are reused, not probed again; filled with the new ones.
    """
    global _skipped_for_tensorflow
    _skipped_for_tensorflow = False
    try:
        cl = _cl()
    except ImportError as exc:  # pragma: no cover - pyopencl is a dependency
        warnings.warn(f"malinn: pyopencl cannot be imported ({exc}); no OpenCL device is usable", stacklevel=3)
        return []
    found = []
    tensorflow = tensorflow_loaded()
    try:
        if tensorflow and not _icd_loader_without_pocl(lambda: cl.get_platforms()):
            return []
        platforms = cl.get_platforms()
    except Exception as exc:
        warnings.warn(f"malinn: no OpenCL platform could be listed ({status_name(exc)}: {exc}); "
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
                          f"listed ({status_name(exc)}: {exc})", stacklevel=3)
            continue
        for di, cl_device in enumerate(cl_devices):
            device = _probe_or_warn(cl, platform, cl_device, (pi, di), known)
            if device is not None:
                found.append(device)
    return found
