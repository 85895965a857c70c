"""Resizing (nearest, bilinear, bicubic, area), UpSampling2D by those interpolations and
GroupNormalization vs numpy definitions on every device, over odd shapes (one pixel, one channel,
sizes that shrink and grow unevenly), batch 1 and 3."""

import numpy as np
import pytest
from resize_references import area_reference, bicubic_reference
from upsampling_references import group_norm_reference, resize_reference

import malinn
from malinn.layers import GroupNormalization, Resizing, UpSampling2D

pytestmark = pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)


@pytest.mark.parametrize("interpolation", ["bilinear", "nearest"])
@pytest.mark.parametrize(
    "shape,size",
    [((1, 1, 1), (3, 2)), ((7, 5, 3), (3, 4)), ((3, 2, 13), (7, 5)), ((4, 4, 2), (4, 4)), ((5, 7, 1), (1, 13))],
)
def test_resizing_matches_tf_image_resize(device, rng, interpolation, shape, size):
    model = malinn.Sequential([Resizing(*size, interpolation=interpolation)])
    model.build((None,) + shape)
    for batch in (1, 3):
        x = rng.standard_normal((batch,) + shape).astype(np.float32)
        want = resize_reference(x, *size, interpolation)
        got = model.predict(x)
        assert got.shape == want.shape == (batch,) + size + shape[-1:]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("interpolation", ["bicubic", "area"])
@pytest.mark.parametrize(
    "shape,size",
    [((1, 1, 1), (3, 2)), ((7, 5, 3), (3, 4)), ((3, 2, 13), (7, 5)), ((4, 4, 2), (4, 4)), ((13, 11, 1), (1, 3))],
)
def test_bicubic_and_area_resizing_match_tf_image_resize(device, rng, interpolation, shape, size):
    """TensorFlow's bicubic (Keys' a = -0.5, its 1/1024 coefficient table, the taps outside the
    image left out and the rest reweighted) and area resizes, shrinking and growing unevenly."""
    reference = bicubic_reference if interpolation == "bicubic" else area_reference
    model = malinn.Sequential([Resizing(*size, interpolation=interpolation)])
    model.build((None,) + shape)
    for batch in (1, 3):
        x = rng.standard_normal((batch,) + shape).astype(np.float32)
        want = reference(x, *size)
        got = model.predict(x)
        assert got.shape == want.shape == (batch,) + size + shape[-1:]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, np.abs(want).max()))


def test_a_bicubic_resize_keeps_a_constant_image_and_reads_nothing_outside(device):
    """The four taps' weights sum to 1 at the edges too: a constant image stays constant, and a
    1001-pixel-wide image shrunk to 13 pixels."""
    for shape, size in (((5, 1001, 1), (2, 13)), ((1, 1, 3), (4, 5))):
        model = malinn.Sequential([Resizing(*size, interpolation="bicubic")])
        model.build((None,) + shape)
        np.testing.assert_allclose(model.predict(np.full((1,) + shape, 2.5, np.float32)), 2.5, rtol=1e-6)


@pytest.mark.parametrize("interpolation", ["bicubic", "area"])
def test_upsampling_by_bicubic_and_area_is_a_resize_to_the_multiple(device, rng, interpolation):
    reference = bicubic_reference if interpolation == "bicubic" else area_reference
    model = malinn.Sequential([UpSampling2D((2, 3), interpolation=interpolation)])
    model.build((None, 5, 3, 4))
    x = rng.standard_normal((3, 5, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(model.predict(x), reference(x, 10, 9), rtol=0, atol=1e-5 * 4)


def test_bilinear_upsampling_is_a_resize_to_the_multiple(device, rng):
    model = malinn.Sequential([UpSampling2D((2, 3), interpolation="bilinear")])
    model.build((None, 5, 3, 4))
    x = rng.standard_normal((3, 5, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(model.predict(x), resize_reference(x, 10, 9, "bilinear"), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "shape,groups,center,scale",
    [
        ((5, 4, 6), 3, True, True),
        ((7, 4), 1, False, True),
        ((2, 3, 4), 4, True, False),
        ((1, 1, 13), 13, False, False),
        ((3, 13), 13, True, True),
    ],
)
def test_group_normalization_matches_the_definition(device, rng, shape, groups, center, scale):
    layer = GroupNormalization(groups, epsilon=1e-3, center=center, scale=scale)
    model = malinn.Sequential([layer])
    model.build((None,) + shape)
    layer.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in layer.get_weights()])
    for batch in (1, 3):
        x = rng.standard_normal((batch,) + shape).astype(np.float32) * 3 + 1
        want = group_norm_reference(x, groups, 1e-3, layer.gamma, layer.beta)
        np.testing.assert_allclose(model.predict(x), want, rtol=0, atol=1e-5 * max(1.0, np.abs(want).max()))


def test_what_is_not_computed_is_refused_by_name():
    with pytest.raises(ValueError, match="crop_to_aspect_ratio"):
        Resizing(3, 3, crop_to_aspect_ratio=True)
    for interpolation in ("lanczos3", "lanczos5", "gaussian", "mitchellcubic"):
        with pytest.raises(ValueError, match=f"interpolation '{interpolation}' .* is not computed"):
            Resizing(3, 3, interpolation=interpolation)
        with pytest.raises(ValueError, match=f"interpolation '{interpolation}' .* is not computed"):
            UpSampling2D(2, interpolation=interpolation)
    with pytest.raises(ValueError, match="multiple of groups=4"):
        malinn.Sequential([GroupNormalization(4)]).build((None, 3, 6))
