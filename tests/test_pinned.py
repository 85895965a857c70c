"""Page-locked inputs (``malinn.empty_pinned``, malinn/backends/pinned.py): zeroed float32 memory of
the shape asked; on a discrete GPU in the device's page-locked memory, which a full pass uploads by
one DMA (no ring, no staging copy) with results equal to a plain array's; plain memory elsewhere.

PoCL shares the host's memory; posing as a discrete GPU (``host_unified_memory`` False) its
page-locked host arrays are CL_MEM_ALLOC_HOST_PTR buffers mapped once, as on NVIDIA's driver."""

import gc

import numpy as np
import pytest
from support import assert_close, dense_forward

import malinn
from malinn import Sequential
from malinn.backends import opencl_memory
from malinn.backends.opencl_memory import STAGED_MIN_BYTES
from malinn.layers import Dense


@pytest.fixture
def discrete(device, monkeypatch):
    if device.backend != "opencl":
        pytest.skip("page-locked memory is OpenCL's (the OpenGL backends copy through their own buffers)")
    monkeypatch.delenv("MALINN_STAGING", raising=False)
    monkeypatch.delenv("MALINN_PINNED", raising=False)
    monkeypatch.setattr(device, "host_unified_memory", False)
    return device


def test_empty_pinned_is_zeroed_float32_of_the_shape_asked(device):
    for shape, want in ((5, (5,)), ((3, 4), (3, 4)), ((70_000, 2), (70_000, 2)), ((0, 7), (0, 7))):
        array = malinn.empty_pinned(shape, device=device)
        assert array.shape == want and array.dtype == np.float32 and array.flags.c_contiguous
        assert not array.any()
        array[...] = 1.5
        assert float(array.sum()) == 1.5 * array.size


def test_empty_pinned_refuses_other_dtypes_and_negative_sizes(device):
    with pytest.raises(ValueError, match="float64 is not float32"):
        malinn.empty_pinned((3, 4), dtype=np.float64, device=device)
    with pytest.raises(ValueError, match="negative size"):
        malinn.empty_pinned((3, -1), device=device)


def test_page_locked_memory_is_known_by_address_while_an_array_on_it_lives(discrete):
    array = malinn.empty_pinned((300, 1024), device=discrete)
    assert discrete.page_locked(array) and discrete.page_locked(array[10:20]) and discrete.page_locked(array[5])
    assert not discrete.page_locked(np.zeros((300, 1024), np.float32))
    assert not discrete.page_locked(array.copy())
    start = array.__array_interface__["data"][0]
    view = array[100:]
    del array
    gc.collect()
    assert discrete.page_locked(view)  # the view keeps the mapping
    del view
    gc.collect()
    assert start not in opencl_memory._PAGE_LOCKED.get(discrete.platform, {})


def test_a_full_pass_from_page_locked_memory_is_one_copy_with_the_same_results(discrete):
    rng = np.random.default_rng(11)
    model = Sequential([Dense(19, activation="relu"), Dense(7)])
    model.build((None, 1024))
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.05 for w in model.get_weights()])
    w = model.get_weights()
    samples = STAGED_MIN_BYTES // (4 * 1024)  # a plain array of it moves through the staging ring
    plain = rng.standard_normal((samples, 1024)).astype(np.float32)
    pinned = malinn.empty_pinned(plain.shape, device=discrete)
    pinned[...] = plain
    want = model.predict(plain, verbose=0)
    plan = model.plan(samples, discrete)
    ((_, _, _, _, unpadded),) = plan._io[0]
    assert unpadded and plan._rings[0][0] is not None
    before = dict(discrete.counters)
    got = model.predict(pinned, verbose=0)
    assert discrete.counters.get("staged", 0) == before.get("staged", 0)  # no ring: one copy
    assert discrete.counters["uploads"] - before["uploads"] == 1
    np.testing.assert_array_equal(got, want)
    assert_close(got, dense_forward(plain, [(w[0], w[1], "relu"), (w[2], w[3], "linear")]))
    # a shorter pass of the same memory (not the plan's whole batch) takes the ring's way
    np.testing.assert_array_equal(model.predict(pinned[:1000], verbose=0), want[:1000])


def test_on_a_device_sharing_the_hosts_memory_it_is_plain_memory(device):
    if device.backend != "opencl" or not device.host_unified_memory:
        pytest.skip("a device that shares the host's memory")
    array = malinn.empty_pinned((300, 1024), device=device)
    assert not device.page_locked(array)


def test_another_device_of_the_platform_uploads_page_locked_memory_as_its_own(discrete, monkeypatch):
    """Memory pinned through one device's context is page-locked for every device of its platform
    (a twin: a second device object on the same OpenCL device, a context of its own, as the second
    of two identical GPUs): a full pass of it is one upload there too, no staging ring, the results
    the model's; a device of another platform does not take it as page-locked."""
    import pyopencl as cl

    from malinn.backends import opencl as opencl_backend
    from malinn.backends import selection

    twin = opencl_backend.probe(cl, discrete.cl_device.platform, discrete.cl_device, (discrete.index[0], 99))
    assert twin.context != discrete.context and twin.platform == discrete.platform
    monkeypatch.setattr(selection, "_devices", [*malinn.devices(), twin])  # listed among the working devices
    monkeypatch.setattr(twin, "host_unified_memory", False)
    rng = np.random.default_rng(12)
    model = Sequential([Dense(13, activation="relu"), Dense(3)])
    model.build((None, 1024))
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.05 for w in model.get_weights()])
    w = model.get_weights()
    samples = STAGED_MIN_BYTES // (4 * 1024)
    plain = rng.standard_normal((samples, 1024)).astype(np.float32)
    pinned = malinn.empty_pinned(plain.shape, device=discrete)  # pinned through the first device's context
    pinned[...] = plain
    assert twin.page_locked(pinned) and twin.page_locked(pinned[:100])
    assert not twin.page_locked(plain)
    plan = model.plan(samples, twin)
    assert plan._rings[0][0] is not None  # a pageable input of this size would go through the ring
    before = dict(twin.counters)
    got = model.predict(pinned, devices=twin, verbose=0)
    assert twin.counters.get("staged", 0) == before.get("staged", 0)  # no ring: one copy
    assert twin.counters["uploads"] - before["uploads"] == 1
    assert_close(got, dense_forward(plain, [(w[0], w[1], "relu"), (w[2], w[3], "linear")]))
    monkeypatch.setattr(twin, "platform", twin.platform + " (another)")
    assert not twin.page_locked(pinned)
