"""The convolution tuner: times each conv layer's candidate algorithms on a device and remembers the best.

``malinn tune --model M`` (:func:`tune_convs`) takes each convolution geometry the model's plans run
(:class:`~malinn.choice.conv_geometry.ConvGeometry`: batch, channels, groups, window) and times, on a
one-layer plan of that geometry with random weights, every candidate algorithm
(:func:`candidates`): each ``conv`` kernel of the library in each configuration the device can
run (``candidates`` in kernels/library.json) and each ``im2col`` kernel whose patch matrix fits
the patch budget (:func:`malinn.choice.conv_choice.patch_budget`), multiplied by the device's matmul. The
time is the device time of all the plan's launches (OpenCL profiling; median of ``repeat``),
re-layouts included; each candidate is checked against a numpy convolution before it may win. The
winner goes to the tuning database under the geometry's key, which the plan reads when it next
lowers a layer of that geometry (:func:`malinn.choice.conv_choice.choose_algorithm`).
"""

from __future__ import annotations

import random
import sys
import time
from typing import IO, Any

import numpy as np

from ..backends.base import Device
from ..backends.selection import get_device
from ..choice.conv_choice import ConvGeometry, default_algorithm, rules, runs
from ..choice.tuning_db import check_writable, save
from ..errors import MalinnError
from ..library.kernel_library import KernelSpec, load_library
from ..plan import kinds
from ..plan.builder import PlanBuilder
from ..plan.tensors import Weight

__all__ = ["tune_convs", "candidates", "reference", "time_algorithm", "QUICK_CONV_CONFIGS"]

#: configurations per conv kernel with ``quick``: its defaults, the rules' configurations, a sample
QUICK_CONV_CONFIGS = 4


def reference(x: np.ndarray, weights: np.ndarray, g: ConvGeometry) -> np.ndarray:
    """The convolution of ``x`` (``batch x IH x IW x CIN``) by ``weights`` (``COUT x KH*KW*CG``,
    column ``(ky*KW + kx)*CG + c``) in float64, ``batch x OH x OW x COUT``."""
    x = x.astype(np.float64)
    out = np.zeros((x.shape[0], g.OH, g.OW, g.cout))
    mg = g.cout // g.groups
    for ky in range(g.KH):
        iy = np.arange(g.OH) * g.SH - g.PT + ky * g.DH
        for kx in range(g.KW):
            ix = np.arange(g.OW) * g.SW - g.PL + kx * g.DW
            mask = ((iy >= 0) & (iy < g.IH))[:, None] & ((ix >= 0) & (ix < g.IW))[None, :]
            patch = x[:, np.clip(iy, 0, g.IH - 1)][:, :, np.clip(ix, 0, g.IW - 1)] * mask[None, :, :, None]
            tap = (ky * g.KW + kx) * g.cg
            for group in range(g.groups):
                w = weights[group * mg : (group + 1) * mg, tap : tap + g.cg].astype(np.float64)
                out[..., group * mg : (group + 1) * mg] += patch[..., group * g.cg : (group + 1) * g.cg] @ w.T
    return out


def _plan(device: Device, g: ConvGeometry, weights: np.ndarray, algorithm: KernelSpec) -> Any:
    builder = PlanBuilder(device, g.batch)
    x = builder.input((g.IH, g.IW, g.cin))
    weight = Weight(f"conv {g.key()} weights", weights.shape, lambda: weights, {})
    y = kinds.conv(
        builder,
        x,
        weight,
        {**g.window_defines(), "GROUPS": g.groups},
        (g.batch, g.OH, g.OW, g.cout),
        what=f"conv {g.key()}",
        algorithm=algorithm,
    )
    return builder.compile([y]).allocate()


def case(g: ConvGeometry) -> tuple:
    """``(x, weights, want)``: a random input and weights of ``g`` and their :func:`reference`
    (computed once per geometry: every candidate is checked against it)."""
    rng = np.random.default_rng(g.cin * 7 + g.cout * 3 + g.pixels)
    x = rng.standard_normal((g.batch, g.IH, g.IW, g.cin)).astype(np.float32)
    weights = (rng.standard_normal((g.cout, g.taps * g.cg)) / np.sqrt(g.taps * g.cg)).astype(np.float32)
    return x, weights, reference(x, weights, g)


def time_algorithm(
    device: Device,
    g: ConvGeometry,
    algorithm: KernelSpec,
    repeat: int = 3,
    tolerance: float = 1e-4,
    data: tuple | None = None,
) -> float | None:
    """Median device seconds of all the launches of a one-layer plan of ``g`` running
    ``algorithm``, or ``None`` when its result differs from :func:`reference`.

    ``data``: :func:`case` of ``g``, where the caller made it already.

    Raises:
        MalinnError: the kernel cannot be built or launched on ``device`` (or does not fit it).
    """
    x, weights, want = data if data is not None else case(g)
    plan = _plan(device, g, weights, algorithm)
    got = plan.run([x])[0]
    if not np.abs(got - want).max() <= tolerance * max(1.0, np.abs(want).max()):
        return None
    times = []
    for _ in range(repeat):
        with device.lock:
            events = [launch.enqueue() for launch in plan.launches]
            device.finish()
        times.append(sum((e.profile.end - e.profile.start) * 1e-9 for e in events))
    return float(np.median(times))


def candidates(device: Device, g: ConvGeometry, quick: bool = False, seed: int = 0) -> list[KernelSpec]:
    """The algorithms to time for ``g``: the untuned default first
    (:func:`malinn.choice.conv_choice.default_algorithm`), the other rules' kernels, then every conv kernel in each configuration the device can run and whose
    preconditions hold, and each im2col kernel whose patches fit the budget. With ``quick``, at
    most :data:`QUICK_CONV_CONFIGS` configurations of each conv kernel beyond the rules': its
    defaults, then one of each other staging mode (``LOCAL``), then a sample."""
    library = load_library()
    found = [default_algorithm(device, g)]
    seen = {(found[0].codename, found[0].defines)}  # one timing per kernel and configuration

    def add(spec: KernelSpec) -> None:
        if (spec.codename, spec.defines) not in seen and runs(spec, g, device):
            seen.add((spec.codename, spec.defines))
            found.append(spec)

    for spec, _ in rules(device):
        add(spec)
    for op in ("conv", "im2col"):
        for codename in library.codenames(op, device.backend):
            spec = library[codename]
            configs = spec.configurations(device) if spec.candidates else [spec.config]
            rest = configs[1:]
            random.Random(seed).shuffle(rest)
            # each staging mode (LOCAL) once before any second configuration of one
            firsts = [
                c
                for i, c in enumerate(rest)
                if c.get("LOCAL") not in [configs[0].get("LOCAL")] + [r.get("LOCAL") for r in rest[:i]]
            ]
            rest = firsts + [c for c in rest if c not in firsts]
            configs = configs[:1] + (rest[: QUICK_CONV_CONFIGS - 1] if quick else rest)
            for config in configs:
                add(spec.configure(config))
    return found


def tune_convs(
    geometries: list,
    device: Device | None = None,
    quick: bool = False,
    repeat: int = 3,
    budget_s: float | None = None,
    stream: IO[str] = sys.stderr,
    seed: int = 0,
) -> dict:
    """Times every candidate algorithm of each convolution geometry and stores the fastest correct one.

    Args:
        geometries: the :class:`ConvGeometry` of each layer (duplicates are timed once).
        device: the device (default: the current one).
        quick: fewer configurations per conv kernel (:func:`candidates`).
        repeat: timed runs per candidate (the median counts).
        budget_s: stop trying new candidates after this many seconds (the best so far wins; each
            geometry's untuned default is timed still, so a winner is never worse than it).
        stream: where one line per geometry goes.
        seed: for the sample of configurations.

    Returns:
        ``{"convs": {key: winner}, "untuned": [keys], "candidates": n, "path": ...}``, each winner
        with ``codename``, ``defines``, ``seconds``, ``gflops`` and ``default_seconds`` (the untuned
        choice's time, where it was timed).

    Raises:
        MalinnError: no candidate ran correctly for any geometry, or the database cannot be written.
    """
    check_writable()
    device = device or get_device()
    geometries = list(dict.fromkeys(geometries))
    start = time.perf_counter()
    winners, untuned, timed = {}, [], 0
    for g in geometries:
        results: list[tuple[float, KernelSpec]] = []  # (seconds, configured algorithm)
        data = case(g)
        default = default_algorithm(device, g)
        for spec in candidates(device, g, quick, seed):
            if budget_s is not None and time.perf_counter() - start > budget_s and results:
                break  # the default is always timed
            try:
                seconds = time_algorithm(device, g, spec, repeat, data=data)
            except MalinnError as exc:  # a configuration this device cannot build, launch or hold
                stream.write(f"{g.key()}: {spec.codename} {_config(spec)}: {str(exc).splitlines()[0]}\n")
                continue
            timed += 1
            if seconds is not None:
                results.append((seconds, spec))
            else:  # a kernel developer's only numpy check of a candidate: say so
                stream.write(f"{g.key()}: {spec.codename} {_config(spec)}: a result that numpy does not give\n")
        if not results:
            untuned.append(g.key())
            continue
        seconds, spec = min(results, key=lambda r: r[0])
        flop = 2.0 * g.cout * g.taps * g.cg * g.pixels
        winner = {
            "codename": spec.codename,
            "defines": _overrides(spec),
            "seconds": seconds,
            "gflops": flop / seconds / 1e9,
            "tuned_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        before = next((s for s, c in results if c == default), None)
        if before is not None:
            winner["default_seconds"] = before
        winners[g.key()] = winner
        stream.write(
            f"{g.key()}: {spec.codename} {_config(spec)} {seconds * 1e3:.3f} ms"
            + (f" (default {default.codename}: {before * 1e3:.3f} ms)" if before is not None else "")
            + "\n"
        )
    if not winners:
        raise MalinnError(
            f"no convolution algorithm ran correctly on {device.name} for "
            f"{', '.join(g.key() for g in geometries) or 'no layer'}"
        )
    path = save(device, convs=winners)
    return {"convs": winners, "untuned": untuned, "candidates": timed, "path": str(path)}


def _overrides(spec: KernelSpec) -> dict:
    """The defines of ``spec`` that differ from its entry's (what the database stores)."""
    base = load_library()[spec.codename].config
    return {k: int(v) if v.lstrip("-").isdigit() else v for k, v in spec.config.items() if base.get(k) != v}


def _config(spec: KernelSpec) -> str:
    return " ".join(f"{k}={v}" for k, v in _overrides(spec).items())
