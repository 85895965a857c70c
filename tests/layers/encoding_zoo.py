"""Keras models of the tabular preprocessing layers (CategoryEncoding, IntegerLookup) and of the
bicubic and area resizes, built and saved in a process of their own (TensorFlow and PoCL cannot
share one: tests/keras_zoo.py says why):

    python3 tests/layers/encoding_zoo.py OUTDIR

For each model of :data:`MODELS` and each Keras generation it names: the model saved as
``<generation>/<key>.keras`` and ``.h5`` (those of :data:`SUFFIXES` it lists), and
``<generation>/<key>.npz`` holding, per batch of :data:`BATCHES`, the inputs ``x<batch>_<i>`` and
Keras's predict ``y<batch>``. ``manifest.json`` is written last. The module level is plain data:
the tests import it.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

GENERATIONS = ("keras3", "tf_keras")
SUFFIXES = (".keras", ".h5")
BATCHES = (1, 3)
BOTH = GENERATIONS
KERAS3 = ("keras3",)

VOCABULARY = [12, 36, 1138, 42, 7, -5]
#: tokens of the inputs beside the vocabulary's: out of vocabulary (negative too) and the mask, 0
OUT_OF_VOCABULARY = [0, 5, -7, 1139, 100000]
#: 1000 distinct ids spread over [-10^6, 10^6], a vocabulary of 1000
THOUSAND = [((i * 7919) % 2000003) - 1000001 for i in range(1, 1001)]

#: key -> {"generations", "suffixes" (default both), "inputs": [(shape, dtype, tokens)], "layers":
#: [(class, kwargs)] for a Sequential, or "graph": a Functional model's name (:func:`_graph`)}.
#: ``tokens``: the values to draw from (a list or a range), or "normal".
MODELS = {
    "ce_one_hot_column": {
        "generations": BOTH,
        "inputs": [((1,), "int64", range(0, 5))],
        "layers": [("CategoryEncoding", dict(num_tokens=5, output_mode="one_hot"))],
    },
    "ce_one_hot_each": {  # tf_keras encodes no more than rank 2 outputs
        "generations": KERAS3,
        "inputs": [((3,), "int64", range(0, 4))],
        "layers": [("CategoryEncoding", dict(num_tokens=4, output_mode="one_hot"))],
    },
    "ce_multi_hot": {
        "generations": BOTH,
        "inputs": [((13,), "int64", range(0, 7))],
        "layers": [("CategoryEncoding", dict(num_tokens=7, output_mode="multi_hot"))],
    },
    "ce_count_1001": {
        "generations": BOTH,
        "inputs": [((3,), "int64", range(0, 1001))],
        "layers": [("CategoryEncoding", dict(num_tokens=1001, output_mode="count"))],
    },
    "ce_one_token": {
        "generations": BOTH,
        "inputs": [((1,), "int64", range(0, 1))],
        "layers": [("CategoryEncoding", dict(num_tokens=1, output_mode="count"))],
    },
    "ce_outside_keras3": {  # Keras 3 computes these: a one-hot of any index outside is zeros
        "generations": KERAS3,
        "inputs": [((3,), "int64", range(-3, 9))],
        "layers": [("CategoryEncoding", dict(num_tokens=4, output_mode="one_hot"))],
    },
    "ce_beyond_keras3": {  # Keras 3 leaves out an index >= num_tokens from multi-hot and count
        "generations": KERAS3,
        "inputs": [((5,), "int64", range(0, 9))],
        "layers": [("CategoryEncoding", dict(num_tokens=4, output_mode="count"))],
    },
    "lookup_int": {
        "generations": BOTH,
        "inputs": [((3,), "int64", VOCABULARY + OUT_OF_VOCABULARY)],
        "layers": [("IntegerLookup", dict(vocabulary=VOCABULARY))],
    },
    "lookup_int_mask_oov3": {
        "generations": BOTH,
        "inputs": [((5,), "int64", VOCABULARY + OUT_OF_VOCABULARY)],
        "layers": [("IntegerLookup", dict(vocabulary=VOCABULARY, mask_token=0, num_oov_indices=3))],
    },
    "lookup_no_oov": {
        "generations": BOTH,
        "inputs": [((3,), "int64", VOCABULARY)],
        "layers": [("IntegerLookup", dict(vocabulary=VOCABULARY, num_oov_indices=0))],
    },
    "lookup_one_hot": {
        "generations": BOTH,
        "inputs": [((1,), "int64", VOCABULARY + OUT_OF_VOCABULARY)],
        "layers": [("IntegerLookup", dict(vocabulary=VOCABULARY, output_mode="one_hot", mask_token=0))],
    },
    "lookup_multi_hot_mask": {
        "generations": BOTH,
        "inputs": [((5,), "int64", VOCABULARY + OUT_OF_VOCABULARY)],
        "layers": [
            ("IntegerLookup", dict(vocabulary=VOCABULARY, output_mode="multi_hot", mask_token=0, num_oov_indices=2))
        ],
    },
    "lookup_count_padded": {
        "generations": BOTH,
        "inputs": [((4,), "int64", VOCABULARY + OUT_OF_VOCABULARY)],
        "layers": [
            ("IntegerLookup", dict(vocabulary=VOCABULARY, output_mode="count", max_tokens=12, pad_to_max_tokens=True))
        ],
    },
    "lookup_vocabulary_of_one": {
        "generations": BOTH,
        "inputs": [((1,), "int64", [7, 8, -1])],
        "layers": [("IntegerLookup", dict(vocabulary=[7], output_mode="one_hot"))],
    },
    "lookup_vocabulary_of_1000": {
        "generations": BOTH,
        "inputs": [((13,), "int64", THOUSAND[::7] + [3, -2, 999999])],
        "layers": [("IntegerLookup", dict(vocabulary=THOUSAND, num_oov_indices=2))],
    },
    "lookup_adapted": {  # the vocabulary in the .keras file's assets, mask and OOV tokens first
        "generations": BOTH,
        "suffixes": (".keras",),
        "inputs": [((3,), "int64", VOCABULARY + OUT_OF_VOCABULARY)],
        "layers": [("IntegerLookup", dict(mask_token=0, num_oov_indices=2))],
        "adapt": VOCABULARY + VOCABULARY[:3] + [42],
    },
    "lookup_tf_idf": {  # the OOV index weighted by the mean idf (the vocabulary given without it)
        "generations": BOTH,
        "inputs": [((5,), "int64", VOCABULARY + OUT_OF_VOCABULARY)],
        "layers": [
            (
                "IntegerLookup",
                dict(vocabulary=VOCABULARY, idf_weights=[0.5, 1.25, 2.0, 0.75, 3.0, 1.5], output_mode="tf_idf"),
            )
        ],
    },
    "lookup_tf_idf_special_padded": {  # weights of the special tokens given; zeros up to max_tokens
        "generations": BOTH,
        "inputs": [((4,), "int64", VOCABULARY + OUT_OF_VOCABULARY)],
        "layers": [
            (
                "IntegerLookup",
                dict(
                    vocabulary=[-1, -1] + VOCABULARY,
                    idf_weights=[0.25, 0.5] + [1.0, 2.0, 3.0, 0.5, 1.5, 2.5],
                    num_oov_indices=2,
                    mask_token=0,
                    output_mode="tf_idf",
                    max_tokens=11,
                    pad_to_max_tokens=True,
                ),
            )
        ],
    },
    "lookup_tf_idf_adapted": {  # the vocabulary in the assets, the idf weights in the weights file
        "generations": BOTH,
        "suffixes": (".keras",),
        "inputs": [((3,), "int64", VOCABULARY + OUT_OF_VOCABULARY)],
        "layers": [("IntegerLookup", dict(output_mode="tf_idf"))],
        "adapt": [12, 36, 36, 7, 42, 12, 1138, -5, 7, 12],
    },
    "tabular": {
        "generations": BOTH,
        "inputs": [
            ((1,), "int64", VOCABULARY + OUT_OF_VOCABULARY),
            ((2,), "int64", range(0, 6)),
            ((3,), "float32", "normal"),
        ],
        "graph": "tabular",
    },
    "resizing_bicubic_up": {
        "generations": BOTH,
        "inputs": [((3, 2, 2), "float32", "normal")],
        "layers": [("Resizing", dict(height=7, width=5, interpolation="bicubic"))],
    },
    "resizing_bicubic_down": {
        "generations": BOTH,
        "inputs": [((7, 5, 3), "float32", "normal")],
        "layers": [("Resizing", dict(height=3, width=4, interpolation="bicubic"))],
    },
    "resizing_bicubic_one_pixel": {
        "generations": BOTH,
        "inputs": [((1, 1, 1), "float32", "normal")],
        "layers": [("Resizing", dict(height=3, width=2, interpolation="bicubic"))],
    },
    "resizing_area": {
        "generations": BOTH,
        "inputs": [((13, 11, 2), "float32", "normal")],
        "layers": [("Resizing", dict(height=4, width=3, interpolation="area"))],
    },
    "resizing_area_up": {
        "generations": BOTH,
        "inputs": [((3, 2, 2), "float32", "normal")],
        "layers": [("Resizing", dict(height=7, width=5, interpolation="area"))],
    },
    "upsampling_bicubic": {
        "generations": BOTH,
        "inputs": [((5, 3, 2), "float32", "normal")],
        "layers": [("UpSampling2D", dict(size=(2, 3), interpolation="bicubic"))],
    },
    "upsampling_area": {  # Keras 3's UpSampling2D does not offer "area"
        "generations": ("tf_keras",),
        "inputs": [((3, 4, 2), "float32", "normal")],
        "layers": [("UpSampling2D", dict(size=2, interpolation="area"))],
    },
}

#: files Keras writes that malinn refuses, in ``keras3/``: an adapted lookup in Keras 3's .h5 (which
#: loses its vocabulary) and a StringLookup (string tokens)
REFUSED = ("lookup_adapted_lost.h5", "string_lookup.keras")


def sample(rng, shape: tuple, dtype: str, tokens, batch: int):
    """A batch of inputs of one sample ``shape`` drawn from ``tokens`` (see :data:`MODELS`)."""
    import numpy as np

    if tokens == "normal":
        return rng.standard_normal((batch,) + tuple(shape)).astype(dtype)
    return rng.choice(np.asarray(list(tokens)), (batch,) + tuple(shape)).astype(dtype)


def _graph(keras, name: str):
    """The tabular model: a category looked up and one-hot encoded, codes counted, beside numbers,
    concatenated into two Dense layers (keras.io's structured-data classification, smaller)."""
    assert name == "tabular"
    category = keras.Input((1,), dtype="int64", name="category")
    codes = keras.Input((2,), dtype="int64", name="codes")
    numbers = keras.Input((3,), dtype="float32", name="numbers")
    looked_up = keras.layers.IntegerLookup(vocabulary=VOCABULARY, output_mode="one_hot")(category)
    counted = keras.layers.CategoryEncoding(num_tokens=6, output_mode="count")(codes)
    joined = keras.layers.Concatenate()([looked_up, counted, numbers])
    hidden = keras.layers.Dense(5, activation="relu")(joined)
    return keras.Model([category, codes, numbers], keras.layers.Dense(1, activation="sigmoid")(hidden))


def _build(keras, spec: dict):
    import numpy as np

    if "graph" in spec:
        model = _graph(keras, spec["graph"])
    else:
        (shape, dtype, _), *_ = spec["inputs"]
        layers = [getattr(keras.layers, cls)(**kw) for cls, kw in spec["layers"]]
        if "adapt" in spec:
            layers[0].adapt(np.asarray(spec["adapt"], np.int64))
        model = keras.Sequential([keras.Input(shape, dtype=dtype)] + layers)
    rng = np.random.default_rng(5)
    for layer in model.layers:
        if type(layer).__name__ == "Dense":
            layer.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.5 for w in layer.get_weights()])
    return model


def main(outdir: str) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import numpy as np
    import tf_keras

    out = pathlib.Path(outdir)
    for generation, module in (("keras3", keras), ("tf_keras", tf_keras)):
        (out / generation).mkdir(parents=True, exist_ok=True)
        for key, spec in MODELS.items():
            if generation not in spec["generations"]:
                continue
            model = _build(module, spec)
            for suffix in spec.get("suffixes", SUFFIXES):
                model.save(out / generation / f"{key}{suffix}")
            rng = np.random.default_rng(3)
            data = {}
            for batch in BATCHES:
                xs = [sample(rng, shape, dtype, tokens, batch) for shape, dtype, tokens in spec["inputs"]]
                for i, x in enumerate(xs):
                    data[f"x{batch}_{i}"] = x
                data[f"y{batch}"] = np.asarray(model.predict(xs if len(xs) > 1 else xs[0], verbose=0))
            np.savez(out / generation / f"{key}.npz", **data)
            if generation == "keras3" and key == "lookup_adapted":
                model.save(out / generation / "lookup_adapted_lost.h5")
    strings = keras.Sequential([keras.Input((2,), dtype="string"), keras.layers.StringLookup(vocabulary=["a", "b"])])
    strings.save(out / "keras3" / "string_lookup.keras")
    manifest = {"keras": keras.__version__, "tf_keras": tf_keras.__version__, "models": list(MODELS)}
    (out / "manifest.json").write_text(json.dumps(manifest))


if __name__ == "__main__":
    main(sys.argv[1])
