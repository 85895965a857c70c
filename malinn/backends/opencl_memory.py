"""An OpenCL device's memory: buffers, uploads and downloads (mapped in place on devices that share
memory with the host), page-locked staging arrays on discrete GPUs, zeroed buffers and images
(the memory side of :class:`~malinn.backends.opencl.OpenCLDevice`); large inputs and outputs
through a ring of page-locked slots in chunks (:mod:`.opencl_staging`).
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..environment import switch
from ..errors import DeviceError
from .base import ALLOCATION_HINT, size_text
from .opencl_driver import pyopencl_module, status_name
from .opencl_staging import STAGING_CHUNK_BYTES, StagingRing, default_threads

if TYPE_CHECKING:
    import pyopencl

__all__ = ["DeviceMemory", "zero_copy_enabled", "PINNED_MIN_BYTES", "DIRECT_MIN_BYTES", "STAGED_MIN_BYTES"]


class _SharesMemory(Protocol):
    """What :func:`zero_copy_enabled` reads of a device (a :class:`~malinn.backends.base.Device`)."""

    @property
    def host_unified_memory(self) -> bool: ...


def zero_copy_enabled(device: _SharesMemory) -> bool:
    """Whether buffers on ``device`` are host memory mapped in place of copied.

    True on devices that share memory with the host (Mali, Adreno, CPUs), unless
    ``MALINN_ZERO_COPY=0``: buffers are then allocated with ``CL_MEM_ALLOC_HOST_PTR`` and filled
    and read through ``clEnqueueMapBuffer``, so no second copy of the data is made.
    """
    return device.host_unified_memory and bool(switch("MALINN_ZERO_COPY", True))  # never None: its default is True


#: staging arrays below this size stay in pageable memory (see :meth:`OpenCLDevice.host_array`)
PINNED_MIN_BYTES = 64 * 1024
#: from this size, an unpadded input is uploaded from the caller's array: the driver's own pipelined
#: staging of pageable memory beats a host copy into page-locked memory and its DMA (H200: 1.2 MB in
#: 124 us against 127 us; 0.3 MB in 57 us against 44 us: benchmarks/results/transfers_nvidia_h200.json)
DIRECT_MIN_BYTES = 1024 * 1024
#: from this size, a plan's input or output moves in chunks through a ring of page-locked slots, the
#: host's copies overlapping the DMA (:class:`~.opencl_staging.StagingRing`): a pageable upload runs
#: at 6-13 GB/s on the H200, a page-locked one at 45-55 GB/s, one thread's host copy at ~10 GB/s.
#: Below 12 MiB the driver's pageable copy was as fast or faster there (benchmarks/transfers.py,
#: benchmarks/results/transfers_nvidia_h200.json: 6.4 and 8.4 MB at 11.6-11.7 GB/s pageable against
#: 8.9-10.4 through the ring; 12.6 MB at 12.4 against 13.8, 21-26 MB at 13.5-13.6 against 17.9-18.6)
STAGED_MIN_BYTES = 12 * 1024 * 1024

#: the page-locked memory :meth:`DeviceMemory.host_array` gave out, by platform: start address ->
#: end. Host memory a driver pinned through one context is pinned for its other contexts too, so a
#: device uploads another device's page-locked memory directly, as its own (a page-locked input
#: spread over several GPUs), where it would take a pageable array's staging ring
_PAGE_LOCKED: dict[str, dict[int, int]] = {}
_PAGE_LOCKED_LOCK = threading.Lock()


def _forget_page_locked(platform: str, start: int) -> None:
    with _PAGE_LOCKED_LOCK:
        _PAGE_LOCKED.get(platform, {}).pop(start, None)


class DeviceMemory:
    """The memory side of :class:`~malinn.backends.opencl.OpenCLDevice` (a mixin: it reads the
    device's ``context``, ``queue``, ``counters`` and limits)."""

    # what it reads of the device (:class:`~malinn.backends.base.Device`'s and
    # :class:`~malinn.backends.opencl.OpenCLDevice`'s fields)
    name: str
    platform: str
    max_allocation: int
    host_unified_memory: bool
    image_support: bool
    image2d_max_size: tuple
    counters: dict
    cache: dict[str, Any]
    context: pyopencl.Context
    queue: pyopencl.CommandQueue
    #: a staging ring's chunk, at most (bytes), slots and copy threads (:meth:`staging_ring`)
    staging_chunk_bytes: int = STAGING_CHUNK_BYTES
    staging_slots: int = 0  # 0: the copy threads and 2 more (one slot in DMA, one being handed over)
    staging_threads: int = 0  # 0: opencl_staging.default_threads()

    def alloc(self, nbytes: int, what: str) -> pyopencl.Buffer:
        cl = pyopencl_module()
        if nbytes > self.max_allocation:
            raise DeviceError(
                f"{what}: {size_text(nbytes)} exceeds the largest single allocation of "
                f"{self.name} ({size_text(self.max_allocation)}){ALLOCATION_HINT}"
            )
        flags = cl.mem_flags.READ_WRITE | (cl.mem_flags.ALLOC_HOST_PTR if zero_copy_enabled(self) else 0)
        try:
            return cl.Buffer(self.context, flags, max(int(nbytes), 4))
        except cl.Error as exc:
            raise DeviceError(
                f"{what}: allocating {size_text(nbytes)} on {self.name} failed ({status_name(exc)})"
            ) from exc

    def upload(
        self,
        buffer: pyopencl.Buffer,
        array: np.ndarray,
        blocking: bool = True,
        what: str = "data",
        mapped: bool | None = None,
    ) -> pyopencl.Event | None:
        event = self._transfer(buffer, array, True, blocking, mapped, f"uploading {what} ({array.nbytes} bytes) to")
        self.counters["uploads"] += 1
        return event

    def download(
        self,
        buffer: pyopencl.Buffer,
        out: np.ndarray,
        blocking: bool = True,
        what: str = "data",
        mapped: bool | None = None,
    ) -> None:
        self._transfer(buffer, out, False, blocking, mapped, f"downloading {what} ({out.nbytes} bytes) from")
        self.counters["downloads"] += 1

    def _transfer(
        self,
        buffer: pyopencl.Buffer,
        host: np.ndarray,
        to_device: bool,
        blocking: bool,
        mapped: bool | None,
        what: str,
    ) -> pyopencl.Event | None:
        """One copy between ``buffer`` and ``host``: through a mapping on host-unified devices when
        blocking (unless ``mapped`` says otherwise), else a plain copy. Returns a non-blocking copy's
        event (pyopencl's, which waits for the copy when it is freed: the caller holds it until a
        later blocking transfer), else None."""
        cl = pyopencl_module()
        try:
            if blocking and (zero_copy_enabled(self) if mapped is None else mapped):
                flags = cl.map_flags.WRITE_INVALIDATE_REGION if to_device else cl.map_flags.READ
                view, _ = cl.enqueue_map_buffer(
                    self.queue, buffer, flags, 0, (host.size,), host.dtype, is_blocking=True
                )
                try:
                    if to_device:
                        view[...] = host.reshape(-1)
                    else:
                        host.reshape(-1)[...] = view
                finally:
                    view.base.release(self.queue)
                self.counters["zero_copy"] += 1
                return None
            event = cl.enqueue_copy(
                self.queue, *((buffer, host) if to_device else (host, buffer)), is_blocking=blocking
            )
            return None if blocking else event
        except cl.Error as exc:
            raise DeviceError(f"{what} {self.name} failed ({status_name(exc)})") from exc

    def host_array(self, shape: int | tuple[int, ...], what: str = "staging") -> np.ndarray:
        """Page-locked memory on a discrete GPU: a ``CL_MEM_ALLOC_HOST_PTR`` buffer mapped once for
        good (NVIDIA's OpenCL guide: the driver then copies it by DMA, with no staging copy of its
        own); plain memory where the device shares the host's, for less than
        :data:`PINNED_MIN_BYTES` (the driver copies a small pageable array as fast, without a DMA
        setup), or with ``MALINN_PINNED=0``."""
        nbytes = 4 * int(np.prod(shape))
        if not self._pinned(nbytes):
            return np.zeros(shape, np.float32)
        dims = (shape,) if isinstance(shape, int) else tuple(shape)  # Device.host_array takes an int too
        cl = pyopencl_module()
        try:
            buffer = cl.Buffer(self.context, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, max(nbytes, 4))
            view, _ = cl.enqueue_map_buffer(
                self.queue,
                buffer,
                cl.map_flags.READ | cl.map_flags.WRITE,
                0,
                dims,
                np.float32,
                is_blocking=True,
            )
        except cl.Error as exc:
            raise DeviceError(
                f"{what}: allocating {size_text(nbytes)} of page-locked host memory for "
                f"{self.name} failed ({status_name(exc)})"
            ) from exc
        view[...] = 0
        start = view.__array_interface__["data"][0]
        with _PAGE_LOCKED_LOCK:
            _PAGE_LOCKED.setdefault(self.platform, {})[start] = start + nbytes
        weakref.finalize(view, _forget_page_locked, self.platform, start)  # unmapped with the last array on it
        return view  # the mapping keeps the buffer alive as long as the array

    def page_locked(self, array: np.ndarray) -> bool:
        """:meth:`Device.page_locked`: whether ``array`` lies in page-locked memory of
        :meth:`host_array`'s (a slot, a staging array, :func:`malinn.empty_pinned`'s), this
        device's or another's of its platform (:data:`_PAGE_LOCKED`)."""
        if array.base is None:  # memory given out is a view of its mapping, never owned
            return False
        with _PAGE_LOCKED_LOCK:
            regions = _PAGE_LOCKED.get(self.platform)
            if not regions:
                return False
            start = array.__array_interface__["data"][0]
            stop = start + array.nbytes
            return any(begin <= start and stop <= end for begin, end in regions.items())

    def stages_input(self, nbytes: int) -> bool:
        """True where :meth:`host_array` gives page-locked memory and the input is below
        :data:`DIRECT_MIN_BYTES`."""
        return self._pinned(nbytes) and nbytes < DIRECT_MIN_BYTES

    def stages_output(self, nbytes: int) -> bool:
        """True where :meth:`host_array` gives page-locked memory (a discrete GPU's DMA target: an
        output of ``nbytes`` is read into it, then copied out); False where the device shares the
        host's memory or the output is small: the driver's read lands in the caller's array as fast,
        with no second host pass."""
        return self._pinned(nbytes)

    def pads_on_device(self, nbytes: int) -> bool:
        """:meth:`Device.pads_on_device`: True on a discrete GPU (not sharing the host's memory) for
        an input of at least :data:`DIRECT_MIN_BYTES`, which is then uploaded from the caller's array
        (below it an unpadded input is staged anyway: :meth:`stages_input`, and the copy kernel's
        launch would be one more cost); False elsewhere. ``MALINN_DEVICE_PADDING=1`` pads every
        padded input on the device (on any device, of any size: what the tests of the path run on
        PoCL and Oclgrind), ``MALINN_DEVICE_PADDING=0`` none."""
        forced = switch("MALINN_DEVICE_PADDING", None)
        if forced is not None:
            return forced
        return not self.host_unified_memory and nbytes >= DIRECT_MIN_BYTES

    def unpads_on_device(self, nbytes: int) -> bool:
        """:meth:`Device.unpads_on_device`: True on a discrete GPU (not sharing the host's memory) for
        a padded output buffer of at least :data:`PINNED_MIN_BYTES`, the size from which it would be
        read whole into a page-locked staging array (:meth:`stages_output`) and its samples cut out
        by a strided host copy; False elsewhere. ``MALINN_DEVICE_PADDING=1`` unpads every
        padded output on the device (on any device, of any size), ``=0`` none: one switch for
        inputs (:meth:`pads_on_device`) and outputs alike."""
        forced = switch("MALINN_DEVICE_PADDING", None)
        if forced is not None:
            return forced
        return not self.host_unified_memory and nbytes >= PINNED_MIN_BYTES

    def staging_ring(self, shape: tuple[int, int], what: str = "data") -> StagingRing | None:
        """:meth:`Device.staging_ring`: a ring of page-locked slots (:class:`~.opencl_staging.StagingRing`)
        for a buffer laid out as a ``shape`` staging array (columns, padded rows) of at least
        :data:`STAGED_MIN_BYTES` on a discrete GPU (page-locked memory: :meth:`host_array`); None
        elsewhere. ``MALINN_STAGING=1`` gives every buffer a ring (on any device, of any size: what
        the tests of the path run on PoCL), ``MALINN_STAGING=0`` none."""
        forced = switch("MALINN_STAGING", None)
        columns, rows = (int(n) for n in shape)
        nbytes = 4 * rows * columns
        if forced is False or (forced is None and not (self._pinned(nbytes) and nbytes >= STAGED_MIN_BYTES)):
            return None
        threads = self.staging_threads or default_threads()
        return StagingRing(
            self, rows, columns, self.staging_chunk_bytes, self.staging_slots or threads + 2, threads, what
        )

    def _pinned(self, nbytes: int) -> bool:
        return not (self.host_unified_memory or nbytes < PINNED_MIN_BYTES or not switch("MALINN_PINNED", True))

    def fill_zero(self, buffer: pyopencl.Buffer, nbytes: int, what: str = "buffer") -> None:
        cl = pyopencl_module()
        try:  # a copy of zeros: Oclgrind 21.10 takes a clEnqueueFillBuffer'ed buffer for uninitialised
            cl.enqueue_copy(self.queue, buffer, np.zeros(int(nbytes) // 4, np.float32), is_blocking=True)
        except cl.Error as exc:
            raise DeviceError(f"clearing {what} ({nbytes} bytes) on {self.name} failed ({status_name(exc)})") from exc

    def image_from(self, buffer: pyopencl.Buffer, width: int, height: int, what: str = "image") -> pyopencl.Image:
        cl = pyopencl_module()
        if not self.image_support or width > self.image2d_max_size[0] or height > self.image2d_max_size[1]:
            raise DeviceError(
                f"{what}: {self.name} cannot hold a {width}x{height} image "
                f"(image support {self.image_support}, limit {self.image2d_max_size})"
            )
        try:
            image = cl.create_image(
                self.context,
                cl.mem_flags.READ_ONLY,
                cl.ImageFormat(cl.channel_order.RGBA, cl.channel_type.FLOAT),
                shape=(width, height),
            )
            cl.enqueue_copy(self.queue, image, buffer, offset=0, origin=(0, 0), region=(width, height))
        except cl.Error as exc:
            raise DeviceError(
                f"{what}: making a {width}x{height} image on {self.name} failed ({status_name(exc)})"
            ) from exc
        return image

    def finish(self) -> None:
        cl = pyopencl_module()
        try:
            self.queue.finish()
        except cl.Error as exc:
            raise DeviceError(f"{self.name} failed while finishing its queue ({status_name(exc)})") from exc
