"""gemv_split_stream_c launched by hand on one batch-1 layer: for probes that change its source or its
weights' layout (weight_tiles.py, two_layers_one_launch.py), outside any plan.

:class:`StreamLayer` holds a random ``m x k`` layer's weights (laid out as ``layout`` returns them), its
input, result and scratch buffers on a malinn OpenCL device; :meth:`StreamLayer.launch` runs a program
built from the library's source (:func:`build`, optionally edited) and returns its event;
:meth:`StreamLayer.error` checks the result against numpy.
"""

from __future__ import annotations

import argparse

import numpy as np
import pyopencl as cl
from models import copy_bandwidth

import malinn
from malinn.backends.opencl import opencl_index_macro
from malinn.library.kernel_library import load_library

SPEC = load_library()["gemv_split_stream_c"]
DEFINES = {k: int(v) for k, v in SPEC.defines}
ROWS = DEFINES["MDIM"] * DEFINES["VW"]   # rows of a work-group's tile


def probe_arguments(doc: str, argv=None, repeat: int = 200):
    """A probe's command line (``--device``, ``--repeat``, ``--json``, described by ``doc``): the
    parsed arguments and the malinn device they name."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--device", help="an OpenCL device: gpu, P:D or part of a name (default: malinn's default)")
    parser.add_argument("--repeat", type=int, default=repeat, help=f"timed launches of each (default: {repeat})")
    parser.add_argument("--json", metavar="PATH", help="also write the results, as JSON, to PATH")
    args = parser.parse_args(argv)
    return args, (malinn.set_device(args.device) if args.device else malinn.get_device())


def build(device, edit=lambda source: source, extra_options=()):
    """The gemv_split kernel of gemv_split_stream_c, its source passed through ``edit``."""
    source = edit(SPEC.program_source({"a": "C", "b": "C", "r": "C"}, opencl_index_macro))
    program = cl.Program(device.context, source).build(options=list(SPEC.options()) + list(extra_options))
    return cl.Kernel(program, "gemv_split")


class StreamLayer:
    """A random ``m x k`` Dense layer at batch 1 on ``device`` (weights as ``layout(a)`` lays them out:
    column-major by default, the library's layout)."""

    def __init__(self, device, m: int, k: int, rng, layout=lambda a: np.ascontiguousarray(a.T)):
        self.device, self.m, self.k = device, m, k
        self.a = rng.standard_normal((m, k), dtype=np.float32)
        self.x = rng.standard_normal(k, dtype=np.float32)
        flags = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
        self.weights = cl.Buffer(device.context, flags, hostbuf=layout(self.a))
        self.input = cl.Buffer(device.context, flags, hostbuf=self.x)
        self.result = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 4 * m)
        self.scratch = cl.Buffer(device.context, flags, hostbuf=np.zeros(m // ROWS + DEFINES["SLICES"] * m, np.uint32))
        self.unused = cl.Buffer(device.context, cl.mem_flags.READ_ONLY, 4)   # bias, scale, shift: not read

    def launch(self, kernel, extra=()):
        """Enqueues ``kernel`` on this layer (arguments "lhwmnHWpppp", then a, b, r, bias, scale,
        shift, scratch, then ``extra``); returns the event."""
        m, k = np.uint32(self.m), np.uint32(self.k)
        kernel.set_args(k, m, np.uint32(1), m, np.uint32(1), m, k, *[np.float32(0)] * 4, self.weights, self.input,
                        self.result, self.unused, self.unused, self.unused, self.scratch, *extra)
        return cl.enqueue_nd_range_kernel(self.device.queue, kernel,
                                          (self.m // DEFINES["VW"], DEFINES["KSPLIT"] * DEFINES["SLICES"]),
                                          (DEFINES["MDIM"], DEFINES["KSPLIT"]))

    def error(self, kernel, extra=()) -> float:
        """Max error of one launch's result against numpy (float64), relative to the largest value."""
        self.launch(kernel, extra).wait()
        got = np.empty(self.m, np.float32)
        cl.enqueue_copy(self.device.queue, got, self.result)
        want = self.a.astype(np.float64) @ self.x
        return float(np.abs(got - want).max() / np.abs(want).max())


def event_us(event) -> float:
    """An event's device time in microseconds."""
    return (event.profile.end - event.profile.start) * 1e-3


def record_pair(times: tuple, one, two) -> None:
    """Appends two finished launches' device times to ``times`` (first's, second's, and the span from
    the first's start to the second's end, each in microseconds)."""
    times[0].append(event_us(one))
    times[1].append(event_us(two))
    times[2].append((two.profile.end - one.profile.start) * 1e-3)


def pair_medians(times: tuple) -> list:
    """Medians of :func:`record_pair`'s times: first, second, their sum, span (microseconds)."""
    first, second, span = times
    return [float(np.median(first)), float(np.median(second)), float(np.median(np.add(first, second))),
            float(np.median(span))]


def copy_and_weights(device, layers, note: str) -> tuple:
    """A device-to-device copy's bandwidth (GB/s, bytes read plus written) and the fp32 weights'
    bytes of ``layers`` ((units, inputs) pairs); prints the bandwidth and ``note``."""
    copy_gbs = copy_bandwidth(device) / 1e9
    print(f"{device.name}: copy {copy_gbs:.0f} GB/s (read + written); {note}")
    return copy_gbs, 4 * sum(m * k for m, k in layers)
