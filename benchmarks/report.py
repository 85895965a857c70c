"""Writes docs/PERFORMANCE.md and docs/gemm.png from the JSON results in benchmarks/results/.

Run after the benchmarks (each writes its JSON with --json):  python3 benchmarks/report.py
Needs matplotlib for the plot (pip install .[bench]); the tables are written without it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def load(name):
    path = RESULTS / name
    return json.loads(path.read_text()) if path.is_file() else None


def gemm_table(d):
    cols = [k for k in d["rows"][0] if k != "n"]
    out = [f"Device: {d['device']['name']} ({d['device']['platform']}), driver {d['driver']}; tuned kernel: "
           f"`{d.get('tuned', '?')}`.", "", "| n | " + " | ".join(cols) + " |", "|" + " --- |" * (len(cols) + 1)]
    out += [f"| {r['n']} | " + " | ".join(f"{r[c]:.0f}" if r[c] >= 100 else f"{r[c]:.1f}" for c in cols) + " |"
            for r in d["rows"]]
    return out


def ratios(d, against):
    row = max(d["rows"], key=lambda r: r["n"])
    return {p: row["tuned"] / row[p] for p in against if p in row}, row["n"]


def models_table(d):
    peers = [p for p in ("numpy", "tensorflow", "torch") if any(p in r for r in d["rows"])]
    precision = any("precision" in r for r in d["rows"])
    out = [f"Device: {d['device']['name']}; default matmul kernel `{d['matmul']}`. Milliseconds per batch, host to "
           "host; in brackets the peer's time over malinn's (above 1: malinn is faster)"
           + ("; reduced precisions beside fp32 in the same run, `matmuls` their weight-streaming kernels' device "
              "time against fp32's" if precision else "")
           + (" (passes of the precisions interleaved: `matmul_interleaved`; the kernels column times each "
              "precision's passes back to back)" if any("matmul_interleaved" in r for r in d["rows"]) else "")
           + ".", "",
           "| model | batch | " + ("precision | " if precision else "") + "malinn | " + " | ".join(peers) + " |",
           "|" + " --- |" * (3 + precision + len(peers))]
    extra = "kernels" in d["rows"][0]
    if extra:
        out[2] = out[2].rstrip(" |") + " | launches | kernels (device) | weights read |"
        out[3] += " --- | --- | --- |"
        out[0] += (f" Weights read: their bytes over the matmul kernels' device time, beside a device-to-device copy "
                   f"of {d['copy_gbs']:.0f} GB/s (read + written) in the same run.")
    for r in d["rows"]:
        cells = [f"{r[p] * 1e3:.3f} ({r[p] / r['malinn']:.2f}x)" if p in r else "-" for p in peers]
        if extra:
            cells += [str(r["launches"]), f"{r['kernels'] * 1e3:.3f}",
                      f"{r['weights_gbs']:.0f} GB/s ({r['weights_gbs'] / r['copy_gbs']:.0%})"]
        if precision and r.get("precision", "fp32") != "fp32":
            cells[-3:] = [f"{cells[-3]}", f"{cells[-2]} (matmuls {r['speedup_matmul']:.2f}x faster)", cells[-1]]
        first = f"| {r['model']} | {r['batch']} | " + (f"{r.get('precision', 'fp32')} | " if precision else "")
        out.append(first + f"{r['malinn'] * 1e3:.3f} | " + " | ".join(cells) + " |")
    return out


def backends_table(d):
    """One run, several devices (models.py --device 0:0,gl:0): per network and batch each device's
    host-to-host time, each further device's time over the first's, and torch from the same run."""
    devices = d["devices"]
    first, others = devices[0]["index"], [x["index"] for x in devices[1:]]
    names = {x["index"]: f"{x['backend']} `{x['index']}`" for x in devices}
    out = ["Devices: " + "; ".join(f"{names[x['index']]} = {x['name']} ({x['platform']}), default matmul "
                                   f"`{x['matmul']}`" for x in devices)
           + ". Milliseconds per batch, host to host, all in one run; `x / y`: the times' ratio host to host, "
             "and in brackets of the launches alone (enqueue until the device finished, measured alike on both "
             "backends); above 1: slower than " + names[first] + ".", "",
           "| model | batch | " + " | ".join(names[i] for i in [first] + others) + " | "
           + " | ".join(f"{names[i]} / {names[first]}" for i in others) + " | torch |",
           "|" + " --- |" * (3 + 2 * len(others) + 1)]
    rows = {(r["model"], r["batch"], r["precision"], r["device"]): r for r in d["rows"]}
    ratios = {(r["model"], r["batch"], r["precision"], r["device"]): r for r in d.get("ratios", [])}
    for r in d["rows"]:
        if r["device"] != first:
            continue
        key = (r["model"], r["batch"], r["precision"])
        times = [f"{rows[key + (i,)]['malinn'] * 1e3:.3f}" if key + (i,) in rows else "-" for i in [first] + others]
        quotients = [f"**{ratios[key + (i,)]['malinn']:.2f}x** ({ratios[key + (i,)]['launch_wall']:.2f}x)"
                     if key + (i,) in ratios else "-" for i in others]
        torch = f"{r['torch'] * 1e3:.3f}" if "torch" in r else "-"
        precision = "" if r["precision"] == "fp32" else f" ({r['precision']})"
        out.append(f"| {r['model']}{precision} | {r['batch']} | " + " | ".join(times + quotients) + f" | {torch} |")
    return out


def convolution_table(d):
    """Per layer and batch: each algorithm's device time (compute launches), the best against cuDNN,
    the plan's untuned (default) and tuned choices against cuDNN where the run has them, extra memory."""
    choices = any(r["algorithm"] == "default" for r in d["layers"])
    head = f"Device: {d['device']['name']}; " + (
        "the plan's choice per layer by the library's conv_algorithms rules (default) and after the conv tuner (tuned)"
        if choices else f"default convolution kernel `{d.get('conv_default', '?')}`")
    out = [head + ". Device milliseconds of the convolution's own launches; cuDNN fp32 (TF32 off) by CUDA events; "
           "cuDNN's time over malinn's (0.5 is the target); `extra` the activation memory beyond input and output.",
           "", "| layer | batch | kn2row | kn2col | im2row | im2col | implicit | best / cuDNN |"
           + (" default / cuDNN | tuned / cuDNN |" if choices else "") + " extra kn2row / im2col |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- | --- |" if choices else "") + " --- |"]
    groups = {}
    for r in d["layers"]:
        groups.setdefault((r["network"], r["layer"], r["batch"]), {})[r["algorithm"]] = r
    for (network, layer, batch), algos in groups.items():
        def cell(a):
            return f"{algos[a]['compute_seconds'] * 1e3:.3f}" if a in algos else "-"
        implicit = min((r for a, r in algos.items() if a.startswith("implicit")), default=None,
                       key=lambda r: r["compute_seconds"])
        best = min((r for a, r in algos.items() if a not in ("default", "tuned")), key=lambda r: r["compute_seconds"])
        peer = best.get("torch_kernels")
        ratio = f"{best['algorithm']}: {peer / best['compute_seconds']:.2f}x" if peer else "-"
        chosen = ""
        if choices:
            for a in ("default", "tuned"):
                r = algos.get(a, algos.get("gemm"))
                chosen += (f" {r.get('chosen', 'gemm')}: {peer / r['compute_seconds']:.2f}x |" if r and peer else
                           f" {r.get('chosen', 'gemm') if r else '-'} |")
        mem = (f"{algos['kn2row']['extra_bytes'] / 2**20:.1f} / {algos['im2col']['extra_bytes'] / 2**20:.1f} MiB"
               if "kn2row" in algos and "im2col" in algos else "-")
        out.append(f"| {network} {layer} | {batch} | {cell('kn2row')} | {cell('kn2col')} | {cell('im2row')} | "
                   f"{cell('im2col')} | {implicit['compute_seconds'] * 1e3:.3f} | " if implicit else
                   f"| {network} {layer} | {batch} | {cell('kn2row')} | {cell('kn2col')} | {cell('im2row')} | "
                   f"{cell('im2col')} | - | ")
        out[-1] += f"{ratio} |{chosen} {mem} |"
    if choices:
        for key in ("best", "default", "tuned"):
            values = [e[f"{key}_vs_cudnn"] for e in d.get("summary", []) if e.get(f"{key}_vs_cudnn") is not None]
            if values:
                out += ["", f"- {key}: >= 0.5x cuDNN in {sum(v >= 0.5 for v in values)} of {len(values)} "
                        f"layer x batch cases ({min(values):.2f}-{max(values):.2f}x)."] if key == "best" else \
                       [f"- {key}: >= 0.5x cuDNN in {sum(v >= 0.5 for v in values)} of {len(values)} "
                        f"({min(values):.2f}-{max(values):.2f}x)."]
    out += ["", "| CIFAR-style VGG | choice | batch | malinn (host to host) | launches | peer | convolutions |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in d.get("vgg", []):
        peers = [f"{p} {r[p] * 1e3:.3f} ({r[p] / r['malinn']:.2f}x)" for p in ("torch", "tensorflow") if p in r]
        out.append(f"| {r['network']} | {r.get('choice', 'default')} | {r['batch']} | {r['malinn'] * 1e3:.3f} | "
                   f"{r['launches']} | " + (", ".join(peers) or "-") + f" | {r.get('convs', '-')} |")
    return out


def overhead_table(d):
    out = [f"Device: {d['device']['name']}. Milliseconds per predict, host to host; the floor is plain pyopencl "
           "doing the plan's own work (the same upload, kernels and download); `empty` the same launches of an "
           "empty kernel.", "", "| model | batch | launches | malinn | floor | empty kernels | malinn / floor |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in d["rows"]:
        out.append(f"| {r['model']} | {r['batch']} | {r['launches']} | {r['malinn'] * 1e3:.4f} | "
                   f"{r['floor'] * 1e3:.4f} | {r['empty'] * 1e3:.4f} | **{r['overhead']:.2f}x** |")
    return out


def plot(gemms, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(gemms), figsize=(6.5 * len(gemms), 4.5), squeeze=False)
    for ax, (title, d) in zip(axes[0], gemms):
        ns = [r["n"] for r in d["rows"]]
        for key in [k for k in d["rows"][0] if k != "n"]:
            style = "-o" if key in ("tuned", "CLBlast", "cuBLAS", "numpy") else ":."
            ax.plot(ns, [r[key] for r in d["rows"]], style, label=key, linewidth=2 if key == "tuned" else 1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n (square n x n x n)")
        ax.set_ylabel("GFLOP/s")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def cold_table(rows):
    """Cold start beside the plain-pyopencl floor: each phase in milliseconds, medians of fresh processes."""
    out = ["The floor is plain pyopencl in a fresh process doing what a first prediction cannot avoid on the "
           "same device (import numpy and pyopencl, list the platforms, a context and queue, one program from a "
           "binary, one upload, launch and download); malinn's phases are timed inside its process. "
           "Milliseconds, medians.", "",
           "| device | warm | floor | malinn above the floor | malinn: import numpy / malinn / device / "
           "load_model / plan / predict | floor: numpy / pyopencl / platforms / context / program / run | "
           "builds from source (warm) | warm, modules from source |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for title, d in rows:
        mine = " / ".join(f"{v * 1e3:.0f}" for v in d["warm_phases"].values())
        floor = " / ".join(f"{v * 1e3:.0f}" for v in d["floor_phases"].values())
        out.append(f"| {title} | **{d['warm_s'] * 1e3:.0f}** | {d['floor_s'] * 1e3:.0f} | "
                   f"{d['above_floor_s'] * 1e3:.0f} | {mine} | {floor} | {d['warm_counters'].get('builds', '-')} | "
                   + (f"{d['warm_from_source_s'] * 1e3:.0f} |" if "warm_from_source_s" in d else "- |"))
    return out


def main(argv=None):
    argparse.ArgumentParser(description=__doc__.splitlines()[0],
                            epilog="No options: it reads benchmarks/results/*.json and benchmarks/NOTES.md.").parse_args(argv)
    gpu, cpu = load("gemm_nvidia_h200.json"), load("gemm_pocl_cpu.json")
    models_gpu, models_cpu = load("models_nvidia_h200.json"), load("models_pocl_cpu.json")
    cold_gpu, cold_cpu = load("cold_nvidia_h200.json"), load("cold_pocl_cpu.json")
    overhead_gpu, overhead_cpu = load("overhead_nvidia_h200.json"), load("overhead_pocl_cpu.json")
    tuned_gpu = load("models_tuned_nvidia_h200.json")
    models_gl = load("models_gl_nvidia_h200.json")
    backends_gpu = load("models_backends_nvidia_h200.json")
    backends_h100 = load("models_backends_nvidia_h100.json")
    precision_gpu = load("models_precision_nvidia_h200.json") or load("models_precision_nvidia_h100.json")
    precision_cpu = load("models_precision_pocl_cpu.json")
    gemm_backends = load("gemm_backends_nvidia_h200.json")
    conv_gpu, conv_cpu = load("convolution_nvidia_h200.json"), load("convolution_pocl_cpu.json")
    doc = ["# Performance", "",
           "Every figure comes from a script in `benchmarks/` and is read as a ratio against a peer timed in",
           "the same run (`benchmarks/results/*.json` hold the raw numbers and the commands; this page is",
           "written from them by `python3 benchmarks/report.py`). These machines are noisy: rerun before",
           "trusting a single digit. No test asserts a speed.", "",
           "## GEMM, square n x n x n, GFLOP/s", "",
           "`python3 benchmarks/gemm_variants.py --json OUT.json`: every matmul kernel of the library, the tuned",
           "kernel, CLBlast's SGEMM on the same queue, numpy on the host CPU and cuBLAS (torch, TF32 off);",
           "time from launch to queue finished, operands on the device, median of 5 after a warm-up.", ""]
    gemms = []
    if gpu:
        doc += ["### NVIDIA H200 through NVIDIA's OpenCL driver (lent machine)", ""] + gemm_table(gpu) + [""]
        r, n = ratios(gpu, ("CLBlast", "cuBLAS"))
        doc += [f"At n = {n}: tuned / CLBlast = **{r.get('CLBlast', float('nan')):.2f}x** (target 1.0x), "
                f"tuned / cuBLAS = **{r.get('cuBLAS', float('nan')):.2f}x** (target 0.75x).", ""]
        gemms.append(("NVIDIA H200 (OpenCL)", gpu))
    if cpu:
        doc += ["### This project's 2-core machine, PoCL CPU device", ""] + gemm_table(cpu) + [""]
        r, n = ratios(cpu, ("numpy", "CLBlast"))
        m42 = [row["morton_4_2"] / row["blocked_rmcm"] for row in cpu["rows"]]
        doc += [f"At n = {n}: tuned / numpy = **{r.get('numpy', float('nan')):.2f}x** (target 0.5x)"
                + (f", tuned / CLBlast = {r['CLBlast']:.2f}x" if "CLBlast" in r else "") + ".",
                f"The thesis's claim on a cache-only device: Morton 4-2 / blocked RMxCM = "
                f"{min(m42):.2f}x to {max(m42):.2f}x over these sizes (the thesis saw 1.12x on a Mali T-628).", ""]
        gemms.append(("PoCL CPU (2 cores)", cpu))
    if gemm_backends:
        doc += ["### NVIDIA H200: OpenGL beside OpenCL, one run", "",
                f"`{gemm_backends['command']}`: the columns `gl:0/...` are the same kernels' GLSL twins on the "
                "same GPU through NVIDIA's EGL.", ""] + gemm_table(gemm_backends) + [""]
        doc += ["GL time over OpenCL time per size (runtime choices; fastest kernels): "
                + ", ".join(f"n = {r['n']}: {r['tuned']:.2f}x; {r['fastest']:.2f}x" for r in gemm_backends["ratios"])
                + ".", ""]
    plotted = bool(gemms) and plot(gemms, ROOT / "docs" / "gemm.png")
    if plotted:
        doc += ["![GEMM GFLOP/s](gemm.png)", ""]
    doc += ["## Rovder's Table 10.5 networks", "",
            "`python3 benchmarks/models.py --json OUT.json`: Partial MNIST 640-150-10, Partial CIFAR 256-128-10,",
            "Full MNIST 784-2500-2000-10, Full CIFAR 3072-4096-3072-10, ReLU between layers; batch 100 and",
            "batch 1 (latency).", ""]
    for title, d in (("NVIDIA H200 through OpenCL, library defaults", models_gpu),
                     ("NVIDIA H200, after `benchmarks/tune_networks.py` (a winner per layer shape)", tuned_gpu),
                     ("NVIDIA H200 through OpenGL (`--device gl`, NVIDIA's EGL; a run of its own, its torch "
                      "column from that run)", models_gl),
                     ("PoCL CPU, this machine", models_cpu),
                     ("NVIDIA GPU: weight precisions at batch 1 (`--batch 1 --precision fp32 fp16-storage "
                      "int8-weights`)", precision_gpu),
                     ("PoCL CPU: weight precisions at batch 1 (`--batch 1 --precision fp32 fp16-storage "
                      "int8-weights`)", precision_cpu)):
        if d:
            doc += [f"### {title}", ""] + models_table(d) + [""]
    if backends_gpu:
        doc += ["### NVIDIA H200: the OpenGL backend beside the OpenCL backend, one run", "",
                f"`{backends_gpu['command']}` (the target: GL within 1.5x of OpenCL).", ""]
        doc += backends_table(backends_gpu) + [""]
    if backends_h100:
        doc += ["### NVIDIA H100: the OpenGL backend (with the GLSL gemm_keras and gemv_split) beside OpenCL, one run",
                "", f"`{backends_h100['command']}` (`--repeat 10`: a noisy run; the target: GL within 1.5x"
                " of OpenCL).", ""]
        doc += backends_table(backends_h100) + [""]
    if conv_gpu or conv_cpu:
        doc += ["## Convolution", "",
                "`python3 benchmarks/convolution.py --json OUT.json`: selected AlexNet, VGG-16 and GoogLeNet layers",
                "(ReLU fused), each algorithm forced in turn beside the plan's own choice untuned and tuned, and a",
                "small CIFAR-style VGG end to end.", ""]
        for title, d in (("NVIDIA H200", conv_gpu), ("PoCL CPU, this machine (`--quick`)", conv_cpu)):
            if d:
                doc += [f"### {title}", ""] + convolution_table(d) + [""]
    doc += ["## What malinn adds to the driver's floor", "",
            "`python3 benchmarks/overhead.py --json OUT.json`: each network's compiled plan, its device work",
            "replayed in plain pyopencl (the floor) beside `model.predict(x)`, the three timed in turn within",
            "each round (medians; a drift of the machine moves all three, not one side of the ratio).", ""]
    for title, d in (("NVIDIA H200", overhead_gpu), ("PoCL CPU, this machine", overhead_cpu)):
        if d:
            doc += [f"### {title}", ""] + overhead_table(d) + [""]
    doc += ["## Cold start", "", "`python3 benchmarks/cold_start.py --json OUT.json`: a new process imports malinn,",
            "loads a Partial MNIST model file and predicts once; with the program-binary and probe caches filled",
            "by an earlier process, and with every cache off. A warm process probes only the device it chooses",
            "(the first working OpenCL GPU, else every device), runs no probe kernel where this device and driver",
            "passed it before, and builds no program; malinn's modules are compiled to bytecode first, as",
            "`pip install` does (`from source`: every process compiles them, as a checkout under",
            "PYTHONDONTWRITEBYTECODE does).", ""]
    for title, d in (("NVIDIA H200", cold_gpu), ("PoCL CPU, this machine", cold_cpu)):
        if d:
            doc.append(f"- {title}: warm cache **{d['warm_s']:.3f} s**, no caches {d['cold_s']:.3f} s "
                       f"(of which importing malinn and probing the devices {d['import_and_probe_s']:.3f} s).")
    cold_rows = [(title, d) for title, d in (("NVIDIA H200", cold_gpu), ("PoCL CPU", cold_cpu)) if d and "floor_s" in d]
    if cold_rows:
        doc += [""] + cold_table(cold_rows)
    notes = ROOT / "benchmarks" / "NOTES.md"
    if notes.is_file():
        doc += ["", notes.read_text().strip()]
    (ROOT / "docs" / "PERFORMANCE.md").write_text("\n".join(doc) + "\n")
    print("wrote docs/PERFORMANCE.md" + (" and docs/gemm.png" if plotted else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
