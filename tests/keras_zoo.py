"""The Keras models the converter tests run, built and saved in a process of their own.

TensorFlow and PoCL cannot share a process (once TensorFlow is loaded, PoCL's kernel compiler binds
to TensorFlow's LLVM and fails or crashes), so the tests never import tensorflow, keras or tf_keras.
This script does all the Keras work instead:

    python3 tests/keras_zoo.py OUTDIR

builds every test model with Keras 3 and with tf_keras (Keras 2), saves each one in both of its
generation's formats, and writes into OUTDIR:

* the model files: ``<generation>/<key>.keras`` and ``<generation>/<key>.h5``;
* the split save form of every model (:data:`SPLIT_FORMATS`): ``<generation>/<key>.json``
  (``model.to_json()``) and its ``model.save_weights()`` file(s): Keras 3 ``<key>.weights.h5``;
  tf_keras ``<key>_weights.h5`` (Keras 2's layout) and ``<key>.weights.h5`` (Keras 3's layout,
  which tf_keras writes for that suffix);
* ``keras3/small_savedmodel/`` (``model.export``), ``keras3/small.tflite`` and a tf_keras
  checkpoint ``tf_keras/ckpt/small`` (``save_weights`` without ``.h5``): TensorFlow's formats,
  which malinn refuses (``manifest["tensorflow_files"]``);
* ``<generation>/<key>.data.npz``: ``x`` (the inputs), ``y`` (Keras's output on ``x``) and
  ``layer:<name>`` (Keras's output of every layer, InputLayer left out) for the models the
  equivalence tests run; extra arrays for some (``labels`` for the digits model);
* ``<generation>/<key>.weights.npz``: ``layer.get_weights()`` of every layer in execution order
  (nested models flattened, InputLayers left out), key ``"<layer index>/<weight index>"``;
* ``manifest.json``: versions, formats and, per model, its files, layers (class, name, config),
  input shape, batch sizes and data files. Paths in it are relative to OUTDIR.

The module level below is plain data (no TensorFlow) so the tests can import it to parametrize.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

#: format id -> (generation, file suffix). "keras3-zip" / "keras3-h5" are written by Keras 3,
#: "keras2-h5" / "tf_keras-zip" by tf_keras (Keras 2).
FORMATS = {
    "keras3-zip": ("keras3", ".keras"),
    "keras3-h5": ("keras3", ".h5"),
    "keras2-h5": ("tf_keras", ".h5"),
    "tf_keras-zip": ("tf_keras", ".keras"),
}
#: What :func:`malinn.converters.read_keras` reports as ``KerasModel.format`` for each format id.
READER_FORMAT = {
    "keras3-zip": "keras3-zip",
    "keras3-h5": "keras3-h5",
    "keras2-h5": "keras2-h5",
    "tf_keras-zip": "keras3-zip",
}
#: split form id -> (generation, architecture suffix, weights suffix): ``model.to_json()`` beside
#: ``model.save_weights()``.
SPLIT_FORMATS = {
    "keras3-split": ("keras3", ".json", ".weights.h5"),
    "tf_keras-split": ("tf_keras", ".json", "_weights.h5"),
    "tf_keras-split-v3": ("tf_keras", ".json", ".weights.h5"),
}
#: What :func:`malinn.converters.read_keras` reports as ``KerasModel.format`` for each split form.
SPLIT_READER_FORMAT = {
    "keras3-split": "keras3-json",
    "tf_keras-split": "keras2-json",
    "tf_keras-split-v3": "keras2-json",
}
GENERATIONS = {"keras3": 3, "tf_keras": 2}
MODULES = {"keras3": "keras", "tf_keras": "tf_keras"}

#: Every activation string malinn supports, each tried as a Dense activation and as an
#: Activation layer. tf_keras has no hard_silu / hard_swish.
ACTIVATIONS = [
    "linear",
    "relu",
    "relu6",
    "sigmoid",
    "hard_sigmoid",
    "tanh",
    "softmax",
    "elu",
    "selu",
    "softplus",
    "softsign",
    "swish",
    "silu",
    "gelu",
    "exponential",
    "leaky_relu",
    "hard_silu",
    "hard_swish",
    "mish",
]
KERAS3_ONLY = {"hard_silu", "hard_swish"}

#: Models built of supported layers (besides the act_* ones), checked against Keras.
LAYER_MODELS = ["noops", "multiaxis", "batchnorm", "relus", "wide", "tiny", "digits", "cnn", "cnn1d", "cnn_odd"]

#: The single-input layers (activations, normalizations, reshaping, rescaling) on every rank and axis (tests/converters/test_layer_models.py):
#: key -> the generations that have it (tf_keras has no rms_scaling, Keras 3 no ThresholdedReLU).
#: Each also records ``x_large`` / ``y_large``: inputs far outside [-1, 1] and Keras's outputs.
SINGLE_INPUT_LAYER_MODELS = {
    "dense_nd": ("keras3", "tf_keras"),
    "dense_4d": ("keras3", "tf_keras"),
    "softmax_axes": ("keras3", "tf_keras"),
    "batchnorm_axes": ("keras3", "tf_keras"),
    "batchnorm_tf_variants": ("tf_keras",),
    "elementwise_nd": ("keras3", "tf_keras"),
    "reshapes": ("keras3", "tf_keras"),
    "prelu": ("keras3", "tf_keras"),
    "thresholded": ("tf_keras",),
    "layernorm": ("keras3", "tf_keras"),
    "layernorm_rms": ("keras3",),
    "unitnorm": ("keras3", "tf_keras"),
    "preprocessing": ("keras3", "tf_keras"),
    "normalization_axes": ("keras3", "tf_keras"),
    "timedistributed": ("keras3", "tf_keras"),
    "softmax_v2": ("keras3",),
    "identity_only": ("keras3", "tf_keras"),
}


def single_input_layer_models(generation):
    return [key for key, generations in SINGLE_INPUT_LAYER_MODELS.items() if generation in generations]


#: Custom objects registered under the names of Keras built-ins, each computing twice the built-in
#: (a Dense subclass registered as ``adv>Dense``, a Sequential subclass with its own ``call``, an
#: activation registered as ``adv>relu``): model key -> what the converter must name.
CUSTOM_MODELS = {
    "custom_dense": ["'d_adv'", "adv>Dense"],
    "custom_sequential": ["'doubled'", "AdvSequential"],
    "custom_activation": ["'d_adv_relu'", "'act_adv_relu'", "adv>relu"],
}
#: Keras 3 layers whose constructor arguments the zoo records (``manifest["keras3_layer_arguments"]``):
#: the window layers, whose configs the converter passes on key by key.
ARGUMENT_LAYERS = [
    "Conv1D",
    "Conv2D",
    "Conv1DTranspose",
    "Conv2DTranspose",
    "DepthwiseConv2D",
    "SeparableConv2D",
    "MaxPooling1D",
    "MaxPooling2D",
    "AveragePooling1D",
    "AveragePooling2D",
    "GlobalMaxPooling1D",
    "GlobalMaxPooling2D",
    "GlobalAveragePooling1D",
    "GlobalAveragePooling2D",
    "ZeroPadding1D",
    "ZeroPadding2D",
    "Cropping1D",
    "Cropping2D",
    "UpSampling1D",
    "UpSampling2D",
    "Conv3D",
    "Conv3DTranspose",
    "MaxPooling3D",
    "AveragePooling3D",
    "GlobalMaxPooling3D",
    "GlobalAveragePooling3D",
    "ZeroPadding3D",
    "Cropping3D",
    "UpSampling3D",
]

#: Keras 3 Dense variants: weights stored as bfloat16, LoRA enabled, int8-quantized (Keras 3
#: only, except bfloat16 which tf_keras writes too).
VARIANT_MODELS = ["bfloat16", "lora", "int8", "int8_lora"]

#: One LayerNormalization (random gamma and beta) over samples whose mean and variance float32
#: computes badly: constant (1e10, 65504, 1e4...), offset (1e4 + noise), near the largest float
#: (3e38); one model per axis size, and with rms_scaling (tf_keras has none)
#: (tests/layers/test_normalization_statistics.py).
STATISTICS_SIZES = (1, 3, 13, 1001, 4096)


#: The dtypes an Input is given in the zoo's ``input_<dtype>`` models (a Dense of the identity
#: after ``Input((4,), dtype=...)``: Keras casts predict's float32 input to it first) and the
#: values cast (toward zero, wrapped, NaN and 1e10 as C converts them); uint32 and uint64 are left
#: out: NumPy and TensorFlow convert their out-of-range values differently
#: (tests/converters/test_input_dtypes.py).
INPUT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "bool", "float16", "bfloat16", "float64")
INPUT_DTYPE_VALUES = [
    [0.7, -1.6, 2.5, 300.2],
    [-0.5, 1e10, -3e9, 65535.7],
    [255.9, 256.0, -129.0, 127.5],
    [float("nan"), float("inf"), float("-inf"), 0.0],
    [1.0, 0.0, -0.0, 1e-30],
]


def statistics_models(generation):
    return [
        f"ln_statistics_{n}{'_rms' if rms else ''}"
        for n in STATISTICS_SIZES
        for rms in (False, True)
        if not rms or generation == "keras3"
    ]


def activation_models(generation):
    return [f"act_{a}" for a in ACTIVATIONS if generation == "keras3" or a not in KERAS3_ONLY]


def equivalence_models(generation):
    """Model keys the equivalence tests run for ``generation``."""
    return LAYER_MODELS + activation_models(generation) + single_input_layer_models(generation)


BATCH_SIZES = [1, 7, 100]
BIG_BATCH = 10_000


class ZooIndex:
    """The zoo as the tests see it (numpy only): ``manifest.json`` with its paths resolved.

    ``fmt`` is a key of :data:`FORMATS`; ``key`` a model key (``"noops"``, ``"act_gelu"``...).
    """

    def __init__(self, root):
        self.root = pathlib.Path(root)
        self.manifest = json.loads((self.root / "manifest.json").read_text())
        self.versions = self.manifest["versions"]
        self.formats = self.manifest["formats"]
        self.models = self.manifest["models"]
        self.split_formats = self.manifest.get("split_formats", {})
        self._cache = {}

    def require(self, fmt, key=None):
        """The model's manifest entry; skips the test when the zoo could not build it here."""
        import pytest

        if fmt not in self.formats:
            pytest.skip(f"{FORMATS[fmt][0]} is not installed, so the zoo has no {fmt} files")
        if key is None:
            return self.formats[fmt]
        entry = self.models.get(f"{FORMATS[fmt][0]}/{key}")
        if entry is None or fmt not in entry["files"]:
            pytest.skip(f"the zoo has no {fmt} file of {key!r} (see tests/keras_zoo.py's output)")
        return entry

    def path(self, fmt, key) -> pathlib.Path:
        return self.root / self.require(fmt, key)["files"][fmt]

    def split_paths(self, fmt, key) -> tuple:
        """``(architecture JSON, weights file)`` of a model in the split form ``fmt`` (a key of
        :data:`SPLIT_FORMATS`); skips the test when the zoo has none."""
        import pytest

        generation = SPLIT_FORMATS[fmt][0]
        entry = self.models.get(f"{generation}/{key}")
        if generation not in self.versions or entry is None or fmt not in entry.get("split", {}):
            pytest.skip(f"the zoo has no {fmt} files of {key!r} (see tests/keras_zoo.py's output)")
        pair = entry["split"][fmt]
        return self.root / pair["architecture"], self.root / pair["weights"]

    def split_entry(self, fmt, key) -> dict:
        """The manifest entry of a model the zoo wrote in the split form ``fmt``."""
        self.split_paths(fmt, key)
        return self.models[f"{SPLIT_FORMATS[fmt][0]}/{key}"]

    def split_data(self, fmt, key) -> dict:
        """:meth:`data` of a model the zoo wrote in the split form ``fmt``."""
        return self._npz(self.split_entry(fmt, key)["data"])

    def _npz(self, relative):
        import numpy as np

        if relative not in self._cache:
            with np.load(self.root / relative) as npz:
                self._cache[relative] = {k: npz[k] for k in npz.files}
        return self._cache[relative]

    def data(self, fmt, key) -> dict:
        """``x``, ``y`` (Keras's output), ``layer:<name>`` (each Keras layer's output), extras."""
        return self._npz(self.require(fmt, key)["data"])

    def weights(self, fmt, key) -> list:
        """``get_weights()`` of each Keras layer, in execution order (InputLayers left out)."""
        entry = self.require(fmt, key)
        arrays = self._npz(entry["weights"])
        return [[arrays[f"{i}/{j}"] for j in range(layer["n_weights"])] for i, layer in enumerate(entry["layers"])]


# ---------------------------------------------------------------------------------------------
# everything below runs only in the zoo's own process


def _json_default(value):
    import numpy as np

    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def plain(array):
    """``array`` as numpy can save it: bfloat16 (ml_dtypes, a void type to numpy) widened to
    float32, which is exact; any other dtype as it is."""
    import numpy as np

    array = np.asarray(array)
    return array.astype(np.float32) if array.dtype.name == "bfloat16" else array


def leaf_layers(model):
    """Keras's layers in execution order, nested models flattened, InputLayers left out."""
    out = []
    for layer in model.layers:
        if hasattr(layer, "layers") and layer.__class__.__name__ in ("Sequential", "Functional"):
            out.extend(leaf_layers(layer))
        elif layer.__class__.__name__ != "InputLayer":
            out.append(layer)
    return out


class Zoo:
    def __init__(self, outdir, generation, K):
        import numpy as np

        self.np = np
        self.outdir = outdir
        self.generation = generation
        self.K = K
        self.L = K.layers
        self.models = {}
        self.tensorflow_files = {}
        self.seed_offset = 0 if generation == "keras3" else 1000  # different numbers per generation
        os.makedirs(os.path.join(outdir, generation), exist_ok=True)

    # ------------------------------------------------------------------ shared steps
    def sequential(self, input_shape, layers, name, kwarg_style=False):
        """A Sequential; tf_keras models may give the input shape as the first layer's kwarg."""
        K = self.K
        if kwarg_style:
            first = layers[0]
            cls = type(first)
            config = first.get_config()
            layers = [cls.from_config({**config, "batch_input_shape": (None, *input_shape)})] + layers[1:]
            return K.Sequential(layers, name=name)
        return K.Sequential([K.Input(input_shape)] + layers, name=name)

    def calibrate(self, model, x, seed, targets=None):
        """Random weights everywhere; each Dense scaled so its pre-activations have the std in
        ``targets`` (default 2.0) on ``x``; BatchNormalization moving statistics near the real
        ones, but off (so folding them matters), gammas and betas random."""
        np = self.np
        rng = np.random.default_rng(seed + self.seed_offset)
        targets = targets or {}
        h = x
        for layer in leaf_layers(model):
            cls = layer.__class__.__name__
            if cls == "Dense":
                weights = layer.get_weights()
                kernel = rng.standard_normal(weights[0].shape)
                z = h.astype(np.float64) @ kernel  # Dense works on the last axis
                bias = None
                if len(weights) == 2:
                    bias = rng.standard_normal(weights[1].shape) * 0.5 * max(z.std(), 1e-3)
                    z = z + bias
                s = targets.get(layer.name, 2.0) / max(z.std(), 1e-6)
                new = [(kernel * s).astype(np.float32)]
                if bias is not None:
                    new.append((bias * s).astype(np.float32))
                layer.set_weights(new)
            elif cls == "BatchNormalization":
                cfg = layer.get_config()
                axis = cfg.get("axis", -1)
                axis = (axis[0] if isinstance(axis, (list, tuple)) else axis) % h.ndim
                feats = np.moveaxis(np.asarray(h), axis, -1).reshape(-1, h.shape[axis]).astype(np.float64)
                mean, var = feats.mean(0), feats.var(0)
                n = mean.shape[0]
                values = {
                    "gamma": rng.uniform(0.5, 2.0, n) * rng.choice([-1.0, 1.0], n),
                    "beta": rng.normal(0.0, 0.5, n),
                    "moving_mean": mean + rng.normal(0.0, 0.3, n) * np.sqrt(var + 1e-6),
                    "moving_variance": var * rng.uniform(0.5, 2.0, n) + 1e-4,
                }
                order = (
                    (["gamma"] if cfg.get("scale", True) else [])
                    + (["beta"] if cfg.get("center", True) else [])
                    + ["moving_mean", "moving_variance"]
                )
                layer.set_weights([values[k].astype(np.float32) for k in order])
            h = np.asarray(layer(h, training=False))
        return model

    def jitter(self, model, seed, classes=("PReLU", "LayerNormalization")):
        """Random weights for the layers of ``classes`` (alphas in [-0.5, 1.5], gammas around 1)."""
        np = self.np
        rng = np.random.default_rng(seed + self.seed_offset)
        for layer in leaf_layers(model):
            if layer.__class__.__name__ == "TimeDistributed":  # its inner layer's weights
                layer = layer.layer
            if layer.__class__.__name__ in classes:
                layer.set_weights(
                    [
                        (
                            rng.uniform(-0.5, 1.5, tuple(w.shape))
                            if "alpha" in w.name or "gamma" in w.name
                            else rng.normal(0.0, 0.5, tuple(w.shape))
                        ).astype(np.float32)
                        for w in layer.weights
                    ]
                )
        return model

    def uniform(self, shape, n=100, seed=0, low=-1.0, high=1.0):
        rng = self.np.random.default_rng(seed + self.seed_offset)
        return rng.uniform(low, high, (n, *shape)).astype(self.np.float32)

    def add_single_input_layer(self, key, model, x, x_large):
        """A model of :data:`SINGLE_INPUT_LAYER_MODELS`: inputs in [-1, 1] (``x``) and large ones."""
        np = self.np
        x_large = np.asarray(x_large, np.float32)
        self.add(key, model, x, extra={"x_large": x_large, "y_large": plain(model(x_large, training=False))})

    def randomize(self, model, seed):
        """Give every weight distinct values (moving variances positive)."""
        np = self.np
        rng = np.random.default_rng(seed)
        for layer in leaf_layers(model):
            values = []
            for weight in layer.weights:
                shape = tuple(weight.shape)
                if "variance" in weight.name:
                    values.append(rng.uniform(0.5, 2.0, shape).astype(np.float32))
                else:
                    values.append(rng.standard_normal(shape).astype(np.float32))
            if values:
                layer.set_weights(values)

    def add(
        self,
        key,
        model,
        x=None,
        batch_sizes=None,
        extra=None,
        suffixes=(".keras", ".h5"),
        layer_outputs=True,
        files=None,
        kind="model",
    ):
        """Saves ``model`` in every format of this generation and records its reference data."""
        np = self.np
        entry = {
            "key": key,
            "generation": self.generation,
            "keras_major": GENERATIONS[self.generation],
            "kind": kind,
            "files": {},
        }
        base = os.path.join(self.generation, key)
        for fmt, (generation, suffix) in FORMATS.items():
            if generation == self.generation and suffix in suffixes:
                model.save(os.path.join(self.outdir, base + suffix))
                entry["files"][fmt] = base + suffix
        entry.update(files or {})
        if model is not None:
            entry["split"] = self.save_split(model, base)
            leaves = leaf_layers(model)
            entry["name"] = model.name
            entry["model_class"] = model.__class__.__name__
            entry["layers"] = [
                {
                    "class_name": l.__class__.__name__,
                    "name": l.name,
                    "config": json.loads(json.dumps(l.get_config(), default=_json_default)),
                    "n_weights": len(l.get_weights()),
                }
                for l in leaves
            ]
            shape = getattr(model, "input_shape", None)
            try:
                entry["input_shape"] = list(model.input_shape[1:]) if shape is not None else None
            except (AttributeError, TypeError):
                entry["input_shape"] = None
            arrays = {f"{i}/{j}": plain(w) for i, l in enumerate(leaves) for j, w in enumerate(l.get_weights())}
            np.savez(os.path.join(self.outdir, base + ".weights.npz"), **arrays)
            entry["weights"] = base + ".weights.npz"
        if x is not None:
            x = np.asarray(x, dtype=np.float32)
            data = {"x": x, "y": plain(model(x, training=False))}
            if layer_outputs:
                h = x
                for layer in leaf_layers(model):
                    h = layer(h, training=False)
                    data[f"layer:{layer.name}"] = plain(h)
                # the chain of layer calls is the model: a check of the zoo itself
                assert np.allclose(np.asarray(h), data["y"], rtol=1e-5, atol=1e-6), key
            data.update(extra or {})
            np.savez(os.path.join(self.outdir, base + ".data.npz"), **data)
            entry["data"] = base + ".data.npz"
            entry["batch_sizes"] = batch_sizes or BATCH_SIZES
        self.models[key] = entry
        return entry

    def save_split(self, model, base) -> dict:
        """Writes ``model.to_json()`` and the weights files of this generation's split forms."""
        architecture = base + ".json"
        with open(os.path.join(self.outdir, architecture), "w") as fh:
            fh.write(model.to_json())
        out = {}
        for fmt, (generation, _, suffix) in SPLIT_FORMATS.items():
            if generation == self.generation:
                model.save_weights(os.path.join(self.outdir, base + suffix))
                out[fmt] = {"architecture": architecture, "weights": base + suffix}
        return out

    def inputs(self, shape, n=100, seed=0, scale=1.5):
        rng = self.np.random.default_rng(seed + self.seed_offset)
        return (rng.standard_normal((n, *shape)) * scale).astype(self.np.float32)

    # ------------------------------------------------------------------ equivalence models
    def build_equivalence(self):
        L = self.L
        k2 = self.generation == "tf_keras"

        # Inference no-ops between computing layers (and one first).
        layers = [
            L.Dropout(0.3, name="drop_first"),
            L.Dense(13, activation="relu", name="d13"),
            L.GaussianNoise(0.5, name="noise"),
            L.AlphaDropout(0.2, name="alpha_drop"),
            L.GaussianDropout(0.2, name="gauss_drop"),
            L.ActivityRegularization(l1=0.01, l2=0.01, name="act_reg"),
            L.Dense(3, name="d3"),
            L.Identity(name="identity"),
            L.Dropout(0.5, name="drop"),
            L.Activation("tanh", name="tanh"),
            L.Dense(1, name="d1"),
        ]
        x = self.inputs((9,), seed=1)
        self.add("noops", self.calibrate(self.sequential((9,), layers, "noops", kwarg_style=k2), x, 1), x)

        # A (28, 28) sample: element-wise layers and a per-channel BatchNormalization before
        # the Flatten, a BatchNormalization folded into the Dense after it.
        layers = [
            L.LeakyReLU(0.1, name="leaky"),
            L.BatchNormalization(name="bn_channels"),
            L.SpatialDropout1D(0.2, name="spatial_drop"),
            L.Activation("sigmoid", name="sig"),
            L.ELU(0.7, name="elu"),
            L.ReLU(max_value=0.9, name="relu_cap"),
            L.Flatten(name="flat"),
            L.Dense(13, name="d13"),
            L.BatchNormalization(name="bn_folded"),
            L.Activation("relu", name="relu"),
            L.Dense(3, activation="softmax", name="d3"),
        ]
        x = self.inputs((28, 28), seed=2)
        self.add("multiaxis", self.calibrate(self.sequential((28, 28), layers, "multiaxis"), x, 2), x)

        # BatchNormalization everywhere: first, folded (also across a Dropout and without bias),
        # standalone after an activation, without center / scale, twice in a row, last.
        layers = [
            L.BatchNormalization(name="bn_input"),
            L.Dense(13, name="d_lin"),
            L.BatchNormalization(name="bn_folded"),
            L.Dense(13, activation="tanh", name="d_tanh"),
            L.BatchNormalization(name="bn_after_act"),
            L.Dense(13, name="d_lin2"),
            L.Dropout(0.4, name="drop"),
            L.BatchNormalization(momentum=0.9, name="bn_folded_drop"),
            L.Dense(3, use_bias=False, name="d_nobias"),
            L.BatchNormalization(center=False, name="bn_nocenter_folded"),
            L.Dense(3, activation="relu", name="d_relu"),
            L.BatchNormalization(scale=False, name="bn_noscale"),
            L.BatchNormalization(center=False, scale=False, epsilon=0.01, name="bn_bare"),
            L.Dense(1, name="d1"),
            L.BatchNormalization(epsilon=0.1, name="bn_last"),
        ]
        x = self.inputs((7,), seed=3)
        self.add("batchnorm", self.calibrate(self.sequential((7,), layers, "batchnorm"), x, 3), x)

        # ReLU with max_value / negative_slope / threshold in combinations, LeakyReLU, ELU, Softmax.
        relus = [
            dict(),
            dict(max_value=1.5),
            dict(negative_slope=0.1),
            dict(threshold=0.5),
            dict(max_value=3.0, negative_slope=0.1),
            dict(max_value=1.0, threshold=0.3),
            dict(negative_slope=0.3, threshold=1.0),
            dict(max_value=2.0, negative_slope=0.2, threshold=0.5),
        ]
        layers = []
        for i, kwargs in enumerate(relus):
            layers += [L.Dense(13, name=f"d{i}"), L.ReLU(**kwargs, name=f"relu{i}")]
        layers += [
            L.Dense(13, name="d_leaky_default"),
            L.LeakyReLU(name="leaky_default"),
            L.Dense(13, name="d_leaky"),
            L.LeakyReLU(0.05, name="leaky"),
            L.Dense(13, name="d_elu_default"),
            L.ELU(name="elu_default"),
            L.Dense(13, name="d_elu"),
            L.ELU(0.5, name="elu"),
            L.Dense(3, name="d_softmax"),
            L.Softmax(name="softmax"),
        ]
        x = self.inputs((5,), seed=4)
        self.add("relus", self.calibrate(self.sequential((5,), layers, "relus"), x, 4), x)

        layers = [
            L.Dense(1001, activation="relu", name="d1001"),
            L.Dense(13, activation="sigmoid", name="d13"),
            L.Dense(1, name="d1"),
        ]
        x = self.inputs((1001,), seed=5)
        self.add("wide", self.calibrate(self.sequential((1001,), layers, "wide"), x, 5), x)

        layers = [L.Dense(13, activation="tanh", name="d13"), L.Dense(1, activation="sigmoid", name="d1")]
        x = self.inputs((3,), n=BIG_BATCH, seed=6)
        model = self.calibrate(self.sequential((3,), layers, "tiny", kwarg_style=k2), x[:100], 6)
        self.add("tiny", model, x, batch_sizes=BATCH_SIZES + [BIG_BATCH])

        for i, act in enumerate(activation_models(self.generation)):
            name = act[len("act_") :]
            # exp / softplus: pre-activations of std 1 keep exp's outputs where float32 is exact enough
            target = 1.0 if name in ("exponential",) else 2.0
            layers = [
                L.Dense(13, activation=name, name="dense_act"),
                L.Dense(3, name="dense_lin"),
                L.Activation(name, name="act"),
                L.Dense(1, activation=name, name="dense_out"),
            ]
            x = self.inputs((5,), seed=100 + i)
            model = self.sequential((5,), layers, act)
            self.calibrate(model, x, 100 + i, {"dense_act": target, "dense_lin": target, "dense_out": target})
            self.add(act, model, x)

        self.build_cnn()
        self.build_digits()
        self.build_single_input_layers()

    def build_single_input_layers(self):
        """The models of :data:`SINGLE_INPUT_LAYER_MODELS`."""
        L, np = self.L, self.np
        keys = single_input_layer_models(self.generation)

        def seq(key, shape, layers, seed, large=100.0, x=None, x_large=None):
            model = self.sequential(shape, layers, key)
            x = self.uniform(shape, seed=seed) if x is None else x
            x_large = self.inputs(shape, seed=seed + 50, scale=large) if x_large is None else x_large
            self.calibrate(model, x, seed)
            self.jitter(model, seed)
            self.add_single_input_layer(key, model, x, x_large)

        seq(
            "dense_nd",
            (5, 7),
            [
                L.Rescaling(2.0, name="resc_first"),
                L.Dense(13, activation="tanh", name="d13"),
                L.Dense(3, name="d3"),
                L.Dense(4, activation="relu", name="d4"),
            ],
            200,
        )
        seq(
            "dense_4d",
            (3, 4, 5),
            [L.Dense(6, name="d6"), L.Activation("relu", name="relu"), L.Dense(1, activation="sigmoid", name="d1")],
            201,
        )
        seq(
            "softmax_axes",
            (3, 5, 7),
            [
                L.Softmax(axis=1, name="sm1"),
                L.Dense(7, name="d7a"),
                L.Softmax(axis=[1, 3], name="sm13"),
                L.Dense(7, name="d7b"),
                L.Softmax(axis=[2, 3], name="sm23"),
                L.Dense(7, name="d7c"),
                L.Softmax(axis=-2, name="sm_2"),
                L.Softmax(name="sm_last"),
            ],
            202,
            large=30.0,
        )
        seq(
            "batchnorm_axes",
            (4, 5, 6),
            [
                L.BatchNormalization(axis=1, name="bn1"),
                L.BatchNormalization(axis=2, name="bn2"),
                L.Dense(6, name="d6"),
                L.BatchNormalization(axis=3, name="bn3_folded"),
                L.BatchNormalization(axis=-2, center=False, name="bn_2"),
                L.Activation("tanh", name="tanh"),
                L.BatchNormalization(axis=1, scale=False, name="bn1_noscale"),
            ],
            203,
            large=30.0,
        )  # at std 100, float32 rounding in this chain puts Keras and malinn 2e-5 to 5e-5 from exact
        if "batchnorm_tf_variants" in keys:
            # batch renormalization and ghost batch normalization: plain BatchNormalization at inference
            # (random weights: calibrate sets a BatchNormalization's four arrays, renorm has seven)
            model = self.sequential(
                (4, 5, 6),
                [
                    L.BatchNormalization(renorm=True, name="bn_renorm"),
                    L.BatchNormalization(axis=2, virtual_batch_size=1, name="bn_ghost2"),
                    L.Dense(6, name="d6"),
                    L.BatchNormalization(virtual_batch_size=1, name="bn_ghost"),
                ],
                "batchnorm_tf_variants",
            )
            self.randomize(model, 205)
            self.add_single_input_layer(
                "batchnorm_tf_variants",
                model,
                self.uniform((4, 5, 6), seed=205),
                self.inputs((4, 5, 6), seed=255, scale=30.0),
            )
        seq(
            "elementwise_nd",
            (4, 5),
            [
                L.ReLU(max_value=0.8, name="relu"),
                L.Activation("tanh", name="tanh"),
                L.LeakyReLU(0.2, name="leaky"),
                L.Dropout(0.2, name="drop"),
            ],
            204,
        )
        seq(
            "reshapes",
            (4, 6),
            [
                L.Reshape((-1, 3), name="to_8x3"),
                L.Dense(5, name="d5"),
                L.Permute((2, 1), name="swap"),
                L.Reshape((40,), name="flat40"),
                L.RepeatVector(3, name="repeat"),
                L.Dense(2, name="d2"),
                L.Reshape((2, 3, 1), name="to_2x3x1"),
                L.Permute((3, 1, 2), name="perm312"),
                L.Flatten(name="flat"),
            ],
            205,
        )
        seq(
            "prelu",
            (4, 5, 6),
            [
                L.PReLU(name="prelu_full"),
                L.Dense(6, name="d6"),
                L.PReLU(shared_axes=[1, 2], name="prelu_channels"),
                L.PReLU(shared_axes=[3], name="prelu_rows"),
                # Keras: alpha_shape[-1 - 1] = 1, the sample's second-to-last axis
                L.PReLU(shared_axes=[-1], name="prelu_negative"),
                L.Dense(3, name="d3"),
            ],
            206,
        )
        if "thresholded" in keys:
            seq(
                "thresholded",
                (5,),
                [
                    L.Dense(13, name="d13"),
                    L.ThresholdedReLU(theta=0.5, name="thr"),
                    L.Dense(3, name="d3"),
                    L.ThresholdedReLU(theta=0.0, name="thr0"),
                ],
                207,
            )
        seq(
            "layernorm",
            (4, 6),
            [
                L.LayerNormalization(name="ln_last"),
                L.Dense(6, name="d6"),
                L.LayerNormalization(axis=[1, 2], name="ln_both"),
                L.LayerNormalization(axis=1, center=False, name="ln_rows"),
                L.LayerNormalization(scale=False, epsilon=0.1, name="ln_noscale"),
                L.Reshape((2, 2, 6), name="to3d"),
                L.LayerNormalization(axis=[1, 3], name="ln_split"),
                L.Dense(2, name="d2"),
            ],
            208,
        )
        if "layernorm_rms" in keys:
            seq(
                "layernorm_rms",
                (4, 6),
                [
                    L.Dense(6, name="d6"),
                    L.LayerNormalization(rms_scaling=True, name="rms"),
                    L.LayerNormalization(axis=[1, 2], rms_scaling=True, name="rms_both"),
                    # Keras builds gamma for rms_scaling whatever scale says
                    L.LayerNormalization(rms_scaling=True, scale=False, name="rms_noscale"),
                ],
                209,
            )
        seq(
            "unitnorm",
            (4, 6),
            [
                L.UnitNormalization(name="un_last"),
                L.Dense(6, name="d6"),
                L.UnitNormalization(axis=1, name="un_rows"),
                L.UnitNormalization(axis=[1, 2], name="un_both"),
            ],
            210,
        )
        # tabular data: raw features far from 0 (a year, an income), normalized by adapted statistics
        rng = np.random.default_rng(211 + self.seed_offset)
        centre, spread = np.array([2000.0, 5e4, 3.0, -40.0, 0.0, 1e3]), np.array([10.0, 2e4, 1.0, 5.0, 0.01, 300.0])

        def raw(n):
            return (centre + rng.standard_normal((n, 6)) * spread).astype(np.float32)

        norm = L.Normalization(name="norm")
        norm.adapt(raw(500))
        seq(
            "preprocessing",
            (6,),
            [
                norm,
                L.Dense(13, activation="relu", name="d13"),
                L.Rescaling(0.5, offset=0.1, name="resc"),
                L.Dense(3, name="d3"),
                L.Rescaling(1.0 / 255, name="resc_scale"),
                L.Dense(2, name="d2_folded"),
                L.Normalization(mean=1.0, variance=4.0, name="norm_given"),
                L.Normalization(invert=True, mean=[1.0, -2.0], variance=[9.0, 0.25], name="norm_invert"),
            ],
            211,
            x=raw(100),
            x_large=raw(100) * 3,
        )
        norm_axes = L.Normalization(axis=1, name="norm_rows")
        norm_axes.adapt(self.inputs((4, 5), n=300, seed=212) * 3 + 7)
        seq(
            "normalization_axes",
            (4, 5),
            [
                norm_axes,
                L.Rescaling([0.5, 1.0, 2.0, -1.0, 3.0], name="resc_cols"),
                L.Normalization(axis=None, mean=0.5, variance=2.0, name="norm_scalar"),
            ],
            212,
        )
        seq(
            "timedistributed",
            (5, 4, 3),
            [
                L.TimeDistributed(L.Flatten(), name="td_flat"),
                L.TimeDistributed(L.Dense(4, activation="relu"), name="td_dense"),
                L.TimeDistributed(L.Dropout(0.3), name="td_drop"),
                L.TimeDistributed(L.Dense(3), name="td_dense3"),
                L.TimeDistributed(L.PReLU(), name="td_prelu"),  # one alpha for every step
                L.TimeDistributed(L.Softmax(), name="td_softmax"),
                L.TimeDistributed(L.Reshape((3, 1)), name="td_reshape"),
                L.Flatten(name="flat"),
                L.Dense(2, name="d2"),
            ],
            213,
        )
        if "softmax_v2" in keys:
            import tensorflow as tf

            seq(
                "softmax_v2",
                (5,),
                [L.Dense(4, activation=tf.nn.softmax, name="d_sm"), L.Dense(3, name="d3")],
                214,
                large=30.0,
            )
        seq("identity_only", (4, 5), [L.Identity(name="ident"), L.Dropout(0.5, name="drop")], 215)

    def conv_weights(self, model, seed):
        """Every convolution's kernel rescaled to unit gain (std 1/sqrt(fan in)) and a random bias,
        so biases count and activations stay in the range where float32 is exact enough."""
        np = self.np
        rng = np.random.default_rng(seed + self.seed_offset)
        for layer in leaf_layers(model):
            if "Conv" not in layer.__class__.__name__:
                continue
            new = []
            for i, weight in enumerate(layer.get_weights()):
                if weight.ndim == 1:
                    new.append(rng.normal(0.0, 0.3, weight.shape).astype(np.float32))
                    continue
                depthwise = (
                    i == 0 and "Depthwise" in layer.__class__.__name__ or "Separable" in layer.__class__.__name__
                )
                fan_in = int(np.prod(weight.shape[:-2] if depthwise and i == 0 else weight.shape[:-1]))
                new.append((rng.standard_normal(weight.shape) * 1.5 / np.sqrt(fan_in)).astype(np.float32))
            layer.set_weights(new)
        return model

    def build_cnn(self):
        """Convolutional networks: every convolution, pooling and pixel-moving layer over odd shapes,
        strides, dilations, both paddings, groups, depth multipliers, BatchNormalization folded
        into a linear convolution (and one left after an activated one)."""
        L = self.L
        layers = [
            L.Conv2D(13, 3, padding="same", activation="relu", name="c3_same"),
            L.BatchNormalization(name="bn_after_relu"),
            L.Conv2D(64, 5, strides=2, name="c5_s2_valid"),
            L.BatchNormalization(name="bn_folded"),
            L.Activation("relu", name="relu"),
            L.DepthwiseConv2D(3, padding="same", depth_multiplier=2, dilation_rate=2, activation="tanh", name="dw_d2"),
            L.MaxPooling2D(2, padding="same", name="max_same"),
            L.SeparableConv2D(3, 3, padding="same", activation="elu", name="sep"),
            L.ZeroPadding2D(((1, 2), (0, 1)), name="zpad"),
            L.Conv2D(12, 1, name="pointwise"),
            L.Cropping2D(((1, 0), (0, 1)), name="crop"),
            L.UpSampling2D((2, 3), name="up"),
            L.AveragePooling2D(3, strides=2, padding="same", name="avg_same"),
            L.Conv2D(6, 3, padding="same", dilation_rate=2, groups=2, activation="sigmoid", name="c3_d2_g2"),
            L.DepthwiseConv2D(3, strides=2, name="dw_s2_valid"),
            L.BatchNormalization(name="bn_dw_folded"),
            L.GlobalAveragePooling2D(name="gap"),
            L.Dense(3, activation="softmax", name="head"),
        ]
        x = self.inputs((13, 13, 3), seed=20)
        model = self.conv_weights(self.sequential((13, 13, 3), layers, "cnn"), 20)
        self.add("cnn", self.calibrate(model, x, 20), x)

        layers = [
            L.Conv1D(13, 5, padding="causal", dilation_rate=2, activation="relu", name="c5_causal"),
            L.MaxPooling1D(2, name="max"),
            L.Conv1D(7, 3, strides=2, padding="same", name="c3_s2_same"),
            L.AveragePooling1D(2, padding="same", name="avg_same"),
            L.UpSampling1D(3, name="up"),
            L.ZeroPadding1D((2, 1), name="zpad"),
            L.Cropping1D((1, 3), name="crop"),
            L.Conv1D(4, 3, groups=1, activation="swish", name="c3"),
            L.GlobalMaxPooling1D(name="gmax"),
            L.Dense(3, name="head"),
        ]
        x = self.inputs((31, 3), seed=21)
        model = self.conv_weights(self.sequential((31, 3), layers, "cnn1d"), 21)
        self.add("cnn1d", self.calibrate(model, x, 21), x)

        layers = [
            L.Conv2D(3, 7, strides=2, activation="relu", name="c7_s2"),
            L.MaxPooling2D(3, strides=1, name="max_s1"),
            L.Conv2D(64, 3, padding="same", name="c3_to64"),
            L.GlobalMaxPooling2D(name="gmax"),
            L.Dense(5, activation="softmax", name="head"),
        ]
        x = self.inputs((31, 31, 1), seed=22)
        model = self.conv_weights(self.sequential((31, 31, 1), layers, "cnn_odd"), 22)
        self.add("cnn_odd", self.calibrate(model, x, 22), x)

    def build_digits(self):
        """A 64-32-10 MLP trained on scikit-learn's bundled digits (fixed split)."""
        np, K, L = self.np, self.K, self.L
        import importlib.util

        if importlib.util.find_spec("sklearn") is None:
            print("keras_zoo: scikit-learn is not installed; the digits model is left out", file=sys.stderr)
            return
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        digits = load_digits()
        x = (digits.data / 16.0).astype(np.float32)
        x_train, x_test, y_train, y_test = train_test_split(
            x, digits.target, test_size=0.25, random_state=0, stratify=digits.target
        )
        K.utils.set_random_seed(0)
        model = K.Sequential(
            [
                K.Input((64,)),
                L.Dense(32, activation="relu", name="hidden"),
                L.Dropout(0.1, name="drop"),
                L.Dense(10, activation="softmax", name="out"),
            ],
            name="digits",
        )
        optimizer = K.optimizers.Adam(learning_rate=0.01)
        model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
        model.fit(x_train, y_train, epochs=15, batch_size=64, verbose=0)
        probabilities = np.asarray(model(x_test, training=False))
        accuracy = float((probabilities.argmax(1) == y_test).mean())
        self.add(
            "digits", model, x_test, batch_sizes=[1, 7, 100, len(x_test)], extra={"labels": y_test.astype(np.int64)}
        )
        self.models["digits"]["accuracy"] = accuracy

    # ------------------------------------------------------------------ error models
    def build_errors(self):
        L = self.L
        # Supported layers around unsupported ones: Masking, a ConvLSTM1D whose activation is a softmax
        # (over its filters: not element-wise), the generic RNN wrapper of a cell and a Dense with an
        # activation malinn does not have.
        layers = [
            L.Dense(12, name="ok_dense"),
            L.Masking(name="bad_masking"),
            L.Reshape((3, 4, 1), name="ok_reshape"),
            L.ConvLSTM1D(4, 2, activation="softmax", name="bad_conv"),
            L.RNN(L.LSTMCell(5), name="bad_lstm"),
            L.Dense(3, activation="log_softmax", name="bad_logsm"),
            L.Activation("relu", name="ok_relu"),
        ]
        model = self.sequential((12,), layers, "unsupported")
        self.randomize(model, 7)
        self.add("unsupported", model)

        # Softmax over the last axis of a (4, 7) sample (not the flattened features), then Flatten.
        layers = [L.Softmax(name="softmax_rows"), L.Flatten(name="flat"), L.Dense(3, name="d3")]
        x = self.inputs((4, 7), seed=8)
        self.add("softmax_multiaxis", self.calibrate(self.sequential((4, 7), layers, "softmax_multiaxis"), x, 8), x)

        # A Dense on a (4, 7) sample works on the last axis; malinn must not flatten silently.
        layers = [L.Dense(3, name="d3_on_rows"), L.Flatten(name="flat"), L.Dense(2, name="d2")]
        x = self.inputs((4, 7), seed=9)
        self.add("dense_multiaxis", self.calibrate(self.sequential((4, 7), layers, "dense_multiaxis"), x, 9), x)

    def build_tensorflow_formats(self, small, folder):
        """TensorFlow's own formats of a small model: a SavedModel directory and a .tflite file."""
        import tensorflow as tf

        saved = os.path.join(folder, "small_savedmodel")
        small.export(saved, verbose=False)
        self.tensorflow_files["savedmodel"] = f"{self.generation}/small_savedmodel"
        with open(os.path.join(folder, "small.tflite"), "wb") as fh:
            fh.write(tf.lite.TFLiteConverter.from_saved_model(saved).convert())
        self.tensorflow_files["tflite"] = f"{self.generation}/small.tflite"

    # ------------------------------------------------------------------ custom objects
    def build_custom(self):
        """Custom objects named like Keras built-ins (see :data:`CUSTOM_MODELS`).

        Keras itself loads these files only with the custom code at hand; without it, the
        names would read as Keras's Dense, Sequential and relu, and compute half the result.
        """
        K, L = self.K, self.L
        register = K.saving.register_keras_serializable

        class Dense(L.Dense):
            """Keras's Dense, doubled; its config says class_name "Dense"."""

            def call(self, inputs):
                return 2 * super().call(inputs)

        Dense.__module__ = "adv.layers"  # a module of its own (not __main__, written as null)
        register(package="adv", name="Dense")(Dense)

        class AdvSequential(K.Sequential):
            """A Sequential whose call doubles the result."""

            def call(self, inputs, training=None, mask=None):
                return 2 * super().call(inputs, training=training, mask=mask)

        register(package="adv")(AdvSequential)

        def relu(x):
            return 2 * K.activations.relu(x)

        register(package="adv", name="relu")(relu)

        model = K.Sequential([K.Input((4,)), Dense(3, name="d_adv"), L.Dense(2, name="d2")], name="custom_dense")
        self.randomize(model, 30)
        self.add("custom_dense", model, kind="custom")

        model = AdvSequential([K.Input((4,)), L.Dense(3, name="d3")], name="doubled")
        self.randomize(model, 31)
        self.add("custom_sequential", model, kind="custom")

        model = K.Sequential(
            [
                K.Input((4,)),
                L.Dense(3, activation=relu, name="d_adv_relu"),
                L.Activation(relu, name="act_adv_relu"),
                L.Dense(1, name="d1"),
            ],
            name="custom_activation",
        )
        self.randomize(model, 32)
        self.add("custom_activation", model, kind="custom")

    # ------------------------------------------------------------------ normalization statistics
    def build_statistics(self):
        """The models of :func:`statistics_models`, each on constant, offset, huge and plain samples
        (one file: the statistics do not depend on the format)."""
        L, np = self.L, self.np
        for key in statistics_models(self.generation):
            n, rms = int(key.split("_")[2]), key.endswith("_rms")
            rng = np.random.default_rng(300 + n + rms + self.seed_offset)
            rows = [np.full(n, v) for v in (1e10, -1e10, 65504.0, 3e4, 1e4, 1.0, 0.0, 1e-30, 1e38, 3e38, -3e38)]
            rows += [1e4 + rng.standard_normal(n) * spread for spread in (1e-2, 1e-2, 1.0, 1.0)]
            rows += [-5e5 + rng.standard_normal(n) * 3.0] + [
                rng.standard_normal(n) * s for s in (1.0, 100.0, 1e18, 1e30)
            ]
            model = self.sequential(
                (n,), [L.LayerNormalization(name="ln", **({"rms_scaling": True} if rms else {}))], key
            )
            self.jitter(model, 300 + n)
            self.add(
                key,
                model,
                np.array(rows, np.float32),
                layer_outputs=False,
                suffixes=(".keras",) if self.generation == "keras3" else (".h5",),
            )

    # ------------------------------------------------------------------ input dtypes
    def build_input_dtypes(self):
        """``input_<dtype>`` for each of :data:`INPUT_DTYPES`, and ``input_dtypes_graph``: an int32
        and a uint8 input, each through a Dense of the identity, added. Keras's outputs come from
        its ``predict`` (``y``; the graph's inputs ``x_a`` and ``x_b``)."""
        K, L, np = self.K, self.L, self.np
        x = np.array(INPUT_DTYPE_VALUES, np.float32)
        suffixes = (".keras",) if self.generation == "keras3" else (".h5",)

        def identity(name):
            return L.Dense(4, use_bias=False, kernel_initializer="identity", name=name)

        def add(key, model, data):
            entry = self.add(key, model, layer_outputs=False, suffixes=suffixes)
            np.savez(os.path.join(self.outdir, self.generation, key + ".data.npz"), **data)
            entry["data"] = f"{self.generation}/{key}.data.npz"
            entry["input_shape"] = [4]  # the graph's first input's too, as the readers give a graph's

        for dtype in INPUT_DTYPES:
            model = K.Sequential([K.Input((4,), dtype=dtype), identity("d")], name=f"input_{dtype}")
            add(f"input_{dtype}", model, {"x": x, "y": plain(model.predict(x, verbose=0))})
        a, b = K.Input((4,), dtype="int32", name="a_int32"), K.Input((4,), dtype="uint8", name="b_uint8")
        model = K.Model([a, b], L.Add(name="add")([identity("da")(a), identity("db")(b)]), name="input_dtypes_graph")
        add(
            "input_dtypes_graph",
            model,
            {"x_a": x, "x_b": x[::-1].copy(), "y": plain(model.predict([x, x[::-1].copy()], verbose=0))},
        )

    # ------------------------------------------------------------------ Dense variants
    def build_variants(self):
        """bfloat16 weights, LoRA and int8 quantization (see :data:`VARIANT_MODELS`)."""
        K, L, np = self.K, self.L, self.np

        # bfloat16 variables: a Dense and a BatchNormalization in bfloat16, a float32 Dense. The
        # file's weights are bfloat16 (exactly float32 values); Keras also computes those layers
        # in bfloat16, so y_float32 is the same model with the same weights in float32.
        def bf16_layers(dtype):
            return [
                L.Dense(13, activation="relu", name="d13_bf16", dtype=dtype),
                L.BatchNormalization(name="bn_bf16", dtype=dtype),
                L.Dense(3, name="d3"),
            ]

        x = self.inputs((5,), seed=40)
        model = self.calibrate(self.sequential((5,), bf16_layers("bfloat16"), "bf16"), x, 40)
        twin = self.sequential((5,), bf16_layers("float32"), "bf16_twin")
        for mine, theirs in zip(leaf_layers(twin), leaf_layers(model)):
            mine.set_weights([plain(w) for w in theirs.get_weights()])
        assert model.layers[0].get_weights()[0].dtype.name == "bfloat16", "no bfloat16 weights"
        self.add("bfloat16", model, x, layer_outputs=False, extra={"y_float32": np.asarray(twin(x, training=False))})

        if not hasattr(L.Dense, "enable_lora") or not hasattr(K.Model, "quantize"):
            print(f"keras_zoo: {self.generation} has no LoRA / quantize; those models are left out", file=sys.stderr)
            return

        # LoRA on two Dense layers (one without bias); lora_alpha != rank makes the scale matter.
        layers = [
            L.Dense(13, activation="tanh", name="d13_lora"),
            L.Dense(3, use_bias=False, name="d3_lora"),
            L.Dense(1, name="d1"),
        ]
        x = self.inputs((5,), seed=41)
        model = self.calibrate(self.sequential((5,), layers, "lora"), x, 41)
        rng = np.random.default_rng(41)
        for name, rank, alpha in (("d13_lora", 2, 6), ("d3_lora", 3, None)):
            layer = model.get_layer(name)
            layer.enable_lora(rank, lora_alpha=alpha)
            a, b = layer.lora_kernel_a, layer.lora_kernel_b
            a.assign(rng.standard_normal(a.shape).astype(np.float32) / np.sqrt(a.shape[0]))
            b.assign(rng.standard_normal(b.shape).astype(np.float32) * 0.3)
        self.add("lora", model, x)

        layers = [L.Dense(13, activation="relu", name="d13_int8"), L.Dense(3, name="d3_int8")]
        x = self.inputs((5,), seed=42)
        model = self.calibrate(self.sequential((5,), layers, "int8"), x, 42)
        model.quantize("int8")
        self.add("int8", model, kind="variant")

        # QLoRA: LoRA on an int8 Dense; a .keras archive holds the factors merged into the int8
        # kernel and its scale, an .h5 holds them apart
        x = self.inputs((5,), seed=43)
        model = self.calibrate(
            self.sequential(
                (5,), [L.Dense(7, activation="tanh", name="d7_qlora"), L.Dense(3, name="d3_int8")], "int8_lora"
            ),
            x,
            43,
        )
        model.quantize("int8")
        layer = model.get_layer("d7_qlora")
        layer.enable_lora(2)
        rng = np.random.default_rng(43)
        layer.lora_kernel_a.assign(rng.standard_normal(layer.lora_kernel_a.shape).astype(np.float32) * 0.5)
        layer.lora_kernel_b.assign(rng.standard_normal(layer.lora_kernel_b.shape).astype(np.float32) * 0.5)
        self.add("int8_lora", model, x, kind="variant")

    # ------------------------------------------------------------------ reader models
    def reader_layers(self, first_kwargs):
        L = self.L
        return [
            L.Flatten(name="flat", **first_kwargs),
            L.Dense(13, activation="relu", name="d13"),
            L.BatchNormalization(name="bn_full"),
            L.Dropout(0.25, name="drop"),
            L.Dense(3, activation="tanh", name="d3"),
            L.BatchNormalization(center=False, name="bn_nocenter"),
            L.ReLU(max_value=6.0, negative_slope=0.1, threshold=0.5, name="relu_layer"),
            L.Dense(13, use_bias=False, name="d13_nobias"),
            L.BatchNormalization(scale=False, name="bn_noscale"),
            L.LeakyReLU(0.2, name="leaky"),
            L.ELU(0.5, name="elu"),
            L.Dense(1, activation="sigmoid", name="d1"),
            L.BatchNormalization(center=False, scale=False, name="bn_bare"),
            L.Activation("hard_sigmoid", name="act_hs"),
            L.Dense(3, name="d3b"),
            L.Softmax(name="smax"),
        ]

    def build_readers(self):
        """The models of the reader tests: a Sequential of every layer, a Functional chain, a
        branching Functional, a nested model, names long enough to split layer_names..."""
        K, L = self.K, self.L
        k3 = self.generation == "keras3"
        if k3:
            zoo = K.Sequential([K.Input((4, 7))] + self.reader_layers({}), name="zoo")
        else:
            zoo = K.Sequential(self.reader_layers({"input_shape": (4, 7)}), name="zoo")
        self.randomize(zoo, 1)
        self.add("zoo", zoo, kind="reader")

        inputs = K.Input((5,), name="x")
        h = L.Dense(3, activation="gelu", name="f_gelu")(inputs)
        h = L.Dropout(0.5, name="f_drop")(h)
        outputs = L.Dense(1, name="f_out")(h)
        chain = K.Model(inputs, outputs, name="chain")
        self.randomize(chain, 2)
        self.add("chain", chain, kind="reader")

        inputs = K.Input((5,), name="bx")
        left = L.Dense(2, name="left")(inputs)
        right = L.Dense(2, name="right")(inputs)
        self.add("branch", K.Model(inputs, L.Add(name="add")([left, right]), name="branch"), kind="reader")

        inner = K.Sequential(
            [K.Input((4,)), L.Dense(3, name="inner_a"), L.Dense(2, activation="relu", name="inner_b")], name="inner"
        )
        nested = K.Sequential(
            [K.Input((6,)), L.Dense(4, name="outer_a"), inner, L.Dense(1, name="outer_b")], name="nested"
        )
        self.randomize(nested, 3)
        self.add("nested", nested, kind="reader")

        # A saved model loaded and wrapped with a new head (transfer learning): Keras names the new
        # head 'dense' again, beside the encoder's own 'dense' (names are unique per model only)
        encoder = K.Sequential(
            [K.Input((8,)), L.Dense(16, activation="relu", name="dense"), L.Dense(8, name="dense_1")], name="encoder"
        )
        tx = K.Input((8,), name="tx")
        transfer = K.Model(tx, L.Dense(3, activation="softmax", name="dense")(encoder(tx)), name="transfer")
        self.randomize(transfer, 4)
        self.add("nested_names", transfer, self.uniform((8,), seed=4), layer_outputs=False, kind="reader")
        # the same names at three depths of a graph, the nested model called twice
        ii = K.Input((5,), name="ii")
        deep = K.Model(ii, L.Dense(5, activation="relu", name="dense")(ii), name="deep")
        mi = K.Input((5,), name="mi")
        mid = K.Model(mi, L.Add(name="add")([deep(mi), L.Dense(5, name="dense_1")(mi)]), name="mid")
        gx = K.Input((5,), name="gx")
        a = mid(L.Dense(5, name="dense")(gx))
        out = L.Dense(2, name="dense_1")(L.Concatenate(name="cat")([a, mid(a)]))
        graph = K.Model(gx, out, name="nested_names_graph")
        self.randomize(graph, 5)
        self.add("nested_names_graph", graph, self.uniform((5,), seed=5), layer_outputs=False, kind="reader")

        # Enough long layer names that Keras writes layer_names0, layer_names1, ...
        body = [L.Dropout(0.0, name=f"drop_{i:02d}_" + "n" * 1000) for i in range(70)]
        if k3:
            split = K.Sequential([K.Input((4,)), L.Dense(3, name="first")] + body, name="split")
        else:
            split = K.Sequential([L.Dense(3, name="first", input_shape=(4,))] + body, name="split")
        self.add("split", split, suffixes=(".h5",), kind="reader")

        folder = os.path.join(self.outdir, self.generation)
        if k3:
            cx = K.Input((3,), name="cx")  # x * 2.0: an operation with a constant operand
            # beside an unsupported layer: both are named in one message
            self.add(
                "constant_operand",
                K.Model(
                    cx, [L.Dense(3, name="c_dense")(cx) * 2.0, L.Masking(name="c_mask")(cx)], name="constant_operand"
                ),
                kind="reader",
            )
            # an operation a + b before a layers.Add: Keras numbers the layers' weight groups alone
            ox = K.Input((4,), name="ox")
            d1, d2 = L.Dense(4, name="op_d1")(ox), L.Dense(4, name="op_d2")(ox)
            op_first = K.Model(ox, L.Dense(2, name="op_out")(L.Add(name="res_add")([d1 + d2, d1])), name="op_first")
            self.randomize(op_first, 7)
            self.add("operation_before_layer", op_first, self.uniform((4,), seed=7), layer_outputs=False, kind="reader")
            # an input whose shape is not fully known apart from the batch
            self.add(
                "unknown_shape",
                K.Sequential([K.Input((None, 4)), L.Dense(2, name="u_dense")], name="unknown_shape"),
                kind="reader",
            )
            # ZeroPadding1D over the steps of a channels-first sequence: malinn runs channels last only
            self.add(
                "zero_padding1d_channels_first",
                K.Sequential(
                    [
                        K.Input((4, 6)),
                        L.ZeroPadding1D(1, data_format="channels_first", name="zp_cf"),
                        L.Flatten(name="flat"),
                        L.Dense(2, name="zp_dense"),
                    ],
                    name="zp_cf",
                ),
                kind="reader",
            )
            small = K.Sequential([K.Input((3,)), L.Dense(2, name="small")], name="small")
            small.save_weights(os.path.join(folder, "small.weights.h5"))
            self.build_tensorflow_formats(small, folder)
            self.add(
                "weights_only",
                None,
                suffixes=(),
                kind="reader",
                files={"files": {"keras3-h5": f"{self.generation}/small.weights.h5"}},
            )
            small.save(os.path.join(folder, "small_dir"), zipped=False)  # an unzipped .keras
            self.add(
                "unzipped",
                small,
                suffixes=(),
                kind="reader",
                files={"files": {"keras3-zip": f"{self.generation}/small_dir"}},
            )
            # An unbuilt model: no input shape, so no weights.
            unbuilt = K.Sequential([L.Dense(3, name="lonely")])
            unbuilt.save(os.path.join(folder, "unbuilt.keras"))
            self.models["unbuilt"] = {
                "key": "unbuilt",
                "generation": self.generation,
                "kind": "reader",
                "files": {"keras3-zip": f"{self.generation}/unbuilt.keras"},
            }
        else:
            tx = K.Input((4,), name="tx")  # h * 2.0 in tf_keras: a TFOpLambda whose node is one flat reference
            self.add(
                "tf_op_lambda",
                K.Model(tx, L.Dense(2, name="t_out")(L.Dense(4, name="t_dense")(tx) * 2.0), name="tf_op_lambda"),
                suffixes=(".h5",),
                kind="reader",
            )
            small = K.Sequential([L.Dense(2, name="small", input_shape=(3,))])
            small.save_weights(os.path.join(folder, "small_weights.h5"))
            small.save_weights(os.path.join(folder, "ckpt", "small"))  # a TensorFlow checkpoint
            self.tensorflow_files["checkpoint"] = f"{self.generation}/ckpt/small"
            self.add(
                "weights_only",
                None,
                suffixes=(),
                kind="reader",
                files={"files": {"keras2-h5": f"{self.generation}/small_weights.h5"}},
            )


def main(argv):
    if len(argv) != 1:
        print(__doc__.split("\n\n")[0], "\nusage: python3 tests/keras_zoo.py OUTDIR", file=sys.stderr)
        return 2
    outdir = os.path.abspath(argv[0])
    os.makedirs(outdir, exist_ok=True)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    import importlib
    import warnings

    warnings.filterwarnings("ignore")
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    try:
        import absl.logging

        absl.logging.set_verbosity(absl.logging.ERROR)
    except ImportError:
        pass
    started = time.time()
    manifest = {
        "versions": {"tensorflow": tf.__version__},
        "formats": {},
        "models": {},
        "timings": {},
        "split_formats": {},
        "tensorflow_files": {},
    }
    for generation, module in MODULES.items():
        try:
            K = importlib.import_module(module)
        except ImportError as exc:
            print(f"keras_zoo: {module} is not installed ({exc}); its formats are left out", file=sys.stderr)
            continue
        if GENERATIONS[generation] == 3 and not K.__version__.startswith("3."):
            print(f"keras_zoo: keras {K.__version__} is not Keras 3; left out", file=sys.stderr)
            continue
        t = time.time()
        zoo = Zoo(outdir, generation, K)
        zoo.build_equivalence()
        zoo.build_errors()
        zoo.build_readers()
        zoo.build_custom()
        zoo.build_variants()
        zoo.build_statistics()
        zoo.build_input_dtypes()
        manifest["versions"][generation] = K.__version__
        for fmt, (gen, suffix) in FORMATS.items():
            if gen == generation:
                manifest["formats"][fmt] = {
                    "generation": generation,
                    "suffix": suffix,
                    "keras_version": K.__version__,
                    "keras_major": GENERATIONS[generation],
                    "reader_format": READER_FORMAT[fmt],
                }
        for fmt, (gen, arch_suffix, weights_suffix) in SPLIT_FORMATS.items():
            if gen == generation:
                manifest["split_formats"][fmt] = {
                    "generation": generation,
                    "keras_version": K.__version__,
                    "keras_major": GENERATIONS[generation],
                    "weights_suffix": weights_suffix,
                    "reader_format": SPLIT_READER_FORMAT[fmt],
                }
        manifest["tensorflow_files"].update(zoo.tensorflow_files)
        if GENERATIONS[generation] == 3:  # what each window layer takes, for the converter's table
            import inspect

            manifest["keras3_layer_arguments"] = {
                name: [p for p in inspect.signature(getattr(K.layers, name).__init__).parameters if p != "self"]
                for name in ARGUMENT_LAYERS
            }
        for key, entry in zoo.models.items():
            manifest["models"][f"{generation}/{key}"] = entry
        manifest["timings"][generation] = round(time.time() - t, 2)
    manifest["timings"]["total"] = round(time.time() - started, 2)
    with open(os.path.join(outdir, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1, default=_json_default)
    print(
        f"keras_zoo: {len(manifest['models'])} models in {outdir} "
        f"({manifest['timings']['total']} s after importing TensorFlow)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
