"""The tuner: times candidate matmul kernels and configurations on a device and remembers the best.

``malinn tune [--quick]`` (or :func:`tune`) times every matmul kernel of the library, and the
configurations of tunable ones (``candidates`` in kernels/library.json), on the shapes that matter
(a model's layers, or a standard set). Each candidate is checked against numpy before it may win.
The winner is stored in a per-user cache (``$MALINN_CACHE_DIR``, else ``$XDG_CACHE_HOME/malinn``,
else ``~/.cache/malinn``) keyed by device name, vendor and driver version; the runtime uses it
when present (:func:`tuned_choice`), else the library default for the device's kind.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from pathlib import Path

import numpy as np

from .device import Device
from .errors import MalinnError
from .files import write_file

__all__ = ["cache_dir", "tuned_choice", "tune", "Product", "STANDARD_SHAPES"]

#: (m, k, n): Dense layers of the thesis's Table 10.5 models at batch 100, and square products.
STANDARD_SHAPES = [(150, 640, 100), (2500, 784, 100), (2000, 2500, 100), (4096, 3072, 100), (1024, 1024, 1024)]
QUICK_SHAPES = [(2000, 2500, 100), (1024, 1024, 1024)]

_lock = threading.Lock()
_loaded: dict | None = None


def cache_dir() -> Path:
    """The folder of malinn's per-user caches (tuning results, program binaries)."""
    if os.environ.get("MALINN_CACHE_DIR"):
        return Path(os.environ["MALINN_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "malinn"


def _tuning_file() -> Path:
    return cache_dir() / "tuning.json"


def _device_key(device: Device) -> str:
    return f"{device.name}|{device.vendor}|{device.driver_version}"


def _read_all() -> dict:
    global _loaded
    with _lock:
        if _loaded is None:
            try:
                _loaded = json.loads(_tuning_file().read_text())
                if not isinstance(_loaded, dict):
                    _loaded = {}
            except (OSError, ValueError):
                _loaded = {}
        return _loaded


def tuned_choice(device: Device):
    """``(codename, defines)`` the tuner chose for ``device``, or ``None`` if it was not tuned."""
    entry = _read_all().get(_device_key(device))
    if not isinstance(entry, dict) or "codename" not in entry:
        return None
    from .kernel_library import load_library

    library = load_library()
    codename, config = entry["codename"], entry.get("defines", {})
    try:
        library[codename].configure(config)
    except MalinnError:
        return None   # the library changed since tuning: fall back to defaults
    return codename, config


def _save(device: Device, result: dict) -> Path:
    global _loaded
    data = dict(_read_all())
    data[_device_key(device)] = result
    path = _tuning_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, lambda f: f.write(json.dumps(data, indent=2).encode()))
    with _lock:
        _loaded = data
    return path


def _progress(done: int, total: int, label: str, stream) -> None:
    width = 30
    filled = int(width * done / max(total, 1))
    stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label[:48]:<48}")
    if done == total:
        stream.write("\n")
    stream.flush()


def _time_candidate(spec, device, shapes, repeat):
    """Total seconds of ``spec`` over ``shapes`` (median of ``repeat``), or None when it is wrong."""
    total = 0.0
    for m, k, n in shapes:
        product = Product(spec, device, m, k, n)
        if not product.correct():
            return None
        times = []
        for _ in range(repeat):
            event = product.launch()
            event.wait()
            times.append((event.profile.end - event.profile.start) * 1e-9)
        total += float(np.median(times))
    return total


class Product:
    """A random ``m x k`` by ``k x n`` product set up on ``device`` in ``spec``'s layouts, for timing.

    Attributes:
        a, b: the host operands; r: the device result.
    """

    def __init__(self, spec, device: Device, m: int, k: int, n: int):
        from . import ops
        from .matrix import DeviceMatrix

        rng = np.random.default_rng(m * 7 + k * 3 + n)
        self.a = rng.standard_normal((m, k)).astype(np.float32)
        self.b = rng.standard_normal((k, n)).astype(np.float32)
        plan = ops.matmul_plan(spec, m, k, n)
        self.r = DeviceMatrix.empty(device, (m, n), spec.matrices["r"].layout, plan["r"])
        self._args = {"a": DeviceMatrix.upload(device, self.a, spec.matrices["a"].layout, plan["a"]),
                      "b": DeviceMatrix.upload(device, self.b, spec.matrices["b"].layout, plan["b"]), "r": self.r}
        self._spec, self._device, self._common = spec, device, plan["a"][1]

    def launch(self):
        """Enqueues the kernel once; returns its event."""
        from . import ops

        return ops.launch(self._spec, self._device, self._args, common=self._common)

    def correct(self, tolerance: float = 1e-4) -> bool:
        """Runs once and compares with numpy in float64."""
        self.launch().wait()
        got, want = self.r.numpy(), self.a.astype(np.float64) @ self.b
        return bool(np.abs(got - want).max() <= tolerance * max(1.0, np.abs(want).max()))


def tune(device: Device | None = None, shapes=None, quick: bool = False, repeat: int = 3,
         budget_s: float | None = None, stream=sys.stderr, seed: int = 0) -> dict:
    """Times candidates on ``device`` and stores the fastest correct one in the tuning cache.

    Args:
        device: the device (default: the current one).
        shapes: ``(m, k, n)`` products to time (default: :data:`STANDARD_SHAPES`, or a smaller
            set with ``quick``).
        quick: fewer shapes and at most 24 configurations per tunable kernel.
        repeat: timed runs per candidate and shape (the median counts).
        budget_s: stop trying new candidates after this many seconds (the best so far wins).
        stream: where the progress bar goes.
        seed: for the sample of configurations.

    Returns:
        ``{"codename", "defines", "seconds", "shapes", "candidates", "path"}`` of the winner.

    Raises:
        MalinnError: no candidate was correct on this device.
    """
    from .device import get_device
    from .kernel_library import load_library

    device = device or get_device()
    library = load_library()
    shapes = [tuple(s) for s in (shapes or (QUICK_SHAPES if quick else STANDARD_SHAPES))]
    candidates = []
    for codename in library.codenames("matmul"):
        spec = library[codename]
        configs = spec.configurations(device) if spec.candidates else [{}]
        # the entry's default first, the rest shuffled: a run cut short by budget_s samples evenly
        rest = configs[1:]
        random.Random(seed).shuffle(rest)
        configs = configs[:1] + (rest[:23] if quick else rest)
        candidates += [(codename, config) for config in configs]
    start = time.perf_counter()
    best, results = None, []
    for i, (codename, config) in enumerate(candidates):
        label = f"{codename} {' '.join(f'{k}={v}' for k, v in config.items())}"
        _progress(i, len(candidates), label, stream)
        if budget_s is not None and time.perf_counter() - start > budget_s:
            stream.write(f"\ntime budget of {budget_s:g} s spent after {i} candidates\n")
            break
        spec = library[codename].configure(config)
        try:
            seconds = _time_candidate(spec, device, shapes, repeat)
        except MalinnError as exc:  # a configuration this device cannot build or launch
            results.append({"codename": codename, "defines": config, "error": str(exc).splitlines()[0]})
            continue
        results.append({"codename": codename, "defines": config, "seconds": seconds})
        if seconds is not None and (best is None or seconds < best["seconds"]):
            best = {"codename": codename, "defines": config, "seconds": seconds}
    else:
        _progress(len(candidates), len(candidates), "done", stream)
    if best is None:
        raise MalinnError(f"no matmul candidate ran correctly on {device.name}")
    flop = sum(2.0 * m * k * n for m, k, n in shapes)
    timed = sorted((r for r in results if r.get("seconds")), key=lambda r: r["seconds"])
    best.update(shapes=[list(s) for s in shapes], gflops=flop / best["seconds"] / 1e9,
                device=device.name, driver=device.driver_version, tuned_at=time.strftime("%Y-%m-%d %H:%M:%S"),
                candidates=len(results),
                ranking=[{**r, "gflops": flop / r["seconds"] / 1e9} for r in timed[:20]])
    best["path"] = str(_save(device, best))
    return best
