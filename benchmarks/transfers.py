"""Ways to move a predict's input to the device and its output back, timed in one run.

A plan uploads each input buffer whole. This measures, for the input sizes of the Table 10.5
networks at batch 1 and 100 (640 to 3072 features), what each way of doing that costs on one
device, host to device and back, blocking at the end of each (medians of --repeat):

* ``pageable``: ``enqueue_copy`` from the caller's numpy array (the driver stages it itself);
* ``pinned_copy``: numpy copy into a page-locked staging array (``Device.host_array``), then
  ``enqueue_copy`` from it (what ``Plan.run`` does);
* ``pinned_only``: ``enqueue_copy`` from the page-locked array alone (the DMA, no host copy: the
  lower bound of the two above);
* ``host_copy``: the numpy copy into the page-locked array alone;
* ``chunked``: the staging copy in --chunks pieces, each piece's upload enqueued as soon as it is
  copied (the host copy overlaps the DMA);
* ``download``: the blocking read of a (batch x 10) output into a page-locked array.

Run:  python3 benchmarks/transfers.py [--device D] [--repeat 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pyopencl as cl

import malinn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import median_time  # noqa: E402

SIZES = [(1, 640), (1, 3072), (100, 784), (100, 3072)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="gpu, cpu, P:D or part of a device name (default: malinn's default device)")
    parser.add_argument("--repeat", type=int, default=200, help="timed runs per measurement (default: 200)")
    parser.add_argument("--chunks", type=int, default=4, help="pieces of the chunked upload (default: 4)")
    parser.add_argument("--json", metavar="PATH", help="also write the results, as JSON, to PATH")
    args = parser.parse_args(argv)
    device = malinn.set_device(args.device) if args.device else malinn.get_device()
    queue = device.queue
    rows = []
    for batch, features in SIZES:
        x = np.random.default_rng(0).random((batch, features), dtype=np.float32)
        buffer = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, x.nbytes)
        staging = device.host_array(x.shape)
        out_buffer = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, batch * 10 * 4)
        out = device.host_array((batch, 10))
        bounds = np.linspace(0, batch * features, args.chunks + 1).astype(int)
        flat_x, flat_staging = x.reshape(-1), staging.reshape(-1)

        def pageable():
            cl.enqueue_copy(queue, buffer, x, is_blocking=False)
            queue.finish()

        def pinned_copy():
            staging[...] = x
            cl.enqueue_copy(queue, buffer, staging, is_blocking=False)
            queue.finish()

        def pinned_only():
            cl.enqueue_copy(queue, buffer, staging, is_blocking=False)
            queue.finish()

        def host_copy():
            staging[...] = x

        def chunked():
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                flat_staging[lo:hi] = flat_x[lo:hi]
                cl.enqueue_copy(queue, buffer, flat_staging[lo:hi], dst_offset=int(lo) * 4, is_blocking=False)
            queue.finish()

        def download():
            cl.enqueue_copy(queue, out, out_buffer, is_blocking=True)

        row = {"batch": batch, "features": features, "bytes": x.nbytes}
        for name, run in [("pageable", pageable), ("pinned_copy", pinned_copy), ("pinned_only", pinned_only),
                          ("host_copy", host_copy), ("chunked", chunked), ("download", download)]:
            row[name] = median_time(run, args.repeat, warmup=5)
        rows.append(row)
        print(f"{batch:>4} x {features:<5} " + "  ".join(
            f"{k} {row[k] * 1e6:7.1f} us" for k in ("pageable", "pinned_copy", "pinned_only", "host_copy", "chunked",
                                                     "download")), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device.describe(), "driver": device.driver_version,
                                               "rows": rows, "chunks": args.chunks}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
