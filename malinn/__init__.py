"""malinn: run trained Keras models on OpenCL devices.

Quick start::

    import numpy as np
    import malinn
    model = malinn.Sequential([malinn.layers.Dense(150, activation="relu"),
                               malinn.layers.Dense(10, activation="softmax")])
    model.build((None, 640))
    y = model.predict(np.random.rand(100, 640).astype("float32"))
"""

from pathlib import Path as _Path

# An installed wheel holds the repository's converters/ as malinn/converters/; in a source checkout
# run without installing, it sits beside malinn/, so the checkout's root joins the package path.
if not (_Path(__file__).resolve().parent / "converters").is_dir():
    _root = _Path(__file__).resolve().parent.parent
    if (_root / "converters" / "__init__.py").is_file():
        __path__.append(str(_root))

from . import layers, ops  # noqa: E402
from .device_selection import Device, devices, get_device, set_device  # noqa: E402
from .errors import (BackendError, ConversionError, DeviceError, KernelBuildError, LayoutError,  # noqa: E402
                     LibraryError, MalinnError, SettingError)
from .kernel_library import load_library  # noqa: E402
from .layout import Layout  # noqa: E402
from .models import Sequential  # noqa: E402
from .functional import Functional, Model  # noqa: E402
from .graph import Input  # noqa: E402
from .saving import convert, load_model  # noqa: E402

from .version import __version__  # noqa: E402

__all__ = [
    "__version__",
    "Sequential", "Functional", "Model", "Input", "load_model", "convert", "layers", "ops", "Layout", "load_library",
    "Device", "devices", "get_device", "set_device",
    "MalinnError", "DeviceError", "KernelBuildError", "LibraryError", "BackendError", "LayoutError",
    "ConversionError", "SettingError",
]
