"""Every kernel against its numpy reference, on odd shapes, on every working device."""

import math

import numpy as np
import pytest
from support import activation as ref_activation
from support import assert_close, program_key

from malinn import ops
from malinn.choice.kernel_choice import explicit_choice
from malinn.choice.matrix import DeviceMatrix
from malinn.errors import DeviceError, LibraryError
from malinn.library.kernel_library import load_library
from malinn.library.layout import Layout

pytestmark = pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)

LIB = load_library()
MATMULS = LIB.codenames("matmul")
SHAPES = [(1, 1, 1), (3, 5, 7), (13, 37, 5), (64, 64, 64), (100, 784, 150), (1001, 1003, 1)]
LAYOUTS = ["R", "C", "C_4_2_C", "C_4_4_C", "R_2_4_R", "R_16_16_C_4_4_R"]


@pytest.mark.parametrize("codename", MATMULS)
@pytest.mark.parametrize("m, k, n", SHAPES, ids=lambda v: str(v))
def test_matmul_matches_numpy(device, codename, m, k, n, rng):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    r = ops.matmul(DeviceMatrix.from_host(a), DeviceMatrix.from_host(b), LIB[codename], device)
    assert r.layout == LIB[codename].matrices["r"].layout
    assert_close(r.numpy(), a.astype(np.float64) @ b.astype(np.float64))


@pytest.mark.parametrize("codename", MATMULS)
def test_matmul_padding_of_the_result_is_zero(device, codename, rng):
    a = rng.standard_normal((5, 7)).astype(np.float32)
    b = rng.standard_normal((7, 3)).astype(np.float32)
    r = ops.matmul(DeviceMatrix.from_host(a), DeviceMatrix.from_host(b), LIB[codename], device)
    full = r.layout.unpack(_download(r), r.padded, r.padded)
    assert np.count_nonzero(full[5:, :]) == 0 and np.count_nonzero(full[:, 3:]) == 0


def _download(matrix):
    flat = np.empty(matrix.padded[0] * matrix.padded[1], np.float32)
    matrix.device.download(matrix.buffer, flat, what="the padded matrix")
    return flat


def test_matmul_rejects_mismatched_inner_dimensions(device):
    with pytest.raises(ValueError, match=r"cannot multiply \(3, 4\) by \(5, 2\)"):
        ops.matmul(DeviceMatrix.from_host(np.zeros((3, 4))), DeviceMatrix.from_host(np.zeros((5, 2))), device=device)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (13, 1), (1001, 3)], ids=str)
def test_scale_shift_in_every_layout(device, layout, shape, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    scale, shift = rng.standard_normal((2, shape[0])).astype(np.float32)
    m = DeviceMatrix.upload(device, x, layout, Layout.parse(layout).padded_shape(*shape, 4, 4))
    ops.affine(m, ops.upload_vector(device, scale), ops.upload_vector(device, shift))
    assert_close(m.numpy(), x * scale[:, None] + shift[:, None])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (13, 1), (1001, 3)], ids=str)
def test_bias_add_in_every_layout(device, layout, shape, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    bias = rng.standard_normal(shape[0]).astype(np.float32)
    padded = Layout.parse(layout).padded_shape(*shape, 4, 4)
    m = DeviceMatrix.upload(device, x, layout, padded)
    ops.bias_add(m, ops.upload_vector(device, bias))
    assert_close(m.numpy(), x + bias[:, None])
    full = Layout.parse(layout).unpack(_download(m), padded, padded)
    assert np.count_nonzero(full[shape[0] :, :]) == 0 and np.count_nonzero(full[:, shape[1] :]) == 0


PARAMS = {
    "elu": [{}, {"alpha": 0.3}],
    "leaky_relu": [{}, {"negative_slope": 0.01}],
    "relu_general": [
        {"negative_slope": 0.1, "max_value": 2.5, "threshold": 0.5, "has_max_value": 1.0},
        {"negative_slope": 0.0, "max_value": 1.0, "threshold": 0.0, "has_max_value": 1.0},
        {"negative_slope": 0.2, "threshold": -0.5},
        {"threshold": 1.5},
    ],
}
CASES = [(name, p) for name in LIB.activations() for p in PARAMS.get(name, [{}])]


def test_every_library_activation_has_a_reference():
    from support import ACTIVATIONS

    assert set(LIB.activations()) - {"softmax"} <= set(ACTIVATIONS)


@pytest.mark.parametrize("name, params", CASES, ids=[f"{n}{p or ''}" for n, p in CASES])
@pytest.mark.parametrize(
    "layout, shape", [("C_4_2_C", (1, 1)), ("R", (5, 3)), ("C_4_4_C", (13, 7)), ("R_16_16_C_4_4_R", (1001, 5))], ids=str
)
def test_activation_matches_its_formula(device, name, params, layout, shape, rng):
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    padded = Layout.parse(layout).padded_shape(*shape, 4, 4)
    m = DeviceMatrix.upload(device, x, layout, padded)
    ops.activation(m, name, **params)
    # the matrix is features x batch, so softmax runs over axis 0 (each column is a sample)
    assert_close(m.numpy(), ref_activation(name, x.astype(np.float64), axis=0, **params))
    full = Layout.parse(layout).unpack(_download(m), padded, padded)
    assert np.count_nonzero(full[shape[0] :, :]) == 0 and np.count_nonzero(full[:, shape[1] :]) == 0


def test_softmax_is_numerically_stable(device):
    x = np.array([[1000.0, -1000.0], [1001.0, -999.0], [999.0, -1001.0]], np.float32)
    m = DeviceMatrix.upload(device, x, "C_4_2_C")
    got = ops.activation(m, "softmax").numpy()
    assert np.isfinite(got).all()
    assert_close(got, ref_activation("softmax", x.astype(np.float64), axis=0))


def test_unknown_activation_parameter_is_named(device):
    m = DeviceMatrix.upload(device, np.ones((2, 2)), "R")
    with pytest.raises(ValueError, match=r"takes parameters \['alpha'\], not \['beta'\]"):
        ops.activation(m, "elu", beta=1.0)


@pytest.mark.parametrize("name", ["relu", "sigmoid", "tanh", "softmax", "gelu", "hard_sigmoid", "elu", "softplus"])
def test_nan_and_inf_propagate_like_the_formula(device, name):
    x = np.array([[np.nan, 1.0, np.inf], [2.0, -np.inf, 0.5]], np.float32)
    m = DeviceMatrix.upload(device, x, "C")
    got = ops.activation(m, name).numpy()
    want = ref_activation(name, x.astype(np.float64), axis=0)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6)


def test_linear_activation_launches_nothing(device):
    m = DeviceMatrix.upload(device, np.ones((3, 3)), "R")
    before = device.counters["launches"]
    assert ops.activation(m, "linear") is m and device.counters["launches"] == before


def test_unknown_activation_is_named(device):
    m = DeviceMatrix.upload(device, np.ones((3, 3)), "R")
    with pytest.raises(ValueError, match="no kernel computes activation 'swishy'"):
        ops.activation(m, "swishy")


@pytest.mark.parametrize("src", LAYOUTS)
@pytest.mark.parametrize("dst", ["R", "C_4_2_C", "R_4_4_C"])
def test_relayout_on_the_device(device, src, dst, rng):
    x = rng.standard_normal((13, 7)).astype(np.float32)
    m = DeviceMatrix.upload(device, x, src, Layout.parse(src).padded_shape(13, 7, 8, 4))
    padded = Layout.parse(dst).padded_shape(13, 7, 4, 8)
    r = ops.to_layout(m, device, dst, padded)
    assert r.layout == Layout.parse(dst) and r.padded == padded
    np.testing.assert_array_equal(_download(r), Layout.parse(dst).pack(x, padded))


def test_in_layout_is_a_no_op_when_it_already_matches(device):
    m = DeviceMatrix.upload(device, np.ones((5, 5)), "C_4_2_C")
    assert ops.to_layout(m, device, "C_4_2_C", m.padded) is m


def test_use_changes_the_kernel_and_rejects_mismatches(device):
    ops.use("matmul", "crossv", device)
    assert ops.kernel_for("matmul", device).codename == "crossv"
    with pytest.raises(LibraryError, match="implements 'activation', not 'matmul'"):
        ops.use("matmul", "relu", device)
    with pytest.raises(LibraryError, match="no kernel with codename"):
        ops.use("matmul", "fastest", device)


def test_use_refuses_a_configuration_the_device_cannot_launch(device, monkeypatch):
    """A choice whose work-group or local memory is beyond the device would be replaced by a fallback
    kernel at every layer, without a word: refused where it is made, naming the limit."""
    monkeypatch.setattr(device, "max_work_group_size", 64)
    with pytest.raises(
        DeviceError,
        match=r"'gemm_tiled' in configuration \{'MDIMC': 16\} runs work-groups of 256 "
        r"items; .* launches at most 64",
    ):
        ops.use("matmul", "gemm_tiled", device, {"MDIMC": 16})
    monkeypatch.setattr(device, "max_work_group_size", 256)
    monkeypatch.setattr(device, "local_memory", 1024)
    with pytest.raises(DeviceError, match=r"'gemv' in its defaults needs 9,\d+ bytes of local memory; .* has 1,024"):
        ops.use("matmul", "gemv", device)
    assert explicit_choice("matmul", device) is None
    ops.use("matmul", "crossv", device)  # 64 items, no local memory
    assert ops.kernel_for("matmul", device).codename == "crossv"


def test_upload_and_download_are_counted(device):
    before = dict(device.counters)
    m = DeviceMatrix.upload(device, np.arange(6, dtype=np.float32).reshape(2, 3), "R")
    m.host = None
    np.testing.assert_array_equal(m.numpy(), np.arange(6).reshape(2, 3))
    assert device.counters["uploads"] == before["uploads"] + 1
    assert device.counters["downloads"] == before["downloads"] + 1


def _distinct_programs(pairs):
    """``(codename, config)`` pairs, each program once (support.program_key: a variant that differs
    from its parent only in preconditions runs the parent's programs)."""
    seen = set()
    for codename, config in pairs:
        key = program_key(LIB[codename].configure(config))
        if key not in seen:
            seen.add(key)
            yield codename, config


TUNABLE = list(
    _distinct_programs(
        (codename, config)
        for codename in MATMULS
        for config in LIB[codename].configurations()
        if LIB[codename].candidates
    )
)


@pytest.mark.parametrize(
    "codename, config", TUNABLE, ids=[f"{c}-" + "-".join(f"{k}{v}" for k, v in cfg.items()) for c, cfg in TUNABLE]
)
def test_every_configuration_the_tuner_can_emit_matches_numpy(device, codename, config, rng):
    spec = LIB[codename].configure(config)
    if spec.workgroup and np.prod(spec.workgroup) > device.max_work_group_size:
        pytest.skip(f"work-group {spec.workgroup} exceeds {device.name}'s {device.max_work_group_size}")
    if config not in LIB[codename].configurations(device):
        pytest.skip(f"{codename} {config} needs more local memory than {device.name}'s {device.local_memory} bytes")
    for m, k, n in [(1, 1, 1), (13, 37, 5), (33, 17, 65), (100, 784, 150)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        r = ops.matmul(DeviceMatrix.from_host(a), DeviceMatrix.from_host(b), spec, device)
        assert_close(r.numpy(), a.astype(np.float64) @ b.astype(np.float64))


@pytest.mark.parametrize("activation", ["linear", "relu", "gelu", "elu", "softmax"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_fused_epilogue_matches_separate_kernels(device, activation, with_bias, rng):
    """gemm_tiled fuses bias and an element-wise activation; its work-groups do not hold whole
    columns, so softmax runs after it as its own kernel (the bias still fused)."""
    spec = LIB["gemm_tiled"]
    a = rng.standard_normal((37, 29)).astype(np.float32)
    b = rng.standard_normal((29, 21)).astype(np.float32)
    bias = rng.standard_normal(37).astype(np.float32)
    before = device.counters["launches"]
    r = ops.matmul(
        DeviceMatrix.from_host(a),
        DeviceMatrix.from_host(b),
        spec,
        device,
        bias=ops.upload_vector(device, bias) if with_bias else None,
        activation=activation,
        params={"alpha": 0.5} if activation == "elu" else None,
    )
    launches = device.counters["launches"] - before
    z = a.astype(np.float64) @ b + (bias[:, None] if with_bias else 0)
    params = {"alpha": 0.5} if activation == "elu" else {}
    assert_close(r.numpy(), ref_activation(activation, z, axis=0, **params))
    assert launches == (1 if activation != "softmax" else 2)  # softmax is not gemm_tiled's to fuse
    full = r.layout.unpack(_download(r), r.padded, r.padded)
    assert np.count_nonzero(full[37:, :]) == 0 and np.count_nonzero(full[:, 21:]) == 0


def test_small_batches_fall_back_to_the_general_kernel(device):
    """Below gemm_tiled's batch, the first of the fallbacks whose preconditions hold: a gemv kernel
    (gemv on a CPU, gemv_split_c on a GPU) with NB >= n up to its bound, then the general kernel."""
    ops.use("matmul", "gemm_tiled", device)
    assert ops.kernel_for("matmul", device, (64, 64, 100)).codename == "gemm_tiled"
    fallbacks = LIB.default_specs("matmul_fallback", device.kind, device.backend)
    bound = max(dict(f.preconditions).get("max_n", 0) for f in fallbacks)
    for n in range(1, 16):
        small = ops.kernel_for("matmul", device, (64, 64, n))
        want = next((f for f in fallbacks if f.accepts(64, 64, n)), fallbacks[-1])
        assert (small.codename, small.defines) == (want.codename, want.defines)
        if n <= bound:
            assert small.codename.startswith("gemv") and int(small.config["NB"]) >= n
        else:
            assert small.codename == fallbacks[-1].codename and not fallbacks[-1].preconditions


def test_image_operand_is_made_once_and_kept(device, rng):
    if not device.image_support:
        pytest.skip(f"{device.name} has no image support")
    spec = LIB["gemm_image"]
    a = DeviceMatrix.from_host(rng.standard_normal((9, 11)).astype(np.float32))
    a = ops.to_layout(a, device, spec.matrices["a"].layout, ops.matmul_plan(spec, 9, 11, 3)["a"])
    for n in (3, 17):
        b = rng.standard_normal((11, n)).astype(np.float32)
        r = ops.matmul(a, DeviceMatrix.from_host(b), spec, device)
        assert_close(r.numpy(), a.numpy().astype(np.float64) @ b)
    assert a.image is not None


def test_image_kernels_fall_back_where_images_do_not_fit(device):
    ops.use("matmul", "gemm_image", device)
    fallbacks = LIB.default_specs("matmul_fallback", device.kind, device.backend)
    fallback = next((f for f in fallbacks if f.accepts(64, 64, 64)), fallbacks[-1])  # the first that holds
    assert ops.kernel_for("matmul", device, (64, 64, 64)).codename == (
        "gemm_image" if device.image_support else fallback.codename
    )
    too_deep = (64, device.image2d_max_size[1] + 4 if device.image_support else 64, 8)
    assert ops.kernel_for("matmul", device, too_deep).codename != "gemm_image"


# ------------------------------------------------------------------ one launch per Dense layer

# every matmul kernel fuses: the bias and a four-parameter activation (relu_general, non-default
# parameters: every float parameter reaches the epilogue); the bias, an activation and the affine
# step; and one more, a different one per kernel in turn: the bias alone or another activation
# family (the formulas are activations.clh's, shared by every epilogue: each still runs on several
# kernels). A matmul without epilogue is test_matmul_matches_numpy's.
EPILOGUES = {
    "relu_general": (
        "relu_general",
        {"negative_slope": 0.1, "max_value": 2.5, "threshold": 0.5, "has_max_value": 1.0},
        False,
    ),
    "selu+affine": ("selu", {}, True),
}
ROTATED = {
    "bias": ("linear", {}, False),
    "relu": ("relu", {}, False),
    "sigmoid": ("sigmoid", {}, False),
    "tanh": ("tanh", {}, False),
    "gelu": ("gelu", {}, False),
    "elu": ("elu", {"alpha": 0.3}, False),
}
EPILOGUE_CASES = [
    (codename, name)
    for i, codename in enumerate(MATMULS)
    for name in list(EPILOGUES) + [list(ROTATED)[i % len(ROTATED)]]
]
EPILOGUE_SHAPES = [(1, 1, 1), (3, 5, 7), (13, 37, 5), (33, 17, 65), (1001, 3, 1)]


def _full(matrix):
    """The whole padded matrix, padding included, as the device holds it."""
    return matrix.layout.unpack(_download(matrix), matrix.padded, matrix.padded)


def _dense_reference(a, b, bias, activation, params, affine):
    z = a.astype(np.float64) @ b.astype(np.float64)
    if bias is not None:
        z = z + bias[:, None]
    z = ref_activation(activation or "linear", z, axis=0, **params)
    if affine is not None:
        z = z * affine[0][:, None] + affine[1][:, None]
    return z


@pytest.mark.parametrize("codename, epilogue", EPILOGUE_CASES, ids=[f"{c}-{e}" for c, e in EPILOGUE_CASES])
def test_every_matmul_fuses_its_epilogue_in_one_launch(device, codename, epilogue, rng):
    """bias, activation and affine in the kernel's final write, on odd shapes; R's padding 0."""
    if LIB[codename].matrices["a"].image and not device.image_support:
        pytest.skip(f"{device.name} has no image support")
    activation, params, with_affine = {**EPILOGUES, **ROTATED}[epilogue]
    for m, k, n in EPILOGUE_SHAPES:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        bias = rng.standard_normal(m).astype(np.float32) if activation else None
        affine = tuple(rng.standard_normal((2, m)).astype(np.float32)) if with_affine else None
        before = device.counters["launches"]
        r = ops.matmul(
            DeviceMatrix.from_host(a),
            DeviceMatrix.from_host(b),
            LIB[codename],
            device,
            bias=None if bias is None else ops.upload_vector(device, bias),
            activation=activation or "linear",
            params=params,
            affine=None if affine is None else tuple(ops.upload_vector(device, v) for v in affine),
        )
        assert device.counters["launches"] - before == 1, (m, k, n)
        assert_close(r.numpy(), _dense_reference(a, b, bias, activation, params, affine))
        full = _full(r)
        assert np.count_nonzero(full[m:, :]) == 0 and np.count_nonzero(full[:, n:]) == 0, (m, k, n)


@pytest.mark.parametrize("codename", MATMULS)
def test_infinite_inputs_leave_the_padding_of_the_result_zero(device, codename, rng):
    """An Inf in B times A's zero padding rows is NaN: the kernels write R's padding as 0 instead
    of computing it, so nothing but zeros ever reaches the next layer's padding."""
    if LIB[codename].matrices["a"].image and not device.image_support:
        pytest.skip(f"{device.name} has no image support")
    m, k, n = 5, 7, 3
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    b[2, 1] = np.inf
    r = ops.matmul(DeviceMatrix.from_host(a), DeviceMatrix.from_host(b), LIB[codename], device)
    full = _full(r)
    assert np.count_nonzero(full[m:, :]) == 0 and np.count_nonzero(full[:, n:]) == 0
    assert np.isinf(full[:m, 1]).all() or np.isnan(full[:m, 1]).any()
    assert_close(r.numpy()[:, [0, 2]], a.astype(np.float64) @ b[:, [0, 2]])


@pytest.mark.parametrize("codename", MATMULS)
def test_a_left_operand_padded_more_than_the_result_serves_as_it_is(device, codename, rng):
    """Kernels index A with its own padded shape and read k < l only: a weight buffer padded
    further (here with NaN beyond what the kernel needs) is used without re-layout, and the result
    is bit for bit the one from the exactly padded buffer."""
    spec = LIB[codename]
    if spec.matrices["a"].image and not device.image_support:
        pytest.skip(f"{device.name} has no image support")
    layout = spec.matrices["a"].layout
    for m, k, n in [(3, 5, 7), (13, 37, 5), (33, 17, 1)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = DeviceMatrix.from_host(rng.standard_normal((k, n)).astype(np.float32))
        need = ops.matmul_plan(spec, m, k, n)["a"]
        rows, cols = spec.matrices["a"].row_multiple, spec.matrices["a"].col_multiple
        big = (need[0] + 2 * math.lcm(rows, 4), need[1] + 3 * math.lcm(cols, 4))
        full = np.zeros(big, np.float32)
        full[need[0] :, :] = np.nan  # beyond what the kernel may read
        full[:, need[1] :] = np.nan
        full[:m, :k] = a
        wide = DeviceMatrix.upload_flat(device, layout.pack(full, big), (m, k), layout, big, "wide A")
        before = device.counters["launches"]
        got = ops.matmul(wide, b, spec, device).numpy()
        assert device.counters["launches"] - before == 1, "A was re-laid out"
        exact = ops.matmul(DeviceMatrix.from_host(a), b, spec, device).numpy()
        np.testing.assert_array_equal(got, exact)
        assert_close(got, a.astype(np.float64) @ b.numpy())


GEMV_CONFIGS = [c for c in LIB["gemv"].configurations()]


@pytest.mark.parametrize("config", GEMV_CONFIGS, ids=["-".join(f"{k}{v}" for k, v in c.items()) for c in GEMV_CONFIGS])
def test_gemv_at_every_batch_up_to_its_bound(device, config, rng):
    """Every configuration of gemv the library names or the tuner can emit, at n = 1 .. NB (its
    max_n), on odd m and k, with a fused bias and activation."""
    spec = LIB["gemv"].configure(config)
    if np.prod(spec.workgroup) > device.max_work_group_size:
        pytest.skip(f"work-group {spec.workgroup} exceeds {device.name}'s {device.max_work_group_size}")
    bound = dict(spec.preconditions)["max_n"]
    assert bound == int(config["NB"])
    for m, k in [(1, 1), (7, 13), (131, 67), (1001, 3)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        bias = rng.standard_normal(m).astype(np.float32)
        weights = DeviceMatrix.from_host(a)
        for n in range(1, bound + 1):
            assert spec.accepts(m, k, n) and not spec.accepts(m, k, bound + 1)
            b = rng.standard_normal((k, n)).astype(np.float32)
            r = ops.matmul(
                weights,
                DeviceMatrix.from_host(b),
                spec,
                device,
                bias=ops.upload_vector(device, bias),
                activation="tanh",
            )
            assert_close(r.numpy(), _dense_reference(a, b, bias, "tanh", {}, None))


def test_gemv_results_are_bit_identical_run_after_run(device, rng):
    """The K split is reduced in local memory in a fixed order (no atomics)."""
    a = DeviceMatrix.from_host(rng.standard_normal((300, 2001)).astype(np.float32))
    b = DeviceMatrix.from_host(rng.standard_normal((2001, 3)).astype(np.float32))
    for config in GEMV_CONFIGS:
        spec = LIB["gemv"].configure(config)
        if np.prod(spec.workgroup) > device.max_work_group_size:
            continue
        first = ops.matmul(a, b, spec, device).numpy().copy()
        for _ in range(3):
            np.testing.assert_array_equal(ops.matmul(a, b, spec, device).numpy(), first)


@pytest.mark.parametrize("m", [1, 10, 1000])
def test_softmax_head_is_one_launch(device, m, rng):
    """Dense(m, activation="softmax") in one launch (a work-group holds whole columns), for
    any batch; the kernel is the library's matmul_softmax in the first configuration that holds m."""
    k = 37
    spec = ops.kernel_for("matmul", device, (m, k, 100), activation="softmax")
    assert "softmax" in spec.epilogue and spec.accepts(m, k, 100)
    a = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    for n in (1, 7, 100):
        b = (rng.standard_normal((k, n)) * 2).astype(np.float32)
        before = device.counters["launches"]
        r = ops.matmul(
            DeviceMatrix.from_host(a),
            DeviceMatrix.from_host(b),
            spec,
            device,
            bias=ops.upload_vector(device, bias),
            activation="softmax",
        )
        assert device.counters["launches"] - before == 1
        got = r.numpy()
        assert_close(got, _dense_reference(a, b, bias, "softmax", {}, None))
        np.testing.assert_allclose(got.sum(axis=0), 1.0, rtol=1e-5)
        full = _full(r)
        assert np.count_nonzero(full[m:, :]) == 0 and np.count_nonzero(full[:, n:]) == 0


def test_softmax_head_keeps_nan_and_inf_in_their_column(device, rng):
    """A NaN or Inf in one sample makes that sample's column NaN (as the softmax kernel does), and
    no other column changes; numerically stable on large values."""
    m, k, n = 10, 6, 5
    spec = ops.kernel_for("matmul", device, (m, k, n), activation="softmax")
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    b[:, 4] *= 400  # large logits: exp would overflow without the max
    b[2, 1] = np.nan
    b[4, 3] = np.inf
    r = ops.matmul(DeviceMatrix.from_host(a), DeviceMatrix.from_host(b), spec, device, activation="softmax")
    got = r.numpy()
    assert np.isnan(got[:, 1]).all() and np.isnan(got[:, 3]).all()
    clean = [0, 2, 4]
    assert np.isfinite(got[:, clean]).all()
    assert_close(got[:, clean], _dense_reference(a, b[:, clean], None, "softmax", {}, None))
    standalone = ops.activation(
        ops.matmul(DeviceMatrix.from_host(a), DeviceMatrix.from_host(b), LIB["gemv"], device), "softmax"
    ).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(standalone))


def test_softmax_is_fused_only_where_a_work_group_holds_the_columns(device, rng):
    """gemv_softmax holds at most 1024 units per column; beyond, ops.matmul runs the separate
    softmax kernel after it (and kernel_for keeps the device's own choice)."""
    largest = max(
        dict(LIB["gemv_softmax"].configure(c).preconditions)["max_m"] for c in LIB["gemv_softmax"].configurations()
    )
    m, k, n = largest + 1, 3, 2
    assert ops.kernel_for("matmul", device, (m, k, n), activation="softmax").codename != "gemv_softmax"
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    before = device.counters["launches"]
    r = ops.matmul(
        DeviceMatrix.from_host(a), DeviceMatrix.from_host(b), LIB["gemv_softmax"], device, activation="softmax"
    )
    assert device.counters["launches"] - before == 2
    assert_close(r.numpy(), _dense_reference(a, b, None, "softmax", {}, None))


@pytest.mark.parametrize("src, dst", [("R", "C"), ("C", "R"), ("C_4_2_C", "R_2_4_R"), ("C", "C")])
@pytest.mark.parametrize(
    "shape, view",
    [((1, 1), (1, 1)), ((3, 5), (15, 1)), ((13, 7), (7, 13)), ((1001, 3), (3, 1001)), ((6, 10), (4, 15))],
    ids=str,
)
def test_reshape_keeps_the_flat_order_between_layouts(device, src, dst, shape, view, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    m = DeviceMatrix.upload(device, x, src, Layout.parse(src).padded_shape(*shape, 4, 4))
    padded = Layout.parse(dst).padded_shape(*view, 8, 4)
    r = ops.reshape(m, view, dst, padded)
    np.testing.assert_array_equal(r.numpy(), x.T.reshape(-1).reshape(view[1], view[0]).T)
    full = Layout.parse(dst).unpack(_download(r), padded, padded)
    assert np.count_nonzero(full[view[0] :, :]) == 0 and np.count_nonzero(full[:, view[1] :]) == 0
