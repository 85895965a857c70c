"""Property tests (hypothesis) over layouts and Dense/Sequential.

Random shapes (1 and odd sizes included), random Hybrid Morton layouts (R, C and multi-level
ones built at random), random activations and matmul kernels: everything agrees with numpy.
Examples are derandomised (the same on every run, so CI is reproducible) and bounded so that the
file runs in well under a minute; the device properties draw from pools small enough that most
examples reuse programs already built.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from support import activation as ref_activation
from support import assert_close

from malinn import Sequential, ops
from malinn.choice.matrix import DeviceMatrix
from malinn.layers import ELU, Activation, BatchNormalization, Dense, LeakyReLU, ReLU, Softmax
from malinn.library.kernel_library import load_library
from malinn.library.layout import Layout, convert

pytestmark = pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)

LIB = load_library()
MATMULS = LIB.codenames("matmul")
#: activations a Dense takes by name; relu_general is ReLU's (its parameters have no Keras default)
DENSE_ACTIVATIONS = ["linear"] + [a for a in LIB.activations() if a != "relu_general"]

HOST = settings(max_examples=150, deadline=None, derandomize=True, database=None)
DEVICE = settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
#: a random network may need several new programs (a fused GEMM build takes seconds on PoCL)
NETWORKS = settings(DEVICE, max_examples=15)

dims = st.one_of(st.integers(1, 9), st.sampled_from([13, 16, 17, 31, 33, 64, 65]))


@st.composite
def layouts(draw, max_levels=3):
    """A random valid layout ``B0[_Y1_X1_B1 ...]``: each chunk divides its parent."""
    levels = draw(st.integers(0, max_levels))
    bases = [draw(st.sampled_from("RC")) for _ in range(levels + 1)]
    blocks = []
    y, x = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 4]))
    for _ in range(levels):
        blocks.append((y, x))
        y, x = y * draw(st.sampled_from([1, 2, 3, 4])), x * draw(st.sampled_from([1, 2, 3, 4]))
    blocks.reverse()  # the largest chunk first
    text = bases[0] + "".join(f"_{by}_{bx}_{b}" for (by, bx), b in zip(blocks, bases[1:]))
    return Layout.parse(text)


def matrix(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ------------------------------------------------------------------------------ host layouts


@HOST
@given(layout=layouts(), rows=dims, cols=dims, ra=st.sampled_from([1, 2, 3, 4, 8]), ca=st.sampled_from([1, 2, 4, 5]))
def test_packing_follows_the_index_formula_and_pads_with_zeros(layout, rows, cols, ra, ca):
    assert Layout.parse(str(layout)) == layout
    m = matrix((rows, cols), rows * 97 + cols)
    padded = layout.padded_shape(rows, cols, ra, ca)
    assert padded[0] >= rows and padded[1] >= cols and padded[0] % ra == 0 and padded[1] % ca == 0
    assert padded[0] % layout.row_multiple == 0 and padded[1] % layout.col_multiple == 0
    flat = layout.pack(m, padded)
    table = layout.index_table(padded)
    np.testing.assert_array_equal(np.sort(table.ravel()), np.arange(padded[0] * padded[1]))  # a permutation
    np.testing.assert_array_equal(flat[table[:rows, :cols]], m)  # the formula
    padding = np.ones(padded, bool)
    padding[:rows, :cols] = False
    assert not flat[table[padding]].any()  # zeros
    np.testing.assert_array_equal(layout.unpack(flat, (rows, cols), padded), m)  # round trip


@HOST
@given(src=layouts(), dst=layouts(), rows=dims, cols=dims)
def test_host_conversion_between_any_two_layouts(src, dst, rows, cols):
    m = matrix((rows, cols), rows + 1000 * cols)
    sp, dp = src.padded_shape(rows, cols, 2, 4), dst.padded_shape(rows, cols, 4, 1)
    np.testing.assert_array_equal(convert(src.pack(m, sp), m.shape, src, sp, dst, dp), dst.pack(m, dp))


# ----------------------------------------------------------------------------- on the device

LAYOUT_POOL = ["R", "C", "C_4_2_C", "R_2_4_R", "C_4_4_C", "R_4_4_C", "R_16_16_C_4_4_R", "C_8_4_R_2_2_C"]


@DEVICE
@given(
    src=st.sampled_from(LAYOUT_POOL),
    dst=st.sampled_from(LAYOUT_POOL),
    rows=dims,
    cols=dims,
    align=st.sampled_from([(1, 1), (4, 4), (8, 2)]),
)
def test_device_relayout_between_layouts(device, src, dst, rows, cols, align):
    m = matrix((rows, cols), rows * cols)
    a = DeviceMatrix.upload(device, m, src, Layout.parse(src).padded_shape(rows, cols, 4, 4))
    padded = Layout.parse(dst).padded_shape(rows, cols, *align)
    r = ops.to_layout(a, device, dst, padded)
    assert r.padded == padded
    flat = np.empty(padded[0] * padded[1], np.float32)
    device.download(r.buffer, flat, what="the re-laid matrix")
    np.testing.assert_array_equal(flat, Layout.parse(dst).pack(m, padded))  # padding included


@DEVICE
@given(codename=st.sampled_from(MATMULS), m=dims, k=dims, n=dims, src=st.sampled_from(LAYOUT_POOL))
def test_matmul_of_any_shape_from_any_layout(device, codename, m, k, n, src):
    """The right operand starts in a random layout: matmul re-lays it out on the device."""
    assume(LIB[codename].has_source(device.backend))  # a kernel the device's backend runs
    a, b = matrix((m, k), m + k), matrix((k, n), k * n)
    bd = DeviceMatrix.upload(device, b, src)
    r = ops.matmul(DeviceMatrix.from_host(a), bd, LIB[codename], device)
    assert_close(r.numpy(), a.astype(np.float64) @ b.astype(np.float64))


@st.composite
def networks(draw):
    """(input width, [(kind, arguments)], batch): Dense layers of random widths and activations,
    with element-wise layers (Activation, ReLU, LeakyReLU, ELU, BatchNormalization, Softmax)
    between them."""
    layers = []
    for _ in range(draw(st.integers(1, 3))):
        layers.append(("dense", draw(dims), draw(st.sampled_from(DENSE_ACTIVATIONS)), draw(st.booleans())))
        if draw(st.integers(0, 3)) == 0:
            layers.append(
                draw(
                    st.sampled_from(
                        [
                            ("activation", draw(st.sampled_from(["relu", "tanh", "sigmoid", "gelu", "softsign"]))),
                            (
                                "relu",
                                draw(st.sampled_from([None, 1.5, 6.0])),
                                draw(st.sampled_from([0.0, 0.1])),
                                draw(st.sampled_from([0.0, 0.5, -0.5])),
                            ),
                            ("leaky_relu", draw(st.floats(0.0, 1.0))),
                            ("elu", draw(st.floats(0.1, 2.0))),
                            ("batch_norm",),
                            ("softmax",),
                        ]
                    )
                )
            )
    return draw(dims), layers, draw(st.integers(1, 40))


def build(network, seed):
    width, spec, _ = network
    rng = np.random.default_rng(seed)
    layers = []
    for item in spec:
        kind = item[0]
        if kind == "dense":
            layers.append(Dense(item[1], activation=item[2], use_bias=item[3]))
        elif kind == "activation":
            layers.append(Activation(item[1]))
        elif kind == "relu":
            layers.append(ReLU(max_value=item[1], negative_slope=item[2], threshold=item[3]))
        elif kind == "leaky_relu":
            layers.append(LeakyReLU(item[1]))
        elif kind == "elu":
            layers.append(ELU(item[1]))
        elif kind == "batch_norm":
            layers.append(BatchNormalization())
        else:
            layers.append(Softmax())
    model = Sequential(layers)
    model.build((None, width))
    for layer in model.layers:
        weights = [
            rng.standard_normal(w.shape).astype(np.float32) / np.sqrt(max(1, w.shape[0])) for w in layer.get_weights()
        ]
        if isinstance(layer, BatchNormalization):
            weights[-1] = np.abs(weights[-1]) + 0.5
        layer.set_weights(weights)
    return model


def numpy_forward(model, x):
    """The float64 forward pass and the largest magnitude any layer produced."""
    h = x.astype(np.float64)
    largest = float(np.abs(h).max())
    with np.errstate(all="ignore"):
        for layer in model.layers:
            w = [v.astype(np.float64) for v in layer.get_weights()]
            if isinstance(layer, Dense):
                h = h @ w[0] + (w[1] if layer.use_bias else 0.0)
                h = ref_activation(layer.activation, h, axis=-1)
            elif isinstance(layer, BatchNormalization):
                gamma, beta, mean, var = w
                h = (h - mean) / np.sqrt(var + layer.epsilon) * gamma + beta
            else:  # Activation, ReLU, LeakyReLU, ELU, Softmax
                h = ref_activation(layer.activation, h, axis=-1, **layer.params)
            largest = max(largest, float(np.abs(h).max()))
    return h, largest


@NETWORKS
@given(network=networks(), codename=st.sampled_from(MATMULS))
def test_sequential_of_random_layers_matches_numpy(device, network, codename):
    ops.use("matmul", codename, device)
    model = build(network, seed=len(network[1]))
    x = matrix((network[2], network[0]), network[2]) * 2
    want, largest = numpy_forward(model, x)
    assume(largest < 1e30)  # float32 overflows where float64 does not (chained exponentials): not a bug
    got = model.predict(x)
    assert got.shape == (network[2], model.output_shape[-1]) and got.dtype == np.float32
    assert_close(got, want, rtol=2e-5)
    if network[2] > 1:  # a split into passes changes nothing
        assert_close(model.predict(x, batch_size=max(1, network[2] // 3)), got, rtol=1e-5)


@pytest.mark.parametrize("codename", MATMULS)
def test_every_dense_activation_through_each_matmul(device, codename):
    """Every activation a Dense takes, with each kernel, on a batch large enough for any kernel's
    preconditions (so a fused epilogue runs where a kernel has one: there it once gave elu and
    leaky_relu a parameter of 0)."""
    ops.use("matmul", codename, device)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((40, 9)).astype(np.float32) * 2
    failures = []
    names = DENSE_ACTIVATIONS
    if getattr(LIB[codename], "epilogue", False):
        # each fused activation is a build of the whole GEMM (seconds on PoCL); the formulas are the
        # activation kernels' (checked one by one in test_ops.py), so check what the fusion adds:
        # the parameters (elu, leaky_relu), the bias alone (linear) and the unfused softmax
        names = ["linear", "elu", "leaky_relu", "softmax"]
    for name in names:
        model = Sequential([Dense(6, activation=name)])
        model.build((None, 9))
        model.set_weights(
            [rng.standard_normal((9, 6)).astype(np.float32) / 3, rng.standard_normal(6).astype(np.float32)]
        )
        try:
            assert_close(model.predict(x), numpy_forward(model, x)[0], rtol=2e-5)
        except AssertionError as exc:
            failures.append(f"{name}: {exc}")
    assert not failures, failures
