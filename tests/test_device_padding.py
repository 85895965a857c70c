"""An input padded on the device (``Device.pads_on_device``, malinn/plan/passes/input_padding.py):
a plan whose kernels read an input from a padded buffer uploads it as the caller's array is laid out,
into a buffer of its own, and its first step (the re-layout kernel) copies it into the padded buffer,
zeroing the padding. Results equal those of the host's padding (a staging array laid out as the
padded buffer) and numpy's, full passes and shorter ones alike; a page-locked input goes by one DMA.

PoCL shares the host's memory, where the path is off by default: ``MALINN_DEVICE_PADDING=1`` forces
it (on every device, the OpenGL backends too). The GPU's kernels (the device's kind pretended) read
a Dense layer's input in Keras's order from a buffer padded to their tiles, as on an H200.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from support import assert_close, dense_forward, run_under_oclgrind

import malinn
from malinn import Sequential
from malinn.backends import opencl
from malinn.layers import Conv2D, Dense
from malinn.plan.arena import arena
from malinn.plan.kinds.layout import RELAYOUT


def network(features: int, rng, units=(37, 10)) -> tuple:
    """A Dense network on ``features`` inputs and its numpy forward pass."""
    model = Sequential([Dense(units[0], activation="relu"), Dense(units[1], activation="softmax")])
    model.build((None, features))
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.2 for w in model.get_weights()])
    w = model.get_weights()
    return model, lambda x: dense_forward(x, [(w[0], w[1], "relu"), (w[2], w[3], "softmax")])


def replan(model) -> None:
    """Forgets the model's plans, so the next predict makes one (the path is decided when it is)."""
    model._plans.clear()
    model._recent = {}


def padded_input(plan) -> bool:
    """Whether the plan's kernels read its input from a buffer larger than the caller's array."""
    x = plan.inputs[0]
    storage = x.producer.out.storage if plan.input_copies else x.storage
    return storage.padded_size != (x.rows, x.cols)


@pytest.mark.parametrize("features", [784, 13, 1, 1001])
def test_a_dense_input_padded_on_the_device_answers_as_the_hosts_padding_and_numpy(
    padding_gpu, rng, monkeypatch, features
):
    """19 samples (no multiple of a column tile) and 320 (a tiled GEMM's batch): forced, the input's
    upload is direct from an unpadded buffer that the first step copies; switched off (0: what PoCL
    and llvmpipe do by default, sharing the host's memory) it goes through the padded staging array.
    Results equal."""
    device = padding_gpu
    model, forward = network(features, rng)
    for batch in (19, 320):
        x = rng.standard_normal((batch, features)).astype(np.float32)
        replan(model)
        plan = model.plan(batch, device)
        ((_, staging, _, _, unpadded),) = plan._io[0]
        assert not plan.input_copies and padded_input(plan) and not unpadded
        assert staging.shape != (batch, features)  # laid out as the padded buffer
        host = model.predict(x, verbose=0)
        monkeypatch.setenv("MALINN_DEVICE_PADDING", "1")
        replan(model)
        plan = model.plan(batch, device)
        assert len(plan.input_copies) == 1 and plan.steps[0] is plan.input_copies[0]
        assert plan.steps[0].kind is RELAYOUT and plan.steps[0].inputs["a"] is plan.inputs[0]
        got = model.predict(x, verbose=0)
        ((_, staging, value, _, unpadded),) = plan._io[0]
        assert unpadded and value.storage.padded == (features, batch) and staging.shape == (batch, features)
        np.testing.assert_array_equal(got, host)
        assert_close(got, forward(x))
        assert_close(model.predict(-x, verbose=0), forward(-x))  # the next call is not served the last's
        monkeypatch.setenv("MALINN_DEVICE_PADDING", "0")


def test_a_shorter_pass_zeroes_the_samples_past_it_in_the_padded_buffer(padding_gpu, rng, monkeypatch):
    """A pass of 300 samples in a 320-sample plan, after a full pass of other data: the answers are
    numpy's, and the padded buffer the kernels read holds the 300 samples, then zeros (never the
    earlier call's samples); then a full pass again."""
    monkeypatch.setenv("MALINN_DEVICE_PADDING", "1")
    device = padding_gpu
    model = Sequential([Dense(5)])  # one layer: the padded buffer is still the copy's when the pass ends
    model.build((None, 13))
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in model.get_weights()])
    kernel, bias = model.get_weights()
    plan = model.plan(300, device)
    assert plan.batch == 320 and len(plan.input_copies) == 1
    padded = plan.input_copies[0].out.storage
    assert [len(held) for _, held in plan._arena() if padded in held] == [1]  # its buffer is its own
    full = 100 + rng.standard_normal((320, 13)).astype(np.float32)
    assert_close(model.predict(full, verbose=0), full.astype(np.float64) @ kernel + bias)
    short = rng.standard_normal((300, 13)).astype(np.float32)
    assert_close(model.predict(short, verbose=0), short.astype(np.float64) @ kernel + bias)
    rows, cols = padded.padded_size
    assert (rows, cols) != (13, 320)
    held = np.empty((cols, rows), np.float32)  # C: a column (one sample's features) after another
    with device.lock:
        device.download(padded.buffer, held, blocking=True, what="the padded input")
    np.testing.assert_array_equal(held[:300, :13], short)
    assert not held[300:].any() and not held[:, 13:].any()
    assert_close(model.predict(-full, verbose=0), -full.astype(np.float64) @ kernel + bias)


def test_a_one_by_one_convolution_reads_its_input_padded_on_the_device(padding_gpu, rng, monkeypatch):
    """Conv2D(8, 1) on 9x9x13 images: the GPU's matmul reads the pixels' 13 channels padded; forced,
    the input is copied on the device; results equal the host's padding and numpy's."""
    device = padding_gpu
    model = Sequential([Conv2D(8, 1, activation="relu")])
    model.build((None, 9, 9, 13))
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.3 for w in model.get_weights()])
    kernel, bias = model.get_weights()
    x = rng.standard_normal((7, 9, 9, 13)).astype(np.float32)
    want = np.maximum(x.astype(np.float64) @ kernel[0, 0] + bias, 0)
    assert padded_input(model.plan(7, device)) and not model.plan(7, device).input_copies
    host = model.predict(x, verbose=0)
    monkeypatch.setenv("MALINN_DEVICE_PADDING", "1")
    replan(model)
    assert len(model.plan(7, device).input_copies) == 1
    got = model.predict(x, verbose=0)
    np.testing.assert_array_equal(got, host)
    assert_close(got, want)
    assert_close(model.predict(x[:3], verbose=0), want[:3])


def test_a_small_convolutions_unpadded_input_is_left_alone(device, rng, monkeypatch):
    """A 3x3 convolution reads its input as it is (no padding): forced, no copy is added."""
    monkeypatch.setenv("MALINN_DEVICE_PADDING", "1")
    model = Sequential([Conv2D(5, 3, activation="relu")])
    model.build((None, 6, 6, 3))
    plan = model.plan(4, device)
    assert not plan.input_copies and not padded_input(plan)


def test_the_unpadded_inputs_buffer_is_free_for_later_tensors_after_the_copy(padding_gpu, rng, monkeypatch):
    """The arena gives the unpadded input a buffer of exactly its size, which a later tensor that
    fits takes once the copy ran (Full MNIST's first layers at 1024 samples); results stay numpy's."""
    monkeypatch.setenv("MALINN_DEVICE_PADDING", "1")
    device = padding_gpu
    model, forward = network(784, rng, units=(250, 10))
    plan = model.plan(1024, device)
    source = plan.inputs[0].storage
    ((size, held),) = [(size, held) for size, held in plan._arena() if source in held]
    assert size == 4 * 784 * 1024 and held[0] is source and len(held) > 1
    assert all(storage.first > 0 for storage in held[1:])  # after the copy (step 0)
    x = rng.standard_normal((1024, 784)).astype(np.float32)
    assert_close(model.predict(x, verbose=0), forward(x))
    assert_close(model.predict(x[::-1].copy(), verbose=0), forward(x[::-1]))


class Held:
    """A storage as the arena sees it."""

    def __init__(self, elements: int, first: int, last: int):
        self.size, self.first, self.last, self.base = elements, first, last, None

    def elements(self) -> int:
        return self.size


class Input:
    def __init__(self, storage: Held):
        self.storage = storage


def test_the_arena_reuses_a_released_inputs_buffer_and_never_grows_it():
    source, copied, small, large = Held(100, -1, 0), Held(128, 0, 1), Held(60, 1, 2), Held(500, 2, 3)
    buffers = arena([Input(source)], [source, copied, small, large], frozenset({id(source)}))
    assert (400, [source, small]) in buffers  # taken by a tensor that fits, at its size
    assert all(source not in held or size == 400 for size, held in buffers)
    kept = arena([Input(source)], [source, copied, small, large])
    assert (400, [source]) in kept  # not released: the input's alone


def test_a_discrete_gpu_pads_a_large_input_itself_and_a_page_locked_one_goes_by_one_copy(
    padding_discrete, rng, monkeypatch
):
    """On a discrete GPU (by default) an input of 1 MiB or more is padded on the device, a smaller
    one on the host; ``MALINN_DEVICE_PADDING=0`` keeps the host's padding. A whole pass from
    ``malinn.empty_pinned`` memory is then one upload, its staging untouched, with a plain array's
    results; a shorter pass of it goes through the staging."""
    device = padding_discrete
    assert device.pads_on_device(opencl.DIRECT_MIN_BYTES) and not device.pads_on_device(opencl.DIRECT_MIN_BYTES - 4)
    model, forward = network(784, rng)
    assert not model.plan(320, device).input_copies  # 784 x 320 floats: below 1 MiB
    monkeypatch.setenv("MALINN_DEVICE_PADDING", "0")
    assert not model.plan(1024, device).input_copies
    monkeypatch.delenv("MALINN_DEVICE_PADDING")
    replan(model)
    plan = model.plan(1024, device)
    ((_, staging, _, direct, unpadded),) = plan._io[0]
    assert len(plan.input_copies) == 1 and unpadded and direct and plan._rings[0][0] is None
    plain = rng.standard_normal((1024, 784)).astype(np.float32)
    pinned = malinn.empty_pinned(plain.shape, device=device)
    pinned[...] = plain
    assert device.page_locked(pinned)
    want = model.predict(plain, verbose=0)
    assert_close(want, forward(plain))
    staging[...] = 7.0
    before = dict(device.counters)
    got = model.predict(pinned, verbose=0)
    assert device.counters["uploads"] - before["uploads"] == 1 and (staging == 7.0).all()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(model.predict(pinned[:1000], verbose=0), want[:1000])
    assert not staging[1000:].any()  # the shorter pass's samples past it, zeros


def test_through_a_staging_ring_the_unpadded_input_moves_in_chunks(padding_gpu, rng, monkeypatch):
    """``MALINN_STAGING=1`` with the path forced: the ring is laid out as the unpadded buffer;
    results equal the host's padding, full and shorter passes."""
    if padding_gpu.backend != "opencl":
        pytest.skip("staging rings are OpenCL's")
    device = padding_gpu
    model, forward = network(13, rng)
    x = rng.standard_normal((320, 13)).astype(np.float32)
    host = model.predict(x, verbose=0)
    monkeypatch.setenv("MALINN_DEVICE_PADDING", "1")
    monkeypatch.setenv("MALINN_STAGING", "1")
    replan(model)
    plan = model.plan(320, device)
    (ring,) = plan._rings[0]
    assert len(plan.input_copies) == 1 and (ring.rows, ring.columns) == (13, 320)
    np.testing.assert_array_equal(model.predict(x, verbose=0), host)
    assert_close(model.predict(x[:300], verbose=0), forward(x[:300]))


OCLGRIND = shutil.which("oclgrind")
OCLGRIND_SCRIPT = r"""
import json, os
os.environ["MALINN_DEVICE_PADDING"] = "1"
import numpy as np, malinn
from malinn.layers import Dense
device = malinn.get_device()
type(device).kind = property(lambda self: "gpu")
rng = np.random.default_rng(0)
errors = {}
for features, units, batch, n in [(13, 5, 19, 19), (1, 1, 3, 3), (13, 13, 320, 300)]:
    model = malinn.Sequential([Dense(units, activation="relu")])
    model.build((None, features))
    plan = model.plan(batch, device)
    assert len(plan.input_copies) == 1 and len(plan.output_copies) == 1, plan.describe()
    w, b = model.get_weights()
    full = rng.standard_normal((batch, features)).astype(np.float32) + 50
    for which, x in (("full", full), ("then", rng.standard_normal((n, features)).astype(np.float32))):
        got = model.predict(x, verbose=0)
        errors[f"{features} {units} {batch} {which} {len(x)}"] = float(np.abs(got - np.maximum(x @ w + b, 0)).max())
print(json.dumps(errors))
"""


@pytest.mark.skipif(OCLGRIND is None, reason="oclgrind is not on PATH (bash .ci/setup --test installs it)")
def test_an_input_padded_and_an_output_unpadded_on_the_device_are_clean_under_oclgrind():
    """Out-of-bounds accesses (the output's copy reads a larger buffer than it writes), uninitialised
    values (the padding read is zeros the input's copy wrote), data races and API misuse: full passes
    and a shorter one after a full one, the input padded and the output unpadded in one plan."""
    errors = run_under_oclgrind(OCLGRIND, OCLGRIND_SCRIPT)
    assert len(errors) == 6 and all(error < 1e-3 for error in errors.values()), errors
