"""predict over a device listed twice: two replicas of the plan, each passing its data on a queue
of its own where the device's copies run beside its kernels (a discrete GPU's), results in order
and equal to one pass's."""

import numpy as np
import pytest
from support import assert_close, dense_forward

from malinn import Sequential
from malinn.layers import Dense


def model_and_reference(features: int):
    rng = np.random.default_rng(1)
    model = Sequential([Dense(19, activation="relu"), Dense(7, activation="softmax")])
    model.build((None, features))
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.2 for w in model.get_weights()])
    w = model.get_weights()
    return model, lambda x: dense_forward(x, [(w[0], w[1], "relu"), (w[2], w[3], "softmax")])


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("n", [1, 13, 1001, 4096])
def test_replicas_on_queues_of_their_own_give_the_results_in_order(device, monkeypatch, overlap, n):
    monkeypatch.setattr(device, "overlap_queues", overlap)
    model, reference = model_and_reference(37)
    x = np.random.default_rng(n).standard_normal((n, 37)).astype(np.float32)
    batch = max(1, -(-n // 4))
    before = device.counters["downloads"]
    y = model.predict(x, batch_size=batch, devices=[device, device], verbose=0)
    assert y.shape == (n, 7)
    assert_close(y, reference(x))
    assert device.counters["downloads"] - before == -(-n // batch)  # one download per pass
    queue, lock = device.stream(1)
    if overlap and device.backend == "opencl":
        assert queue is not device.queue and lock is not device.lock  # a queue of its own
    else:
        assert lock is device.lock  # one queue: the passes run one after another
    assert_close(
        model.predict(x[::-1].copy(), batch_size=batch, devices=[device, device], verbose=0), reference(x[::-1])
    )


def test_replica_zero_runs_on_the_device_queue(device):
    queue, lock = device.stream(0)
    assert lock is device.lock
    assert queue is (device.queue if device.backend == "opencl" else None)
