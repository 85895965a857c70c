"""Page-locked host memory for inputs: :func:`empty_pinned`.

A discrete GPU copies page-locked host memory by DMA at the bus's pace (H200: ~52 GB/s), but a
pageable numpy array at a fraction of it: the driver, or malinn's staging ring, first copies it into
page-locked memory of their own (6-13 and 15-34 GB/s there). An input a caller builds in
:func:`empty_pinned` memory skips that copy: a plan uploads a full pass of it by one DMA (the way
``torch.Tensor.pin_memory`` serves torch). Filling it (reading a data set's next batch into it) is
the one host copy left, and one the caller makes anyway.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .base import Device
from .selection import get_device

__all__ = ["empty_pinned"]


def empty_pinned(shape: int | tuple[int, ...], dtype: Any = "float32", device: Device | None = None) -> np.ndarray:
    """A zero-filled float32 array in ``device``'s page-locked host memory.

    A model's ``predict`` (or call) of a whole batch held in such an array uploads it by one DMA,
    where the plan's input buffer is laid out as the array is (no padded features), instead of
    through a host copy into staging memory. Where the device has no page-locked memory (it shares
    the host's: CPUs, Mali, Adreno; the OpenGL backends), or ``MALINN_PINNED=0``, or for less than
    64 KiB, it is a plain numpy array, and predict takes it as any other.

    Args:
        shape: the array's shape, e.g. ``(8192, 784)`` for a batch of 8192 samples of 784 features.
        dtype: float32, the dtype plans take.
        device: whose page-locked memory (default: the current device).

    Returns:
        The array (C-contiguous); the memory stays page-locked as long as it or a view of it lives.

    Raises:
        ValueError: ``dtype`` is not float32, or ``shape`` has a negative size.
        DeviceError: the driver could not allocate the memory.
    """
    if np.dtype(dtype) != np.float32:
        raise ValueError(f"empty_pinned: dtype {np.dtype(dtype)} is not float32, the dtype a plan's inputs take")
    dims = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"empty_pinned: shape {dims} has a negative size")
    device = device or get_device()
    if math.prod(dims) == 0:
        return np.zeros(dims, np.float32)
    return device.host_array(dims, "malinn.empty_pinned")
