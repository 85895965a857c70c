"""malinn against Keras on Functional graphs: every merge layer on every rank and axis, broadcasting,
shared layers, nested models (tf_keras numbers their calls from 1), several inputs and outputs (inputs
returned as outputs among them), in
every Keras file format, at batch 1, 7 and 100, on inputs in [-1, 1] and in [-1000, 1000], within
``1e-5 x max(1, max |Keras|)`` (3e-5 on OpenGL devices: ``TOLERANCE``); a malinn file of each
predicts the same bit for bit; unsupported layers of a graph, merges included, are all named in one
ConversionError.

The Keras side comes from tests/graph_zoo.py, run once per test run in a process of its own
(TensorFlow and PoCL cannot share one); ``MALINN_GRAPH_ZOO=DIR`` keeps (or reuses) it in DIR.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from graph_zoo import (
    BATCH_SIZES,
    ERROR_MODELS,
    FORMATS,
    KERAS3_ONLY,
    KERAS3_ZIP_ONLY,
    RANGES,
    TF_KERAS_ONLY,
    model_keys,
)

import malinn

ZOO_SCRIPT = Path(__file__).resolve().parents[1] / "graph_zoo.py"
EQUIVALENCE = [key for key in model_keys() if key not in ERROR_MODELS]


@pytest.fixture(scope="session")
def graph_zoo(tmp_path_factory):
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("tensorflow is not installed: the Keras reference graphs cannot be built")
    kept = os.environ.get("MALINN_GRAPH_ZOO")
    folder = Path(kept) if kept else tmp_path_factory.mktemp("graph_zoo")
    if not (folder / "manifest.json").is_file():
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        proc = subprocess.run(
            [sys.executable, str(ZOO_SCRIPT), str(folder)], capture_output=True, text=True, env=env, timeout=900
        )
        if proc.returncode != 0 or not (folder / "manifest.json").is_file():
            pytest.fail(f"tests/graph_zoo.py failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return folder, json.loads((folder / "manifest.json").read_text())


def zoo_file(graph_zoo, fmt, key):
    folder, manifest = graph_zoo
    generation, suffix = FORMATS[fmt]
    if fmt not in manifest["formats"]:
        pytest.skip(f"{generation} is not installed")
    if f"{generation}/{key}" not in manifest["models"]:
        reason = manifest["skipped"].get(f"{generation}/{key}", "not built")
        pytest.fail(f"the graph zoo has no {generation} model {key!r}: {reason}")
    return folder / generation / (key + suffix), folder / generation / (key + ".npz")


#: within 1e-5 x max(1, max |Keras|); on OpenGL devices 3e-5: Mesa's llvmpipe rounds a * b + c twice
#: (no fused multiply-add, not even through fma()), where TensorFlow and OpenCL round it once.
TOLERANCE = {"opencl": 1e-5, "gl": 3e-5}
#: the "large" range ([-1000, 1000]) at LARGE_FACTOR times that: concat_three_mixed feeds a softmax
#: logits of -622.73 and -622.66, where one float32 ulp (6e-5) moves the output by 1.5e-5, and
#: TensorFlow's summation order (its CPU kernels differ by machine) may differ from malinn's by a few
#: ulps (2.2e-5 seen with tf_keras on a CI machine)
LARGE_FACTOR = 10


def assert_keras_close(got, want, what, tolerance=1e-5):
    want = np.asarray(want, np.float32)
    assert got.dtype == np.float32 and got.shape == want.shape, f"{what}: {got.shape} {got.dtype}, Keras {want.shape}"
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max())
    assert err <= tolerance * scale, f"{what}: max |malinn - Keras| = {err:.3g} > {tolerance:g} x {scale:.3g}"


@pytest.mark.parametrize(
    "fmt,key",
    [
        pytest.param(fmt, key, id=f"{fmt}-{key}")
        for fmt in FORMATS
        for key in EQUIVALENCE
        if (key not in KERAS3_ONLY or FORMATS[fmt][0] == "keras3")
        and (key not in KERAS3_ZIP_ONLY or fmt == "keras3-zip")
    ],
)
@pytest.mark.formats_once
def test_graph_matches_keras(graph_zoo, device, tmp_path, fmt, key):
    path, data_path = zoo_file(graph_zoo, fmt, key)
    model = malinn.load_model(path)
    with np.load(data_path) as npz:
        data = {k: npz[k] for k in npz.files}
    saved = malinn.load_model(model.save(tmp_path / "m.malinn"))
    names = graph_zoo[1]["models"][f"{FORMATS[fmt][0]}/{key}"].get("output_names")

    def outputs(result) -> list:
        if names:  # Keras returned a dict: malinn too, with the same keys
            assert isinstance(result, dict) and list(result) == names
            return list(result.values())
        return result if isinstance(result, list) else [result]

    for label in RANGES:
        xs = [data[f"{label}:x{i}"] for i in range(sum(k.startswith(f"{label}:x") for k in data))]
        ys = [data[f"{label}:y{i}"] for i in range(sum(k.startswith(f"{label}:y") for k in data))]
        for batch in BATCH_SIZES:
            got = outputs(model.predict([x[:batch] for x in xs] if len(xs) > 1 else xs[0][:batch]))
            assert len(got) == len(ys)
            for j, (g, y) in enumerate(zip(got, ys)):
                assert_keras_close(
                    g,
                    y[:batch],
                    f"{fmt} {key} {label} batch {batch} output {j}",
                    TOLERANCE[device.backend] * (LARGE_FACTOR if label == "large" else 1),
                )
        given = xs if len(xs) > 1 else xs[0]
        for g, w in zip(outputs(saved.predict(given)), outputs(model.predict(given))):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("fmt", ["keras3-zip", "keras3-h5"])
def test_inputs_given_as_a_dict_are_named_by_its_keys(graph_zoo, device, fmt):
    """Keras 3's predict takes a model's dict inputs by the dict's keys (not the Input names), and a
    list in the order of the sorted keys."""
    path, data_path = zoo_file(graph_zoo, fmt, "dict_keys")
    keys = graph_zoo[1]["models"]["keras3/dict_keys"]["input_keys"]
    assert keys == ["alpha", "beta"] and graph_zoo[1]["models"]["keras3/dict_keys"]["inputs"] == ["a_in", "b_in"]
    model = malinn.load_model(path)
    assert model.input_names == keys
    with np.load(data_path) as npz:
        xs, y = [npz["unit:x0"], npz["unit:x1"]], npz["unit:y0"]
    assert_keras_close(model.predict(dict(zip(keys, xs))), y, f"{fmt} by key")
    assert_keras_close(model.predict(xs), y, f"{fmt} as a list")


@pytest.mark.parametrize(
    "fmt,key",
    [
        pytest.param(fmt, key, id=f"{fmt}-{key}")
        for key in ERROR_MODELS
        for fmt in FORMATS
        if key not in TF_KERAS_ONLY or FORMATS[fmt][0] == "tf_keras"
    ],
)
def test_unsupported_layers_of_a_graph_are_all_named(graph_zoo, fmt, key):
    path, _ = zoo_file(graph_zoo, fmt, key)
    with pytest.raises(malinn.ConversionError) as info:
        malinn.load_model(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    for fragment in ERROR_MODELS[key]:
        assert fragment in message, message
    assert f"{len(ERROR_MODELS[key])} unsupported layer(s)" in message


#: (format, graph) pairs verified: graphs in Keras 3's form, and the nested one in Keras 2's too
VERIFIED = [
    ("keras3-zip", "residual"),
    ("keras3-zip", "shared_two_outputs"),
    ("keras3-zip", "nested_shared"),
    ("keras2-h5", "nested_shared"),
    # inputs given as a dict: Keras is given them by key (a list in malinn's order failed:
    # "the structure of `inputs` doesn't match"), also where the keys are not the inputs' names
    ("keras3-zip", "dict_io"),
    ("keras3-zip", "dict_keys"),
]


@pytest.mark.parametrize("fmt, key", VERIFIED)
def test_verify_compares_a_graph_layer_by_layer(graph_zoo, device, capsys, fmt, key):
    """Each run starts TensorFlow, so: every graph on OpenCL, one (two outputs) on another backend,
    and the nested graph in Keras 2's form as well. Past predict_layers
    (which test_graph_matches_keras checks on every device and format) verify is the same code."""
    from malinn.cli.commands import main

    if device.backend != "opencl" and (fmt, key) != ("keras3-zip", "shared_two_outputs"):
        pytest.skip(f"{fmt} {key} is verified on OpenCL; {device.backend} verifies keras3-zip shared_two_outputs")
    path, _ = zoo_file(graph_zoo, fmt, key)
    model = malinn.load_model(path)
    model.plan(16, device)  # first: a backend without the merge kernels skips the test here
    assert main(["verify", str(path)]) == 0
    text = capsys.readouterr().out
    assert "OK: worst rel error" in text
    outputs = len(model.outputs)
    assert text.count("(model output") == outputs
    # rows with both errors (not "(not compared)", nor the argmax and OK lines after the table)
    compared = [line for line in text.splitlines() if re.search(r"\de[-+]\d\d +\d\.\d+e[-+]\d\d$", line)]
    assert len(compared) >= outputs + 1, text  # the outputs and at least one layer of their own


def test_the_zoo_runs_every_augmentation_layer_the_converter_drops():
    """The "augmented" models try each layer the converter drops as a random augmentation (those the
    installed Keras has), so each one's identity at inference is checked against Keras above."""
    from graph_zoo import AUGMENTATION_ARGS

    from malinn.converters.validate import AUGMENTATIONS

    assert set(AUGMENTATION_ARGS) == set(AUGMENTATIONS)
