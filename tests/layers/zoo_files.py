"""What the layer zoo scripts (``*_zoo.py``, each run by a test in a child process: TensorFlow never
shares a test process) do with their models: each built by both Keras generations, saved as
``.keras`` and ``.h5``, its input and Keras's outputs written beside them in a ``.npz``."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

#: the Keras generations every zoo saves with: Keras 3 (``keras``) and Keras 2 (``tf_keras``)
GENERATIONS = ("keras3", "tf_keras")


def inputs_and_outputs(x, ys: list) -> dict:
    """The ``.npz`` arrays of a model's input ``x`` (``x``, or ``x0``, ``x1``, ... for a list) and its
    outputs ``ys`` (``y0``, ``y1``, ...)."""
    xs = {f"x{i}": v for i, v in enumerate(x)} if isinstance(x, list) else {"x": x}
    return {**xs, **{f"y{i}": y for i, y in enumerate(ys)}}


def write_zoo(out: Path, keys: Iterable[str], build: Callable, arrays: Callable = inputs_and_outputs) -> None:
    """Writes ``out/<generation>/<key>.keras``, ``.h5`` and ``.npz`` for each generation and key, then
    ``out/done``.

    Args:
        build: ``build(keras, key)`` -> ``(model, x)``, ``keras`` the generation's module.
        arrays: ``arrays(x, ys)`` -> the ``.npz``'s arrays, ``ys`` the model's outputs as a list.
    """
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np

    keys = list(keys)
    for generation in GENERATIONS:
        if generation == "keras3":
            import keras
        else:
            import tf_keras as keras
        folder = out / generation
        folder.mkdir(parents=True, exist_ok=True)
        for key in keys:
            model, x = build(keras, key)
            ys = model.predict(x, verbose=0)
            ys = [np.asarray(y) for y in ys] if isinstance(ys, (list, tuple)) else [np.asarray(ys)]
            model.save(folder / f"{key}.keras")
            model.save(folder / f"{key}.h5")
            np.savez(folder / f"{key}.npz", **arrays(x, ys))
    (out / "done").write_text("ok")


def randomize_statistics(model, seed: int) -> None:
    """Random normalization statistics and scales (a LayerScale's too: 1e-6 would hide its branch);
    the other weights keep Keras's own initializers, under which a deep model's activations stay
    near 1 (standard normal weights grow them to 1e4, where float32 sums differ by more than 1e-5)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    weights = []
    for w in model.weights:
        value, name, shape = np.asarray(w.numpy(), np.float32), w.name, tuple(w.shape)
        if "variance" in name or "gamma" in name:
            value = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        elif "beta" in name or "moving_mean" in name:
            value = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        weights.append(value)
    model.set_weights(weights)
