"""A predict without ``batch_size`` on a device whose memory is the host's (PoCL, Mali, Adreno)
bounds each pass's activations (``SHARED_PASS_BYTES``), not only its input: a chunk of small
images through a convolution holds many times its own bytes in activations, which on a board are
its RAM. Other devices keep their one pass. Either way the outputs are the model's."""

import numpy as np
import pytest
from support import conv2d_reference

import malinn.model.batches as batches
from malinn import Sequential
from malinn.layers import Conv2D


def conv_model():
    model = Sequential([Conv2D(16, 3, padding="same", activation="relu")])
    model.build((None, 28, 28, 1))
    rng = np.random.default_rng(4)
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.3 for w in model.get_weights()])
    return model


def reference(model, x):
    kernel, bias = model.get_weights()
    return np.maximum(conv2d_reference(x, kernel, bias, padding="same"), 0)


@pytest.mark.parametrize("n", [1, 13, 300])
def test_a_default_pass_holds_at_most_the_shared_activation_budget(device, monkeypatch, n):
    model = conv_model()
    per_sample = model._arena_bytes_per_sample()
    assert per_sample == 4 * 4 * 28 * 28 * 16  # four tensors of the largest layer's 28 x 28 x 16 floats
    monkeypatch.setattr(batches, "SHARED_PASS_BYTES", 64 * per_sample)  # passes of 64 samples
    x = np.random.default_rng(n).uniform(-1, 1, (n, 28, 28, 1)).astype(np.float32)
    before = device.counters["downloads"]
    y = model.predict(x, verbose=0)
    passes = device.counters["downloads"] - before
    np.testing.assert_allclose(y, reference(model, x), rtol=1e-4, atol=1e-4)
    if device.host_unified_memory:
        assert passes == -(-n // 64)  # 1, 1 and 5 passes
    else:
        assert passes == 1  # a discrete GPU's memory is its own: one pass up to ARRAY_PASS_BYTES
    # a given batch_size is the caller's: no bound on it
    before = device.counters["downloads"]
    np.testing.assert_array_equal(model.predict(x, batch_size=n, verbose=0), y)
    assert device.counters["downloads"] - before == 1


def test_the_bound_is_in_whole_buckets_and_at_least_one_sample():
    x = np.zeros((5000, 28, 28, 1), np.float32)
    per_sample = 4 * 4 * 28 * 28 * 16
    assert batches.default_step([x], 5000, 1) == 5000  # no device sharing the host's memory: one pass
    step = batches.default_step([x], 5000, 1, per_sample)
    assert step == batches.SHARED_PASS_BYTES // per_sample // 64 * 64  # 1,280: a bucket (a multiple of 64)
    assert step * per_sample <= batches.SHARED_PASS_BYTES
    assert batches.default_step([x], 5000, 1, batches.SHARED_PASS_BYTES * 2) == 1  # one sample beyond it: one a pass
