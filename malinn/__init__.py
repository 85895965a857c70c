"""malinn: run trained Keras models on OpenCL devices.

Quick start::

    import numpy as np
    import malinn
    model = malinn.Sequential([malinn.layers.Dense(150, activation="relu"),
                               malinn.layers.Dense(10, activation="softmax")])
    model.build((None, 640))
    y = model.predict(np.random.rand(100, 640).astype("float32"))
"""

import importlib
from typing import TYPE_CHECKING

from . import registry as _registry
from .version import __version__

__all__ = [
    "__version__",
    "Sequential",
    "Functional",
    "Model",
    "Input",
    "load_model",
    "convert",
    "layers",
    "ops",
    "Layout",
    "load_library",
    "Device",
    "devices",
    "get_device",
    "get_devices",
    "set_device",
    "empty_pinned",
    "MalinnError",
    "DeviceError",
    "KernelBuildError",
    "LibraryError",
    "BackendError",
    "LayoutError",
    "ConversionError",
    "SettingError",
]

if TYPE_CHECKING:  # what the first use of the package imports (_load), for readers and type checkers
    from . import layers, ops
    from .backends.pinned import empty_pinned
    from .backends.selection import Device, devices, get_device, get_devices, set_device
    from .errors import (
        BackendError,
        ConversionError,
        DeviceError,
        KernelBuildError,
        LayoutError,
        LibraryError,
        MalinnError,
        SettingError,
    )
    from .layers.input_layer import Input
    from .library.kernel_library import load_library
    from .library.layout import Layout
    from .model.functional import Functional, Model
    from .model.saving import convert, load_model
    from .model.sequential import Sequential


_loaded = False


#: where _load finds each name of the public API (a module of the package)
_API = {
    "Device": "backends.selection",
    "devices": "backends.selection",
    "get_device": "backends.selection",
    "set_device": "backends.selection",
    "get_devices": "backends.selection",
    "Functional": "model.functional",
    "Model": "model.functional",
    "Input": "layers.input_layer",
    "load_library": "library.kernel_library",
    "empty_pinned": "backends.pinned",
    "Layout": "library.layout",
    "Sequential": "model.sequential",
    "convert": "model.saving",
    "load_model": "model.saving",
    **{
        name: "errors"
        for name in (
            "BackendError",
            "ConversionError",
            "DeviceError",
            "KernelBuildError",
            "LayoutError",
            "LibraryError",
            "MalinnError",
            "SettingError",
        )
    },
}


def _load() -> None:
    """Imports the public API (numpy, pyopencl and h5py with it) into the package, once: the package's
    own import stays cheap, so that the ``malinn`` command (:mod:`malinn.__main__`) takes Ctrl-C
    before anything slow runs."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name, module in _API.items():
        globals()[name] = getattr(importlib.import_module(f".{module}", __name__), name)
    for module in ("layers", "ops"):
        globals()[module] = importlib.import_module(f".{module}", __name__)


_registry.complete_with(_load)  # a file naming a class the package has not imported yet finds it


def __getattr__(name: str) -> object:
    """The public API, imported on first use (PEP 562); a submodule of the package where one has the name."""
    if name.startswith("__"):
        raise AttributeError(f"module 'malinn' has no attribute {name!r}")
    _load()
    if name in globals():
        return globals()[name]
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module 'malinn' has no attribute {name!r}")


def __dir__() -> list:
    _load()
    return sorted(set(globals()) | set(__all__))
