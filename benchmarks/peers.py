"""Peers timed beside malinn in the same run: numpy, CLBlast (ctypes), cuBLAS (torch), TensorFlow.

CLBlast is Debian's libclblast1 (``apt-get install libclblast1``; or ``$MALINN_CLBLAST``, a path to a
libclblast.so), called through ctypes on malinn's own pyopencl queue and buffers; without it that peer
is skipped with a message saying so. TensorFlow runs in a subprocess: it cannot share
a process with PoCL (see docs/CONVERTING.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def median_time(fn, repeat: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def write_results(path, device, rows: list, **fields) -> None:
    """Writes ``{"device", "driver", "rows", ...fields, "command"}`` as JSON to ``path`` (its folder
    made): a benchmark's results beside the command that made them."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"device": device.describe(), "driver": device.driver_version, "rows": rows,
                                      **fields, "command": shlex.join(sys.argv)}, indent=2) + "\n")


def interleaved_median_times(fns: dict, repeat: int, warmup: int = 1) -> dict:
    """``{name: median seconds}`` of each function of ``fns``, timed in turn within each of ``repeat``
    rounds (the order turned each round): every function meets the same moments of the machine, so
    a drift of its clocks or a neighbour's load moves them all, not one side of a ratio."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times = {name: [] for name in names}
    for i in range(repeat):
        for name in names[i % len(names):] + names[:i % len(names)]:
            t = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t)
    return {name: float(np.median(values)) for name, values in times.items()}


CLBLAST_HINT = "install Debian's libclblast1 (apt-get install libclblast1) or set MALINN_CLBLAST=/path/to/libclblast.so"


class CLBlast:
    """``CLBlastSgemm`` on a pyopencl queue; :meth:`load` says why when the library cannot be used."""

    ROW_MAJOR, NO_TRANSPOSE = 101, 111

    def __init__(self, lib):
        self.lib = lib
        f = lib.CLBlastSgemm
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t,
                      ctypes.c_float, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                      ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_float,
                      ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                      ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]

    @classmethod
    def load(cls):
        """The library, found as ``$MALINN_CLBLAST`` or the system's libclblast.

        Returns:
            ``(CLBlast, None)``, or ``(None, reason)`` when it is missing or cannot be loaded.
        """
        path = os.environ.get("MALINN_CLBLAST") or ctypes.util.find_library("clblast")
        if not path:
            return None, f"libclblast not found: {CLBLAST_HINT}"
        try:
            return cls(ctypes.CDLL(path)), None
        except (OSError, AttributeError) as exc:   # not loadable, or no CLBlastSgemm in it
            return None, f"{path} cannot be used ({exc}): {CLBLAST_HINT}"

    def sgemm(self, queue, m, n, k, a, b, c):
        """C (m x n) = A (m x k) B (k x n), all row-major float32 pyopencl buffers."""
        q = ctypes.c_void_p(queue.int_ptr)
        status = self.lib.CLBlastSgemm(self.ROW_MAJOR, self.NO_TRANSPOSE, self.NO_TRANSPOSE, m, n, k, 1.0,
                                       a.int_ptr, 0, k, b.int_ptr, 0, n, 0.0, c.int_ptr, 0, n,
                                       ctypes.byref(q), None)
        if status != 0:
            raise RuntimeError(f"CLBlastSgemm returned status {status}")


def torch_cuda():
    """The torch module when a CUDA GPU is usable (TF32 off), else None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def tensorflow_model_times(model_code: str, x_shape, repeat: int, timeout: int = 600) -> dict | None:
    """Median seconds of TensorFlow-cpu ``model(x)`` in a subprocess (TensorFlow never shares a
    process with PoCL), or None where TensorFlow is missing or fails.

    Args:
        model_code: Python that builds ``model`` with ``tf`` imported (and ``np``).
        x_shape: the input's shape, batch first (uniform random float32 values).
        repeat: timed runs; the median counts.
    """
    code = f"""
import os, time, json, numpy as np
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
import tensorflow as tf
{model_code}
x = np.random.default_rng(0).random({tuple(x_shape)!r}, dtype=np.float32)
model(x)
times = []
for _ in range({repeat}):
    t = time.perf_counter(); model(x).numpy(); times.append(time.perf_counter() - t)
print(json.dumps({{"seconds": float(np.median(times)), "version": tf.__version__}}))
"""
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def tensorflow_times(widths, batch, repeat) -> dict | None:
    """Median seconds of TensorFlow-cpu ``model(x)`` for a ReLU MLP of ``widths``, in a subprocess."""
    code = f"""widths = {list(widths)}
layers = [tf.keras.Input((widths[0],))] + [tf.keras.layers.Dense(w, activation="relu" if i < len(widths) - 2 else None)
                                           for i, w in enumerate(widths[1:])]
model = tf.keras.Sequential(layers)"""
    return tensorflow_model_times(code, (batch, widths[0]), repeat)
