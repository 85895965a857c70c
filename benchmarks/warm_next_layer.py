"""Whether Full CIFAR's first batch-1 layer can read the start of the second layer's weights into the
GPU's cache in its own tail, so that the second layer finds them there.

A split-K layer ends in a tail: its last work-groups exchange partial sums while memory has little to
do, and the next launch starts with its first loads' latency. :func:`warming` edits gemv_split so
that the work-groups that finish between tickets ``first`` and ``first + groups`` (in the order they
finish) each touch one share of the next layer's weights (one 4-byte load per 32-byte sector). This
probe times gemv_split_stream_c (the library's configuration) on 4096x3072 then 3072x4096 at batch 1,
the pair launched back to back as a plan launches them, with no warming and with each warming
configuration, interleaved; each configuration's first layer is checked against numpy.

Patterns: "slices" warms the first MB / 8 of each of the second layer's 8 K slices (the columns each
of its work-groups reads first), "prefix" the buffer's first MB. ``first`` is the first ticket that
warms (the first layer has 512 work-groups): the last ``groups`` to finish, or the ``groups`` before them.

Run:  python3 benchmarks/warm_next_layer.py [--device D] [--repeat 300] [--json out.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyopencl as cl
from stream_layer import DEFINES, ROWS, StreamLayer, build, copy_and_weights, pair_medians, probe_arguments, record_pair

LAYERS = [(4096, 3072), (3072, 4096)]   #: (units, inputs): Full CIFAR's two wide layers
SECTOR = 32                              #: bytes per warmed sector
WARM_ARGS = (", __global const uint *warm, __global uint *warm_ticket, uint warm_first, uint warm_groups, "
             "uint warm_ranges, uint warm_stride, uint warm_len")
#: the end of the kernel: the work-groups that finish between tickets warm_first and warm_first +
#: warm_groups (taken in the order they finish; the last resets the ticket) read warm_ranges runs of
#: warm_len 32-byte sectors, warm_stride sectors apart, one 4-byte load per sector
WARM_TAIL = """    {
        if (t == 0) {
            const uint q = atomic_inc(warm_ticket);
            if (q == get_num_groups(0) * get_num_groups(1) - 1)
                atomic_xchg(warm_ticket, 0u);
            warm_q = q;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (warm_q >= warm_first && warm_q < warm_first + warm_groups) {
            const uint total = warm_ranges * warm_len;
            const uint per = (total + warm_groups - 1) / warm_groups;
            const uint i0 = (warm_q - warm_first) * per, i1 = min(total, i0 + per);
            uint x = 0;
            for (uint i = i0 + t; i < i1; i += 8 * THREADS) {
                uint v[8];
                #pragma unroll
                for (uint u = 0; u < 8; ++u) {
                    const uint j = i + u * THREADS;
                    v[u] = j < i1 ? warm[((size_t)(j / warm_len) * warm_stride + j % warm_len) * 8] : 0u;
                }
                #pragma unroll
                for (uint u = 0; u < 8; ++u)
                    x ^= v[u];
            }
            if (x == 0x9E3779B9u)
                warm_ticket[1] = x;
        }
    }
"""


def warming(source: str) -> str:
    """gemv_split's source with the warming arguments and tail."""
    for anchor in ("HEAD_ARGS)", "    __local float part[", "#endif\n}\n"):
        assert source.count(anchor) >= 1, anchor
    source = source.replace("HEAD_ARGS)", "HEAD_ARGS" + WARM_ARGS + ")", 1)
    source = source.replace("    __local float part[", "    __local uint warm_q;\n    __local float part[", 1)
    head, tail = source.rsplit("#endif\n}\n", 1)
    return head + "#endif\n" + WARM_TAIL + "}\n" + tail


def configurations(groups_total: int):
    """(pattern, MiB, groups, first) to try."""
    yield "none", 0, 0, 0
    for mib in (4, 8, 16, 24):
        for groups in (64, 128, 256):
            for back in (0, groups):
                if groups + back <= groups_total:
                    yield "slices", mib, groups, groups_total - groups - back
    for mib in (8, 16):
        yield "prefix", mib, 128, groups_total - 128


def warm_arguments(ticket, second: StreamLayer, pattern: str, mib: int, groups: int, first: int):
    """The warming arguments for ``mib`` MiB of ``second``'s weights."""
    sectors = mib * 2**20 // SECTOR
    slices = DEFINES["SLICES"]
    slice_sectors = -(-second.k // slices) * second.m * 4 // SECTOR   # the weights are m x k column-major, H = m
    ranges, stride, length = (slices, slice_sectors, sectors // slices) if pattern == "slices" else (1, sectors, sectors)
    return (second.weights, ticket, *map(np.uint32, (first, groups, ranges, stride, length)))


def main(argv=None):
    args, device = probe_arguments(__doc__, argv, repeat=300)
    plain, warm = build(device), build(device, warming)
    rng = np.random.default_rng(0)
    first, second = (StreamLayer(device, m, k, rng) for m, k in LAYERS)
    ticket = cl.Buffer(device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                       hostbuf=np.zeros(2, np.uint32))
    total = (first.m // ROWS) * DEFINES["SLICES"]
    configs = list(configurations(total))
    extras = [warm_arguments(ticket, second, *c) for c in configs]
    errors = [first.error(warm, e) for e in extras] + [first.error(plain), second.error(plain)]
    assert max(errors) < 1e-5, errors
    times = {c: ([], [], []) for c in ["plain"] + configs}
    for i in range(args.repeat):
        order = [("plain", plain, ())] + [(c, warm, e) for c, e in zip(configs, extras)]
        for name, kernel, extra in (order if i % 2 else order[::-1]):
            one = first.launch(kernel, extra)
            two = second.launch(plain)
            two.wait()
            record_pair(times[name], one, two)
    left = np.empty(2, np.uint32)
    cl.enqueue_copy(device.queue, left, ticket)
    assert left[0] == 0, left
    copy_gbs, weights = copy_and_weights(device, LAYERS, f"first layer's work-groups: {total}")
    rows = []
    print(f"{'pattern':<7} {'MiB':>4} {'groups':>6} {'first':>6}  {'layer 1':>8} {'layer 2':>8} {'sum':>8} {'span':>8}  of copy")
    for name, pair in times.items():
        us = pair_medians(pair)
        pattern, mib, groups, start = ("plain", 0, 0, 0) if name == "plain" else name
        rows.append({"pattern": pattern, "mib": mib, "groups": groups, "first": start, "layer1_us": us[0],
                     "layer2_us": us[1], "sum_us": us[2], "span_us": us[3]})
        print(f"{pattern:<7} {mib:>4} {groups:>6} {start:>6}  {us[0]:8.2f} {us[1]:8.2f} {us[2]:8.2f} {us[3]:8.2f}  "
              f"{weights / us[2] / 1e3 / copy_gbs:.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": device.name, "driver": device.driver_version, "copy_gbs": copy_gbs, "defines": DEFINES,
            "errors": errors, "layers": LAYERS, "first_layer_groups": total, "rows": rows, "repeat": args.repeat,
            "command": "benchmarks/warm_next_layer.py " + " ".join(sys.argv[1:])}, indent=1))


if __name__ == "__main__":
    main()
