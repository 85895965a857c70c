"""malinn's environment variables, read one way.

A switch (``MALINN_GL``, ``MALINN_BINARY_CACHE``, ``MALINN_PROBE_CACHE``, ``MALINN_ZERO_COPY``,
``MALINN_PINNED``, ``MALINN_STAGING``, ``MALINN_DEVICE_PADDING``, ``MALINN_OVERLAP``, ``MALINN_GL_NO_COMPUTE``,
``MALINN_PROGRESS``) is on with ``1``, ``true``, ``yes``
or ``on`` and off with ``0``, ``false``, ``no`` or ``off`` (any case, spaces around ignored); unset
or empty, it keeps its default (``MALINN_STAGING``'s: decided per device and size, a staging ring
for large transfers on a discrete GPU; 1 gives every plan input and output one, 0 none;
``MALINN_DEVICE_PADDING``'s: a padded input padded by a kernel on a discrete GPU, 1 on every device,
0 on none). Any other value is refused by name: ``MALINN_BINARY_CACHE=false`` was once ignored (the
cache stayed on) and ``MALINN_GL=false`` loaded Mesa beside TensorFlow.
"""

from __future__ import annotations

import os

from .errors import SettingError

__all__ = ["switch", "check_switches", "SWITCHES", "ON", "OFF"]

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")
#: every switch malinn reads
SWITCHES = (
    "MALINN_GL",
    "MALINN_GL_NO_COMPUTE",
    "MALINN_BINARY_CACHE",
    "MALINN_PROBE_CACHE",
    "MALINN_ZERO_COPY",
    "MALINN_PINNED",
    "MALINN_STAGING",
    "MALINN_DEVICE_PADDING",
    "MALINN_OVERLAP",
    "MALINN_PROGRESS",
)


def switch(name: str, default: bool | None) -> bool | None:
    """The value of the switch ``name``, or ``default`` where it is unset or empty.

    Raises:
        SettingError: the variable holds something else; the message names it and its value.
    """
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in ON:
        return True
    if value in OFF:
        return False
    raise SettingError(
        f"{name}={os.environ[name]!r}: expected 1 or 0 (or true/false, yes/no, on/off); unset it for the default"
    )


def check_switches() -> None:
    """Reads every switch once, before the devices are looked for: a value malinn does not read is
    refused there, on every machine, rather than inside a device's probe (which a failure only
    skips: the next device would be used) or not at all (a switch some devices never read).

    Raises:
        SettingError: a switch holds a value malinn does not read.
    """
    for name in SWITCHES:
        switch(name, None)
