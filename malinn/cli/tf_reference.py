"""Keras's own outputs for ``malinn verify``, computed in a separate process.

Run as ``python -m malinn.cli.tf_reference [--weights=W] MODEL X.npz OUT.npz NAME [NAME ...]``
(``X.npz`` holds ``x0``, ``x1``, ...: one array per model input, and ``names``: malinn's names of
those inputs, which put them in Keras's order); writes Keras's output of each
named layer (``layer:<name>``), the model's output (``output``, or ``output:<j>`` for several) and
the dtypes its layers computed in (``compute_dtypes``: ``float16`` under ``mixed_float16``, say,
``int8`` for a quantized layer).
With ``--weights``, MODEL is an architecture JSON (``model.to_json()``) and W its ``save_weights``
file. malinn never imports this module: TensorFlow and PoCL cannot share a process (PoCL's kernel
compiler then binds to TensorFlow's LLVM and fails), and TensorFlow is no runtime dependency.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

# Keras's models, layers and tensors are typed Any here: keras and tf_keras ship no type information.


def main(argv: list[str]) -> int:
    weights = None
    if argv and argv[0].startswith("--weights="):
        weights, argv = argv[0][len("--weights=") :], argv[1:]
    model_path, x_path, out_path, *names = argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    # TensorFlow's oneDNN kernels fuse ops and change their NaN results (a softmax of [nan, 0, 1, 2]
    # gives [nan, 0, 0, 0], not all NaN): Keras's own arithmetic is the reference, as the test zoo's
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    import numpy as np

    keras = _keras_for(model_path, weights)
    if weights is None:
        model = keras.models.load_model(model_path, compile=False)
    else:
        model = _load_split(keras, model_path, weights)
    with np.load(x_path) as npz:  # x0, x1, ...: one array per model input, and their names
        count = len([f for f in npz.files if f.startswith("x")])
        arrays = [npz[f"x{i}"] for i in range(count)]
        input_names = [str(n) for n in npz["names"]] if "names" in npz.files else []
    x = _as_keras_inputs(model, arrays, input_names)
    # float32 whatever Keras computed in (a bfloat16 model's outputs would be saved as raw 2-byte items)
    result = model(x, training=False)
    if isinstance(result, (list, tuple, dict)):
        result = list(result.values()) if isinstance(result, dict) else list(result)
        outputs: dict[str, np.ndarray] = {f"output:{j}": np.asarray(y).astype(np.float32) for j, y in enumerate(result)}
    else:
        outputs = {"output": np.asarray(result).astype(np.float32)}
    wanted = []
    for name in names:
        try:
            wanted.append((name, model.get_layer(name).output))
        except (ValueError, AttributeError):
            pass  # a layer of a nested model, or one called twice: only the final output is compared
    if wanted:
        probe = keras.Model(inputs=model.inputs, outputs=[t for _, t in wanted])
        x = _in_order(model.inputs, _by_input(model, arrays, input_names), arrays)
        values = probe(x, training=False)
        values = values if isinstance(values, (list, tuple)) else [values]
        for (name, _), value in zip(wanted, values):
            outputs[f"layer:{name}"] = np.asarray(value).astype(np.float32)
    # what Keras computed in: a mixed or half policy differs from malinn's float32 by its precision
    outputs["compute_dtypes"] = np.array(sorted({str(dtype) for dtype in _compute_dtypes(model)}) or ["float32"])
    np.savez(out_path, **outputs)  # type: ignore[arg-type]  # numpy's stubs take **outputs for savez's allow_pickle
    return 0


def _tensor_name(tensor: Any) -> str:
    return str(getattr(tensor, "name", "")).split(":")[0]


def _by_input(model: Any, arrays: list[np.ndarray], names: list[str]) -> dict:
    """Each array by the name of the Keras input tensor it feeds: malinn names an input by its
    ``Input``'s name, or, for a Keras 3 dict of inputs, by its key."""
    by_name = dict(zip(names, arrays))
    struct = getattr(model, "_inputs_struct", None)
    if isinstance(struct, dict):
        for key, tensor in struct.items():
            if key in by_name:
                by_name.setdefault(_tensor_name(tensor), by_name[key])
    return by_name


def _in_order(tensors: list, by_input: dict, arrays: list[np.ndarray]) -> object:
    """The arrays as a list in the order of ``tensors``; ``arrays`` as given (malinn's order) where
    an input's name is not known."""
    ordered = [by_input.get(_tensor_name(t)) for t in tensors]
    found = arrays if any(a is None for a in ordered) or len(ordered) != len(arrays) else ordered
    return found[0] if len(found) == 1 else found


def _as_keras_inputs(model: Any, arrays: list[np.ndarray], names: list[str]) -> object:
    """The inputs as ``model`` takes them: a dict keyed as its inputs' dict (Keras 3 orders a dict
    of inputs by key, not as written), else a list in the order of ``model.inputs``."""
    by_input = _by_input(model, arrays, names)
    struct = getattr(model, "_inputs_struct", None)
    if isinstance(struct, dict):
        keyed = {key: by_input.get(_tensor_name(t)) for key, t in struct.items()}
        if all(v is not None for v in keyed.values()):
            return keyed
    return _in_order(model.inputs, by_input, arrays)


def _compute_dtypes(model: Any) -> Iterator[str]:
    """The compute dtype of every layer of ``model``, nested models' layers too; ``int8`` for a
    layer Keras quantized (``model.quantize("int8")``: it rounds the layer's inputs to int8 too)."""
    for layer in getattr(model, "layers", []):
        if getattr(layer, "layers", None):
            yield from _compute_dtypes(layer)
        elif type(layer).__name__ != "InputLayer":
            mode = getattr(layer, "quantization_mode", None) or getattr(
                getattr(layer, "dtype_policy", None), "quantization_mode", None
            )
            yield str(mode) if mode else getattr(layer, "compute_dtype", "float32")


def _load_split(keras: ModuleType, architecture: str, weights: str) -> Any:
    """``model_from_json`` then ``load_weights``, the weights file seen under the suffix Keras
    dispatches on: ``.weights.h5`` for Keras 3's layout, ``.h5`` for Keras 2's."""
    import h5py

    with open(architecture, encoding="utf-8-sig") as fh:
        model = keras.models.model_from_json(fh.read())
    with h5py.File(weights, "r") as f:
        legacy = "layer_names" in f.attrs or "layer_names0" in f.attrs
    with tempfile.TemporaryDirectory() as tmp:
        link = os.path.join(tmp, "model.h5" if legacy else "model.weights.h5")
        os.symlink(os.path.abspath(weights), link)
        model.load_weights(link)
    return model


def _keras_for(path: str, weights: str | None = None) -> ModuleType:
    """tf_keras for files written by Keras 2 (when installed), else Keras 3."""
    from malinn.converters import read_keras

    if read_keras(path, weights=weights).keras_major == 2:
        try:
            import tf_keras

            return tf_keras
        except ImportError:
            pass
    import keras

    return keras


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
