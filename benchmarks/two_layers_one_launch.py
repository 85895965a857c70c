"""What Full CIFAR's two batch-1 layers would cost in one launch: the bound a fused launch could reach.

Times gemv_split_stream_c (the library's source and configuration) on 4096x3072 and on 3072x4096 at
batch 1, one launch each (what a plan runs), and on 7168x3584, the same bytes of weights in one launch
with no dependency between its halves (what no real fusion can beat: the second layer needs all of
the first's result). Each is checked against numpy; OpenCL profiling events, median of --repeat,
interleaved; a device-to-device copy of 1 GiB in the same run (bytes read plus written per second).

Run:  python3 benchmarks/two_layers_one_launch.py [--repeat 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import pyopencl as cl  # noqa: E402

from malinn.backends.opencl import opencl_index_macro  # noqa: E402
from malinn.kernel_library import load_library  # noqa: E402

#: (units, inputs): Full CIFAR's two wide layers, then their weights' bytes as one layer
LAYERS = [(4096, 3072), (3072, 4096), (7168, 3584)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--json")
    args = parser.parse_args()
    ctx = cl.create_some_context(interactive=False)
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    spec = load_library()["gemv_split_stream_c"]
    d = {k: int(v) for k, v in spec.defines}
    src = spec.program_source({"a": "C", "b": "C", "r": "C"}, opencl_index_macro)
    kernel = cl.Kernel(cl.Program(ctx, src).build(options=list(spec.options())), "gemv_split")
    mf = cl.mem_flags
    rng = np.random.default_rng(0)
    rows = d["MDIM"] * d["VW"]
    layers = []
    for m, k in LAYERS:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal(k, dtype=np.float32)
        layers.append(dict(m=m, k=k, a=a, b=b,
                           weights=cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(a.T)),
                           scratch=cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR,
                                             hostbuf=np.zeros(m // rows + d["SLICES"] * m, np.uint32)),
                           x=cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=b),
                           r=cl.Buffer(ctx, mf.READ_WRITE, m * 4)))
    dummy = cl.Buffer(ctx, mf.READ_ONLY, 4)

    def launch(layer):   # the arguments "lhwmnHWpppp", then a, b, r, bias, scale, shift, scratch
        m, k = layer["m"], layer["k"]
        kernel.set_args(np.uint32(k), np.uint32(m), np.uint32(1), np.uint32(m), np.uint32(1), np.uint32(m),
                        np.uint32(k), *[np.float32(0)] * 4, layer["weights"], layer["x"], layer["r"], dummy, dummy,
                        dummy, layer["scratch"])
        return cl.enqueue_nd_range_kernel(queue, kernel, (m // d["VW"], d["KSPLIT"] * d["SLICES"]),
                                          (d["MDIM"], d["KSPLIT"]))

    errors = []
    for layer in layers:
        launch(layer).wait()
        out = np.empty(layer["m"], np.float32)
        cl.enqueue_copy(queue, out, layer["r"])
        want = layer["a"].astype(np.float64) @ layer["b"]
        errors.append(float(np.abs(out - want).max() / np.abs(want).max()))
    assert max(errors) < 1e-5, errors
    times = [[] for _ in layers]
    for i in range(args.repeat):
        for j in (range(len(layers)) if i % 2 else reversed(range(len(layers)))):
            event = launch(layers[j])
            event.wait()
            times[j].append((event.profile.end - event.profile.start) * 1e-3)
    nbytes = 2 ** 30
    src_b, dst_b = cl.Buffer(ctx, mf.READ_WRITE, nbytes), cl.Buffer(ctx, mf.READ_WRITE, nbytes)
    copies = []
    for _ in range(6):
        event = cl.enqueue_copy(queue, dst_b, src_b, byte_count=nbytes)
        event.wait()
        copies.append((event.profile.end - event.profile.start) * 1e-9)
    copy_gbs = 2 * nbytes / np.median(copies[1:]) / 1e9
    us = [float(np.median(t)) for t in times]
    weights = 4 * LAYERS[0][0] * LAYERS[0][1] * 2
    two, one = us[0] + us[1], us[2]
    print(f"{ctx.devices[0].name}: copy {copy_gbs:.0f} GB/s (read + written)")
    print(f"two launches: {us[0]:.2f} + {us[1]:.2f} = {two:.2f} us, weights at {weights / two / 1e3 / copy_gbs:.1%} of the copy")
    print(f"one launch:   {one:.2f} us, at {weights / one / 1e3 / copy_gbs:.1%} of the copy")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": ctx.devices[0].name, "driver": ctx.devices[0].driver_version, "copy_gbs": copy_gbs,
            "defines": d, "errors": errors, "layers": LAYERS, "median_us": us, "two_launches_us": two,
            "one_launch_us": one, "repeat": args.repeat,
            "command": "benchmarks/two_layers_one_launch.py " + " ".join(sys.argv[1:])}, indent=1))


if __name__ == "__main__":
    main()
