"""The one registry of serializable classes: layers and models, by class name (as Keras's).

Layer classes register themselves when they are defined (:class:`malinn.layers.Layer` does it for
every subclass) and model classes likewise, so saving, loading, the converter and the CLI find a
class from the name a file records, and no module needs to import the one that defines it.
"""

from __future__ import annotations

__all__ = ["register", "lookup", "names"]

_CLASSES: dict = {"layer": {}, "model": {}}


def register(kind: str, cls) -> None:
    """Registers ``cls`` as a ``kind`` (``"layer"`` or ``"model"``) under its class name."""
    _CLASSES[kind][cls.__name__] = cls


def lookup(kind: str, name: str):
    """The ``kind`` class registered as ``name``.

    Raises:
        KeyError: none is; the message lists the known names.
    """
    try:
        return _CLASSES[kind][name]
    except KeyError:
        raise KeyError(f"unknown {kind} class {name!r}; known: {', '.join(sorted(_CLASSES[kind]))}") from None


def names(kind: str) -> list:
    """The registered ``kind`` class names, sorted."""
    return sorted(_CLASSES[kind])
