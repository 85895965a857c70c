"""Models thousands of layers deep load in linear time and without recursion, in every form malinn
reads (.keras, Keras 3's and tf_keras's .h5, each generation's architecture JSON with its weights,
the malinn model file), and predict.

A Functional model of 1,000 / 2,000 / 4,000 layers took 2.8 / 9.0 / 34.7 s to load (the graph's
calls were put in order by scanning every call left once per round), a graph of 1,000 raised
RecursionError (Functional's walk from the outputs, then the plan's walk along layers working in
place), and a malinn file of 20,000 Activation layers took 39.7 s (each ``Sequential.add`` scanned
every name before it). The files are written without Keras (``deep_files.py``): Keras builds such
a model far too slowly. Linear time is asserted on counted work (the Python calls a load makes for
``n`` and ``2n`` layers), never on a clock; a generous time bound guards against a hang only.
"""

from __future__ import annotations

import io
import json
import sys
import time
import zipfile

import deep_files
import h5py
import numpy as np
import pytest

import malinn
from malinn import ConversionError
from malinn.converters.chain import MAX_NESTED_MODELS

FORMS = deep_files.FORMS + ("malinn",)


def write(tmp_path, form: str, n: int, graph: bool = True) -> tuple:
    """``(model, weights)`` of the deep model of ``n`` Activation layers in ``form`` (a malinn file:
    converted from the .keras form)."""
    if form != "malinn":
        return deep_files.write(tmp_path / f"{form}-{n}-{graph}", form, n, graph)
    keras, _ = deep_files.write(tmp_path / f"keras-{n}-{graph}.keras", "keras3-zip", n, graph)
    path = tmp_path / f"{n}-{graph}.malinn"
    malinn.convert(keras, path, target="cpu")
    return str(path), None


def calls_to_load(model: str, weights) -> int:
    """How many Python function calls (and generator resumptions, and calls of C functions)
    ``malinn.load_model`` makes for the file: a count of the work done, the same on any machine."""
    count = 0

    def counted(frame, event, arg):
        nonlocal count
        count += event in ("call", "c_call")

    sys.setprofile(counted)
    try:
        malinn.load_model(model, weights=weights)
    finally:
        sys.setprofile(None)
    return count


@pytest.mark.parametrize("form, graph", [(form, True) for form in FORMS] + [("keras3-zip", False), ("malinn", False)])
def test_loading_does_work_linear_in_the_depth(tmp_path, form, graph):
    """Twice the layers, twice the work: quadratic loading (the graph's rounds, the names scanned
    by each add) did 2.4 to 3.4 times the work for 500 layers as for 250."""
    small, large = write(tmp_path, form, 250, graph), write(tmp_path, form, 500, graph)
    malinn.load_model(*small)  # imports and the kernel library, once, before counting
    counts = [calls_to_load(*small), calls_to_load(*large)]
    assert counts[1] < 2.3 * counts[0], f"{counts[1]} calls for 500 layers, {counts[0]} for 250"


@pytest.mark.parametrize("form", FORMS)
def test_a_graph_of_4000_layers_loads_in_every_form(tmp_path, form):
    """4,000 layers, four times past Python's recursion limit, in each form."""
    files = write(tmp_path, form, 4000)
    started = time.perf_counter()
    model = malinn.load_model(*files)
    seconds = time.perf_counter() - started
    assert isinstance(model, malinn.Functional) and len(model.layers) == 4002
    assert [layer.name for layer in model.layers[:3]] == ["dense", "act_0", "act_1"]
    assert model.layers[-1].name == "add"
    assert seconds < 30, f"4000 layers took {seconds:.1f} s (35 s when loading was quadratic)"  # a hang's guard


def test_a_graph_deeper_than_the_recursion_limit_predicts_as_numpy(tmp_path):
    """The plan's walk along the values that layers working in place share (one Activation after
    another) recursed: 1,000 layers raised RecursionError in predict."""
    model = malinn.load_model(*write(tmp_path, "keras3-zip", 1500))
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(model.predict(x), deep_files.expected(x), rtol=1e-5, atol=1e-6)


def test_the_order_of_a_graphs_calls_is_each_call_after_what_it_reads(tmp_path):
    """The calls come in rounds (those reading only the inputs first, then those reading them...),
    each round in the config's order: the Add after the 300 Activations it reads from, whatever
    its place in the config."""
    config = deep_files.keras3_config(300, graph=True)
    layers = config["config"]["layers"]
    layers.insert(2, layers.pop())  # the Add listed right after the Dense, before the chain it reads
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        deep_files._keras3_weight_tree(f, 300, True)
    path = tmp_path / "reordered.keras"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("config.json", json.dumps(config))
        z.writestr("model.weights.h5", buffer.getvalue())
    from malinn.converters import read_keras

    calls = [call.layer for call in read_keras(path).graph.calls]
    assert calls == ["dense"] + [f"act_{i}" for i in range(300)] + ["add"]


def nested(tmp_path, depth: int):
    """A .keras of Sequentials nested ``depth`` deep around one Dense."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        group = f.create_group("/".join(["layers/sequential"] * (depth - 1) + ["layers/dense/vars"]))
        group.create_dataset("0", data=deep_files.KERNEL)
        group.create_dataset("1", data=deep_files.BIAS)
    path = tmp_path / f"nested{depth}.keras"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("config.json", json.dumps(deep_files.nested_sequential(depth)))
        z.writestr("model.weights.h5", buffer.getvalue())
    return path


def test_models_nested_past_the_limit_are_refused_by_name(tmp_path):
    """The walks over nested models recurse once per level: past MAX_NESTED_MODELS a clear refusal,
    not a RecursionError (JSON itself nests about 300 models deep before its parser stops)."""
    x = np.ones((2, 4), np.float32)
    model = malinn.load_model(nested(tmp_path, MAX_NESTED_MODELS + 1))  # the innermost at the limit
    np.testing.assert_allclose(model.predict(x), x @ deep_files.KERNEL + deep_files.BIAS, rtol=1e-6)
    with pytest.raises(
        ConversionError,
        match=f"is a model nested {MAX_NESTED_MODELS + 1} models deep, more than "
        f"malinn reads \\({MAX_NESTED_MODELS}\\)",
    ):
        malinn.load_model(nested(tmp_path, MAX_NESTED_MODELS + 2))
