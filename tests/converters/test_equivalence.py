"""malinn against Keras: every supported layer and activation, in every Keras file format.

The Keras side comes from the zoo (tests/keras_zoo.py, run once per test run in a process of its
own: TensorFlow and PoCL cannot share one). For each format (Keras 3 ``.keras``, Keras 3 ``.h5``,
tf_keras ``.h5``, tf_keras ``.keras``) and each model, ``malinn.load_model`` must give Keras's
outputs within ``1e-5 x max(1, max |Keras|)`` in float32, at batch sizes 1, 7, 100 (and 10,000
for one model), and layer by layer; ``convert -> load -> predict`` must equal
``load -> predict`` bit for bit.
"""

from __future__ import annotations

import os
import sys

import h5py
import numpy as np
import pytest
from keras_zoo import FORMATS, equivalence_models

import malinn

RTOL = 1e-5

#: Keras layers that do nothing at inference (malinn drops them, or folds their name in).
NO_OPS = {
    "Dropout",
    "GaussianNoise",
    "AlphaDropout",
    "GaussianDropout",
    "ActivityRegularization",
    "Identity",
    "SpatialDropout1D",
    "SpatialDropout2D",
    "SpatialDropout3D",
    "InputLayer",
}


def cases():
    for fmt, (generation, _) in FORMATS.items():
        for key in equivalence_models(generation):
            yield pytest.param(fmt, key, id=f"{fmt}-{key}")


CASES = list(cases())
FORMAT_PARAMS = [pytest.param(fmt, id=fmt) for fmt in FORMATS]


def assert_keras_close(got, want, what):
    """max |got - want| <= 1e-5 x max(1, max |want|), float32 output of Keras's own shape."""
    want = np.asarray(want, dtype=np.float32)
    assert got.dtype == np.float32, f"{what}: dtype {got.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, Keras {want.shape}"
    assert np.isfinite(want).all(), f"{what}: the Keras reference is not finite (zoo problem)"
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max())
    assert err <= RTOL * scale, (
        f"{what}: max |malinn - Keras| = {err:.3g} > {RTOL:g} x {scale:.3g} (relative {err / scale:.3g})"
    )


def load(keras_zoo, fmt, key):
    return malinn.load_model(keras_zoo.path(fmt, key))


def group_of(model, keras_name):
    """The malinn layer that stands for the Keras layer ``keras_name``."""
    found = [layer for layer in model.layers if keras_name in layer.keras_names]
    assert len(found) == 1, f"Keras layer {keras_name!r} is in {len(found)} malinn layers"
    return found[0]


def test_tensorflow_is_not_loaded_in_the_test_process(keras_zoo):
    """PoCL breaks once TensorFlow is in the process: the zoo must have run elsewhere."""
    assert keras_zoo.versions.get("tensorflow")
    for module in ("tensorflow", "keras", "tf_keras"):
        assert module not in sys.modules, f"{module} was imported into the pytest process"


@pytest.mark.parametrize("fmt,key", CASES)
@pytest.mark.formats_once
def test_predict_matches_keras(keras_zoo, device, fmt, key):
    entry = keras_zoo.require(fmt, key)
    data = keras_zoo.data(fmt, key)
    model = load(keras_zoo, fmt, key)
    assert isinstance(model, malinn.Sequential)
    assert model.input_shape == (None,) + tuple(entry["input_shape"])  # Keras's, the batch axis first
    for batch in entry["batch_sizes"]:
        x = data["x"][:batch]
        assert x.shape[0] == batch
        assert_keras_close(model.predict(x), data["y"][:batch], f"{fmt} {key} batch {batch}")


@pytest.mark.parametrize("fmt,key", CASES)
@pytest.mark.formats_once
def test_layer_by_layer_matches_keras(keras_zoo, device, fmt, key):
    entry = keras_zoo.require(fmt, key)
    data = keras_zoo.data(fmt, key)
    model = load(keras_zoo, fmt, key)
    x = data["x"][:100]
    outputs = model.predict_layers(x)
    assert len(outputs) == len(model.layers)

    # keras_names: every Keras layer that computes something, once, in Keras's order.
    keras_order = [layer["name"] for layer in entry["layers"]]
    named = [name for layer in model.layers for name in layer.keras_names]
    assert all(layer.keras_names for layer in model.layers), [l.name for l in model.layers]
    assert len(set(named)) == len(named), named
    assert named == [n for n in keras_order if n in named], (named, keras_order)
    computing = [layer["name"] for layer in entry["layers"] if layer["class_name"] not in NO_OPS]
    assert set(computing) <= set(named), sorted(set(computing) - set(named))

    for layer, out in zip(model.layers, outputs):
        last = layer.keras_names[-1]
        assert_keras_close(
            out,
            data[f"layer:{last}"][:100],
            f"{fmt} {key}: malinn layer {layer.name!r} {layer.keras_names} vs Keras {last!r}",
        )
    # a plan that keeps every layer may not fuse what predict fuses (a softmax after its Dense), and a
    # fused head sums K in another order: equal within float32 rounding, not bit for bit
    np.testing.assert_allclose(outputs[-1], model.predict(x), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("fmt", FORMAT_PARAMS)
def test_batchnorm_after_linear_dense_is_folded(keras_zoo, device, fmt):
    model = load(keras_zoo, fmt, "batchnorm")
    for dense, bn in [("d_lin", "bn_folded"), ("d_nobias", "bn_nocenter_folded"), ("d1", "bn_last")]:
        layer = group_of(model, bn)
        assert isinstance(layer, malinn.layers.Dense), (bn, type(layer).__name__)
        assert dense in layer.keras_names, (bn, layer.keras_names)
    for bn, before in [
        ("bn_input", None),
        ("bn_after_act", "d_tanh"),
        ("bn_noscale", "d_relu"),
        ("bn_bare", "bn_noscale"),
    ]:
        layer = group_of(model, bn)
        assert isinstance(layer, malinn.layers.BatchNormalization), (bn, type(layer).__name__)
        assert before not in layer.keras_names
    assert isinstance(group_of(load(keras_zoo, fmt, "multiaxis"), "bn_folded"), malinn.layers.Dense)


@pytest.mark.parametrize("fmt", FORMAT_PARAMS)
def test_zoo_batchnorm_statistics_are_not_trivial(keras_zoo, fmt):
    """Folding is only tested if moving mean / variance are far from 0 / 1."""
    entry = keras_zoo.require(fmt, "batchnorm")
    for layer, weights in zip(entry["layers"], keras_zoo.weights(fmt, "batchnorm")):
        if layer["class_name"] == "BatchNormalization":
            mean, variance = weights[-2], weights[-1]
            assert np.abs(mean).max() > 0.1 and np.abs(variance - 1).max() > 0.1, layer["name"]


@pytest.mark.parametrize("fmt", FORMAT_PARAMS)
def test_hard_sigmoid_follows_the_files_keras_generation(keras_zoo, device, fmt):
    """Keras 2: clip(0.2 x + 0.5, 0, 1); Keras 3: clip(x / 6 + 0.5, 0, 1). The zoo's inputs
    reach where the two differ, and malinn gives the file's own one."""
    major = keras_zoo.require(fmt)["keras_major"]
    data = keras_zoo.data(fmt, "act_hard_sigmoid")
    z, keras_out = data["layer:dense_lin"].astype(np.float64), data["layer:act"]
    keras2 = np.clip(0.2 * z + 0.5, 0.0, 1.0)
    keras3 = np.clip(z / 6.0 + 0.5, 0.0, 1.0)
    mine, other = (keras2, keras3) if major == 2 else (keras3, keras2)
    np.testing.assert_allclose(keras_out, mine, atol=1e-6)
    assert np.abs(keras_out - other).max() > 0.05
    model = load(keras_zoo, fmt, "act_hard_sigmoid")
    outputs = model.predict_layers(data["x"])
    got = outputs[model.layers.index(group_of(model, "act"))]
    assert_keras_close(got, keras_out, f"{fmt} hard_sigmoid (Keras {major})")


def test_big_batch_in_every_format(keras_zoo, device):
    """Batch 10,000 (one pass and in chunks of 999) for the small model of each format."""
    checked = 0
    for fmt in FORMATS:
        if fmt not in keras_zoo.formats:
            continue
        data = keras_zoo.data(fmt, "tiny")
        assert data["x"].shape[0] == 10_000
        model = load(keras_zoo, fmt, "tiny")
        assert_keras_close(model.predict(data["x"]), data["y"], f"{fmt} tiny batch 10000")
        assert_keras_close(
            model.predict(data["x"], batch_size=999), data["y"], f"{fmt} tiny batch 10000 in chunks of 999"
        )
        checked += 1
    assert checked == len(keras_zoo.formats) > 0


@pytest.mark.parametrize("fmt", FORMAT_PARAMS)
def test_digits_model_agrees_with_keras_on_every_test_sample(keras_zoo, device, fmt):
    entry = keras_zoo.require(fmt, "digits")
    data = keras_zoo.data(fmt, "digits")
    x, labels, keras_probabilities = data["x"], data["labels"], data["y"]
    assert x.shape == (450, 64) and labels.shape == (450,)
    keras_classes = keras_probabilities.argmax(axis=1)
    assert entry["accuracy"] > 0.9 and (keras_classes == labels).mean() > 0.9  # it did learn
    probabilities = load(keras_zoo, fmt, "digits").predict(x)
    assert_keras_close(probabilities, keras_probabilities, f"{fmt} digits")
    classes = probabilities.argmax(axis=1)
    disagree = np.flatnonzero(classes != keras_classes)
    assert disagree.size == 0, f"malinn and Keras disagree on samples {disagree.tolist()}"


@pytest.mark.parametrize("fmt", FORMAT_PARAMS)
def test_softmax_over_rows_before_flatten_is_right_or_rejected(keras_zoo, device, fmt):
    """Keras's Softmax on a (4, 7) sample runs over the 7 values of each row, not over all 28."""
    path = keras_zoo.path(fmt, "softmax_multiaxis")
    data = keras_zoo.data(fmt, "softmax_multiaxis")
    try:
        model = malinn.load_model(path)
    except malinn.ConversionError as exc:
        assert "softmax_rows" in str(exc) and path.name in str(exc), str(exc)
        return
    assert_keras_close(model.predict(data["x"]), data["y"], f"{fmt} softmax over rows")


@pytest.mark.parametrize("fmt", FORMAT_PARAMS)
def test_dense_on_a_multi_axis_sample_is_right_or_rejected(keras_zoo, device, fmt):
    """Keras's Dense on a (4, 7) sample works on the last axis (no implicit flatten)."""
    path = keras_zoo.path(fmt, "dense_multiaxis")
    data = keras_zoo.data(fmt, "dense_multiaxis")
    try:
        model = malinn.load_model(path)
    except malinn.ConversionError as exc:
        assert "d3_on_rows" in str(exc) and path.name in str(exc), str(exc)
        return
    assert_keras_close(model.predict(data["x"]), data["y"], f"{fmt} Dense on rows")


# ---------------------------------------------------------------------------------------------
# round trip through a malinn model file


@pytest.mark.parametrize("fmt,key", CASES)
@pytest.mark.formats_once
def test_convert_round_trip_is_bit_for_bit(keras_zoo, device, tmp_path, fmt, key):
    src = keras_zoo.path(fmt, key)
    x = keras_zoo.data(fmt, key)["x"][:100]
    direct = malinn.load_model(src)
    dst = tmp_path / f"{key}.malinn"
    written = malinn.convert(src, dst)
    assert written == dst and isinstance(written, os.PathLike)
    assert sorted(os.listdir(tmp_path)) == [dst.name]  # no temporary file left beside it
    assert h5py.is_hdf5(dst)
    converted = malinn.load_model(dst)
    assert [type(l).__name__ for l in converted.layers] == [type(l).__name__ for l in direct.layers]
    assert [l.keras_names for l in converted.layers] == [l.keras_names for l in direct.layers]
    assert tuple(converted.input_shape) == tuple(direct.input_shape)
    expected = direct.predict(x)
    got = converted.predict(x)
    assert got.dtype == expected.dtype == np.float32
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(converted.predict(x[:1]), direct.predict(x[:1]))


@pytest.mark.parametrize("fmt", FORMAT_PARAMS)
def test_save_round_trip_is_bit_for_bit(keras_zoo, device, tmp_path, fmt):
    x = keras_zoo.data(fmt, "batchnorm")["x"]
    direct = load(keras_zoo, fmt, "batchnorm")
    expected = direct.predict(x)
    direct.save(tmp_path / "saved.malinn")
    again = malinn.load_model(tmp_path / "saved.malinn")
    np.testing.assert_array_equal(again.predict(x), expected)
    # and a malinn file converted again is the same model
    malinn.convert(tmp_path / "saved.malinn", tmp_path / "again.malinn")
    np.testing.assert_array_equal(malinn.load_model(tmp_path / "again.malinn").predict(x), expected)


def test_every_target_loads_to_the_same_predictions(keras_zoo, device, tmp_path):
    """A file laid out for another kernel is re-laid out at load: same numbers on this device."""
    src = keras_zoo.path("keras3-zip", "wide")
    x = keras_zoo.data("keras3-zip", "wide")["x"][:7]
    expected = malinn.load_model(src).predict(x)
    targets = ["cpu", "gpu"] + list(malinn.load_library().codenames("matmul"))
    assert len(targets) > 3
    for target in targets:
        dst = tmp_path / f"wide_{target}.malinn"
        assert malinn.convert(src, dst, target=target) == dst
        np.testing.assert_array_equal(malinn.load_model(dst).predict(x), expected, err_msg=target)


@pytest.mark.parametrize("fmt", FORMAT_PARAMS)
def test_batchnorm_after_linear_convolution_is_folded(keras_zoo, device, fmt):
    model = load(keras_zoo, fmt, "cnn")
    for conv, bn, cls in [
        ("c5_s2_valid", "bn_folded", malinn.layers.Conv2D),
        ("dw_s2_valid", "bn_dw_folded", malinn.layers.DepthwiseConv2D),
    ]:
        layer = group_of(model, bn)
        assert isinstance(layer, cls) and conv in layer.keras_names, (bn, type(layer).__name__, layer.keras_names)
    assert isinstance(group_of(model, "bn_after_relu"), malinn.layers.BatchNormalization)
    rows = model.plan(7).describe()
    kinds = [row["kind"] for row in rows]
    # one conv step, or a patch matrix (im2col) and its matmul, per convolution; the 1x1 one is a matmul
    assert kinds.count("conv") + kinds.count("im2col") == 6 and "affine" not in kinds, kinds
    first = next(row for row in rows if row["kind"] in ("conv", "matmul"))  # the first convolution's GEMM
    assert first["fused"] == ["bias", "relu", "affine"], first  # bn_after_relu in the epilogue
