"""A sweep of the implicit-GEMM convolution (conv_implicit) on the layers under 0.5x cuDNN.

For each layer at its batch (the misses in benchmarks/results/convolution_nvidia_h200.json:
AlexNet conv2 at batch 1 and 8, conv5 at batch 8, VGG-16 conv4_3 at batch 1, GoogLeNet
inception_5b/5x5 at batch 8; stride 1, 'same' padding, ReLU), in one run:
  * cuDNN (torch, fp32, TF32 off, CUDA events), when torch sees a CUDA GPU;
  * the plan's untuned default and the algorithms that were the best before (kn2col's implicit
    GEMM LOCAL=2 in its two configurations, im2row through the device's GEMM);
  * conv_implicit in each configuration of a grid (tiles TM x TN with RM x RN per item, KT
    channels a K step, the K split over SLICES work-groups, with and without PREFETCH, one or two
    local buffers), nearest to 2 work-groups per SM first, until --budget seconds are spent.
Each configuration's output is checked against cuDNN's (or, without torch, the default plan's);
the time is the device time of the convolution's launches (OpenCL profiling, median of --repeat).
Then the check: the --check leading configurations (nearest the best on every swept layer; the
K split chosen per layer) on every other layer of benchmarks/convolution.py at batch 1 and 8, beside
the plan's default, so that a conv rule can be chosen without losing a layer that met 0.5x.
Prints a line per configuration and a summary per layer (the best conv_implicit configuration,
the best before, their ratios to cuDNN); --json writes everything.

Run:  python3 benchmarks/conv_sweep.py --json benchmarks/results/conv_sweep_nvidia_h200.json
      (--quick: two small layers and a few configurations, a smoke test on a CPU)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

import malinn
from malinn.choice import kernel_choice

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convolution import ALGORITHMS, chosen, conv_model, launch_seconds, torch_conv  # noqa: E402
from convolution import LAYERS as CONV_LAYERS  # noqa: E402
from convolution import QUICK as CONV_QUICK
from peers import torch_cuda  # noqa: E402

#: (network, layer, H=W, C, M, k, batch)
LAYERS = [
    ("AlexNet", "conv2", 27, 96, 256, 5, 1),
    ("AlexNet", "conv2", 27, 96, 256, 5, 8),
    ("AlexNet", "conv5", 13, 384, 256, 3, 8),
    ("VGG-16", "conv4_3", 28, 512, 512, 3, 1),
    ("GoogLeNet", "inception_5b/5x5", 7, 48, 128, 5, 8),
]
QUICK_LAYERS = [("AlexNet", "conv5 (small)", 13, 32, 32, 3, 1), ("GoogLeNet", "5x5 (small)", 7, 12, 16, 5, 2)]
#: the algorithms timed besides conv_implicit (names of benchmarks/convolution.py's ALGORITHMS)
BEFORE = ("implicit", "implicit-32", "im2row")
#: work-group tiles (TM, TN, RM, RN): output channels x pixels per work-group, per item
TILES = [(64, 64, 8, 4), (128, 64, 8, 8), (128, 32, 8, 4), (64, 32, 8, 2), (64, 32, 4, 4), (32, 64, 4, 4)]
KTS = (16, 32)
SLICES = (1, 2, 4, 8, 16)
#: a K split only while the work-groups stay at most this many (8 per SM of an H200: more is no use)
MAX_GROUPS = 1056
#: local memory a work-group may take (NVIDIA: 48 KiB): DOUBLE only where its two buffers fit
LOCAL_LIMIT = 48 * 1024
#: the work-groups a configuration would best make (2 per SM of an H200): the grid's order
TARGET_GROUPS = 264
QUICK_TILES = [(16, 16, 4, 2), (32, 16, 8, 2)]


def grid(quick: bool, m: int, n: int) -> list[dict]:
    """The conv_implicit configurations timed for a GEMM of m output channels x n pixels: every tile
    x KT x SLICES (those leaving at most MAX_GROUPS work-groups) with PREFETCH, with one local buffer
    and with two (DOUBLE) where they fit LOCAL_LIMIT, then each tile without PREFETCH at the first KT and no
    slices. Ordered by how near their work-groups come to TARGET_GROUPS, so that a spent budget
    leaves out the least likely."""
    tiles, kts, slices = (QUICK_TILES, (4, 8), (1, 4)) if quick else (TILES, KTS, SLICES)
    configs = []
    for tm, tn, rm, rn in tiles:
        groups = -(-m // tm) * -(-n // tn)
        for s in slices:
            if s > 1 and groups * s > MAX_GROUPS:
                continue
            for kt in kts:
                for double in ((0, 1) if 8 * kt * (tm + tn) + 4 <= LOCAL_LIMIT else (0,)):
                    configs.append(({"TM": tm, "TN": tn, "RM": rm, "RN": rn, "KT": kt, "SLICES": s, "PREFETCH": 1,
                                     "DOUBLE": double}, groups * s))
        configs.append(({"TM": tm, "TN": tn, "RM": rm, "RN": rn, "KT": kts[0], "SLICES": 1, "PREFETCH": 0,
                         "DOUBLE": 0}, 10 ** 9))
    return [c for c, _ in sorted(configs, key=lambda c: abs(math.log2(c[1] / TARGET_GROUPS)))]


def time_choice(model, device, x, batch, repeat, use=None) -> tuple:
    """(compute seconds, all launches seconds, output, chosen kernels) of the model's plan with
    ``use`` = (op, codename, config) forced, or the plan's own choice."""
    kernel_choice.forget(device)
    if use is not None:
        kernel_choice.use(use[0], use[1], device=device, config=use[2] if len(use) > 2 else None)
    y = model.predict(x)
    plan = model.plan(batch, device)
    total, own = launch_seconds(plan, x, repeat)
    return own, total, y, chosen(plan)


def time_layer(args, device, torch, layer, fixed, configs, budget: float) -> dict:
    """Times one layer: cuDNN, each of ``fixed`` ((kind, use) pairs: use as for :func:`time_choice`),
    then conv_implicit in each of ``configs`` until ``budget`` seconds have passed since the start."""
    begin = time.perf_counter()
    network, name, h, c, m, k, batch = layer
    model = conv_model(h, c, m, k)
    x = np.random.default_rng(1).standard_normal((batch, h, h, c), dtype=np.float32)
    flop = 2.0 * batch * h * h * m * c * k * k
    out = {"network": network, "layer": name, "hw": h, "c": c, "m": m, "k": k, "batch": batch, "rows": []}
    reference = None
    if torch is not None:
        out["cudnn_seconds"], _, x, reference = torch_conv(torch, model, batch, args.repeat)
    label = f"{network} {name} b{batch}"

    def record(kind, config, use):
        start = time.perf_counter()
        try:
            own, total, y, kernels = time_choice(model, device, x, batch, args.repeat, use)
        except malinn.MalinnError as exc:
            print(f"{label:<34} {kind:<14} {config}: failed: {str(exc).splitlines()[0]}", flush=True)
            out["rows"].append({"kind": kind, "config": config, "error": str(exc).splitlines()[0]})
            return
        want = reference if reference is not None else out.get("default_output")
        err = None if want is None else float(np.abs(y - want).max() / max(1.0, np.abs(want).max()))
        row = {"kind": kind, "config": config, "chosen": kernels, "compute_seconds": own, "device_seconds": total,
               "gflops": flop / own / 1e9, "error": err, "wall_seconds": time.perf_counter() - start}
        if "cudnn_seconds" in out:
            row["vs_cudnn"] = out["cudnn_seconds"] / own
        out["rows"].append(row)
        vs = f" {row['vs_cudnn']:5.2f}x cuDNN" if "vs_cudnn" in row else ""
        bad = "" if err is None or err < 1e-3 else f"  WRONG (error {err:.2g})"
        print(f"{label:<34} {kind:<14} {own * 1e6:9.1f} us {row['gflops']:7.0f} GFLOP/s{vs}  {kernels}{bad}",
              flush=True)
        if kind == "default" and reference is None:
            out["default_output"] = y

    for kind, use in fixed:
        record(kind, use[2] if use and len(use) > 2 else None, use)
    for i, config in enumerate(configs):
        if time.perf_counter() - begin > budget:
            print(f"{label:<34} budget of {budget:.0f} s spent: {len(configs) - i} configurations left untimed",
                  flush=True)
            out["untimed"] = configs[i:]
            break
        record("conv_implicit", config, ("conv", "conv_implicit", config))
    out.pop("default_output", None)
    ok = [r for r in out["rows"] if "compute_seconds" in r and (r["error"] is None or r["error"] < 1e-3)]
    out["best_implicit"] = min((r for r in ok if r["kind"] == "conv_implicit"), key=lambda r: r["compute_seconds"],
                               default=None)
    out["best_before"] = min((r for r in ok if r["kind"] != "conv_implicit"), key=lambda r: r["compute_seconds"],
                             default=None)
    return out


def shape_of(config: dict) -> tuple:
    """A configuration without its K split: what the check phase carries to other layers."""
    return tuple(sorted((k, v) for k, v in config.items() if k != "SLICES"))


def leaders(results, count: int) -> list[dict]:
    """The ``count`` configurations (without SLICES) nearest the best of every swept layer: the
    smallest sum over the layers of log(their best time over the layer's best conv_implicit time),
    each layer's best over its K splits; a configuration a layer did not time counts as 2x there."""
    scores = {}
    for r in results:
        times = {}
        for row in r["rows"]:
            if row["kind"] == "conv_implicit" and "compute_seconds" in row and (row["error"] or 0) < 1e-3:
                key = shape_of(row["config"])
                times[key] = min(times.get(key, math.inf), row["compute_seconds"])
        if times:
            best = min(times.values())
            for key in set(scores) | set(times):
                scores[key] = scores.get(key, 0.0) + (math.log(times[key] / best) if key in times else math.log(2))
    return [dict(key) for key, _ in sorted(scores.items(), key=lambda kv: kv[1])[:count]]


def with_slices(config: dict, m: int, n: int) -> dict:
    """``config`` with the smallest K split that gives the layer TARGET_GROUPS / 2 work-groups."""
    groups = -(-m // config["TM"]) * -(-n // config["TN"])
    return {**config, "SLICES": next((s for s in SLICES if groups * s >= TARGET_GROUPS // 2), SLICES[-1])}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="gpu, cpu, P:D or part of a device name (default: malinn's default device)")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs; the median counts (default: 10)")
    parser.add_argument("--quick", action="store_true", help="two small layers, a few configurations (a smoke test)")
    parser.add_argument("--budget", type=float, default=70,
                        help="seconds for the layers' grids, shared equally by the layers (default: 70)")
    parser.add_argument("--check", type=int, default=2,
                        help="leading configurations timed on the other layers afterwards (default: 2)")
    parser.add_argument("--check-budget", type=float, default=25,
                        help="seconds for the check, shared equally by the other layers (default: 25)")
    parser.add_argument("--json", metavar="PATH", help="also write the results, as JSON, to PATH")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    device = malinn.set_device(args.device) if args.device else malinn.get_device()
    torch = torch_cuda()
    print(f"device: {device}; torch cuDNN peer: {'yes' if torch is not None else 'no (no CUDA torch)'}")
    layers = QUICK_LAYERS if args.quick else LAYERS
    before = [("default", None)] + [(name, ALGORITHMS[name]) for name in BEFORE]
    results = [time_layer(args, device, torch, layer, before, grid(args.quick, layer[4], layer[6] * layer[2] ** 2),
                          args.budget / len(layers)) for layer in layers]
    # the check: the leading configurations on every other layer of benchmarks/convolution.py
    top = leaders(results, args.check)
    print(f"\ncheck: {top} on the other layers, beside the default (benchmarks/convolution.py's layers)")
    others = [(*layer, batch) for layer in (CONV_QUICK if args.quick else CONV_LAYERS)
              for batch in ((1, 2) if args.quick else (1, 8)) if layer[5] > 1 and (*layer, batch) not in layers]
    checks = [time_layer(args, device, torch, layer, [("default", None)],
                         [with_slices(config, layer[4], layer[6] * layer[2] ** 2) for config in top],
                         args.check_budget / max(1, len(others))) for layer in others]
    kernel_choice.forget(device)
    print(f"\n{'layer':<34} {'cuDNN us':>9} {'before us':>9} {'x':>5}  {'implicit us':>11} {'x':>5}  "
          "best configuration")
    for r in results + checks:
        cudnn, before, best = r.get("cudnn_seconds"), r["best_before"], r["best_implicit"]
        def ratio(row):
            return (f"{cudnn / row['compute_seconds']:5.2f}" if cudnn and row else f"{'-':>5}")
        print(f"{r['network'] + ' ' + r['layer'] + ' b' + str(r['batch']):<34} "
              f"{cudnn * 1e6 if cudnn else float('nan'):9.1f} "
              f"{before['compute_seconds'] * 1e6 if before else float('nan'):9.1f} {ratio(before)}  "
              f"{best['compute_seconds'] * 1e6 if best else float('nan'):11.1f} {ratio(best)}  "
              f"{best['config'] if best else None} (before: {before['kind'] if before else None})")
    print(f"sweep took {time.perf_counter() - start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device.describe(), "driver": device.driver_version,
                                               "layers": results, "leaders": top, "checks": checks,
                                               "command": " ".join(sys.argv),
                                               "seconds": time.perf_counter() - start}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
