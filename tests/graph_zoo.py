"""Keras Functional graphs (merges, shared layers, nested models, several inputs and outputs) for
the graph equivalence tests, built and saved in a process of their own:

    python3 tests/graph_zoo.py OUTDIR

TensorFlow and PoCL cannot share a process, so the tests never import tensorflow/keras/tf_keras;
this script does the Keras work. For Keras 3 and tf_keras (Keras 2) it builds every model of
:data:`MODELS`, saves it as ``<generation>/<key>.keras`` and ``.h5``, and writes
``<generation>/<key>.npz`` with, for each input range ``r`` (``unit``: uniform in [-1, 1];
``large``: uniform in [-1000, 1000]), the inputs ``r:x<i>`` (100 samples each) and Keras's outputs
``r:y<j>`` (in the order of the output dict's keys where Keras returns one, named in the manifest;
the inputs in the order of ``model.inputs``, with their dict keys in the manifest where Keras takes a dict).
``manifest.json`` lists what was built (a model a generation cannot express is left
out, with the reason). The module level is plain data so tests can import it to parametrize.
"""

from __future__ import annotations

import json
import os
import re
import sys

GENERATIONS = {"keras3": "keras", "tf_keras": "tf_keras"}
#: format id -> (generation, suffix), as in tests/keras_zoo.py
FORMATS = {
    "keras3-zip": ("keras3", ".keras"),
    "keras3-h5": ("keras3", ".h5"),
    "keras2-h5": ("tf_keras", ".h5"),
    "tf_keras-zip": ("tf_keras", ".keras"),
}
ELEMENTWISE = ["Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum"]
#: sample shapes of the ranks the merges are tried on
SHAPES = {2: (6,), 3: (3, 6), 4: (2, 3, 4)}
CONCAT_AXES = {2: [-1, 1], 3: [1, 2, -1], 4: [1, 2, 3]}
#: (key, sample shape of x, of y, Keras axes, normalize)
DOTS = [
    ("dot_r2", (6,), (6,), 1, False),
    ("dot_r2_norm", (6,), (6,), 1, True),
    ("dot_r3_22", (3, 6), (4, 6), (2, 2), False),
    ("dot_r3_11", (3, 6), (3, 5), (1, 1), False),
    ("dot_r3_12", (3, 6), (5, 3), (1, 2), False),
    ("dot_r3_norm", (3, 6), (4, 6), (2, 2), True),
    ("dot_r3_r2", (3, 6), (6,), (2, 1), False),
    ("dot_neg", (3, 6), (4, 6), -1, False),
]
#: models only Keras 3 builds (inputs and outputs given as dicts, an operator on tensors)
KERAS3_ONLY = {"dict_io", "dict_keys", "augmented_keras3", "training_true"}
#: models only tf_keras builds
TF_KERAS_ONLY = {"training_true_tf_keras"}
#: graphs malinn must refuse, each with the layers its one ConversionError must name
ERROR_MODELS = {
    "unsupported_graph": ["RNN 'rnn'", "Dot 'dot4'", "ConvLSTM1D 'convlstm' with activation 'softmax'"],
    "random_crop": ["RandomCrop 'crop' (tf_keras crops and resizes at inference"],
    # layers called with training=True: tf_keras's predict runs their training behaviour
    # (Keras 3's passes training=False over it: "training_true" matches Keras there)
    "training_true_tf_keras": [
        "RandomFlip 'flip' called with training=True",
        "Dropout 'mc_drop' called with training=True",
        "BatchNormalization 'bn' called with training=True",
    ],
}
#: Keras's random augmentation layers with the arguments they need: the "augmented" models run each
#: one the installed Keras has (Keras 3 lacks RandomHeight / RandomWidth, tf_keras the colour ones);
#: "augmented_keras3" those Keras 3 cannot write to .h5 (their configs hold a module: Keras raises),
#: saved as .keras alone
AUGMENTATION_ARGS = {
    "RandomFlip": {},
    "RandomRotation": {"factor": 0.2},
    "RandomZoom": {"height_factor": 0.2},
    "RandomTranslation": {"height_factor": 0.2, "width_factor": 0.2},
    "RandomContrast": {"factor": 0.3},
    "RandomBrightness": {"factor": 0.3},
    "RandomHeight": {"factor": 0.3},
    "RandomWidth": {"factor": 0.3},
    "RandomColorDegeneration": {"factor": 0.3},
    "RandomColorJitter": {},
    "RandomElasticTransform": {},
    "RandomErasing": {},
    "RandomGaussianBlur": {},
    "RandomGrayscale": {},
    "RandomHue": {"factor": 0.3},
    "RandomInvert": {},
    "RandomPerspective": {},
    "RandomPosterization": {"factor": 4},
    "RandomSaturation": {"factor": 0.3},
    "RandomSharpness": {"factor": 0.3},
    "RandomShear": {},
    "AugMix": {},
    "CutMix": {},
    "MixUp": {},
    "RandAugment": {},
    "Solarization": {},
}
NO_H5 = {
    "RandomBrightness",
    "RandomColorDegeneration",
    "RandomPosterization",
    "RandomSaturation",
    "RandomSharpness",
    "Solarization",
}
#: models Keras 3 saves as .keras only
KERAS3_ZIP_ONLY = {"augmented_keras3"}
BATCH_SIZES = [1, 7, 100]
RANGES = {"unit": 1.0, "large": 1000.0}


def model_keys() -> list:
    keys = [f"{op.lower()}_r{rank}" for op in ELEMENTWISE for rank in SHAPES]
    keys += [f"{op.lower()}_three" for op in ELEMENTWISE if op != "Subtract"]
    keys += ["add_broadcast", "multiply_rank_broadcast", "subtract_broadcast_first"]
    keys += [f"concat_r{rank}_axis{axis}" for rank, axes in CONCAT_AXES.items() for axis in axes]
    keys += ["concat_three_mixed"]
    keys += [key for key, *_ in DOTS]
    keys += [
        "residual",
        "shared_two_outputs",
        "nested_shared",
        "nested_functional",
        "diamond",
        "dict_io",
        "nested_functional_twice",
        "nested_sequential_twice",
        "input_as_output",
        "inputs_only",
        "dict_keys",
        "augmented",
        "augmented_keras3",
        "training_true",
    ]
    return keys + list(ERROR_MODELS)


def build(K, key):
    """The model for ``key`` (Keras module ``K``)."""
    L = K.layers
    if re.fullmatch(r"[a-z]+_r\d", key) and key.split("_r")[0].capitalize() in ELEMENTWISE:
        op, rank = key.split("_r")
        shape = SHAPES[int(rank)]
        x, y = K.Input(shape, name="x"), K.Input(shape, name="y")
        a = L.Dense(shape[-1], name="d")(x)  # one operand from a kernel, one straight from the input
        return K.Model([x, y], getattr(L, op.capitalize())(name="merge")([a, y]), name=key)
    if key.endswith("_three"):
        op = key[:-6].capitalize()
        ins = [K.Input((5,), name=n) for n in "xyz"]
        h = L.Dense(5, activation="tanh", name="d")(ins[1])
        return K.Model(ins, getattr(L, op)(name="merge")([ins[0], h, ins[2]]), name=key)
    if key == "add_broadcast":
        x, y = K.Input((3, 6), name="x"), K.Input((1, 6), name="y")
        return K.Model([x, y], L.Add(name="merge")([L.Dense(6, name="d")(x), y]), name=key)
    if key == "multiply_rank_broadcast":
        x, y = K.Input((3, 6), name="x"), K.Input((6,), name="y")
        return K.Model([x, y], L.Multiply(name="merge")([x, y]), name=key)
    if key == "subtract_broadcast_first":
        x, y = K.Input((1, 6), name="x"), K.Input((3, 6), name="y")
        return K.Model([x, y], L.Subtract(name="merge")([x, L.Dense(6, name="d")(y)]), name=key)
    if key.startswith("concat_r"):
        rank, axis = key[len("concat_r") :].split("_axis")
        shape = SHAPES[int(rank)]
        axis = int(axis)
        other = list(shape)
        other[axis - 1 if axis > 0 else -1] += 2
        x, y = K.Input(shape, name="x"), K.Input(tuple(other), name="y")
        a = L.Dense(shape[-1], activation="relu", name="d")(x)
        out = L.Concatenate(axis=axis, name="merge")([a, y])
        return K.Model([x, y], L.Dense(3, name="head")(out), name=key)
    if key == "concat_three_mixed":
        x = K.Input((4,), name="x")
        t = K.Input((3,), name="t")
        parts = [L.Dense(2, name="d1")(x), t, L.Dense(5, activation="sigmoid", name="d2")(x)]
        return K.Model(
            [x, t], L.Dense(2, activation="softmax", name="head")(L.Concatenate(name="merge")(parts)), name=key
        )
    for name, sx, sy, axes, normalize in DOTS:
        if key == name:
            x, y = K.Input(sx, name="x"), K.Input(sy, name="y")
            a = L.Dense(sx[-1], name="d")(x)
            return K.Model([x, y], L.Dot(axes=axes, normalize=normalize, name="merge")([a, y]), name=key)
    if key == "residual":
        x = K.Input((8,), name="x")
        h = L.Dense(16, activation="relu", name="d1")(x)
        h = L.Add(name="res1")([x, L.Dense(8, name="d2")(h)])
        h = L.Activation("relu", name="act")(h)
        g = L.Dense(8, activation="tanh", name="d3")(h)
        h = L.Add(name="res2")([h, g])
        return K.Model(x, L.Dense(3, activation="softmax", name="head")(L.Dropout(0.1, name="drop")(h)), name=key)
    if key == "shared_two_outputs":
        x, y = K.Input((6,), name="x"), K.Input((6,), name="y")
        shared = L.Dense(4, activation="relu", name="shared")
        a, b = shared(x), shared(y)
        c = L.Concatenate(name="cat")([a, b])
        return K.Model([x, y], [L.Dense(2, name="o1")(c), L.Subtract(name="o2")([a, b])], name=key)
    if key == "nested_shared":
        inner = K.Sequential(
            [K.Input((4,)), L.Dense(3, activation="relu", name="inner_a"), L.Dense(3, name="inner_b")], name="seq_sub"
        )
        x, y = K.Input((4,), name="x"), K.Input((4,), name="y")
        return K.Model([x, y], L.Maximum(name="max")([inner(x), inner(y)]), name=key)
    if key == "nested_functional":
        ix = K.Input((5,), name="ix")
        ih = L.Dense(4, activation="relu", name="in_d")(ix)
        inner = K.Model(ix, L.Add(name="in_add")([ih, L.Dense(4, name="in_skip")(ix)]), name="func_sub")
        x = K.Input((5,), name="x")
        h = inner(x)
        return K.Model(x, L.Dense(2, name="head")(h), name=key)
    if key in ("nested_functional_twice", "nested_sequential_twice"):
        # a nested model called twice in a chain, its first output both a model output and read by a
        # layer: Keras 3 numbers its calls from 0 in the calls and from 1 in output_layers (a
        # Functional; 0 for a Sequential), tf_keras from 1 in both
        if key == "nested_sequential_twice":
            inner = K.Sequential([K.Input((6,)), L.Dense(6, activation="tanh", name="in_d")], name="seq_in")
        else:
            ix = K.Input((6,), name="ix")
            inner = K.Model(ix, L.Dense(6, activation="tanh", name="in_d")(ix), name="func_in")
        x = K.Input((6,), name="x")
        h = inner(x)
        return K.Model(x, [h, L.Dense(2, name="head")(h), inner(h)], name=key)
    if key == "diamond":
        x = K.Input((2, 5), name="x")
        a = L.Dense(5, activation="relu", name="a")(x)
        b = L.Dense(5, activation="sigmoid", name="b")(x)
        m = L.Multiply(name="mul")([a, b])
        s = L.Average(name="avg")([m, x, a])
        return K.Model(x, L.Flatten(name="flat")(L.Concatenate(axis=1, name="cat")([s, b])), name=key)
    if key == "dict_io":
        if not K.__name__.startswith("keras"):
            raise ValueError("tf_keras keeps no names of a dict of outputs")
        a, b = K.Input((4,), name="a"), K.Input((4,), name="b")
        h = L.Dense(4, name="d")(a)
        return K.Model({"a": a, "b": b}, {"sum": h + b, "prod": L.Multiply(name="mul")([h, b])}, name=key)
    if key == "input_as_output":  # inputs returned as they are, beside a layer's output
        x, y = K.Input((4,), name="x"), K.Input((4,), name="y")
        return K.Model([x, y], [x, L.Dense(2, name="d")(y), y], name=key)
    if key == "inputs_only":  # no layer computes anything: the outputs are the inputs
        x, y = K.Input((4,), name="x"), K.Input((3,), name="y")
        return K.Model([x, y], [L.Dropout(0.5, name="drop")(y), x], name=key)
    if key == "dict_keys":  # inputs given as a dict whose keys are not the inputs' names
        a, b = K.Input((4,), name="a_in"), K.Input((3,), name="b_in")
        h = L.Concatenate(name="cat")([L.Dense(2, name="d")(a), b])
        return K.Model({"beta": b, "alpha": a}, L.Dense(2, name="head")(h), name=key)
    if key in ("augmented", "augmented_keras3"):
        # keras.io's "image classification from scratch": random augmentation in a nested Sequential
        # (each layer returns its input at inference), then Rescaling, a convolution and a residual
        names = [name for name in AUGMENTATION_ARGS if hasattr(L, name) and (name in NO_H5) == (key != "augmented")]
        aug = K.Sequential(
            [K.Input((9, 9, 3))] + [getattr(L, name)(**AUGMENTATION_ARGS[name], name=name.lower()) for name in names],
            name="augmentation",
        )
        x = K.Input((9, 9, 3), name="x")
        h = L.Rescaling(1 / 255.0, name="rescale")(aug(x))
        h = L.Conv2D(3, 3, padding="same", activation="relu", name="conv")(h)
        h = L.Add(name="res")([h, L.RandomFlip(name="flip_inner")(x)])
        h = L.GlobalAveragePooling2D(name="gap")(h)
        return K.Model(x, L.Dense(3, name="head")(h), name=key)
    if key in (
        "training_true",
        "training_true_tf_keras",
    ):  # Monte Carlo dropout, a forced augmentation, a nested model in training
        x = K.Input((9, 9, 3), name="x")
        h = L.Conv2D(2, 3, name="conv")(L.RandomFlip(name="flip")(x, training=True))
        h = L.Dropout(0.5, name="mc_drop")(L.Flatten(name="flat")(h), training=True)
        h = L.Dense(4, name="d")(h, training=True)  # computes the same either way: not named
        inner = K.Sequential([K.Input((4,)), L.BatchNormalization(name="bn")], name="inner")
        return K.Model(x, L.Dense(2, name="head")(inner(h, training=True)), name=key)
    if key == "random_crop":  # an augmentation layer whose inference differs between Keras 3 and tf_keras
        x = K.Input((9, 9, 3), name="x")
        return K.Model(x, L.Conv2D(2, 3, name="conv")(L.RandomCrop(8, 8, name="crop")(x)), name=key)
    if key == "unsupported_graph":
        x, y = K.Input((3, 4), name="x"), K.Input((2, 3, 4), name="y")
        d = L.Dot(axes=3, name="dot4")([y, y])  # a merge on shapes malinn does not run
        convlstm = L.ConvLSTM1D(2, 1, activation="softmax", name="convlstm")(y)  # not element-wise gates
        return K.Model([x, y], [L.RNN(L.GRUCell(2), name="rnn")(x), L.Flatten(name="flat")(d), convlstm], name=key)
    raise KeyError(key)


def _input_keys(model):
    """Keras 3's keys of inputs given as a dict, in the order of ``model.inputs``; else None."""
    struct = getattr(model, "_inputs_struct", None)
    if not isinstance(struct, dict):
        return None
    return [next(k for k, t in struct.items() if t is tensor) for tensor in model.inputs]


def main(argv):
    out = argv[0]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import importlib
    import warnings

    import numpy as np

    warnings.filterwarnings("ignore")
    manifest = {"models": {}, "skipped": {}, "formats": []}
    for generation, module in GENERATIONS.items():
        try:
            K = importlib.import_module(module)
        except ImportError as exc:
            manifest["skipped"][generation] = str(exc)
            continue
        manifest["formats"] += [fmt for fmt, (g, _) in FORMATS.items() if g == generation]
        os.makedirs(os.path.join(out, generation), exist_ok=True)
        for i, key in enumerate(model_keys()):
            if (key in KERAS3_ONLY and generation != "keras3") or (key in TF_KERAS_ONLY and generation == "keras3"):
                continue
            try:
                model = build(K, key)
            except Exception as exc:  # a graph this generation cannot express
                manifest["skipped"][f"{generation}/{key}"] = f"{type(exc).__name__}: {exc}"
                continue
            rng = np.random.default_rng(i + (0 if generation == "keras3" else 1000))
            for layer in model.layers:
                for sub in layer.layers if hasattr(layer, "layers") else [layer]:
                    weights = sub.get_weights()
                    if weights:
                        new = [(rng.standard_normal(w.shape) * 0.5).astype(np.float32) for w in weights]
                        if sub.__class__.__name__ == "BatchNormalization":  # a variance is never negative
                            new[-1] = np.abs(new[-1]) + 0.1
                        sub.set_weights(new)
            base = os.path.join(out, generation, key)
            model.save(base + ".keras")
            if key not in KERAS3_ZIP_ONLY:
                model.save(base + ".h5")
            data = {}
            for label, scale in RANGES.items():
                xs = [rng.uniform(-scale, scale, (100,) + tuple(t.shape[1:])).astype(np.float32) for t in model.inputs]
                keys = _input_keys(model)
                given = dict(zip(keys, xs)) if keys else (xs if len(xs) > 1 else xs[0])
                ys = model(given, training=False)
                output_names = list(ys) if isinstance(ys, dict) else None
                ys = list(ys.values()) if isinstance(ys, dict) else ys if isinstance(ys, (list, tuple)) else [ys]
                data.update({f"{label}:x{j}": x for j, x in enumerate(xs)})
                data.update({f"{label}:y{j}": np.asarray(y, np.float32) for j, y in enumerate(ys)})
            np.savez(base + ".npz", **data)
            manifest["models"][f"{generation}/{key}"] = {
                "inputs": [t.name.split(":")[0] for t in model.inputs],
                "input_keys": _input_keys(model),
                "outputs": len(model.outputs),
                "output_names": output_names,
            }
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
