"""gemv_split (kernels/gemv_split.cl): batch 1..8 products with K split across work-groups, the
partial sums reduced by the last work-group through a scratch buffer.

Every configuration the library names or the tuner can emit, on odd shapes (m and k among 1, 3, 5,
13, 1001, 4099; n = 1 .. NB), against numpy computed with the weights each precision stores
(``malinn.library.precision.effective``), with the fused epilogue; results bit-identical run after run
(the slices are added in a fixed order, and every launch leaves the scratch counters at 0);
the library's ``scratch_bytes`` field validated; a Dense model at batch 1 planned with the GPU
defaults runs the kernel the defaults name; Oclgrind's memory, race and API checks in every
precision.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support import activation as ref_activation
from support import assert_close, run_under_oclgrind

import malinn
from malinn import ops
from malinn.choice.matrix import DeviceMatrix
from malinn.errors import LibraryError
from malinn.layers import Dense
from malinn.library.kernel_library import load_library
from malinn.library.precision import device_bytes, effective
from malinn.resources import kernels_dir

pytestmark = pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
LIB = load_library()
CODENAMES = ("gemv_split", "gemv_split_c")
#: every configuration the tuner can emit (gemv_split_c's candidates; gemv_split, in Keras's order's stead, takes them too)
CONFIGS = [{k: v for k, v in c.items() if k != "KERAS_ORDER"} for c in LIB["gemv_split_c"].configurations()]
CONFIG_IDS = ["-".join(f"{k}{v}" for k, v in c.items()) for c in CONFIGS]
#: (m, k): every one of 1, 3, 5, 13, 1001, 4099 as m and as k
ODD = [(1, 4099), (4099, 1), (3, 13), (13, 3), (5, 1001), (1001, 5), (1, 1), (13, 1001), (4099, 13)]
PARAMS = {"negative_slope": 0.1, "max_value": 2.5, "threshold": 0.5, "has_max_value": 1.0}


def precisions(device) -> list:
    return ["fp32", "fp16-storage", "int8-weights"] + (["fp16"] if "cl_khr_fp16" in device.extensions else [])


def run(spec, device, a, b, bias=None, affine=None, activation="linear", params=None):
    """``ops.matmul`` with ``a`` uploaded as ``spec``'s precision stores it; the result on the host."""
    m, k = a.shape
    padded = ops.matmul_plan(spec, m, k, b.shape[1])["a"]
    layout = spec.matrices["a"].layout
    weights = DeviceMatrix.upload_weights(
        device, device_bytes(a, spec.precision, layout, padded), (m, k), layout, padded, spec.precision
    )
    vector = lambda v: None if v is None else ops.upload_vector(device, v)  # noqa: E731
    r = ops.matmul(
        weights,
        DeviceMatrix.from_host(b),
        spec,
        device,
        bias=vector(bias),
        activation=activation,
        params=params,
        affine=None if affine is None else tuple(vector(v) for v in affine),
    )
    return r.numpy()


def reference(a, b, precision, bias=None, affine=None, activation="linear", params=None):
    z = effective(a, precision).astype(np.float64) @ b.astype(np.float64)
    if bias is not None:
        z = z + bias[:, None]
    z = ref_activation(activation, z, axis=0, **(params or {}))
    if affine is not None:
        z = z * affine[0][:, None] + affine[1][:, None]
    return z


def fits(spec, device) -> bool:
    return int(np.prod(spec.workgroup)) <= device.max_work_group_size


@pytest.mark.parametrize("codename", CODENAMES)
@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
def test_every_configuration_at_every_batch_up_to_its_bound(device, codename, config, rng):
    """Each configuration on odd m and k at n = 1 .. NB, with bias and an activation fused."""
    spec = LIB[codename].configure(config)
    if not fits(spec, device):
        pytest.skip(f"work-group {spec.workgroup} exceeds {device.name}'s {device.max_work_group_size}")
    bound = dict(spec.preconditions)["max_n"]
    assert bound == int(config["NB"]) and not spec.accepts(5, 5, bound + 1)
    for m, k in [(13, 1001), (1001, 5), (3, 13)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        bias = rng.standard_normal(m).astype(np.float32)
        for n in range(1, bound + 1):
            b = rng.standard_normal((k, n)).astype(np.float32)
            got = run(spec, device, a, b, bias=bias, activation="tanh")
            assert_close(got, reference(a, b, "fp32", bias=bias, activation="tanh"))


@pytest.mark.parametrize("codename", CODENAMES)
def test_every_precision_and_epilogue_on_odd_shapes(device, codename, rng):
    """The default configuration, a sliced one with 1-row vectors and one with vloadN loads (WIDE 0),
    in every precision the device runs, on every odd shape: the plain product, and bias + a four-parameter activation + affine."""
    base = LIB[codename]
    small = base.configure({"VW": 1, "MDIM": 4, "KSPLIT": 8, "SLICES": 4, "UNROLL": 1, "NB": 2})
    narrow = base.configure({"VW": 16, "MDIM": 4, "KSPLIT": 4, "SLICES": 2, "UNROLL": 1, "NB": 2, "WIDE": 0})
    for precision in precisions(device):
        tolerance = 1e-2 if precision == "fp16" else 1e-5
        for spec in (base.in_precision(precision), small.in_precision(precision), narrow.in_precision(precision)):
            for i, (m, k) in enumerate(ODD):
                n = 1 + i % int(dict(spec.preconditions)["max_n"])
                a = rng.standard_normal((m, k)).astype(np.float32)
                b = rng.standard_normal((k, n)).astype(np.float32)
                assert_close(run(spec, device, a, b), reference(a, b, precision), tolerance)
                bias, scale, shift = (rng.standard_normal(m).astype(np.float32) for _ in range(3))
                got = run(
                    spec, device, a, b, bias=bias, affine=(scale, shift), activation="relu_general", params=PARAMS
                )
                assert_close(got, reference(a, b, precision, bias, (scale, shift), "relu_general", PARAMS), tolerance)


def test_results_are_bit_identical_run_after_run(device, rng):
    """The slices are added in slice order whichever work-group finishes last, and each launch leaves
    the scratch counters at 0: products that share one scratch buffer, interleaved, repeat exactly."""
    a1 = rng.standard_normal((300, 2001)).astype(np.float32)
    a2 = rng.standard_normal((300, 777)).astype(np.float32)
    b1 = rng.standard_normal((2001, 1)).astype(np.float32)
    b2 = rng.standard_normal((777, 1)).astype(np.float32)
    for config in CONFIGS:
        spec = LIB["gemv_split_c"].configure(config)
        if not fits(spec, device):
            continue
        first = run(spec, device, a1, b1), run(spec, device, a2, b2)
        assert_close(first[0], reference(a1, b1, "fp32"))
        for _ in range(2):
            np.testing.assert_array_equal(run(spec, device, a1, b1), first[0])
            np.testing.assert_array_equal(run(spec, device, a2, b2), first[1])


def test_scratch_holds_the_counters_and_the_partial_sums():
    """scratch_bytes: a counter per block of results and SLICES partial sums per result; none
    without slices."""
    spec = LIB["gemv_split_c"].configure({"VW": 4, "MDIM": 64, "KSPLIT": 2, "SLICES": 16, "UNROLL": 2, "NB": 1})
    from malinn.library.expressions import evaluate

    values = {**dict(spec.defines), "h": 512, "w": 1}
    assert evaluate(spec.scratch_bytes, values) == 4 * (2 * 1 + 16 * 512 * 1)
    plain = spec.configure({"SLICES": 1})
    assert evaluate(plain.scratch_bytes, {**dict(plain.defines), "h": 512, "w": 1}) == 0


def _broken_library(tmp_path, mutate):
    folder = tmp_path / "kernels"
    shutil.copytree(kernels_dir(), folder)
    data = json.loads((folder / "library.json").read_text())
    mutate(data["kernels"]["gemv_split"])
    (folder / "library.json").write_text(json.dumps(data))
    return folder / "library.json"


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda e: e.pop("scratch_bytes"), "kernel 'gemv_split', field 'scratch_bytes': a kernel with a 'scratch'"),
        (
            lambda e: e.update(scratch_bytes="4 * SLABS * h"),
            "kernel 'gemv_split', field 'scratch_bytes': '4 * SLABS * h' names 'SLABS'",
        ),
        (
            lambda e: e["restrictions"].update(buffers=["a", "b", "r", "bias", "scale", "shift", "scrap"]),
            "kernel 'gemv_split', field 'restrictions.buffers': unknown buffer 'scrap'",
        ),
    ],
)
def test_malformed_scratch_is_named(tmp_path, mutate, fragment):
    with pytest.raises(LibraryError) as info:
        load_library(_broken_library(tmp_path, mutate))
    assert fragment in str(info.value)


def test_a_kernel_without_scratch_may_not_name_its_size(tmp_path):
    def mutate(data):
        data["kernels"]["gemv"]["scratch_bytes"] = "4"

    folder = tmp_path / "kernels"
    shutil.copytree(kernels_dir(), folder)
    data = json.loads((folder / "library.json").read_text())
    mutate(data)
    (folder / "library.json").write_text(json.dumps(data))
    with pytest.raises(LibraryError, match="kernel 'gemv', field 'scratch_bytes'"):
        load_library(folder / "library.json")


@pytest.mark.parametrize("batch", [1, 8])
def test_dense_model_at_small_batch_runs_the_gpu_default(device, monkeypatch, rng, batch):
    """With the GPU's defaults (the device's kind pretended), a Dense network at batch 1 and 8 runs
    each wide layer with the first of matmul_fallback whose preconditions hold, and answers as numpy
    does; the classifier head (softmax) runs inside the kernel of the layer before it
    (gemv_split_c_head, in that layer's configuration): one launch fewer, on a backend whose library
    entries offer it (OpenCL; on GL the head keeps gemv_softmax_c)."""
    monkeypatch.setattr(type(device), "kind", property(lambda self: "gpu"))
    sizes = [301, 257, 129, 10]
    layers = [Dense(257, activation="relu"), Dense(129, activation="tanh"), Dense(10, activation="softmax")]
    model = malinn.Sequential(layers)
    model.build((None, sizes[0]))
    for layer in model.layers:
        layer.set_weights([layer.kernel, rng.standard_normal(layer.units).astype(np.float32) * 0.1])
    rows = [r for r in model.plan(batch, device).describe() if r["kind"] == "matmul"]
    fuses = bool(LIB.default_specs("matmul_head", "gpu", device.backend))
    fallbacks = LIB.default_specs("matmul_fallback", "gpu", device.backend)
    for row, (k, m) in zip(rows[:2], zip(sizes, sizes[1:])):
        want = next(f for f in fallbacks if f.accepts(m, k, batch))
        assert row["kernel"].split(" ")[0] == want.codename + ("_head" if fuses and row is rows[1] else "")
        assert all(f"{key}={want.config[key]}" in row["kernel"] for key in ("VW", "MDIM", "KSPLIT", "SLICES", "NB"))
    if fuses:
        assert len(rows) == 2 and rows[1]["layers"] == [layers[1].name, layers[2].name]
        assert rows[1]["fused"] == ["bias", "tanh", "head (softmax)"]
    else:
        assert rows[2]["kernel"].startswith("gemv_softmax_c")
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    h = x.astype(np.float64)
    for layer in model.layers:
        h = ref_activation(layer.activation, h @ layer.kernel.astype(np.float64) + layer.bias, axis=-1)
    assert_close(model.predict(x), h)


def test_the_gpu_defaults_name_gemv_split_c_for_small_batches():
    """The H200 sweep (benchmarks/results/gemv_split_sweep_nvidia_h200.json) chose gemv_split_c for
    batches 1..8 (K split across work-groups beats gemv_c's split inside one); at batch 1 a head of at
    most 64 units takes gemv_split_head_c, its configuration for few rows (timed inside the networks:
    benchmarks/results/insitu_b1_*_nvidia_h200.json), in every precision; in fp32 a wider layer of
    3072 inputs or more takes gemv_split_stream_c, its configuration for weight-streaming layers."""
    for precision in ("fp32", "fp16-storage", "int8-weights"):
        fallbacks = LIB.default_specs("matmul_fallback", "gpu", precision=precision)
        for n in range(1, 9):
            for m, k in ((4096, 3072), (3072, 4096), (2500, 784), (65, 3072), (10, 3)):
                chosen = next(f for f in fallbacks if f.accepts(m, k, n)).codename
                want = (
                    "gemv_split_head_c"
                    if m <= 64 and n == 1
                    else "gemv_split_stream_c"
                    if precision == "fp32" and k >= 3072 and n == 1
                    else "gemv_split_c"
                )
                assert chosen == want, (precision, m, k, n)
        head = LIB["gemv_split_head_c"]
        assert not head.accepts(65, 3072, 1) and not head.accepts(10, 3072, 2) and head.accepts(64, 1, 1)


OCLGRIND = shutil.which("oclgrind")
OCLGRIND_SCRIPT = r"""
import json, numpy as np, malinn
from malinn import ops
from malinn.library.kernel_library import load_library
from malinn.choice.matrix import DeviceMatrix
from malinn.library.precision import device_bytes, effective
device = malinn.get_device()
lib = load_library()
rng = np.random.default_rng(0)
errors = {}
precisions = ["fp32", "fp16-storage", "int8-weights"] + (["fp16"] if "cl_khr_fp16" in device.extensions else [])
odd = [(13, 37, 1), (5, 3, 2), (33, 17, 1)]
# (configuration, shapes): the two of 1024 and 4096 items a work-group column, whose simulation is
# most of this test's time, on one shape each: 16 rows a work-group on 33 (three row tiles); 128
# rows on 13 (one tile, as 33 would be)
configs = [(None, odd), ({"VW": 1, "MDIM": 4, "KSPLIT": 8, "SLICES": 4, "UNROLL": 1, "NB": 2}, odd),
           ({"VW": 16, "MDIM": 2, "KSPLIT": 4, "SLICES": 8, "UNROLL": 1, "NB": 1}, odd),
           ({"VW": 16, "MDIM": 2, "KSPLIT": 2, "SLICES": 2, "UNROLL": 2, "NB": 1, "WIDE": 0}, odd),
           ({"VW": 4, "MDIM": 4, "KSPLIT": 64, "SLICES": 16, "UNROLL": 1, "NB": 1}, odd[2:]),
           ({"VW": 8, "MDIM": 16, "KSPLIT": 16, "SLICES": 32, "COLS": 2, "NB": 1}, odd[:1])]
tuned = [lib["gemv_split_c"].configure(c).defines for c in lib["gemv_split_c"].configurations()]
for precision in precisions:
    for c, (config, shapes) in enumerate(configs):
        if config and precision == "fp32" and lib["gemv_split_c"].configure(config).defines in tuned:
            continue   # tests/test_oclgrind.py runs each configuration the tuner can emit in fp32
        spec = lib["gemv_split_c"].configure(config).in_precision(precision) if config else \
            lib["gemv_split_c"].in_precision(precision)
        for m, k, n in shapes:
            if n > int(dict(spec.preconditions)["max_n"]):
                continue
            a = rng.standard_normal((m, k)).astype(np.float32)
            b = rng.standard_normal((k, n)).astype(np.float32)
            bias, scale, shift = (rng.standard_normal(m).astype(np.float32) for _ in range(3))
            padded = ops.matmul_plan(spec, m, k, n)["a"]
            layout = spec.matrices["a"].layout
            w = DeviceMatrix.upload_weights(device, device_bytes(a, precision, layout, padded), (m, k), layout,
                                            padded, precision)
            up = lambda v: ops.upload_vector(device, v)
            for _ in range(2):
                got = ops.matmul(w, DeviceMatrix.from_host(b), spec, device, bias=up(bias), activation="tanh",
                                 affine=(up(scale), up(shift))).numpy()
            want = np.tanh(effective(a, precision).astype(np.float64) @ b + bias[:, None]) * scale[:, None] + shift[:, None]
            errors[f"{precision} {c} {m}x{k}x{n}"] = float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))
print(json.dumps(errors))
"""


@pytest.mark.skipif(OCLGRIND is None, reason="oclgrind is not on PATH (bash .ci/setup --test installs it)")
def test_clean_under_oclgrind_in_every_precision():
    """Out-of-bounds accesses, data races between work-items and work-groups (the partial sums and
    counters are atomics), uninitialised values and API misuse, with slices and without, each
    launched twice (the second finds the counters the first left). Of the configurations the tuner
    can emit, only the default runs in fp32 here (tests/test_oclgrind.py runs the others in fp32)."""
    errors = run_under_oclgrind(OCLGRIND, OCLGRIND_SCRIPT)
    assert len(errors) >= 28, errors
    assert all(error < (1e-2 if case.startswith("fp16 ") else 1e-5) for case, error in errors.items()), errors
