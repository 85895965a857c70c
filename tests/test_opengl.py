"""The OpenGL backend (malinn/backends/opengl.py): what is particular to it.

Every test that takes the ``device`` fixture already runs on the OpenGL devices too (each kernel
against numpy on odd shapes, the models, the Keras equivalence suite); this file checks the
backend's own parts: discovery and device choice, the GLSL index macros against
``Layout.index``, build and allocation errors, and a model file moving between the backends.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from support import assert_close

import malinn
from malinn import Sequential, ops
from malinn.choice import conv_choice
from malinn.choice.conv_geometry import ConvGeometry
from malinn.choice.matrix import DeviceMatrix
from malinn.errors import DeviceError, KernelBuildError, LibraryError
from malinn.layers import (
    Activation,
    BatchNormalization,
    Conv2D,
    Dense,
    DepthwiseConv2D,
    Flatten,
    GlobalAveragePooling2D,
    Softmax,
)
from malinn.library.kernel_library import load_library
from malinn.library.layout import Layout

pytest.importorskip("moderngl", reason="the OpenGL backend's extra is not installed (pip install malinn[gl])")
from malinn.backends import opengl  # noqa: E402

GL = [d for d in malinn.devices() if d.backend == "gl"]
needs_gl = pytest.mark.skipif(not GL, reason="no working OpenGL device (EGL with OpenGL 4.3 or ES 3.1)")


def test_an_opengl_device_is_found_where_egl_works():
    """.ci/setup --test installs Mesa's EGL and llvmpipe: CI must find at least that device."""
    assert GL, "moderngl is installed but no OpenGL device was found: run .ci/setup --test"
    for d in GL:
        assert d.backend == "gl" and d.index == ("gl", d.index[1])
        assert d.opencl_c_version == "GLSL ES 3.10" and d.identity.startswith("gl|")
        assert str(d).startswith(f"[gl:{d.index[1]}] {d.name}")
        assert d.max_allocation > 0 and d.local_memory >= 16384 and d.max_work_group_size >= 128


@needs_gl
@pytest.mark.parametrize("spec", ["gl", "GL", "gl:0", "gl:llvmpipe", "gl:cpu"])
def test_set_device_names_the_backend(spec):
    previous = malinn.get_device()
    try:
        if spec == "gl:llvmpipe" and "llvmpipe" not in GL[0].name:
            spec = f"gl:{GL[0].name}"
        if spec == "gl:cpu" and GL[0].kind != "cpu":
            spec = "gl:gpu"
        assert malinn.set_device(spec) is GL[0]
    finally:
        malinn.set_device(previous)


@needs_gl
def test_an_unknown_gl_device_is_named_with_the_working_ones():
    with pytest.raises(DeviceError, match=r"no working device gl:7; working devices: .*gl:0 "):
        malinn.set_device("gl:7")


@needs_gl
def test_malinn_device_environment_and_the_cli_list_gl_devices():
    env = {**os.environ, "MALINN_DEVICE": "gl"}
    env.pop("MALINN_GL", None)
    out = subprocess.run(
        [sys.executable, "-c", "import malinn; print(malinn.get_device().backend)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.strip() == "gl", out.stderr[-2000:]
    out = subprocess.run(
        [sys.executable, "-m", "malinn.cli", "devices"], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert re.search(r"^\* \[gl:0\] ", out.stdout, re.M), out.stdout


def test_opengl_stays_unloaded_when_asked_or_beside_an_opencl_gpu(monkeypatch):
    monkeypatch.setenv("MALINN_GL", "0")
    assert opengl.discover([], force=True) == []
    monkeypatch.delenv("MALINN_GL")
    gpu = type("D", (), {"kind": "gpu"})()
    assert not opengl.wanted([gpu]) and opengl.wanted([])
    monkeypatch.setenv("MALINN_GL", "1")
    assert opengl.wanted([gpu])


@pytest.mark.parametrize("rep", ["R", "C", "R_2_4_R", "C_4_2_C", "R_4_4_C", "R_16_16_C_4_4_R"])
@pytest.mark.parametrize("shape", [(5, 3), (13, 7), (16, 16)], ids=str)
def test_gl_index_macro_equals_layout_index(rep, shape):
    """The GLSL macro, run on the device, gives Layout.index for every element of the padded matrix."""
    if not GL:
        pytest.skip("no working OpenGL device")
    device = GL[0]
    layout = Layout.parse(rep)
    prows, pcols = layout.padded_shape(*shape, 4, 4)
    source = (
        opengl.gl_index_macro(layout, "IX")
        + """
MALINN_ARGS(uint prows; uint pcols;)
layout(std430, binding = 0) writeonly buffer BufOut { uint ix[]; };
void main() {
    MALINN_GUARD
    uint r = gl_GlobalInvocationID.x, c = gl_GlobalInvocationID.y;
    ix[r * pcols + c] = IX(r, c, prows, pcols);
}
"""
    )
    out = device.alloc(4 * prows * pcols, "indices")
    program = device.compile(source, origin="index test")
    device.launch_all(
        [
            device.bind(
                program, "main", [np.uint32(prows), np.uint32(pcols), out], (prows, pcols), None, what="index test"
            )
        ]
    )
    got = np.empty(prows * pcols, np.uint32)
    device.download(out, got)
    rows, cols = np.meshgrid(np.arange(prows), np.arange(pcols), indexing="ij")
    want = layout.index(rows, cols, (prows, pcols)).reshape(-1)
    np.testing.assert_array_equal(got, want)


@needs_gl
def test_a_failed_glsl_build_names_the_origin_options_and_log():
    device = GL[0]
    program = device.compile(
        "MALINN_ARGS(uint n;)\nvoid main() { float x = undeclared_thing; }", ("-DMALINN_TEST=1",), origin="broken.comp"
    )
    with pytest.raises(KernelBuildError) as info:
        device.bind(program, "main", [np.uint32(1)], (1,), None, what="broken")
    text = str(info.value)
    assert "broken.comp" in text and "-DMALINN_TEST=1" in text and "undeclared_thing" in text
    assert device.name in text


@needs_gl
def test_programs_are_linked_once_per_work_group_shape():
    device = GL[0]
    source = "MALINN_ARGS(uint n;)\nlayout(std430, binding = 0) buffer B { float x[]; };\nvoid main() { x[0] = 1.0; }"
    program = device.compile(source, ("-DX=1",))
    assert device.compile(source, ("-DX=1",)) is program
    buffer = device.alloc(4, "x")
    linked = lambda: device.counters["builds"] + device.counters["binary_hits"]  # noqa: E731  (a cache hit links too)
    before = linked()
    for _ in range(3):
        device.bind(program, "main", [np.uint32(1), buffer], (1,), (1,))
    device.bind(program, "main", [np.uint32(1), buffer], (4,), (4,))
    assert linked() - before == 2


@needs_gl
def test_too_large_a_buffer_is_a_device_error_naming_what():
    device = GL[0]
    with pytest.raises(DeviceError, match=r"^layer 'x' weights: .* MiB exceeds the largest single allocation of "):
        device.alloc(device.max_allocation + 4, "layer 'x' weights")


@needs_gl
def test_an_interrupt_while_making_the_context_current_gives_the_lock_back(monkeypatch):
    """A KeyboardInterrupt (a SIGALRM timeout around predict, say) that landed while the lock made
    the context current left the lock held: every other thread's predict then hung."""
    import threading

    device, before = GL[0], malinn.get_device()
    malinn.set_device(device)
    try:
        _interrupt_while_making_the_context_current(device, monkeypatch, threading)
    finally:
        malinn.set_device(before)


def _interrupt_while_making_the_context_current(device, monkeypatch, threading):
    model = Sequential([Dense(3)])
    model.build((None, 4))
    x = np.ones((2, 4), np.float32)
    want = model.predict(x)
    real = device.ctx

    class Interrupting:  # the real context, but its next __enter__ is interrupted
        def __init__(self):
            self.fired = False

        def __enter__(self):
            if not self.fired:
                self.fired = True
                raise KeyboardInterrupt
            return real.__enter__()

        def __getattr__(self, name):
            return getattr(real, name)

    monkeypatch.setattr(device, "ctx", Interrupting())
    with pytest.raises(KeyboardInterrupt):
        model.predict(x)
    monkeypatch.setattr(device, "ctx", real)
    got = []
    other = threading.Thread(target=lambda: got.append(model.predict(x)), daemon=True)
    other.start()
    other.join(60)
    assert not other.is_alive(), "another thread's predict waits for the lock the interrupt left held"
    np.testing.assert_array_equal(got[0], want)


@needs_gl
def test_a_failed_batch_of_launches_names_at_most_four_of_them(monkeypatch):
    """GL reports one error for a batch of launches; the DeviceError names the device, the error
    and the first four launches (their layers), not all of a large model's."""
    device = GL[0]
    model = Sequential([Dense(7, name=f"d{i}") for i in range(6)])
    model.build((None, 5))
    plan = model.plan(2, device)
    assert len(plan.launches) > 4
    monkeypatch.setattr(type(device), "_error", lambda self: "GL_OUT_OF_MEMORY")
    with pytest.raises(DeviceError) as info:
        plan.run([np.ones((2, 5), np.float32)])
    text = str(info.value)
    assert text.startswith(f"one of {len(plan.launches)} launches (layer 'd0'") and device.name in text, text
    assert f"and {len(plan.launches) - 4} more) on" in text and "(GL_OUT_OF_MEMORY)" in text, text


@pytest.mark.parametrize(
    "groups, dispatch, fold",
    [
        ((1,), (1, 1, 1), 1),
        ((65535, 65535), (65535, 65535, 1), 1),
        ((1, 65536), (1, 32768, 2), 1),
        ((70001, 3), (35001, 3, 2), 2),
        ((140000, 140000), (46667, 46667, 9), 3),
    ],
)
def test_a_range_of_too_many_work_groups_is_folded_into_the_third_dimension(groups, dispatch, fold):
    assert opengl.fold_groups(groups) == (dispatch, fold)


def test_a_range_too_large_even_folded_is_refused():
    assert opengl.fold_groups((65535 * 300, 65535 * 300)) == (None, 0)


_FOLD_SOURCE = """
MALINN_ARGS(uint width;)
layout(std430, binding = 0) buffer BufCount { uint count[]; };
void main() {
    MALINN_GUARD
    atomicAdd(count[MALINN_GLOBAL_X * width + MALINN_GLOBAL_Y], 1u);
}
"""

_FOLD_GROUPS_SOURCE = """
MALINN_ARGS(uint width;)
layout(std430, binding = 0) buffer BufCount { uint count[]; };
shared uint seen[MALINN_LOCAL_X * MALINN_LOCAL_Y];
void main() {
    MALINN_GROUP_GUARD
    uint t = gl_LocalInvocationID.y * uint(MALINN_LOCAL_X) + gl_LocalInvocationID.x;
    seen[t] = 1u;
    barrier();
    if (t == 0u) {
        uint sum = 0u;
        for (uint i = 0u; i < uint(MALINN_LOCAL_X * MALINN_LOCAL_Y); ++i)
            sum += seen[i];
        atomicAdd(count[MALINN_GROUP_X * width + MALINN_GROUP_Y], sum);
    }
}
"""


@needs_gl
@pytest.mark.parametrize(
    "source, per_item",
    [(_FOLD_SOURCE, True), (_FOLD_GROUPS_SOURCE, False)],
    ids=["guarded items", "work-groups with a barrier"],
)
@pytest.mark.parametrize("global_size, local", [((3, 600001), (1, 8)), ((524297, 2), (8, 1))], ids=str)
def test_a_launch_of_more_work_groups_than_a_dimension_dispatches_runs_each_once(source, per_item, global_size, local):
    """More than 65535 work-groups along x or y (a 32-sample batch of 128 x 128 x 3 images relaid for
    a convolution: 524288 columns) run folded along z: every invocation of the range, or every
    work-group (whole, for a kernel with barriers), exactly once, and nothing past it."""
    device = GL[0]
    if per_item:
        cells = global_size
    else:  # one cell per work-group, counting its invocations
        global_size = tuple(-(-g // l) * l for g, l in zip(global_size, local))
        cells = tuple(g // l for g, l in zip(global_size, local))
    width = cells[1]
    spare = 4096  # where a folded dispatch's extra work-groups would land unguarded
    count = device.alloc(4 * (cells[0] * width + spare), "counts")
    device.fill_zero(count, 4 * (cells[0] * width + spare), what="counts")
    program = device.compile(source, origin="fold test")
    device.launch_all([device.bind(program, "main", [np.uint32(width), count], global_size, local, what="fold test")])
    got = np.empty(cells[0] * width + spare, np.uint32)
    device.download(count, got)
    want = 1 if per_item else local[0] * local[1]
    assert np.all(got[: cells[0] * width] == want) and not got[cells[0] * width :].any()


@needs_gl
def test_a_convolution_of_32_images_of_128_x_128_is_numpys_on_gl(rng):
    """The re-layout of 32 samples of 128 x 128 x 3 for a convolution spans 524288 columns (65536
    work-groups of 8 along y): refused before dispatches were folded, numpy's answer now."""
    model = Sequential([Conv2D(2, 1, name="mix")])
    model.build((None, 128, 128, 3))
    w = rng.standard_normal((1, 1, 3, 2)).astype(np.float32)
    b = rng.standard_normal(2).astype(np.float32)
    model.set_weights([w, b])
    x = rng.standard_normal((32, 128, 128, 3)).astype(np.float32)
    for device in GL:
        assert_close(model.plan(32, device).run([x])[0], x.astype(np.float64) @ w[0, 0] + b)


@needs_gl
def test_the_probe_measures_where_the_driver_ends_a_shaders_loops():
    """llvmpipe ends an invocation's loops after 65535 iterations, silently (Mesa's
    LP_MAX_TGSI_LOOP_ITERATIONS); a GPU's driver runs them to their end."""
    for device in GL:
        if "llvmpipe" in device.name:
            assert device.max_loop_iterations == 65535
        else:
            assert device.max_loop_iterations is None or device.max_loop_iterations >= 65535, device


@needs_gl
@pytest.mark.parametrize("batch", [9, 12, 15])
def test_a_long_sum_at_9_to_15_samples_is_exact_where_loops_end_early(batch):
    """A Dense layer of 9216 inputs (a Flatten after convolutions) at 9-15 samples: on a device
    that ends loops early, the kernel chosen splits K (the general kernel would loop 6 x 9216 times
    in one invocation and answer wrongly); the numbers are numpy's on every GL device."""
    rng = np.random.default_rng(batch)
    model = Sequential([Dense(10, name="logits")])
    model.build((None, 9216))
    model.set_weights(
        [rng.standard_normal((9216, 10)).astype(np.float32) * 0.02, rng.standard_normal(10).astype(np.float32)]
    )
    x = rng.standard_normal((batch, 9216)).astype(np.float32)
    w, b = model.get_weights()
    for device in GL:
        assert_close(model.plan(batch, device).run([x])[0], x.astype(np.float64) @ w + b)


@needs_gl
def test_a_kernel_whose_loops_the_driver_would_end_is_refused_by_name(monkeypatch):
    """Where a kernel would loop longer than the driver lets an invocation, the plan refuses it,
    naming the layer, the count and the limit, instead of answering wrongly (a softmax over 400
    features loops 3 x 400 times; a limit of 1000 stands in for llvmpipe's 65535 at 32000 features;
    a global pooling over 40 x 40 pixels, 40 x 41 times)."""
    device = GL[0]
    monkeypatch.setattr(device, "max_loop_iterations", 1000)
    for layer, shape, count in [
        (Softmax(name="vocabulary"), (400,), "1,200"),
        (GlobalAveragePooling2D(name="pooled"), (40, 40, 2), "1,640"),
    ]:
        model = Sequential([layer])
        model.build((None,) + shape)
        with pytest.raises(DeviceError) as info:
            model.plan(2, device)
        text = str(info.value)
        assert f"layer '{layer.name}'" in text and f"{count} loop iterations" in text and "after 1,000" in text, text


@needs_gl
def test_convolution_kernels_whose_loops_the_driver_would_end_are_not_chosen_or_are_refused(monkeypatch):
    """The direct convolutions bound their loops too (conv_kn2row was wrong from 65700
    taps x channels on llvmpipe, the default choice for an 18 x 18 x 8192 input, and a depthwise
    260 x 260 window wrong): with a limit of 1000, a 3 x 3 kn2row over 120 channels (1,137
    iterations) does not run where 100 channels (957) do, and a depthwise 32 x 32 window (1,056)
    is refused naming the layer."""
    device = GL[0]
    monkeypatch.setattr(device, "max_loop_iterations", 1000)
    window = {
        "IH": 3,
        "IW": 3,
        "OH": 1,
        "OW": 1,
        "KH": 3,
        "KW": 3,
        "SH": 1,
        "SW": 1,
        "DH": 1,
        "DW": 1,
        "PT": 0,
        "PL": 0,
    }
    spec = load_library()["conv_kn2row"].configure({"LOCAL": 0})
    assert conv_choice.runs(spec, ConvGeometry.of(1, 100, 4, 1, window), device)
    assert not conv_choice.runs(spec, ConvGeometry.of(1, 120, 4, 1, window), device)
    model = Sequential([DepthwiseConv2D(32, name="wide_window")])
    model.build((None, 32, 32, 1))
    with pytest.raises(DeviceError, match=r"layer 'wide_window'.* 1,056 loop iterations .*after 1,000"):
        model.plan(1, device)


@needs_gl
def test_a_kernel_without_a_gl_source_is_refused_by_name():
    spec = load_library()["gemm_image"]
    assert not spec.has_source("gl")
    with pytest.raises(LibraryError, match="kernel 'gemm_image' has no gl source"):
        spec.program_source({"a": "C", "b": "R", "r": "R"}, opengl.gl_index_macro, "gl")
    for op in ("matmul", "matmul_fallback", "matmul_softmax", "bias", "affine", "relayout", "reshape"):
        for kind in ("gpu", "cpu"):
            assert all(s.has_source("gl") for s in load_library().default_specs(op, kind, "gl"))


def _model():
    model = Sequential(
        [
            Flatten(name="f"),
            Dense(33, activation="gelu", name="d1"),
            BatchNormalization(name="bn"),
            Dense(17, name="d2"),
            Activation("tanh", name="t"),
            Dense(10, activation="softmax", name="head"),
        ]
    )
    model.build((None, 3, 7))
    rng = np.random.default_rng(5)
    model.set_weights([w + rng.standard_normal(w.shape).astype(np.float32) * 0.3 for w in model.get_weights()])
    return model


@needs_gl
@pytest.mark.parametrize("target", ["gpu", "cpu", "morton_4_2", "gl", "gl:cpu"])
@pytest.mark.parametrize("batch", [1, 5, 40])
def test_a_model_file_converted_for_one_backend_runs_on_the_other(tmp_path, target, batch):
    """Weights laid out for an OpenCL kernel run on the GL device and the reverse, with the same
    results as the model's own numpy reference."""
    model = _model()
    path = malinn.model.saving.save_model(model, tmp_path / "m.malinn", target=target)
    x = np.random.default_rng(batch).standard_normal((batch, 3, 7)).astype(np.float32)
    results = {}
    previous = malinn.get_device()
    try:
        for d in malinn.devices():
            malinn.set_device(d)
            results[d.identity] = malinn.load_model(path).predict(x)
    finally:
        malinn.set_device(previous)
    first = next(iter(results.values()))
    for got in results.values():
        np.testing.assert_allclose(got, first, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(first.sum(axis=1), 1.0, rtol=1e-5)


@needs_gl
def test_activations_keep_nan_on_gl():
    """A GLSL compiler may fold x < 0 ? 0 : x into max(x, 0), which drops NaN: the shaders keep it."""
    d = GL[0]
    x = np.array([[np.nan, -1.0, 2.0]], np.float32)
    for name in ("relu", "relu6", "hard_sigmoid", "leaky_relu"):
        got = ops.activation(DeviceMatrix.upload(d, x, "R"), name).numpy()
        assert np.isnan(got[0, 0]) and np.isfinite(got[0, 1:]).all(), (name, got)


@needs_gl
@pytest.mark.parametrize("op", ["matmul", "matmul_fallback", "matmul_softmax"])
def test_a_gl_gpu_runs_the_opencl_gpus_kernels(op, rng):
    """A GL GPU takes the OpenCL GPU's default kernels that have GLSL, Keras-order ones included,
    each in the configuration the table names, and each matches numpy on odd shapes on the GL
    device (llvmpipe, a CPU, stands in for a GL GPU here)."""
    library = load_library()
    gl = library.default_specs(op, "gpu", "gl")
    cl = [spec for spec in library.default_specs(op, "gpu", "opencl") if spec.has_source("gl")]
    own = [s for s in gl if s.codename.startswith("gemm_keras_gl_")]  # GL's own, timed in GLSL
    assert gl and [(s.codename, s.defines) for s in gl] == [(s.codename, s.defines) for s in own + cl]
    device = GL[0]
    checked = 0
    for spec in gl:
        if spec.workgroup and np.prod(spec.workgroup) > device.max_work_group_size:
            continue
        for m, k, n in [
            (1, 1, 1),
            (3, 5, 7),
            (13, 37, 5),
            (150, 640, 13),
            (1001, 3, 1),
            (5, 1001, 13),
            (13, 1030, 64),
            (70, 3073, 60),
        ]:
            if not spec.accepts(m, k, n):
                continue
            a = rng.standard_normal((m, k)).astype(np.float32)
            b = rng.standard_normal((k, n)).astype(np.float32)
            r = ops.matmul(DeviceMatrix.from_host(a), DeviceMatrix.from_host(b), spec, device).numpy()
            want = a.astype(np.float64) @ b.astype(np.float64)
            np.testing.assert_allclose(r, want, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want).max()))
            checked += 1
    assert checked >= len(gl)


@pytest.mark.parametrize(
    "op",
    [
        "matmul",
        "matmul_fallback",
        "matmul_softmax",
        "bias",
        "affine",
        "relayout",
        "reshape",
        "broadcast",
        "normalize",
        "permute",
        "repeat",
        "merge",
        "concat",
        "dot",
        "conv",
        "depthwise",
        "pool",
        "spatial",
        "im2col",
        "conv_transpose",
        "conv3d",
        "conv3d_transpose",
        "pool3d",
        "spatial3d",
        "resize",
        "conv_lstm_gates",
        "gather",
        "masking",
        "recurrent",
        "recurrent_masked",
        "attention",
        "normalize_column",
        "encoding",
        "lookup",
    ],
)
@pytest.mark.parametrize("kind", ["gpu", "cpu"])
def test_every_op_has_a_glsl_kernel_and_gl_takes_the_opencl_defaults(op, kind):
    """Every op of the library runs on GL (the tests that take the ``device`` fixture compare each
    kernel with numpy there), and a GL device of a kind takes the OpenCL device's default kernels,
    in the same configurations, wherever they have GLSL (all but gemm_image and gemv_rows), after a
    GL GPU's own matmul defaults (gemm_keras configurations timed faster in GLSL); but a GL
    CPU (Mesa's llvmpipe) runs its small-batch products with K split over work-items (see
    test_a_long_product_on_a_gl_cpu_is_exact), each bounding its loops (library ``loop_iterations``)."""
    library = load_library()
    gl = library.default_specs(op, kind, "gl")
    cl = [spec for spec in library.default_specs(op, kind, "opencl") if spec.has_source("gl")]
    assert gl and all(spec.has_source("gl") for spec in gl)
    if kind == "cpu" and op in ("matmul_fallback", "matmul_softmax"):
        # K split over 32-128 items, and each says how long its loops run (a device that ends them
        # early is never given one that would loop too long: test_a_long_sum_at_9_to_15_samples...)
        assert all(int(s.config.get("KSPLIT", 64)) >= 32 for s in gl), [s.config for s in gl]
        assert all(s.loop_bounds for s in gl), [s.codename for s in gl if not s.loop_bounds]
        return
    own = [s for s in gl if s.codename.startswith("gemm_keras_gl_")]  # a GL GPU's own matmul defaults first
    assert bool(own) == (op == "matmul" and kind == "gpu")
    assert [(s.codename, s.defines) for s in gl] == [(s.codename, s.defines) for s in own + cl]


@pytest.mark.skipif(not GL, reason="no OpenGL device")
@pytest.mark.parametrize("activation", [None, "softmax"])
def test_a_long_product_on_a_gl_cpu_is_exact(activation, rng):
    """llvmpipe ends a shader invocation's loops after 65535 iterations in all (Mesa's
    LP_MAX_TGSI_LOOP_ITERATIONS), so a batch-1 gemv that runs all of K in one invocation with an inner
    loop of 16 went wrong from about 3850 inputs (Full CIFAR's 4096: off by 0.07, 4000: by 3.4); with K
    split over 64-128 work-items a 5000-input layer is numpy's on every GL device."""
    model = malinn.Sequential([Dense(10, activation=activation)])
    model.build((None, 5000))
    x = rng.standard_normal((1, 5000)).astype(np.float32) * 0.05
    z = x.astype(np.float64) @ model.layers[0].kernel.astype(np.float64) + model.layers[0].bias
    if activation == "softmax":
        z = np.exp(z - z.max(1, keepdims=True))
        z /= z.sum(1, keepdims=True)
    previous = malinn.get_device()
    try:
        for device in GL:
            malinn.set_device(device)
            assert_close(model.predict(x), z)
    finally:
        malinn.set_device(previous)


_BINARY_SOURCE = """MALINN_ARGS(uint n; float s;)
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
void main() { MALINN_GUARD uint i = gl_GlobalInvocationID.x; y[i] = x[i] * s + float(K); }"""


def _run_binary_source(device, defines=("-DK=3",)):
    """Runs _BINARY_SOURCE on 37 values on ``device``: (result, the program)."""
    x = np.arange(37, dtype=np.float32)
    y = np.zeros_like(x)
    xb, yb = device.alloc(x.nbytes, "x"), device.alloc(y.nbytes, "y")
    device.upload(xb, x)
    program = device.compile(_BINARY_SOURCE, defines, "binary test")
    device.launch_all([device.bind(program, "main", [np.uint32(37), np.float32(2), xb, yb], (37,), None)])
    device.download(yb, y)
    return y, program


@needs_gl
def test_a_second_context_loads_the_program_binary_from_the_cache(tmp_path, monkeypatch):
    """The first context builds from source and writes the binary (glGetProgramBinary); a second
    context, with nothing in memory, links from the cached binary and builds nothing."""
    monkeypatch.setenv("MALINN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MALINN_BINARY_CACHE", "1")
    first = opengl.probe(GL[0].index[1])
    if not first.binary_formats:
        pytest.skip(f"{first.name} offers no program binary format")
    y, _ = _run_binary_source(first)
    np.testing.assert_array_equal(y, 2 * np.arange(37, dtype=np.float32) + 3)
    assert (first.counters["builds"], first.counters["binary_hits"]) == (1, 0)
    assert len(list((tmp_path / "programs").glob("*.bin"))) == 3  # the probe shaders (values, loops) and this one
    second = opengl.probe(GL[0].index[1])
    assert second.counters["builds"] == 0
    y, program = _run_binary_source(second)
    np.testing.assert_array_equal(y, 2 * np.arange(37, dtype=np.float32) + 3)
    assert (second.counters["builds"], second.counters["binary_hits"]) == (0, 1)
    assert isinstance(program.shaders[(opengl.DEFAULT_LOCAL[1], False)], opengl.BinaryShader)
    y, _ = _run_binary_source(second, ("-DK=4",))  # other defines: another entry, built
    np.testing.assert_array_equal(y, 2 * np.arange(37, dtype=np.float32) + 4)
    assert (second.counters["builds"], second.counters["binary_hits"]) == (1, 1)


@needs_gl
def test_a_binary_the_driver_refuses_is_rebuilt_from_source(tmp_path, monkeypatch):
    """An entry that passes the cache's checks but that the driver does not take (a driver update)
    is built from source instead, and replaced."""
    from malinn.io.cache import read_entry, write_entry

    monkeypatch.setenv("MALINN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MALINN_BINARY_CACHE", "1")
    device = opengl.probe(GL[0].index[1])
    if not device.binary_formats:
        pytest.skip(f"{device.name} offers no program binary format")
    program = device.compile(_BINARY_SOURCE, ("-DK=3",), "binary test")
    local = opengl.DEFAULT_LOCAL[1]
    key = program.binary_key(local, program.text(local))
    write_entry("programs", key, b"\x01\x00\x00\x00" + b"not a program binary" * 8)
    y, _ = _run_binary_source(device)
    np.testing.assert_array_equal(y, 2 * np.arange(37, dtype=np.float32) + 3)
    assert (device.counters["builds"], device.counters["binary_hits"]) == (1, 0)
    assert b"not a program binary" not in read_entry("programs", key)


@needs_gl
def test_binary_cache_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("MALINN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MALINN_BINARY_CACHE", "0")
    device = opengl.probe(GL[0].index[1])
    _run_binary_source(device)
    assert device.counters["builds"] == 1 and not list(tmp_path.rglob("*.bin"))


def _gl_devices_under(env_extra: dict) -> tuple:
    """(backends listed, platforms of the GL devices, stderr) of a discovery in a new process."""
    env = {**os.environ, "MALINN_GL": "1", **env_extra}
    code = (
        "import warnings, malinn\nwarnings.simplefilter('always')\n"
        "print([d.backend for d in malinn.devices()])\n"
        "print([d.platform for d in malinn.devices() if d.backend == 'gl'])"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    backends, platforms = out.stdout.strip().splitlines()[-2:]
    return backends, platforms, out.stderr


@needs_gl
def test_a_driver_below_opengl_4_3_is_skipped_naming_its_version():
    """Mesa made to offer OpenGL 3.3 and OpenGL ES 3.0 (MESA_GL_VERSION_OVERRIDE,
    MESA_GLES_VERSION_OVERRIDE): the device is skipped with a warning that names the renderer, the
    versions it offers and the versions compute shaders need."""
    if "Mesa" not in GL[0].platform:
        pytest.skip("MESA_GL_VERSION_OVERRIDE is Mesa's")
    backends, _, stderr = _gl_devices_under(
        {"MESA_GL_VERSION_OVERRIDE": "3.3", "MESA_GLES_VERSION_OVERRIDE": "3.0", "MALINN_GL_API": ""}
    )
    assert "'gl'" not in backends
    assert re.search(
        r"skipping OpenGL device gl:0: .+ offers OpenGL 3\.3 .* and no OpenGL ES 3\.1 \(.+\); .*"
        r"need OpenGL 4\.3 or OpenGL ES 3\.1",
        stderr,
    ), stderr[-2000:]


@needs_gl
def test_an_unknown_gl_api_is_named_once_not_ignored():
    """MALINN_GL_API=desk (a typo): one warning naming it and the values it takes; no OpenGL device
    (it was ignored: either API served)."""
    backends, _, stderr = _gl_devices_under({"MALINN_GL_API": "desk"})
    assert "'gl'" not in backends and "'gles3'" not in backends
    assert stderr.count("MALINN_GL_API='desk' is neither 'gl' (desktop OpenGL only) nor 'es'") == 1, stderr[-2000:]


@needs_gl
def test_opengl_es_serves_where_desktop_opengl_is_below_4_3():
    """The Raspberry Pi's case (desktop OpenGL 2.1, OpenGL ES 3.1), played by Mesa made to offer
    OpenGL 3.3: the device comes up on an OpenGL ES context and runs a model; MALINN_GL_API=gl
    refuses ES, MALINN_GL_API=es asks for it first."""
    if "Mesa" not in GL[0].platform:
        pytest.skip("MESA_GL_VERSION_OVERRIDE is Mesa's")
    backends, platforms, stderr = _gl_devices_under({"MESA_GL_VERSION_OVERRIDE": "3.3", "MALINN_GL_API": ""})
    assert "'gl'" in backends and "OpenGL ES 3." in platforms, stderr[-2000:]
    backends, _, stderr = _gl_devices_under({"MESA_GL_VERSION_OVERRIDE": "3.3", "MALINN_GL_API": "gl"})
    assert "'gl'" not in backends and "offers OpenGL 3.3" in stderr
    _, platforms, _ = _gl_devices_under({"MALINN_GL_API": "es"})
    assert "OpenGL ES 3." in platforms
    env = {**os.environ, "MALINN_GL": "1", "MALINN_GL_API": "es", "MALINN_DEVICE": "gl"}
    code = (
        "import numpy as np, malinn\nfrom malinn.layers import Dense\n"
        "m = malinn.Sequential([Dense(13, activation='relu'), Dense(5, activation='softmax')])\n"
        "m.build((None, 7))\nx = np.random.default_rng(0).standard_normal((3, 7)).astype(np.float32)\n"
        "w = m.get_weights()\nh = np.maximum(x @ w[0] + w[1], 0) @ w[2] + w[3]\n"
        "p = np.exp(h - h.max(1, keepdims=True))\np /= p.sum(1, keepdims=True)\n"
        "print(malinn.get_device().platform, float(np.abs(m.predict(x) - p).max()))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    platform, err = out.stdout.strip().rsplit(" ", 1)
    assert platform.startswith("OpenGL ES 3.") and float(err) < 1e-6, out.stdout
