"""The tuning database: the matmul kernel and configuration that won on each device (CLBlast-style).

``tuning.json`` in the cache folder (:func:`malinn.io.cache.cache_dir`), apart from the kernel
library (as CLBlast keeps its tuning database apart from its kernels)::

    {"format": "malinn-tuning", "version": 1, "devices": {"<device identity>": {
        "general": {"codename": ..., "defines": {...}, "gflops": ..., "tuned_at": ...},
        "shapes": {"150x640x1": {"codename": ..., "defines": {...}, "seconds": ...}, ...},
        "convs": {"b8-c96-m256-g1-i27x27-o27x27-k5x5-s1x1-d1x1-p2x2": {"codename": "im2row", ...}}}}}

(the flat ``{"<device key>": {"codename": ...}}`` of malinn 0.1 is read as general winners).
Every entry is checked against the kernel library when it is read: a matmul codename, defines of
the right types forming a configuration the library offers on this device, and, for a shape's
winner, a kernel whose preconditions that shape meets; a convolution's winner (``convs``, keyed by
:meth:`malinn.choice.conv_geometry.ConvGeometry.key`) names a ``conv`` or ``im2col`` kernel in a
configuration the library offers. An entry that fails is ignored with a
one-line warning naming the file, the device and why; the kernel choice then falls back to the
library's default (:func:`tuned_choice`). ``malinn tune`` (:mod:`malinn.tuning.tuner`) writes it.
"""

from __future__ import annotations

import json
import threading
import warnings
from pathlib import Path
from typing import Any

from ..backends.base import Device
from ..errors import LibraryError, MalinnError
from ..io.cache import cache_dir, locked, write_atomic
from ..library.kernel_library import load_library
from .conv_geometry import ConvGeometry

__all__ = [
    "tuned_choice",
    "tuned_conv",
    "offered",
    "save",
    "check_writable",
    "forget",
    "version",
    "tuning_file",
    "device_key",
    "shape_key",
    "read_all",
    "stored",
    "TUNING_FORMAT",
    "TUNING_VERSION",
]

TUNING_FORMAT = "malinn-tuning"
TUNING_VERSION = 1

_lock = threading.Lock()
_loaded: dict | None = None  # device key -> raw entry, as read from tuning.json
_checked: dict = {}  # device key -> {"general": choice or None, "shapes": {(m, k, n): choice}}
_version = [0]


def tuning_file() -> Path:
    """Where the tuning database lives: ``tuning.json`` in the cache folder."""
    return cache_dir() / "tuning.json"


def device_key(device: Device, precision: str = "fp32") -> str:
    """The database's name of a device: its one identity (backend, platform, name, vendor, driver),
    and for a weight precision other than fp32, ``|`` and the precision's name (winners in another
    precision are timed apart: a kernel that reads half the bytes may win where it did not)."""
    return device.identity if precision == "fp32" else f"{device.identity}|{precision}"


def shape_key(shape: tuple) -> str:
    """The database's name of a product ``(m, k, n)``: ``"MxKxN"``."""
    m, k, n = shape
    return f"{m}x{k}x{n}"


def _parse_shape(text: object) -> tuple:
    parts = text.split("x") if isinstance(text, str) else []
    if len(parts) != 3 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"{text!r} is not a product MxKxN of positive integers")
    return tuple(int(p) for p in parts)


def _type(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__
    )


def forget() -> None:
    """Drops what was read from tuning.json, so the next question reads it again."""
    global _loaded
    with _lock:
        _loaded = None
        _checked.clear()
        _version[0] += 1


def version() -> int:
    """A number that changes whenever what the database answers may change (plans made before are stale)."""
    return _version[0]


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
    except RecursionError:
        return damaged("nested too deeply to read")
    if not isinstance(data, dict):
        return damaged(f"expected an object, got {_type(data)}")
    if "format" not in data and "version" not in data and "devices" not in data:
        return {key: {"general": entry} for key, entry in data.items()}, True  # the flat form of malinn < 0.2
    if data.get("format") != TUNING_FORMAT:
        return damaged(f"'format' is {data.get('format')!r}, expected {TUNING_FORMAT!r}")
    version = data.get("version")
    if version != TUNING_VERSION:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > TUNING_VERSION
        return damaged(
            f"version {version!r}"
            + (", written by a newer malinn" if newer else "")
            + f"; this malinn reads version {TUNING_VERSION}",
            writable=not newer,
        )
    if not isinstance(data.get("devices"), dict):
        return damaged(f"'devices' is {_type(data.get('devices'))}, expected an object")
    return data["devices"], True


def read_all() -> dict:
    """The database's device entries, read once per process (until :func:`tune` stores new ones)."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _read_file(tuning_file())[0]
        return _loaded


def _checked_choice(
    entry: Any, device: Device, shape: tuple[int, int, int] | None = None, precision: str = "fp32"
) -> tuple[str, dict]:
    """``(codename, defines)`` of a stored winner after checking it against the library.

    Raises:
        ValueError: the entry is not a winner the library can run on ``device`` (for ``shape``).
    """
    if not isinstance(entry, dict):
        raise ValueError(f"expected an object, got {_type(entry)}")
    codename = entry.get("codename")
    if not isinstance(codename, str):
        raise ValueError(f"'codename' is {_type(codename)}, expected a string")
    library = load_library()
    if codename not in library or library[codename].op != "matmul":
        raise ValueError(f"{codename!r} is not a matmul kernel of {library.path}")
    spec = library[codename]
    if precision not in spec.precisions:
        raise ValueError(f"{codename!r} does not support precision {precision!r}")
    defines = entry.get("defines", {})
    if not isinstance(defines, dict):
        raise ValueError(f"'defines' is {_type(defines)}, expected an object")
    for name, value in defines.items():
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError(f"define {name} is {_type(value)}, expected an integer or a string")
    config = {**spec.config, **{name: str(value) for name, value in defines.items()}}
    if config not in spec.configurations(device):
        raise ValueError(
            f"{codename} {' '.join(f'{k}={v}' for k, v in defines.items()) or '(defaults)'} is not "
            f"a configuration the library offers on {device.name} (the library changed since tuning, "
            f"or the file was edited)"
        )
    if shape is not None and not spec.configure(config).accepts(*shape, device=device):
        raise ValueError(f"{codename}'s preconditions do not hold for {shape_key(shape)}")
    return codename, config


def offered(entry: Any, device: Device, shape: tuple[int, int, int] | None = None, precision: str = "fp32") -> bool:
    """Whether a stored matmul winner is one the library still offers on ``device`` (for the product
    ``shape``, its preconditions holding) in ``precision`` (what :func:`tuned_choice` would take)."""
    try:
        _checked_choice(entry, device, shape, precision)
    except ValueError:
        return False
    return True


def _checked_conv(entry: Any, device: Device) -> tuple[str, dict]:
    """``(codename, defines)`` of a stored convolution winner after checking it against the library.

    Raises:
        ValueError: the entry is not a conv or im2col kernel in a configuration the library offers.
    """
    if not isinstance(entry, dict) or not isinstance(entry.get("codename"), str):
        raise ValueError(f"expected an object with a 'codename' string, got {_type(entry)}")
    library = load_library()
    codename, defines = entry["codename"], entry.get("defines", {})
    if codename not in library or library[codename].op not in ("conv", "im2col"):
        raise ValueError(f"{codename!r} is not a conv or im2col kernel of {library.path}")
    if not isinstance(defines, dict) or any(
        isinstance(v, bool) or not isinstance(v, (int, str)) for v in defines.values()
    ):
        raise ValueError("'defines' is not an object of integers and strings")
    spec = library[codename]
    config = {**spec.config, **{name: str(value) for name, value in defines.items()}}
    if config not in spec.configurations(device) + _rule_configurations(library, spec, device):
        raise ValueError(
            f"{codename} {' '.join(f'{k}={v}' for k, v in defines.items()) or '(defaults)'} is not "
            f"a configuration the library offers on {device.name}"
        )
    return codename, config


def _rule_configurations(library: Any, spec: Any, device: Device) -> list:
    """The configurations of ``spec`` that the library's ``conv_algorithms`` rules name (for any
    kind) and ``device`` can launch: the tuner times the device kind's rules beside the entry's
    candidates, and one of them may win."""
    found = []
    for table in library.section("conv_algorithms").get("rules", {}).values():
        for rule in table if isinstance(table, list) else []:
            if isinstance(rule, dict) and rule.get("codename") == spec.codename:
                try:
                    configured = spec.configure(rule.get("defines"))
                except LibraryError:  # a bad rule is conv_choice.rules' to name
                    continue
                if configured.fits(device):
                    found.append(configured.config)
    return found


def _checked_entry(device: Device, precision: str = "fp32") -> dict:
    """This device's winners (in ``precision``), checked once per process; bad ones are dropped
    with a warning each."""
    key = device_key(device, precision)
    with _lock:
        if key in _checked:
            return _checked[key]
    devices = read_all()
    raw = devices.get(key, {})
    result: dict[str, Any] = {"general": None, "shapes": {}, "convs": {}}
    problems: list[str] = []
    if not isinstance(raw, dict):
        problems.append(f"entry: it is {_type(raw)}, expected an object")
    else:
        if "general" in raw:
            try:
                result["general"] = _checked_choice(raw["general"], device, precision=precision)
            except ValueError as exc:
                problems.append(f"general winner: {exc}")
        shapes = raw.get("shapes", {})
        if not isinstance(shapes, dict):
            problems.append(f"winners by shape: 'shapes' is {_type(shapes)}, expected an object")
            shapes = {}
        for text, entry in shapes.items():
            try:
                shape = _parse_shape(text)
                result["shapes"][shape] = _checked_choice(entry, device, shape, precision)
            except ValueError as exc:
                problems.append(f"winner for {text!r}: {exc}")
        convs = raw.get("convs", {}) if precision == "fp32" else {}
        if not isinstance(convs, dict):
            problems.append(f"convolution winners: 'convs' is {_type(convs)}, expected an object")
            convs = {}
        for text, entry in convs.items():
            try:
                result["convs"][ConvGeometry.parse(text)] = _checked_conv(entry, device)
            except ValueError as exc:
                problems.append(f"convolution winner for {text!r}: {exc}")
    for problem in problems:
        warnings.warn(
            f"malinn: {tuning_file()}: device {key!r}: ignoring the tuned {problem}", RuntimeWarning, stacklevel=4
        )
    with _lock:
        _checked[key] = result
    return result


def tuned_choice(
    device: Device, shape: tuple[int, int, int] | None = None, precision: str = "fp32"
) -> tuple[str, dict] | None:
    """What the tuner chose for ``device``: the winner for ``shape``, else the general winner.

    Args:
        device: the device.
        shape: a product ``(m, k, n)`` (units, inputs, batch of a Dense layer), or ``None``.
        precision: the weights' precision (winners are stored per precision).

    Returns:
        ``(codename, defines)`` (the defines without the precision's), or ``None`` when nothing
        valid was tuned for this device in ``precision``.
    """
    entry = _checked_entry(device, precision)
    choice = entry["shapes"].get(tuple(int(v) for v in shape)) if shape is not None else None
    choice = choice or entry["general"]
    return (choice[0], dict(choice[1])) if choice else None


def tuned_conv(device: Device, geometry: ConvGeometry) -> tuple[str, dict] | None:
    """The tuner's winner for a convolution of ``geometry`` on ``device``: ``(codename, defines)``
    (a ``conv`` or ``im2col`` kernel), or ``None`` when none was tuned (or it failed its checks)."""
    choice = _checked_entry(device)["convs"].get(geometry)
    return (choice[0], dict(choice[1])) if choice else None


def save(
    device: Device,
    general: dict | None = None,
    shapes: dict | None = None,
    precision: str = "fp32",
    convs: dict | None = None,
) -> Path:
    """Stores a general winner, per-shape winners and/or convolution winners (``convs``: geometry
    key -> winner) for ``device`` (in ``precision``); other entries are kept.

    Raises:
        MalinnError: the database cannot be written, or a newer malinn wrote it.
    """
    path = tuning_file()
    try:
        with locked(path):  # read, merged and written under one lock: two tuning processes lose nothing
            devices, writable = _read_file(path, quiet=True)
            if not writable:
                check_writable()
            key = device_key(device, precision)
            known = devices.get(key)
            entry = dict(known) if isinstance(known, dict) else {}
            if general is not None:
                entry["general"] = general
            if shapes:
                old = entry.get("shapes")
                entry["shapes"] = {**(old if isinstance(old, dict) else {}), **shapes}
            if convs:
                old = entry.get("convs")
                entry["convs"] = {**(old if isinstance(old, dict) else {}), **convs}
            data = {"format": TUNING_FORMAT, "version": TUNING_VERSION, "devices": {**devices, key: entry}}
            write_atomic(path, (json.dumps(data, indent=2) + "\n").encode())
    except OSError as exc:
        raise MalinnError(f"{path}: cannot store the tuning results ({exc.strerror or exc})") from None
    forget()
    return path


def stored(device: Device, precision: str = "fp32") -> dict:
    """This device's entry in ``precision`` as the file holds it now (unchecked; ``{}`` where there
    is none): what a run cut short by its budget compares its winners with before replacing them."""
    entry = _read_file(tuning_file(), quiet=True)[0].get(device_key(device, precision))
    return entry if isinstance(entry, dict) else {}


def check_writable() -> None:
    """Fails before any timing when the results could not be stored.

    Raises:
        MalinnError: the cache folder is not a folder, the database's path is a folder, or a newer
            malinn wrote the database.
    """
    path = tuning_file()
    if path.is_dir():
        raise MalinnError(
            f"{path} is a folder, where the tuning database is a file: move it away (or set "
            f"MALINN_CACHE_DIR to another folder)"
        )
    for folder in (path.parent, *path.parent.parents):
        if folder.exists():
            if not folder.is_dir():
                raise MalinnError(
                    f"the cache folder {path.parent} cannot be made: {folder} is not a folder "
                    f"(set MALINN_CACHE_DIR to a folder)"
                )
            break
    if not _read_file(path, quiet=True)[1]:
        raise MalinnError(
            f"{path} was written by a newer malinn; not overwriting it (set MALINN_CACHE_DIR "
            f"to another folder to tune with this one)"
        )
