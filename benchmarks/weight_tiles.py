"""Would batch-1 layers read their weights faster if each work-group's share of them were contiguous?

gemv_split_stream_c (Full CIFAR's batch-1 kernel) reads, per work-group, ROWS = MDIM x VW rows of each
of its K slice's columns: runs of 256 bytes, a column (16 KB) apart. This builds the library's source
three ways, changing only the address of A: as the library reads it (column-major), and with A cut
into ROWS x T tiles (T = KSPLIT x U columns, one work-group step), column-major inside, the tiles
ordered along K first ("tiles R": a work-group's whole slice is one contiguous run) or along M first
("tiles C": a step of all work-groups is one run). Each is checked against numpy (the weights
re-laid out to match), then Full CIFAR's two wide layers (4096x3072 and 3072x4096, batch 1) are timed
one after the other, the variants interleaved (OpenCL profiling events, median of --repeat), beside
a device-to-device copy of 1 GiB in the same run (bytes read plus written per second).

Run:  python3 benchmarks/weight_tiles.py [--repeat 200] [--json out.json]
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

ORIGINAL = "const __global WEIGHT *ak = a + (size_t)(kb + u) * H + rowg + tm * VL;"
TILED = {
    "R": "const __global WEIGHT *ak = a + ((size_t)(rowg / ROWS) * (l / TK) + (kb + u) / TK) * (ROWS * TK)"
         " + ((kb + u) % TK) * ROWS + tm * VL;",
    "C": "const __global WEIGHT *ak = a + ((size_t)((kb + u) / TK) * (H / ROWS) + rowg / ROWS) * (ROWS * TK)"
         " + ((kb + u) % TK) * ROWS + tm * VL;",
}


def relayout(a, rows, tk, order):
    """A (M x K, logical) as the tiled buffer."""
    m, k = a.shape
    t = a.reshape(m // rows, rows, k // tk, tk)          # [ti, r, tj, c]
    if order == "R":
        t = t.transpose(0, 2, 3, 1)                      # [ti][tj][c][r]
    else:
        t = t.transpose(2, 0, 3, 1)                      # [tj][ti][c][r]
    return np.ascontiguousarray(t).ravel()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--json")
    args = parser.parse_args()
    ctx = cl.create_some_context(interactive=False)
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    spec = load_library()["gemv_split_stream_c"]
    d = dict(spec.defines)
    rows, tk = int(d["MDIM"]) * int(d["VW"]), int(d["KSPLIT"]) * int(d["UNROLL"])
    src = spec.program_source({"a": "C", "b": "C", "r": "C"}, opencl_index_macro)
    assert src.count(ORIGINAL) == 1
    options = list(spec.options()) + [f"-DTK={tk}"]
    variants = {"column-major": src}
    for order, line in TILED.items():
        variants[f"tiles {order}"] = src.replace(ORIGINAL, line)
    kernels = {name: cl.Program(ctx, s).build(options=options).gemv_split for name, s in variants.items()}
    mf = cl.mem_flags
    rng = np.random.default_rng(0)
    layers = []
    for m, k in ((4096, 3072), (3072, 4096)):
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal(k, dtype=np.float32)
        bufs = {"column-major": cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.asfortranarray(a).ravel(order="K"))}
        for order in TILED:
            bufs[f"tiles {order}"] = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=relayout(a, rows, tk, order))
        slices = int(d["SLICES"])
        scratch = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR,
                            hostbuf=np.zeros(m // rows + slices * m, np.uint32))
        layers.append(dict(m=m, k=k, a=a, b=b, bufs=bufs, scratch=scratch,
                           bb=cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=b),
                           r=cl.Buffer(ctx, mf.READ_WRITE, m * 4)))
    dummy = cl.Buffer(ctx, mf.READ_ONLY, 4)
    ksplit, vw = int(d["KSPLIT"]), int(d["VW"])

    def launch(name, layer):
        kern = kernels[name]
        m, k = layer["m"], layer["k"]
        kern.set_args(np.uint32(k), np.uint32(m), np.uint32(1), np.uint32(m), np.uint32(1), np.uint32(m),
                      np.uint32(k), np.float32(0), np.float32(0), np.float32(0), np.float32(0),
                      layer["bufs"][name], layer["bb"], layer["r"], dummy, dummy, dummy, layer["scratch"])
        return cl.enqueue_nd_range_kernel(queue, kern, (m // vw, ksplit * slices), (int(d["MDIM"]), ksplit))

    errors = {}
    for name in variants:
        for layer in layers:
            launch(name, layer).wait()
            out = np.empty(layer["m"], np.float32)
            cl.enqueue_copy(queue, out, layer["r"])
            ref = layer["a"].astype(np.float64) @ layer["b"]
            errors.setdefault(name, []).append(float(np.abs(out - ref).max()))
    print("max errors", errors)
    assert max(max(e) for e in errors.values()) < 1e-3, errors
    times = {name: [[], []] for name in variants}
    names = list(variants)
    for i in range(args.repeat):
        order = names[i % len(names):] + names[:i % len(names)]
        for name in order:
            events = [launch(name, layer) for layer in layers]
            events[-1].wait()
            for j, e in enumerate(events):
                times[name][j].append((e.profile.end - e.profile.start) * 1e-3)
    nbytes = 2 ** 30
    src_b, dst_b = cl.Buffer(ctx, mf.READ_WRITE, nbytes), cl.Buffer(ctx, mf.READ_WRITE, nbytes)
    copies = []
    for _ in range(6):
        e = cl.enqueue_copy(queue, dst_b, src_b, byte_count=nbytes)
        e.wait()
        copies.append((e.profile.end - e.profile.start) * 1e-9)
    copy_gbs = 2 * nbytes / np.median(copies[1:]) / 1e9
    result = {"device": ctx.devices[0].name, "driver": ctx.devices[0].driver_version, "repeat": args.repeat,
              "command": "benchmarks/weight_tiles.py " + " ".join(sys.argv[1:]), "copy_gbs": copy_gbs, "errors": errors, "defines": d, "tile": [rows, tk],
              "median_us": {n: [float(np.median(t)) for t in ts] for n, ts in times.items()},
              "p10_us": {n: [float(np.percentile(t, 10)) for t in ts] for n, ts in times.items()}}
    wbytes = sum(layer["m"] * layer["k"] * 4 for layer in layers)
    for n, ts in result["median_us"].items():
        total = sum(ts)
        print(f"{n:<14} {ts[0]:7.2f} {ts[1]:7.2f} us  total {total:7.2f}  = {wbytes / total / 1e3 / copy_gbs:.1%} of copy "
              f"({copy_gbs:.0f} GB/s)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
