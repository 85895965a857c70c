"""How a plan's outputs reach the caller: an output whose features are not padded is read straight
into the array returned (one host pass over it) where the device says a staging array would not pay
(``Device.stages_output``), else through the staging array and a copy out. Both give bit-identical
results, a pass shorter than its plan reads only its own samples, and a result is a new array that
no later call writes into."""

import numpy as np
import pytest
from support import assert_close, small_conv_model
from support import model_forward as numpy_forward

from malinn import Sequential
from malinn.layers import Dense


def dense_model(seed=0):
    rng = np.random.default_rng(seed)
    model = Sequential([Dense(23, activation="relu", name="d0"), Dense(10, name="d1")])
    model.build((None, 40))
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.3 for w in model.get_weights()])
    return model


def predictions(model, x, device, monkeypatch, stages: bool) -> list:
    """Predicts of ``x`` whole, of its first 21 samples and in passes of 64 (a shorter last one) on
    plans made where the device answers ``stages`` for every output; and whether its output was
    read straight into the result."""
    monkeypatch.setattr(type(device), "stages_output", lambda self, nbytes: stages)
    model._plans.clear()  # a plan decides at allocation: make new ones
    model._recent = {}
    got = [model.predict(x, verbose=0), model.predict(x[:21], verbose=0), model.predict(x, batch_size=64, verbose=0)]
    ((output,),) = [model.plan(x.shape[0], device)._io[1]]
    return got, output.direct


@pytest.mark.parametrize("kind", ["dense", "conv"])
def test_an_output_read_straight_into_the_result_equals_one_cut_from_the_staging(device, rng, monkeypatch, kind):
    model = dense_model() if kind == "dense" else small_conv_model()
    shape = (100, 40) if kind == "dense" else (100, 6, 6, 3)
    x = rng.standard_normal(shape).astype(np.float32)
    staged, staged_direct = predictions(model, x, device, monkeypatch, True)
    direct, is_direct = predictions(model, x, device, monkeypatch, False)
    assert not staged_direct
    value = model.plan(100, device).outputs[0]
    assert is_direct == (value.storage.padded_size[0] == value.rows)
    if device.backend == "opencl" and device.kind == "cpu" and kind == "dense":  # PoCL: ten unpadded features
        assert is_direct
    for a, b in zip(staged, direct):
        np.testing.assert_array_equal(b, a)
    if kind == "dense":
        assert_close(direct[0], numpy_forward(model, x))
        assert_close(direct[1], numpy_forward(model, x[:21]))
        assert_close(direct[2], numpy_forward(model, x))
    assert direct[1].shape == (21,) + direct[0].shape[1:]


def test_a_result_is_never_written_by_a_later_call(device, rng, monkeypatch):
    """The arrays a predict returns are its own: two calls on one plan, then a shorter one, leave the
    first results as they were (a direct read lands in a new array each call)."""
    monkeypatch.setattr(type(device), "stages_output", lambda self, nbytes: False)
    model = dense_model(1)
    x = rng.standard_normal((64, 40)).astype(np.float32)
    first = model.predict(x, verbose=0)
    kept = first.copy()
    second = model.predict(-x, verbose=0)
    third = model.predict(x[:5] * 2, verbose=0)
    assert not np.shares_memory(first, second) and not np.shares_memory(first, third)
    np.testing.assert_array_equal(first, kept)
    assert_close(first, numpy_forward(model, x))
    assert_close(second, numpy_forward(model, -x))
    assert_close(third, numpy_forward(model, x[:5] * 2))


def test_a_discrete_gpu_reads_outputs_into_page_locked_staging(device, monkeypatch):
    """OpenCL: a staged read (page-locked memory, then a copy out) from PINNED_MIN_BYTES on a discrete
    GPU; a straight read below it, with MALINN_PINNED=0, and where the device shares the host's memory."""
    if device.backend != "opencl":
        pytest.skip("page-locked staging is OpenCL's")
    from malinn.backends.opencl_memory import PINNED_MIN_BYTES

    assert not device.stages_output(PINNED_MIN_BYTES) or not device.host_unified_memory
    monkeypatch.setattr(device, "host_unified_memory", False)
    assert device.stages_output(PINNED_MIN_BYTES) and device.stages_output(64 * 2**20)
    assert not device.stages_output(PINNED_MIN_BYTES - 4)
    monkeypatch.setenv("MALINN_PINNED", "0")
    assert not device.stages_output(PINNED_MIN_BYTES)
    monkeypatch.setattr(device, "host_unified_memory", True)
    monkeypatch.delenv("MALINN_PINNED")
    assert not device.stages_output(64 * 2**20)
