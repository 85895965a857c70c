"""``malinn predict`` of a ``.npy`` larger than memory: the input read in chunks, each predicted and
appended to the output ``.npy`` as it comes (the header written with the first chunk's output
shape), the next chunk read while the device computes. Memory holds two input chunks and one
chunk's outputs, whatever the file's size; the output is a temporary file renamed into place at
the end (:func:`malinn.io.files.write_file`), so an error or Ctrl-C leaves nothing half-written.
"""

from __future__ import annotations

import math
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

import numpy as np

from ..environment import switch
from ..errors import MalinnError
from ..io.files import write_file
from ..model.progbar import ProgressBar

__all__ = ["CHUNK_BYTES", "npy_layout", "stream_predict"]

#: the input bytes read per chunk (a chunk of at least one --batch-size, and a whole number of them)
CHUNK_BYTES = 64 * 2**20


def npy_layout(path: str | os.PathLike) -> tuple | None:
    """``(shape, dtype, offset)`` of a ``.npy`` file whose samples can be read in chunks: a
    regular file of numbers in C order, format 1.0 or 2.0, at least one sample; else None (the
    whole-file reader then reads it, and says what is wrong with it).

    Raises:
        MalinnError: the header declares more data than the file holds.
    """
    fmt = np.lib.format
    try:
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as f:
            version = fmt.read_magic(f)
            read = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}.get(version)
            if read is None:
                return None
            shape, fortran, dtype = read(f)
            offset = f.tell()
            size = os.fstat(f.fileno()).st_size
    except (OSError, ValueError, SyntaxError, EOFError, TypeError):
        return None
    if (
        fortran
        or dtype.hasobject
        or dtype.kind not in "biuf"
        or dtype.fields is not None
        or not shape
        or any(d < 0 for d in shape)
        or shape[0] == 0
    ):
        return None
    nbytes = math.prod(shape) * dtype.itemsize
    if size - offset < nbytes:
        raise MalinnError(
            f"{path}: truncated: the header declares shape {shape} of {dtype} ({nbytes} bytes of data), "
            f"the file has {max(0, size - offset)}"
        )
    return shape, dtype, offset


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _chunk_samples(sample_bytes: int, batch_size: int | None) -> int:
    """Samples per chunk: :data:`CHUNK_BYTES` of input, a whole number of ``batch_size`` (at least one)."""
    samples = max(1, CHUNK_BYTES // max(1, sample_bytes))
    if batch_size:
        samples = max(batch_size, samples // batch_size * batch_size)
    return samples


def stream_predict(
    model: Any,
    src: str | os.PathLike,
    dst: str | os.PathLike,
    layout: tuple,
    batch_size: int | None,
    devices: list | None = None,
    source: str | os.PathLike | tuple | None = None,
    overwrite_source: bool = False,
) -> tuple:
    """Predicts the ``.npy`` ``src`` (its ``layout`` from :func:`npy_layout`) chunk by chunk into the
    ``.npy`` ``dst``, with a progress bar on stderr (``MALINN_PROGRESS=0`` silences it).

    Args:
        model: a model of one input and one output.
        src: the input file; dst: the output file (written atomically).
        layout: ``(shape, dtype, offset)`` of ``src``.
        batch_size: samples per device pass (None: each chunk in one pass).
        devices: the devices to spread each chunk's passes over (None: the current choice).
        source, overwrite_source: as :func:`malinn.io.files.write_file` takes them.

    Returns:
        ``(input shape, output shape)``.

    Raises:
        MalinnError: the input cannot be read or ends early; what ``predict`` raises for a chunk
            (the output is not written then).
    """
    shape, dtype, offset = layout
    n, sample = shape[0], tuple(shape[1:])
    chunk = min(n, _chunk_samples(math.prod(sample) * dtype.itemsize, batch_size))
    steps = -(-n // chunk)
    # a bar on a terminal; elsewhere (a log) its last line, where the input spans several chunks
    verbose = (
        1
        if switch("MALINN_PROGRESS", True) and sys.stderr is not None and (steps > 1 or _is_terminal(sys.stderr))
        else 0
    )
    bar = ProgressBar(steps, verbose, stream=sys.stderr)
    out_shape = [None]

    def write(out: IO[bytes]) -> None:
        with open(src, "rb") as f, ThreadPoolExecutor(1, thread_name_prefix="malinn-read") as reader:
            f.seek(offset)
            buffers = [np.empty((chunk,) + sample, dtype) for _ in range(min(2, steps))]

            def read(i: int) -> np.ndarray:
                count = min(chunk, n - i * chunk)
                buffer = buffers[i % len(buffers)][:count]
                view = buffer.reshape(-1).view(np.uint8).data
                done = 0
                while done < len(view):
                    got = f.readinto(view[done:])
                    if not got:
                        raise MalinnError(
                            f"{src}: ended after {offset + i * chunk * buffer[0].nbytes + done} bytes, "
                            f"before the {n} samples its header declares"
                        )
                    done += got
                return buffer

            pending = reader.submit(read, 0)
            for i in range(steps):
                x = pending.result()
                if i + 1 < steps:
                    pending = reader.submit(read, i + 1)  # the next chunk read while this one runs
                y = model.predict(x, batch_size=batch_size, verbose=0, devices=devices)
                if i == 0:
                    out_shape[0] = (n,) + y.shape[1:]
                    header = {
                        "descr": np.lib.format.dtype_to_descr(y.dtype),
                        "fortran_order": False,
                        "shape": out_shape[0],
                    }
                    try:
                        np.lib.format.write_array_header_1_0(out, header)
                    except ValueError:  # a header longer than format 1.0 holds
                        np.lib.format.write_array_header_2_0(out, header)
                out.write(np.ascontiguousarray(y).data.cast("B"))
                del x, y
                bar.update(i + 1, finalize=i + 1 == steps)

    write_file(dst, write, source=source, overwrite_source=overwrite_source)
    return shape, out_shape[0]
