"""gemm_bulk (kernels/gemm_bulk.cl): the two-level tiled GEMM in Keras's memory order for large
batches, with its inputs' tile transposed into local memory through a bank permutation, one or two
local tiles, work-groups ordered in bands (GROUP) and K optionally split across work-groups (SLICES).

Each configuration the library names, and ones with odd tiles (fewer blocks than items, tiles that
are not multiples of 32 and so stored without the permutation, bands that do not divide the rows
of tiles, K steps of 4 and 64), on odd shapes with 1, 3, 13, 1001 and 4096 in each dimension against
numpy with the weights each precision stores, with the fused epilogue; sliced results bit-identical
run after run with products of different shapes sharing the scratch; a Dense network that uses it
answers as numpy does at a batch it serves and at one its preconditions leave to the fallback.
(The generic matmul tests in test_ops.py and the Oclgrind suite cover it as every matmul kernel.)
"""

from __future__ import annotations

import numpy as np
import pytest
from support import activation as ref_activation
from support import assert_close
from test_gemv_split import PARAMS, fits, precisions, reference, run

import malinn
from malinn import ops
from malinn.layers import Dense
from malinn.library.kernel_library import load_library

pytestmark = pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)

LIB = load_library()
ENTRIES = ["gemm_bulk", "gemm_bulk_split", "gemm_bulk_64", "gemm_bulk_wide"]
#: every entry's configuration, then odd ones
CONFIGS = [dict(LIB[codename].configure(None).config) for codename in ENTRIES] + [
    # 32 items, 4 input blocks a step (most items load none), TN 16: no permutation; bands of 3
    {"TM": 32, "TN": 16, "RM": 4, "RN": 4, "KT": 4, "BUFFERS": 1, "GROUP": 3, "SLICES": 2},
    # TN 96 (24 groups, permuted in runs of 8), 8 quads a step, 12 samples an item, 8 slices
    {"TM": 64, "TN": 96, "RM": 8, "RN": 12, "KT": 32, "BUFFERS": 2, "GROUP": 2, "SLICES": 8},
    # K steps of 64 (8 weight vectors and 2 input blocks per item), 16 slices
    {"TM": 32, "TN": 32, "RM": 4, "RN": 4, "KT": 64, "BUFFERS": 2, "GROUP": 0, "SLICES": 16},
]
CONFIGS = [{k: v for k, v in c.items() if k != "KERAS_ORDER"} for c in CONFIGS]
CONFIG_IDS = ["-".join(f"{k}{v}" for k, v in c.items()) for c in CONFIGS]
#: (m, k, n): 1, 3, 13, 1001 and 4096 in each dimension; several tiles each way, the last partial
ODD = [
    (1, 1, 1),
    (3, 13, 1001),
    (13, 1001, 3),
    (1001, 3, 13),
    (4096, 13, 3),
    (3, 4096, 13),
    (13, 3, 4096),
    (130, 257, 300),
]


def opencl_only(device):
    if device.backend != "opencl":
        pytest.skip(f"gemm_bulk has no {device.backend} source")


@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
def test_every_configuration_and_precision_on_odd_shapes(device, config, rng):
    """The plain product, and bias + a four-parameter activation + affine: in every precision the
    device runs for the default and the last two configurations (sliced, odd tiles), in fp32 for
    the others."""
    base = LIB["gemm_bulk"].configure(config)
    if not fits(base, device):
        pytest.skip(f"work-group {base.workgroup} exceeds {device.name}'s {device.max_work_group_size}")
    opencl_only(device)
    every = config == CONFIGS[0] or config in CONFIGS[-2:]
    for precision in precisions(device) if every else ["fp32"]:
        spec, tolerance = base.in_precision(precision), (1e-2 if precision == "fp16" else 1e-5)
        for m, k, n in ODD:
            a = rng.standard_normal((m, k)).astype(np.float32)
            b = rng.standard_normal((k, n)).astype(np.float32)
            assert_close(run(spec, device, a, b), reference(a, b, precision), tolerance)
        for m, k, n in ODD[-2:]:
            a = rng.standard_normal((m, k)).astype(np.float32)
            b = rng.standard_normal((k, n)).astype(np.float32)
            bias, scale, shift = (rng.standard_normal(m).astype(np.float32) for _ in range(3))
            got = run(spec, device, a, b, bias=bias, affine=(scale, shift), activation="relu_general", params=PARAMS)
            assert_close(got, reference(a, b, precision, bias, (scale, shift), "relu_general", PARAMS), tolerance)


def test_a_large_product(device, rng):
    """1001 x 1001 by 1001 x 257 in the default configuration: 8 x 3 tiles, 63 K steps, the last
    tile of each dimension mostly padding."""
    opencl_only(device)
    a = rng.standard_normal((1001, 1001)).astype(np.float32)
    b = rng.standard_normal((1001, 257)).astype(np.float32)
    assert_close(run(LIB["gemm_bulk"], device, a, b), reference(a, b, "fp32"))


def test_sliced_results_are_bit_identical_run_after_run(device, rng):
    """The slices are added in slice order whichever work-group finishes last, and each launch leaves
    the counters at 0: two products that share one scratch buffer, interleaved, repeat exactly."""
    a1, a2 = rng.standard_normal((200, 517)).astype(np.float32), rng.standard_normal((200, 263)).astype(np.float32)
    b1, b2 = rng.standard_normal((517, 23)).astype(np.float32), rng.standard_normal((263, 23)).astype(np.float32)
    sliced = [c for c in CONFIGS if int(c["SLICES"]) > 1]
    assert len(sliced) >= 3
    for config in sliced:
        spec = LIB["gemm_bulk"].configure(config)
        if not fits(spec, device):
            continue
        first = run(spec, device, a1, b1), run(spec, device, a2, b2)
        assert_close(first[0], reference(a1, b1, "fp32"))
        assert_close(first[1], reference(a2, b2, "fp32"))
        for _ in range(2):
            np.testing.assert_array_equal(run(spec, device, a1, b1), first[0])
            np.testing.assert_array_equal(run(spec, device, a2, b2), first[1])


def test_preconditions_offer_it_for_large_batches_of_wide_layers():
    """It serves 256 samples or more of a layer of 33 units or more; smaller products go to the
    fallback (every configuration of the family shares the rule)."""
    for codename in ENTRIES:
        spec = LIB[codename]
        assert spec.accepts(33, 1, 256) and spec.accepts(4096, 4096, 8192)
        assert not spec.accepts(33, 1, 255) and not spec.accepts(32, 1024, 1024)


@pytest.mark.parametrize("codename", ["gemm_bulk", "gemm_bulk_split"])
def test_a_dense_network_that_uses_it_answers_as_numpy_does(device, codename, rng):
    """Chosen with ops.use: at batch 300 its layers of 33 units or more run it, the 10-unit head the
    fallback, and the answer is numpy's; at batch 20 every layer runs the fallback, answering alike."""
    opencl_only(device)
    ops.use("matmul", codename, device)
    model = malinn.Sequential([Dense(200, activation="relu"), Dense(40, activation="tanh"), Dense(10)])
    model.build((None, 77))
    for layer in model.layers:
        layer.set_weights([layer.kernel, rng.standard_normal(layer.units).astype(np.float32) * 0.1])
    kernels = [r["kernel"].split(" ")[0] for r in model.plan(300, device).describe() if r["kind"] == "matmul"]
    assert kernels[:2] == [codename, codename] and kernels[2] != codename, kernels
    for batch in (300, 20):
        x = rng.uniform(-1, 1, (batch, 77)).astype(np.float32)
        h = x.astype(np.float64)
        for layer in model.layers:
            h = ref_activation(layer.activation, h @ layer.kernel.astype(np.float64) + layer.bias, axis=-1)
        assert_close(model.predict(x), h)
