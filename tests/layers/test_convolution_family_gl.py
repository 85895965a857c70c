"""The convolution family's GLSL twins (kernels/gl/conv_transpose.comp, conv3d.comp,
conv3d_transpose.comp, pool3d.comp, resize.comp) bound their loops: where the GL driver would end a
shader invocation's loops early (llvmpipe after 65535 iterations in all, silently), the plan refuses
the layer by name, with the count and the limit, instead of answering wrongly; within the limit the
same layers run and equal numpy. Their arithmetic on GL is checked by the layers' own tests, which
take the ``device`` fixture (PoCL and Mesa's llvmpipe)."""

from __future__ import annotations

import numpy as np
import pytest
from upsampling_references import conv_transpose_reference
from volumetric_reference import pool3d_reference

import malinn
from malinn.errors import DeviceError
from malinn.layers import AveragePooling3D, Conv2DTranspose, Conv3D, Conv3DTranspose, Resizing

pytest.importorskip("moderngl", reason="the OpenGL backend's extra is not installed (pip install malinn[gl])")

GL = [d for d in malinn.devices() if d.backend == "gl"]
needs_gl = pytest.mark.skipif(not GL, reason="no working OpenGL device (EGL with OpenGL 4.3 or ES 3.1)")

#: (layer, input shape, loop iterations of one invocation): each over a limit of 1000, counted as
#: the entries' loop_iterations count them (the window's loops and, inside, the channels')
TOO_LONG = [
    (lambda: Conv2DTranspose(2, 3, name="wide_transpose"), (4, 4, 120), "1,092"),  # 3 * (1 + 3 * 121)
    (lambda: Conv3D(2, 3, name="wide_conv3d"), (3, 3, 3, 40), "1,119"),  # 3 * (1 + 3 * (1 + 3 * 41))
    (lambda: Conv3DTranspose(2, 3, name="wide_conv3dt"), (2, 2, 2, 40), "1,119"),
    (lambda: AveragePooling3D(11, name="wide_pool3d"), (11, 11, 11, 1), "1,463"),  # 11 * (1 + 11 * 12)
    (lambda: Resizing(2, 2, "area", name="wide_area"), (64, 64, 1), "1,190"),  # (64/2 + 2) * (64/2 + 3)
]


@needs_gl
@pytest.mark.parametrize("make, shape, count", TOO_LONG, ids=[c[0]().name for c in TOO_LONG])
def test_a_layer_whose_loops_the_driver_would_end_is_refused_by_name(monkeypatch, make, shape, count):
    device = GL[0]
    monkeypatch.setattr(device, "max_loop_iterations", 1000)
    layer = make()
    model = malinn.Sequential([layer])
    model.build((None,) + shape)
    with pytest.raises(DeviceError) as info:
        model.plan(1, device)
    text = str(info.value)
    assert f"layer '{layer.name}'" in text and f"{count} loop iterations" in text and "after 1,000" in text, text


@needs_gl
def test_the_same_layers_within_the_limit_run_and_equal_numpy(monkeypatch, rng):
    """A transposed convolution over 100 channels (912 iterations) and a 9-voxel-wide average
    pooling (819) run under the limit of 1000, and answer as numpy does."""
    device = GL[0]
    monkeypatch.setattr(device, "max_loop_iterations", 1000)
    previous = malinn.get_device()
    malinn.set_device(device)
    try:
        layer = Conv2DTranspose(2, 3, strides=2, padding="same")
        model = malinn.Sequential([layer])
        model.build((None, 3, 4, 100))
        layer.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in layer.get_weights()])
        x = rng.standard_normal((2, 3, 4, 100)).astype(np.float32)
        want = conv_transpose_reference(x, layer.kernel, layer.bias, (2, 2), (1, 1), "same", None)
        np.testing.assert_allclose(model.predict(x), want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))

        pool = malinn.Sequential([AveragePooling3D(9, strides=2, padding="same")])
        pool.build((None, 9, 9, 9, 3))
        v = rng.standard_normal((2, 9, 9, 9, 3)).astype(np.float32)
        want = pool3d_reference(v, (9, 9, 9), (2, 2, 2), "same", "avg")
        np.testing.assert_allclose(pool.predict(v), want, rtol=1e-5, atol=1e-5)
    finally:
        malinn.set_device(previous)
