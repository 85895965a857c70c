"""The one registry of serializable classes: layers and models, by class name (as Keras's), and the
layer class that converts each Keras layer class.

Layer classes register themselves when they are defined (:class:`malinn.layers.Layer` does it for
every subclass, and under ``"keras"`` for each Keras class name a subclass converts: its own and
those it declares) and model classes likewise, so saving, loading, the converter and the CLI find a
class from the name a file records, and no module needs to import the one that defines it. The
package imports its classes on first use (:mod:`malinn`): it gives the registry that loader
(:func:`complete_with`), which a lookup runs before it says a name is unknown.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["register", "lookup", "names", "complete_with"]

_CLASSES: dict = {"layer": {}, "model": {}, "keras": {}}
#: what imports every class not yet registered (the package's loader), run once, when first needed
_loader: Callable[[], object] | None = None


def complete_with(loader: Callable[[], object]) -> None:
    """``loader()`` imports the modules that define the classes; it runs before a lookup misses."""
    global _loader
    _loader = loader


def _complete() -> None:
    global _loader
    if _loader is not None:
        loader, _loader = _loader, None
        loader()


def register(kind: str, cls: type, name: str | None = None) -> None:
    """Registers ``cls`` as a ``kind`` (``"layer"``, ``"model"``, or ``"keras"``: the layer class
    that converts a Keras class) under ``name`` (default: its class name)."""
    _CLASSES[kind][name or cls.__name__] = cls


def lookup(kind: str, name: str) -> type[Any]:
    """The ``kind`` class registered as ``name``.

    Raises:
        KeyError: none is; the message lists the known names.
    """
    if name not in _CLASSES[kind]:
        _complete()
    try:
        return _CLASSES[kind][name]
    except KeyError:
        raise KeyError(f"unknown {kind} class {name!r}; known: {', '.join(sorted(_CLASSES[kind]))}") from None


def names(kind: str) -> list:
    """The registered ``kind`` class names, sorted."""
    _complete()
    return sorted(_CLASSES[kind])
