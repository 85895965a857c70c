"""gemv_split_c_head (kernels/gemv_split.cl with HEAD=1): a small Dense head computed inside the kernel
of the Dense layer before it, at batches up to the kernel's NB (one launch fewer).

Networks planned with the GPU's defaults (the device's kind pretended) on odd shapes (first layer's
units and inputs among 1, 3, 5, 13, 1001; head units 1, 3, 10, 64), every precision against numpy
computed with the weights that precision stores, every kind of head activation (linear, softmax,
parameterless element-wise); results bit-identical run after run with two fused plans sharing the
scratch buffer; the cases the plan must not fuse (too many units, a parameterised activation, an
explicit kernel choice, the first layer's result read elsewhere); Oclgrind's memory, race,
uninitialised-value and API checks.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from support import activation as ref_activation
from support import assert_close, run_under_oclgrind

import malinn
from malinn.choice import kernel_choice
from malinn.layers import Dense
from malinn.library.kernel_library import load_library
from malinn.library.precision import effective

pytestmark = pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)

LIB = load_library()


@pytest.fixture
def gpu_kind(device, monkeypatch):
    """The device with the GPU's defaults (its kind pretended); skips devices whose backend the
    library offers no fused head on."""
    if not LIB.default_specs("matmul_head", "gpu", device.backend):
        pytest.skip(f"the library offers no fused head on the {device.backend} backend")
    monkeypatch.setattr(type(device), "kind", property(lambda self: "gpu"))
    return device


def network(sizes, activations, rng, precision="fp32"):
    """A Dense network of ``sizes`` (inputs first) with random biases, in ``precision``."""
    model = malinn.Sequential([Dense(units, activation=a) for units, a in zip(sizes[1:], activations)])
    model.build((None, sizes[0]))
    for layer in model.layers:
        layer.set_weights([layer.kernel, rng.standard_normal(layer.units).astype(np.float32) * 0.1])
    model.precision = precision
    return model


def reference(model, x, precision):
    h = x.astype(np.float64)
    for layer in model.layers:
        weights = effective(layer.kernel.T, precision).T.astype(np.float64)
        h = ref_activation(layer.activation, h @ weights + layer.bias, axis=-1)
    return h


def matmul_rows(model, batch, device):
    return [r for r in model.plan(batch, device).describe() if r["kind"] == "matmul"]


#: (inputs, first layer's units, head units, batch, first activation, head activation)
CASES = [
    (1001, 13, 10, 1, "tanh", "softmax"),
    (5, 1001, 1, 1, "relu", "linear"),
    (1, 3, 3, 1, "sigmoid", "relu"),
    (13, 1001, 64, 1, "relu", "sigmoid"),
    (1001, 5, 3, 2, "linear", "softmax"),
    (3, 257, 10, 8, "relu", "tanh"),
    (3072, 129, 10, 1, "relu", "softmax"),
]


@pytest.mark.parametrize("precision", ["fp32", "fp16-storage", "int8-weights", "fp16"])
def test_a_fused_head_matches_numpy_on_odd_shapes(gpu_kind, precision, rng):
    device = gpu_kind
    if precision == "fp16" and "cl_khr_fp16" not in device.extensions:
        pytest.skip(f"{device.name} has no cl_khr_fp16")
    # every case in fp32; every other one in the reduced precisions (only the weights' loads differ)
    for inputs, units, head, batch, first, last in CASES if precision == "fp32" else CASES[::2]:
        model = network([inputs, units, head], [first, last], rng, precision)
        rows = matmul_rows(model, batch, device)
        assert len(rows) == 1 and rows[0]["kernel"].startswith("gemv_split_c_head"), rows
        assert rows[0]["layers"] == [layer.name for layer in model.layers]
        assert rows[0]["fused"][-1] == ("head" if last == "linear" else f"head ({last})")
        x = rng.standard_normal((batch, inputs)).astype(np.float32)
        assert_close(model.predict(x), reference(model, x, precision), 1e-2 if precision == "fp16" else 1e-5)


def test_a_parameterised_activation_before_the_head_keeps_its_parameters(gpu_kind, rng):
    """The first layer's activation takes parameters (ELU's alpha, a ReLU's slope, cap and
    threshold): they reach the fused kernel (found on the H200 by the Keras equivalence suite)."""
    from malinn.layers import ELU, ReLU

    for activation in (ELU(alpha=0.5), ReLU(max_value=2.0, negative_slope=0.2, threshold=0.5)):
        model = malinn.Sequential([Dense(13), activation, Dense(3, activation="softmax")])
        model.build((None, 5))
        model.set_weights(
            [w if w.ndim == 2 else rng.standard_normal(w.shape).astype(np.float32) for w in model.get_weights()]
        )
        rows = matmul_rows(model, 1, gpu_kind)
        assert len(rows) == 1 and rows[0]["kernel"].startswith("gemv_split_c_head"), rows
        x = rng.standard_normal((1, 5)).astype(np.float32)
        h = x.astype(np.float64) @ model.layers[0].kernel + model.layers[0].bias
        if isinstance(activation, ELU):
            h = np.where(h > 0, h, 0.5 * np.expm1(h))
        else:
            h = np.where(h >= 2.0, 2.0, np.where(h >= 0.5, h, 0.2 * (h - 0.5)))
        z = h @ model.layers[2].kernel + model.layers[2].bias
        z = np.exp(z - z.max(axis=-1, keepdims=True))
        assert_close(model.predict(x), z / z.sum(axis=-1, keepdims=True))


def test_fused_heads_repeat_bit_for_bit_sharing_the_scratch(gpu_kind, rng):
    """Each launch leaves the head counters and partial sums at 0 and the tiles are added in tile
    order: two fused networks, interleaved, repeat exactly."""
    one = network([1001, 3000, 10], ["relu", "softmax"], rng)
    two = network([700, 2000, 7], ["tanh", "linear"], rng)
    x1, x2 = rng.standard_normal((1, 1001)).astype(np.float32), rng.standard_normal((1, 700)).astype(np.float32)
    first = one.predict(x1), two.predict(x2)
    assert_close(first[0], reference(one, x1, "fp32"))
    assert_close(first[1], reference(two, x2, "fp32"))
    for _ in range(3):
        np.testing.assert_array_equal(one.predict(x1), first[0])
        np.testing.assert_array_equal(two.predict(x2), first[1])


def test_what_the_plan_does_not_fuse(gpu_kind, rng, monkeypatch):
    """A head of more units than the kernel takes, one whose activation has parameters, a batch
    beyond the first layer's kernel, and a network whose kernel was chosen with ``use`` keep two
    launches, and answer as numpy does."""
    device = gpu_kind
    limit = int(dict(LIB["gemv_split_c_head"].defines)["HEAD_UNITS"])
    cases = [
        (network([300, 200, limit + 1], ["relu", "linear"], rng), 1),
        (network([300, 200, 10], ["relu", "elu"], rng), 1),
        (network([300, 200, 10], ["relu", "softmax"], rng), 9),
    ]
    for model, batch in cases:
        assert len(matmul_rows(model, batch, device)) == 2
        x = rng.standard_normal((batch, 300)).astype(np.float32)
        assert_close(model.predict(x), reference(model, x, "fp32"))
    model = network([300, 200, 10], ["relu", "softmax"], rng)
    kernel_choice.use("matmul", "gemv_split_c", device, {"NB": 1})
    try:
        assert len(matmul_rows(model, 1, device)) == 2
    finally:
        kernel_choice.forget(device)
    assert len(matmul_rows(model, 1, device)) == 1


def test_a_head_counts_in_the_plan_weights_and_tuned_shapes(gpu_kind, rng):
    """The head's weight copy is among the plan's weights (summary, memory), and ``malinn tune
    --model`` still times both layers' products."""
    device = gpu_kind
    model = network([300, 200, 10], ["relu", "softmax"], rng)
    plan = model.plan(1, device)
    assert plan.matmul_shapes() == [(200, 300, 1), (10, 200, 1)]
    assert len(plan.weight_sizes()) == 2 and plan.weight_sizes()[1] >= 10 * 200 * 4
    assert model.memory(1, device)["weights"] >= 4 * (200 * 300 + 10 * 200)


OCLGRIND = shutil.which("oclgrind")
OCLGRIND_SCRIPT = r"""
import json, numpy as np, malinn
from malinn.layers import Dense
from malinn.library.precision import effective
device = malinn.get_device()
type(device).kind = property(lambda self: "gpu")
rng = np.random.default_rng(0)
errors = {}
for precision in ["fp32", "fp16-storage", "int8-weights"]:
    for sizes, acts, batch in [([37, 13, 3], ["relu", "softmax"], 1), ([5, 130, 3], ["tanh", "linear"], 2)]:
        model = malinn.Sequential([Dense(u, activation=a) for u, a in zip(sizes[1:], acts)])
        model.build((None, sizes[0]))
        model.precision = precision
        rows = [r for r in model.plan(batch, device).describe() if r["kind"] == "matmul"]
        assert len(rows) == 1 and rows[0]["kernel"].startswith("gemv_split_c_head"), rows
        x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
        for _ in range(2):
            got = model.predict(x)
        h = x.astype(np.float64)
        for layer in model.layers:
            z = h @ effective(layer.kernel.T, precision).T.astype(np.float64) + layer.bias
            if layer.activation == "softmax":
                e = np.exp(z - z.max(-1, keepdims=True)); h = e / e.sum(-1, keepdims=True)
            else:
                h = {"relu": lambda v: np.maximum(v, 0), "tanh": np.tanh, "linear": lambda v: v}[layer.activation](z)
        errors[f"{precision} {sizes} {batch}"] = float(np.abs(got - h).max())
print(json.dumps(errors))
"""


@pytest.mark.skipif(OCLGRIND is None, reason="oclgrind is not on PATH (bash .ci/setup --test installs it)")
def test_a_fused_head_is_clean_under_oclgrind():
    """Out-of-bounds accesses, data races (the head's partial sums and counter are atomics),
    uninitialised values and API misuse, every weight precision, each network run twice (the second
    finds the counters the first left)."""
    errors = run_under_oclgrind(OCLGRIND, OCLGRIND_SCRIPT)
    assert len(errors) == 6 and all(error < 1e-5 for error in errors.values()), errors
