"""The Keras models the serving tests serve, built and saved in a process of their own.

TensorFlow and PoCL cannot share a process, so the tests never import tensorflow or keras; this
script does the Keras work:

    python3 tests/serve/keras_models.py OUTDIR

writes, for each model of :data:`MODELS`, ``OUTDIR/<key>.keras`` and ``OUTDIR/<key>.npz``: the
inputs ``x:<input name>`` (:data:`SAMPLES` samples each, in the model's input order) and Keras's
outputs ``y:<output name>`` on them; ``OUTDIR/manifest.json`` (written last) lists the input and
output names of each model in order.

* ``mlp``: a Sequential 20 -> Dense 32 relu -> Dense 10 softmax; ``mlp_v2``: the same with other
  weights, on the same inputs (the new version of the version-switch test);
* ``cnn``: Conv2D, BatchNormalization, ReLU6, MaxPooling2D, DepthwiseConv2D, GlobalAveragePooling2D,
  Dense, on 12 x 12 x 3 images;
* ``two_io``: a Functional of an ``image`` input (6 x 6 x 1, float32) and a ``meta`` input (4
  integers, int32), with the outputs ``label`` (softmax of 3) and ``score`` (sigmoid) given as a dict.
"""

from __future__ import annotations

import json
import os
import sys

MODELS = ("mlp", "mlp_v2", "cnn", "two_io")
SAMPLES = 16


def build(keras, key: str):
    layers = keras.layers
    if key in ("mlp", "mlp_v2"):
        keras.utils.set_random_seed(1 if key == "mlp" else 2)
        return keras.Sequential(
            [
                keras.Input((20,)),
                layers.Dense(32, activation="relu", name="hidden"),
                layers.Dense(10, activation="softmax", name="probs"),
            ],
            name=key,
        )
    if key == "cnn":
        keras.utils.set_random_seed(3)
        x = inputs = keras.Input((12, 12, 3), name="pixels")
        x = layers.Conv2D(8, 3, padding="same", name="conv")(x)
        x = layers.BatchNormalization(name="bn")(x)
        x = layers.ReLU(6.0, name="relu6")(x)
        x = layers.MaxPooling2D(2, name="pool")(x)
        x = layers.DepthwiseConv2D(3, name="depthwise")(x)
        x = layers.GlobalAveragePooling2D(name="gap")(x)
        outputs = layers.Dense(5, activation="softmax", name="classes")(x)
        model = keras.Model(inputs, outputs, name="cnn")
        bn = model.get_layer("bn")
        rng = __import__("numpy").random.default_rng(3)
        bn.set_weights(
            [rng.uniform(0.5, 1.5, 8), rng.uniform(-0.2, 0.2, 8), rng.uniform(-0.2, 0.2, 8), rng.uniform(0.5, 1.5, 8)]
        )
        return model
    keras.utils.set_random_seed(4)
    image = keras.Input((6, 6, 1), name="image")
    meta = keras.Input((4,), name="meta", dtype="int32")
    h = layers.Flatten(name="flat")(image)
    h = layers.Concatenate(name="joined")([h, meta])
    h = layers.Dense(12, activation="tanh", name="mixed")(h)
    return keras.Model(
        {"image": image, "meta": meta},
        {
            "label": layers.Dense(3, activation="softmax", name="label")(h),
            "score": layers.Dense(1, activation="sigmoid", name="score")(h),
        },
        name="two_io",
    )


def inputs_of(np, key: str, rng) -> dict:
    if key in ("mlp", "mlp_v2"):
        return {"input": rng.standard_normal((SAMPLES, 20)).astype(np.float32)}
    if key == "cnn":
        return {"pixels": rng.uniform(-1, 1, (SAMPLES, 12, 12, 3)).astype(np.float32)}
    return {
        "image": rng.uniform(-1, 1, (SAMPLES, 6, 6, 1)).astype(np.float32),
        "meta": rng.integers(-5, 6, (SAMPLES, 4)).astype(np.float32),
    }


def main(folder: str) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import keras
    import numpy as np

    os.makedirs(folder, exist_ok=True)
    manifest = {}
    for key in MODELS:
        model = build(keras, key)
        model.save(os.path.join(folder, f"{key}.keras"))
        seed = 10 + MODELS.index("mlp" if key == "mlp_v2" else key)  # the two versions answer the same inputs
        x = inputs_of(np, key, np.random.default_rng(seed))
        y = model.predict(x if key == "two_io" else next(iter(x.values())), verbose=0)
        outputs = y if isinstance(y, dict) else {model.layers[-1].name: y}
        np.savez(
            os.path.join(folder, f"{key}.npz"),
            **{f"x:{k}": v for k, v in x.items()},
            **{f"y:{k}": np.asarray(v, np.float32) for k, v in outputs.items()},
        )
        manifest[key] = {"inputs": list(x), "outputs": sorted(outputs)}
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump(manifest, f)


if __name__ == "__main__":
    main(sys.argv[1])
