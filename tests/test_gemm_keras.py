"""gemm_keras (kernels/gemm_keras.cl): the register-blocked GEMM in Keras's memory order for batch
products, with K optionally split across work-groups (SLICES) and the partial sums added by the
tile's last work-group through a scratch buffer.

Each configuration the library names, and sliced ones with tiles that are not powers of two, on odd
shapes against numpy with the weights each precision stores, with the fused epilogue; results
bit-identical run after run with products of different shapes sharing the scratch; with the GPU's
defaults a Dense network at batch 100 runs its wide layers with gemm_keras_full_batch and answers as
numpy does. (The generic matmul tests in test_ops.py and the Oclgrind suite cover it as every
matmul kernel.)
"""

from __future__ import annotations

import numpy as np
import pytest
from support import activation as ref_activation
from support import assert_close
from test_gemv_split import PARAMS, fits, precisions, reference, run

import malinn
from malinn.layers import Dense
from malinn.library.kernel_library import load_library

pytestmark = pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)

LIB = load_library()
#: the library's configurations, and sliced ones whose tiles are not powers of two
CONFIGS = [dict(c) for c in LIB["gemm_keras"].configurations()] + [
    {"TM": 32, "TN": 20, "RM": 4, "RN": 4, "KT": 8, "PREFETCH": 1, "SLICES": 4, "BUFFERS": 2},
    {"TM": 32, "TN": 20, "RM": 4, "RN": 5, "KT": 8, "PREFETCH": 1, "SLICES": 8},
    {"TM": 128, "TN": 6, "RM": 8, "RN": 3, "KT": 4, "PREFETCH": 0, "SLICES": 2},
]
CONFIG_IDS = ["-".join(f"{k}{v}" for k, v in c.items()) for c in CONFIGS]
#: (m, k, n): 1, 3, 5, 13, 1001 and 4099 among the sizes, batches that do and do not fill a tile
ODD = [(1, 1, 9), (3, 13, 13), (13, 5, 100), (1001, 3, 17), (5, 1001, 33), (13, 4099, 9), (130, 257, 101)]


@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
def test_every_configuration_and_precision_on_odd_shapes(device, config, rng):
    """The plain product and bias + a four-parameter activation + affine: in every precision the
    device runs for the default and the last two configurations (sliced, tiles not powers of two),
    in fp32 for the others."""
    base = LIB["gemm_keras"].configure(config)
    if not fits(base, device):
        pytest.skip(f"work-group {base.workgroup} exceeds {device.name}'s {device.max_work_group_size}")
    every = config == CONFIGS[0] or config in CONFIGS[-2:]
    if device.backend != "opencl" and config not in (CONFIGS[0], CONFIGS[-1]):  # llvmpipe is slow; the GPU's
        pytest.skip("on GL: the default and the last odd sliced configuration only")  # in test_gl_keras_kernels
    for precision in precisions(device) if every else ["fp32"]:
        spec, tolerance = base.in_precision(precision), (1e-2 if precision == "fp16" else 1e-5)
        for m, k, n in ODD:
            a = rng.standard_normal((m, k)).astype(np.float32)
            b = rng.standard_normal((k, n)).astype(np.float32)
            assert_close(run(spec, device, a, b), reference(a, b, precision), tolerance)
            bias, scale, shift = (rng.standard_normal(m).astype(np.float32) for _ in range(3))
            got = run(spec, device, a, b, bias=bias, affine=(scale, shift), activation="relu_general", params=PARAMS)
            assert_close(got, reference(a, b, precision, bias, (scale, shift), "relu_general", PARAMS), tolerance)


def test_sliced_results_are_bit_identical_run_after_run(device, rng):
    """The slices are added in slice order whichever work-group finishes last, and each launch leaves
    the counters at 0: two products that share one scratch buffer, interleaved, repeat exactly."""
    # several K tiles per slice and two row tiles; K differs, so the products slice differently
    a1, a2 = rng.standard_normal((200, 517)).astype(np.float32), rng.standard_normal((200, 263)).astype(np.float32)
    b1, b2 = rng.standard_normal((517, 23)).astype(np.float32), rng.standard_normal((263, 23)).astype(np.float32)
    for config in CONFIGS if device.backend == "opencl" else CONFIGS[-1:]:  # llvmpipe is slow
        spec = LIB["gemm_keras"].configure(config)
        if int(spec.config["SLICES"]) == 1 or not fits(spec, device):
            continue
        first = run(spec, device, a1, b1), run(spec, device, a2, b2)
        assert_close(first[0], reference(a1, b1, "fp32"))
        assert_close(first[1], reference(a2, b2, "fp32"))
        for _ in range(2):
            np.testing.assert_array_equal(run(spec, device, a1, b1), first[0])
            np.testing.assert_array_equal(run(spec, device, a2, b2), first[1])


def test_a_wide_dense_network_at_batch_100_runs_gemm_keras_on_a_gpu(device, monkeypatch, rng):
    """With the GPU's defaults (the device's kind pretended), at batch 100 a wide layer with 1024
    inputs or more runs gemm_keras_full_batch (at 130, gemm_keras_large), a narrow one
    with as many inputs gemm_keras_narrow, a small one gemv_batch_small_c, and a layer of fewer than 1024
    inputs gemm_keras_medium; on a GL GPU, its own configurations timed in GLSL (gemm_keras_gl_batch,
    gemm_keras_gl_narrow) in their stead; the answer is numpy's, bit-identical call after call."""
    monkeypatch.setattr(type(device), "kind", property(lambda self: "gpu"))
    gl = device.backend == "gl"
    full, narrow = (
        ("gemm_keras_gl_batch", "gemm_keras_gl_narrow") if gl else ("gemm_keras_full_batch", "gemm_keras_narrow")
    )
    for sizes, want in (
        ([1100, 2600, 40, 10], [full, narrow, "gemv_batch_small_c"]),
        ([784, 1030, 10], ["gemm_keras_medium", narrow]),
    ):
        model = malinn.Sequential(
            [Dense(units, activation=act) for units, act in zip(sizes[1:], ("relu", "tanh", None)[-(len(sizes) - 1) :])]
        )
        model.build((None, sizes[0]))
        for layer in model.layers:
            layer.set_weights([layer.kernel, rng.standard_normal(layer.units).astype(np.float32) * 0.1])
        kernels = [r["kernel"].split(" ")[0] for r in model.plan(100, device).describe() if r["kind"] == "matmul"]
        assert kernels == want, kernels
        if sizes[0] >= 1024:
            assert model.plan(130, device).describe()[0]["kernel"].startswith("gemm_keras_large"), "batch 130"
        x = rng.uniform(-1, 1, (100, sizes[0])).astype(np.float32)
        h = x.astype(np.float64)
        for layer in model.layers:
            h = ref_activation(layer.activation, h @ layer.kernel.astype(np.float64) + layer.bias, axis=-1)
        got = model.predict(x)
        assert_close(got, h)
        np.testing.assert_array_equal(model.predict(x), got)


def test_a_classifier_head_at_a_large_batch_runs_gemm_keras_head_bulk_on_a_gpu(device, monkeypatch, rng):
    """With the GPU's defaults (the device's kind pretended), a head of at most 32 units on 1024 inputs
    or more runs gemm_keras_head_bulk past 256 samples (up to 256 gemm_keras_narrow, on a GL GPU its
    own gemm_keras_gl_narrow); the answers are numpy's, at a batch that fills no tile too."""
    monkeypatch.setattr(type(device), "kind", property(lambda self: "gpu"))
    narrow = "gemm_keras_gl_narrow" if device.backend == "gl" else "gemm_keras_narrow"
    model = malinn.Sequential([Dense(1030, activation="relu"), Dense(10)])
    model.build((None, 40))
    for layer in model.layers:
        layer.set_weights([layer.kernel, rng.standard_normal(layer.units).astype(np.float32) * 0.1])
    for batch, want in ((256, narrow), (300, "gemm_keras_head_bulk"), (1024, "gemm_keras_head_bulk")):
        kernels = [r["kernel"].split(" ")[0] for r in model.plan(batch, device).describe() if r["kind"] == "matmul"]
        assert kernels[-1] == want, (batch, kernels)
    for n in (300, 1024, 1001):
        x = rng.uniform(-1, 1, (n, 40)).astype(np.float32)
        h = np.maximum(x.astype(np.float64) @ model.layers[0].kernel + model.layers[0].bias, 0)
        assert_close(model.predict(x, batch_size=n), h @ model.layers[1].kernel + model.layers[1].bias)
