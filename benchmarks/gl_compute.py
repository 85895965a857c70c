"""What a compute shader gets of the GPU beside an OpenCL kernel on the same GPU.

The GL backend's batch-100 products run the same algorithm as the OpenCL ones and take about twice
as long on the H200 (where the batch-1 layers, which stream the weights, take about as long). This
script separates the platform from malinn's shaders with one kernel written twice, OpenCL C and
GLSL ES 3.10, the same arithmetic in the same order:

* ``mad``: each item runs 8 independent chains ``a = a * b + c`` (b a runtime argument) for
  --iters steps and writes their sum; ``add``: the same with ``a = a + b``. FLOP/s at a full
  range (both backends' device clocks: OpenCL profiling events, GL timestamp queries). If GL's
  ``mad`` rate is half OpenCL's and its ``add`` rate is not, GL does not fuse ``a * b + c``.
* ``fused``: whether the two backends' ``mad`` results are bit-identical (OpenCL C contracts
  ``a * b + c`` into one rounding on NVIDIA; a compiler that rounds twice gives other bits).
* ``scaling``: the ``mad`` kernel's time over ranges of 1 to 4096 work-groups of 256 items: where
  the time starts to grow is how many work-groups the GPU runs at once (SMs x work-groups per SM).
  A GL/OpenCL ratio near 1 at few work-groups that grows with their number means GL gets fewer SMs
  (or fewer work-groups per SM); a constant ratio means each item runs slower.

Run:  python3 benchmarks/gl_compute.py [--device opencl:gpu,gl:gpu] [--iters 4096] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import malinn

CHAINS = 8
LOCAL = 256
OPENCL = """
__kernel void chains(const uint iters, const float b, __global float *out)
{
    const uint g = get_global_id(0);
    float a[CHAINS];
    for (uint j = 0; j < CHAINS; ++j)
        a[j] = (float)(g % 1024u) * 1e-3f + (float)j;
    for (uint i = 0; i < iters; ++i) {
        #pragma unroll
        for (uint j = 0; j < CHAINS; ++j)
#if MAD
            a[j] = a[j] * b + 0.5f;
#else
            a[j] = a[j] + b;
#endif
    }
    float s = 0.0f;
    for (uint j = 0; j < CHAINS; ++j)
        s += a[j];
    out[g] = s;
}
"""
GLSL = """
MALINN_ARGS(uint iters; float b;)
layout(std430, binding = 0) writeonly buffer BufOut { float o[]; };
void main() {
    uint g = gl_GlobalInvocationID.x;
    float a[CHAINS];
    for (int j = 0; j < CHAINS; ++j)
        a[j] = float(g % 1024u) * 1e-3 + float(j);
    for (uint i = 0u; i < iters; ++i) {
        for (int j = 0; j < CHAINS; ++j)
#if MAD
            a[j] = a[j] * b + 0.5;
#else
            a[j] = a[j] + b;
#endif
    }
    float s = 0.0;
    for (int j = 0; j < CHAINS; ++j)
        s += a[j];
    o[g] = s;
}
"""
#: each kernel's MAD define and the FLOP of its step
STEPS = {"mad": (1, 2), "add": (0, 1)}


def launch(device, kind: str, items: int, iters: int, out):
    """A bound launch of the ``kind`` kernel over ``items`` items (a multiple of LOCAL)."""
    gl = device.backend != "opencl"
    options = (f"-DCHAINS={CHAINS}", f"-DMAD={STEPS[kind][0]}")
    program = device.compile(GLSL if gl else OPENCL, options, f"gl_compute.py {kind}")
    args = [np.uint32(iters), np.float32(0.999), out]
    return device.bind(program, "chains", args, (items,), (LOCAL,), what=f"the {kind} chains")


def seconds(bound, repeat: int) -> float:
    """Median device seconds of ``bound`` (its events: OpenCL profiling, GL timestamps)."""
    bound.enqueue().wait()
    times = []
    for _ in range(repeat):
        event = bound.enqueue()
        event.wait()
        times.append((event.profile.end - event.profile.start) * 1e-9)
    return float(np.median(times))


def measure(device, items: int, iters: int, groups: list, repeat: int) -> dict:
    out = device.alloc(4 * items, "the chains' sums")
    row = {"device": device.describe()["index"], "backend": device.backend, "name": device.name}
    for kind, (_, flop) in STEPS.items():
        s = seconds(launch(device, kind, items, iters, out), repeat)
        row[kind] = {"seconds": s, "gflops": flop * CHAINS * iters * items / s / 1e9}
    result = np.empty(items, np.float32)
    launch(device, "mad", items, iters, out).enqueue().wait()
    device.download(out, result)
    row["mad_sums"] = result
    row["scaling"] = {g: seconds(launch(device, "mad", g * LOCAL, iters, out), repeat) for g in groups}
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="opencl:gpu,gl:gpu",
                        help="devices, comma-separated, the first the reference (default: opencl:gpu,gl:gpu)")
    parser.add_argument("--items", type=int, default=2**20, help="items of the full range (default: 2^20)")
    parser.add_argument("--iters", type=int, default=4096, help="steps of each chain (default: 4096)")
    parser.add_argument("--groups", type=int, nargs="+", default=[1, 16, 64, 128, 256, 512, 1024, 2048, 4096],
                        help="work-group counts of the scaling runs (default: 1 to 4096)")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs of each; the median counts (default: 10)")
    parser.add_argument("--json", metavar="PATH", help="also write the results, as JSON, to PATH")
    args = parser.parse_args(argv)
    devices = [malinn.set_device(s) for s in args.device.split(",") if s.strip()]
    items = -(-args.items // LOCAL) * LOCAL
    rows = [measure(d, items, args.iters, args.groups, args.repeat) for d in devices]
    first = rows[0]
    for row in rows:
        fused = bool(np.array_equal(row["mad_sums"], first["mad_sums"]))
        row["mad_bits_equal_first"] = fused
        print(f"{row['device']:<6} {row['name']}: mad {row['mad']['gflops']:8.0f} GFLOP/s, add "
              f"{row['add']['gflops']:8.0f} GFLOP/s" + ("" if row is first else
                                                          f"; mad sums bit-identical to {first['device']}'s: {fused}"))
    print("work-groups of 256: " + "  ".join(f"{r['device']:>10}" for r in rows) + "   (us; ratios to the first)")
    for g in args.groups:
        base = first["scaling"][g]
        print(f"{g:>19}: " + "  ".join(f"{r['scaling'][g] * 1e6:10.1f}" for r in rows) + "   "
              + " ".join(f"{r['scaling'][g] / base:5.2f}x" for r in rows[1:]))
    if args.json:
        for row in rows:
            row["mad_sums"] = [float(v) for v in row["mad_sums"][:8]]
            row["scaling"] = {str(g): s for g, s in row["scaling"].items()}
        Path(args.json).write_text(json.dumps({"rows": rows, "iters": args.iters, "items": items,
                                               "chains": CHAINS, "local": LOCAL, "command": " ".join(sys.argv)},
                                              indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
