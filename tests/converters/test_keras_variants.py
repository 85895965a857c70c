"""Keras 3's Dense variants and bfloat16 weights: read exactly, or refused by name.

* bfloat16 variables (Keras 3 and tf_keras, ``.keras`` and ``.h5``) are stored as a 2-byte opaque
  HDF5 type; they widen to float32 exactly, and malinn computes in float32: it equals Keras's
  float32 computation with the same weights within 1e-5, and Keras's own bfloat16 computation
  within bfloat16's precision.
* LoRA (``enable_lora``): the ``.keras`` archive holds the merged kernel, the ``.h5`` the four
  variables, merged on reading; both equal Keras's output within 1e-5.
* int8-quantized Dense (``model.quantize("int8")``): read as its int8 values times their scales,
  the int8 form kept for the int8-weights precision (tests/test_precision.py runs it).

The Keras files come from the zoo (tests/keras_zoo.py).
"""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest

import malinn
from malinn import ConversionError
from malinn.converters import read_keras
from malinn.converters.dtypes import widen_bfloat16

RTOL = 1e-5
#: Keras computes a bfloat16 layer in bfloat16 (8 significant bits); malinn in float32.
BFLOAT16_RTOL = 2e-2

ALL_FORMATS = [pytest.param(f, id=f) for f in ("keras3-zip", "keras3-h5", "keras2-h5", "tf_keras-zip")]
KERAS3_FORMATS = [pytest.param(f, id=f) for f in ("keras3-zip", "keras3-h5")]


def relative_error(got, want):
    want = np.asarray(want, dtype=np.float64).reshape(len(want), -1)
    scale = max(1.0, float(np.abs(want).max()))
    return float(np.abs(np.asarray(got, dtype=np.float64) - want).max()) / scale


# ---------------------------------------------------------------------------------------------
# bfloat16


def test_bfloat16_widening_is_exact_for_every_kind_of_value():
    rng = np.random.default_rng(3)
    values = np.concatenate(
        [
            rng.standard_normal(1000) * 10.0 ** rng.integers(-40, 38, 1000),
            [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -3e-39, 3.3e38],
        ]
    ).astype(np.float32)
    truncated = (values.view(np.uint32) & 0xFFFF0000).view(np.float32)  # exactly bfloat16 values
    stored = (values.view(np.uint32) >> 16).astype("<u2").view("V2")  # how the files hold them
    widened = widen_bfloat16(stored)
    assert widened.dtype == np.float32
    np.testing.assert_array_equal(widened.view(np.uint32), truncated.view(np.uint32))


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_bfloat16_weights_read_exactly(keras_zoo, fmt):
    """Before: ``weight ... has dtype |V2, not a numeric array``."""
    path = keras_zoo.path(fmt, "bfloat16")
    model = read_keras(path)
    expected = keras_zoo.weights(fmt, "bfloat16")  # Keras's bfloat16 weights as float32
    assert [layer.name for layer in model.layers] == ["d13_bf16", "bn_bf16", "d3"]
    for layer, want in zip(model.layers, expected):
        assert len(layer.weights) == len(want)
        for got, ref in zip(layer.weights, want):
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, ref)
            if layer.name == "d13_bf16":  # bfloat16 values: low 16 bits zero (tf_keras keeps
                assert not (got.view(np.uint32) & 0xFFFF).any()  # BatchNormalization's in float32)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_bfloat16_model_matches_keras(keras_zoo, device, fmt):
    data = keras_zoo.data(fmt, "bfloat16")
    y = malinn.load_model(keras_zoo.path(fmt, "bfloat16")).predict(data["x"])
    assert relative_error(y, data["y_float32"]) <= RTOL
    assert relative_error(y, data["y"]) <= BFLOAT16_RTOL


@pytest.mark.parametrize("fmt", [pytest.param("keras3-h5", id="keras3"), pytest.param("keras2-h5", id="tf_keras")])
def test_two_byte_opaque_weights_need_a_bfloat16_layer(keras_zoo, tmp_path, fmt):
    """The opaque type has no tag: only the layer's dtype policy says it is bfloat16."""
    path = shutil.copy(keras_zoo.path(fmt, "bfloat16"), tmp_path / "relabelled.h5")
    with h5py.File(path, "r+") as f:
        config = json.loads(f.attrs["model_config"])
        for layer in config["config"]["layers"]:
            if layer["config"].get("name") == "d13_bf16":
                layer["config"]["dtype"] = "float32"
        f.attrs["model_config"] = json.dumps(config)
    with pytest.raises(ConversionError, match=r"2-byte opaque type .* its layer's dtype is 'float32', not bfloat16"):
        read_keras(path)


# ---------------------------------------------------------------------------------------------
# LoRA


def test_lora_h5_holds_the_unmerged_variables(keras_zoo):
    """The premise of the merge: Keras's .h5 stores kernel, bias and both LoRA factors."""
    with h5py.File(keras_zoo.path("keras3-h5", "lora"), "r") as f:
        names = [n.decode() if isinstance(n, bytes) else n for n in f["model_weights/d13_lora"].attrs["weight_names"]]
    assert sorted(n.rsplit("/", 1)[-1] for n in names) == ["bias", "kernel", "lora_kernel_a", "lora_kernel_b"]


@pytest.mark.parametrize("fmt", KERAS3_FORMATS)
def test_lora_model_matches_keras(keras_zoo, device, fmt):
    """Before (.h5): ``expected 2 weight arrays (kernel and bias), the file has 4``."""
    data = keras_zoo.data(fmt, "lora")
    model = malinn.load_model(keras_zoo.path(fmt, "lora"))
    assert [layer.name for layer in model.layers] == ["d13_lora", "d3_lora", "d1"]
    assert relative_error(model.predict(data["x"]), data["y"]) <= RTOL
    for layer, out in zip(model.layers, model.predict_layers(data["x"])):
        assert relative_error(out, data[f"layer:{layer.name}"]) <= RTOL, layer.name


def test_lora_merges_to_the_same_kernel_from_both_formats(keras_zoo):
    """Keras merged the .keras kernel in float32, malinn the .h5 one in float64: within an ulp or so."""
    merged = {layer.name: layer.weights for layer in read_keras(keras_zoo.path("keras3-h5", "lora")).layers}
    saved = {layer.name: layer.weights for layer in read_keras(keras_zoo.path("keras3-zip", "lora")).layers}
    assert [len(merged[n]) for n in ("d13_lora", "d3_lora", "d1")] == [2, 1, 2]
    for name in merged:
        for got, want in zip(merged[name], saved[name]):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_lora_variables_that_cannot_be_told_apart_are_refused(keras_zoo, tmp_path):
    path = shutil.copy(keras_zoo.path("keras3-h5", "lora"), tmp_path / "lora.h5")
    with h5py.File(path, "r+") as f:
        group = f["model_weights/d13_lora"]
        names = [n.decode() if isinstance(n, bytes) else n for n in group.attrs["weight_names"]]
        group.attrs["weight_names"] = np.array([n.encode() for n in names if not n.endswith("lora_kernel_b")])
    with pytest.raises(
        ConversionError,
        match=r"layer 'd13_lora': LoRA Dense \(lora_rank=2, lora_alpha=6\): "
        r"the file has 3 weight arrays .* expected kernel, bias, "
        r"lora_kernel_a, lora_kernel_b",
    ):
        read_keras(path)


# ---------------------------------------------------------------------------------------------
# int8


@pytest.mark.parametrize("fmt", KERAS3_FORMATS)
def test_int8_quantized_dense_reads_its_int8_values_and_scales(keras_zoo, fmt):
    """Before: refused (``int8-quantized Dense (Keras 3 quantize) is not supported yet``). Keras's
    weights are ``kernel / kernel_scale``; the layer keeps the int8 form for int8-weights."""
    path = keras_zoo.path(fmt, "int8")
    model = malinn.load_model(path)
    assert model.precision == "fp32"
    layer = model.layers[0]
    q, scales = layer.quantized
    assert q.dtype == np.int8 and q.shape == (13, 5) and scales.shape == (13,)
    np.testing.assert_allclose(layer.kernel.T, q * scales[:, None], rtol=1e-6)
    assert np.abs(q).max() == 127


def test_int8_dense_with_lora_reads_its_merged_form_and_names_lora_otherwise(keras_zoo):
    """A QLoRA fine-tune (int8 Dense, LoRA enabled): the .keras archive holds the factors merged
    into the int8 kernel and its scale, and reads as an int8 Dense (Keras quantizes the inputs too:
    a looser tolerance); an .h5 holds them apart and is refused naming LoRA and what to do (both
    were refused as 'not supported (malinn reads int8-quantized Dense layers)')."""
    data = keras_zoo.data("keras3-zip", "int8_lora")
    model = malinn.load_model(keras_zoo.path("keras3-zip", "int8_lora"))
    assert model.layers[0].quantized is not None
    assert relative_error(model.predict(data["x"]), data["y"]) <= 0.05
    with pytest.raises(
        ConversionError, match=r"int8-quantized Dense: the file has 5 weight arrays .*with LoRA.*\.keras"
    ):
        malinn.load_model(keras_zoo.path("keras3-h5", "int8_lora"))
