"""What ``predict`` reads, batch by batch, and how it puts the results back together in order.

``x`` is one of Keras's forms:

* the data itself: an array (a memory-mapped ``.npy`` too: ``np.load(path, mmap_mode="r")``), a
  list of arrays or a dict of them by input name: sliced into batches of ``batch_size`` samples,
  each converted to float32 only when its turn comes, so a memory-mapped file larger than memory
  is read a batch at a time;
* an iterable of batches (a generator, ``Dataset.iter_batches()`` of Ray Data, a torch
  ``DataLoader``, any object with ``__iter__`` that is not an array): each item is one batch in
  any of the forms above, or, as Keras unpacks it, a tuple ``(x,)``, ``(x, y)`` or
  ``(x, y, sample_weight)`` whose ``x`` is taken. ``steps`` batches are drawn (all, where None);
  one batch is held at a time (one per device).

Results are written into arrays made once the first batch's output is known (the data's number
of samples known), or kept per batch and joined at the end (an iterable's), never the inputs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sized
from typing import Any

import numpy as np

from .buckets import bucket_floor

__all__ = [
    "ARRAY_PASS_BYTES",
    "SPREAD_PASS_BYTES",
    "STREAM_PASS_BYTES",
    "SHARED_PASS_BYTES",
    "Results",
    "check_batch_size",
    "check_steps",
    "default_step",
    "is_iterable_source",
    "iterable_length",
    "unpack",
]

#: the input bytes of one pass over a memory-mapped array when no ``batch_size`` is given: large
#: enough that a GPU's pass is long beside its launch, small enough that the host's staging copy
#: stays far below a file larger than memory
STREAM_PASS_BYTES = 64 * 2**20
#: the input bytes of one pass over an array in memory when no ``batch_size`` is given: a pass of
#: gigabytes uploads them all before its first kernel and holds an arena as large, and ran slower
#: than passes of hundreds of megabytes (8192 images at 224 x 224 on an H200: MobileNetV2 7,184 and
#: EfficientNetB0 5,728 images/s in passes of thousands, 8,409-8,714 and 6,712-6,982 in passes of
#: 256 and 512 images, 154 and 308 MB: benchmarks/throughput.py --pass-sizes,
#: benchmarks/results/throughput_nvidia_h200_x2.json and throughput_whole_array_pass_nvidia_h200_x2.json, two runs);
#: the largest MLP batch timed (8192 x 3072 floats, 100 MB) stays one pass
ARRAY_PASS_BYTES = 512 * 2**20
#: the same where the passes are spread over several devices: shorter passes, so that the devices'
#: host copies take turns and each device's share ends at about the same time (two H200s: passes of
#: 256 images gave 1.98x and 1.96x one device's images/s at the same passes, passes of 512 1.95x and
#: 1.92x: the same measurement; an earlier run, with a thread per device, gave passes of 1024 1.62x
#: and 1.79x)
SPREAD_PASS_BYTES = 160 * 2**20
#: the activation bytes of one pass when no ``batch_size`` is given, on a device whose memory is the
#: host's (a CPU through PoCL, Mali, Adreno): there a pass's arena is the board's RAM, of which it
#: may have 1 to 8 GB, where a 64 MiB chunk of 28 x 28 images in one pass would hold 1.07 GB in
#: each 28 x 28 x 16 activation; passes of a few hundred images keep such a device as busy
SHARED_PASS_BYTES = 256 * 2**20


def check_batch_size(batch_size: object) -> int | None:
    """``batch_size`` as an int (or None).

    Raises:
        ValueError: it is not a positive integer.
    """
    if batch_size is None:
        return None
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    return int(batch_size)


def check_steps(steps: object) -> int | None:
    """``steps`` as an int (or None).

    Raises:
        ValueError: it is not a positive integer.
    """
    if steps is None:
        return None
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be a positive integer (the batches to draw), got {steps!r}")
    return int(steps)


def is_iterable_source(x: object) -> bool:
    """Whether ``x`` is an iterable of batches (a generator, a data loader) rather than the data
    itself (an array, something numpy reads as one, a list or a dict of them)."""
    if isinstance(x, (np.ndarray, list, tuple, dict, str, bytes)) or np.isscalar(x):
        return False
    if hasattr(x, "__array__") or hasattr(x, "__array_interface__"):  # a torch tensor, a DataFrame
        return False
    return hasattr(x, "__iter__") or hasattr(x, "__next__")


def iterable_length(x: Iterable, steps: int | None) -> int | None:
    """The batches an iterable yields: ``steps``, else (or fewer) its ``len`` where it has one, else None."""
    if not isinstance(x, Sized):  # no __len__
        return steps
    try:
        length = len(x)
    except (TypeError, NotImplementedError):
        return steps
    return length if steps is None else min(steps, length)


def unpack(item: Any) -> Any:
    """The model's input from one item of an iterable, as Keras's ``unpack_x_y_sample_weight``
    takes it: ``x`` of a tuple (or list) ``(x,)``, ``(x, y)`` or ``(x, y, sample_weight)``, else
    the item itself (an array, a dict by input name).

    Raises:
        ValueError: a tuple of more than three items.
    """
    if isinstance(item, list):
        item = tuple(item)
    if not isinstance(item, tuple):
        return item
    if 1 <= len(item) <= 3:
        return item[0]
    raise ValueError(
        f"a batch of an iterable is unpacked as Keras does, (x,), (x, y) or (x, y, sample_weight); "
        f"got a tuple of {len(item)} items: yield (x,) where x is a list of arrays (one per input) or "
        f"a dict by input name"
    )


def default_step(arrays: list, n: int, slots: int, arena_per_sample: int | None = None) -> int:
    """The samples of one pass where ``batch_size`` is None: all ``n`` (one pass) up to
    :data:`ARRAY_PASS_BYTES` of float32 input (:data:`SPREAD_PASS_BYTES` where the ``slots``
    devices are several, each then taking at most an even share), :data:`STREAM_PASS_BYTES` where
    an input is memory-mapped, and where ``arena_per_sample`` is given (a device that shares the
    host's memory: the bytes a pass's activations take per sample) up to :data:`SHARED_PASS_BYTES`
    of activations; a pass cut by those bytes holds a bucket's samples (at most 256, else a multiple
    of 64: :func:`~malinn.model.buckets.bucket_floor`), whose plan pads none (a pass of 278 samples
    ran the plan of 320)."""
    per_sample = max(1, sum(4 * math.prod(a.shape[1:]) for a in arrays))
    if any(isinstance(a, np.memmap) for a in arrays):
        most = STREAM_PASS_BYTES
    else:
        most = SPREAD_PASS_BYTES if slots > 1 else ARRAY_PASS_BYTES
    step = bucket_floor(most // per_sample)  # a pass of a bucket's size: none of its samples padding
    if arena_per_sample:
        step = min(step, bucket_floor(SHARED_PASS_BYTES // arena_per_sample))
    if slots > 1:
        step = min(step, -(-n // slots))
    return max(1, min(step, n))


class Results:
    """The outputs of a prediction, batch by batch, in order.

    Args:
        total: the samples of the whole prediction where known (the outputs are written into arrays
            of that many samples, made at the first batch's result), None for an iterable (each
            batch's outputs kept and joined at the end).
    """

    def __init__(self, total: int | None):
        self.total = total
        self.arrays: list | None = None
        self.parts: dict = {}

    def put(self, index: int, start: int, outputs: list) -> None:
        """Stores batch ``index``'s ``outputs`` (one array per output), its first sample ``start``."""
        if self.total is None:
            self.parts[index] = outputs
            return
        if self.arrays is None:
            self.arrays = [np.empty((self.total,) + y.shape[1:], y.dtype) for y in outputs]
        for out, y in zip(self.arrays, outputs):
            out[start : start + y.shape[0]] = y

    def collect(self, empty: list) -> list:
        """The outputs, one array per output, every batch's in order (``empty``: the shapes' zero-sample
        arrays where no batch ran)."""
        if self.total is not None:
            return self.arrays if self.arrays is not None else empty
        if not self.parts:
            return empty
        ordered = [self.parts[i] for i in sorted(self.parts)]
        self.parts = {}
        if len(ordered) == 1:
            return ordered[0]
        return [np.concatenate(parts, axis=0) for parts in zip(*ordered)]
