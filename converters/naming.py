"""Names Keras derives from class names when it saves a ``.keras`` archive.

Keras 3 (and tf_keras's ``.keras`` format) store each layer of a Sequential or Functional model
under ``layers/<snake_case(class name)>``, adding ``_1``, ``_2``... when a class repeats, in the
order of ``model.layers``, not under the layer's own name.
"""

from __future__ import annotations

import re


def to_snake_case(name: str) -> str:
    """Keras's ``naming.to_snake_case``: ``"BatchNormalization"`` -> ``"batch_normalization"``."""
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    name = re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()
    if name.startswith("_"):
        # tf_keras prefixes private-looking names this way; Keras 3 class names never start so.
        name = "private" + name
    return name


def unique_saving_names(class_names: list[str]) -> list[str]:
    """The path component Keras gives each object of a list, in order (``dense``, ``dense_1``)."""
    used: dict[str, int] = {}
    out = []
    for class_name in class_names:
        base = to_snake_case(class_name)
        if base in used:
            used[base] += 1
            out.append(f"{base}_{used[base]}")
        else:
            used[base] = 0
            out.append(base)
    return out
