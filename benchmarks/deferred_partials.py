"""Whether Full CIFAR's first batch-1 layer gets faster when it leaves its split-K partial sums for the
second layer to add, instead of adding them in its own tail.

A plan launches gemv_split_stream_c on each wide layer: K over 8 work-groups, and in each row tile the
work-group that counts last (an atomic counter) reads the 8 partial sums back and writes the layer's
output. This probe times, on 4096x3072 then 3072x4096 at batch 1, launched back to back as a plan
launches them:

- ``plan``: the library's kernel on both layers;
- ``deferred_direct``: the first layer stores its partial sums and ends (no counter, no tail); the
  second reads each input as the sum of the first layer's 8 partial sums (in slice order: the same sums
  as the tail's);
- ``deferred_local``: as ``deferred_direct``, but each work-group of the second layer first adds the
  partial sums of its K slice into local memory, then reads its input from there;
- ``deferred_prefetch``: as ``deferred_local``, with each item's first step of weights loaded before
  the partial sums are added (its loads in flight during them).

Each variant's second-layer result is checked against numpy (float64). OpenCL profiling events,
median of --repeat, the variants interleaved; a device-to-device copy in the same run. A probe: the
edits live here, not in the kernel library.

Results: benchmarks/results/deferred_partials_nvidia_h200.json, deferred_partials_b_nvidia_h200.json (and
NOTES.md for the same idea built into the plan: patches/deferred_partial_sums.patch).

Run:  python3 benchmarks/deferred_partials.py [--device D] [--repeat 300] [--json out.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyopencl as cl
from stream_layer import DEFINES, ROWS, StreamLayer, build, copy_and_weights, pair_medians, probe_arguments, record_pair

LAYERS = [(4096, 3072), (3072, 4096)]   #: (units, inputs): Full CIFAR's two wide layers
SLICES = DEFINES["SLICES"]

#: the first layer's tail: the partial sums stored, then counted; the edit stores them and ends
TAIL = """    for (uint e = t; e < OUTS; e += THREADS)
        atomic_xchg(partial + slice * OUTS + e, part[e]);
    mem_fence(CLK_GLOBAL_MEM_FENCE);
"""
NO_TAIL = """    for (uint e = t; e < OUTS; e += THREADS)
        partial[slice * OUTS + e] = part[e];
    return;
"""
#: input k of the second layer: the first layer's SLICES partial sums of its row k, in slice order
X_FROM_PARTIALS = f"""
float x_from_partials(__global const float *p, uint k)
{{
    __global const float *q = p + IN_TILES + (size_t)(k / {ROWS}) * {SLICES} * {ROWS} + k % {ROWS};
    float s = q[0];
    #pragma unroll
    for (uint i = 1; i < {SLICES}; ++i)
        s += q[i * {ROWS}];
    return s;
}}
"""
LOOP = "    for (uint kb = any ? k0 + tk * U : k1; kb < k1; kb += KSPLIT * U) {\n"
LOAD = "av[u][p] = (live[p] && kb + u < k1) ? LOAD_V(ak + p * MDIM * VL) : (accv)(ACC_ZERO);"
KERNEL = "__kernel __attribute__((reqd_work_group_size(MDIM, KSPLIT, 1)))"
CHUNK = "    const uint k1 = min(l, k0 + chunk);\n"


def partials_only(source: str) -> str:
    assert source.count(TAIL) == 1
    return source.replace(TAIL, NO_TAIL)


def direct(source: str) -> str:
    assert source.count(KERNEL) == 1
    return source.replace(KERNEL, X_FROM_PARTIALS + "#undef B_AT\n#define B_AT(k, col) x_from_partials(b, k)\n"
                          + KERNEL)


def local(source: str) -> str:
    assert source.count(KERNEL) == 1 and source.count(CHUNK) == 1
    source = source.replace(KERNEL, X_FROM_PARTIALS + "#undef B_AT\n#define B_AT(k, col) xs[(k) - k0]\n" + KERNEL)
    return source.replace(CHUNK, CHUNK + """    __local float xs[XS_MAX];
    for (uint i = get_local_id(1) * MDIM + get_local_id(0); i < k1 - k0; i += MDIM * KSPLIT)
        xs[i] = x_from_partials(b, k0 + i);
    barrier(CLK_LOCAL_MEM_FENCE);
""")


def prefetch(source: str) -> str:
    """``local`` with the first step's weights loaded before the partial sums are added."""
    assert source.count(KERNEL) == 1 and source.count(LOOP) == 1 and source.count(LOAD) == 1
    source = source.replace(KERNEL, X_FROM_PARTIALS + "#undef B_AT\n#define B_AT(k, col) xs[(k) - k0]\n" + KERNEL)
    source = source.replace(LOOP, """    const uint kfirst = any ? k0 + tk * U : k1;
    accv pre[U][NV];
    #pragma unroll
    for (uint u = 0; u < U; ++u) {
        const __global WEIGHT *ak = a + (size_t)(kfirst + u) * H + rowg + tm * VL;
        #pragma unroll
        for (uint p = 0; p < NV; ++p)
            pre[u][p] = (live[p] && kfirst + u < k1) ? LOAD_V(ak + p * MDIM * VL) : (accv)(ACC_ZERO);
    }
    __local float xs[XS_MAX];
    for (uint i = t; i < k1 - k0; i += THREADS)
        xs[i] = x_from_partials(b, k0 + i);
    barrier(CLK_LOCAL_MEM_FENCE);
""" + LOOP)
    return source.replace(LOAD, "av[u][p] = kb == kfirst ? pre[u][p] : (live[p] && kb + u < k1) ? "
                                "LOAD_V(ak + p * MDIM * VL) : (accv)(ACC_ZERO);")


def launch(layer: StreamLayer, kernel, b):
    """``kernel`` on ``layer`` with ``b`` as its input buffer; the event."""
    m, k = np.uint32(layer.m), np.uint32(layer.k)
    kernel.set_args(k, m, np.uint32(1), m, np.uint32(1), m, k, *[np.float32(0)] * 4, layer.weights, b,
                    layer.result, layer.unused, layer.unused, layer.unused, layer.scratch)
    return cl.enqueue_nd_range_kernel(layer.device.queue, kernel, (layer.m // DEFINES["VW"], DEFINES["KSPLIT"] * SLICES),
                                      (DEFINES["MDIM"], DEFINES["KSPLIT"]))


def main(argv=None):
    args, device = probe_arguments(__doc__, argv, repeat=300)
    rng = np.random.default_rng(0)
    first, second = (StreamLayer(device, m, k, rng) for m, k in LAYERS)
    tiles = np.uint32(first.m // ROWS)
    chunk = -(-second.k // SLICES)
    plain = build(device)
    variants = {
        "plan": (plain, lambda: first.result, plain),
        "deferred_direct": (build(device, partials_only), lambda: first.scratch,
                            build(device, direct, [f"-DIN_TILES={tiles}"])),
        "deferred_local": (build(device, partials_only), lambda: first.scratch,
                           build(device, local, [f"-DIN_TILES={tiles}", f"-DXS_MAX={chunk}"])),
        "deferred_prefetch": (build(device, partials_only), lambda: first.scratch,
                              build(device, prefetch, [f"-DIN_TILES={tiles}", f"-DXS_MAX={chunk}"])),
    }
    want = second.a.astype(np.float64) @ (first.a.astype(np.float64) @ first.x)
    errors = {}
    for name, (one, b, two) in variants.items():
        launch(first, one, first.input)
        launch(second, two, b()).wait()
        got = np.empty(second.m, np.float32)
        cl.enqueue_copy(device.queue, got, second.result)
        errors[name] = float(np.abs(got - want).max() / np.abs(want).max())
    assert max(errors.values()) < 1e-5, errors
    times = {name: ([], [], []) for name in variants}
    names = list(variants)
    for i in range(args.repeat):
        for name in (names if i % 2 else names[::-1]):
            one, b, two = variants[name]
            e1 = launch(first, one, first.input)
            e2 = launch(second, two, b())
            e2.wait()
            record_pair(times[name], e1, e2)
    copy_gbs, weights = copy_and_weights(device, LAYERS, f"errors {errors}")
    rows = []
    print(f"{'variant':<16} {'layer 1':>8} {'layer 2':>8} {'sum':>8} {'span':>8}  of copy (sum)")
    for name, pair in times.items():
        us = pair_medians(pair)
        rows.append({"variant": name, "layer1_us": us[0], "layer2_us": us[1], "sum_us": us[2], "span_us": us[3]})
        print(f"{name:<16} {us[0]:8.2f} {us[1]:8.2f} {us[2]:8.2f} {us[3]:8.2f}  {weights / us[2] / 1e3 / copy_gbs:.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": device.name, "driver": device.driver_version, "copy_gbs": copy_gbs, "defines": DEFINES,
            "errors": errors, "layers": LAYERS, "rows": rows, "repeat": args.repeat,
            "command": "benchmarks/deferred_partials.py " + " ".join(sys.argv[1:])}, indent=1))


if __name__ == "__main__":
    main()
