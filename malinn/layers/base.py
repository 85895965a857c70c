"""The layer contract, as in Keras: ``__init__`` validates, ``build`` makes weights, ``call`` runs,
``get_config`` returns what ``__init__`` needs to make the layer again."""

from __future__ import annotations

import itertools
import re

__all__ = ["Layer"]

_counters: dict = {}
_counter_lock = __import__("threading").Lock()


def _auto_name(prefix: str) -> str:
    with _counter_lock:
        counter = _counters.setdefault(prefix, itertools.count())
        i = next(counter)
    return prefix if i == 0 else f"{prefix}_{i}"


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Layer:
    """Base class of malinn layers.

    Args:
        name: the layer's name (default: the class name in snake case, numbered like Keras).

    Raises:
        ValueError: ``name`` is not a non-empty string.
    """

    #: True for layers that act on each value alone (they may stand before a Flatten).
    elementwise = False
    #: True for Flatten.
    flattens = False

    def __init__(self, name: str | None = None):
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"{type(self).__name__}: name must be a non-empty string, got {name!r}")
        self.name = name or _auto_name(_snake(type(self).__name__))
        self.built = False
        self.input_dim: int | None = None
        #: names of the Keras layers this layer stands for (set by the converter; for verify)
        self.keras_names: tuple = ()

    def build(self, input_dim: int) -> None:
        """Creates the layer's weights for inputs of ``input_dim`` features."""
        self.input_dim = int(input_dim)
        self.built = True

    def output_dim(self, input_dim: int) -> int:
        """The number of output features for ``input_dim`` input features."""
        return input_dim

    def call(self, inputs):
        """Runs the layer on a :class:`~malinn.matrix.DeviceMatrix` (features x batch)."""
        raise NotImplementedError

    def count_params(self) -> int:
        return sum(int(w.size) for w in self.get_weights())

    def get_weights(self) -> list:
        """The layer's weights as numpy arrays, in Keras's shapes and order."""
        return []

    def set_weights(self, weights) -> None:
        """Replaces the layer's weights; shapes must equal :meth:`get_weights`'s."""
        if list(weights):
            raise ValueError(f"layer {self.name!r} ({type(self).__name__}) has no weights, got {len(list(weights))}")

    def get_config(self) -> dict:
        return {"name": self.name}

    @classmethod
    def from_config(cls, config: dict) -> "Layer":
        return cls(**config)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r}>"
