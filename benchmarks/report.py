"""Writes docs/PERFORMANCE.md (and docs/gemm.png) from benchmarks/results/*.json and benchmarks/findings.md.

For each benchmark, the latest result of each device (``<benchmark>_<device>.json``, as
benchmarks/harness.py names them) as a table with its peer's ratio, then that benchmark's findings.
Run after the benchmarks:  python benchmarks/report.py
Needs matplotlib for the plot (pip install .[bench]); the tables are written without it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FINDINGS = ROOT / "benchmarks" / "findings.md"
#: Result names whose files begin with another benchmark's name: ``models_precision_*`` is not ``models``.
NAMES = (
    "models",
    "models_backends",
    "models_precision",
    "overhead",
    "gemm",
    "gemm_networks",
    "gemm_backends",
    "convolution",
    "convolution_precision",
    "transfers",
    "cold_start",
    "cold",
    "tuning",
    "throughput",
    "sequence",
    "serve",
)


#: Devices of results written before they named their benchmark (``"benchmark"`` in the JSON).
EARLIER_DEVICES = ("nvidia_h200", "nvidia_h100", "pocl_cpu", "gl_nvidia_h200", "gl_llvmpipe")


def results(name: str) -> list:
    """``(device slug, result)`` of each ``<name>_<device>.json``, GPUs first; the sweeps kept as the
    kernel library's evidence (``gemm_keras_sweep_*``) are not ``gemm`` results."""
    found = []
    for path in sorted(RESULTS.glob(f"{name}_*.json")):
        slug = path.stem[len(name) + 1 :]
        if any(other != name and other.startswith(name + "_") and path.stem.startswith(other + "_") for other in NAMES):
            continue
        d = json.loads(path.read_text())
        if d.get("benchmark", name if slug in EARLIER_DEVICES else None) == name:
            found.append((slug, d))
    return sorted(
        found,
        key=lambda item: (
            "pocl" in item[0] or "llvmpipe" in item[0],
            item[0].startswith("gl_"),
            item[0] != "nvidia_h200",
            item[0],
        ),
    )


def device_title(slug: str, d: dict) -> str:
    """A table's heading: the device, its platform and driver, and how the run was made."""
    device = d.get("device")
    if isinstance(device, dict):
        driver = d.get("driver") or ""
        platform = device.get("platform", "?")
        title = (
            f"{device['name']} through {'OpenCL' if device.get('backend', 'opencl') == 'opencl' else 'OpenGL'} "
            f"({platform}" + (f", driver {driver}" if driver and driver not in platform else "") + ")"
        )
    else:
        title = slug.replace("_", " ")
    return title + (" (`--quick`)" if d.get("quick") or "--quick" in d.get("command", "") else "")


def command(d: dict) -> list:
    """The command that made a result, as the run recorded it (its output path left out)."""
    text = d.get("command")
    if not text:
        return []
    text = re.sub(r"\s--(json|out) \S+", "", text).replace("benchmarks/gemm_variants.py", "benchmarks/gemm.py")
    return [f"`python {text}`", ""]


def findings() -> dict:
    """benchmarks/findings.md's sections by their heading."""
    sections, key = {}, None
    for line in FINDINGS.read_text().splitlines() if FINDINGS.is_file() else []:
        if line.startswith("## "):
            key = line[3:].strip()
            sections[key] = []
        elif key is not None:
            sections[key].append(line)
    return {k: "\n".join(v).strip() for k, v in sections.items()}


def number(v):
    return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def gemm_table(d):
    """GFLOP/s per size (or network product) and kernel, the peers' columns last."""
    first = "shape" if "shape" in d["rows"][0] else "n"
    cols = [k for k in d["rows"][0] if k != first]
    chosen = "runtime's choice per shape: `chosen`" if first == "shape" else f"tuned kernel: `{d.get('tuned', '?')}`"
    out = [f"{chosen}. GFLOP/s.", "", f"| {first} | " + " | ".join(cols) + " |", "|" + " --- |" * (len(cols) + 1)]
    out += [f"| {r[first]} | " + " | ".join(number(r.get(c)) for c in cols) + " |" for r in d["rows"]]
    return out


def ratios(d, against):
    row = max(d["rows"], key=lambda r: r["n"])
    return {p: row["tuned"] / row[p] for p in against if row.get(p) and row.get("tuned")}, row["n"]


def models_table(d):
    peers = [p for p in ("numpy", "tensorflow", "torch") if any(p in r for r in d["rows"])]
    precision = any("precision" in r for r in d["rows"])
    out = [
        f"Default matmul kernel `{d['matmul']}`. Milliseconds per batch, host to "
        "host; in brackets the peer's time over malinn's (above 1: malinn is faster)"
        + (
            "; reduced precisions beside fp32 in the same run, `matmuls` their weight-streaming kernels' device "
            "time against fp32's"
            if precision
            else ""
        )
        + (
            " (passes of the precisions interleaved: `matmul_interleaved`; the kernels column times each "
            "precision's passes back to back)"
            if any("matmul_interleaved" in r for r in d["rows"])
            else ""
        )
        + ".",
        "",
        "| model | batch | " + ("precision | " if precision else "") + "malinn | " + " | ".join(peers) + " |",
        "|" + " --- |" * (3 + precision + len(peers)),
    ]
    extra = "kernels" in d["rows"][0]
    if extra:
        out[2] = out[2].rstrip(" |") + " | launches | kernels (device) | weights read |"
        out[3] += " --- | --- | --- |"
        out[0] += (
            f" Weights read: their bytes over the matmul kernels' device time, beside a device-to-device copy "
            f"of {d['copy_gbs']:.0f} GB/s (read + written) in the same run."
        )
    for r in d["rows"]:
        cells = [f"{r[p] * 1e3:.3f} ({r[p] / r['malinn']:.2f}x)" if p in r else "-" for p in peers]
        if extra:
            cells += [
                str(r["launches"]),
                f"{r['kernels'] * 1e3:.3f}",
                f"{r['weights_gbs']:.0f} GB/s ({r['weights_gbs'] / r['copy_gbs']:.0%})",
            ]
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
    out = [
        "Devices: "
        + "; ".join(
            f"{names[x['index']]} = {x['name']} ({x['platform']}), default matmul `{x['matmul']}`" for x in devices
        )
        + ". Milliseconds per batch, host to host, all in one run; `x / y`: the times' ratio host to host, "
        "and in brackets of the launches alone (enqueue until the device finished, measured alike on both "
        "backends); above 1: slower than " + names[first] + ".",
        "",
        "| model | batch | "
        + " | ".join(names[i] for i in [first] + others)
        + " | "
        + " | ".join(f"{names[i]} / {names[first]}" for i in others)
        + " | torch |",
        "|" + " --- |" * (3 + 2 * len(others) + 1),
    ]
    rows = {(r["model"], r["batch"], r["precision"], r["device"]): r for r in d["rows"]}
    ratios = {(r["model"], r["batch"], r["precision"], r["device"]): r for r in d.get("ratios", [])}
    for r in d["rows"]:
        if r["device"] != first:
            continue
        key = (r["model"], r["batch"], r["precision"])
        times = [f"{rows[key + (i,)]['malinn'] * 1e3:.3f}" if key + (i,) in rows else "-" for i in [first] + others]
        quotients = [
            f"**{ratios[key + (i,)]['malinn']:.2f}x** ({ratios[key + (i,)]['launch_wall']:.2f}x)"
            if key + (i,) in ratios
            else "-"
            for i in others
        ]
        torch = f"{r['torch'] * 1e3:.3f}" if "torch" in r else "-"
        precision = "" if r["precision"] == "fp32" else f" ({r['precision']})"
        out.append(f"| {r['model']}{precision} | {r['batch']} | " + " | ".join(times + quotients) + f" | {torch} |")
    return out


def convolution_table(d):
    """Per layer and batch: each algorithm's device time (compute launches), the best against cuDNN,
    the plan's untuned (default) and tuned choices against cuDNN where the run has them, extra memory."""
    choices = any(r["algorithm"] == "default" for r in d.get("layers") or d["rows"])
    head = "" + (
        "the plan's choice per layer by the library's conv_algorithms rules (default) and after the conv tuner (tuned)"
        if choices
        else f"default convolution kernel `{d.get('conv_default', '?')}`"
    )
    out = [
        head + ". Device milliseconds of the convolution's own launches; cuDNN fp32 (TF32 off) by CUDA events; "
        "cuDNN's time over malinn's (0.5 is the target); `extra` the activation memory beyond input and output.",
        "",
        "| layer | batch | kn2row | kn2col | im2row | im2col | implicit | best / cuDNN |"
        + (" default / cuDNN | tuned / cuDNN |" if choices else "")
        + " extra kn2row / im2col |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- | --- |" if choices else "") + " --- |",
    ]
    groups = {}
    for r in d.get("layers") or d["rows"]:
        groups.setdefault((r["network"], r["layer"], r["batch"]), {})[r["algorithm"]] = r
    for (network, layer, batch), algos in groups.items():

        def cell(a):
            return f"{algos[a]['compute_seconds'] * 1e3:.3f}" if a in algos else "-"

        implicit = min(
            (r for a, r in algos.items() if a.startswith("implicit")), default=None, key=lambda r: r["compute_seconds"]
        )
        best = min((r for a, r in algos.items() if a not in ("default", "tuned")), key=lambda r: r["compute_seconds"])
        peer = best.get("torch_kernels")
        ratio = f"{best['algorithm']}: {peer / best['compute_seconds']:.2f}x" if peer else "-"
        chosen = ""
        if choices:
            for a in ("default", "tuned"):
                r = algos.get(a, algos.get("gemm"))
                chosen += (
                    f" {r.get('chosen', 'gemm')}: {peer / r['compute_seconds']:.2f}x |"
                    if r and peer
                    else f" {r.get('chosen', 'gemm') if r else '-'} |"
                )
        mem = (
            f"{algos['kn2row']['extra_bytes'] / 2**20:.1f} / {algos['im2col']['extra_bytes'] / 2**20:.1f} MiB"
            if "kn2row" in algos and "im2col" in algos
            else "-"
        )
        out.append(
            f"| {network} {layer} | {batch} | {cell('kn2row')} | {cell('kn2col')} | {cell('im2row')} | "
            f"{cell('im2col')} | {implicit['compute_seconds'] * 1e3:.3f} | "
            if implicit
            else f"| {network} {layer} | {batch} | {cell('kn2row')} | {cell('kn2col')} | {cell('im2row')} | "
            f"{cell('im2col')} | - | "
        )
        out[-1] += f"{ratio} |{chosen} {mem} |"
    if choices:
        for key in ("best", "default", "tuned"):
            values = [e[f"{key}_vs_cudnn"] for e in d.get("summary", []) if e.get(f"{key}_vs_cudnn") is not None]
            if values:
                out += (
                    [
                        "",
                        f"- {key}: >= 0.5x cuDNN in {sum(v >= 0.5 for v in values)} of {len(values)} "
                        f"layer x batch cases ({min(values):.2f}-{max(values):.2f}x).",
                    ]
                    if key == "best"
                    else [
                        f"- {key}: >= 0.5x cuDNN in {sum(v >= 0.5 for v in values)} of {len(values)} "
                        f"({min(values):.2f}-{max(values):.2f}x)."
                    ]
                )
    out += [
        "",
        "| CIFAR-style VGG | choice | batch | malinn (host to host) | launches | peer | convolutions |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in d.get("vgg", []):
        peers = [f"{p} {r[p] * 1e3:.3f} ({r[p] / r['malinn']:.2f}x)" for p in ("torch", "tensorflow") if p in r]
        out.append(
            f"| {r['network']} | {r.get('choice', 'default')} | {r['batch']} | {r['malinn'] * 1e3:.3f} | "
            f"{r['launches']} | " + (", ".join(peers) or "-") + f" | {r.get('convs', '-')} |"
        )
    return out


def overhead_table(d):
    out = [
        "Milliseconds per predict, host to host; the floor is plain pyopencl "
        "doing the plan's own work (the same upload, kernels and download); `empty` the same launches of an "
        "empty kernel.",
        "",
        "| model | batch | launches | malinn | floor | empty kernels | malinn / floor |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in d["rows"]:
        out.append(
            f"| {r['model']} | {r['batch']} | {r['launches']} | {r['malinn'] * 1e3:.4f} | "
            f"{r['floor'] * 1e3:.4f} | {r['empty'] * 1e3:.4f} | **{r['overhead']:.2f}x** |"
        )
    if d.get("cycled"):
        out += [
            "",
            "Batches of several sizes in turn: `predict` on each beside each size's plan run directly, ms a call.",
            "",
            "| model | sizes in turn | predict | plans | predict / plans |",
            "| --- | --- | --- | --- | --- |",
        ]
        for r in d["cycled"]:
            out.append(
                f"| {r['model']} | {'/'.join(map(str, r['cycle']))} | {r['predict_s'] * 1e3:.4f} | "
                f"{r['plans_s'] * 1e3:.4f} | **{r['overhead']:.2f}x** |"
            )
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
    out = [
        "The floor is plain pyopencl in a fresh process doing what a first prediction cannot avoid on the "
        "same device (import numpy and pyopencl, list the platforms, a context and queue, one program from a "
        "binary, one upload, launch and download); malinn's phases are timed inside its process. "
        "Milliseconds, medians.",
        "",
        "| device | warm | floor | malinn above the floor | malinn: import numpy / malinn / device / "
        "load_model / plan / predict | floor: numpy / pyopencl / platforms / context / program / run | "
        "builds from source (warm) | warm, modules from source |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for title, d in rows:
        mine = " / ".join(f"{v * 1e3:.0f}" for v in d["warm_phases"].values())
        floor = " / ".join(f"{v * 1e3:.0f}" for v in d["floor_phases"].values())
        out.append(
            f"| {title} | **{d['warm_s'] * 1e3:.0f}** | {d['floor_s'] * 1e3:.0f} | "
            f"{d['above_floor_s'] * 1e3:.0f} | {mine} | {floor} | {d['warm_counters'].get('builds', '-')} | "
            + (f"{d['warm_from_source_s'] * 1e3:.0f} |" if "warm_from_source_s" in d else "- |")
        )
    return out


def networks_cold_table(d):
    """Real networks' first prediction in a new process, caches empty (cold) and filled (warm), beside
    the peer's own new process."""
    peer = d.get("peer", "peer")
    out = [
        f"| network | size | cold s | warm s | {peer} s | cold / {peer} | warm / {peer} | programs built cold |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in d["rows"]:
        built = r.get("programs_built", "")
        out.append(
            f"| {r['network']} | {r.get('size', '')} | {r['cold_s']:.2f} | {r['warm_s']:.2f} | {r['peer_s']:.2f} | "
            f"**{r['cold_s'] / r['peer_s']:.2f}** | {r['warm_s'] / r['peer_s']:.2f} | {built} |"
        )
    return out


def throughput_table(d):
    out = ["| network | batch | malinn samples/s | peer samples/s | malinn / peer |", "| --- | --- | --- | --- | --- |"]
    for r in d["rows"]:
        peer = f"{r['peer_samples_per_s']:,.0f} ({r['peer']})" if r.get("peer_samples_per_s") else "none"
        ratio = f"**{r['ratio']:.2f}**" if r.get("ratio") else ""
        out.append(f"| {r['network']} | {r['batch']} | {r['samples_per_s']:,.0f} | {peer} | {ratio} |")
    for m in d.get("multi_device") or []:
        out.append(
            f"| {m['network']} on {len(m['devices'])} devices{' (one listed twice)' if m.get('same_device') else ''}"
            f" | {m['batch']} | {m['samples_per_s']:,.0f} | one device {m['one_device_samples_per_s']:,.0f} | "
            f"{m['speedup']:.2f}x one device |"
        )
    for m in d.get("pass_sizes") or []:
        if "devices" in m:
            out.append(
                f"| {m['network']} in passes of {m['pass_samples']} on {m['devices']} devices | {m['batch']} | "
                f"{m['samples_per_s']:,.0f} | one device {m['one_device_samples_per_s']:,.0f} | "
                f"{m['speedup']:.2f}x one device |"
            )
    return out


def sequence_table(d):
    out = [
        "| model | batch | malinn ms | peer ms | malinn / peer | max error vs Keras |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in d["rows"]:
        out.append(
            f"| {r['model']} | {r['batch']} | {r['malinn_ms']:.3f} | {r['peer_ms']:.3f} ({r['peer']}) | "
            f"**{r['ratio']:.2f}** | {r['max_error']:.1e} |"
        )
    return out


def serve_table(d):
    out = [
        "| model | batching | clients | requests/s | p50 ms | p99 ms | failed |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, m in d["models"].items():
        for mode, run in m["serve"].items():
            for p in run["points"]:
                out.append(
                    f"| {name} | {mode} | {p['clients']} | {p['requests_per_s']:,.1f} | {p['p50_ms']:.2f} | "
                    f"{p['p99_ms']:.2f} | {p['failed']} |"
                )
        inproc = m["in_process"]
        out.append(
            f"| {name} in-process | | 1 | {inproc['batch1_calls_per_s']:,.1f} calls/s | {inproc['p50_ms']:.3f} | "
            f"{inproc['p99_ms']:.3f} | batch 64: {inproc['batch64_samples_per_s']:,.0f} samples/s |"
        )
    return out


def section(doc, name, table, intro=None):
    """Each device's latest ``name`` result as a table under its heading; whether there was one."""
    found = results(name)
    for slug, d in found:
        doc += [f"### {intro + ': ' if intro else ''}{device_title(slug, d)}", ""] + command(d) + table(d) + [""]
    return bool(found)


def gemm_summary(d):
    r, n = ratios(d, ("CLBlast", "cuBLAS", "numpy"))
    line = [
        f"At n = {n}: " + ", ".join(f"tuned / {p} = **{v:.2f}x**" for p, v in r.items()) + " (GFLOP/s over GFLOP/s)."
    ]
    if all(k in d["rows"][0] for k in ("morton_4_2", "blocked_rmcm")):
        m42 = [
            row["morton_4_2"] / row["blocked_rmcm"]
            for row in d["rows"]
            if row.get("morton_4_2") and row.get("blocked_rmcm")
        ]
        if m42:
            line.append(
                f"The thesis's claim on a cache-only device: Morton 4-2 / blocked RMxCM = {min(m42):.2f}x to "
                f"{max(m42):.2f}x over these sizes (the thesis saw 1.12x on a Mali T-628)."
            )
    return [" ".join(line)]


def backends_gemm_summary(d):
    return [
        "GL time over OpenCL time per size (runtime choices; fastest kernels): "
        + ", ".join(
            f"n = {r['n']}: {r['tuned']:.2f}x; {r['fastest']:.2f}x"
            for r in d.get("ratios", [])
            if r.get("tuned") and r.get("fastest")
        )
        + "."
    ]


def transfers_table(d):
    out = [
        "Microseconds, host to device and back, medians.",
        "",
        "| batch x features | bytes | pageable | pinned copy | pinned only | host copy | chunked | download |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in d["rows"]:
        out.append(
            f"| {r['batch']} x {r['features']} | {r['bytes']} | "
            + " | ".join(
                f"{r[k] * 1e6:.1f}"
                for k in ("pageable", "pinned_copy", "pinned_only", "host_copy", "chunked", "download")
            )
            + " |"
        )
    parallel = d.get("parallel")
    if parallel:
        out += [
            "",
            f"Uploads to {parallel[0]['devices']} GPUs at once (`--devices`), one share each, GB/s of the whole "
            "array beside one GPU's upload of all of it:",
            "",
            "| batch x features | MB | page-locked: one GPU | all at once | ratio | pageable: one GPU | all at once | ratio |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in parallel:
            out.append(
                f"| {r['batch']} x {r['features']} | {r['bytes'] / 1e6:.1f} | {r['pinned_one_gbs']:.1f} | "
                f"{r['pinned_all_gbs']:.1f} | {r['pinned_speedup']:.2f}x | {r['pageable_one_gbs']:.1f} | "
                f"{r['pageable_all_gbs']:.1f} | {r['pageable_speedup']:.2f}x |"
            )
    launch = d.get("launch")
    if launch:
        out += [
            "",
            f"Launch floor (device time, cold data): an empty kernel's event {launch['empty_1_item_s'] * 1e6:.1f} us, "
            f"a 4 KiB copy {launch['copy_4kib_s'] * 1e6:.1f} us; a stream of B bytes takes "
            f"{launch['fixed_s'] * 1e6:.1f} us + B / {launch['rate_gbs']:.0f} GB/s.",
        ]
    torch = d.get("torch")
    if torch:
        out += [
            f"torch on the same GPU: `sum` {torch['fixed_s'] * 1e6:.1f} us + B / {torch['rate_gbs']:.0f} GB/s; "
            + "; ".join(
                f"cuBLAS mv {r['units']}x{r['inputs']} fp32 {r['fp32_s'] * 1e6:.1f} us, fp16 {r['fp16_s'] * 1e6:.1f} us"
                for r in torch["gemv"]
            )
            + "."
        ]
    return out


def main(argv=None):
    argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="No options: it reads benchmarks/results/*.json and benchmarks/findings.md.",
    ).parse_args(argv)
    notes = findings()
    doc = [
        "# Performance",
        "",
        "Every figure on this page comes from a script in `benchmarks/` that times a peer in the same run",
        "(numpy, TensorFlow, torch, CLBlast, cuBLAS, cuDNN or plain pyopencl) and is read as a ratio against",
        "it; `benchmarks/results/*.json` hold the raw numbers and the command that made each, and",
        "`python benchmarks/report.py` writes this page from them and from `benchmarks/findings.md`. Each",
        "section shows the latest run on each device, then what the measurements taught: why the kernels",
        "and the plan are as they are, and what was tried and did not pay. Shared machines are noisy: rerun",
        "before trusting a single digit. No test asserts a speed. `docs/BENCHMARKS.md` says how to run each",
        "script.",
        "",
    ]

    def findings_of(key):
        if notes.get(key):
            doc.extend(["#### Findings", "", notes[key], ""])

    doc += [
        "## Rovder's Table 10.5 networks",
        "",
        "`benchmarks/models.py`: Partial MNIST 640-150-10, Partial CIFAR 256-128-10, Full MNIST",
        "784-2500-2000-10, Full CIFAR 3072-4096-3072-10, ReLU between layers, at batch 100 and batch 1",
        "(latency), host numpy batch to host numpy result, beside numpy, TensorFlow-cpu and torch.",
        "",
    ]
    section(doc, "models", models_table)
    findings_of("models")

    doc += [
        "## What malinn adds to the driver's floor",
        "",
        "`benchmarks/overhead.py`: each network's compiled plan, its device work replayed in plain pyopencl",
        "(the floor) beside `model.predict(x)`, the three timed in turn within each round (medians).",
        "",
    ]
    section(doc, "overhead", overhead_table)
    findings_of("overhead")

    doc += [
        "## GEMM",
        "",
        "`benchmarks/gemm.py`: every matmul kernel of the library in the configuration the runtime gives",
        "it, the runtime's choice, CLBlast's SGEMM on the same queue, numpy on the host CPU and cuBLAS (torch,",
        "TF32 off); from launch to queue finished, operands on the device, median after a warm-up.",
        "",
    ]
    gemms = []
    for slug, d in results("gemm"):
        doc += [f"### Square n x n x n: {device_title(slug, d)}", ""] + command(d) + gemm_table(d) + [""]
        doc += gemm_summary(d) + [""]
        gemms.append((d["device"]["name"], d))
    section(doc, "gemm_networks", gemm_table, "The networks' Dense products")
    for slug, d in results("gemm_backends"):
        doc += [f"### OpenGL beside OpenCL: {device_title(slug, d)}", ""] + command(d)
        doc += ["Columns `gl:0/...` are the same kernels' GLSL twins on the same GPU.", ""] + gemm_table(d) + [""]
        doc += backends_gemm_summary(d) + [""]
    if gemms and plot(gemms, ROOT / "docs" / "gemm.png"):
        doc += ["![GEMM GFLOP/s](gemm.png)", ""]
    findings_of("gemm")

    doc += [
        "## Convolution",
        "",
        "`benchmarks/convolution.py`: selected AlexNet, VGG-16 and GoogLeNet layers (ReLU fused), each",
        "algorithm forced in turn beside the plan's own choice untuned and tuned, against cuDNN; and a small",
        "CIFAR-style VGG end to end against torch and TensorFlow-cpu.",
        "",
    ]
    section(doc, "convolution", convolution_table)
    findings_of("convolution")

    doc += [
        "## Reduced precisions",
        "",
        "`benchmarks/models.py --batch 1 --precision fp32 fp16-storage int8-weights`: each network in",
        "every weight precision in one run, the weight-streaming kernels' device time against fp32's (passes",
        "of the precisions interleaved).",
        "",
    ]
    section(doc, "models_precision", models_table)
    section(doc, "convolution_precision", convolution_table, "Convolutions")
    findings_of("precision")

    doc += [
        "## OpenGL beside OpenCL",
        "",
        "`benchmarks/models.py --device opencl:gpu,gl:gpu`: the networks on both backends of one GPU in one",
        "run (the target: GL within 1.5x of OpenCL); `--device gl` alone times the GL backend beside torch.",
        "",
    ]
    section(doc, "models_backends", backends_table)
    findings_of("backends")

    doc += [
        "## Transfers and the launch floor",
        "",
        "`benchmarks/transfers.py`: each way of moving a predict's input and output, and what a launch costs",
        "in device time before it reads a byte, beside torch's own launch and cuBLAS.",
        "",
    ]
    section(doc, "transfers", transfers_table)
    findings_of("transfers")

    doc += [
        "## Cold start",
        "",
        "`benchmarks/cold_start.py`: a new process imports malinn, loads a Partial MNIST model file and",
        "predicts once, with the program-binary and probe caches filled by an earlier process (warm) and",
        "with every cache off, beside plain pyopencl doing the same unavoidable work in a fresh process.",
        "",
    ]
    cold = [(device_title(slug, d), d) for name in ("cold_start", "cold") for slug, d in results(name)]
    for title, d in cold:
        if "rows" in d:  # real networks beside TensorFlow's or torch's new process
            doc += [f"### Real networks: {title}", ""] + command(d) + networks_cold_table(d) + [""]
        else:
            doc.append(
                f"- {title}: warm cache **{d['warm_s']:.3f} s**, no caches {d['cold_s']:.3f} s "
                f"(of which importing malinn and probing the devices {d['import_and_probe_s']:.3f} s)."
            )
    rows = [(title, d) for title, d in cold if "floor_s" in d]
    if rows:
        doc += [""] + cold_table(rows)
    doc.append("")
    findings_of("cold_start")

    doc += [
        "## Throughput",
        "",
        "`benchmarks/throughput.py`: samples per second host to host at large batches, beside "
        "torch (cuBLAS, cuDNN) or numpy in the same run.",
        "",
    ]
    section(doc, "throughput", throughput_table)
    findings_of("throughput")

    doc += [
        "## Sequence models",
        "",
        "`benchmarks/sequence.py`: an Embedding + LSTM text classifier, a Bidirectional GRU "
        "and a Transformer encoder, host to host, beside torch (cuDNN, TF32 off) or TensorFlow in the same run.",
        "",
    ]
    section(doc, "sequence", sequence_table)
    findings_of("sequence")

    doc += [
        "## Serving",
        "",
        "`benchmarks/serve.py`: `malinn serve` on loopback, requests per second and latency at 1, "
        "8 and 64 concurrent clients with dynamic batching on and off, beside the same model called in-process.",
        "",
    ]
    section(doc, "serve", serve_table)
    findings_of("serve")

    if notes.get("tried"):
        doc += ["## Tried and not kept", "", notes["tried"], ""]
    (ROOT / "docs" / "PERFORMANCE.md").write_text("\n".join(doc).rstrip() + "\n")
    print(
        "wrote docs/PERFORMANCE.md" + (" and docs/gemm.png" if gemms and (ROOT / "docs" / "gemm.png").is_file() else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
