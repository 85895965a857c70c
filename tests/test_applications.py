"""Every keras.applications family, converted from Keras 3 and tf_keras files (``.keras`` and
``.h5``) and predicted on the current device, equal to Keras's own logits within
1e-5 x max(1, |y|): the networks of tests/applications_zoo.py, built in a process of their own once
per test run (the ``applications`` fixture of tests/conftest.py).

They take tens of minutes to build and compile on two cores, so they run with
``MALINN_SLOW_TESTS=1`` only; ``MALINN_APPLICATIONS_ZOO=DIR`` keeps the saved networks in ``DIR``
across runs."""

import json
import os

import numpy as np
import pytest
from applications_zoo import APPLICATIONS, GENERATIONS, SUFFIXES
from support import assert_close

import malinn

SLOW = os.environ.get("MALINN_SLOW_TESTS") == "1"
pytestmark = pytest.mark.skipif(
    not SLOW, reason="keras.applications' networks take tens of minutes on two cores: MALINN_SLOW_TESTS=1"
)


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("name", list(APPLICATIONS))
def test_application_equals_keras(applications, name, generation, suffix):
    manifest = json.loads((applications / "manifest.json").read_text())
    if name not in manifest["applications"][generation]:
        version = manifest["keras" if generation == "keras3" else "tf_keras"]
        pytest.skip(f"keras.applications of {generation} {version} has no {name}")
    data = np.load(applications / generation / f"{name}.npz")
    model = malinn.load_model(str(applications / generation / f"{name}{suffix}"))
    assert_close(model.predict(data["x"]), data["y"])
