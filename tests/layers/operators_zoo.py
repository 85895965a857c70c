"""Keras models of operators and scale layers (a constant operand, two-tensor operators, the
activation functions called as operators, LayerScale, CustomScaleLayer), built and saved in a
process of their own (TensorFlow and PoCL cannot share one: tests/keras_zoo.py says why):

    python3 tests/layers/operators_zoo.py OUTDIR [--applications]

For each model of :data:`MODELS`, with Keras 3 (which saves ``x + 3`` as an operation node) and with
tf_keras (a ``TFOpLambda``): random weights, the model saved as ``<generation>/<key>.keras`` and
``.h5``, and ``<generation>/<key>.npz`` holding ``x1``/``x3`` (inputs of batch 1 and 3) and
``y1``/``y3`` (Keras's predict). ``--applications`` also saves the keras.applications models of
:data:`APPLICATIONS` (Keras's initial weights, random normalization statistics, their smallest
input, the logits: no softmax, which would round most of them to 0) the same way. ``manifest.json`` is
written last. The module level is plain data: the tests import it.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

from zoo_files import randomize_statistics

GENERATIONS = ("keras3", "tf_keras")
SUFFIXES = (".keras", ".h5")
BATCHES = (1, 3)

#: key -> input shape (without the batch); the graphs are built by :func:`_graph`
MODELS = {
    "constant_scalars": (5, 3),
    "constant_first": (4,),
    "constant_per_channel": (2, 3, 4),
    "constant_maximum_minimum": (7,),
    "two_tensors": (3, 5),
    "activations": (2, 6),
    "layer_scale": (3, 4, 5),
    "custom_scale": (3, 3, 2),
}

#: key -> (generation, application name, input shape, extra keyword arguments)
APPLICATIONS = {
    "mobilenet_v3_small": (("keras3", "tf_keras"), "MobileNetV3Small", (32, 32, 3), {"minimalistic": False}),
    "convnext_tiny": (("keras3", "tf_keras"), "ConvNeXtTiny", (32, 32, 3), {}),
    "inception_resnet_v2": (("keras3", "tf_keras"), "InceptionResNetV2", (75, 75, 3), {}),
    "regnet_x002": (("tf_keras",), "RegNetX002", (32, 32, 3), {}),
}


def _graph(generation, keras, key, shape):
    """The model ``key``: Keras 3 ops through ``keras.ops``, tf_keras's through ``tf``."""
    import numpy as np

    L = keras.layers
    if generation == "keras3":
        ops = keras.ops
        maximum, minimum = ops.maximum, ops.minimum
        relu6, sigmoid, tanh, silu, softmax = ops.relu6, ops.sigmoid, ops.tanh, ops.silu, ops.softmax
        hard_sigmoid, gelu, relu = ops.hard_sigmoid, (lambda t: ops.gelu(t, approximate=False)), ops.relu
    else:
        import tensorflow as tf

        maximum, minimum = tf.maximum, tf.minimum
        relu6, sigmoid, tanh, silu, softmax = tf.nn.relu6, tf.math.sigmoid, tf.math.tanh, tf.nn.silu, tf.nn.softmax
        hard_sigmoid, gelu, relu = None, tf.nn.gelu, tf.nn.relu
    x = keras.Input(shape, name="x")
    if key == "constant_scalars":  # MobileNetV3's hard sigmoid, and each operator with a number
        h = L.Dense(3, name="d")(x)
        outs = [L.ReLU(6.0)(h + 3.0) * (1.0 / 6.0), h - 0.5, h / 4.0, h * -2.5]
        y = L.Concatenate()(outs)
    elif key == "constant_first":  # the number first: 2 - h, 3 * h, 1 + h
        h = L.Dense(4, name="d")(x)
        y = L.Concatenate()([2.0 - h, 3.0 * h, 1.0 + h])
    elif key == "constant_per_channel":  # arrays broadcast over the last axis and over the trailing two
        h = L.Conv2D(4, 1, name="c")(x)
        scale = np.array([0.5, -1.0, 2.0, 3.0], np.float32)
        shift = np.arange(12, dtype=np.float32).reshape(3, 4) / 7.0
        y = (h * scale) + shift
        y = y - np.array([0.25, 0.5, 0.75, 1.0], np.float32)
    elif key == "constant_maximum_minimum":
        h = L.Dense(7, name="d")(x)
        y = L.Concatenate()([maximum(h, 0.0), maximum(h, 0.3), minimum(h, 0.2), minimum(h, -0.4), maximum(h, -0.1)])
    elif key == "two_tensors":  # RegNet's residual add and squeeze-excite multiply, and the rest
        a, b = L.Dense(5, name="a")(x), L.Dense(5, name="b")(x)
        c = L.Dense(1, name="c", activation="sigmoid")(x)
        y = L.Concatenate()([a + b, a - b, a * b, a / (c + 0.5), maximum(a, b), minimum(a, b), a * c])
    elif key == "activations":
        h = L.Dense(6, name="d")(x)
        outs = [relu6(h * 4.0), sigmoid(h), tanh(h), silu(h), softmax(h), gelu(h), relu(h)]
        if hard_sigmoid is not None:
            outs.append(hard_sigmoid(h * 4.0))
        y = L.Concatenate()(outs)
    elif key == "layer_scale":
        if generation == "keras3":
            from keras.src.applications.convnext import LayerScale
        else:
            from tf_keras.src.applications.convnext import LayerScale
        y = LayerScale(1e-6, shape[-1], name="ls")(L.Conv2D(shape[-1], 1, name="c")(x))
    elif key == "custom_scale":
        if generation == "keras3":
            from keras.src.applications.inception_resnet_v2 import CustomScaleLayer
        else:
            from tf_keras.src.applications.inception_resnet_v2 import CustomScaleLayer
        a, b = L.Conv2D(2, 1, name="a")(x), L.Conv2D(2, 1, name="b")(x)
        y = CustomScaleLayer(0.17, name="scale")([a, b])
    else:
        raise KeyError(key)
    return keras.Model(x, y, name=key)


def _randomize(model, seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    weights = []
    for w in model.weights:
        value = rng.standard_normal(tuple(w.shape)).astype(np.float32) * 0.5
        if "variance" in w.name:
            value = np.abs(value) + 0.5
        weights.append(value)
    model.set_weights(weights)


def _save(model, folder, key, shape, seed):
    import numpy as np

    for suffix in SUFFIXES:
        model.save(folder / f"{key}{suffix}")
    rng = np.random.default_rng(seed)
    data = {}
    for batch in BATCHES:
        x = rng.standard_normal((batch,) + tuple(shape)).astype(np.float32)
        data[f"x{batch}"], data[f"y{batch}"] = x, np.asarray(model.predict(x, verbose=0))
    np.savez(folder / f"{key}.npz", **data)


def main(outdir: str, applications: bool = False) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import tf_keras

    out = pathlib.Path(outdir)
    for generation, module in (("keras3", keras), ("tf_keras", tf_keras)):
        folder = out / generation
        folder.mkdir(parents=True, exist_ok=True)
        for i, (key, shape) in enumerate(MODELS.items()):
            model = _graph(generation, module, key, shape)
            _randomize(model, i)
            _save(model, folder, key, shape, 3)
        if applications:
            for i, (key, (generations, name, shape, extra)) in enumerate(APPLICATIONS.items()):
                if generation not in generations:
                    continue
                model = getattr(module.applications, name)(
                    weights=None, input_shape=shape, classifier_activation=None, **extra
                )
                randomize_statistics(model, 100 + i)
                _save(model, folder, key, shape, 5)
    manifest = {
        "keras": keras.__version__,
        "tf_keras": tf_keras.__version__,
        "models": list(MODELS),
        "applications": list(APPLICATIONS) if applications else [],
    }
    (out / "manifest.json").write_text(json.dumps(manifest))


if __name__ == "__main__":
    main(sys.argv[1], "--applications" in sys.argv[2:])
