"""The layers that grow or renormalize images, converted from Keras 3 and tf_keras files (.keras and
.h5), equal to Keras's own predict within 1e-5 x max(1, |y|): the models of
tests/layers/upsampling_zoo.py, built in a process of its own once per test run."""

from pathlib import Path

import numpy as np
import pytest
from conftest import built_zoo
from upsampling_zoo import BATCHES, GENERATIONS, MODELS, SUFFIXES

import malinn

ZOO = Path(__file__).with_name("upsampling_zoo.py")


@pytest.fixture(scope="session")
def upsampling_zoo(tmp_path_factory) -> Path:
    """The zoo's folder, built once per test run (every xdist worker reads the one built)."""
    return built_zoo(tmp_path_factory, ZOO)


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("key", list(MODELS))
def test_converted_model_equals_keras(device, upsampling_zoo, key, generation, suffix):
    model = malinn.load_model(str(upsampling_zoo / generation / f"{key}{suffix}"))
    data = np.load(upsampling_zoo / generation / f"{key}.npz")
    for batch in BATCHES:
        want = data[f"y{batch}"]
        got = model.predict(data[f"x{batch}"])
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())))
