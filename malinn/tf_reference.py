"""Keras's own outputs for ``malinn verify``, computed in a separate process.

Run as ``python -m malinn.tf_reference [--weights=W] MODEL X.npz OUT.npz NAME [NAME ...]``
(``X.npz`` holds ``x0``, ``x1``, ...: one array per model input); writes Keras's output of each
named layer (``layer:<name>``), the model's output (``output``, or ``output:<j>`` for several) and
the dtypes its layers computed in (``compute_dtypes``: ``float16`` under ``mixed_float16``, say).
With ``--weights``, MODEL is an architecture JSON (``model.to_json()``) and W its ``save_weights``
file. malinn never imports this module: TensorFlow and PoCL cannot share a process (PoCL's kernel
compiler then binds to TensorFlow's LLVM and fails), and TensorFlow is no runtime dependency.
"""

import os
import sys
import tempfile


def main(argv):
    weights = None
    if argv and argv[0].startswith("--weights="):
        weights, argv = argv[0][len("--weights="):], argv[1:]
    model_path, x_path, out_path, *names = argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np

    keras = _keras_for(model_path, weights)
    if weights is None:
        model = keras.models.load_model(model_path, compile=False)
    else:
        model = _load_split(keras, model_path, weights)
    with np.load(x_path) as npz:   # x0, x1, ...: one array per model input
        x = [npz[f"x{i}"] for i in range(len(npz.files))]
    x = x[0] if len(x) == 1 else x
    # float32 whatever Keras computed in (a bfloat16 model's outputs would be saved as raw 2-byte items)
    result = model(x, training=False)
    if isinstance(result, (list, tuple, dict)):
        result = list(result.values()) if isinstance(result, dict) else list(result)
        outputs = {f"output:{j}": np.asarray(y).astype(np.float32) for j, y in enumerate(result)}
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
        values = probe(x, training=False)
        values = values if isinstance(values, (list, tuple)) else [values]
        for (name, _), value in zip(wanted, values):
            outputs[f"layer:{name}"] = np.asarray(value).astype(np.float32)
    # what Keras computed in: a mixed or half policy differs from malinn's float32 by its precision
    outputs["compute_dtypes"] = np.array(sorted({str(dtype) for dtype in _compute_dtypes(model)}) or ["float32"])
    np.savez(out_path, **outputs)
    return 0


def _compute_dtypes(model):
    """The compute dtype of every layer of ``model``, nested models' layers too."""
    for layer in getattr(model, "layers", []):
        if getattr(layer, "layers", None):
            yield from _compute_dtypes(layer)
        elif type(layer).__name__ != "InputLayer":
            yield getattr(layer, "compute_dtype", "float32")


def _load_split(keras, architecture, weights):
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


def _keras_for(path, weights=None):
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
