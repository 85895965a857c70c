"""Weight precisions: fp16-storage, fp16 and int8-weights beside fp32.

Each reduced precision is checked twice: against a numpy reference computed with the very weights
the kernel multiplies by (``malinn.library.precision.effective``: the float16 values, or the int8 values
times their scales) at the float32 tolerance, and against the float32 weights at the tolerance
docs/CONVERTING.md documents (:data:`VS_FP32`). Odd shapes, both matmul kernels that read reduced
weights (gemv below 16 samples, gemm_tiled above), every activation, model files, Keras's own int8
layers, the tuning key, the device memory, the digits example, and Oclgrind.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from support import activation as ref_activation
from support import assert_close, python_env, rounded_kernel, run_under_oclgrind

import malinn
from malinn import ops
from malinn.choice import tuning_db
from malinn.choice.kernel_call import program_for
from malinn.choice.kernel_choice import choose
from malinn.choice.matrix import DeviceMatrix
from malinn.errors import ConversionError, DeviceError, LibraryError
from malinn.layers import Conv2D, Dense, DepthwiseConv2D, SeparableConv2D
from malinn.library.kernel_library import WEIGHT_OPS, load_library
from malinn.library.layout import parse_layout
from malinn.library.precision import device_bytes, effective, quantize_int8
from malinn.resources import kernels_dir

ROOT = Path(__file__).resolve().parents[1]
REDUCED = ("fp16-storage", "int8-weights")
#: documented error against float32 weights, rel to max(1, max |output|), for the layers below
#: (inputs standard normal, Glorot weights): docs/CONVERTING.md, "Precision"
VS_FP32 = {"fp32": 1e-5, "fp16-storage": 2e-3, "int8-weights": 3e-2}


def forward(model, x, precision):
    """float64 numpy forward pass of a Dense-only model with the weights ``precision`` stores."""
    h = np.asarray(x, np.float64)
    for layer in model.layers:
        w = effective(layer.kernel.T, precision, layer.quantized if precision == "int8-weights" else None)
        h = h @ w.T.astype(np.float64) + (layer.bias if layer.use_bias else 0.0)
        h = ref_activation(layer.activation, h, axis=-1)
    return h


def dense_model(sizes, activations, precision, seed=0):
    layers = [Dense(units, activation=act) for units, act in zip(sizes[1:], activations)]
    model = malinn.Sequential(layers, precision=precision)
    model.build((None, sizes[0]))
    rng = np.random.default_rng(seed)
    for layer in model.layers:  # biases not zero, so that the epilogue's order (scale, then bias) shows
        layer.set_weights([layer.kernel, rng.standard_normal(layer.units).astype(np.float32) * 0.1])
    return model


@pytest.mark.parametrize("precision", ("fp32",) + REDUCED)
@pytest.mark.parametrize("batch", [1, 3, 8, 37])
def test_every_precision_matches_its_own_reference_and_float32_within_the_documented_tolerance(
    device, rng, precision, batch
):
    model = dense_model([53, 67, 29, 10], ["relu", "tanh", "softmax"], precision)
    x = rng.standard_normal((batch, 53)).astype(np.float32)
    got = model.predict(x)
    kinds = {row["kernel"].split()[0] for row in model.plan(batch, device).describe() if row["kind"] == "matmul"}
    assert all(precision in load_library()[kind].precisions for kind in kinds), kinds
    assert all(
        row["kernel"].endswith(f"[{precision}]") == (precision != "fp32")
        for row in model.plan(batch, device).describe()
        if row["kind"] == "matmul"
    )
    assert_close(got, forward(model, x, precision), rtol=1e-5)
    assert_close(got, forward(model, x, "fp32"), rtol=VS_FP32[precision])


@pytest.mark.parametrize("precision", REDUCED)
def test_every_activation_fused_after_reduced_weights(device, rng, precision):
    """Each activation fused after weights in one of the reduced precisions, in turn (the epilogue
    is the same in every precision; the weights' loads are what the precision changes), at batch 1
    and 19 in turn (gemv and gemm_tiled)."""
    names = [n for n in load_library().activations() if n not in ("relu_general",)]
    turn = REDUCED.index(precision)
    for i, name in enumerate(names):
        if i % len(REDUCED) != turn:
            continue
        batch = 1 if (i // len(REDUCED)) % 2 else 19
        model = dense_model([31, 45], [name], precision, seed=i)
        x = rng.standard_normal((batch, 31)).astype(np.float32)
        got = model.predict(x)
        with np.errstate(all="ignore"):
            want = forward(model, x, precision)
        assert_close(got, want, rtol=2e-5)


def test_int8_quantization_is_per_output_channel_and_symmetric():
    w = np.array([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0], [3.0, 1.5, -0.03]], np.float32)
    q, scales = quantize_int8(w)
    np.testing.assert_array_equal(q, [[64, -127, 32], [0, 0, 0], [127, 64, -1]])
    np.testing.assert_allclose(scales, [1.0 / 127, 1.0, 3.0 / 127], rtol=1e-7)
    assert q.dtype == np.int8


def test_int8_buffer_holds_values_then_row_scales_at_a_4_byte_boundary():
    w = np.arange(15, dtype=np.float32).reshape(5, 3) - 7
    layout = malinn.library.layout.parse_layout("C")
    flat = device_bytes(w, "int8-weights", layout, (5, 3))
    q, scales = quantize_int8(w)
    assert flat.dtype == np.uint8 and flat.size == 16 + 4 * 5
    np.testing.assert_array_equal(flat[:15].view(np.int8), q.T.reshape(-1))
    np.testing.assert_array_equal(flat[16:].view(np.float32), scales)
    half = device_bytes(w, "fp16-storage", layout, (8, 3))
    assert half.dtype == np.float16 and half.size == 24


def test_kernels_build_in_every_precision_they_list(device):
    library = load_library()
    for codename in [c for op in WEIGHT_OPS if op != "matmul_head" for c in library.codenames(op, device.backend)]:
        spec = library[codename]
        for precision in spec.precisions:
            if (
                library.precision(precision).extension
                and library.precision(precision).extension not in device.extensions
            ):
                continue
            configured = spec.in_precision(precision).configure({"BIAS": 1, "AFFINE": 1})
            assert configured.precision == precision
            layouts = {n: parse_layout("R") if r.any_layout else r.layout for n, r in configured.matrices.items()}
            program_for(configured, device, layouts)


def test_a_kernel_without_the_precision_is_not_chosen(device):
    ops.use("matmul", "morton_4_2", device)
    spec = choose("matmul", device, (30, 20, 3), precision="int8-weights")
    assert "int8-weights" in spec.precisions and spec.precision == "int8-weights"
    assert choose("matmul", device, (30, 20, 3)).codename == "morton_4_2"


def test_fp16_arithmetic_is_refused_without_cl_khr_fp16(device, rng):
    model = dense_model([8, 5], ["relu"], "fp16")
    x = rng.standard_normal((2, 8)).astype(np.float32)
    if "cl_khr_fp16" in device.extensions:
        assert_close(model.predict(x), forward(model, x, "fp16-storage"), rtol=2e-2)
        return
    with pytest.raises(
        DeviceError,
        match=r"precision 'fp16' computes in half and needs cl_khr_fp16, which .* does "
        r"not offer; use fp16-storage \(half weights, float arithmetic",
    ):
        model.predict(x)


@pytest.mark.parametrize("first", ["conv", "depthwise"])
def test_fp16_is_refused_without_cl_khr_fp16_whatever_the_models_first_layer(device, rng, monkeypatch, first):
    """A model of convolutions alone is refused as a Dense one is (under the GPU's rules, a direct
    convolution kernel, and a depthwise one anywhere, ran it in fp16-storage without a word)."""
    if device.backend != "opencl" or "cl_khr_fp16" in device.extensions:
        pytest.skip(f"{device.name} runs fp16 (or reads fp32 weights only: another refusal)")
    monkeypatch.setattr(type(device), "kind", property(lambda self: "gpu"))  # the direct kernels' rules
    layer = Conv2D(4, 3, padding="same") if first == "conv" else DepthwiseConv2D(3, padding="same")
    model = malinn.Sequential([layer])
    model.build((None, 7, 7, 3))
    model.precision = "fp16"
    x = rng.standard_normal((2, 7, 7, 3)).astype(np.float32)
    with pytest.raises(
        DeviceError,
        match=r"precision 'fp16' computes in half and needs cl_khr_fp16, which .* does "
        r"not offer; use fp16-storage \(half weights, float arithmetic",
    ):
        model.predict(x)


def test_unknown_precision_is_named():
    with pytest.raises(ValueError, match=r"unknown precision 'fp8'; use one of fp32, fp16-storage, fp16, int8-weights"):
        malinn.Sequential(precision="fp8")


def test_weight_memory_is_halved_and_quartered(device):
    model = dense_model([256, 512, 128], ["relu", None], "fp32")
    sizes = {}
    for precision in ("fp32",) + REDUCED:
        model.precision = precision
        sizes[precision] = model.memory(1, device)["weights"] - 4 * (512 + 128)  # biases stay float
        text = model.summary(print_fn=lambda _: None)
        assert f"in {precision} (" in text
    assert sizes["fp16-storage"] * 2 == sizes["fp32"]
    assert sizes["int8-weights"] == sizes["fp32"] // 4 + 4 * (512 + 128)  # plus one scale per unit
    assert re.search(r"Weights on the device: [\d.]+ KiB in int8-weights \(0\.25\d of [\d.]+ KiB in fp32\)", text), text


@pytest.mark.parametrize("precision", REDUCED)
def test_model_file_records_the_precision_and_runs_bit_identically(device, rng, tmp_path, precision):
    model = dense_model([21, 17, 4], ["elu", "sigmoid"], precision)
    x = rng.standard_normal((5, 21)).astype(np.float32)
    want = model.predict(x)
    path = model.save(tmp_path / "m.malinn", target="cpu")
    with h5py.File(path, "r") as f:
        assert f.attrs["precision"] == precision and f.attrs["format_version"] == 2
        stored = f["layers/0/kernel_laid_out"]
        assert stored.dtype == (np.float16 if precision == "fp16-storage" else np.int8)
    again = malinn.load_model(path)
    assert again.precision == precision
    np.testing.assert_array_equal(again.predict(x), want)
    assert malinn.load_model(path, precision="fp32").precision == "fp32"


def conv_model(precision, rng):
    """A convolution, a depthwise and a separable one, and a head: every kind of weight the plan
    lowers to a precision itself (the kernels read Keras's weights as matrices)."""
    model = malinn.Sequential(
        [
            Conv2D(5, 3, padding="same", activation="relu"),
            DepthwiseConv2D(3, depth_multiplier=2),
            SeparableConv2D(4, 3, padding="same"),
            malinn.layers.Flatten(),
            Dense(3),
        ],
        precision=precision,
    )
    model.build((None, 7, 6, 3))
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in model.get_weights()])
    return model


@pytest.mark.parametrize("precision", REDUCED)
def test_a_conv_model_file_holds_the_rounded_weights_and_runs_bit_identically(device, rng, tmp_path, precision):
    """A file in a reduced precision holds only what the device will (docs/CONVERTING.md), for a
    convolution's weights as for a Dense layer's; loading it runs the same numbers."""
    model = conv_model(precision, rng)
    x = rng.standard_normal((2, 7, 6, 3)).astype(np.float32)
    want = model.predict(x)
    path = model.save(tmp_path / "m.malinn", target="cpu")
    conv, depthwise, separable = model.layers[:3]
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["layers/0/0"][()], rounded_kernel(conv.kernel, precision))
        np.testing.assert_array_equal(f["layers/1/0"][()], rounded_kernel(depthwise.depthwise_kernel, precision, True))
        np.testing.assert_array_equal(f["layers/2/0"][()], rounded_kernel(separable.depthwise_kernel, precision, True))
        np.testing.assert_array_equal(f["layers/2/1"][()], rounded_kernel(separable.pointwise_kernel, precision))
        assert not np.array_equal(f["layers/0/0"][()], conv.kernel)
    again = malinn.load_model(path)
    np.testing.assert_array_equal(again.predict(x), want)
    again.precision = "fp32"  # the rounded values, now read as float32: the same products
    np.testing.assert_allclose(again.predict(x), want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize(
    "precision, weight, message",
    [
        ("fp16-storage", 1e5, r"1 of its weights are beyond float16's range"),
        ("int8-weights", np.nan, r"1 of its weights are NaN or infinite; int8-weights cannot scale them"),
    ],
)
def test_a_conv_weight_the_precision_cannot_hold_is_refused_at_conversion(
    device, rng, tmp_path, precision, weight, message
):
    model = conv_model("fp32", rng)
    depthwise = model.layers[1]
    kernel = depthwise.depthwise_kernel.copy()
    kernel[1, 2, 0, 1] = weight
    depthwise.set_weights([kernel, depthwise.bias])
    model.precision = precision
    with pytest.raises(ConversionError, match=rf"layer '{depthwise.name}' depthwise kernel: {message}"):
        model.save(tmp_path / "m.malinn", target="cpu")
    assert not (tmp_path / "m.malinn").exists()


def test_a_conv_models_weight_memory_is_in_its_precision(device, rng):
    """The summary's device memory counts every weight in the model's precision, the convolutions'
    too (they were fp32 whatever the precision)."""
    if device.backend != "opencl":
        pytest.skip("a GL device's kernels read fp32 weights only")
    model = conv_model("fp16-storage", rng)
    text = model.summary(print_fn=lambda _: None)
    assert re.search(r"Weights on the device: [\d.]+ KiB in fp16-storage \(0\.500 of [\d.]+ KiB in fp32\)", text), text


def test_a_layer_called_on_two_tensors_counts_its_weights_once(device):
    shared = Dense(64)
    a, b = malinn.Input((32,)), malinn.Input((32,))
    twice = malinn.Functional([a, b], malinn.layers.Add()([shared(a), shared(b)]))
    assert twice.memory(1, device)["weights"] == model_weight_bytes(shared, device)
    text = twice.summary(print_fn=lambda _: None)
    assert re.search(r"Weights on the device: 8\.\d KiB in fp32 \(1\.000 of 8\.\d KiB in fp32\)", text), text


def model_weight_bytes(dense, device) -> int:
    """The bytes of one Dense layer's copy on ``device`` in a model of its own."""
    alone = malinn.Sequential([Dense(dense.units)])
    alone.build((None, dense.input_dim))
    return alone.memory(1, device)["weights"]


def test_a_device_kind_whose_default_reads_fp32_only_gets_a_kernel_that_reads_the_precision(device, rng, tmp_path):
    """--target accelerator: its default (morton_4_2) reads fp32 only; the file is laid out for the
    kind's first kernel that reads int8 (it was refused naming the internal kernel)."""
    model = dense_model([6, 3], [None], "int8-weights")
    path = model.save(tmp_path / "m.malinn", target="accelerator")
    with h5py.File(path, "r") as f:
        assert f["layers/0/kernel_laid_out"].dtype == np.int8
    x = rng.standard_normal((2, 6)).astype(np.float32)
    np.testing.assert_array_equal(malinn.load_model(path).predict(x), model.predict(x))


def test_convert_says_how_many_weights_half_precision_stores_as_zero(tmp_path, capsys):
    """Weights below float16's smallest (about 6e-8) become 0 in fp16-storage: a model of 1e-8
    weights predicted all zeros without a word; convert names the layers and the count."""
    from malinn.cli.commands import main

    model = dense_model([4, 2], [None], "fp32")
    model.set_weights([np.full((4, 2), 1e-8, np.float32), np.zeros(2, np.float32)])
    src = model.save(tmp_path / "tiny.malinn", target="cpu")
    assert (
        main(
            ["convert", str(src), "-o", str(tmp_path / "half.malinn"), "--precision", "fp16-storage", "--target", "cpu"]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "8 non-zero weights are below fp16-storage's smallest value" in err
    assert f"({model.layers[0].name} kernel: 8)" in err
    assert (
        main(
            ["convert", str(src), "-o", str(tmp_path / "int8.malinn"), "--precision", "int8-weights", "--target", "cpu"]
        )
        == 0
    )
    assert "non-zero weights" not in capsys.readouterr().err  # int8 scales per unit: nothing lost


def test_a_target_without_the_precision_is_refused(tmp_path):
    model = dense_model([6, 3], [None], "int8-weights")
    with pytest.raises(ConversionError, match="target morton_4_2 reads fp32 weights only, not int8-weights"):
        model.save(tmp_path / "m.malinn", target="morton_4_2")
    assert not (tmp_path / "m.malinn").exists()


@pytest.mark.parametrize("precision", ["fp16-storage", "fp16"])
def test_a_weight_beyond_half_range_is_refused_by_name_not_stored_as_infinity(device, tmp_path, precision):
    if device.backend != "opencl":
        pytest.skip("a GL CPU's kernels read fp32 weights only")
    model = dense_model([2, 2], [None], "fp32")
    model.set_weights([np.array([[1e5, 1.0], [1.0, 1.0]], np.float32), np.zeros(2, np.float32)])
    layer = model.layers[0].name
    message = rf"layer '{layer}' kernel: 1 of its weights are beyond float16's range \(the largest, 100000"
    model.precision = precision
    with pytest.raises(ConversionError, match=message):
        model.save(tmp_path / "m.malinn", target="cpu")
    assert not (tmp_path / "m.malinn").exists()
    if precision == "fp16-storage":  # every device reads half weights; fp16 arithmetic needs cl_khr_fp16
        with pytest.raises(ValueError, match=message):
            model.predict(np.zeros((1, 2), np.float32))
    model.precision = "int8-weights"  # per-unit scales hold it
    np.testing.assert_allclose(model.predict(np.array([[1.0, 3.0]], np.float32)), [[1e5 + 3.0, 4.0]], rtol=1e-2)


def test_int8_refuses_nan_or_infinite_weights_by_name(device):
    if device.backend != "opencl":
        pytest.skip("a GL CPU's kernels read fp32 weights only")
    model = dense_model([3, 2], [None], "fp32")
    model.set_weights([np.array([[1.0, np.inf], [0.0, 1.0], [2.0, 1.0]], np.float32), np.zeros(2, np.float32)])
    model.precision = "int8-weights"
    with pytest.raises(
        ValueError,
        match=rf"layer '{model.layers[0].name}' kernel: 1 of its weights are NaN or "
        "infinite; int8-weights cannot scale them",
    ):
        model.predict(np.zeros((1, 3), np.float32))


@pytest.mark.parametrize("target", ["gl", "gl:gpu", "gl:cpu", "gles3"])
def test_an_opengl_target_refuses_a_reduced_precision_at_conversion(tmp_path, target):
    model = dense_model([6, 3], [None], "int8-weights")
    with pytest.raises(ConversionError, match=f"target {target} is an OpenGL device's, which runs fp32 weights only"):
        model.save(tmp_path / "m.malinn", target=target)
    assert not (tmp_path / "m.malinn").exists()


def test_keras_int8_dense_runs_on_its_own_int8_values(device, keras_zoo):
    path = keras_zoo.path("keras3-zip", "int8")
    model = malinn.load_model(path, precision="int8-weights")
    q, scales = model.layers[0].quantized
    x = np.random.default_rng(3).standard_normal((4, 5)).astype(np.float32)
    got = model.predict(x)
    assert_close(got, forward(model, x, "int8-weights"), rtol=1e-5)
    np.testing.assert_array_equal(effective(None, "int8-weights", (q, scales)), q * scales[:, None])


def test_tuning_key_includes_the_precision(device, tmp_path, monkeypatch):
    monkeypatch.setenv("MALINN_CACHE_DIR", str(tmp_path))
    tuning_db.forget()
    try:
        assert tuning_db.device_key(device, "int8-weights") == device.identity + "|int8-weights"
        shape = (40, 30, 2)
        default = choose("matmul", device, shape)
        gemv = load_library()["gemv"]
        config = next(
            c for c in gemv.configurations(device) if gemv.configure(c).accepts(*shape) and c != default.config
        )
        tuning_db.save(device, shapes={"40x30x2": {"codename": "gemv", "defines": config}}, precision="fp16-storage")
        chosen = choose("matmul", device, shape, precision="fp16-storage")
        assert (chosen.codename, chosen.precision) == ("gemv", "fp16-storage")
        assert {k: v for k, v in chosen.config.items() if k != "WEIGHT_BITS"} == config
        for precision in ("fp32", "int8-weights"):  # their winners are stored apart: none here
            other = choose("matmul", device, shape, precision=precision)
            assert (other.codename, {k: v for k, v in other.config.items() if k != "WEIGHT_BITS"}) == (
                default.codename,
                default.config,
            )
    finally:
        tuning_db.forget()


@pytest.mark.parametrize("precision", ("fp32",) + REDUCED)
def test_digits_example_agrees_with_keras_on_every_sample(device, precision):
    data = np.load(ROOT / "examples" / "digits_test.npz")
    model = malinn.load_model(ROOT / "examples" / "digits_mlp.keras", precision=precision)
    got = model.predict(data["x"])
    np.testing.assert_array_equal(np.argmax(got, axis=1), np.argmax(data["keras"], axis=1))
    assert np.abs(got - data["keras"]).max() <= {"fp32": 1e-5, "fp16-storage": 2e-3, "int8-weights": 2e-2}[precision]


def test_cli_convert_and_predict_in_a_precision(device, tmp_path):
    out = tmp_path / "digits.malinn"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "malinn.cli",
            "convert",
            str(ROOT / "examples" / "digits_mlp.keras"),
            "-o",
            str(out),
            "--precision",
            "int8-weights",
            "--target",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=python_env(),
    )
    assert run.returncode == 0, run.stderr
    assert "weights laid out for gemm_tiled in int8-weights" in run.stderr + run.stdout
    assert malinn.load_model(out).precision == "int8-weights"
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "malinn.cli",
            "convert",
            str(ROOT / "examples" / "digits_mlp.keras"),
            "-o",
            str(tmp_path / "x.malinn"),
            "--precision",
            "int4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=python_env(),
    )
    assert bad.returncode == 2 and "invalid choice: 'int4'" in bad.stderr


@pytest.mark.parametrize("precision", ["fp16", "int8-weights"])
def test_cli_convert_writes_a_file_this_device_cannot_run_with_a_note(device, tmp_path, capsys, precision):
    """A file may be meant for a board (fp16 for a Mali or Adreno GPU): convert writes it, and says
    when the device it ran on could not run it."""
    from malinn.cli.commands import main

    out = tmp_path / "digits.malinn"
    assert main(["convert", str(ROOT / "examples" / "digits_mlp.keras"), "-o", str(out), "--precision", precision]) == 0
    assert malinn.load_model(out).precision == precision
    err = capsys.readouterr().err
    runs_here = device.backend == "opencl" and (precision != "fp16" or "cl_khr_fp16" in device.extensions)
    if runs_here:
        assert "note" not in err, err
    else:
        assert f"malinn: note: {out} is written, but this device cannot run it: precision {precision!r}" in err, err
        assert device.name in err


def test_cli_convert_to_a_reduced_precision_after_an_fp32_only_kernel_was_chosen(device, tmp_path, capsys):
    """The device's chosen kernel (a tuned winner, here set with ``use``) may read fp32 weights only:
    convert then lays the weights out for the device kind's default, which reads them all (it
    refused before, naming the chosen kernel)."""
    from malinn.choice import kernel_choice
    from malinn.cli.commands import main

    fp32_only = next(
        c for c in load_library().codenames("matmul", device.backend) if load_library()[c].precisions == ("fp32",)
    )
    out = tmp_path / "digits.malinn"
    kernel_choice.use("matmul", fp32_only, device)
    try:
        assert (
            main(
                ["convert", str(ROOT / "examples" / "digits_mlp.keras"), "-o", str(out), "--precision", "fp16-storage"]
            )
            == 0
        )
    finally:
        kernel_choice.forget(device)
    model = malinn.load_model(out)
    assert model.precision == "fp16-storage"
    report = capsys.readouterr()
    (used,) = re.findall(r"weights laid out for (\S+) in fp16-storage", report.out + report.err)
    assert used != fp32_only and "fp16-storage" in load_library()[used].precisions


# ------------------------------------------- per-precision configurations of the batch-1 GPU default
def batch1_gpu_default(precision: str, codename: str | None = None):
    """The GPU's batch-1 kernel for a 4096x3072 layer in ``precision`` (the first of ``codename``'s
    entries where given), in the configuration the library names for it (an entry of
    matmul_fallback with "precisions" first)."""
    fallbacks = load_library().default_specs("matmul_fallback", "gpu", precision=precision)
    return next(
        f
        for f in fallbacks
        if f.accepts(4096, 3072, 1) and precision in f.precisions and codename in (None, f.codename)
    ).in_precision(precision)


def bytes_per_item_and_step(spec) -> int:
    """The bytes of A a gemv_split item loads per step: U columns of VW rows (kernels/gemv_split.cl)."""
    config, size = spec.config, load_library().precision(spec.precision).weight_bytes
    columns = int(config["COLS"]) or int(config["UNROLL"]) * 4 // size
    return columns * int(config["VW"]) * size


@pytest.mark.parametrize("precision", REDUCED + ("fp16",))
def test_reduced_weights_stream_in_wide_loads_with_as_many_bytes_per_item_as_fp32(precision):
    """half and int8 weights read in vector loads of 8 or more bytes of rows (VW 8: half8 is
    16 bytes, char8 8; char16 loads were slower inside the network on the H200,
    benchmarks/results/insitu_b1_cifar_int8_nvidia_h200.json), each item moving at least the bytes per
    step that fp32's general configuration does, over fewer items (fp32's own configuration for
    layers of 3072+ inputs, gemv_split_stream_c, is timed in fp32 only)."""
    fp32, mine = batch1_gpu_default("fp32", "gemv_split_c"), batch1_gpu_default(precision)
    assert mine.codename == "gemv_split_c" and mine.precision == precision
    assert batch1_gpu_default("fp32").codename == "gemv_split_stream_c"
    assert int(mine.config["VW"]) * load_library().precision(precision).weight_bytes >= 8
    assert int(fp32.config["VW"]) * 4 >= 16
    assert bytes_per_item_and_step(mine) >= bytes_per_item_and_step(fp32)


def test_per_precision_defaults_serve_their_precisions_only():
    """A defaults entry with "precisions" is among the defaults of those precisions, and of no other."""
    library = load_library()
    found = 0
    for kind in ("gpu", "cpu", "accelerator"):
        for table in ("matmul", "matmul_fallback"):
            entries = library.defaults.get(table, {}).get(kind, [])
            for entry in entries if isinstance(entries, list) else [entries]:
                if not isinstance(entry, dict) or "precisions" not in entry:
                    continue
                found += 1
                config = library[entry["codename"]].configure(entry.get("defines")).config
                for precision in library.precisions:
                    serving = [s.config for s in library.default_specs(table, kind, precision=precision)]
                    assert (config in serving) == (precision in entry["precisions"]), (kind, table, precision)
    assert found >= 2


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (
            lambda e: e.update(precisions=["fp8"]),
            "field 'defaults.matmul_fallback.gpu.precisions': expected a list of "
            "precisions 'gemv_split_head_c' supports",
        ),
        (lambda e: e.update(precisions="int8-weights"), "field 'defaults.matmul_fallback.gpu.precisions'"),
        (lambda e: e.update(precisions=[]), "field 'defaults.matmul_fallback.gpu.precisions'"),
    ],
)
def test_malformed_default_precisions_are_named(tmp_path, mutate, fragment):
    folder = tmp_path / "kernels"
    shutil.copytree(kernels_dir(), folder)
    data = json.loads((folder / "library.json").read_text())
    mutate(next(e for e in data["defaults"]["matmul_fallback"]["gpu"] if "precisions" in e))
    (folder / "library.json").write_text(json.dumps(data))
    with pytest.raises(LibraryError) as info:
        load_library(folder / "library.json")
    assert fragment in str(info.value)


def gemv_split_variants(precision: str) -> list:
    """The library's batch-1 GPU configuration for ``precision`` and a variant of it with an odd COLS
    (a partial last step in every slice) and, for half weights, two 16-byte loads per column (VW 16),
    for int8 ones the conversion through the exponent bias (INT8_BIAS)."""
    default = batch1_gpu_default(precision)
    size = load_library().precision(precision).weight_bytes
    other = {"VW": 16} if size == 2 else {"INT8_BIAS": 1} if size == 1 else {}
    return [default, default.configure({**other, "COLS": 3, "SLICES": 4, "MDIM": 8})]


def run_matmul(spec, device, a, b, bias, affine, activation, params):
    m, k = a.shape
    padded = ops.matmul_plan(spec, m, k, b.shape[1])["a"]
    layout = spec.matrices["a"].layout
    weights = DeviceMatrix.upload_weights(
        device, device_bytes(a, spec.precision, layout, padded), (m, k), layout, padded, spec.precision
    )
    vector = lambda v: ops.upload_vector(device, v)  # noqa: E731
    r = ops.matmul(
        weights,
        DeviceMatrix.from_host(b),
        spec,
        device,
        bias=vector(bias),
        activation=activation,
        params=params,
        affine=tuple(vector(v) for v in affine),
    )
    return r.numpy()


@pytest.mark.parametrize("precision", ("fp32",) + REDUCED + ("fp16",))
def test_per_precision_configurations_match_numpy_on_odd_shapes(device, rng, precision):
    """Each reduced precision's batch-1 configuration (and a variant: odd COLS, 2 loads per column)
    against numpy with the weights the precision stores, bias, a four-parameter activation and
    affine fused, on odd shapes (m and k among 1, 3, 13, 1001, 4099); fp32 runs them too (the tuner
    may choose them for it)."""
    if device.backend != "opencl":
        pytest.skip("gemv_split has OpenCL sources only")
    if precision == "fp16" and "cl_khr_fp16" not in device.extensions:
        pytest.skip(f"{device.name} has no cl_khr_fp16")
    specs = (
        [s.in_precision(precision) for p in REDUCED for s in gemv_split_variants(p)]
        if precision == "fp32"
        else gemv_split_variants(precision)
    )
    params = {"negative_slope": 0.1, "max_value": 2.5, "threshold": 0.5, "has_max_value": 1.0}
    for spec in specs:
        for m, k in [(1, 4099), (4099, 1), (3, 13), (13, 1001), (1001, 3)]:
            a = rng.standard_normal((m, k)).astype(np.float32)
            b = rng.standard_normal((k, 1)).astype(np.float32)
            bias, scale, shift = (rng.standard_normal(m).astype(np.float32) for _ in range(3))
            got = run_matmul(spec, device, a, b, bias, (scale, shift), "relu_general", params)
            z = effective(a, precision).astype(np.float64) @ b.astype(np.float64) + bias[:, None]
            want = ref_activation("relu_general", z, axis=0, **params) * scale[:, None] + shift[:, None]
            assert_close(got, want, 1e-2 if precision == "fp16" else 1e-5)


# ------------------------------------------------------------------ Oclgrind
OCLGRIND = shutil.which("oclgrind")
OCLGRIND_SCRIPT = r"""
import json, sys
import numpy as np
import malinn
from malinn.layers import Conv2D, Dense, DepthwiseConv2D, SeparableConv2D
from malinn.library.precision import effective
kept, errors = [], {}
for precision in ("fp16-storage", "int8-weights"):
    for batch in (1, 3, 17):
        model = malinn.Sequential([Dense(13, activation="relu"), Dense(6, activation="softmax")], precision=precision)
        model.build((None, 11))
        kept.append(model)            # no buffer is released (see tests/oclgrind_driver.py)
        x = np.random.default_rng(batch).standard_normal((batch, 11)).astype(np.float32)
        h = x.astype(np.float64)
        for layer in model.layers:
            h = h @ effective(layer.kernel.T, precision).T + layer.bias
            h = np.maximum(h, 0) if layer.activation == "relu" else np.exp(h - h.max(1, keepdims=True))
        h = h / h.sum(1, keepdims=True)
        errors[f"{precision} {batch}"] = float(np.abs(model.predict(x) - h).max())
print(json.dumps(errors))
"""


@pytest.mark.skipif(OCLGRIND is None, reason="oclgrind is not on PATH (bash .ci/setup --test installs it)")
def test_reduced_precision_kernels_are_clean_under_oclgrind():
    errors = run_under_oclgrind(OCLGRIND, OCLGRIND_SCRIPT, options=("--global-mem-size", str(2**28)))
    assert len(errors) == 6 and max(errors.values()) < 1e-5, errors


OCLGRIND_SPLIT_SCRIPT = r"""
import json, sys
import numpy as np
import malinn
from malinn import ops
from malinn.choice.matrix import DeviceMatrix
from malinn.library.precision import device_bytes, effective
sys.path.insert(0, sys.argv[1])
from test_precision import REDUCED, gemv_split_variants
device = malinn.get_device()
rng = np.random.default_rng(0)
kept, errors = [], {}             # no buffer is released (see tests/oclgrind_driver.py)
for precision in REDUCED + (("fp16",) if "cl_khr_fp16" in device.extensions else ()):
    for c, spec in enumerate(gemv_split_variants(precision)):
        for m, k in [(13, 37), (33, 5)]:
            a = rng.standard_normal((m, k)).astype(np.float32)
            b = rng.standard_normal((k, 1)).astype(np.float32)
            bias, scale, shift = (rng.standard_normal(m).astype(np.float32) for _ in range(3))
            padded = ops.matmul_plan(spec, m, k, 1)["a"]
            layout = spec.matrices["a"].layout
            w = DeviceMatrix.upload_weights(device, device_bytes(a, precision, layout, padded), (m, k), layout, padded,
                                            precision)
            vectors = [ops.upload_vector(device, v) for v in (bias, scale, shift)]
            kept += [w] + vectors
            for _ in range(2):         # the second launch finds the counters the first left
                x = DeviceMatrix.from_host(b)
                r = ops.matmul(w, x, spec, device, bias=vectors[0], activation="tanh", affine=tuple(vectors[1:]))
                kept += [x, r]
                got = r.numpy()
            want = np.tanh(effective(a, precision).astype(np.float64) @ b + bias[:, None]) * scale[:, None] + shift[:, None]
            errors[f"{precision} {c} {m}x{k}"] = float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))
print(json.dumps(errors))
"""


@pytest.mark.skipif(OCLGRIND is None, reason="oclgrind is not on PATH (bash .ci/setup --test installs it)")
def test_per_precision_configurations_are_clean_under_oclgrind():
    """The reduced precisions' 16-byte-load configurations of gemv_split_c (and the odd-COLS variant)
    under Oclgrind's memory, race, uninitialised-value and API checks, each launched twice."""
    errors = run_under_oclgrind(OCLGRIND, OCLGRIND_SPLIT_SCRIPT, str(ROOT / "tests"))
    assert len(errors) >= 8, errors
    assert all(error < (1e-2 if case.startswith("fp16 ") else 1e-5) for case, error in errors.items()), errors


def test_cli_convert_of_a_reduced_precision_file_back_to_fp32_says_the_weights_stay_rounded(device, tmp_path, capsys):
    """A malinn file's int8 weights converted to fp32 keep their rounded values (a file holds no
    other); the command says so, and to convert the Keras file for its own weights."""
    from malinn.cli.commands import main

    keras = ROOT / "examples" / "digits_mlp.keras"
    small, back = tmp_path / "int8.malinn", tmp_path / "back.malinn"
    assert main(["convert", str(keras), "-o", str(small), "--precision", "int8-weights"]) == 0
    capsys.readouterr()
    assert main(["convert", str(small), "-o", str(back), "--precision", "fp32"]) == 0
    err = capsys.readouterr().err
    assert f"{small} holds weights rounded to int8-weights" in err and "convert the Keras file" in err, err
    original, rounded = malinn.load_model(keras), malinn.load_model(back)
    assert rounded.precision == "fp32"
    assert any(not np.array_equal(a, b) for a, b in zip(original.get_weights(), rounded.get_weights()))
    assert main(["convert", str(keras), "-o", str(tmp_path / "plain.malinn")]) == 0
    assert "rounded" not in capsys.readouterr().err
