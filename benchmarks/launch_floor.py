"""What a launch costs in device time before it reads a byte, beside torch (CUDA) on the same GPU.

A batch-1 Dense layer streams its weights once, so its kernel time is ``fixed + bytes / rate``. The
fixed part decides how much a narrower precision or one launch fewer can gain. This
script measures both parts on one device, in one run:

* OpenCL (profiling events, each launch after a kernel that reads --flush-mib MiB, so the data is
  cold as in a network): an empty kernel of one item, an empty kernel of 4096 work-groups of 256, a
  4 KiB buffer copy, an empty kernel queued right behind a 12.5 MB stream (as a network's next layer
  is), and a streaming read (float4 loads, one sum per item) of each --sizes MB;
  ``fixed`` and ``rate`` are the least-squares line through the streaming reads of 4 MB and more.
* torch (when CUDA is there): the same streaming read as ``torch.sum`` and a matrix times a vector
  (cuBLAS) of each --gemv shape in float32, float16 and (weights only) bfloat16, timed with CUDA
  events around each call (its launch included, as an OpenCL event's start-to-end is not), after
  the same flush.

Run:  python3 benchmarks/launch_floor.py [--device D] [--repeat 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

import numpy as np
import pyopencl as cl

import malinn

SOURCE = """
__kernel void nothing(__global float *x) { }
__kernel void stream(__global const float4 *x, const uint n4, __global float *out)
{
    float4 s = (float4)(0.0f);
    for (uint i = get_global_id(0); i < n4; i += get_global_size(0))
        s += x[i];
    out[get_global_id(0)] = s.x + s.y + s.z + s.w;
}
"""


#: the stream an empty kernel is queued behind (a network's 12.5 MB layer)
CHAINED_BYTES = 12_500_000


def line(sizes_bytes, seconds):
    """Least-squares ``seconds = fixed + bytes / rate``: (fixed seconds, rate in bytes per second)."""
    slope, fixed = np.polyfit(np.asarray(sizes_bytes, float), np.asarray(seconds, float), 1)
    return float(fixed), float(1.0 / slope)


def opencl_figures(device, sizes_mb, flush_mib, repeat):
    ctx, queue = device.context, device.queue
    program = cl.Program(ctx, SOURCE).build()
    nothing, stream = cl.Kernel(program, "nothing"), cl.Kernel(program, "stream")
    flush_n4 = flush_mib * 2**20 // 16
    biggest = max(int(s * 1e6) for s in sizes_mb)
    mf = cl.mem_flags
    data = cl.Buffer(ctx, mf.READ_WRITE, max(biggest, flush_n4 * 16 * 2, CHAINED_BYTES))   # every stream below fits
    cl.enqueue_fill_buffer(queue, data, np.float32(1.0), 0, data.size).wait()
    items = device.compute_units * 2048
    out = cl.Buffer(ctx, mf.READ_WRITE, 4 * items)
    small_src, small_dst = cl.Buffer(ctx, mf.READ_WRITE, 4096), cl.Buffer(ctx, mf.READ_WRITE, 4096)

    def flush():
        stream.set_args(data, np.uint32(flush_n4), out)
        cl.enqueue_nd_range_kernel(queue, stream, (items,), (256,))

    def timed(enqueue):
        times = []
        for _ in range(repeat + 1):
            flush()
            event = enqueue()
            event.wait()
            times.append((event.profile.end - event.profile.start) * 1e-9)
        return float(np.median(times[1:]))

    def run_stream(nbytes):
        n4 = nbytes // 16
        stream.set_args(data, np.uint32(n4), out)
        global_items = min(items, -(-n4 // 256) * 256)
        return cl.enqueue_nd_range_kernel(queue, stream, (global_items,), (256,))

    nothing.set_args(out)
    figures = {
        "empty_1_item_s": timed(lambda: cl.enqueue_nd_range_kernel(queue, nothing, (1,), (1,))),
        "empty_4096_groups_s": timed(lambda: cl.enqueue_nd_range_kernel(queue, nothing, (4096 * 256,), (256,))),
        "copy_4kib_s": timed(lambda: cl.enqueue_copy(queue, small_dst, small_src, byte_count=4096)),
        "stream": [{"mb": s, "s": timed(lambda s=s: run_stream(int(s * 1e6)))} for s in sizes_mb],
    }
    fit = [r for r in figures["stream"] if r["mb"] >= 4]
    fixed, rate = line([r["mb"] * 1e6 for r in fit], [r["s"] for r in fit])
    figures.update(fixed_s=fixed, rate_gbs=rate / 1e9)
    # an empty kernel queued right behind a 12.5 MB stream, as a network's next layer is: its event
    chained = []
    for _ in range(repeat + 1):
        flush()
        run_stream(CHAINED_BYTES)
        event = cl.enqueue_nd_range_kernel(queue, nothing, (1,), (1,))
        event.wait()
        chained.append((event.profile.end - event.profile.start) * 1e-9)
    figures["empty_after_a_kernel_s"] = float(np.median(chained[1:]))
    return figures


def torch_figures(torch, sizes_mb, gemv_shapes, flush_mib, repeat):
    flush_buffer = torch.ones(flush_mib * 2**18, device="cuda")

    def timed(fn):
        times = []
        for _ in range(repeat + 1):
            flush_buffer.sum()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        return float(np.median(times[1:]))

    one = torch.ones(1, device="cuda")
    figures = {"empty_add_s": timed(lambda: one.add_(0.0)),
               "stream": [], "gemv": []}
    for s in sizes_mb:
        x = torch.ones(int(s * 1e6) // 4, device="cuda")
        figures["stream"].append({"mb": s, "s": timed(lambda x=x: x.sum())})
    fit = [r for r in figures["stream"] if r["mb"] >= 4]
    fixed, rate = line([r["mb"] * 1e6 for r in fit], [r["s"] for r in fit])
    figures.update(fixed_s=fixed, rate_gbs=rate / 1e9)
    for units, inputs in gemv_shapes:
        row = {"units": units, "inputs": inputs}
        for name, dtype in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
            w = torch.randn(units, inputs, device="cuda").to(dtype)
            v = torch.randn(inputs, device="cuda").to(dtype)
            row[name + "_s"] = timed(lambda w=w, v=v: torch.mv(w, v))
        row["fp16_speedup"] = row["fp32_s"] / row["fp16_s"]
        figures["gemv"].append(row)
    return figures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="malinn device name (default: malinn's choice)")
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.004, 0.25, 1, 4, 12.5, 25, 50, 100],
                        help="streaming reads, MB")
    parser.add_argument("--gemv", nargs="+", default=["4096x3072", "3072x4096", "2500x784"],
                        help="torch matrix-vector shapes UNITSxINPUTS")
    parser.add_argument("--flush-mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if sum(size >= 4 for size in args.sizes) < 2:
        parser.error("--sizes: give at least two sizes of 4 MB or more (the line is fitted to those)")

    if args.device:
        malinn.set_device(args.device)
    device = malinn.get_device()
    result = {"device": device.name, "opencl": opencl_figures(device, args.sizes, args.flush_mib, args.repeat)}
    o = result["opencl"]
    print(f"{device.name}: OpenCL event of an empty 1-item kernel {o['empty_1_item_s'] * 1e6:.2f} us, "
          f"4096 empty groups {o['empty_4096_groups_s'] * 1e6:.2f} us, 4 KiB copy {o['copy_4kib_s'] * 1e6:.2f} us, "
          f"empty kernel right behind another {o['empty_after_a_kernel_s'] * 1e6:.2f} us")
    for r in o["stream"]:
        print(f"  stream {r['mb']:8.3f} MB  {r['s'] * 1e6:8.2f} us")
    print(f"  fit: fixed {o['fixed_s'] * 1e6:.2f} us + bytes / {o['rate_gbs']:.0f} GB/s")
    if not args.no_torch:
        from peers import torch_cuda

        torch = torch_cuda()
        if torch is None:
            print("torch: no CUDA torch here; its figures are left out")
        else:
            shapes = [tuple(int(v) for v in s.split("x")) for s in args.gemv]
            t = result["torch"] = torch_figures(torch, args.sizes, shapes, args.flush_mib, args.repeat)
            print(f"torch (CUDA events, launch included): add_ on 1 value {t['empty_add_s'] * 1e6:.2f} us")
            for r in t["stream"]:
                print(f"  sum {r['mb']:8.3f} MB  {r['s'] * 1e6:8.2f} us")
            print(f"  fit: fixed {t['fixed_s'] * 1e6:.2f} us + bytes / {t['rate_gbs']:.0f} GB/s")
            for r in t["gemv"]:
                print(f"  mv {r['units']}x{r['inputs']}: fp32 {r['fp32_s'] * 1e6:.2f} us, fp16 {r['fp16_s'] * 1e6:.2f}, "
                      f"bf16 {r['bf16_s'] * 1e6:.2f} (fp16 {r['fp16_speedup']:.2f}x faster)")
    result["command"] = shlex.join(["benchmarks/launch_floor.py"] + (sys.argv[1:] if argv is None else list(argv)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
