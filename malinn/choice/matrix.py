"""Device matrices (Rovder 4.5 Mirrorable, 5.1 CLMatrix): what a kernel argument holds.

A :class:`DeviceMatrix` is a logical ``rows x cols`` float32 matrix that lives on the host, on a
device, or both. On the device it is a flat buffer in a layout, zero-padded to a padded shape.
Data moves only when asked: :meth:`DeviceMatrix.upload` lays the host data out in a layout and
copies it; :meth:`DeviceMatrix.numpy` downloads. Re-laying out on the device is an op
(:func:`malinn.ops.to_layout`). Any backend's device serves: only its memory interface is used.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backends.base import Device
from ..errors import LayoutError
from ..library.layout import Layout, parse_layout

__all__ = ["DeviceMatrix"]


class DeviceMatrix:
    """A logical 2-D float32 matrix with an optional host copy and an optional device copy.

    Attributes:
        shape: the logical ``(rows, cols)``.
        device: the :class:`~malinn.backends.base.Device` holding the buffer, or ``None`` while host-only.
        layout: the buffer's :class:`Layout` (``None`` while host-only).
        padded: the buffer's padded ``(rows, cols)``.
        buffer: the backend's buffer (``None`` while host-only).
        image: the buffer as an image, made by kernels that read their operand through textures.
        precision: how the buffer stores the values (``fp32``; a weight matrix may be uploaded in a
            reduced precision, :meth:`upload_weights`, and then only a kernel in that precision reads it).
    """

    def __init__(
        self,
        shape: tuple,
        *,
        host: np.ndarray | None = None,
        device: Device | None = None,
        layout: Layout | str | None = None,
        padded: tuple | None = None,
        buffer: Any = None,
    ):
        self.shape = (int(shape[0]), int(shape[1]))
        self.host = host
        self.device = device
        self.layout = parse_layout(layout) if layout is not None else None
        self.padded = tuple(int(p) for p in padded) if padded is not None else None
        self.buffer = buffer
        self.image = None
        self.precision = "fp32"

    def __repr__(self) -> str:
        where = (
            f"on {self.device.name} as {self.layout} padded to {self.padded}"
            if self.buffer is not None and self.device is not None
            else "host only"
        )
        return f"DeviceMatrix({self.shape[0]}x{self.shape[1]}, {where})"

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_host(cls, array: Any) -> "DeviceMatrix":
        """Wraps a 2-D host array; nothing is uploaded until a layout is asked for."""
        array = np.asarray(array, dtype=np.float32)
        if array.ndim != 2:
            raise LayoutError(f"a DeviceMatrix is 2-D; got an array of shape {array.shape}")
        return cls(array.shape, host=array)

    @classmethod
    def empty(
        cls, device: Device, shape: tuple, layout: Layout | str, padded: tuple, what: str = "result"
    ) -> "DeviceMatrix":
        """Allocates an uninitialised device matrix (a kernel will write every padded element)."""
        layout = parse_layout(layout)
        layout.check_padded(padded)
        buffer = device.alloc(4 * padded[0] * padded[1], f"{what} {shape[0]}x{shape[1]} in {layout}")
        return cls(shape, device=device, layout=layout, padded=padded, buffer=buffer)

    @classmethod
    def upload(
        cls, device: Device, array: Any, layout: Layout | str, padded: tuple | None = None, what: str = "matrix"
    ) -> "DeviceMatrix":
        """Lays ``array`` out on the host in ``layout`` and copies it to ``device``."""
        layout = parse_layout(layout)
        array = np.asarray(array, dtype=np.float32)
        padded = tuple(padded) if padded is not None else layout.padded_shape(*array.shape)
        matrix = cls.upload_flat(device, layout.pack(array, padded), array.shape, layout, padded, what)
        matrix.host = array
        return matrix

    @classmethod
    def upload_flat(
        cls, device: Device, flat: np.ndarray, shape: tuple, layout: Layout | str, padded: tuple, what: str = "matrix"
    ) -> "DeviceMatrix":
        """Copies a buffer that is already laid out (``layout``, ``padded``) to ``device``."""
        flat = np.ascontiguousarray(flat, dtype=np.float32).reshape(-1)
        if flat.size != padded[0] * padded[1]:
            raise LayoutError(f"{what}: a buffer of {flat.size} elements is not {padded[0]}x{padded[1]}")
        matrix = cls.empty(device, shape, layout, padded, what)
        with device.lock:
            device.upload(matrix.buffer, flat, blocking=True, what=f"{what} {tuple(shape)}")
        return matrix

    @classmethod
    def upload_weights(
        cls,
        device: Device,
        flat: np.ndarray,
        shape: tuple,
        layout: Layout | str,
        padded: tuple,
        precision: str,
        what: str = "weights",
    ) -> "DeviceMatrix":
        """Copies a weight buffer already in ``precision`` (:func:`malinn.library.precision.device_bytes`)
        to ``device``; the matrix has no host copy (its values are not float32)."""
        if precision == "fp32":
            return cls.upload_flat(device, flat, shape, layout, padded, what)
        layout = parse_layout(layout)
        layout.check_padded(padded)
        flat = np.ascontiguousarray(flat).reshape(-1)
        buffer = device.alloc(flat.nbytes, f"{what} {shape[0]}x{shape[1]} in {layout} ({precision})")
        with device.lock:
            device.upload(buffer, flat, blocking=True, what=f"{what} {tuple(shape)} ({precision})")
        matrix = cls(shape, device=device, layout=layout, padded=padded, buffer=buffer)
        matrix.precision = precision
        return matrix

    # ---------------------------------------------------------------- state
    def matches(self, device: Device, layout: Layout | str, padded: tuple) -> bool:
        """Whether the device copy is already on ``device`` in ``layout`` with ``padded``."""
        return (
            self.buffer is not None
            and self.device is device
            and self.layout == parse_layout(layout)
            and self.padded == tuple(padded)
        )

    def numpy(self) -> np.ndarray:
        """The logical matrix on the host, downloading it if only the device copy is current."""
        if self.host is not None:
            return self.host
        if self.precision != "fp32":
            raise LayoutError(f"a {self.shape} matrix stored in {self.precision} has no float32 copy to download")
        if self.device is None or self.layout is None or self.padded is None:
            raise LayoutError(f"a {self.shape} matrix has neither a host copy nor a device copy")
        flat = np.empty(self.padded[0] * self.padded[1], dtype=np.float32)
        with self.device.lock:
            self.device.download(self.buffer, flat, blocking=True, what=f"a {self.shape} result")
        self.host = self.layout.unpack(flat, self.shape, (self.padded[0], self.padded[1]))
        return self.host

    def invalidate_host(self) -> None:
        """Marks the host copy (and an image made from the buffer) stale after a kernel wrote it."""
        if self.buffer is not None:
            self.host = None
            self.image = None
