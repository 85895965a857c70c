"""What Full CIFAR's two batch-1 layers would cost in one launch: the bound a fused launch could reach.

Times gemv_split_stream_c (the library's source and configuration) on 4096x3072 and on 3072x4096 at
batch 1, one launch each (what a plan runs), and on 7168x3584, the same bytes of weights in one launch
with no dependency between its halves (what no real fusion can beat: the second layer needs all of
the first's result). Each is checked against numpy; OpenCL profiling events, median of --repeat,
interleaved; a device-to-device copy of 1 GiB in the same run (bytes read plus written per second).

Run:  python3 benchmarks/two_layers_one_launch.py [--device D] [--repeat 200] [--json out.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from models import copy_bandwidth
from stream_layer import DEFINES, StreamLayer, build, event_us, probe_arguments

#: (units, inputs): Full CIFAR's two wide layers, then their weights' bytes as one layer
LAYERS = [(4096, 3072), (3072, 4096), (7168, 3584)]


def main(argv=None):
    args, device = probe_arguments(__doc__, argv)
    kernel = build(device)
    rng = np.random.default_rng(0)
    layers = [StreamLayer(device, m, k, rng) for m, k in LAYERS]
    errors = [layer.error(kernel) for layer in layers]
    assert max(errors) < 1e-5, errors
    times = [[] for _ in layers]
    for i in range(args.repeat):   # interleaved, the order turned every other pass
        for j in (range(len(layers)) if i % 2 else reversed(range(len(layers)))):
            event = layers[j].launch(kernel)
            event.wait()
            times[j].append(event_us(event))
    copy_gbs = copy_bandwidth(device) / 1e9
    us = [float(np.median(t)) for t in times]
    weights = 4 * LAYERS[0][0] * LAYERS[0][1] * 2
    two, one = us[0] + us[1], us[2]
    print(f"{device.name}: copy {copy_gbs:.0f} GB/s (read + written)")
    print(f"two launches: {us[0]:.2f} + {us[1]:.2f} = {two:.2f} us, weights at {weights / two / 1e3 / copy_gbs:.1%} of the copy")
    print(f"one launch:   {one:.2f} us, at {weights / one / 1e3 / copy_gbs:.1%} of the copy")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": device.name, "driver": device.driver_version, "copy_gbs": copy_gbs, "defines": DEFINES,
            "errors": errors, "layers": LAYERS, "median_us": us, "two_launches_us": two, "one_launch_us": one,
            "repeat": args.repeat, "command": "benchmarks/two_layers_one_launch.py " + " ".join(sys.argv[1:])}, indent=1))


if __name__ == "__main__":
    main()
