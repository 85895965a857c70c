"""Convolution layers vs the numpy definition, on every working device and with every algorithm
(kn2row, kn2col accumulating GEMMs; im2col, im2row patch matrices through the GEMM; a 1x1
convolution as a plain matmul), over odd shapes, strides, dilations, paddings, groups, batch 1 and 7."""

import numpy as np
import pytest
from support import activation, conv2d_reference, depthwise_reference, rounded_kernel

import malinn
from malinn.choice import kernel_choice
from malinn.layers import Conv1D, Conv2D, DepthwiseConv2D, SeparableConv2D

pytestmark = pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)

#: (op, codename) chosen with use(); None: the library's default for the device
ALGORITHMS = [
    None,
    ("conv", "conv_kn2row"),
    ("conv", "conv_kn2col"),
    ("im2col", "im2col"),
    ("im2col", "im2row"),
    ("conv", "conv_kn2row", {"LOCAL": 1}),
    ("conv", "conv_kn2col", {"LOCAL": 1, "KC": 8, "MWI": 8}),
    ("conv", "conv_kn2col", {"LOCAL": 2, "KC": 16, "MWI": 8, "NWI": 4, "MDIM": 8, "NDIM": 16}),
    ("conv", "conv_kn2col", {"LOCAL": 2, "KC": 4, "VW": 2, "MWI": 4, "NWI": 4, "MDIM": 4, "NDIM": 8}),
    # the implicit GEMM: a K step past CIN, the patch tile loaded in two rounds, no prefetch
    ("conv", "conv_implicit", {"TM": 16, "TN": 12, "RM": 4, "RN": 3, "KT": 8, "PREFETCH": 0}),
    # and its K split over 4 work-groups (the last slices empty for small kernels), two local buffers
    ("conv", "conv_implicit", {"TM": 32, "TN": 16, "RM": 8, "RN": 4, "KT": 4, "SLICES": 4, "DOUBLE": 1}),
]
#: (H, W, C, M, kernel, strides, dilation, padding, groups, batch)
CASES = [
    (5, 5, 3, 13, 3, 1, 1, "valid", 1, 1),
    (13, 13, 3, 13, 3, 2, 1, "same", 1, 7),
    (13, 5, 13, 3, 5, 1, 2, "same", 1, 7),
    (31, 31, 1, 1, 7, 2, 1, "valid", 1, 1),
    (1, 13, 13, 64, (1, 3), 1, 1, "same", 1, 7),
    (5, 5, 64, 3, 5, 2, 1, "same", 1, 1),
    (7, 7, 4, 6, 3, 1, 1, "same", 2, 7),
    (5, 13, 3, 64, 1, 1, 1, "valid", 1, 7),
    (13, 13, 13, 3, 1, 2, 1, "same", 1, 1),
    (5, 5, 3, 5, 7, 1, 1, "same", 1, 1),
]


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _run(layer, x):
    model = malinn.Sequential([layer])
    model.build((None,) + x.shape[1:])
    return model


def _randomize(layer, rng):
    layer.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in layer.get_weights()])


def _algorithm_id(a) -> str:
    """default, or the codename with the defines that tell its configurations apart"""
    if not a:
        return "default"
    config = a[2] if len(a) > 2 else {}
    if "LOCAL" in config:
        return f"{a[1]}-local{config['LOCAL']}-kc{config.get('KC', 16)}"
    return a[1] + "".join(f"-{k.lower()}{v}" for k, v in config.items() if k in ("KT", "SLICES", "DOUBLE"))


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=_algorithm_id)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_conv2d_matches_the_definition(device, rng, algorithm, case):
    h, w, c, m, k, s, d, padding, groups, batch = case
    if algorithm is not None:
        kernel_choice.use(*algorithm[:2], device=device, config=algorithm[2] if len(algorithm) > 2 else None)
    layer = Conv2D(m, k, s, padding, d, groups, activation="relu" if m % 2 else "tanh")
    model = _run(layer, np.zeros((1, h, w, c)))
    _randomize(layer, rng)
    x = rng.standard_normal((batch, h, w, c)).astype(np.float32)
    want = activation(
        layer.activation, conv2d_reference(x, layer.kernel, layer.bias, _pair(s), _pair(d), padding, groups)
    )
    got = model.predict(x)
    assert got.shape == want.shape == layer.compute_output_shape((batch, h, w, c))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))


def test_the_implicit_gemm_sums_in_kn2cols_order_and_its_k_split_in_slice_order(device, rng):
    """conv_implicit adds the taps' channels in kn2col's order (bit-identical to its direct loop);
    split over work-groups it adds the slices' partial sums in slice order: the same bits at every
    run, with one local buffer or two."""
    if device.backend != "opencl":
        pytest.skip("conv_implicit is an OpenCL kernel")
    model = _run(Conv2D(13, 3, padding="same", activation="relu"), np.zeros((1, 9, 7, 13)))
    _randomize(model.layers[0], rng)
    x = rng.standard_normal((3, 9, 7, 13)).astype(np.float32)

    def predict(codename, config=None):
        kernel_choice.forget(device)
        kernel_choice.use("conv", codename, device=device, config=config)
        return model.predict(x)

    tile = {"TM": 32, "TN": 16, "RM": 8, "RN": 4, "KT": 4}
    np.testing.assert_array_equal(predict("conv_implicit", tile), predict("conv_kn2col"))
    split = predict("conv_implicit", {**tile, "SLICES": 4})
    for _ in range(2):
        np.testing.assert_array_equal(predict("conv_implicit", {**tile, "SLICES": 4, "DOUBLE": 1}), split)
    want = np.maximum(conv2d_reference(x, model.layers[0].kernel, model.layers[0].bias, padding="same"), 0)
    np.testing.assert_allclose(split, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_pointwise_conv_is_a_plain_matmul_and_kn2row_never_holds_k2_copies(device):
    pointwise = _run(Conv2D(8, 1), np.zeros((1, 5, 5, 3)))
    assert [s["kind"] for s in pointwise.plan(7).describe() if s["kind"] != "relayout"] == ["matmul"]
    kernel_choice.use("conv", "conv_kn2row", device=device)
    model = _run(Conv2D(16, 3, padding="same"), np.zeros((1, 13, 13, 8)))
    plan = model.plan(7)
    assert "conv" in [s["kind"] for s in plan.describe()]
    largest, _, _ = plan.activation_bytes()
    # the biggest buffer is the output (16 x 7*13*13 padded to whole tiles), never 9 x the input
    assert largest <= 4 * 32 * (7 * 13 * 13 + 32) < 4 * 9 * 8 * 7 * 13 * 13


@pytest.mark.parametrize("padding", ["valid", "same", "causal"])
def test_conv1d_matches_the_definition(device, rng, padding):
    layer = Conv1D(5, 3, strides=1 if padding == "causal" else 2, padding=padding, dilation_rate=2, activation="elu")
    model = _run(layer, np.zeros((1, 13, 3)))
    _randomize(layer, rng)
    x = rng.standard_normal((7, 13, 3)).astype(np.float32)
    x2 = x[:, None]
    if padding == "causal":  # zeros before the sequence only: a 'valid' conv of the left-padded input
        x2 = np.concatenate([np.zeros((7, 1, 4, 3), np.float32), x2], axis=2)
    want = conv2d_reference(
        x2, layer.kernel[None], layer.bias, (1, layer.strides[0]), (1, 2), "valid" if padding == "causal" else padding
    )[:, 0]
    np.testing.assert_allclose(model.predict(x), activation("elu", want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "case",
    [
        (5, 5, 3, 1, 3, 1, 1, "valid"),
        (13, 13, 13, 2, 3, 2, 1, "same"),
        (13, 31, 1, 3, 5, 1, 2, "same"),
        (1, 5, 64, 1, (1, 3), 1, 1, "same"),
    ],
    ids=lambda c: "-".join(map(str, c)),
)
def test_depthwise_and_separable_match_the_definition(device, rng, case):
    h, w, c, dm, k, s, d, padding = case
    x = rng.standard_normal((7, h, w, c)).astype(np.float32)
    depthwise = DepthwiseConv2D(k, s, padding, dm, d, activation="relu6")
    model = _run(depthwise, x)
    _randomize(depthwise, rng)
    want = depthwise_reference(x, depthwise.depthwise_kernel, depthwise.bias, _pair(s), _pair(d), padding)
    np.testing.assert_allclose(model.predict(x), np.clip(want, 0, 6), rtol=1e-5, atol=1e-5)
    separable = SeparableConv2D(4, k, s, padding, dm, d, activation="sigmoid")
    model = _run(separable, x)
    _randomize(separable, rng)
    mid = depthwise_reference(x, separable.depthwise_kernel, None, _pair(s), _pair(d), padding)
    want = activation("sigmoid", mid @ separable.pointwise_kernel[0, 0] + separable.bias)
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", ["fp16-storage", "int8-weights"])
@pytest.mark.parametrize("algorithm", [a for a in ALGORITHMS if a is None or a[0] == "conv"], ids=_algorithm_id)
@pytest.mark.parametrize("case", [CASES[2], CASES[6], CASES[7]], ids=lambda c: "-".join(map(str, c)))
def test_every_conv_kernel_reads_its_weights_in_the_models_precision(device, rng, precision, algorithm, case):
    """The direct kernels (kn2row, kn2col, the implicit GEMM) read a reduced precision's weights as
    the im2col path's matmul does: equal to the definition with the weights that precision keeps
    (int8: per output channel), and the plan says so."""
    h, w, c, m, k, s, d, padding, groups, batch = case
    if algorithm is not None:
        kernel_choice.use(*algorithm[:2], device=device, config=algorithm[2] if len(algorithm) > 2 else None)
    layer = Conv2D(m, k, s, padding, d, groups, activation="tanh")
    model = _run(layer, np.zeros((1, h, w, c)))
    model.precision = precision
    _randomize(layer, rng)
    x = rng.standard_normal((batch, h, w, c)).astype(np.float32)
    kept = rounded_kernel(layer.kernel, precision)
    assert not np.array_equal(kept, layer.kernel)
    want = np.tanh(conv2d_reference(x, kept, layer.bias, _pair(s), _pair(d), padding, groups))
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))
    steps = [row for row in model.plan(batch).describe() if row["kind"] in ("conv", "matmul")]
    assert steps and all(f"[{precision}]" in row["kernel"] for row in steps), steps


@pytest.mark.parametrize("precision", ["fp16-storage", "int8-weights"])
def test_depthwise_and_separable_read_their_weights_in_the_models_precision(device, rng, precision):
    x = rng.standard_normal((3, 13, 5, 3)).astype(np.float32)
    separable = SeparableConv2D(5, 3, 2, "same", 2, activation="relu")
    model = _run(separable, x)
    model.precision = precision
    _randomize(separable, rng)
    mid = depthwise_reference(
        x, rounded_kernel(separable.depthwise_kernel, precision, depthwise=True), None, (2, 2), (1, 1), "same"
    )
    want = np.maximum(mid @ rounded_kernel(separable.pointwise_kernel, precision)[0, 0] + separable.bias, 0)
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))
    kernels = [row["kernel"] for row in model.plan(3).describe() if row["kind"] in ("conv", "matmul")]
    assert len(kernels) == 2 and all(f"[{precision}]" in k for k in kernels), kernels


def test_batchnorm_folds_into_a_linear_convolution(rng):
    for layer in (Conv2D(4, 3, padding="same"), DepthwiseConv2D(3, depth_multiplier=2), SeparableConv2D(4, 3)):
        layer.build((None, 5, 5, 2))
        _randomize(layer, rng)
        before = layer.get_weights()
        m = layer.compute_output_shape((None, 5, 5, 2))[-1]
        scale, shift = rng.uniform(0.5, 2, m), rng.standard_normal(m)
        assert layer.absorb_affine(scale, shift)
        kernel_index = 1 if isinstance(layer, SeparableConv2D) else 0
        folded = layer.get_weights()
        np.testing.assert_allclose(
            folded[kernel_index].reshape(-1, m), before[kernel_index].reshape(-1, m) * scale, rtol=1e-6
        )
        np.testing.assert_allclose(folded[-1], before[-1] * scale + shift, rtol=1e-6, atol=1e-6)
    relu = Conv2D(4, 3, activation="relu")
    relu.build((None, 5, 5, 2))
    assert not relu.absorb_affine(np.ones(4), np.zeros(4))


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda: Conv2D(0, 3), "filters must be a positive integer"),
        (lambda: Conv2D(4, (3, 0)), "kernel_size must be a positive integer"),
        (lambda: Conv2D(4, 3, padding="full"), "padding must be one of"),
        (lambda: Conv2D(4, 3, padding="causal"), "padding must be one of"),
        (lambda: Conv2D(6, 3, groups=4), "groups must be a positive integer dividing filters"),
        (lambda: Conv2D(4, 3, data_format="channels_first"), "channels_last"),
        (lambda: DepthwiseConv2D(3, depth_multiplier=0), "depth_multiplier must be a positive integer"),
    ],
)
def test_arguments_are_checked(bad, message):
    with pytest.raises(ValueError, match=message):
        bad()


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="does not fit input"):
        Conv2D(4, 7).build((None, 5, 5, 3))
    with pytest.raises(ValueError, match="expects inputs of rank 4"):
        Conv2D(4, 3).build((None, 5, 3))
    with pytest.raises(ValueError, match="not a multiple of groups=2"):
        Conv2D(4, 3, groups=2).build((None, 5, 5, 3))
    layer = Conv2D(4, 3)
    layer.build((None, 5, 5, 3))
    with pytest.raises(ValueError, match=r"kernel shape \(3, 3, 2, 4\) does not match"):
        layer.set_weights([np.zeros((3, 3, 2, 4)), np.zeros(4)])


def test_config_round_trips():
    layer = Conv2D(8, (3, 5), strides=2, padding="same", dilation_rate=1, groups=2, activation="relu", name="c")
    config = layer.get_config()
    assert config["kernel_size"] == (3, 5) and config["groups"] == 2
    assert Conv2D.from_config(config).get_config() == config
    sep = SeparableConv2D(4, 3, depth_multiplier=2, name="s")
    assert SeparableConv2D.from_config(sep.get_config()).get_config() == sep.get_config()


def test_the_plan_chooses_the_conv_algorithm_per_layer_geometry(device):
    """Each layer runs what malinn.choice.conv_choice chooses for its geometry (the library's
    conv_algorithms rules, untuned here): the patch matrix and a matmul for an im2col kernel, one
    conv step otherwise; every kind's rules end in a conv kernel that takes every layer."""
    from malinn.choice.conv_choice import ConvGeometry, choose_algorithm

    for h, c, m, k, batch in [(3, 3, 27, 3, 1), (13, 64, 64, 3, 7), (28, 256, 256, 3, 8)]:
        model = _run(Conv2D(m, k, padding="same"), np.zeros((1, h, h, c)))
        (geometry,) = model.conv_geometries(batch, device)
        assert isinstance(geometry, ConvGeometry) and (geometry.cin, geometry.cout, geometry.KH) == (c, m, k)
        spec, why = choose_algorithm(device, geometry)
        kinds = [s["kind"] for s in model.plan(batch).describe() if s["kind"] != "relayout"]
        assert why == "default" and kinds[:2] == (["im2col", "matmul"] if spec.op == "im2col" else ["conv"])
