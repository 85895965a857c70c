"""A device's staging arrays (``Device.host_array``): a shape given as an int or a tuple, zeroed
float32 memory of that shape on every device (page-locked on a discrete GPU from
``PINNED_MIN_BYTES``, plain memory elsewhere)."""

import numpy as np
import pytest


@pytest.mark.parametrize("shape", [5, (3, 4), 70_000, (70_000, 2)])  # 70 000 floats: page-locked on a GPU
def test_host_array_takes_a_shape_as_an_int_or_a_tuple(device, shape):
    array = device.host_array(shape)
    assert array.shape == ((shape,) if isinstance(shape, int) else shape)
    assert array.dtype == np.float32
    assert not array.any()
    array[...] = np.arange(array.size, dtype=np.float32).reshape(array.shape)
    np.testing.assert_array_equal(array.reshape(-1), np.arange(array.size, dtype=np.float32))
