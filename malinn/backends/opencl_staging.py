"""Large uploads and downloads at the bus's pace: a ring of page-locked staging slots through which a
plan's input or output moves in chunks, the host's copies overlapping the device's DMA.

A discrete GPU copies page-locked host memory by DMA at the bus's pace (H200: 49-51 GB/s), but a
pageable numpy array at a fraction of it (6-13 GB/s: the driver stages it through buffers of its
own), and a host copy of a whole input into page-locked memory before its upload costs about as
much as the slow upload (one thread: ~1 ms per 10 MB). A :class:`StagingRing` pipelines the two:
the copy threads fill free slots with the next chunks of the caller's array while the device copies
the previous chunks from their slots into the device buffer (non-blocking copies on the plan's
in-order queue, flushed at once); a slot is filled again only once its copy's event has completed.
A download runs the other way: the device copies chunks into slots, the copy threads move each into
the caller's output as soon as it arrives, and a slot is read into again once its chunk is out.

Everything is decided once, when a plan is allocated (:meth:`~.opencl_memory.DeviceMemory.staging_ring`):
the chunk (whole columns of the buffer's matrix view, ``chunk_bytes`` of them at most), the slots and
the copy threads; a run only moves data. A ring serves one buffer layout, so the padded part of
each slot (rows past the features, columns past the samples) is only ever zero. A ring belongs to
its plan and is used under the plan's lock (one pass at a time); the copy threads are the device's,
shared by its rings. A failure mid-pipeline waits for every copy already started (host and device),
so that no slot stays in use, and raises a :class:`~malinn.errors.DeviceError` naming the device and
the sizes.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DeviceError
from .base import size_text
from .opencl_driver import pyopencl_module, status_name

if TYPE_CHECKING:
    import pyopencl

__all__ = ["StagingRing", "copy_threads", "STAGING_CHUNK_BYTES", "STAGING_THREADS"]

#: the most bytes of one chunk: each DMA long against its fixed cost (a few microseconds), the
#: first chunk's host copy (not overlapped) short. On an H200 host 4 MiB beat 2 MiB at every thread
#: count (benchmarks/transfers.py --sweep: 8192 x 640 floats at 17.0 against 15.7 GB/s with 6
#: threads, 18.0 against 16.5 with 4)
STAGING_CHUNK_BYTES = 4 * 1024 * 1024
#: the most host threads that copy chunks: one moves 6-13 GB/s into page-locked memory, the bus ~50;
#: more threads ran no faster there (handing a copy to a thread costs ~70 us: --host-copies)
STAGING_THREADS = 6

_pools_lock = threading.Lock()


def copy_threads(device: Any, threads: int) -> ThreadPoolExecutor:
    """The device's pool of ``threads`` copy threads (made on first use, shared by its rings;
    numpy releases Python's lock while it copies a large array, and pyopencl while it waits)."""
    with _pools_lock:
        pools = device.cache.setdefault("staging_threads", {})
        if threads not in pools:
            pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="malinn-staging")
        return pools[threads]


def default_threads() -> int:
    """Copy threads for a ring: half the host's CPUs (the other half runs the driver and the caller),
    at least 1, at most :data:`STAGING_THREADS`."""
    return max(1, min(STAGING_THREADS, (os.cpu_count() or 2) // 2))


class StagingRing:
    """Page-locked slots through which one buffer of ``columns`` columns of ``rows`` floats (a plan's
    input or output, padding included) moves in chunks of ``chunk`` columns.

    Attributes:
        device: the :class:`~malinn.backends.opencl.OpenCLDevice` (its ``host_array``, name, counters).
        rows: the floats of one column in the buffer (padded); columns: the buffer's columns.
        chunk: columns per chunk; slots: the page-locked arrays, each ``chunk x rows`` floats.
        what: what the buffer holds, for messages.
    """

    def __init__(
        self, device: Any, rows: int, columns: int, chunk_bytes: int, slots: int, threads: int, what: str
    ) -> None:
        self.device, self.rows, self.columns, self.what = device, int(rows), int(columns), what
        most = max(1, int(chunk_bytes) // (4 * self.rows))  # columns of chunk_bytes
        # a quarter of the buffer where that is less (none below 1 MiB): the first chunk's host copy
        # and the last one's DMA are not overlapped
        floor = max(1, (1 << 20) // (4 * self.rows))
        self.chunk = max(1, min(self.columns, most, max(-(-self.columns // 4), floor)))
        count = max(1, min(int(slots), -(-self.columns // self.chunk)))
        self.slots = [device.host_array((self.chunk, self.rows), f"{what}: staging slot") for _ in range(count)]
        self.threads = max(1, int(threads))
        #: per slot, the device copy that last used it (pyopencl's event, which holds the slot's array)
        self.events: list[Any] = [None] * count
        #: per slot, the host copy in flight into or out of it
        self.copies: list[Future[None] | None] = [None] * count

    def describe(self) -> str:
        """``8192 x 640 floats (20.00 MiB) in chunks of 819 columns through 4 slots``."""
        return (
            f"{self.columns} x {self.rows} floats ({size_text(4 * self.columns * self.rows)}) in chunks of "
            f"{self.chunk} columns through {len(self.slots)} staging slots"
        )

    def in_use(self) -> int:
        """How many slots a host or device copy is still using (0 between runs)."""
        complete = pyopencl_module().command_execution_status.COMPLETE  # 0; a failed command's is negative
        return sum(
            (copy is not None and not copy.done()) or (event is not None and event.command_execution_status > complete)
            for event, copy in zip(self.events, self.copies)
        )

    # ---------------------------------------------------------------- host side of a chunk
    def _fill(self, slot: int, start: int, array: np.ndarray, used: int, after: Any) -> None:
        """Copies columns ``start...`` of ``array`` (``used`` columns of ``features`` floats hold data)
        into ``slot``, zeros past ``used``; first waits for ``after`` (the slot's last device copy)."""
        if after is not None:
            after.wait()
        view = self.slots[slot]
        stop = min(start + self.chunk, self.columns)
        data = max(0, min(stop, used) - start)
        features = array.shape[1]
        if data:
            view[:data, :features] = array[start : start + data]
        if data < stop - start:
            view[data : stop - start] = 0

    def _empty(self, slot: int, start: int, out: np.ndarray, event: Any) -> None:
        """Waits for ``event`` (the device's copy of the chunk at ``start`` into ``slot``), then copies
        the chunk's columns into ``out``."""
        event.wait()
        data = min(self.chunk, out.shape[0] - start)
        out[start : start + data] = self.slots[slot][:data, : out.shape[1]]

    # ---------------------------------------------------------------- runs
    def upload(self, queue: pyopencl.CommandQueue, buffer: pyopencl.Buffer, array: np.ndarray) -> None:
        """Enqueues the upload of ``array`` (``used x features`` floats, C-contiguous, ``used`` at most
        :attr:`columns` and ``features`` at most :attr:`rows`) into ``buffer``, every float of the
        buffer written (padding as zeros). Returns once every chunk's device copy is enqueued (the
        last ones may still run: later work on the in-order ``queue`` follows them).

        Raises:
            DeviceError: a host copy or a device copy failed (no slot left in use).
        """
        cl = pyopencl_module()
        pool = copy_threads(self.device, self.threads)
        count, row_bytes = len(self.slots), 4 * self.rows
        starts = range(0, self.columns, self.chunk)
        filling: deque = deque()
        index = 0
        try:
            for index, start in enumerate(starts[:count]):
                filling.append(pool.submit(self._fill, index, start, array, array.shape[0], self.events[index]))
                self.copies[index] = filling[-1]
            for index, start in enumerate(starts):
                slot = index % count
                filling.popleft().result()
                stop = min(start + self.chunk, self.columns)
                self.events[slot] = cl.enqueue_copy(
                    queue,
                    buffer,
                    self.slots[slot][: stop - start],
                    dst_offset=start * row_bytes,
                    is_blocking=False,
                )
                queue.flush()  # the DMA starts now, beside the next chunks' host copies
                if index + count < len(starts):
                    filling.append(
                        pool.submit(self._fill, slot, starts[index + count], array, array.shape[0], self.events[slot])
                    )
                    self.copies[slot] = filling[-1]
        except BaseException as exc:  # an interrupt too: no copy may run on into the next call's
            self.settle()
            if not isinstance(exc, Exception):
                raise
            raise self._failed("uploading", "to", index, exc) from exc
        self._count("uploads")

    def download(self, queue: pyopencl.CommandQueue, buffer: pyopencl.Buffer, out: np.ndarray) -> None:
        """Copies the first ``out.shape[0]`` columns of ``buffer`` (their first ``out.shape[1]``
        floats each) into ``out`` (C-contiguous float32, ``out.shape[0]`` at most :attr:`columns`),
        after everything enqueued before it on ``queue``. Returns once ``out`` holds them.

        Raises:
            DeviceError: a device copy or a host copy failed (no slot left in use).
        """
        cl = pyopencl_module()
        pool = copy_threads(self.device, self.threads)
        count, row_bytes = len(self.slots), 4 * self.rows
        used = out.shape[0]
        index = 0
        try:
            for index, start in enumerate(range(0, used, self.chunk)):
                slot = index % count
                copy = self.copies[slot]
                if copy is not None:
                    copy.result()  # the slot's chunk is out: it takes the next
                stop = min(start + self.chunk, used)
                event = cl.enqueue_copy(
                    queue,
                    self.slots[slot][: stop - start],
                    buffer,
                    src_offset=start * row_bytes,
                    is_blocking=False,
                )
                self.events[slot] = event
                queue.flush()
                self.copies[slot] = pool.submit(self._empty, slot, start, out, event)
            for copy in self.copies:
                if copy is not None:
                    copy.result()
        except BaseException as exc:  # an interrupt too: no copy may run on into the next call's
            self.settle()
            if not isinstance(exc, Exception):
                raise
            raise self._failed("downloading", "from", index, exc) from exc
        self._count("downloads")

    # ---------------------------------------------------------------- failures and counts
    def _failed(self, doing: str, way: str, index: int, exc: Exception) -> DeviceError:
        """The error to raise once no copy uses a slot (:meth:`settle`): the device, the sizes, the
        chunk, the cause."""
        cl = pyopencl_module()
        cause = status_name(exc) if isinstance(exc, cl.Error) else f"{type(exc).__name__}: {exc}"
        return DeviceError(
            f"{doing} {self.what} {way} {self.device.name} failed at chunk {index + 1} of "
            f"{-(-self.columns // self.chunk)} ({self.describe()}): {cause}"
        )

    def settle(self) -> None:
        """Waits until no host or device copy uses a slot (errors of those copies ignored: the
        caller reports the first)."""
        for copy in self.copies:
            if copy is not None:
                copy.cancel()  # one not started yet never starts
        for slot, copy in enumerate(self.copies):
            if copy is not None:
                try:
                    copy.exception()  # waits for it; its error, if any, is the one reported
                except BaseException:  # noqa: BLE001 - cancelled: nothing uses the slot
                    pass
            self.copies[slot] = None
        for event in self.events:
            if event is not None:
                try:
                    event.wait()
                except Exception:  # noqa: BLE001 - a failed copy no longer uses its slot
                    pass

    def _count(self, key: str) -> None:
        with self.device.build_lock:  # rings of several replicas count at once
            self.device.counters[key] += 1
            self.device.counters["staged"] = self.device.counters.get("staged", 0) + 1
