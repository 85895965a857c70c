"""The tuner: times candidate matmul kernels and configurations on a device and remembers the best.

``malinn tune`` (or :func:`tune`) times every matmul kernel of the library, and the configurations
of tunable ones (``candidates`` in kernels/library.json), on a set of products ``(m, k, n)``; each
candidate is checked against numpy before it may win. ``malinn tune --model M`` times each of the
model's Dense products on its own (``per_shape``), since the runtime picks each layer's kernel for
that layer's shape.

The winners go to the tuning database, ``tuning.json`` in the cache folder
(:func:`malinn.cache.cache_dir`), apart from the kernel library (as CLBlast keeps its tuning
database apart from its kernels)::

    {"format": "malinn-tuning", "version": 1, "devices": {"<device key>": {
        "general": {"codename": ..., "defines": {...}, "gflops": ..., "tuned_at": ...},
        "shapes": {"150x640x1": {"codename": ..., "defines": {...}, "seconds": ...}, ...}}}}

(the flat ``{"<device key>": {"codename": ...}}`` of earlier versions is read as general winners).
Every entry is checked against the kernel library when it is read: a matmul codename, defines of
the right types forming a configuration the library offers on this device, and, for a shape's
winner, a kernel whose preconditions that shape meets. An entry that fails is ignored with a
one-line warning naming the file, the device key and why; the runtime then uses the library's
default (:func:`tuned_choice`).
"""

from __future__ import annotations

import json
import math
import random
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np

from .cache import cache_dir, write_atomic
from .device import Device
from .errors import MalinnError

__all__ = ["tuned_choice", "tune", "Product", "STANDARD_SHAPES", "QUICK_SHAPES", "shape_key",
           "TUNING_FORMAT", "TUNING_VERSION"]

#: (m, k, n): Dense layers of the thesis's Table 10.5 models at batch 100, and square products.
STANDARD_SHAPES = [(150, 640, 100), (2500, 784, 100), (2000, 2500, 100), (4096, 3072, 100), (1024, 1024, 1024)]
#: smaller products for ``quick``: a skinny inference product and a square one.
QUICK_SHAPES = [(1000, 1250, 64), (512, 512, 256)]
#: configurations per tunable kernel with ``quick``: its defaults, the device kind's default, a sample.
QUICK_CONFIGS = 4

TUNING_FORMAT = "malinn-tuning"
TUNING_VERSION = 1

_lock = threading.Lock()
_loaded: dict | None = None    # device key -> raw entry, as read from tuning.json
_checked: dict = {}            # device key -> {"general": choice or None, "shapes": {(m, k, n): choice}}


def _tuning_file() -> Path:
    return cache_dir() / "tuning.json"


def _device_key(device: Device) -> str:
    return f"{device.name}|{device.vendor}|{device.driver_version}"


def shape_key(shape) -> str:
    """The database's name of a product ``(m, k, n)``: ``"MxKxN"``."""
    m, k, n = shape
    return f"{m}x{k}x{n}"


def _parse_shape(text) -> tuple:
    parts = text.split("x") if isinstance(text, str) else []
    if len(parts) != 3 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"{text!r} is not a product MxKxN of positive integers")
    return tuple(int(p) for p in parts)


def _type(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


def _forget() -> None:
    """Drops what was read from tuning.json, so the next question reads it again."""
    global _loaded
    with _lock:
        _loaded = None
        _checked.clear()


def _read_file(path: Path, quiet: bool = False) -> tuple[dict, bool]:
    """The ``devices`` object of the tuning database and whether this malinn may rewrite the file.

    A damaged file reads as empty (with a one-line warning unless ``quiet``); the flat form of
    earlier versions is converted.
    """
    def damaged(why, writable=True):
        if not quiet:
            warnings.warn(f"malinn: ignoring the tuning database {path}: {why}", RuntimeWarning, stacklevel=5)
        return {}, writable

    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}, True
    except OSError as exc:
        return damaged(f"it cannot be read ({exc.strerror or exc})")
    except ValueError as exc:
        return damaged(f"not valid JSON ({exc})")
    if not isinstance(data, dict):
        return damaged(f"expected an object, got {_type(data)}")
    if "format" not in data and "version" not in data and "devices" not in data:
        return {key: {"general": entry} for key, entry in data.items()}, True   # the flat form of malinn < 0.2
    if data.get("format") != TUNING_FORMAT:
        return damaged(f"'format' is {data.get('format')!r}, expected {TUNING_FORMAT!r}")
    version = data.get("version")
    if version != TUNING_VERSION:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > TUNING_VERSION
        return damaged(f"version {version!r}" + (", written by a newer malinn" if newer else "")
                       + f"; this malinn reads version {TUNING_VERSION}", writable=not newer)
    if not isinstance(data.get("devices"), dict):
        return damaged(f"'devices' is {_type(data.get('devices'))}, expected an object")
    return data["devices"], True


def _read_all() -> dict:
    """The database's device entries, read once per process (until :func:`tune` stores new ones)."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _read_file(_tuning_file())[0]
        return _loaded


def _checked_choice(entry, device: Device, shape=None) -> tuple[str, dict]:
    """``(codename, defines)`` of a stored winner after checking it against the library.

    Raises:
        ValueError: the entry is not a winner the library can run on ``device`` (for ``shape``).
    """
    from .kernel_library import load_library

    if not isinstance(entry, dict):
        raise ValueError(f"expected an object, got {_type(entry)}")
    codename = entry.get("codename")
    if not isinstance(codename, str):
        raise ValueError(f"'codename' is {_type(codename)}, expected a string")
    library = load_library()
    if codename not in library or library[codename].op != "matmul":
        raise ValueError(f"{codename!r} is not a matmul kernel of {library.path}")
    spec = library[codename]
    defines = entry.get("defines", {})
    if not isinstance(defines, dict):
        raise ValueError(f"'defines' is {_type(defines)}, expected an object")
    for name, value in defines.items():
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError(f"define {name} is {_type(value)}, expected an integer or a string")
    config = {**spec.config, **{name: str(value) for name, value in defines.items()}}
    if config not in spec.configurations(device):
        raise ValueError(f"{codename} {' '.join(f'{k}={v}' for k, v in defines.items()) or '(defaults)'} is not "
                         f"a configuration the library offers on {device.name} (the library changed since tuning, "
                         f"or the file was edited)")
    if shape is not None and not spec.configure(config).accepts(*shape, device=device):
        raise ValueError(f"{codename}'s preconditions do not hold for {shape_key(shape)}")
    return codename, config


def _checked_entry(device: Device) -> dict:
    """This device's winners, checked once per process; bad ones are dropped with a warning each."""
    key = _device_key(device)
    with _lock:
        if key in _checked:
            return _checked[key]
    devices = _read_all()
    raw = devices.get(key, {})
    result, problems = {"general": None, "shapes": {}}, []
    if not isinstance(raw, dict):
        problems.append(f"the device's entry is {_type(raw)}, expected an object")
    else:
        if "general" in raw:
            try:
                result["general"] = _checked_choice(raw["general"], device)
            except ValueError as exc:
                problems.append(f"general winner: {exc}")
        shapes = raw.get("shapes", {})
        if not isinstance(shapes, dict):
            problems.append(f"'shapes' is {_type(shapes)}, expected an object")
            shapes = {}
        for text, entry in shapes.items():
            try:
                shape = _parse_shape(text)
                result["shapes"][shape] = _checked_choice(entry, device, shape)
            except ValueError as exc:
                problems.append(f"winner for {text!r}: {exc}")
    for problem in problems:
        warnings.warn(f"malinn: {_tuning_file()}: device {key!r}: ignoring the tuned {problem}",
                      RuntimeWarning, stacklevel=4)
    with _lock:
        _checked[key] = result
    return result


def tuned_choice(device: Device, shape=None):
    """What the tuner chose for ``device``: the winner for ``shape``, else the general winner.

    Args:
        device: the device.
        shape: a product ``(m, k, n)`` (units, inputs, batch of a Dense layer), or ``None``.

    Returns:
        ``(codename, defines)``, or ``None`` when nothing valid was tuned for this device.
    """
    entry = _checked_entry(device)
    choice = entry["shapes"].get(tuple(int(v) for v in shape)) if shape is not None else None
    choice = choice or entry["general"]
    return (choice[0], dict(choice[1])) if choice else None


def _save(device: Device, general: dict | None = None, shapes: dict | None = None) -> Path:
    """Stores a general winner and/or per-shape winners for ``device``; other entries are kept.

    Raises:
        MalinnError: the database cannot be written, or a newer malinn wrote it.
    """
    path = _tuning_file()
    devices, writable = _read_file(path, quiet=True)
    if not writable:
        _check_writable()
    key = _device_key(device)
    entry = dict(devices.get(key)) if isinstance(devices.get(key), dict) else {}
    if general is not None:
        entry["general"] = general
    if shapes:
        old = entry.get("shapes") if isinstance(entry.get("shapes"), dict) else {}
        entry["shapes"] = {**old, **shapes}
    data = {"format": TUNING_FORMAT, "version": TUNING_VERSION, "devices": {**devices, key: entry}}
    try:
        write_atomic(path, (json.dumps(data, indent=2) + "\n").encode())
    except OSError as exc:
        raise MalinnError(f"{path}: cannot store the tuning results ({exc.strerror or exc})") from None
    _forget()
    return path


def _check_writable() -> None:
    """Fails before any timing when the results could not be stored.

    Raises:
        MalinnError: the cache folder is not a folder, or a newer malinn wrote the database.
    """
    path = _tuning_file()
    for folder in (path.parent, *path.parent.parents):
        if folder.exists():
            if not folder.is_dir():
                raise MalinnError(f"the cache folder {path.parent} cannot be made: {folder} is not a folder "
                                  f"(set MALINN_CACHE_DIR to a folder)")
            break
    if not _read_file(path, quiet=True)[1]:
        raise MalinnError(f"{path} was written by a newer malinn; not overwriting it (set MALINN_CACHE_DIR "
                          f"to another folder to tune with this one)")


def _progress(done: int, total: int, label: str, stream, started: float) -> None:
    width = 30
    filled = int(width * done / max(total, 1))
    elapsed = time.perf_counter() - started
    if done == total:
        timing = f"done in {elapsed:.0f} s"
    elif done:
        timing = f"ETA {elapsed / done * (total - done):.0f} s"
    else:
        timing = "ETA ?"
    stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {timing:<14} {label[:56]:<56}")
    if done == total:
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


def _candidates(library, device: Device, quick: bool, seed: int) -> list[tuple[str, dict]]:
    """``(codename, defines)`` to time: every matmul kernel's defaults first, then its other configurations.

    Each tunable kernel's own defaults and the library's default for the device's kind come first; the
    rest are shuffled (a run cut short by a budget samples evenly) and, with ``quick``, cut to
    :data:`QUICK_CONFIGS` in all.
    """
    kind_default = library.default_spec("matmul", device.kind)
    found = []
    for codename in library.codenames("matmul"):
        spec = library[codename]
        configs = spec.configurations(device) if spec.candidates else [spec.config]
        first = configs[:1]
        if codename == kind_default.codename and kind_default.config in configs and kind_default.config not in first:
            first.append(kind_default.config)
        rest = [c for c in configs if c not in first]
        random.Random(seed).shuffle(rest)
        if quick:
            rest = rest[:max(0, QUICK_CONFIGS - len(first))]
        found += [(codename, config) for config in first + rest]
    return found


def tune(device: Device | None = None, shapes=None, quick: bool = False, repeat: int = 3,
         budget_s: float | None = None, stream=sys.stderr, seed: int = 0, per_shape: bool = False) -> dict:
    """Times candidates on ``device`` and stores the fastest correct ones in the tuning database.

    Args:
        device: the device (default: the current one).
        shapes: ``(m, k, n)`` products to time (default: :data:`STANDARD_SHAPES`, or
            :data:`QUICK_SHAPES` with ``quick``).
        quick: the smaller shapes and at most :data:`QUICK_CONFIGS` configurations per tunable
            kernel (every kernel's defaults are still timed and checked).
        repeat: timed runs per candidate and shape (the median counts).
        budget_s: stop trying new candidates after this many seconds (the best so far wins).
        stream: where the progress bar (with its ETA) goes.
        seed: for the sample of configurations.
        per_shape: time each shape on its own, with the candidates whose preconditions it meets,
            and store a winner per shape; else store one general winner, the fastest over all shapes.

    Returns:
        General: ``{"codename", "defines", "seconds", "gflops", "shapes", "candidates", "ranking",
        "path", ...}`` of the winner. Per shape: ``{"shapes": {"MxKxN": winner}, "untuned": [...],
        "candidates", "path"}``, each winner with ``codename``, ``defines``, ``seconds``, ``gflops``.

    Raises:
        MalinnError: no candidate was correct on this device (for any shape), or the database
            cannot be written (checked before any timing where it can be).
    """
    from .device import get_device
    from .kernel_library import load_library

    _check_writable()
    device = device or get_device()
    library = load_library()
    shapes = shapes or (QUICK_SHAPES if quick else STANDARD_SHAPES)
    shapes = list(dict.fromkeys(tuple(int(v) for v in s) for s in shapes))
    work = []   # (codename, config, spec, the shapes it is timed on)
    for codename, config in _candidates(library, device, quick, seed):
        spec = library[codename].configure(config)
        mine = [s for s in shapes if spec.accepts(*s, device=device)] if per_shape else shapes
        if mine:
            work.append((codename, config, spec, mine))
    total = sum(len(w[3]) for w in work)
    start = time.perf_counter()
    done, results = 0, []
    timed = {s: [] for s in shapes}          # shape -> [(seconds, codename, config)]
    for codename, config, spec, mine in work:
        if budget_s is not None and time.perf_counter() - start > budget_s:
            stream.write(f"\ntime budget of {budget_s:g} s spent after {len(results)} candidates\n")
            break
        label = f"{codename} {' '.join(f'{k}={v}' for k, v in config.items())}"
        seconds, error = {}, None
        for shape in mine:
            _progress(done, total, f"{shape_key(shape)} {label}" if per_shape else label, stream, start)
            done += 1
            if error is None and (per_shape or None not in seconds.values()):   # general: wrong once, out
                try:
                    seconds[shape] = _time_product(spec, device, shape, repeat)
                except MalinnError as exc:   # a configuration this device cannot build or launch
                    error = str(exc).splitlines()[0]
        if error is not None:
            results.append({"codename": codename, "defines": config, "error": error})
        else:
            total_s = None if None in seconds.values() else sum(seconds.values())
            results.append({"codename": codename, "defines": config, "seconds": total_s})
        if per_shape or error is None:
            for shape, value in seconds.items():
                if value is not None:
                    timed[shape].append((value, codename, config))
    else:
        _progress(total, total, "", stream, start)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    if per_shape:
        winners = {}
        for shape, found in timed.items():
            if found:
                value, codename, config = min(found, key=lambda t: t[0])
                winners[shape_key(shape)] = {"codename": codename, "defines": config, "seconds": value,
                                             "gflops": 2.0 * math.prod(shape) / value / 1e9, "tuned_at": stamp}
        if not winners:
            raise MalinnError(f"no matmul candidate ran correctly on {device.name} for "
                              f"{', '.join(map(shape_key, shapes))}")
        path = _save(device, shapes=winners)
        return {"shapes": winners, "untuned": [shape_key(s) for s in shapes if shape_key(s) not in winners],
                "candidates": len(results), "path": str(path)}
    ranked = sorted((r for r in results if r.get("seconds")), key=lambda r: r["seconds"])
    if not ranked:
        raise MalinnError(f"no matmul candidate ran correctly on {device.name}")
    flop = sum(2.0 * m * k * n for m, k, n in shapes)
    best = {**ranked[0], "shapes": [list(s) for s in shapes], "gflops": flop / ranked[0]["seconds"] / 1e9,
            "device": device.name, "driver": device.driver_version, "tuned_at": stamp, "candidates": len(results),
            "ranking": [{**r, "gflops": flop / r["seconds"] / 1e9} for r in ranked[:20]]}
    best["path"] = str(_save(device, general=best))
    return best
