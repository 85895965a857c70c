"""Keras models of the 3-D layers (Conv3D, Conv3DTranspose, MaxPooling3D, AveragePooling3D,
GlobalMaxPooling3D, GlobalAveragePooling3D, UpSampling3D, ZeroPadding3D, Cropping3D), built and saved
in a process of their own (TensorFlow and PoCL cannot share one: tests/keras_zoo.py says why):

    python3 tests/layers/volumetric_zoo.py OUTDIR

For each model of :data:`MODELS` and :data:`GRAPHS`, with Keras 3 and with tf_keras: random weights
(biases and normalization statistics too), the model saved as ``<generation>/<key>.keras`` and ``.h5``, and
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
    "video_classifier": (
        (5, 9, 8, 3),
        [
            ("Conv3D", dict(filters=8, kernel_size=3, padding="same", activation="relu")),
            ("MaxPooling3D", dict(pool_size=2, padding="same")),
            ("Conv3DTranspose", dict(filters=4, kernel_size=3, strides=2, padding="same", activation="tanh")),
            ("GlobalAveragePooling3D", {}),
            ("Dense", dict(units=5, activation="softmax")),
        ],
    ),
    "one_voxel": (
        (1, 1, 1, 1),
        [
            ("Conv3D", dict(filters=1, kernel_size=3, padding="same")),
            ("Conv3DTranspose", dict(filters=1, kernel_size=1)),
            ("MaxPooling3D", dict(pool_size=1)),
            ("GlobalMaxPooling3D", dict(keepdims=True)),
        ],
    ),
    "conv3d_strides_dilation_groups": (
        (13, 3, 5, 2),
        [
            ("Conv3D", dict(filters=4, kernel_size=(3, 2, 2), strides=(2, 1, 2), padding="same", activation="elu")),
            ("BatchNormalization", {}),  # after an activation: the convolution's epilogue
            ("Conv3D", dict(filters=4, kernel_size=2, dilation_rate=(2, 1, 1), padding="same", activation="sigmoid")),
            ("Conv3D", dict(filters=6, kernel_size=(1, 2, 3), groups=2, padding="same", activation="relu")),
            ("Conv3D", dict(filters=2, kernel_size=(1, 2, 2), padding="valid", use_bias=False, activation="swish")),
        ],
    ),
    "conv3dt_output_padding": (
        (3, 2, 4, 3),
        [
            ("Conv3DTranspose", dict(filters=2, kernel_size=(2, 3, 2), strides=(3, 2, 2), output_padding=(2, 1, 1))),
            ("BatchNormalization", {}),  # after a linear layer: folded into its kernel and bias
            ("Conv3DTranspose", dict(filters=3, kernel_size=3, strides=(1, 2, 1), padding="same", use_bias=False)),
        ],
    ),
    "pooling_padding_cropping": (
        (13, 3, 4, 2),
        [
            ("AveragePooling3D", dict(pool_size=(3, 2, 2), strides=(2, 1, 3), padding="same")),
            ("ZeroPadding3D", dict(padding=((1, 2), (0, 1), (2, 0)))),
            ("MaxPooling3D", dict(pool_size=(2, 1, 2), strides=1)),
            ("UpSampling3D", dict(size=(1, 3, 2))),
            ("Cropping3D", dict(cropping=((2, 0), (1, 1), (1, 0)))),
            ("GlobalAveragePooling3D", dict(keepdims=True)),
        ],
    ),
}
#: graphs built by a function of this module (``_unet``): key -> input shape without the batch
GRAPHS = {"unet_block": (4, 6, 5, 2)}
GENERATIONS = ("keras3", "tf_keras")
SUFFIXES = (".keras", ".h5")
#: batch sizes of the inputs each model is run on
BATCHES = (1, 3)


def _unet(keras, shape):
    """A 3-D U-Net block: an encoder step (convolution, pooling), the bottleneck, the decoder's
    upsampling padded and cropped back to the skip connection's size, concatenated with it."""
    layers = keras.layers
    x = keras.Input(shape)
    skip = layers.Conv3D(4, 3, padding="same", activation="relu")(x)
    down = layers.MaxPooling3D(2, padding="same")(skip)
    bottom = layers.Conv3D(6, 3, padding="same", activation="relu")(down)
    up = layers.UpSampling3D(2)(bottom)  # (4, 6, 6): one column past the skip's width 5
    up = layers.ZeroPadding3D(((1, 0), (0, 1), (0, 0)))(up)
    up = layers.Cropping3D(((1, 0), (0, 1), (0, 1)))(up)
    merged = layers.Concatenate()([up, skip])
    out = layers.Conv3DTranspose(3, 2, strides=1, padding="same", activation="relu")(merged)
    out = layers.Conv3D(2, 1, activation="sigmoid")(out)
    return keras.Model(x, out)


def _random_weights(model, seed: int) -> None:
    import numpy as np

    rng = np.random.default_rng(seed)
    values = [rng.standard_normal(w.shape).astype(np.float32) * 0.5 for w in model.weights]
    model.set_weights([np.abs(v) + 0.5 if "variance" in w.name else v for v, w in zip(values, model.weights)])


def _build(keras, key):
    if key in GRAPHS:
        model = _unet(keras, GRAPHS[key])
    else:
        shape, layers = MODELS[key]
        model = keras.Sequential([keras.Input(shape)] + [getattr(keras.layers, cls)(**kw) for cls, kw in layers])
    _random_weights(model, len(key))
    return model


def main(outdir: str) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import numpy as np
    import tf_keras

    out = pathlib.Path(outdir)
    for generation, module in (("keras3", keras), ("tf_keras", tf_keras)):
        (out / generation).mkdir(parents=True, exist_ok=True)
        for key in list(MODELS) + list(GRAPHS):
            model = _build(module, key)
            for suffix in SUFFIXES:
                model.save(out / generation / f"{key}{suffix}")
            shape = GRAPHS[key] if key in GRAPHS else MODELS[key][0]
            rng = np.random.default_rng(3)
            data = {}
            for batch in BATCHES:
                x = rng.standard_normal((batch,) + tuple(shape)).astype(np.float32)
                data[f"x{batch}"], data[f"y{batch}"] = x, np.asarray(model.predict(x, verbose=0))
            np.savez(out / generation / f"{key}.npz", **data)
    manifest = {"keras": keras.__version__, "tf_keras": tf_keras.__version__, "models": list(MODELS) + list(GRAPHS)}
    (out / "manifest.json").write_text(json.dumps(manifest))


if __name__ == "__main__":
    main(sys.argv[1])
