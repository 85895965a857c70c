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

Run:  python3 benchmarks/weight_tiles.py [--device D] [--repeat 200] [--json out.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from models import copy_bandwidth
from stream_layer import DEFINES, ROWS, StreamLayer, build, event_us, probe_arguments

#: the line of gemv_split.cl that addresses A, and its tiled replacements (TK: columns per tile)
ORIGINAL = "const __global WEIGHT *ak = a + (size_t)(kb + u) * H + rowg + tm * VL;"
TILED = {
    "R": "const __global WEIGHT *ak = a + ((size_t)(rowg / ROWS) * (l / TK) + (kb + u) / TK) * (ROWS * TK)"
         " + ((kb + u) % TK) * ROWS + tm * VL;",
    "C": "const __global WEIGHT *ak = a + ((size_t)((kb + u) / TK) * (H / ROWS) + rowg / ROWS) * (ROWS * TK)"
         " + ((kb + u) % TK) * ROWS + tm * VL;",
}
TK = DEFINES["KSPLIT"] * DEFINES["UNROLL"]    # a work-group's columns per step
LAYERS = [(4096, 3072), (3072, 4096)]         # Full CIFAR's wide layers


def tiled(order):
    """A (m x k) as the tiled buffer: ROWS x TK tiles, column-major inside, ordered along K first
    (``R``) or along M first (``C``)."""
    def layout(a):
        m, k = a.shape
        t = a.reshape(m // ROWS, ROWS, k // TK, TK)              # [ti, r, tj, c]
        t = t.transpose(0, 2, 3, 1) if order == "R" else t.transpose(2, 0, 3, 1)
        return np.ascontiguousarray(t).ravel()
    return layout


def main(argv=None):
    args, device = probe_arguments(__doc__, argv)
    kernels = {"column-major": build(device)}
    layouts = {"column-major": lambda a: np.ascontiguousarray(a.T)}
    for order, line in TILED.items():
        kernels[f"tiles {order}"] = build(device, lambda source, line=line: source.replace(ORIGINAL, line),
                                          [f"-DTK={TK}"])
        layouts[f"tiles {order}"] = tiled(order)
    layers = {name: [StreamLayer(device, m, k, np.random.default_rng(i), layouts[name]) for i, (m, k) in enumerate(LAYERS)]
              for name in kernels}
    errors = {name: [layer.error(kernels[name]) for layer in layers[name]] for name in kernels}
    print("max errors", errors)
    assert max(max(e) for e in errors.values()) < 1e-5, errors
    times = {name: [[] for _ in LAYERS] for name in kernels}
    names = list(kernels)
    for i in range(args.repeat):   # interleaved, each variant's two layers one after the other
        for name in names[i % len(names):] + names[:i % len(names)]:
            events = [layer.launch(kernels[name]) for layer in layers[name]]
            events[-1].wait()
            for j, event in enumerate(events):
                times[name][j].append(event_us(event))
    copy_gbs = copy_bandwidth(device) / 1e9
    median = {name: [float(np.median(t)) for t in ts] for name, ts in times.items()}
    weights = sum(4 * m * k for m, k in LAYERS)
    for name, us in median.items():
        print(f"{name:<14} {us[0]:7.2f} {us[1]:7.2f} us  total {sum(us):7.2f}  = "
              f"{weights / sum(us) / 1e3 / copy_gbs:.1%} of the copy ({copy_gbs:.0f} GB/s)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": device.name, "driver": device.driver_version, "copy_gbs": copy_gbs, "defines": DEFINES,
            "tile": [ROWS, TK], "layers": LAYERS, "errors": errors, "median_us": median, "repeat": args.repeat,
            "command": "benchmarks/weight_tiles.py " + " ".join(sys.argv[1:])}, indent=1))


if __name__ == "__main__":
    main()
