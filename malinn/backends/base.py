"""What a backend provides: the interface every device of malinn implements.

A backend is one module under ``malinn/backends/`` and the only importer of its API (``opencl.py``
is the only module of malinn that imports pyopencl). Everything above it — device choice, the
kernel library, the plan, the tuner, the layers — speaks to a :class:`Device` through the methods
below and never to the API itself. ``docs/BACKENDS.md`` says what a new backend must implement.

The contract, in the order a model meets it:

* discovery: ``discover(known)`` (OpenCL) or ``discover(others, force=False)`` (a backend that
  reads the devices found before it) ``-> list[Device]`` in the backend module, each device already
  probed (a tiny kernel built, ran and returned the right values; docs/BACKENDS.md);
* memory: :meth:`Device.alloc`, :meth:`Device.upload`, :meth:`Device.download` (blocking or not);
* programs: :meth:`Device.compile` (source + defines -> program, memoised per device and cached on
  disk as a verified binary where the API allows), :meth:`Device.render_index` (a layout's index
  macro in the kernel language);
* launches: :meth:`Device.bind` sets a kernel's arguments once and returns a zero-argument callable
  that enqueues it, so a compiled plan launches with no per-call argument handling;
  :meth:`Device.run_pass` runs a plan's pass (uploads, launches, downloads) in one call, and
  :meth:`Device.start_pass` / :meth:`Device.wait_pass` in two halves (a pass on each of several
  devices enqueued by one thread, then waited for).
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from ..environment import switch
from ..library.layout import Layout

__all__ = ["Device", "BoundLaunch", "size_text"]


#: what a refused allocation's message suggests
ALLOCATION_HINT = "; a reduced precision (fp16-storage, int8-weights) or a device with more memory may hold it"


def size_text(nbytes: int) -> str:
    """``nbytes`` for a message: ``12.34 MiB``, ``64.0 KiB`` below a MiB (a limit of 64 KiB printed
    as "0 MiB" told the reader nothing)."""
    return f"{nbytes / 2**20:.2f} MiB" if nbytes >= 2**20 else f"{nbytes / 1024:.1f} KiB"


@dataclass(eq=False)
class Device:
    """One working device of some backend, with the caches that belong to it.

    Attributes:
        backend: the backend's name (``"opencl"``).
        index: ``(platform_index, device_index)`` within the backend.
        name, platform, vendor, type: as the driver reports them (type ``"GPU"``, ``"CPU"``, ...).
        compute_units, global_memory, max_allocation, max_work_group_size, max_work_item_sizes,
        local_memory, image_support, image2d_max_size, opencl_c_version, driver_version: the
            driver's figures (memory in bytes); ``opencl_c_version`` is the kernel language version.
        host_unified_memory: whether the device shares memory with the host (Mali, Adreno, CPUs).
        max_loop_iterations: where the driver ends an invocation's loops after so many iterations
            in all (llvmpipe), that number: a kernel that would loop longer is not chosen, or is
            refused when bound (``loop_iterations`` in kernels/library.json); else None.
        counters: uploads, downloads, launches, builds, binary_hits (for tests and reports).
        cache: per-device memo of programs and kernels (``"programs"``, ...), owned by the device.
        lock: held while a command sequence is enqueued (one in-order queue per device).
        plan_lock: held while a plan is made and allocated for this device (its kernels bound, its
            weights uploaded): one plan at a time per device, while planned models predict.
    """

    backend: str
    index: tuple
    name: str
    platform: str
    vendor: str
    type: str
    compute_units: int
    global_memory: int
    max_allocation: int
    max_work_group_size: int
    max_work_item_sizes: tuple
    local_memory: int
    image_support: bool
    image2d_max_size: tuple
    opencl_c_version: str
    driver_version: str
    host_unified_memory: bool
    #: the loop iterations after which the driver silently ends a shader invocation's loops
    #: (llvmpipe: 65535, measured by the GL probe); None where nothing ends them
    max_loop_iterations: int | None = None
    #: whether a further plan of one model on this device (a replica: the device listed twice in
    #: ``predict``'s ``devices``) passes its data on a queue of its own (:meth:`stream`), so that one
    #: pass's copies run while another's kernels compute: the backend's probe decides (OpenCL: on a
    #: discrete GPU, whose copy engines work beside its compute units, unless ``MALINN_OVERLAP=0``)
    overlap_queues: bool = False
    counters: dict = field(
        repr=False,
        default_factory=lambda: {
            "uploads": 0,
            "downloads": 0,
            "launches": 0,
            "builds": 0,
            "binary_hits": 0,
            "zero_copy": 0,
        },
    )
    cache: dict = field(repr=False, default_factory=dict)
    lock: AbstractContextManager[Any] = field(repr=False, default_factory=threading.RLock)
    plan_lock: threading.RLock = field(repr=False, default_factory=threading.RLock)

    # ---------------------------------------------------------------- identity
    @property
    def identity(self) -> str:
        """The one string that names this device and its driver, for every cache and setting."""
        return f"{self.backend}|{self.platform}|{self.name}|{self.vendor}|{self.driver_version}"

    @property
    def extensions(self) -> tuple:
        """The device's extensions (``cl_khr_fp16``, ...); a backend that reports none offers none."""
        return ()

    @property
    def kind(self) -> str:
        """``"gpu"``, ``"cpu"`` or ``"accelerator"``: the class used to pick default kernels."""
        return "gpu" if "GPU" in self.type else "cpu" if "CPU" in self.type else "accelerator"

    def describe(self) -> dict:
        """The device's figures as a plain dict (what ``malinn devices`` prints)."""
        return {
            "index": f"{self.index[0]}:{self.index[1]}",
            "backend": self.backend,
            "name": self.name,
            "platform": self.platform,
            "type": self.type,
            "compute_units": self.compute_units,
            "global_memory_mib": self.global_memory // 2**20,
            "max_allocation_mib": self.max_allocation // 2**20,
            "opencl_c_version": self.opencl_c_version,
        }

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # a backend's device is a dataclass too, whose decorator would give it a repr of every
        # field (twenty of them, a screenful for print(malinn.devices())): it keeps this short one
        super().__init_subclass__(**kwargs)
        cls.__repr__ = Device.__repr__  # type: ignore[method-assign]  # replacing the method is the point

    def __repr__(self) -> str:
        """``<Device 0:0 'pthread-skylake-avx512-AMD EPYC' CPU opencl>``: index, name, type, backend."""
        return f"<Device {self.index[0]}:{self.index[1]} {self.name!r} {self.type} {self.backend}>"

    def __str__(self) -> str:
        """The line ``malinn devices`` prints: ``[0:0] name (CPU, platform): 2 compute units, ...``."""
        d = self.describe()
        return (
            f"[{d['index']}] {self.name} ({self.type}, {self.platform}): {self.compute_units} compute units, "
            f"{d['global_memory_mib']} MiB global memory, {d['max_allocation_mib']} MiB max allocation, "
            f"{self.opencl_c_version}"
        )

    def count(self, key: str, amount: int = 1) -> None:
        """Adds to ``counters[key]`` under the device's lock."""
        with self.lock:
            self.counters[key] = self.counters.get(key, 0) + amount

    # ---------------------------------------------------------------- memory (backends implement)
    def alloc(self, nbytes: int, what: str) -> Any:
        """A read-write device buffer of ``nbytes`` (DeviceError on failure, naming ``what``)."""
        raise NotImplementedError

    def upload(
        self, buffer: Any, array: np.ndarray, blocking: bool = True, what: str = "data", mapped: bool | None = None
    ) -> Any:
        """Copies the C-contiguous ``array`` into the start of ``buffer``.

        ``mapped``: write through a mapping of the buffer (``None``: where the device shares memory
        with the host and the call blocks); a plan's per-call uploads use plain copies, which cost
        the driver less per call.

        Returns:
            For a copy that ``blocking=False`` left in flight, an object the caller keeps (with
            ``array``) until a later blocking transfer on the device has returned (pyopencl's event
            waits for its copy when it is freed); else ``None``.
        """
        raise NotImplementedError

    def download(
        self, buffer: Any, out: np.ndarray, blocking: bool = True, what: str = "data", mapped: bool | None = None
    ) -> None:
        """Copies the start of ``buffer`` into the C-contiguous host array ``out`` (``mapped`` as for upload)."""
        raise NotImplementedError

    def host_array(self, shape: int | tuple[int, ...], what: str = "staging") -> np.ndarray:
        """A zeroed float32 host array of ``shape`` that the device copies to and from fastest, for
        data transferred on every call (a plan's input and output staging). This default is plain
        memory; a backend whose driver copies page-locked memory directly (without staging it
        through a buffer of its own) returns such memory."""
        return np.zeros(shape, np.float32)

    def stages_input(self, nbytes: int) -> bool:
        """Whether an input of ``nbytes`` that fills its device buffer exactly (no padding) is copied
        into :meth:`host_array` memory before its upload (True), or uploaded from the caller's array
        as it is (False). This default: False, the staging array being plain memory too."""
        return False

    def page_locked(self, array: np.ndarray) -> bool:
        """Whether ``array`` lies in page-locked host memory this device gave out
        (:meth:`host_array`): a full pass uploads such an input by one DMA, at the bus's pace, with no
        host copy. This default: False."""
        return False

    def stages_output(self, nbytes: int) -> bool:
        """Whether an output of ``nbytes`` whose samples fill the start of its device buffer (no
        padded features) is read into :meth:`host_array` memory and copied out (True), or read
        straight into the array returned to the caller (False). This default: False, the staging
        array being plain memory too."""
        return False

    def pads_on_device(self, nbytes: int) -> bool:
        """Whether a plan's input of ``nbytes`` (unpadded) whose kernels read it from a padded buffer
        (rows padded to a kernel's tile, samples to its columns) is uploaded as the caller's array is
        laid out, into a buffer of its own, and copied into the padded buffer by a kernel on the
        device that zeroes the padding (True: the upload direct, or one DMA from page-locked memory),
        rather than copied on the host into a staging array laid out as the padded buffer (False).
        Pays where the device copies far faster than the host (a discrete GPU: >1 TB/s against one
        host thread's 6-13 GB/s). Decided once, when the plan is compiled. This default: False,
        unless ``MALINN_DEVICE_PADDING=1`` forces it (what the tests of the path run on CPUs and
        OpenGL)."""
        return bool(switch("MALINN_DEVICE_PADDING", False))

    def unpads_on_device(self, nbytes: int) -> bool:
        """Whether a plan's output whose buffer of ``nbytes`` pads its features (a 10-unit head's
        result in rows padded to a kernel's tile) is copied by a kernel on the device into an
        unpadded buffer of its own (the caller's array as laid out), which the download then reads
        (True: only the caller's floats move, and no strided host copy cuts them out), rather than
        read whole into a staging array laid out as the padded buffer and cut on the host (False).
        Pays where the device copies far faster than the host and its reads cost by the byte (a
        discrete GPU). Decided once, when the plan is compiled. This default: False, unless
        ``MALINN_DEVICE_PADDING=1`` forces it (the one switch of both directions: :meth:`pads_on_device`)."""
        return bool(switch("MALINN_DEVICE_PADDING", False))

    def staging_ring(self, shape: tuple[int, int], what: str = "data") -> Any:
        """How a plan moves a buffer laid out as a ``shape`` staging array (columns, padded rows) on
        every call: None, as one copy through :meth:`host_array` memory (this default); or a ring of
        page-locked slots whose ``upload(queue, buffer, array)`` and ``download(queue, buffer, out)``
        move it in chunks, the host's copies overlapping the device's (a backend whose discrete GPU
        copies page-locked memory several times faster than pageable memory). Decided once, when the
        plan is allocated."""
        return None

    def fill_zero(self, buffer: Any, nbytes: int, what: str = "buffer") -> None:
        """Sets the first ``nbytes`` of ``buffer`` to zero on the device (no host copy)."""
        raise NotImplementedError

    def image_from(self, buffer: Any, width: int, height: int, what: str = "image") -> Any:
        """An RGBA float image of ``width x height`` texels copied from ``buffer`` (for image operands)."""
        raise NotImplementedError

    def finish(self) -> None:
        """Waits until everything enqueued on the device has finished."""
        raise NotImplementedError

    # ---------------------------------------------------------------- programs
    def compile(self, source: str, options: tuple = (), origin: str = "<source>") -> Any:
        """A built program for ``source`` and ``options``, memoised (KernelBuildError with the log)."""
        raise NotImplementedError

    def extra_build_options(self) -> tuple:
        """Options this backend's compiler adds to every build (its ``compile`` adds them; caches of
        built programs key on them); none unless the backend reads some from its environment."""
        return ()

    def build(self, source: str, options: tuple = (), origin: str = "<source>") -> Any:
        """Same as :meth:`compile` (the name of malinn 0.1)."""
        return self.compile(source, options, origin)

    def render_index(self, layout: Layout, name: str) -> str:
        """A macro ``name(r, c, prows, pcols)`` giving the memory index of element ``(r, c)``."""
        raise NotImplementedError

    # ---------------------------------------------------------------- launches
    def bind(
        self,
        program: Any,
        function: str,
        args: list,
        global_size: tuple,
        local_size: tuple | None,
        what: str = "",
        name: str | None = None,
    ) -> BoundLaunch:
        """A :class:`BoundLaunch` of ``function`` with ``args`` set once (``name``, the kernel's name
        in messages: its codename in the library; default ``function``)."""
        raise NotImplementedError

    def launch_all(self, launches: list) -> None:
        """Enqueues ``launches`` (a list of :class:`BoundLaunch`) in order, as a plan runs them."""
        raise NotImplementedError

    def stream(self, replica: int = 0) -> tuple[Any, AbstractContextManager[Any]]:
        """The queue and the lock that the passes of a plan for ``replica`` use (see
        :meth:`~malinn.model.model.PlannedModel.plan`): here, and for replica 0 on every backend,
        the device's own queue (None: the backend's one) and :attr:`lock`, so that passes run one
        after another. A backend whose copies can run beside its kernels gives a further replica a
        queue of its own."""
        return None, self.lock

    def run_pass(self, uploads: list, launches: list, downloads: list, queue: Any = None) -> None:
        """One pass of a plan, the caller holding :attr:`lock` (or the lock of ``queue``'s
        :meth:`stream`; None: the device's own queue): ``uploads`` (``(buffer, array)``,
        non-blocking), ``launches`` in order, then ``downloads`` (``(buffer, array)``, the last one
        blocking: every array holds its data when this returns). A backend may override it with a
        tighter sequence of the same calls (``predict``'s path: OpenCL's costs a few microseconds
        less per call than these wrappers)."""
        in_flight = [
            self.upload(buffer, array, blocking=False, what="the input", mapped=False) for buffer, array in uploads
        ]
        self.launch_all(launches)
        for buffer, array in downloads:
            self.download(buffer, array, blocking=True, what="the output", mapped=False)
        del in_flight  # complete: the blocking download after them returned

    def start_pass(self, uploads: list, launches: list, downloads: list, queue: Any = None) -> Any:
        """:meth:`run_pass` in two halves, so that one thread keeps several devices busy at once:
        this enqueues the pass and returns what :meth:`wait_pass` takes, once the caller has
        started the others. Here (a backend with no copies of its own in flight) the pass runs
        whole and None is returned; the caller holds the same lock until :meth:`wait_pass`."""
        self.run_pass(uploads, launches, downloads, queue)
        return None

    def wait_pass(self, started: Any) -> None:
        """Waits for the pass that :meth:`start_pass` returned ``started`` for: every download's
        array holds its data when this returns."""


class BoundLaunch:
    """A kernel with its arguments set, enqueued by calling it (returns the backend's event).

    Attributes:
        function: the kernel's name in messages (its library codename); global_size, local_size: its range.
        handle: the backend's kernel object, arguments set (what :meth:`Device.launch_all` enqueues).
        enqueue: a zero-argument callable that enqueues this one launch and returns its event.
        held: the buffers its arguments name, kept alive as long as the launch: a driver need not
            retain a buffer it was given as an argument, and a layer drops its weight copy when its
            weights change while a plan bound to that copy may still run (PoCL aborted the process).
    """

    __slots__ = ("function", "global_size", "local_size", "handle", "enqueue", "what", "held")
    #: a zero-argument callable; a backend that makes the launch with None sets it right after
    enqueue: Any

    def __init__(
        self,
        function: str,
        global_size: tuple,
        local_size: tuple | None,
        handle: Any,
        enqueue: Callable[[], Any] | None,
        what: str = "",
        held: Iterable = (),
    ):
        self.function, self.global_size, self.local_size = function, global_size, local_size
        self.handle, self.enqueue, self.what, self.held = handle, enqueue, what, tuple(held)

    def __call__(self) -> Any:
        return self.enqueue()

    def __repr__(self) -> str:
        return f"BoundLaunch({self.function}, global {self.global_size}, local {self.local_size})"
