"""The GLSL twins of the OpenCL GPU's fastest matmul kernels: gl/gemm_keras.comp (the
gemm_keras, gemm_keras_large and gemm_keras_narrow entries) and gl/gemv_split.comp (gemv_split,
gemv_split_c), K split over work-groups with the partial sums in the scratch buffer.

On the GL device (llvmpipe in CI): each in the configuration the GPU defaults name, against numpy on
odd shapes (1, 3, 5, 13, 1001 units and inputs; batches 1, 3 and 100) with the fused epilogue;
sliced results bit-identical run after run with products of different shapes sharing the scratch,
and with two shared tiles (BUFFERS=2) as with one; per-launch device times (launch_seconds);
the GL GPU's defaults are the OpenCL GPU's; both read fp16-storage and int8 weights
(gl/weights.glsl), and a precision a GL shader does not read is refused by name instead of reading
half or int8 bytes as floats. Few cases:
llvmpipe is slow, and tests/test_gemm_keras.py and tests/test_gemv_split.py run on the GL device too.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from support import assert_close
from test_gemv_split import PARAMS, reference, run

import malinn
from malinn.errors import BackendError
from malinn.layers import Dense
from malinn.library.kernel_library import load_library

pytest.importorskip("moderngl", reason="the OpenGL backend's extra is not installed (pip install malinn[gl])")

GL = [d for d in malinn.devices() if d.backend == "gl"]
needs_gl = pytest.mark.skipif(not GL, reason="no working OpenGL device (EGL + Mesa's llvmpipe, or a GPU's driver)")
LIB = load_library()


def _gpu_default(codename: str, nb: int | None = None):
    """The OpenCL GPU's default (or fallback) configuration of ``codename`` (with ``NB`` = nb)."""
    for op in ("matmul", "matmul_fallback"):
        for spec in LIB.default_specs(op, "gpu", "opencl"):
            if spec.codename == codename and (nb is None or int(spec.config["NB"]) == nb):
                return spec
    raise AssertionError(f"the GPU defaults name no {codename}")


#: (codename, NB, [(m, k, n), ...]): each kernel on shapes its preconditions accept
CASES = [
    ("gemm_keras_large", None, [(1001, 1024, 100), (3, 1030, 64)]),
    ("gemm_keras_narrow", None, [(13, 1024, 100), (1, 1025, 9)]),
    ("gemm_keras_head_bulk", None, [(13, 1024, 300), (1, 1025, 257), (32, 1031, 1001)]),
    ("gemm_keras", None, [(5, 13, 100), (1001, 3, 17)]),
    ("gemv_split_c", 1, [(1001, 5, 1), (1, 1001, 1), (13, 3, 1)]),
    ("gemv_split_c", 8, [(5, 1001, 3), (1001, 13, 8)]),
]


@needs_gl
@pytest.mark.parametrize("codename, nb, shapes", CASES, ids=[f"{c}-NB{nb}" if nb else c for c, nb, _ in CASES])
def test_each_gl_kernel_matches_numpy_on_odd_shapes(codename, nb, shapes, rng):
    """The GPU defaults' configuration on the GL device: the plain product, and bias + a four-parameter
    activation + affine fused; n and m among 1, 3, 5, 13, 1001, batches 1 to 100."""
    device = GL[0]
    spec = _gpu_default(codename, nb) if codename != "gemm_keras" else LIB["gemm_keras"]
    assert spec.has_source("gl")
    for m, k, n in shapes:
        assert spec.accepts(m, k, n), (codename, m, k, n)
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        assert_close(run(spec, device, a, b), reference(a, b, "fp32"))
        bias, scale, shift = (rng.standard_normal(m).astype(np.float32) for _ in range(3))
        got = run(spec, device, a, b, bias=bias, affine=(scale, shift), activation="relu_general", params=PARAMS)
        assert_close(got, reference(a, b, "fp32", bias, (scale, shift), "relu_general", PARAMS))


@needs_gl
def test_sliced_gl_results_are_bit_identical_run_after_run(rng):
    """Each launch leaves the scratch counters at 0 and the slices are added in slice order: two
    products sharing one scratch buffer, interleaved, repeat exactly, for both sliced shaders."""
    device = GL[0]
    for spec, n in ((_gpu_default("gemm_keras_narrow"), 20), (_gpu_default("gemv_split_c", 1), 1)):
        assert int(spec.config["SLICES"]) > 1
        a1, a2 = rng.standard_normal((30, 2001)).astype(np.float32), rng.standard_normal((30, 1027)).astype(np.float32)
        b1, b2 = rng.standard_normal((2001, n)).astype(np.float32), rng.standard_normal((1027, n)).astype(np.float32)
        first = run(spec, device, a1, b1), run(spec, device, a2, b2)
        assert_close(first[0], reference(a1, b1, "fp32"))
        assert_close(first[1], reference(a2, b2, "fp32"))
        np.testing.assert_array_equal(run(spec, device, a1, b1), first[0])
        np.testing.assert_array_equal(run(spec, device, a2, b2), first[1])


@needs_gl
def test_two_gl_tiles_and_vec4_sample_reads_give_the_same_sums(rng):
    """gl/gemm_keras.comp mirrors gemm_keras.cl: BUFFERS=2 (two shared tiles, one barrier per K
    step) adds in the same order as BUFFERS=1, so its results are bit-identical, with samples read
    as vec4s (RN 4) and as floats (RN 5: gemm_keras_full_batch's tile), K split and the partial sums
    exchanged item-major; and they are numpy's."""
    device = GL[0]
    a = rng.standard_normal((70, 1030)).astype(np.float32)
    b = rng.standard_normal((1030, 60)).astype(np.float32)
    full = _gpu_default("gemm_keras_full_batch").config
    for config in ({"TM": 32, "TN": 20, "RM": 4, "RN": 4, "KT": 8, "PREFETCH": 1, "SLICES": 4}, dict(full)):
        one, two = (LIB["gemm_keras"].configure({**config, "BUFFERS": n}) for n in (1, 2))
        got = run(two, device, a, b)
        assert_close(got, reference(a, b, "fp32"))
        np.testing.assert_array_equal(got, run(one, device, a, b))


@pytest.mark.parametrize("op", ["matmul", "matmul_fallback", "matmul_softmax"])
def test_the_gl_gpu_defaults_are_the_opencl_gpus_after_its_own(op):
    """Now that gemm_keras and gemv_split have GLSL, a GL GPU takes every one of the OpenCL GPU's
    matmul defaults and fallbacks that has a GLSL source, in the same order and configurations
    (before, it lost gemm_keras_large, gemm_keras_narrow and gemv_split_c, the kernels of large
    GPUs; gemm_bulk has OpenCL C only); its matmul defaults first list the gemm_keras configurations
    timed faster in GLSL inside the networks (gemm_keras_gl_*:
    benchmarks/results/insitu_gl_b100_nvidia_h200.json), each a gemm_keras variant."""
    gl = [(s.codename, s.defines) for s in LIB.default_specs(op, "gpu", "gl")]
    cl = [
        (s.codename, s.defines)
        for s in LIB.default_specs(op, "gpu", "opencl")
        if any(api == "gl" for api, *_ in LIB[s.codename].sources)
    ]
    own = [entry for entry in gl if entry[0].startswith("gemm_keras_gl_")]
    assert gl == own + cl
    assert bool(own) == (op == "matmul")
    assert all(LIB[codename].source == LIB["gemm_keras"].source for codename, _ in own)


@needs_gl
@pytest.mark.parametrize("precision", ["fp16-storage", "int8-weights"])
def test_the_new_gl_kernels_read_half_and_int8_weights(precision, rng):
    """gl/weights.glsl: half weights unpacked from uint words, int8 ones sign-extended and scaled per
    row, against numpy with the weights the precision stores; odd counts of halves and bytes (the
    buffer's last word only partly filled: 5 x 3 weights, 1-row loads) included."""
    device = GL[0]
    cases = [
        (_gpu_default("gemm_keras_narrow"), [(13, 1025, 9)]),
        (_gpu_default("gemv_split_c", 1), [(1001, 13, 1)]),
        (
            LIB["gemv_split"].configure({"VW": 1, "MDIM": 4, "KSPLIT": 8, "SLICES": 4, "UNROLL": 1, "NB": 2}),
            [(5, 3, 2), (3, 1001, 1)],
        ),
    ]
    for base, shapes in cases:
        spec = base.in_precision(precision)
        for m, k, n in shapes:
            a = rng.standard_normal((m, k)).astype(np.float32)
            b = rng.standard_normal((k, n)).astype(np.float32)
            bias, scale, shift = (rng.standard_normal(m).astype(np.float32) for _ in range(3))
            got = run(spec, device, a, b, bias=bias, affine=(scale, shift), activation="relu_general", params=PARAMS)
            assert_close(got, reference(a, b, precision, bias, (scale, shift), "relu_general", PARAMS))


@needs_gl
@pytest.mark.parametrize(
    "codename, precision", [("gemv_c", "fp16-storage"), ("gemv_c", "int8-weights"), ("gemv_split_c", "fp16")]
)
def test_a_precision_a_gl_shader_does_not_read_is_refused_by_name(codename, precision, rng):
    """A shader without gl/weights.glsl reads fp32 weights, and no GL shader computes in half: such a
    spec raises BackendError naming the define (before this check, gemv_c read the half or int8
    bytes as floats: wrong numbers)."""
    spec = LIB[codename].in_precision(precision)
    a = rng.standard_normal((13, 5)).astype(np.float32)
    b = rng.standard_normal((5, 1)).astype(np.float32)
    with pytest.raises(BackendError, match="(WEIGHT_BITS=(16|8)|HALF_ARITHMETIC=1).*does not read"):
        run(spec, GL[0], a, b)


@needs_gl
def test_launch_seconds_times_each_launch_of_a_plan_on_the_device(rng):
    """GLDevice.launch_seconds (GL_TIMESTAMP queries around each launch: benchmarks/models.py's
    per-step times on GL) runs each of a plan's launches once and gives one positive time per
    launch, their sum within the call's wall time, as a launch's enqueue() event does (the tuner's
    time); the plan still answers as numpy does."""
    device = GL[0]
    assert device.timer_queries
    model = malinn.Sequential([Dense(300, activation="relu"), Dense(3)])
    model.build((None, 200))
    x = rng.standard_normal((20, 200)).astype(np.float32)
    plan = model.plan(20, device)
    plan.run([x])
    launches = device.counters["launches"]
    start = time.perf_counter()
    seconds = device.launch_seconds(plan.launches)
    wall = time.perf_counter() - start
    assert device.counters["launches"] == launches + len(plan.launches)
    assert len(seconds) == len(plan.launches) >= 2 and all(s > 0 for s in seconds), seconds
    assert sum(seconds) <= wall, (seconds, wall)
    start = time.perf_counter()
    event = plan.launches[1].enqueue()  # what the tuner times: the same device clock
    assert 0 < (event.profile.end - event.profile.start) * 1e-9 <= time.perf_counter() - start
    w1, b1, w2, b2 = model.get_weights()
    assert_close(plan.run([x])[0], np.maximum(x @ w1 + b1, 0) @ w2 + b2)
