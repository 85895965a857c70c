"""``malinn devices``, ``malinn summary`` and ``malinn warm``: what a device and a model look like, and a program cache filled ahead of use."""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from ..backends.selection import devices, get_device
from ..environment import switch
from ..errors import DeviceError, MalinnError
from ..model.model import batch_bucket
from ..model.saving import load_model
from ..plan.progress import reported_by_caller
from ..tuning.tuner import cache_dir
from .arguments import device_of
from .outputs import count_text


# ------------------------------------------------------------------ commands
def cmd_devices(args: argparse.Namespace) -> int:

    os.environ.setdefault("MALINN_GL", "1")  # list the OpenGL devices too, even beside an OpenCL GPU
    found = devices()
    if not found:
        raise MalinnError(
            "no working OpenCL or OpenGL device (install a driver, e.g. apt-get install "
            "pocl-opencl-icd, or libegl-mesa0 and pip install malinn[gl])"
        )
    try:
        current = get_device()
    except DeviceError:
        current = None
        setting = os.environ.get("MALINN_DEVICE", "")
        print(
            f"malinn: warning: MALINN_DEVICE={setting!r} matches none of these devices; no device is marked "
            "and other commands fail until it names one (gpu, cpu, P:D, gl or part of a name)",
            file=sys.stderr,
        )
    for d in found:
        print(("* " if d is current else "  ") + str(d))
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    device_of(args)
    load_model(args.model, weights=args.weights, precision=args.precision).summary(batch=args.batch, show_kernels=True)
    return 0


def cmd_warm(args: argparse.Namespace) -> int:
    """Plans each model at each batch size and runs one pass of zeros on it, so that the kernel
    programs the plans need are in the program-binary cache (and a driver that compiles a kernel
    again at its first launch, PoCL, has done so into its own cache) before the application starts."""
    if switch("MALINN_BINARY_CACHE", True) is False:
        raise MalinnError(
            "MALINN_BINARY_CACHE=0 turns the program cache off: the programs warm builds would be "
            "lost with this process; unset it"
        )
    device = device_of(args)
    if device.backend == "gles3":
        raise MalinnError(
            f"{device.name} ({device.backend}) keeps no program binaries: it builds its shaders in "
            "every process, so there is nothing to warm"
        )
    batches = list(dict.fromkeys(args.batch or [1]))
    counters = device.counters
    built = loaded = plans = 0
    started = time.perf_counter()
    with reported_by_caller():  # a terminal still shows the builds as they go; the lines below report them
        for source in args.model:
            model = load_model(source, precision=args.precision)
            for batch in batches:
                builds, hits, begun = counters.get("builds", 0), counters.get("binary_hits", 0), time.perf_counter()
                samples = max(1, min(batch, model.max_batch(device, limit=batch)))  # as predict splits it
                plan = model.plan(samples, device)
                plan.run([np.zeros((1,) + tuple(shape), np.float32) for shape in model.input_shapes])
                now_built, now_loaded = counters.get("builds", 0) - builds, counters.get("binary_hits", 0) - hits
                built, loaded, plans = built + now_built, loaded + now_loaded, plans + 1
                planned = f" (planned as {batch_bucket(samples)})" if batch_bucket(samples) != batch else ""
                print(
                    f"{source} at batch {batch}{planned}: {count_text(now_built, 'kernel program')} built, {now_loaded} "
                    f"loaded from the program cache ({time.perf_counter() - begun:.1f} s)",
                    flush=True,
                )
    print(
        f"warm on {device.name}: {count_text(plans, 'plan')} of {count_text(len(args.model), 'model')}, "
        f"{count_text(built, 'kernel program')} built, {loaded} loaded from the program cache, in "
        f"{time.perf_counter() - started:.1f} s "
        f"(cache: {cache_dir()})"
    )
    return 0
