"""Keras models of the layers that grow or renormalize images (Conv1DTranspose, Conv2DTranspose,
UpSampling2D bilinear, Resizing, GroupNormalization), built and saved in a process of their own
(TensorFlow and PoCL cannot share one: tests/keras_zoo.py says why):

    python3 tests/layers/upsampling_zoo.py OUTDIR

For each model of :data:`MODELS`, with Keras 3 and with tf_keras: random weights (biases and
normalization offsets too), the model saved as ``<generation>/<key>.keras`` and ``.h5``, and
``<generation>/<key>.npz`` holding ``x`` (odd-shaped inputs, batch 1 and 3) and ``y`` (Keras's
predict). ``manifest.json`` is written last. The module level is plain data: the tests import it.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

#: key -> (input shape without the batch, [(layer class, kwargs)]): a Sequential after an Input
MODELS = {
    "conv2dt_same_s2": (
        (5, 4, 3),
        [("Conv2DTranspose", dict(filters=4, kernel_size=3, strides=2, padding="same", activation="relu"))],
    ),
    "conv2dt_valid_s3x2": (
        (3, 5, 13),
        [("Conv2DTranspose", dict(filters=3, kernel_size=(2, 3), strides=(3, 2), padding="valid"))],
    ),
    "conv2dt_output_padding": (
        (4, 3, 2),
        [("Conv2DTranspose", dict(filters=5, kernel_size=4, strides=(2, 3), padding="same", output_padding=(1, 2)))],
    ),
    "conv2dt_valid_output_padding": (
        (3, 3, 2),
        [
            (
                "Conv2DTranspose",
                dict(filters=2, kernel_size=3, strides=2, padding="valid", output_padding=1, use_bias=False),
            )
        ],
    ),
    "conv2dt_dilated": (
        (4, 5, 2),
        [("Conv2DTranspose", dict(filters=3, kernel_size=3, dilation_rate=2, padding="same", activation="tanh"))],
    ),
    "conv2dt_one_pixel": ((1, 1, 1), [("Conv2DTranspose", dict(filters=1, kernel_size=1))]),
    "conv1dt": (
        (7, 3),
        [
            ("Conv1DTranspose", dict(filters=4, kernel_size=3, strides=2, padding="same")),
            ("Conv1DTranspose", dict(filters=2, kernel_size=2, strides=3, padding="valid", activation="sigmoid")),
        ],
    ),
    "decoder": (
        (3, 3, 4),
        [
            ("Conv2DTranspose", dict(filters=8, kernel_size=3, strides=2, padding="same")),
            ("BatchNormalization", {}),
            ("Conv2DTranspose", dict(filters=3, kernel_size=3, strides=2, padding="same", activation="sigmoid")),
        ],
    ),
    "upsampling_bilinear": ((5, 3, 2), [("UpSampling2D", dict(size=(2, 3), interpolation="bilinear"))]),
    "upsampling_bilinear_one_pixel": ((1, 1, 3), [("UpSampling2D", dict(size=3, interpolation="bilinear"))]),
    "resizing_bilinear_down": ((7, 5, 3), [("Resizing", dict(height=3, width=4))]),
    "resizing_bilinear_up": ((3, 2, 2), [("Resizing", dict(height=7, width=5))]),
    "resizing_nearest": ((5, 7, 2), [("Resizing", dict(height=3, width=11, interpolation="nearest"))]),
    "groupnorm": ((5, 4, 6), [("GroupNormalization", dict(groups=3))]),
    "groupnorm_one_group": ((7, 4), [("GroupNormalization", dict(groups=1, center=False))]),
    "groupnorm_per_channel": ((2, 3, 4), [("GroupNormalization", dict(groups=4, epsilon=1e-5, scale=False))]),
    "groupnorm_after_conv": (
        (3, 3, 2),
        [
            ("Conv2DTranspose", dict(filters=6, kernel_size=3, strides=2)),
            ("GroupNormalization", dict(groups=2)),
            ("Activation", dict(activation="relu")),
        ],
    ),
}
GENERATIONS = ("keras3", "tf_keras")
SUFFIXES = (".keras", ".h5")
#: batch sizes of the inputs each model is run on
BATCHES = (1, 3)


def _build(keras, shape, layers):
    model = keras.Sequential([keras.Input(shape)] + [getattr(keras.layers, cls)(**kw) for cls, kw in layers])
    import numpy as np

    rng = np.random.default_rng(len(layers) * 7 + len(shape))
    weights = []
    for layer in model.layers:
        for w in layer.weights:
            value = rng.standard_normal(w.shape).astype(np.float32) * 0.5
            if "variance" in w.name:
                value = np.abs(value) + 0.5
            weights.append(value)
    model.set_weights(weights)
    return model


def main(outdir: str) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import numpy as np
    import tf_keras

    out = pathlib.Path(outdir)
    for generation, module in (("keras3", keras), ("tf_keras", tf_keras)):
        (out / generation).mkdir(parents=True, exist_ok=True)
        for key, (shape, layers) in MODELS.items():
            model = _build(module, shape, layers)
            for suffix in SUFFIXES:
                model.save(out / generation / f"{key}{suffix}")
            rng = np.random.default_rng(3)
            data = {}
            for batch in BATCHES:
                x = rng.standard_normal((batch,) + shape).astype(np.float32)
                data[f"x{batch}"], data[f"y{batch}"] = x, np.asarray(model.predict(x, verbose=0))
            np.savez(out / generation / f"{key}.npz", **data)
    manifest = {"keras": keras.__version__, "tf_keras": tf_keras.__version__, "models": list(MODELS)}
    (out / "manifest.json").write_text(json.dumps(manifest))


if __name__ == "__main__":
    main(sys.argv[1])
