"""Convolution without im2col: the kn2row seed's evaluation repeated, and a small CNN end to end.

1. Selected convolution layers of AlexNet, VGG-16 and GoogLeNet (stride 1, 'same' padding, ReLU, as
   in those networks), each run as a one-layer malinn model with every algorithm:
     kn2row   the accumulating kn2row kernel (conv_kn2row: channel planes row-major)
     kn2col   the same loop on Keras's NHWC order (conv_kn2col)
     im2row   the patch matrix with each pixel's patch contiguous, then the device's GEMM
     im2col   the patch matrix one patch element per row, then the device's GEMM
     kn2row-local, kn2col-local   the kn2row/kn2col kernels staging weights and shifted input in
              local memory (LOCAL=1: 64 x 64 tiles of 8 x 4 per item, 16 channels a step)
     implicit, implicit-32   kn2col's implicit GEMM (LOCAL=2: tiles loaded along the channels,
              4 floats a load; 64 x 64 tiles with 16 channels a step, 32 x 32 with 32)
     default  what the plan chooses untuned (malinn.choice.conv_choice: the library's conv_algorithms
              rules for the device's kind and the patch budget), its kernels in "kernels"
     tuned    what it chooses after `malinn tune`'s conv tuner timed this layer's candidates
              (malinn.tuning.conv_tuner.tune_convs, quick; in a temporary tuning database)
   (a 1x1 layer is a plain GEMM for all of them and is timed once, as "gemm"). For each: the device
   time of the plan's launches (OpenCL profiling events, median of --repeat; "compute" is the
   convolution's own launches, the rest re-layouts), the host-to-host predict time, and the peak
   device memory of its activations (the plan's arena) with "extra", what it holds beyond the
   input and the output (kn2row/kn2col: at most a padded output; im2col: the k^2 x input patches).
   Peer: torch's cuDNN convolution (fp32, TF32 off, NCHW, CUDA events; host to host too) at the
   same batch, when torch sees a CUDA GPU.
2. A CIFAR-style VGG (32x32x3: 2x conv64, pool, 2x conv128, pool, 2x conv256, pool, dense 256,
   dense 10 softmax) end to end, host to host, against torch on the GPU and TensorFlow-cpu (in a
   subprocess; it cannot share a process with PoCL), outputs checked against torch (without a CUDA
   torch: the tuned choice against the default's output; each layer's algorithms against its first
   fp32 row): with
   the untuned choices ("default") and after tuning its convolutions ("tuned").
3. A summary per layer: the fastest algorithm and the default's and tuned choice's ratio to cuDNN.

With ``--precision fp32 fp16-storage int8-weights`` each layer's algorithms run in each weight
precision in turn (rows carry ``precision`` and ``weight_bytes``; outputs checked against cuDNN's
fp32 within PRECISION_TOLERANCE).

The results go to ``benchmarks/results/convolution_<device>.json`` (``convolution_precision_<device>.json``
with several precisions) unless --out says otherwise.

Run:  python benchmarks/convolution.py [--device D] [--batches 1 8] [--repeat 10] [--precision P ...] [--out PATH]
      (--quick: three small layers at batch 1, the VGG at 1 and 8, no TensorFlow, 3 repeats: a smoke
      test on a CPU; --algorithms to time fewer)
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
from pathlib import Path

import harness
import numpy as np
from harness import median_time, tensorflow_model_times, torch_cuda

import malinn
from malinn.choice import conv_choice, kernel_choice, tuning_db
from malinn.layers import Conv2D, Dense, Flatten, MaxPooling2D
from malinn.tuning import conv_tuner

#: (network, layer, H=W, C, M, k): stride 1, 'same' padding
LAYERS = [
    ("AlexNet", "conv2", 27, 96, 256, 5),
    ("AlexNet", "conv3", 13, 256, 384, 3),
    ("AlexNet", "conv5", 13, 384, 256, 3),
    ("VGG-16", "conv1_2", 224, 64, 64, 3),
    ("VGG-16", "conv2_2", 112, 128, 128, 3),
    ("VGG-16", "conv3_3", 56, 256, 256, 3),
    ("VGG-16", "conv4_3", 28, 512, 512, 3),
    ("VGG-16", "conv5_3", 14, 512, 512, 3),
    ("GoogLeNet", "conv2/3x3", 56, 64, 192, 3),
    ("GoogLeNet", "inception_3a/1x1", 28, 192, 64, 1),
    ("GoogLeNet", "inception_3a/3x3", 28, 96, 128, 3),
    ("GoogLeNet", "inception_3a/5x5", 28, 16, 32, 5),
    ("GoogLeNet", "inception_4a/3x3", 14, 96, 208, 3),
    ("GoogLeNet", "inception_5b/5x5", 7, 48, 128, 5),
]
QUICK = [
    ("AlexNet", "conv5 (small)", 13, 32, 32, 3),
    ("GoogLeNet", "inception_3a/5x5", 28, 16, 32, 5),
    ("GoogLeNet", "inception_3a/1x1 (small)", 14, 32, 16, 1),
]
ALGORITHMS = {
    "kn2row": ("conv", "conv_kn2row"),
    "kn2col": ("conv", "conv_kn2col"),
    "im2row": ("im2col", "im2row"),
    "im2col": ("im2col", "im2col"),
    "kn2row-local": ("conv", "conv_kn2row", {"LOCAL": 1, "MWI": 8, "NWI": 4, "MDIM": 8, "NDIM": 16, "KC": 16}),
    "kn2col-local": ("conv", "conv_kn2col", {"LOCAL": 1, "MWI": 8, "NWI": 4, "MDIM": 8, "NDIM": 16, "KC": 16}),
    "implicit": ("conv", "conv_kn2col", {"LOCAL": 2, "MWI": 8, "NWI": 4, "MDIM": 8, "NDIM": 16, "KC": 16}),
    "implicit-32": ("conv", "conv_kn2col", {"LOCAL": 2, "MWI": 4, "NWI": 4, "MDIM": 8, "NDIM": 8, "KC": 32}),
}
#: the plan's own choices (no explicit kernel): untuned, then after the conv tuner
CHOICES = ("default", "tuned")
#: the CIFAR-style VGG: filters per conv (None: 2x2 max pooling), then the dense widths
VGG = [64, 64, None, 128, 128, None, 256, 256, None]
VGG_DENSE = [256, 10]


def conv_model(h, c, m, k, seed=0):
    rng = np.random.default_rng(seed)
    layer = Conv2D(m, k, padding="same", activation="relu")
    model = malinn.Sequential([layer])
    model.build((None, h, h, c))
    model.set_weights(
        [
            (rng.standard_normal(layer.kernel.shape) / np.sqrt(k * k * c)).astype(np.float32),
            rng.standard_normal(m).astype(np.float32) * 0.1,
        ]
    )
    return model


def launch_seconds(plan, x, repeat: int) -> tuple:
    """Median device seconds of all the plan's launches and of its convolution's own (not re-layouts)."""
    device = plan.device
    plan.run([x])
    compute = [s.launch is not None and s.kind.name not in ("relayout", "reshape") for s in plan.steps]
    compute = [flag for flag, s in zip(compute, plan.steps) if s.launch is not None]
    totals, own = [], []
    for _ in range(repeat):
        with device.lock:
            events = [launch.enqueue() for launch in plan.launches]
            device.finish()
        times = [(e.profile.end - e.profile.start) * 1e-9 for e in events]
        totals.append(sum(times))
        own.append(sum(t for t, flag in zip(times, compute) if flag))
    return float(np.median(totals)), float(np.median(own))


def memory(plan, x_shape, out_shape) -> dict:
    """Peak activation bytes (the plan's arena) and what it holds beyond the input and output:
    ``extra_bytes`` beyond their logical sizes, ``extra_padded_bytes`` beyond their buffers padded to
    the kernels' tiles (what an algorithm itself adds: kn2row's target is none beyond the output)."""
    _, _, arena = plan.activation_bytes()
    io = 4 * (int(np.prod(x_shape)) + int(np.prod(out_shape)))
    padded = sum(4 * v.storage.padded[0] * v.storage.padded[1] for v in plan.inputs + plan.outputs)
    return {
        "arena_bytes": arena,
        "input_bytes": 4 * int(np.prod(x_shape)),
        "output_bytes": 4 * int(np.prod(out_shape)),
        "extra_bytes": max(0, arena - io),
        "extra_padded_bytes": max(0, arena - padded),
        "weight_bytes": plan.weight_bytes(),
    }


def torch_conv(torch, model, batch, repeat):
    """cuDNN fp32 (TF32 off): device ms by CUDA events and host-to-host ms, plus its output (NHWC)."""
    layer = model.layers[0]
    w = torch.from_numpy(np.ascontiguousarray(layer.kernel.transpose(3, 2, 0, 1))).cuda()
    b = torch.from_numpy(layer.bias.copy()).cuda()  # the layer's own arrays are read-only
    pad = layer.kernel_size[0] // 2
    torch.backends.cudnn.benchmark = True
    x = np.random.default_rng(1).standard_normal((batch,) + tuple(model.input_shapes[0]), dtype=np.float32)
    xt = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).cuda()

    def device_run():
        return torch.relu(torch.nn.functional.conv2d(xt, w, b, padding=pad))

    for _ in range(3):
        device_run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        device_run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)

    def host_run():
        t = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).cuda()
        return torch.relu(torch.nn.functional.conv2d(t, w, b, padding=pad)).permute(0, 2, 3, 1).cpu().numpy()

    return float(np.median(times)), median_time(host_run, repeat, warmup=3), x, host_run()


def bench_layers(args, device, torch) -> list:
    rows = []
    for network, name, h, c, m, k in QUICK if args.quick else LAYERS:
        model = conv_model(h, c, m, k)
        for batch in args.batches:
            x = np.random.default_rng(1).standard_normal((batch, h, h, c), dtype=np.float32)
            reference = None
            peer = {}
            if torch is not None:
                seconds, host, x, reference = torch_conv(torch, model, batch, args.repeat)
                peer = {"torch_kernels": seconds, "torch": host}
            names = ["gemm"] if k == 1 else ["default"] + [a for a in ALGORITHMS if a in args.algorithms] + ["tuned"]
            for algorithm in names:
                kernel_choice.forget(device)
                if algorithm in ALGORITHMS:
                    op, codename, *config = ALGORITHMS[algorithm]
                    kernel_choice.use(op, codename, device=device, config=config[0] if config else None)
                elif algorithm == "tuned":
                    log = io.StringIO()
                    conv_tuner.tune_convs(
                        model.conv_geometries(batch, device), device, quick=True, budget_s=args.tune_budget, stream=log
                    )
                    tuning = log.getvalue()
                for precision in args.precision:
                    row = time_layer(
                        args,
                        device,
                        model,
                        x,
                        batch,
                        algorithm,
                        precision,
                        reference,
                        peer,
                        (network, name, h, c, m, k),
                    )
                    if reference is None and row is not None and precision == "fp32":
                        model.precision = "fp32"  # no cuDNN: every other row against this first fp32 one
                        reference = model.predict(x)
                    if row is None:
                        continue
                    if algorithm == "tuned":
                        row["tuning"] = tuning
                    rows.append(row)
    kernel_choice.forget(device)
    return rows


#: the largest error against cuDNN's fp32 output per weight precision (rel to max(1, |y|))
PRECISION_TOLERANCE = {"fp32": 1e-3, "fp16-storage": 1e-2, "int8-weights": 5e-2}


def time_layer(args, device, model, x, batch, algorithm, precision, reference, peer, layer) -> dict | None:
    """One row: the layer's plan at ``batch`` with its weights in ``precision``, checked and timed."""
    network, name, h, c, m, k = layer
    model.precision = precision
    plan = model.plan(batch, device)
    try:
        y = model.predict(x)
    except malinn.MalinnError as exc:  # im2col's k^2 x input may not fit a small device
        print(f"{network:<10} {name:<24} batch {batch:>2} {algorithm:<7} {precision} failed: {exc}", flush=True)
        return None
    if reference is not None:
        err = float(np.abs(y - reference).max() / max(1.0, np.abs(reference).max()))
        assert err < PRECISION_TOLERANCE[precision], (name, algorithm, precision, err)
    total, own = launch_seconds(plan, x, args.repeat)
    row = {
        "network": network,
        "layer": name,
        "hw": h,
        "c": c,
        "m": m,
        "k": k,
        "batch": batch,
        "algorithm": algorithm,
        "precision": precision,
        "kernels": [s.spec.codename for s in plan.steps],
        "chosen": chosen(plan),
        "device_seconds": total,
        "compute_seconds": own,
        "host_seconds": median_time(lambda: model.predict(x), args.repeat),
        "gflops": 2.0 * batch * h * h * m * c * k * k / own / 1e9,
        **memory(plan, x.shape, (batch, h, h, m)),
        **peer,
    }
    vs = f"  cuDNN {peer['torch_kernels'] * 1e3:8.3f} ms ({peer['torch_kernels'] / own:5.2f}x)" if peer else ""
    print(
        f"{network:<10} {name:<24} batch {batch:>2} {algorithm:<12} "
        + (f"{precision:<13}" if len(args.precision) > 1 else "")
        + f"compute {own * 1e3:8.3f} ms "
        f"({row['gflops']:7.0f} GFLOP/s), all launches {total * 1e3:8.3f} ms, host {row['host_seconds'] * 1e3:8.3f} ms, "
        f"arena {row['arena_bytes'] / 2**20:7.1f} MiB (extra {row['extra_bytes'] / 2**20:7.1f} MiB, beyond the padded input and output {row['extra_padded_bytes'] / 2**20:6.2f}, "
        f"output {row['output_bytes'] / 2**20:6.1f} MiB), weights {row['weight_bytes'] / 2**20:6.2f} MiB{vs}"
        + (f"  [{row['chosen']}]" if algorithm in CHOICES else ""),
        flush=True,
    )
    return row


def chosen(plan) -> str:
    """The convolution kernels a plan runs, each with the defines that differ from its entry's."""
    library = malinn.load_library()
    found = []
    for step in plan.steps:
        if step.kind.name in ("conv", "im2col"):
            base = library[step.spec.codename].config
            config = " ".join(
                f"{k}={v}"
                for k, v in step.spec.config.items()
                if base.get(k) != v
                and k not in conv_choice.ConvGeometry.__dataclass_fields__
                and k not in ("CG", "MG", "GROUPS", "CIN", "BIAS", "ACTIVATION", "AFFINE")
            )
            found.append(step.spec.codename + (f" ({config})" if config else ""))
    return ", ".join(found) or "gemm"


def summary(rows) -> list:
    """Per layer and batch: the fastest of the forced algorithms, and the default's and the tuned
    choice's ratio to cuDNN (its time over ours: >= 0.5 is the target)."""
    table = {}
    for row in rows:
        table.setdefault((row["network"], row["layer"], row["batch"], row["precision"]), []).append(row)
    found = []
    for (network, layer, batch, precision), group in table.items():
        best = min((r for r in group if r["algorithm"] not in CHOICES), key=lambda r: r["compute_seconds"])
        by = {r["algorithm"]: r for r in group}
        default, tuned = by.get("default", by.get("gemm")), by.get("tuned", by.get("gemm"))
        entry = {
            "network": network,
            "layer": layer,
            "batch": batch,
            "precision": precision,
            "best": best["algorithm"],
            "best_seconds": best["compute_seconds"],
            "default": default["chosen"] if default else None,
            "default_seconds": default["compute_seconds"] if default else None,
            "tuned": tuned["chosen"] if tuned else None,
            "tuned_seconds": tuned["compute_seconds"] if tuned else None,
        }
        cudnn = group[0].get("torch_kernels")
        if cudnn:
            entry.update(
                {
                    "best_vs_cudnn": cudnn / best["compute_seconds"],
                    "default_vs_cudnn": cudnn / default["compute_seconds"] if default else None,
                    "tuned_vs_cudnn": cudnn / tuned["compute_seconds"] if tuned else None,
                }
            )
        found.append(entry)
    print(
        f"\n{'layer':<34} {'batch':>5}  {'precision':<13} {'best':<12} {'vs cuDNN':>8}  {'default':>8}  {'tuned':>8}  "
        "default / tuned kernels"
    )
    for e in found:

        def ratio(key):
            return f"{e[key]:8.2f}" if e.get(key) is not None else f"{'-':>8}"

        print(
            f"{e['network'] + ' ' + e['layer']:<34} {e['batch']:>5}  {e['precision']:<13} {e['best']:<12} {ratio('best_vs_cudnn')}  "
            f"{ratio('default_vs_cudnn')}  {ratio('tuned_vs_cudnn')}  {e['default']} / {e['tuned']}"
        )
    for key in ("best_vs_cudnn", "default_vs_cudnn", "tuned_vs_cudnn"):
        values = [e[key] for e in found if e.get(key) is not None]
        if values:
            print(f"{key}: >= 0.5x cuDNN in {sum(v >= 0.5 for v in values)}/{len(values)} layer-batches")
    return found


def vgg_model(seed=0):
    rng = np.random.default_rng(seed)
    layers = [MaxPooling2D(2) if f is None else Conv2D(f, 3, padding="same", activation="relu") for f in VGG]
    layers += [Flatten(), Dense(VGG_DENSE[0], activation="relu"), Dense(VGG_DENSE[1], activation="softmax")]
    model = malinn.Sequential(layers)
    model.build((None, 32, 32, 3))
    weights = []
    for w in model.get_weights():
        fan_in = int(np.prod(w.shape[:-1])) if w.ndim > 1 else 1
        weights.append(
            (rng.standard_normal(w.shape) / np.sqrt(fan_in) * (1.4 if w.ndim > 1 else 0.1)).astype(np.float32)
        )
    model.set_weights(weights)
    return model


def torch_vgg(torch, model):
    ops = []
    for layer in model.layers:
        weights = [torch.from_numpy(np.ascontiguousarray(w)).cuda() for w in layer.get_weights()]
        if isinstance(layer, Conv2D):
            weights[0] = weights[0].permute(3, 2, 0, 1).contiguous()
        ops.append((type(layer).__name__, weights))

    def run(x):
        h = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).cuda()
        for name, w in ops:
            if name == "Conv2D":
                h = torch.relu(torch.nn.functional.conv2d(h, w[0], w[1], padding=1))
            elif name == "MaxPooling2D":
                h = torch.nn.functional.max_pool2d(h, 2)
            elif name == "Flatten":
                h = h.permute(0, 2, 3, 1).reshape(h.shape[0], -1)  # Keras flattens NHWC
            else:
                h = h @ w[0] + w[1]
                h = torch.relu(h) if w[0].shape[1] != VGG_DENSE[-1] else torch.softmax(h, dim=1)
        return h.cpu().numpy()

    return run


def tensorflow_vgg(model, batch, repeat) -> dict | None:
    """Median seconds of TensorFlow-cpu ``model(x)`` for the same VGG and weights, in a subprocess."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "weights.npz"
        np.savez(path, *model.get_weights())
        code = f"""L = tf.keras.layers
layers = [tf.keras.Input((32, 32, 3))]
for f in {VGG!r}:
    layers.append(L.MaxPooling2D(2) if f is None else L.Conv2D(f, 3, padding="same", activation="relu"))
layers += [L.Flatten(), L.Dense({VGG_DENSE[0]}, activation="relu"), L.Dense({VGG_DENSE[1]}, activation="softmax")]
model = tf.keras.Sequential(layers)
with np.load({str(path)!r}) as npz:
    model.set_weights([npz[f"arr_{{i}}"] for i in range(len(npz.files))])"""
        return tensorflow_model_times(code, (batch, 32, 32, 3), repeat, timeout=900)


def bench_vgg(args, device, torch) -> list:
    model = vgg_model()
    rows, checked = [], {}  # checked: the default choice's output per batch, where no cuDNN checks it
    batches = sorted(set(args.batches) | {args.vgg_batch})
    for choice in CHOICES:
        kernel_choice.forget(device)
        if choice == "tuned":
            geometries = [g for batch in batches for g in model.conv_geometries(batch, device)]
            conv_tuner.tune_convs(
                geometries, device, quick=True, budget_s=args.tune_budget * len(geometries), stream=io.StringIO()
            )
        for batch in batches:
            x = np.random.default_rng(1).random((batch, 32, 32, 3), dtype=np.float32)
            y = model.predict(x)
            plan = model.plan(batch, device)
            total, own = launch_seconds(plan, x, args.repeat)
            row = {
                "network": "CIFAR VGG",
                "choice": choice,
                "batch": batch,
                "malinn": median_time(lambda: model.predict(x), args.repeat),
                "device_seconds": total,
                "launches": len(plan.launches),
                "kernels": sorted({s.spec.codename for s in plan.steps}),
                "convs": chosen(plan),
                **memory(plan, x.shape, (batch, VGG_DENSE[-1])),
            }
            if torch is not None:
                run = torch_vgg(torch, model)
                reference = run(x)
                assert np.abs(y - reference).max() < 1e-3, np.abs(y - reference).max()
                row["torch"] = median_time(lambda: run(x), args.repeat, warmup=3)
            else:  # no cuDNN: the tuned choice against the default's output
                checked.setdefault(batch, y)
                assert np.abs(y - checked[batch]).max() < 1e-3, np.abs(y - checked[batch]).max()
            if not args.no_tensorflow and choice == "default":
                tf = tensorflow_vgg(model, batch, args.repeat)
                if tf is not None:
                    row["tensorflow"] = tf["seconds"]
            rows.append(row)
            peers = "  ".join(
                f"{p} {row[p] * 1e3:8.3f} ms ({row[p] / row['malinn']:5.2f}x)"
                for p in ("torch", "tensorflow")
                if p in row
            )
            print(
                f"CIFAR VGG {choice:<7} batch {batch:>3}: malinn {row['malinn'] * 1e3:8.3f} ms host to host "
                f"(device {total * 1e3:.3f} ms, {row['launches']} launches, arena "
                f"{row['arena_bytes'] / 2**20:.1f} MiB)  {peers}  [{row['convs']}]",
                flush=True,
            )
    kernel_choice.forget(device)
    return rows


def main(argv=None):
    parser = harness.arguments(__doc__, repeat=10)
    parser.add_argument("--batches", type=int, nargs="+", help="batch sizes (default: 1 8; 1 with --quick)")
    parser.add_argument("--vgg-batch", type=int, help="a larger batch for the VGG (default: 64; 8 with --quick)")
    parser.add_argument("--no-layers", action="store_true", help="skip the per-layer comparison")
    parser.add_argument("--no-vgg", action="store_true", help="skip the CIFAR-style VGG")
    parser.add_argument("--no-tensorflow", action="store_true", help="skip the TensorFlow-cpu peer")
    parser.add_argument(
        "--algorithms",
        nargs="+",
        choices=list(ALGORITHMS),
        help="the forced algorithms to time besides the default and tuned choices (default: all; kn2row, kn2col, im2col and implicit with --quick)",
    )
    parser.add_argument(
        "--tune-budget",
        type=float,
        help="seconds the conv tuner may spend per layer for the 'tuned' rows (default 4; 1 with --quick)",
    )
    parser.add_argument(
        "--precision",
        nargs="+",
        default=["fp32"],
        choices=list(PRECISION_TOLERANCE),
        help="the layers' weight precisions, each timed per algorithm (default: fp32)",
    )
    args = harness.parse(parser, argv)
    args.batches = args.batches or ([1] if args.quick else [1, 8])
    args.vgg_batch = args.vgg_batch or (8 if args.quick else 64)
    args.tune_budget = args.tune_budget or (1.0 if args.quick else 4.0)
    args.no_tensorflow = args.no_tensorflow or args.quick
    args.algorithms = args.algorithms or (
        ["kn2row", "kn2col", "im2col", "implicit"] if args.quick else list(ALGORITHMS)
    )
    # the tuned rows' winners go to a temporary tuning database, never the user's
    os.environ["MALINN_CACHE_DIR"] = tempfile.mkdtemp(prefix="malinn-conv-bench-")
    tuning_db.forget()
    (device,) = harness.devices(args.device)
    torch = torch_cuda()
    print(f"device: {device}; torch cuDNN peer: {'yes' if torch is not None else 'no (no CUDA torch)'}")
    layers = [] if args.no_layers else bench_layers(args, device, torch)
    vgg = [] if args.no_vgg else bench_vgg(args, device, torch)
    table = summary(layers) if layers else []
    harness.save(
        "convolution_precision" if len(args.precision) > 1 else "convolution",
        device,
        layers,
        args,
        conv_default=malinn.ops.kernel_for("conv", device).codename,
        conv_rules=conv_choice._section(),
        patch_budget_bytes=conv_choice.patch_budget(device),
        summary=table,
        vgg=vgg,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
