"""What every benchmark shares: its command line, the device, timing, the peers and the JSON it writes.

A benchmark script builds its command line with :func:`arguments` (``--device``, ``--quick``,
``--out``, ``--repeat``), opens its devices with :func:`devices`, times with :func:`median_time` or
:func:`interleaved_median_times` (a warm-up, then the median of the repeats), times a peer in the
same run (numpy, :class:`CLBlast`, torch through :func:`torch_cuda`, TensorFlow through
:func:`tensorflow_model_times`) and ends with :func:`save`, which writes
``benchmarks/results/<benchmark>_<device>.json``: the device, its driver, the rows, the command that
made them and whether it was a ``--quick`` run. ``benchmarks/report.py`` writes docs/PERFORMANCE.md
from those files.

Run from the checkout's root (``python benchmarks/models.py``): the script's own folder is then on
``sys.path``, so ``import harness`` finds this module.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import malinn

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


# --- command line and devices -----------------------------------------------------------------------


def arguments(
    description: str, repeat: int | None = None, quick_repeat: int = 3, several_devices: bool = False
) -> argparse.ArgumentParser:
    """The command line every benchmark takes; a script adds its own options to it.

    Args:
        description: the script's docstring (its first line is the summary ``--help`` shows).
        repeat: the default of ``--repeat`` (timed runs, the median counts); None: no such option.
        quick_repeat: the default of ``--repeat`` with ``--quick``.
        several_devices: whether ``--device`` may name several devices, comma-separated.

    Returns:
        An ``argparse.ArgumentParser`` with ``--device``, ``--quick``, ``--out`` (and ``--json``, its
        older name) and, where asked, ``--repeat``.
    """
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--device",
        help="gpu, cpu, P:D, part of a device name, or gl for the OpenGL backend"
        + ("; several, comma-separated (0:0,gl:0), are timed in one run" if several_devices else "")
        + " (default: MALINN_DEVICE, else malinn's default device)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a small run that ends within a minute on a CPU (fewer sizes, networks and repeats)",
    )
    parser.add_argument(
        "--out",
        "--json",
        dest="out",
        metavar="PATH",
        help="where to write the JSON results (default: benchmarks/results/<benchmark>_<device>.json)",
    )
    if repeat is not None:
        parser.add_argument(
            "--repeat",
            type=int,
            help=f"timed runs of each measurement after a warm-up; the "
            f"median counts (default: {repeat}, {quick_repeat} with --quick)",
        )
        parser.set_defaults(default_repeat=repeat, quick_repeat=quick_repeat)
    return parser


def parse(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """``parser``'s arguments, ``--repeat`` filled in from ``--quick`` where it was not given."""
    args = parser.parse_args(argv)
    if hasattr(args, "default_repeat") and args.repeat is None:
        args.repeat = args.quick_repeat if args.quick else args.default_repeat
    return args


def devices(spec: str | None) -> list:
    """The devices ``--device`` names (comma-separated), or the default device alone.

    Raises:
        SystemExit: the same device is named twice.
    """
    names = [s for s in (spec or "").split(",") if s.strip()]
    found = [malinn.set_device(s) for s in names] if names else [malinn.get_device()]
    if len({id(d) for d in found}) < len(found):
        raise SystemExit(f"--device {spec} names one device twice")
    if names:
        malinn.set_device(found[0])
    return found


def device_slug(device) -> str:
    """The device's part of a result's file name: ``nvidia_h200``, ``pocl_cpu``, ``gl_llvmpipe``.

    PoCL's devices are named by their kind (their names are the host CPU's), every other device by
    its name up to a slash or bracket; the OpenGL backend's with ``gl_`` in front.
    """
    info = device.describe()
    if "Portable Computing Language" in info.get("platform", ""):
        base = f"pocl_{device.kind}"
    else:
        base = re.split(r"[/(]", info["name"])[0]
    slug = re.sub(r"[^a-z0-9]+", "_", base.lower()).strip("_") or "device"
    return ("gl_" + slug) if device.backend != "opencl" else slug


def describe(device) -> dict:
    """The device as a result records it: ``Device.describe()`` with its driver's version."""
    return {**device.describe(), "driver": device.driver_version}


# --- timing -----------------------------------------------------------------------------------------


def median_time(fn, repeat: int, warmup: int = 1) -> float:
    """Median wall seconds of ``fn()`` over ``repeat`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


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
        for name in names[i % len(names) :] + names[: i % len(names)]:
            t = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t)
    return {name: float(np.median(values)) for name, values in times.items()}


def block_median_times(fns: dict, repeat: int, blocks: int = 3, warmup: int = 2) -> dict:
    """``{name: median seconds}`` of each function of ``fns`` over ``blocks`` blocks of ``repeat``
    calls each (after ``warmup`` untimed ones per block), the functions' blocks in turn and the order
    turned each round: a drift of the host's clocks or load reaches every function, as in
    :func:`interleaved_median_times`, while consecutive calls stay the same function's. For
    functions that use one GPU through different drivers (malinn's OpenCL, torch's CUDA), whose
    calls alternated one by one pay a switch between the drivers' contexts that neither pays when
    run alone."""
    names = list(fns)
    times = {name: [] for name in names}
    for i in range(blocks):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            for _ in range(warmup):
                fns[name]()
            for _ in range(repeat):
                t = time.perf_counter()
                fns[name]()
                times[name].append(time.perf_counter() - t)
    return {name: float(np.median(values)) for name, values in times.items()}


# --- results ----------------------------------------------------------------------------------------


def result_path(benchmark: str, device, out: str | None = None) -> Path:
    """``out``, else ``benchmarks/results/<benchmark>_<device slug>.json``."""
    return Path(out) if out else RESULTS / f"{benchmark}_{device_slug(device)}.json"


def save(benchmark: str, device, rows: list, args: argparse.Namespace, **fields) -> Path:
    """Writes a benchmark's results as JSON and says where.

    Args:
        benchmark: the result's name, the first part of its file name (``models``, ``gemm_backends``).
        device: the device measured (the first, where a run measured several).
        rows: the measurements.
        args: the parsed command line (``--out``, ``--quick``).
        **fields: anything else the report reads (peers' versions, summaries, further devices).

    Returns:
        The file written: ``{"benchmark", "device", "driver", "host", "quick", "rows", ...fields,
        "command"}``.
    """
    path = result_path(benchmark, device, getattr(args, "out", None))
    path.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": benchmark,
        "device": device.describe(),
        "driver": device.driver_version,
        "host": f"{platform.processor() or platform.machine()}, numpy {np.__version__}",
        "quick": bool(getattr(args, "quick", False)),
        "rows": rows,
        **fields,
        "command": shlex.join(sys.argv),
    }
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return path


# --- peers ------------------------------------------------------------------------------------------

CLBLAST_HINT = "install Debian's libclblast1 (apt-get install libclblast1) or set MALINN_CLBLAST=/path/to/libclblast.so"


class CLBlast:
    """``CLBlastSgemm`` on a pyopencl queue; :meth:`load` says why when the library cannot be used."""

    ROW_MAJOR, NO_TRANSPOSE = 101, 111

    def __init__(self, lib):
        self.lib = lib
        f = lib.CLBlastSgemm
        f.restype = ctypes.c_int
        f.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_size_t,
            ctypes.c_size_t,
            ctypes.c_size_t,
            ctypes.c_float,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_size_t,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_size_t,
            ctypes.c_float,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_void_p,
        ]

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
        except (OSError, AttributeError) as exc:  # not loadable, or no CLBlastSgemm in it
            return None, f"{path} cannot be used ({exc}): {CLBLAST_HINT}"

    def sgemm(self, queue, m, n, k, a, b, c):
        """C (m x n) = A (m x k) B (k x n), all row-major float32 pyopencl buffers."""
        q = ctypes.c_void_p(queue.int_ptr)
        status = self.lib.CLBlastSgemm(
            self.ROW_MAJOR,
            self.NO_TRANSPOSE,
            self.NO_TRANSPOSE,
            m,
            n,
            k,
            1.0,
            a.int_ptr,
            0,
            k,
            b.int_ptr,
            0,
            n,
            0.0,
            c.int_ptr,
            0,
            n,
            ctypes.byref(q),
            None,
        )
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
        timeout: seconds before the subprocess is given up.

    Returns:
        ``{"seconds", "version"}``, or None.
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
