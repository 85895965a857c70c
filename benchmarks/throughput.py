"""Throughput at scale: samples per second, host to host, beside torch in the same run.

The four networks of Rovder's Table 10.5 (benchmarks/models.py builds them: Partial MNIST
640-150-10, Partial CIFAR 256-128-10, Full MNIST 784-2500-2000-10, Full CIFAR 3072-4096-3072-10,
ReLU, random weights) at batch 1024 and 8192, and MobileNetV2 and EfficientNetB0 at 224x224 at
batch 32 and 256 (keras.applications with random weights, saved by TensorFlow in a child process
and converted by malinn; the peer builds torchvision's with its own random weights: the same
architecture, so the same work). Each row times one ``model.predict(x)`` of a host numpy batch to a
host numpy result (the median of three blocks of --repeat, each after a warm-up) and gives
``samples_per_s`` = batch / seconds; the peer's figure is timed the same way in the same run, the
two sides' blocks in turn (``harness.block_median_times``: a drift of the host's clocks or load
reaches both sides, while no call of one follows a call of the other, which on one GPU would switch
between the OpenCL and CUDA contexts): torch on the CUDA GPU
(``torch.from_numpy(x).cuda()``, the forward pass, ``.cpu().numpy()``; TF32 off), else, where torch
or a CUDA GPU is missing, numpy on the host CPU for the four MLPs (``peer`` says which; the
convolutional networks then have no peer: ``peer_samples_per_s`` is null and ``peer_note`` says
why). ``ratio`` = malinn's samples/s over the peer's (above 1: malinn is faster). The MLPs' results
are checked against numpy (``max_abs_error``).

Each row also splits malinn's time (``split``): ``kernels_s``, the plan's launches alone (enqueued
and finished, no transfer: the median of --repeat), and ``transfers_s``, the rest (the upload, the
download and their host copies); ``staged`` says whether the input moved through a staging ring
(``Device.staging_ring``: large inputs on a discrete GPU, in chunks through page-locked slots).

With ``--auto-split``, each MLP at batch 8192 is also predicted in two shares on the one
device, each share's plan on a queue of its own (``predict(x, devices=[d, d])``: one share's
transfers overlap the other's kernels on a discrete GPU), as ``auto_split`` rows with its samples/s
and ``speedup`` over one pass: the measurement that decides whether predict should split so itself.

With ``--breakdown``, each MLP row also times a predict's stages alone (``breakdown``: predict's
own checks, the input side, the kernels, the output side, each with the queue finished after it) and
the bare transfers of the same bytes in the same run (one ``enqueue_copy`` each way from and into
plain numpy arrays; from a page-locked copy too on a discrete GPU): ``beyond_transfers_s`` is what a
predict spends beyond its kernels and those copies.

With ``--steps``, each MLP row also lists its plan's steps with each launch's median device seconds
(``models.step_seconds``: OpenCL profiling events): where the kernels' time goes.

With ``--devices N``, each MLP at batch 8192 is also predicted on N devices at once
(``predict(x, devices=[...])``: one plan per device, the batch split in N shares, every share's
pass enqueued before the first is waited for),
and each convolutional network at ``--multi-batch`` (8192 images: a data set's worth, 4.9 GB of
input, run in passes of what each device's memory holds): ``multi_device`` rows give its
samples/s and ``speedup`` over one device; with ``--pinned`` too, ``multi_device_pinned`` rows do
the same for each MLP from page-locked input (``malinn.empty_pinned`` of the first device), where
the host's copies of pageable memory are out of the way. With ``--pass-sizes B ...``, each convolutional
network's ``--multi-batch`` images are also predicted in passes of B (``batch_size``) on one device
and on the N: the ``pass_sizes`` rows, what predict's default pass of an array is set from
(``malinn.model.batches.ARRAY_PASS_BYTES``, ``SPREAD_PASS_BYTES``). The devices are the
first N GPUs malinn finds; where there are fewer (a machine with one CPU device), the first device
listed N times, which shows the splitting's cost, not a speedup (``same_device`` says so).

The results go to ``benchmarks/results/throughput_<device>.json``. --quick: the two Partial
networks at batch 1024 and 8192, 3 repeats, no convolutional network (a minute on a 2-core CPU).

Run:  python benchmarks/throughput.py [--device D] [--devices N [--multi-batch B] [--pass-sizes B ...]] [--auto-split] [--breakdown] [--pinned] [--steps] [--repeat 10] [--quick]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import harness
import numpy as np
from harness import block_median_times, median_time, torch_cuda
from models import MODELS, build, numpy_forward, step_seconds, torch_forward

import malinn

MLP_BATCHES = (1024, 8192)
CNN_BATCHES = (32, 256)
#: keras.applications name -> torchvision's name of the same network
CNNS = {"MobileNetV2": "mobilenet_v2", "EfficientNetB0": "efficientnet_b0"}
CNN_SIZE = 224

SAVE_KERAS = """
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
import keras
keras.utils.set_random_seed(0)
getattr(keras.applications, sys.argv[1])(weights=None, input_shape=(int(sys.argv[2]), int(sys.argv[2]), 3)).save(sys.argv[3])
"""


def keras_network(name: str, folder: Path, saved: Path | None = None) -> Path:
    """``name`` from keras.applications (random weights) saved as a .keras file by TensorFlow in a
    child process (TensorFlow never shares malinn's process); or ``saved/<name>.keras`` where that
    exists (a machine without TensorFlow)."""
    if saved is not None and (saved / f"{name}.keras").exists():
        return saved / f"{name}.keras"
    path = folder / f"{name}.keras"
    out = subprocess.run(
        [sys.executable, "-c", SAVE_KERAS, name, str(CNN_SIZE), str(path)], capture_output=True, text=True, timeout=900
    )
    if out.returncode != 0:
        raise RuntimeError(f"saving keras.applications.{name} failed:\n{out.stderr[-2000:]}")
    return path


def torch_cnn(torch, name: str):
    """torchvision's ``name`` (random weights) on the GPU, host to host: NHWC numpy in, numpy out."""
    import torchvision

    model = getattr(torchvision.models, name)(weights=None).eval().cuda()

    def run(x):
        with torch.inference_mode():
            return model(torch.from_numpy(x).cuda().permute(0, 3, 1, 2)).cpu().numpy()

    return run


def row(network: str, batch: int, seconds: float, peer: str | None, peer_seconds: float | None, **extra) -> dict:
    found = {
        "network": network,
        "batch": batch,
        "seconds": seconds,
        "samples_per_s": batch / seconds,
        "peer": peer,
        "peer_seconds": peer_seconds,
        "peer_samples_per_s": batch / peer_seconds if peer_seconds else None,
        "ratio": peer_seconds / seconds if peer_seconds else None,
        **extra,
    }
    peer_text = (
        f"{peer} {found['peer_samples_per_s']:>12,.0f}/s  malinn/peer {found['ratio']:.2f}x"
        if peer_seconds
        else f"no peer ({extra.get('peer_note', '')})"
    )
    print(f"{network:<16} batch {batch:>5}: malinn {found['samples_per_s']:>12,.0f}/s   {peer_text}", flush=True)
    return found


def time_split(model, batch: int, device, seconds: float, repeat: int) -> dict:
    """``{"kernels_s", "transfers_s", "staged"}``: the plan's launches alone (enqueued, then the
    queue finished), the rest of ``seconds``, and whether the input moved through a staging ring."""
    plan = model.plan(batch, device)

    def kernels():
        device.launch_all(plan.launches)
        device.finish()

    kernel_seconds = median_time(kernels, repeat, warmup=2)
    staged = any(ring is not None for ring in getattr(plan, "_rings", ([], []))[0])
    return {"kernels_s": kernel_seconds, "transfers_s": max(0.0, seconds - kernel_seconds), "staged": staged}


def breakdown(model, x, device, seconds: float, repeat: int) -> dict:
    """Where one ``model.predict(x)`` of ``seconds`` spends its time on the host, each stage timed
    alone (medians of ``repeat``, the queue finished after each): ``dispatch_s`` (predict's checks
    and choices: the predict less its plan's run), ``upload_s`` (the plan's input side: its host
    copies, a ring's chunks, the device copy), ``kernels_s``, ``download_s`` (the output side: the
    device copy and any host copy out of a staging array or ring), and the bare transfers of the
    same bytes in the same run: ``pageable_upload_s`` / ``pageable_download_s`` (one ``enqueue_copy``
    from the caller's array into the input buffer, and of the output's floats into a new array),
    ``pinned_upload_s`` (from a page-locked copy of the input; null where the device has no
    page-locked host memory). ``host_s`` = dispatch + upload + download, ``host_beyond_bare_s`` that
    less the two pageable transfers (the host work a predict adds to moving its data, stage by stage:
    free of the kernels' spread on a CPU device); ``beyond_transfers_s`` = ``seconds`` less the
    kernels and the two pageable transfers (the same, pipelining and waits included)."""
    import pyopencl as cl

    n = x.shape[0]
    plan = model.plan(n, device)
    queue = plan.queue

    def upload():
        with plan.lock:
            device.run_pass(plan._send([x], n), [], [], queue)
            queue.finish()

    def kernels():
        device.launch_all(plan.launches)
        queue.finish()

    def download():
        with plan.lock:
            results, downloads = plan._results(n)
            device.run_pass([], [], downloads, queue)
            plan._receive(results, n)

    (source,), (target,) = plan._io[0], plan._io[1]
    samples = np.empty((n,) + target.sample_shape, np.float32)

    def bare(to_device: bool, host: np.ndarray):
        def copy():
            if to_device:
                cl.enqueue_copy(queue, source.buffer, host, is_blocking=False)
                queue.finish()
            else:
                cl.enqueue_copy(queue, host, target.buffer, is_blocking=True)

        return copy

    pinned = device.host_array(x.shape, "the input's page-locked copy") if device.stages_output(x.nbytes) else None
    if pinned is not None:
        pinned[...] = x
    found = {
        "dispatch_s": dispatch_seconds(model, plan, x, repeat),
        "upload_s": median_time(upload, repeat, warmup=2),
        "kernels_s": median_time(kernels, repeat, warmup=2),
        "download_s": median_time(download, repeat, warmup=2),
        "pageable_upload_s": median_time(bare(True, x), repeat, warmup=2),
        "pageable_download_s": median_time(bare(False, samples), repeat, warmup=2),
        "pinned_upload_s": median_time(bare(True, pinned), repeat, warmup=2) if pinned is not None else None,
        "input": "ring" if plan._rings[0][0] is not None else "direct" if source.direct else "staging array",
        "output": "ring" if plan._rings[1][0] is not None else "direct" if target.direct else "staging array",
    }
    bare = found["pageable_upload_s"] + found["pageable_download_s"]
    found["host_s"] = found["dispatch_s"] + found["upload_s"] + found["download_s"]
    found["host_beyond_bare_s"] = found["host_s"] - bare
    found["beyond_transfers_s"] = seconds - found["kernels_s"] - bare
    return found


def dispatch_seconds(model, plan, x, repeat: int) -> float:
    """A ``model.predict(x)`` with its plan's run made a no-op (on this plan object only, put back
    after): predict's own checks and choices, without a transfer or a kernel."""
    plan.run = lambda arrays: [None]
    try:
        return median_time(lambda: model.predict(x, verbose=0), repeat, warmup=2)
    finally:
        del plan.run


def pinned_row(model, x, y, device, torch, weights, repeat: int) -> dict:
    """The row's predict with its input in page-locked memory (``malinn.empty_pinned``: a full pass
    is one DMA), beside torch's forward from a ``pin_memory()`` tensor (``non_blocking`` upload) where
    torch sees a CUDA GPU, and a plain upload of the same page-locked bytes (``enqueue_copy``: the
    bus's pace, what the plan's upload is measured against)."""
    import pyopencl as cl

    pinned = malinn.empty_pinned(x.shape, device=device)
    pinned[...] = x
    got = model.predict(pinned, verbose=0)
    np.testing.assert_array_equal(got, y)
    seconds = median_time(lambda: model.predict(pinned, verbose=0), repeat, warmup=2)
    plan = model.plan(x.shape[0], device)
    ((buffer, *_),) = plan._io[0]

    def upload():
        with plan.lock:
            device.run_pass(plan._send([pinned], x.shape[0]), [], [], plan.queue)
            plan.queue.finish()

    def bare():
        cl.enqueue_copy(plan.queue, buffer, pinned, is_blocking=False)
        plan.queue.finish()

    found = {
        "seconds": seconds,
        "samples_per_s": x.shape[0] / seconds,
        "upload_s": median_time(upload, repeat, warmup=2),
        "bare_pinned_upload_s": median_time(bare, repeat, warmup=2),
        "page_locked": bool(device.page_locked(pinned)),
    }
    found["upload_over_bus"] = found["bare_pinned_upload_s"] / found["upload_s"]
    if torch is not None:
        run_peer, xt = torch_forward(torch, weights), torch.from_numpy(x).pin_memory()
        found["peer_seconds"] = median_time(lambda: run_peer(xt), repeat, warmup=2)
        found["ratio"] = found["peer_seconds"] / seconds
    return found


def pinned_text(found: dict) -> str:
    peer = (
        f", torch from pinned memory {found['peer_seconds'] * 1e3:.3f} ms: {found['ratio']:.2f}x"
        if "ratio" in found
        else ""
    )
    return (
        f"{'':<16} from page-locked input: {found['seconds'] * 1e3:.3f} ms, upload {found['upload_s'] * 1e3:.3f} ms "
        f"({found['upload_over_bus']:.2f}x the bus: {found['bare_pinned_upload_s'] * 1e3:.3f} ms){peer}"
    )


def breakdown_text(found: dict, seconds: float) -> str:
    ms = {k: v * 1e3 for k, v in found.items() if k.endswith("_s") and v is not None}
    pinned = f", pinned {ms['pinned_upload_s']:.3f}" if "pinned_upload_s" in ms else ""
    return (
        f"{'':<16} dispatch {ms['dispatch_s']:.3f} ms, upload {ms['upload_s']:.3f} ({found['input']}), kernels "
        f"{ms['kernels_s']:.3f}, download {ms['download_s']:.3f} ({found['output']}); bare transfers: up "
        f"{ms['pageable_upload_s']:.3f}{pinned}, down {ms['pageable_download_s']:.3f}; host {ms['host_s']:.3f} ms, "
        f"{ms['host_beyond_bare_s']:+.3f} beyond the bare transfers; predict {seconds * 1e3:.3f} ms, "
        f"{ms['beyond_transfers_s']:+.3f} beyond kernels and bare transfers"
    )


def split_text(split: dict, seconds: float) -> str:
    return (
        f"{'':<16} {seconds * 1e3:8.3f} ms: kernels {split['kernels_s'] * 1e3:.3f} ms, transfers and host copies "
        f"{split['transfers_s'] * 1e3:.3f} ms{' (input staged in chunks)' if split['staged'] else ''}"
    )


def auto_split(model, x, device, seconds: float, repeat: int, network: str) -> dict:
    """``x`` predicted in two shares on ``device`` (two plans, the second on a queue of its own where
    the device overlaps them), checked against one pass, timed."""
    one = model.predict(x, verbose=0)
    two = model.predict(x, devices=[device, device], verbose=0)
    np.testing.assert_allclose(two, one, rtol=1e-4, atol=1e-4)
    split_seconds = median_time(lambda: model.predict(x, devices=[device, device], verbose=0), repeat, warmup=2)
    found = {
        "network": network,
        "batch": x.shape[0],
        "overlap_queues": bool(device.overlap_queues),
        "seconds": split_seconds,
        "samples_per_s": x.shape[0] / split_seconds,
        "one_pass_samples_per_s": x.shape[0] / seconds,
        "speedup": seconds / split_seconds,
    }
    print(
        f"{'':<16} in two shares on one device{'' if device.overlap_queues else ' (one queue)'}: "
        f"{found['samples_per_s']:>12,.0f}/s, {found['speedup']:.2f}x one pass",
        flush=True,
    )
    return found


def several(model, x, pool: list, same: bool, network: str, seconds: float | None, repeat: int, y=None) -> dict:
    """A ``multi_device`` row: ``x`` predicted on the devices of ``pool`` at once (the batch split in
    shares, one pass in flight per device) beside one device's ``seconds`` (timed here where None), the
    results checked against one device's ``y`` (predicted here where None)."""
    if y is None:
        y = model.predict(x, verbose=0)
    if seconds is None:
        seconds = median_time(lambda: model.predict(x, verbose=0), repeat, warmup=1)
    spread = model.predict(x, devices=pool, verbose=0)
    np.testing.assert_allclose(spread, y, rtol=1e-4, atol=1e-4)
    spread_seconds = median_time(lambda: model.predict(x, devices=pool, verbose=0), repeat, warmup=1)
    batch = x.shape[0]
    print(
        f"{network:<16} batch {batch:>5} on {len(pool)} devices{' (one device listed twice)' if same else ''}: "
        f"{batch / spread_seconds:>12,.0f}/s, {seconds / spread_seconds:.2f}x one device "
        f"({batch / seconds:,.0f}/s)",
        flush=True,
    )
    return {**multi_row(network, batch, pool, seconds, spread_seconds), "same_device": same}


def multi_row(network: str, batch: int, pool: list, one: float, spread: float) -> dict:
    """A multi-device row's figures: ``batch`` samples in ``one`` second(s) on one device and
    ``spread`` on the devices of ``pool``."""
    return {
        "network": network,
        "batch": batch,
        "devices": [f"{d.index[0]}:{d.index[1]} {d.name}" for d in pool],
        "seconds": spread,
        "samples_per_s": batch / spread,
        "one_device_seconds": one,
        "one_device_samples_per_s": batch / one,
        "speedup": one / spread,
    }


def several_pinned(model, x, pool: list, network: str, repeat: int, y) -> dict:
    """A ``multi_device_pinned`` row: :func:`several` with ``x`` in page-locked memory
    (``malinn.empty_pinned`` of the first device), one device against the devices of ``pool``."""
    pinned = malinn.empty_pinned(x.shape, device=pool[0])
    pinned[...] = x
    np.testing.assert_allclose(model.predict(pinned, devices=pool, verbose=0), y, rtol=1e-4, atol=1e-4)
    one = median_time(lambda: model.predict(pinned, devices=pool[:1], verbose=0), repeat, warmup=1)
    spread = median_time(lambda: model.predict(pinned, devices=pool, verbose=0), repeat, warmup=1)
    batch = x.shape[0]
    print(
        f"{network:<16} batch {batch:>5} from page-locked memory on {len(pool)} devices: "
        f"{batch / spread:>12,.0f}/s, {one / spread:.2f}x one device ({batch / one:,.0f}/s)",
        flush=True,
    )
    return multi_row(network, batch, pool, one, spread)


def pass_size(model, x, size: int, pool: list, network: str, repeat: int) -> dict:
    """A ``pass_sizes`` row: ``x`` predicted in passes of ``size`` samples (``batch_size``) on one
    device, and spread over the devices of ``pool`` where they are several."""
    one = median_time(lambda: model.predict(x, batch_size=size, verbose=0), repeat, warmup=1)
    found = {"network": network, "batch": x.shape[0], "pass_samples": size, "pass_bytes": x[:size].nbytes}
    found.update(one_device_seconds=one, one_device_samples_per_s=x.shape[0] / one)
    text = f"{network:<16} batch {x.shape[0]:>5} in passes of {size:>5}: {x.shape[0] / one:>10,.0f}/s"
    if len(pool) > 1:
        spread = median_time(lambda: model.predict(x, batch_size=size, devices=pool, verbose=0), repeat, warmup=1)
        found.update(devices=len(pool), seconds=spread, samples_per_s=x.shape[0] / spread, speedup=one / spread)
        text += f", on {len(pool)} devices {x.shape[0] / spread:>10,.0f}/s ({one / spread:.2f}x)"
    print(text, flush=True)
    return found


def several_devices(count: int) -> tuple[list, bool]:
    """The first ``count`` OpenCL GPUs, or (fewer there) the current device ``count`` times; and
    whether the list repeats one device."""
    gpus = [d for d in malinn.devices() if d.kind == "gpu" and d.backend == "opencl"]
    if len(gpus) >= count:
        return gpus[:count], False
    return [malinn.get_device()] * count, True


def main(argv=None):
    parser = harness.arguments(__doc__, repeat=10)
    parser.add_argument(
        "--devices",
        type=int,
        default=1,
        help="also predict each MLP at its largest batch, and each convolutional network at --multi-batch, "
        "on this many devices at once (default 1: not)",
    )
    parser.add_argument(
        "--pass-sizes",
        type=int,
        nargs="+",
        help="also predict each convolutional network's --multi-batch images in passes of each of these "
        "sizes (batch_size), on one device and on --devices (the 'pass_sizes' rows)",
    )
    parser.add_argument(
        "--multi-batch",
        type=int,
        default=8192,
        help="the convolutional networks' batch on --devices (default 8192: in passes, 4.9 GB of input)",
    )
    parser.add_argument(
        "--networks",
        nargs="+",
        choices=list(MODELS) + list(CNNS),
        help="the networks to time (default: all; --quick: the two Partial MLPs)",
    )
    parser.add_argument(
        "--models",
        type=Path,
        help=f"a folder of saved keras.applications files <name>.keras at {CNN_SIZE}x{CNN_SIZE} "
        "(default: saved here by TensorFlow in a child process)",
    )
    parser.add_argument(
        "--auto-split",
        action="store_true",
        help="also predict each MLP at batch 8192 in two shares on the one device, each on a queue of its own",
    )
    parser.add_argument(
        "--batches",
        type=int,
        nargs="+",
        default=list(MLP_BATCHES),
        help=f"the MLPs' batch sizes (default: {' '.join(map(str, MLP_BATCHES))})",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also time each MLP predict's stages alone (dispatch, upload, kernels, download) beside the "
        "bare transfers of the same bytes (a row's 'breakdown')",
    )
    parser.add_argument(
        "--pinned",
        action="store_true",
        help="also time each MLP from page-locked input memory: malinn.empty_pinned beside torch's "
        "pin_memory() (a row's 'pinned'), and with --devices the MLPs' multi-device rows from it too "
        "('multi_device_pinned')",
    )
    parser.add_argument(
        "--steps",
        action="store_true",
        help="also give each MLP row its plan's steps, each launch's median device seconds (a row's 'steps')",
    )
    args = harness.parse(parser, argv)
    device = harness.devices(args.device)[0]
    torch = torch_cuda()
    peer = "torch" if torch is not None else "numpy"
    why = None if torch is not None else "torch with a CUDA GPU is not available here"
    names = args.networks or (["Partial MNIST", "Partial CIFAR"] if args.quick else list(MODELS) + list(CNNS))
    rng = np.random.default_rng(0)
    rows, multi, multi_pinned, split_rows, pass_rows = [], [], [], [], []
    pool, same = several_devices(args.devices) if args.devices > 1 else ([device], False)
    print(f"malinn on {device.name}; peer: {peer}" + (f" ({why})" if why else ""), flush=True)
    for name in [n for n in names if n in MODELS]:
        widths = MODELS[name]
        model = build(widths)
        weights = model.get_weights()
        run_peer = torch_forward(torch, weights) if torch is not None else (lambda x, w=weights: numpy_forward(w, x))
        for batch in args.batches:
            x = rng.uniform(-1, 1, (batch, widths[0])).astype(np.float32)
            y = model.predict(x, verbose=0)
            timed = block_median_times(
                {"malinn": lambda: model.predict(x, verbose=0), "peer": lambda: run_peer(x)}, args.repeat
            )
            seconds, peer_seconds = timed["malinn"], timed["peer"]
            split = time_split(model, batch, device, seconds, args.repeat)
            extra = {"breakdown": breakdown(model, x, device, seconds, args.repeat)} if args.breakdown else {}
            if args.pinned:
                extra["pinned"] = pinned_row(model, x, y, device, torch, weights, args.repeat)
            if args.steps:
                extra["steps"] = step_seconds(model.plan(batch, device), x, args.repeat)
            if len(pool) > 1 and batch == max(args.batches):
                multi.append(several(model, x, pool, same, name, seconds, args.repeat, y))
                if args.pinned:
                    multi_pinned.append(several_pinned(model, x, pool, name, args.repeat, y))
            # the numpy reference last: its BLAS threads spin on the host's cores for a while after a
            # large product, and a predict timed then lost up to a third to them (its copy threads)
            error = float(np.abs(y - numpy_forward(weights, x)).max())
            rows.append(row(name, batch, seconds, peer, peer_seconds, max_abs_error=error, split=split, **extra))
            print(split_text(split, seconds), flush=True)
            if args.breakdown:
                print(breakdown_text(extra["breakdown"], seconds), flush=True)
            if args.pinned:
                print(pinned_text(extra["pinned"]), flush=True)
            for step in extra.get("steps", []):
                print(f"{'':<16} {step['seconds'] * 1e3:8.3f} ms  {step['kind']:<9} {step['kernel'][:60]}", flush=True)
            if args.auto_split and batch >= 8192:
                split_rows.append(auto_split(model, x, device, seconds, args.repeat, name))
    cnns = [n for n in names if n in CNNS]
    if cnns:
        with tempfile.TemporaryDirectory(prefix="malinn-throughput-") as folder:
            for name in cnns:
                model = malinn.load_model(keras_network(name, Path(folder), args.models))
                run_peer = torch_cnn(torch, CNNS[name]) if torch is not None else None
                for batch in CNN_BATCHES:
                    x = rng.uniform(0, 1, (batch, CNN_SIZE, CNN_SIZE, 3)).astype(np.float32)
                    finite = bool(np.isfinite(model.predict(x, verbose=0)).all())
                    fns = {"malinn": lambda: model.predict(x, verbose=0)}
                    if run_peer is not None:
                        fns["peer"] = lambda: run_peer(x)
                    timed = block_median_times(fns, args.repeat, warmup=3)
                    seconds = timed["malinn"]
                    split = time_split(model, batch, device, seconds, args.repeat)
                    if run_peer is not None:
                        rows.append(
                            row(
                                name,
                                batch,
                                seconds,
                                "torch",
                                timed["peer"],
                                finite=finite,
                                split=split,
                            )
                        )
                    else:
                        rows.append(
                            row(
                                name,
                                batch,
                                seconds,
                                None,
                                None,
                                finite=finite,
                                split=split,
                                peer_note="torch with a CUDA GPU is not available here; numpy has no "
                                "convolutional network to compare with",
                            )
                        )
                    print(split_text(split, seconds), flush=True)
                if len(pool) > 1 or args.pass_sizes:  # a data set's worth, in passes
                    x = rng.random((args.multi_batch, CNN_SIZE, CNN_SIZE, 3), dtype=np.float32)
                    if len(pool) > 1:
                        multi.append(several(model, x, pool, same, name, None, max(3, args.repeat // 3)))
                    for size in args.pass_sizes or ():
                        pass_rows.append(pass_size(model, x, size, pool, name, max(3, args.repeat // 3)))
                    del x
    fields = {
        "peer": peer,
        "peer_version": torch.__version__ if torch is not None else np.__version__,
        "repeat": args.repeat,
        "multi_device": multi,
        "multi_device_pinned": multi_pinned,
        "auto_split": split_rows,
        "pass_sizes": pass_rows,
    }
    if why:
        fields["peer_note"] = why
    harness.save("throughput", device, rows, args, **fields)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
