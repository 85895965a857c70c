"""Large inputs and outputs through a ring of page-locked slots (``Device.staging_ring``,
malinn/backends/opencl_staging.py): in chunks, the host's copies overlapping the device's; results
bit-identical to one whole copy's, whatever the chunk, the samples or the threads; a failure
mid-pipeline leaves no slot in use and the model working.

PoCL shares the host's memory, where no ring is made by default: ``MALINN_STAGING=1`` gives every
input and output one (plain memory for slots there), so the path runs here as on a discrete GPU.
"""

import threading

import numpy as np
import pytest
from support import assert_close, dense_forward, small_conv_model

from malinn import DeviceError, Sequential
from malinn.backends import opencl_staging
from malinn.layers import Dense


@pytest.fixture
def staged(device, monkeypatch):
    """The device with a ring for every plan input and output made from here (MALINN_STAGING=1)."""
    if device.backend != "opencl":
        pytest.skip("staging rings are OpenCL's (the OpenGL backends copy through their own buffers)")
    monkeypatch.setenv("MALINN_STAGING", "1")
    return device


def dense_model(features: int = 37):
    rng = np.random.default_rng(3)
    model = Sequential([Dense(19, activation="relu"), Dense(7, activation="softmax")])
    model.build((None, features))
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.2 for w in model.get_weights()])
    w = model.get_weights()
    return model, lambda x: dense_forward(x, [(w[0], w[1], "relu"), (w[2], w[3], "softmax")])


def replan(model):
    """Forgets the model's plans (and its last call's), so that the next predict makes new ones
    (a plan decides its rings when it is allocated)."""
    model._plans.clear()
    model._recent = {}


def unstaged(model, x, monkeypatch):
    """``model.predict(x)`` with one whole copy each way (MALINN_STAGING=0), on plans made for it."""
    monkeypatch.setenv("MALINN_STAGING", "0")
    replan(model)
    y = model.predict(x, verbose=0)
    monkeypatch.setenv("MALINN_STAGING", "1")
    replan(model)  # the next predict makes plans with rings
    return y


def rings(model, n, device):
    plan = model.plan(n, device)
    return plan._rings


# a chunk of one sample (one column) up to 1001 samples: 70 000 chunks would take seconds
SIZES = [(n, chunk) for n in (1, 3, 13, 1001, 70_000) for chunk in ("one column", "uneven", "default")]


@pytest.mark.parametrize("n,chunk", [(n, chunk) for n, chunk in SIZES if n <= 1001 or chunk != "one column"])
def test_chunked_transfers_equal_one_whole_copy(staged, monkeypatch, n, chunk):
    model, reference = dense_model()
    x = np.random.default_rng(n).standard_normal((n, 37)).astype(np.float32)
    want = unstaged(model, x, monkeypatch)
    monkeypatch.setattr(staged, "staging_chunk_bytes", {"one column": 1, "uneven": 4 * 40 * 7, "default": 2**21}[chunk])
    monkeypatch.setattr(staged, "staging_threads", 3)
    before = staged.counters.get("staged", 0)
    got = model.predict(x, verbose=0)
    assert staged.counters.get("staged", 0) - before == 2  # the input and the output, each through its ring
    np.testing.assert_array_equal(got, want)
    assert_close(got, reference(x))
    ins, outs = rings(model, n, staged)
    assert ins[0] is not None and outs[0] is not None and ins[0].in_use() == 0 and outs[0].in_use() == 0
    if chunk == "one column":
        assert ins[0].chunk == 1 and outs[0].chunk == 1
    # a shorter pass on the same plan: the samples past it are zeros again, never the last call's
    if n > 1:
        np.testing.assert_array_equal(model.predict(x[: n - 1], verbose=0), want[: n - 1])


def test_a_sample_of_several_columns_split_between_chunks(staged, monkeypatch):
    """Conv2D: a sample is 36 input columns of 3 floats (padded to the kernel's rows) and 16 output
    columns of 5; chunks of 7 columns cut samples in two."""
    model = small_conv_model()
    x = np.random.default_rng(5).standard_normal((23, 6, 6, 3)).astype(np.float32)
    want = unstaged(model, x, monkeypatch)
    monkeypatch.setattr(staged, "staging_chunk_bytes", 1)
    got_one = model.predict(x, verbose=0)
    ins, _ = rings(model, 23, staged)
    assert ins[0].chunk == 1
    monkeypatch.setattr(staged, "staging_chunk_bytes", 4 * ins[0].rows * 7)
    replan(model)
    got_seven = model.predict(x, verbose=0)
    assert rings(model, 23, staged)[0][0].chunk == 7
    np.testing.assert_array_equal(got_one, want)
    np.testing.assert_array_equal(got_seven, want)


def test_concurrent_predicts_on_one_model_each_get_their_own_results(staged, monkeypatch):
    model, reference = dense_model()
    monkeypatch.setattr(staged, "staging_chunk_bytes", 4 * 40 * 50)
    monkeypatch.setattr(staged, "staging_threads", 2)
    xs = [np.random.default_rng(10 + i).standard_normal((777, 37)).astype(np.float32) for i in range(4)]
    model.predict(xs[0], verbose=0)  # the plan made once, before the threads
    got: dict = {}
    errors: list = []

    def work(i: int) -> None:
        try:
            for _ in range(5):
                got[i] = model.predict(xs[i], verbose=0)
                assert_close(got[i], reference(xs[i]))
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(4):
        assert_close(got[i], reference(xs[i]))


@pytest.mark.parametrize("where", ["_fill", "_empty"])
def test_a_failure_mid_pipeline_leaves_no_slot_in_use_and_the_model_working(staged, monkeypatch, where):
    model, reference = dense_model()
    x = np.random.default_rng(7).standard_normal((1001, 37)).astype(np.float32)
    monkeypatch.setattr(staged, "staging_chunk_bytes", 4 * 7 * 100)  # 100 output columns, 18 input ones
    monkeypatch.setattr(staged, "staging_threads", 2)
    want = model.predict(x, verbose=0)
    real = getattr(opencl_staging.StagingRing, where)
    calls = [0]

    def failing(self, *args):
        calls[0] += 1
        if calls[0] == 3:  # the third chunk's host copy
            raise MemoryError("injected: the host copy failed")
        return real(self, *args)

    monkeypatch.setattr(opencl_staging.StagingRing, where, failing)
    with pytest.raises(DeviceError) as caught:
        model.predict(x, verbose=0)
    message = str(caught.value)
    way = "uploading" if where == "_fill" else "downloading"
    assert way in message and staged.name in message and "chunk" in message and "MemoryError" in message
    ins, outs = rings(model, 1001, staged)
    ring = ins[0] if where == "_fill" else outs[0]
    assert f"{ring.columns} x {ring.rows} floats" in message  # the buffer's sizes, padding included
    assert ins[0].in_use() == 0 and outs[0].in_use() == 0
    monkeypatch.setattr(opencl_staging.StagingRing, where, real)
    np.testing.assert_array_equal(model.predict(x, verbose=0), want)
    assert_close(model.predict(-x, verbose=0), reference(-x))


def test_a_ring_only_for_large_buffers_on_a_discrete_gpu(device, monkeypatch):
    """Unforced: a ring from STAGED_MIN_BYTES where host_array is page-locked; none below it, on a
    device that shares the host's memory, with MALINN_STAGING=0 or MALINN_PINNED=0. On PoCL posing as
    a discrete GPU (page-locked host arrays are CL_MEM_ALLOC_HOST_PTR buffers there too), a predict
    of an input of STAGED_MIN_BYTES through the default ring equals one without it."""
    if device.backend != "opencl":
        pytest.skip("staging rings are OpenCL's")
    from malinn.backends.opencl_memory import STAGED_MIN_BYTES

    monkeypatch.delenv("MALINN_STAGING", raising=False)
    columns = STAGED_MIN_BYTES // (4 * 1024)
    monkeypatch.setattr(device, "host_unified_memory", False)
    ring = device.staging_ring((columns, 1024), "test")
    assert ring is not None and ring.in_use() == 0 and len(ring.slots) >= 2
    assert device.staging_ring((columns - 1, 1024), "test") is None
    monkeypatch.setenv("MALINN_STAGING", "0")
    assert device.staging_ring((columns, 1024), "test") is None
    monkeypatch.setenv("MALINN_STAGING", "")
    monkeypatch.setenv("MALINN_PINNED", "0")
    assert device.staging_ring((columns, 1024), "test") is None
    monkeypatch.delenv("MALINN_PINNED")
    model, reference = dense_model(1024)
    x = np.random.default_rng(8).standard_normal((columns, 1024)).astype(np.float32)
    before = device.counters.get("staged", 0)
    got = model.predict(x, verbose=0)
    assert device.counters.get("staged", 0) - before == 1  # the input; the output (7 floats a sample) is small
    monkeypatch.setenv("MALINN_STAGING", "0")
    replan(model)
    np.testing.assert_array_equal(model.predict(x, verbose=0), got)
    assert_close(got, reference(x))
    monkeypatch.setattr(device, "host_unified_memory", True)
    monkeypatch.delenv("MALINN_STAGING", raising=False)
    assert device.staging_ring((columns, 1024), "test") is None  # shares the host's memory
    monkeypatch.undo()
