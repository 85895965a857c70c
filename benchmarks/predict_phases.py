"""Where a predict's host-to-host time goes, phase by phase, on each device given (one run).

For each network of Rovder's Table 10.5 (``models.py``) at batch 1 and --batch, on each device of
--device (e.g. ``0:0,gl:0``: the same GPU through OpenCL and through OpenGL), medians of --repeat:

* ``upload``: the plan's input upload (``Device.upload`` of its buffer, as ``Plan.run`` makes it),
  then ``Device.finish``;
* ``launches``: the plan's launches (``Device.launch_all``), then ``Device.finish``;
* ``download``: the output's blocking download, the device idle before it;
* ``finish``: ``Device.finish`` on an idle device (what each phase above carries of it);
* ``sequence``: the upload, the launches and the download in one hold of the device's lock, no
  finish between them (what ``Plan.run`` does on the device);
* ``run``: ``Plan.run`` (the sequence, with its staging of the input and output);
* ``predict``: ``model.predict(x)`` (input checks and the plan's look-up besides).

It names the phase where one backend loses to another (GL against OpenCL on one GPU, say).

Run:  python3 benchmarks/predict_phases.py [--device D[,D2...]] [--batch 100] [--repeat 100]
                                           [--models NAME ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import malinn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import MODELS, build  # noqa: E402
from peers import median_time  # noqa: E402


def phases(model, plan, x, repeat: int) -> dict:
    """The phases' median seconds of ``plan`` (made for ``x``'s batch) on its device."""
    device = plan.device
    (in_buffer, in_staging, value, direct), = plan._io[0]
    (out_buffer, out_staging), = plan._io[1]
    source = x if direct else in_staging

    def upload():
        device.upload(in_buffer, source, blocking=False, what="the input", mapped=False)
        device.finish()

    def launches():
        device.launch_all(plan.launches)
        device.finish()

    def download():
        device.download(out_buffer, out_staging, blocking=True, what="the output", mapped=False)

    def sequence():
        with device.lock:
            device.upload(in_buffer, source, blocking=False, what="the input", mapped=False)
            device.launch_all(plan.launches)
            device.download(out_buffer, out_staging, blocking=True, what="the output", mapped=False)

    return {"upload": median_time(upload, repeat, warmup=5),
            "launches": median_time(launches, repeat, warmup=5),
            "download": median_time(download, repeat, warmup=5),
            "finish": median_time(device.finish, repeat, warmup=5),
            "sequence": median_time(sequence, repeat, warmup=5),
            "run": median_time(lambda: plan.run([x]), repeat, warmup=5),
            "predict": median_time(lambda: model.predict(x), repeat, warmup=5)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="devices, comma-separated (e.g. 0:0,gl:0; default: malinn's default)")
    parser.add_argument("--batch", type=int, default=100, help="samples per predict besides batch 1 (default: 100)")
    parser.add_argument("--repeat", type=int, default=100, help="timed runs of each phase; the median counts "
                        "(default: 100)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), metavar="NAME", choices=list(MODELS),
                        help="networks to time, among " + ", ".join(repr(m) for m in MODELS) + " (default: all)")
    parser.add_argument("--json", metavar="PATH", help="also write the results, as JSON, to PATH")
    args = parser.parse_args(argv)
    specs = [s for s in (args.device or "").split(",") if s.strip()]
    devices = [malinn.set_device(s) for s in specs] if specs else [malinn.get_device()]
    rows = []
    for name in args.models:
        model = build(MODELS[name])
        for batch in (1, args.batch):
            x = np.random.default_rng(1).random((batch, MODELS[name][0]), dtype=np.float32)
            for device in devices:
                malinn.set_device(device)
                model.predict(x)
                plan = model.plan(batch, device)
                if plan.batch != batch:
                    raise SystemExit(f"{name}: batch {batch} is planned as {plan.batch}; time a bucket size")
                row = {"model": name, "batch": batch, "device": device.describe()["index"],
                       "launches": len(plan.launches), **phases(model, plan, x, args.repeat)}
                rows.append(row)
                print(f"{name:<14} batch {batch:>4} {row['device']:>6}: " + "  ".join(
                    f"{k} {row[k] * 1e6:8.1f}" for k in ("upload", "launches", "download", "finish", "sequence", "run", "predict"))
                    + " us", flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"devices": [d.describe() for d in devices], "rows": rows,
                                               "command": " ".join(sys.argv)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
