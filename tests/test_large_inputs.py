"""Large inputs, out-of-memory and non-finite inputs (docs/RELIABILITY.md).

The device's largest single allocation is lowered through the real ``Device.max_allocation``
attribute (what ``Sequential.max_batch`` and ``matrix.allocate`` read), so that splitting and
out-of-memory paths run without allocating gigabytes.
"""

import math
import re

import numpy as np
import pytest
from support import assert_close, model_forward

from malinn import DeviceError, Sequential, ops
from malinn.backends.base import size_text
from malinn.choice import conv_choice
from malinn.choice.conv_geometry import ConvGeometry
from malinn.choice.matrix import DeviceMatrix
from malinn.layers import Activation, BatchNormalization, Conv2D, Dense
from malinn.library.kernel_library import load_library
from malinn.plan.builder import PlanBuilder

#: every matmul kernel, and None: the device's own default (in the configuration named for its kind)
MATMULS = [None] + load_library().codenames("matmul")


def _one_per_buffer_signature(codenames):
    """The first kernel of each distinct (layouts of A, B and R, image operand, buffers, scratch,
    which preconditions): a split batch is a matter of the buffers a plan lays out and of which
    kernel each pass may take, not of a kernel's arithmetic (test_ops checks that on every kernel)."""
    library, seen = load_library(), set()
    for codename in codenames:
        spec = library[codename]
        key = (
            tuple((m.representation, m.image) for m in spec.matrices.values()),
            spec.buffers,
            spec.scratch_bytes is not None,
            tuple(sorted(dict(spec.preconditions))),
        )
        if key not in seen:
            seen.add(key)
            yield codename


#: the default and one kernel per buffer signature
SPLIT_MATMULS = [None] + list(_one_per_buffer_signature(load_library().codenames("matmul")))


def choose(codename, device):
    if codename:
        ops.use("matmul", codename, device)


def make_model(seed=0, input_dim=37):
    """37 -> 13 relu -> BatchNormalization -> 1001 sigmoid -> 3 softmax, with non-trivial weights."""
    rng = np.random.default_rng(seed)
    model = Sequential(
        [
            Dense(13, activation="relu", name="narrow"),
            BatchNormalization(name="norm"),
            Dense(1001, activation="sigmoid", name="wide"),
            Dense(3, activation="softmax", name="out"),
        ]
    )
    model.build((None, input_dim))
    weights = [w + rng.standard_normal(w.shape).astype(np.float32) * 0.3 for w in model.get_weights()]
    weights[5] = np.abs(weights[5]) + 0.5  # the moving variance stays positive
    model.set_weights(weights)
    return model


def reference(model, x):
    """A float64 numpy forward pass of ``model`` (Dense and BatchNormalization layers)."""
    return model_forward(model, x)


def same_kernels(model, device, n1, n2):
    """Whether passes of ``n1`` and ``n2`` samples run every Dense with the same kernel (then
    their results are bitwise equal; a kernel whose preconditions need a larger batch may hand a
    small pass to the fallback kernel, which rounds differently)."""
    same = True
    for layer in model.layers:
        if isinstance(layer, Dense):
            a = ops.kernel_for("matmul", device, (layer.units, layer.input_dim, n1))
            b = ops.kernel_for("matmul", device, (layer.units, layer.input_dim, n2))
            same &= a.codename == b.codename and a.defines == b.defines
    return same


def weight_bytes(model, device, n):
    """The largest laid-out Dense kernel (W) of ``model`` for passes of ``n`` samples."""
    return model.memory(n, device)["largest_weight"]


def lower_the_limit(monkeypatch, model, device, n, samples):
    """Sets ``device.max_allocation`` to what about ``samples`` samples need (never below the
    weights, nor below the small batches' scratch buffers: those are one buffer each whatever the
    batch) and returns the passes of ``n``."""
    budget = max(
        [model.activation_bytes(k, device)[0] for k in (1, 2, 4, 8, samples)]  # a small batch's
        + [weight_bytes(model, device, k) for k in (1, 2, 4, 8, samples, n)]
    )  # gemv splits K: scratch
    assert model.activation_bytes(n, device)[0] > budget, "the batch must not fit in one pass"
    monkeypatch.setattr(device, "max_allocation", budget)
    step = model.max_batch(device)
    assert samples <= step < n and model.activation_bytes(step, device)[0] <= budget
    assert model.activation_bytes(step + 1, device)[0] > budget
    return step


def assert_equal_results(got, want, bitwise):
    if bitwise:
        np.testing.assert_array_equal(got, want)
    else:
        assert_close(got, want, rtol=1e-5)


@pytest.mark.parametrize("codename", SPLIT_MATMULS, ids=lambda c: c or "default")
def test_a_batch_beyond_one_allocation_is_split_and_answered_correctly(device, codename, monkeypatch, rng):
    choose(codename, device)
    model = make_model()
    n = 301  # 7 x 43, and a pass takes 60 to 300 samples: the last pass is shorter than the others
    x = rng.standard_normal((n, 37)).astype(np.float32)
    whole = model.predict(x)  # one pass
    step = lower_the_limit(monkeypatch, model, device, n, n // 5)
    passes = math.ceil(n / step)
    assert n % step, step
    model.predict(x[:step])  # a pass may take another kernel than the whole (preconditions on n): its weights now
    before = dict(device.counters)
    split = model.predict(x)
    assert device.counters["downloads"] - before["downloads"] == passes > 1
    assert device.counters["uploads"] - before["uploads"] == passes  # the inputs only
    assert split.shape == (n, 3) and split.dtype == np.float32
    # every pass, the shorter last one too, runs the plan of ``step`` samples
    assert_equal_results(split, whole, same_kernels(model, device, step, n))
    assert_close(split, reference(model, x))


def test_split_and_batch_size_passes_plan_once_not_per_call(device, monkeypatch, rng):
    """Repeated predicts that split a batch (the device's limit, or ``batch_size`` with a shorter
    last pass) plan nothing after the first: the largest pass that fits is remembered and every
    pass runs the plan of the pass size."""
    model = make_model(seed=3)
    n = 230
    x = rng.standard_normal((n, 37)).astype(np.float32)
    lower_the_limit(monkeypatch, model, device, n, n // 4)
    compiles = []
    original = PlanBuilder.compile
    monkeypatch.setattr(
        PlanBuilder, "compile", lambda self, outputs: (compiles.append(self.batch), original(self, outputs))[1]
    )
    for batch_size in (None, 50):  # 50: four passes and a shorter fifth, inside the device's limit
        first = model.predict(x, batch_size=batch_size)
        planned = len(compiles)
        for _ in range(2):
            np.testing.assert_array_equal(model.predict(x, batch_size=batch_size), first)
        assert len(compiles) == planned, (batch_size, compiles[planned:])


def test_batch_size_stays_an_upper_bound_beside_the_device_split(device, monkeypatch, rng):
    model = make_model(seed=1)
    n = 230
    x = rng.standard_normal((n, 37)).astype(np.float32)
    whole = model.predict(x)
    step = lower_the_limit(monkeypatch, model, device, n, n // 4)
    for batch_size, per_pass in [(4, min(4, step)), (n - 10, step), (None, step), (10 * n, step)]:
        before = device.counters["downloads"]
        got = model.predict(x, batch_size=batch_size)
        assert device.counters["downloads"] - before == math.ceil(n / per_pass), batch_size
        assert_equal_results(got, whole, same_kernels(model, device, per_pass, n))


def test_predict_layers_is_split_the_same_way(device, monkeypatch, rng):
    model = make_model(seed=2)
    n = 190
    x = rng.standard_normal((n, 37)).astype(np.float32)
    whole = model.predict_layers(x)
    step = lower_the_limit(monkeypatch, model, device, n, n // 4)
    before = device.counters["downloads"]
    split = model.predict_layers(x)
    assert device.counters["downloads"] - before == math.ceil(n / step) * len(model.layers)
    assert [s.shape for s in split] == [(n, 13), (n, 13), (n, 1001), (n, 3)]
    for got, want in zip(split, whole):
        assert_equal_results(got, want, same_kernels(model, device, step, n))


def test_max_batch_without_a_limit_is_the_whole_batch_when_it_fits(device):
    model = make_model()
    assert model.max_batch(device, limit=1000) == 1000
    size, what = model.activation_bytes(1000, device)
    assert size < device.max_allocation and "layer 'wide'" in what  # the widest layer dominates


@pytest.mark.parametrize("kind", ["own", "gpu"])
def test_one_sample_beyond_the_largest_allocation_names_the_layer_and_shape(device, monkeypatch, rng, kind):
    """With the device's own defaults, and with a GPU's (pretended), where the wide layer and the
    softmax head after it run in one launch whose scratch holds both layers' partial sums."""
    if kind == "gpu":
        monkeypatch.setattr(type(device), "kind", property(lambda self: "gpu"))
    model = make_model()
    x = rng.standard_normal((3, 37)).astype(np.float32)
    size, what = model.activation_bytes(1, device)
    monkeypatch.setattr(device, "max_allocation", size - 4)
    # the largest buffer of one sample: the wide layer's activations, or (where a GPU's batch-1 kernel
    # splits K over work-groups) its scratch of partial sums; sizes exact to the byte
    with pytest.raises(
        DeviceError,
        match=r"(layer 'wide'|layers 'wide' \+ 'out') ((input|output) \(1001 features x 1 "
        r"samples, padded to \d+x\d+ in \w+ for kernel \w+\)|scratch \(partial sums "
        r"for 1001 features x 1 samples, padded to \d+x\d+(, then the head's 3)?, kernel "
        rf"\w+\)) needs [\d.]+ [KM]iB \({size:,} bytes\), more than .* allows in one "
        rf"allocation \([\d.]+ [KM]iB, {size - 4:,} bytes\): even one sample does not fit",
    ):
        model.predict(x)


def test_weights_beyond_the_largest_allocation_raise_a_device_error_naming_the_layer(device, monkeypatch, rng):
    model = Sequential([Dense(1001, name="big_kernel")])
    model.build((None, 300))  # W is 1001 x 300: about 1.2 MiB; one sample's activations are ~4 KiB
    monkeypatch.setattr(device, "max_allocation", 2**18)
    with pytest.raises(
        DeviceError,
        match=r"layer 'big_kernel' kernel 1001x300 in \w+: 1\.\d+ MiB exceeds the largest "
        r"single allocation",
    ):
        model.predict(rng.standard_normal((2, 300)))


def test_a_real_driver_allocation_failure_is_a_device_error(device, monkeypatch):
    """malinn's own size check is lifted, so the driver itself must refuse a 2**40-byte (1 TiB)
    result. PoCL refuses it when it is created (CL_INVALID_BUFFER_SIZE); a driver that allocates
    on first use (NVIDIA's) refuses the first kernel that writes it: either way a DeviceError
    naming the layer and the OpenCL status, and the device works afterwards (OpenGL's: tests/test_opengl.py)."""
    if device.backend != "opencl":
        pytest.skip("OpenCL statuses; the OpenGL backend's out-of-memory test is in tests/test_opengl.py")
    if device.cl_device.max_mem_alloc_size >= 2**40 or device.cl_device.global_mem_size >= 2**40:
        pytest.skip(f"{device.name} claims to hold 1 TiB")
    monkeypatch.setattr(device, "max_allocation", 2**62)
    padded = (2**18, 2**20)  # 2**38 floats; the kernel below touches one of them
    try:
        m = DeviceMatrix.empty(device, (1, 1), "R", padded, what="layer 'x' result")
    except DeviceError as exc:
        assert re.fullmatch(
            r"layer 'x' result 1x1 in R: allocating 1048576\.00 MiB on .* failed \(CL_\w+\)", str(exc)
        ), exc
    else:
        with pytest.raises(DeviceError, match=r"^layer 'x': kernel relu failed on .* \(CL_\w+\)"):
            ops.activation(m, "relu", what="layer 'x'")
            device.queue.finish()  # where the error is only reported when the queue runs
        del m
    model = make_model()
    x = np.ones((2, 37), np.float32)
    assert_close(model.predict(x), reference(model, x))


# ------------------------------------------------------------------------------- NaN and Inf


def poisoned(rng, n=9):
    x = rng.standard_normal((n, 37)).astype(np.float32)
    x[1, 5] = np.nan
    x[3, 0] = np.inf
    x[4, 36] = -np.inf
    x[6, :] = np.nan
    return x, [0, 2, 5, 7, 8]


@pytest.mark.parametrize("codename", MATMULS, ids=lambda c: c or "default")
def test_nan_and_inf_stay_in_their_sample_and_propagate_like_tensorflow(device, codename, rng):
    """TensorFlow propagates NaN and Inf through matmul, bias, relu, sigmoid, softmax by IEEE rules:
    a NaN input makes its whole sample NaN after a Dense; +-Inf gives +-Inf or NaN (Inf - Inf)."""
    choose(codename, device)
    model = make_model(seed=3)
    x, clean = poisoned(rng)
    got = model.predict(x)
    want = reference(model, x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[[1, 3, 4, 6]]).all()  # each poisoned sample is NaN after softmax
    assert np.isfinite(got[clean]).all()  # ...and no other sample is touched
    assert_close(got[clean], want[clean])
    assert_close(got[clean], model.predict(x[clean]))


@pytest.mark.parametrize("activation", ["relu", "sigmoid", "tanh", "softmax", "linear", "elu", "gelu"])
def test_non_finite_values_through_each_activation(device, activation, rng):
    model = Sequential([Dense(5, activation=activation, name="d")])
    model.build((None, 3))
    model.set_weights(
        [np.array([[1, -1, 0.5, 2, 0], [0, 0, 0, 0, 1], [1, 1, 1, 1, 1]], np.float32), np.zeros(5, np.float32)]
    )
    x = np.array([[np.inf, 0, 0], [-np.inf, 0, 0], [np.nan, 0, 0], [1, 2, 3], [1, np.inf, -np.inf]], np.float32)
    got = model.predict(x)
    want = reference(model, x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-6)
    assert np.isfinite(got[3]).all()


def test_nan_does_not_cross_a_split_boundary(device, monkeypatch, rng):
    model = make_model(seed=4)
    x, clean = poisoned(rng, n=9)
    x = np.concatenate([x] * 40)  # 360 samples, poisoned ones in every pass
    clean = [i + 9 * j for j in range(40) for i in clean]
    lower_the_limit(monkeypatch, model, device, len(x), 30)
    got = model.predict(x)
    np.testing.assert_array_equal(np.isnan(got).any(axis=1), [i not in clean for i in range(len(x))])
    assert_close(got[clean], reference(model, x[clean]))


def test_activation_only_model_keeps_nan_and_inf(device):
    model = Sequential([Activation("relu", name="r"), Activation("sigmoid", name="s")])
    x = np.array([[np.nan, np.inf, -np.inf, -1.0, 2.0]], np.float32)
    got = model.predict(x)
    assert np.isnan(got[0, 0]) and got[0, 1] == 1.0 and got[0, 2] == 0.5 and got[0, 3] == 0.5
    assert got[0, 4] == pytest.approx(1 / (1 + np.exp(-2.0)), rel=1e-6)


def test_im2col_is_passed_over_where_its_padded_patches_exceed_the_budget(device, monkeypatch):
    """The patch budget counts the patch matrix as the matmul pads it (9 taps padded to 16 or 64
    rows): im2col was chosen by its unpadded size, 7 to 16 times its budget, and then a single
    image was refused ("even one sample does not fit"), or max_batch's bound, which takes the
    patches to be within a quarter of the largest allocation, let a batch through that predict
    then refused instead of splitting."""
    geometry = ConvGeometry.of(
        1,
        1,
        8,
        1,
        {
            "IH": 130,
            "IW": 130,
            "OH": 128,
            "OW": 128,
            "KH": 3,
            "KW": 3,
            "SH": 1,
            "SW": 1,
            "DH": 1,
            "DW": 1,
            "PT": 0,
            "PL": 0,
        },
    )
    unpadded, padded = conv_choice.patch_bytes(geometry), conv_choice.patch_bytes(geometry, device)
    assert padded > unpadded == 4 * 9 * 128 * 128
    monkeypatch.setattr(conv_choice, "patch_budget", lambda device: (unpadded + padded) // 2)
    im2col = [spec for spec, _ in conv_choice.rules(device) if spec.op == "im2col"]
    assert im2col and not any(conv_choice.runs(spec, geometry, device) for spec in im2col)


def test_sizes_take_positive_whole_numbers_of_samples():
    model = Sequential([Dense(3)])
    model.build((None, 4))
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="positive whole number of samples"):
            model.activation_bytes(bad)
        with pytest.raises(ValueError, match="positive whole number of samples"):
            model.max_batch(limit=bad)


@pytest.mark.parametrize("limit", [600, 2000])
def test_max_batch_of_a_convolution_fits_its_padded_channels(device, monkeypatch, limit):
    """A convolution's tensors are matrices of their channels by batch x pixels: 4 channels padded
    to 32 rows are 8 times the bytes. max_batch's bound took the padding to add to a sample's
    values instead, and let 2000 samples through a 128 MiB limit they need twice of (predict then
    refused instead of splitting)."""
    monkeypatch.setattr(device, "max_allocation", 128 * 2**20)
    model = Sequential([Conv2D(4, 3, name="conv")])
    model.build((None, 34, 34, 1))
    budget = min(device.max_allocation, device.global_memory // 4)
    n = model.max_batch(device, limit=limit)
    assert 1 <= n <= limit and model.activation_bytes(n, device)[0] <= budget


def test_the_weights_and_a_pass_fit_the_devices_global_memory(device, monkeypatch, rng):
    """A model whose weights take most of a board's memory: max_batch keeps the weights and a
    pass's activations within the device's global memory (it checked each buffer alone: five 187 MiB
    layers on a 1 GiB board got passes of 1.7 GiB), predict answers in such passes, and a model
    whose weights and one sample do not fit is refused naming the device's memory."""
    model = Sequential([Dense(1200, activation="relu"), Dense(1200, activation="relu"), Dense(7)])
    model.build((None, 1100))
    weights = model.memory(1, device)["weights"]
    room = 4 * 2**20
    monkeypatch.setattr(device, "global_memory", weights + room)
    step = model.max_batch(device)
    assert 8 < step < 2**31
    used = model.memory(step, device)
    assert used["weights"] + used["activations"] <= weights + room
    more = model.memory(step + 1, device)
    assert more["weights"] + more["activations"] > weights + room
    x = rng.standard_normal((3 * step + 5, 1100)).astype(np.float32)
    assert_close(model.predict(x), model_forward(model, x), rtol=1e-4)
    monkeypatch.setattr(device, "global_memory", weights // 2)
    with pytest.raises(
        DeviceError,
        match=rf"Sequential 'sequential.*': its weights \({size_text(weights)}\) and one "
        r"sample's activations \(.*\) need more than .*'s global memory",
    ):
        model.max_batch(device)  # the plan's weights (the message gave the generous bound: 22 MiB for 0.6)


def test_max_batch_keeps_each_tensor_within_the_kernels_32_bit_element_count(device, monkeypatch):
    """A device whose allocations may hold 2^32 floats or more (an H200's are 35 GB): a pass of a
    depthwise convolution whose result has that many elements is refused by its kernel (it divides
    by its sizes in 32 bits), so max_batch plans passes whose tensors stay below it; it gave the
    whole batch, and predict of 8192 images at 224 x 224 failed."""
    from malinn.layers import DepthwiseConv2D
    from malinn.model.memory import MAX_TENSOR_BYTES

    monkeypatch.setattr(device, "max_allocation", 2**40)
    monkeypatch.setattr(device, "global_memory", 2**43)
    model = Sequential([DepthwiseConv2D(3, padding="same", name="depthwise")])
    model.build((None, 112, 112, 32))
    n = model.max_batch(device, limit=20000)
    assert 8000 < n < 20000  # 112 x 112 x 32 floats a sample: about 10,700 within 2^32 elements
    assert model.activation_bytes(n, device)[0] <= MAX_TENSOR_BYTES < model.activation_bytes(20000, device)[0]
