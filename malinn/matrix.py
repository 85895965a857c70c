"""Device matrices (Rovder 4.5 Mirrorable, 5.1 CLMatrix).

A :class:`DeviceMatrix` is a logical ``rows x cols`` float32 matrix that lives on the host, on a
device, or both. On the device it is a flat buffer in a layout, zero-padded to a padded shape.
Data moves only when asked: :meth:`DeviceMatrix.in_layout` uploads (laying the host data out
directly in the wanted layout) or re-lays out on the device; :meth:`DeviceMatrix.numpy` downloads.
"""

from __future__ import annotations

import os

import numpy as np

from .device import Device, _cl, cl_status_name
from .errors import DeviceError, LayoutError
from .layout import Layout, parse_layout

__all__ = ["DeviceMatrix", "allocate"]


def _count(device: Device, key: str) -> None:
    """Adds one to ``device.counters[key]`` (under the device's lock: predict may run in threads)."""
    with device._lock:
        device.counters[key] = device.counters.get(key, 0) + 1


def zero_copy(device: Device) -> bool:
    """Whether buffers on ``device`` are host memory mapped in place of copied.

    True on devices that share memory with the host (Mali, Adreno, CPUs), unless
    ``MALINN_ZERO_COPY=0``: buffers are then allocated with ``CL_MEM_ALLOC_HOST_PTR`` and filled
    and read through ``clEnqueueMapBuffer``, so no second copy of the data is made.
    """
    return device.host_unified_memory and os.environ.get("MALINN_ZERO_COPY", "1") != "0"


def allocate(device: Device, nbytes: int, what: str):
    """Allocates a read-write device buffer, turning OpenCL failures into :class:`DeviceError`."""
    cl = _cl()
    if nbytes > device.max_allocation:
        raise DeviceError(f"{what}: {nbytes / 2**20:.1f} MiB exceeds the largest single allocation of "
                          f"{device.name} ({device.max_allocation / 2**20:.0f} MiB)")
    flags = cl.mem_flags.READ_WRITE | (cl.mem_flags.ALLOC_HOST_PTR if zero_copy(device) else 0)
    try:
        return cl.Buffer(device.context, flags, max(nbytes, 4))
    except cl.Error as exc:
        raise DeviceError(f"{what}: allocating {nbytes / 2**20:.1f} MiB on {device.name} failed "
                          f"({cl_status_name(exc)})") from exc


class DeviceMatrix:
    """A logical 2-D float32 matrix with an optional host copy and an optional device copy.

    Attributes:
        shape: the logical ``(rows, cols)``.
        device: the :class:`Device` holding the buffer, or ``None`` while host-only.
        layout: the buffer's :class:`Layout` (``None`` while host-only).
        padded: the buffer's padded ``(rows, cols)``.
        buffer: the ``pyopencl.Buffer`` (``None`` while host-only).
    """

    def __init__(self, shape, *, host=None, device=None, layout=None, padded=None, buffer=None):
        self.shape = (int(shape[0]), int(shape[1]))
        self.host = host
        self.device = device
        self.layout = parse_layout(layout) if layout is not None else None
        self.padded = tuple(padded) if padded is not None else None
        self.buffer = buffer
        self.image = None   # the buffer as an image2d, made by kernels that read their operand so

    def __repr__(self) -> str:
        where = f"on {self.device.name} as {self.layout} padded to {self.padded}" if self.buffer is not None else "host only"
        return f"DeviceMatrix({self.shape[0]}x{self.shape[1]}, {where})"

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_host(cls, array) -> "DeviceMatrix":
        """Wraps a 2-D host array; nothing is uploaded until a layout is asked for."""
        array = np.asarray(array, dtype=np.float32)
        if array.ndim != 2:
            raise LayoutError(f"a DeviceMatrix is 2-D; got an array of shape {array.shape}")
        return cls(array.shape, host=array)

    @classmethod
    def empty(cls, device: Device, shape, layout, padded, what: str = "result") -> "DeviceMatrix":
        """Allocates an uninitialised device matrix (a kernel will write every padded element)."""
        layout = parse_layout(layout)
        layout.check_padded(padded)
        buffer = allocate(device, 4 * padded[0] * padded[1], f"{what} {shape[0]}x{shape[1]} in {layout}")
        return cls(shape, device=device, layout=layout, padded=padded, buffer=buffer)

    @classmethod
    def upload(cls, device: Device, array, layout, padded=None, what: str = "matrix") -> "DeviceMatrix":
        """Lays ``array`` out on the host in ``layout`` and copies it to ``device``."""
        layout = parse_layout(layout)
        array = np.asarray(array, dtype=np.float32)
        padded = tuple(padded) if padded is not None else layout.padded_shape(*array.shape)
        matrix = cls.upload_flat(device, layout.pack(array, padded), array.shape, layout, padded, what)
        matrix.host = array
        return matrix

    @classmethod
    def upload_flat(cls, device: Device, flat, shape, layout, padded, what: str = "matrix") -> "DeviceMatrix":
        """Copies a buffer that is already laid out (``layout``, ``padded``) to ``device``."""
        cl = _cl()
        flat = np.ascontiguousarray(flat, dtype=np.float32).reshape(-1)
        if flat.size != padded[0] * padded[1]:
            raise LayoutError(f"{what}: a buffer of {flat.size} elements is not {padded[0]}x{padded[1]}")
        matrix = cls.empty(device, shape, layout, padded, what)
        try:
            if zero_copy(device):
                mapped, _ = cl.enqueue_map_buffer(device.queue, matrix.buffer, cl.map_flags.WRITE_INVALIDATE_REGION,
                                                  0, flat.shape, np.float32, is_blocking=True)
                mapped[...] = flat
                mapped.base.release(device.queue)
                _count(device, "zero_copy")
            else:
                cl.enqueue_copy(device.queue, matrix.buffer, flat, is_blocking=True)
        except cl.Error as exc:
            raise DeviceError(f"uploading {what} {tuple(shape)} to {device.name} failed ({cl_status_name(exc)})") from exc
        _count(device, "uploads")
        return matrix

    # ---------------------------------------------------------------- movement
    def matches(self, device: Device, layout: Layout, padded) -> bool:
        """Whether the device copy is already on ``device`` in ``layout`` with ``padded``."""
        return (self.buffer is not None and self.device is device and self.layout == layout
                and self.padded == tuple(padded))

    def in_layout(self, device: Device, layout, padded) -> "DeviceMatrix":
        """This matrix on ``device`` in ``layout`` with ``padded`` shape.

        Returns ``self`` when it already is; uploads straight into the layout when only the host
        copy exists; otherwise re-lays out on the device (no host round trip).
        """
        layout = parse_layout(layout)
        padded = tuple(padded)
        if self.matches(device, layout, padded):
            return self
        if self.buffer is None or self.device is not device:
            return DeviceMatrix.upload(device, self.numpy(), layout, padded)
        from .ops import relayout  # ops depends on this module

        return relayout(self, layout, padded)

    def numpy(self) -> np.ndarray:
        """The logical matrix on the host, downloading it if only the device copy is current."""
        if self.host is not None:
            return self.host
        cl = _cl()
        size = self.padded[0] * self.padded[1]
        try:
            if zero_copy(self.device):   # read the result where it lies; unpack copies what we keep
                mapped, _ = cl.enqueue_map_buffer(self.device.queue, self.buffer, cl.map_flags.READ, 0, (size,),
                                                  np.float32, is_blocking=True)
                try:
                    host = self.layout.unpack(mapped, self.shape, self.padded)
                    # unpack returns a view when nothing moves (R, no padding): keep no view of the map
                    self.host = host.copy() if np.shares_memory(host, mapped) else host
                finally:
                    mapped.base.release(self.device.queue)
                _count(self.device, "zero_copy")
            else:
                flat = np.empty(size, dtype=np.float32)
                cl.enqueue_copy(self.device.queue, flat, self.buffer, is_blocking=True)
                self.host = self.layout.unpack(flat, self.shape, self.padded)
        except cl.Error as exc:
            raise DeviceError(f"downloading a {self.shape} result from {self.device.name} failed "
                              f"({cl_status_name(exc)})") from exc
        _count(self.device, "downloads")
        return self.host

    def invalidate_host(self) -> None:
        """Marks the host copy (and an image made from the buffer) stale after a kernel wrote it."""
        if self.buffer is not None:
            self.host = None
            self.image = None
