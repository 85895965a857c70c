"""The tuner: times candidate matmul kernels and configurations on a device and remembers the best.

``malinn tune`` (or :func:`tune`) times every matmul kernel of the library, and the configurations
of tunable ones (``candidates`` in kernels/library.json), on a set of products ``(m, k, n)``; each
candidate is checked against numpy before it may win. ``malinn tune --model M`` times each of the
model's Dense products on its own (``per_shape``), since the plan picks each layer's kernel for
that layer's shape. The winners go to the tuning database (:mod:`malinn.choice.tuning_db`).
"""

from __future__ import annotations

import math
import random
import shutil
import sys
import time
from typing import IO, Any

import numpy as np

from ..backends.base import Device
from ..backends.selection import get_device
from ..choice.kernel_call import bind
from ..choice.kernel_choice import check_precision, untuned_matmul
from ..choice.matrix import DeviceMatrix
from ..choice.tuning_db import check_writable, offered, save, shape_key, stored
from ..choice.tuning_db import tuning_file as tuning_file_path
from ..errors import MalinnError
from ..io.cache import cache_dir
from ..library.kernel_library import load_library
from ..library.precision import device_bytes, effective
from ..ops import enqueue, matmul_plan

__all__ = ["tune", "Product", "STANDARD_SHAPES", "QUICK_SHAPES", "cache_dir"]

#: (m, k, n): Dense layers of the thesis's Table 10.5 models at batch 100, and square products.
STANDARD_SHAPES = [(150, 640, 100), (2500, 784, 100), (2000, 2500, 100), (4096, 3072, 100), (1024, 1024, 1024)]
#: smaller products for ``quick``: a skinny inference product and a square one.
QUICK_SHAPES = [(1000, 1250, 64), (512, 512, 256)]
#: configurations per tunable kernel with ``quick``: its defaults, the device kind's default, a sample.
QUICK_CONFIGS = 4


def _progress(
    done: int, total: int, label: str, stream: IO[str], started: float, budget_s: float | None = None
) -> None:
    """One line of progress, rewritten in place: a bar, the count, the time left (the budget's
    rest where that is sooner) and ``label``, cut to the terminal's width so that the line never
    wraps; where the stream is not a terminal (a log), a line of 80 columns at each quarter and at
    the end instead (carriage returns flooded logs)."""
    elapsed = time.perf_counter() - started
    if done == total:
        timing = f"done in {elapsed:.0f} s"
    elif done:
        left = elapsed / done * (total - done)
        if budget_s is not None:
            left = max(0.0, min(left, budget_s - elapsed))
        timing = f"ETA {left:.0f} s"
    else:
        timing = "ETA ?"
    terminal = getattr(stream, "isatty", lambda: False)()
    if not terminal and done < total and (done == 0 or done * 4 // total == (done - 1) * 4 // total):
        return  # a log, not a terminal: a line at each quarter and at the end, no carriage returns
    columns = shutil.get_terminal_size((80, 24)).columns if terminal else 80
    width = 20 if columns >= 60 else 10
    filled = int(width * done / max(total, 1))
    head = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {timing:<13} "
    room = max(0, columns - 1 - len(head))
    stream.write(f"\r{head}{label[:room]:<{room}}" if terminal else f"{head}{label[:room]}".rstrip() + "\n")
    if done == total and terminal:
        stream.write("\n")
    stream.flush()


def _time_product(spec, device, shape, repeat):
    """Seconds of ``spec`` on one product (median of ``repeat``), or None when it is wrong."""
    product = Product(spec, device, *shape)
    if not product.correct():
        return None
    times = []
    for _ in range(repeat):
        event = product.launch()
        event.wait()
        times.append((event.profile.end - event.profile.start) * 1e-9)
    return float(np.median(times))


class Product:
    """A random ``m x k`` by ``k x n`` product set up on ``device`` in ``spec``'s layouts, for timing.

    Attributes:
        a, b: the host operands; r: the device result.
    """

    def __init__(self, spec: Any, device: Device, m: int, k: int, n: int, operands: tuple | None = None):
        """Args:
        operands: ``(a, b)``, float32 arrays of shapes ``(m, k)`` and ``(k, n)``; default: random
            ones seeded by the shape (the same for every kernel).
        """
        if operands is None:
            rng = np.random.default_rng(m * 7 + k * 3 + n)
            operands = (rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32))
        self.a, self.b = operands
        plan = matmul_plan(spec, m, k, n)
        self.r = DeviceMatrix.empty(device, (m, n), spec.matrices["r"].layout, plan["r"])
        layout = spec.matrices["a"].layout
        weights = DeviceMatrix.upload_weights(
            device, device_bytes(self.a, spec.precision, layout, plan["a"]), (m, k), layout, plan["a"], spec.precision
        )
        self.a = effective(self.a, spec.precision)  # what the kernel multiplies by
        self._args = {
            "a": weights,
            "b": DeviceMatrix.upload(device, self.b, spec.matrices["b"].layout, plan["b"]),
            "r": self.r,
        }
        self._spec, self._device = spec, device
        # bound once, as a plan binds its launches: a timed launch is the enqueue alone (bound on
        # every call, products of 1024 x 1024 x 1024 on the H200 timed the binding: at most 5.3 TFLOP/s in
        # any configuration, up to 25.9 bound once; benchmarks/gemm.py --sweep before and after)
        self._bound = bind(spec, device, self._args)

    def launch(self):
        """Enqueues the kernel once; returns its event."""
        return enqueue(self._bound, self._device, self.r)

    def correct(self, tolerance: float = 1e-4) -> bool:
        """Runs once and compares with numpy in float64."""
        self.launch().wait()
        got, want = self.r.numpy(), self.a.astype(np.float64) @ self.b
        return bool(np.abs(got - want).max() <= tolerance * max(1.0, np.abs(want).max()))


def _candidates(library: Any, device: Device, quick: bool, seed: int) -> list[tuple[str, dict]]:
    """``(codename, defines)`` to time: the library's default for the device's kind first (a run cut
    short by its budget has timed the untuned choice), then every matmul kernel's defaults, then
    its other configurations.

    Each tunable kernel's own defaults and the library's default for the device's kind come first; the
    rest are shuffled (a run cut short by a budget samples evenly) and, with ``quick``, cut to
    :data:`QUICK_CONFIGS` in all.
    """
    kind_default = library.default_spec("matmul", device.kind, device.backend)
    found = []
    for codename in library.codenames("matmul", device.backend):
        spec = library[codename]
        configs = spec.configurations(device) if spec.candidates else [spec.config]
        first = configs[:1]
        if codename == kind_default.codename and kind_default.config in configs and kind_default.config not in first:
            first.append(kind_default.config)
        rest = [c for c in configs if c not in first]
        random.Random(seed).shuffle(rest)
        if quick:
            rest = rest[: max(0, QUICK_CONFIGS - len(first))]
        found += [(codename, config) for config in first + rest]
    default = (kind_default.codename, kind_default.config)
    return [default] + [c for c in found if c != default] if default in found else found


def _keep_faster(found: dict, before: dict | None, gflops: float) -> dict | None:
    """``before`` (a winner stored earlier, for the same shapes) where it measured faster than
    ``gflops``, else None: a run cut short by its budget replaces no better winner (the caller
    also checks that the library still offers it: :func:`malinn.choice.tuning_db.offered`)."""
    if not isinstance(before, dict) or not isinstance(before.get("gflops"), (int, float)):
        return None
    same = before.get("shapes") is None or before.get("shapes") == found.get("shapes")
    return before if same and before["gflops"] > gflops else None


def _product(shape: Any) -> tuple[int, int, int]:
    """``(m, k, n)`` of a product's shape as given (a list or tuple of three whole numbers)."""
    m, k, n = (int(v) for v in shape)
    return m, k, n


def tune(
    device: Device | None = None,
    shapes: list[tuple[int, int, int]] | None = None,
    quick: bool = False,
    repeat: int = 3,
    budget_s: float | None = None,
    stream: IO[str] = sys.stderr,
    seed: int = 0,
    per_shape: bool = False,
    precision: str = "fp32",
) -> dict:
    """Times candidates on ``device`` and stores the fastest correct ones in the tuning database.

    Args:
        device: the device (default: the current one).
        shapes: ``(m, k, n)`` products to time (default: :data:`STANDARD_SHAPES`, or
            :data:`QUICK_SHAPES` with ``quick``).
        quick: the smaller shapes and at most :data:`QUICK_CONFIGS` configurations per tunable
            kernel (every kernel's defaults are still timed and checked).
        repeat: timed runs per candidate and shape (the median counts).
        budget_s: stop trying new candidates after this many seconds (the best so far wins; the
            device kind's default, per shape each shape's untuned choice, is timed first whatever
            the budget, and a run cut short replaces no stored winner that measured faster).
        stream: where the progress bar (with its ETA) goes.
        seed: for the sample of configurations.
        per_shape: time each shape on its own, with the candidates whose preconditions it meets,
            and store a winner per shape; else store one general winner, the fastest over all shapes.
        precision: the weights' precision: only kernels supporting it are timed, in it, and the
            winners are stored for it (the tuning database keys them by device and precision).

    Returns:
        General: ``{"codename", "defines", "seconds", "gflops", "shapes", "candidates", "ranking",
        "path", ...}`` of the winner. Per shape: ``{"shapes": {"MxKxN": winner}, "untuned": [...],
        "candidates", "path"}``, each winner with ``codename``, ``defines``, ``seconds``, ``gflops``.

    Raises:
        MalinnError: no candidate was correct on this device (for any shape), or the database
            cannot be written (checked before any timing where it can be).
        BackendError, DeviceError: the device does not run ``precision`` (fp16 without
            cl_khr_fp16, a reduced precision on GL).
    """
    check_writable()
    device = device or get_device()
    check_precision(precision, device)
    library = load_library()
    shapes = list(dict.fromkeys(_product(s) for s in shapes or (QUICK_SHAPES if quick else STANDARD_SHAPES)))
    work = []  # (codename, config, spec, the shapes it is timed on)
    for codename, config in _candidates(library, device, quick, seed):
        if precision not in library[codename].precisions:
            continue
        spec = library[codename].configure(config).in_precision(precision)
        mine = [s for s in shapes if spec.accepts(*s, device=device)]
        if not per_shape and len(mine) < len(shapes):
            continue  # a general winner must run every shape; the runtime would never run it on the others
        if mine:
            work.append((codename, config, spec, mine))
    if per_shape:  # each shape's untuned choice first: a run cut short has timed what the runtime would run
        first: list[tuple] = []
        for shape in shapes:
            spec = untuned_matmul(device, shape, precision)
            queued = [w for w in work if (w[0], w[1]) == (spec.codename, spec.config)]
            first += [w for w in queued if w not in first] or [
                (spec.codename, spec.config, spec.in_precision(precision), [shape])
            ]
        work = first + [w for w in work if w not in first]
    untuned = len(first) if per_shape else 1  # timed whatever the budget: what the runtime runs untuned
    total = sum(len(w[3]) for w in work)
    start = time.perf_counter()
    done, cut = 0, False
    results: list[dict[str, Any]] = []
    timed: dict[tuple, list] = {s: [] for s in shapes}  # shape -> [(seconds, codename, config)]
    for index, (codename, config, spec, mine) in enumerate(work):
        if budget_s is not None and time.perf_counter() - start > budget_s and index >= untuned:
            stream.write(f"\ntime budget of {budget_s:g} s spent after {len(results)} candidates\n")
            cut = True
            break
        label = f"{codename} {' '.join(f'{k}={v}' for k, v in config.items())}"
        seconds: dict[tuple, float | None] = {}
        error = None
        for shape in mine:
            _progress(done, total, f"{shape_key(shape)} {label}" if per_shape else label, stream, start, budget_s)
            done += 1
            if error is None and (per_shape or None not in seconds.values()):  # general: wrong once, out
                try:
                    seconds[shape] = _time_product(spec, device, shape, repeat)
                except MalinnError as exc:  # a configuration this device cannot build or launch
                    error = str(exc).splitlines()[0]
        if error is not None:
            results.append({"codename": codename, "defines": config, "error": error})
        else:
            times = [s for s in seconds.values() if s is not None]
            total_s = None if len(times) < len(seconds) else sum(times)
            results.append({"codename": codename, "defines": config, "seconds": total_s})
        if per_shape or error is None:
            for shape, value in seconds.items():
                if value is not None:
                    timed[shape].append((value, codename, config))
    else:
        _progress(total, total, "", stream, start)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    # what did not run, or ran wrong (numpy disagreed): a kernel developer's only check of a candidate
    failed = [
        {
            "codename": r["codename"],
            "defines": r["defines"],
            "why": r.get("error") or "a result that numpy does not give",
        }
        for r in results
        if r.get("error") or ("seconds" in r and r["seconds"] is None)
    ]
    if per_shape:
        winners = {}
        for shape, found in timed.items():
            if found:
                value, codename, config = min(found, key=lambda t: t[0])
                winners[shape_key(shape)] = {
                    "codename": codename,
                    "defines": config,
                    "seconds": value,
                    "gflops": 2.0 * math.prod(shape) / value / 1e9,
                    "tuned_at": stamp,
                }
        if not winners:
            raise MalinnError(
                f"no matmul candidate ran correctly on {device.name} for {', '.join(map(shape_key, shapes))}"
            )
        kept = {}
        if cut:
            before = stored(device, precision).get("shapes")
            before = before if isinstance(before, dict) else {}
            by_key = {shape_key(shape): shape for shape in shapes}
            kept = {
                key: old
                for key, won in winners.items()
                if (old := _keep_faster(won, before.get(key), won["gflops"])) is not None
                and offered(old, device, by_key[key], precision)
            }  # a winner the library dropped goes
        new = {key: won for key, won in winners.items() if key not in kept}
        path = save(device, shapes=new, precision=precision) if new else tuning_file_path()
        return {
            "shapes": {**winners, **kept},
            "kept": sorted(kept),
            "untuned": [shape_key(s) for s in shapes if shape_key(s) not in winners],
            "candidates": len(results),
            "failed": failed,
            "path": str(path),
        }
    ranked = sorted((r for r in results if r.get("seconds")), key=lambda r: r["seconds"])
    if not ranked:
        raise MalinnError(f"no matmul candidate ran correctly on {device.name}")
    flop = sum(2.0 * m * k * n for m, k, n in shapes)
    best = {
        **ranked[0],
        "shapes": [list(s) for s in shapes],
        "gflops": flop / ranked[0]["seconds"] / 1e9,
        "device": device.name,
        "driver": device.driver_version,
        "tuned_at": stamp,
        "candidates": len(results),
        "ranking": [{**r, "gflops": flop / r["seconds"] / 1e9} for r in ranked[:20]],
    }
    kept_general = _keep_faster(best, stored(device, precision).get("general"), best["gflops"]) if cut else None
    if kept_general is not None and not offered(kept_general, device, precision=precision):  # the library dropped it
        kept_general = None
    if kept_general is not None:  # the stored winner stays; say so
        return {
            **kept_general,
            "kept": True,
            "candidates": len(results),
            "failed": failed,
            "path": str(tuning_file_path()),
        }
    best["path"] = str(save(device, general=best, precision=precision))
    best["failed"] = failed
    return best
