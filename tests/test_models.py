"""Sequential: numpy equivalence for every matmul variant, device residency, input checks."""

import copy
import re
from pathlib import Path

import numpy as np
import pytest
from support import assert_close, dense_forward, model_forward, summary_rows

from malinn import Functional, Input, Sequential, load_model, ops
from malinn.layers import Activation, Add, Conv1D, Dense, Normalization, Reshape
from malinn.layers.activation import get_activation
from malinn.layers.base import Layer
from malinn.library.kernel_library import load_library


def three_layer(seed=0):
    rng = np.random.default_rng(seed)
    model = Sequential(
        [Dense(13, activation="relu"), Dense(1001, activation="sigmoid"), Dense(3, activation="softmax")]
    )
    model.build((None, 37))
    model.set_weights([w + rng.standard_normal(w.shape).astype(np.float32) * 0.1 for w in model.get_weights()])
    return model


def reference(model, x):
    w = model.get_weights()
    acts = [layer.activation for layer in model.layers]
    return dense_forward(x, [(w[0], w[1], acts[0]), (w[2], w[3], acts[1]), (w[4], w[5], acts[2])])


@pytest.mark.parametrize("codename", load_library().codenames("matmul"))
@pytest.mark.parametrize("batch", [1, 3, 100])
def test_three_layer_model_matches_numpy(device, codename, batch, rng):
    ops.use("matmul", codename, device)
    model = three_layer()
    x = rng.standard_normal((batch, 37))
    y = model.predict(x)
    assert y.shape == (batch, 3) and y.dtype == np.float32
    assert_close(y, reference(model, x.astype(np.float32)))


def test_activations_stay_on_the_device(device, rng):
    model = three_layer()
    # uploads the weights once, laid out for the kernels of this batch (a batch of another size may
    # run other kernels: gemv up to its bound, then the general fallback, which read other layouts)
    model.predict(rng.standard_normal((9, 37)))
    before = dict(device.counters)
    model.predict(rng.standard_normal((9, 37)))
    assert device.counters["uploads"] - before["uploads"] == 1  # the input only
    assert device.counters["downloads"] - before["downloads"] == 1  # the output only


def test_batch_size_splits_without_changing_results(device, rng):
    model = three_layer()
    x = rng.standard_normal((23, 37)).astype(np.float32)
    np.testing.assert_array_equal(
        model.predict(x, batch_size=5), np.concatenate([model.predict(x[i : i + 5]) for i in range(0, 23, 5)])
    )
    assert_close(model.predict(x, batch_size=5), reference(model, x))


def test_float64_and_integers_are_cast_like_keras(device):
    model = Sequential([Dense(2, use_bias=False)])
    model.build((None, 3))
    model.set_weights([np.eye(3, 2, dtype=np.float32)])
    np.testing.assert_array_equal(model.predict(np.array([[1.5, 2.5, 3.0]], np.float64)), [[1.5, 2.5]])
    np.testing.assert_array_equal(model.predict([[1, 2, 3]]), [[1.0, 2.0]])


@pytest.mark.parametrize(
    "x, fragment",
    [
        (np.zeros((4, 36)), r"expected shape \(None, 37\), found shape \(4, 36\)"),
        (np.zeros(37), r"expected shape \(None, 37\), found shape \(37,\)"),
        (np.zeros((2, 3, 37)), r"found shape \(2, 3, 37\)"),
        (np.array([["a"] * 37]), "must be numeric, got dtype <U1"),
        ([[1, 2], [3]], "could not be read as an array"),
        ([[[1.0] * 37, [1.0] * 36]], "could not be read as an array"),  # a list holding a ragged batch
    ],
)
def test_bad_input_names_the_layer_and_both_shapes(device, x, fragment):
    model = three_layer()
    with pytest.raises(ValueError, match=fragment) as info:
        model.predict(x)
    assert repr(model.layers[0].name) in str(info.value)


def test_one_sample_without_its_batch_axis_is_refused_with_the_fix(device):
    """A single sample given as it is, the commonest slip of a first predict, is named as such with
    the call that makes it a batch; Keras's own rank adjustment (a batch of scalars for an input of
    one feature) still takes precedence."""
    model = three_layer()
    hint = "; it looks like one sample without its batch axis: pass x[None] or x.reshape(1, 37)"
    with pytest.raises(ValueError, match=re.escape("expected shape (None, 37), found shape (37,)" + hint + "")):
        model.predict(np.zeros(37))
    with pytest.raises(
        ValueError,
        match=re.escape("found shape (37,); it looks like one sample without its batch axis: pass np.asarray(x)[None]"),
    ):
        model.predict([0.5] * 37)
    image = Sequential([Input((4, 3, 1)), Dense(2)])
    with pytest.raises(
        ValueError,
        match=re.escape(
            "found shape (4, 3, 1); it looks like one sample without its "
            "batch axis: pass x[None] or x.reshape(1, 4, 3, 1)"
        ),
    ):
        image.predict(np.zeros((4, 3, 1)))
    unbuilt = Sequential([Dense(2)])
    with pytest.raises(
        ValueError,
        match=re.escape(
            "expected shape (None, features), found shape (5,); it looks like "
            "one sample without its batch axis: pass x[None] or x.reshape(1, 5)"
        ),
    ):
        unbuilt.predict(np.zeros(5))
    graph = Functional(a := Input((6,), name="a"), Dense(2)(a))
    with pytest.raises(
        ValueError,
        match=re.escape(
            "Input 'a' of model 'functional' is incompatible: expected shape "
            "(None, 6), found shape (6,); it looks like one sample without its "
            "batch axis: pass x[None] or x.reshape(1, 6)"
        ),
    ):
        graph.predict(np.zeros(6))
    for wrong in (np.zeros((2, 36)), np.zeros(36)):  # not one sample: no such advice
        with pytest.raises(ValueError, match="found shape") as info:
            model.predict(wrong)
        assert "one sample" not in str(info.value)
    scalars = Sequential([Input((1,)), Dense(2)])  # Keras's form: a batch of 1 scalar, not a sample
    assert scalars.predict(np.zeros(1)).shape == (1, 2)


def test_predict_takes_a_list_of_one_batch_as_keras_does(device):
    model = three_layer()
    x = np.random.default_rng(0).uniform(-1, 1, (4, 37)).astype(np.float32)
    np.testing.assert_array_equal(model.predict([x]), model.predict(x))
    np.testing.assert_array_equal(model.predict(list(x)), model.predict(x))  # a list of samples
    with pytest.raises(ValueError, match="takes one input array, got a list of 2 arrays"):
        model.predict([x, x])
    with pytest.raises(ValueError, match="takes one input array, got a dict of 1 \\(x\\)"):
        model.predict({"x": x})
    unbuilt = Sequential([Dense(2)])
    assert unbuilt.predict([x]).shape == (4, 2) and unbuilt.input_shape == (None, 37)
    # Keras code passes verbose=0 (or "auto", 1, 2): the same results (a bar only where asked: tests/test_predict_sources.py)
    for verbose in (0, 1, 2, "auto"):
        np.testing.assert_array_equal(model.predict(x, verbose=verbose), model.predict(x))


def test_bad_batch_size_and_empty_models():
    model = three_layer()
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        model.predict(np.zeros((2, 37)), batch_size=0)
    with pytest.raises(ValueError, match="has no layers"):
        Sequential().predict(np.zeros((1, 1)))
    with pytest.raises(ValueError, match="expected a malinn layer"):
        Sequential([object()])


def test_empty_batch_returns_an_empty_result(device):
    assert three_layer().predict(np.zeros((0, 37))).shape == (0, 3)


def test_deferred_build_and_weights_round_trip(device, rng):
    model = Sequential([Dense(4, activation="tanh")])
    model.add(Dense(2))
    assert not model.built
    y = model.predict(rng.standard_normal((3, 6)))
    assert model.built and y.shape == (3, 2)
    weights = model.get_weights()
    assert [w.shape for w in weights] == [(6, 4), (4,), (4, 2), (2,)]
    other = Sequential([Dense(4, activation="tanh"), Dense(2)])
    other.build((None, 6))
    other.set_weights(weights)
    x = rng.standard_normal((5, 6))
    np.testing.assert_array_equal(model.predict(x), other.predict(x))
    with pytest.raises(ValueError, match="expects 4 weight arrays, got 3"):
        other.set_weights(weights[:3])


def test_duplicate_layer_names_are_rejected():
    with pytest.raises(ValueError, match="already in the model"):
        Sequential([Dense(2, name="x"), Activation("relu", name="x")])


def test_adding_to_a_built_model_builds_the_new_layer_alone_and_still_refuses_a_name_in_use(monkeypatch):
    """``add`` scanned every layer's name and, on a built model, checked every layer again: 300
    layers after an Input took 45,000 checks (a malinn file of 20,000 layers loaded in 40 s). The
    names and the output shape are kept between calls, and found again where the list was changed
    by hand."""
    checks = []
    monkeypatch.setattr(Activation, "check_reuse", lambda self, shape, how="receives": checks.append(self.name))
    model = Sequential([Input((4,))] + [Activation("relu", name=f"a{i}") for i in range(300)])
    assert checks == [] and all(layer.built for layer in model.layers) and model.output_shape == (None, 4)
    with pytest.raises(ValueError, match="a layer named 'a7' is already in the model"):
        model.add(Activation("relu", name="a7"))
    assert len(model.layers) == 300
    model.layers.pop()  # edited by hand: a299's name is free again
    model.add(Activation("tanh", name="a299"))
    model.layers = model.layers[:10]  # replaced: a12's too, a3's not
    model.add(Activation("relu", name="a12"))
    with pytest.raises(ValueError, match="a layer named 'a3' is already in the model"):
        model.add(Dense(2, name="a3"))
    model.add(Dense(3, name="head"))
    assert [layer.name for layer in model.layers[-3:]] == ["a9", "a12", "head"]
    assert model.output_shape == (None, 3) and model.layers[-1].kernel.shape == (4, 3)


def test_summary_lists_layers_and_params():
    text = three_layer().summary(print_fn=lambda s: None)
    assert "(None, 1001)" in text and "Total params: " + str(37 * 13 + 13 + 13 * 1001 + 1001 + 1001 * 3 + 3) in text


def test_summary_names_the_keras_layers_folded_into_a_layer():
    """A BatchNormalization the converter folded into the convolution before it: its parameters are
    that layer's now, so the total is below Keras's; the row says which layer went in (the summary
    said nothing, and it counted 6090 against Keras's 6218)."""
    model = load_model(Path(__file__).resolve().parents[1] / "examples" / "digits_cnn.keras")
    text = model.summary(print_fn=lambda s: None)
    assert "conv2d_1 (Conv2D) + batch_normalization (folded)" in text, text
    assert "conv2d (Conv2D) " in text and "conv2d (Conv2D) +" not in text


def test_a_weight_assigned_to_a_layer_reaches_the_next_predict(device):
    """``dense.kernel = ...`` after a predict (Keras's ``layer.kernel.assign``): the next predict,
    a new batch size's plan and a saved file all use it (predict kept the old weights)."""
    dense = Dense(2, name="d")
    model = Sequential([dense])
    model.build((None, 3))
    x = np.ones((1, 3), np.float32)
    model.predict(x)
    dense.kernel = np.zeros((3, 2), np.float32)
    dense.bias = np.ones(2, np.float32)
    np.testing.assert_array_equal(model.predict(x), [[1.0, 1.0]])
    np.testing.assert_array_equal(model.predict(np.ones((5, 3), np.float32)), np.ones((5, 2)))
    dense.activation = get_activation("relu")
    dense.bias = -np.ones(2, np.float32)
    np.testing.assert_array_equal(model.predict(x), [[0.0, 0.0]])


@pytest.mark.parametrize("make", [lambda: Dense(2, name="d"), lambda: Conv1D(2, 1, name="d")])
def test_a_weight_changed_in_place_is_refused_and_one_of_another_shape_named(device, make):
    """A layer's weight arrays are read-only: ``dense.kernel[:] = 0`` after a predict changed what
    get_weights, save and another device saw while this device kept computing with the values it had
    uploaded. A weight assigned in another shape is refused by name (a (2, 2) kernel for 3 inputs
    was cut or padded silently); one given as a list is taken as float32."""
    layer = make()
    model = Sequential([layer])
    model.build((None, 3) if isinstance(layer, Dense) else (None, 4, 3))
    x = np.ones((1,) + model.input_shapes[0], np.float32)
    before = model.predict(x)
    with pytest.raises(ValueError, match="read-only"):
        layer.kernel[...] = 7.0
    with pytest.raises(ValueError, match="read-only"):
        layer.bias += 1.0
    np.testing.assert_array_equal(model.predict(x), before)
    shape = layer.kernel.shape
    with pytest.raises(
        ValueError,
        match=rf"layer 'd' \({type(layer).__name__}\): kernel has shape "
        rf"{re.escape(str(shape))}, got \(2, 2\)",
    ):
        layer.kernel = np.full((2, 2), 7.0, np.float32)
    with pytest.raises(ValueError, match=r"layer 'd' .*: bias must be numeric"):
        layer.bias = ["a", "b"]
    np.testing.assert_array_equal(model.predict(x), before)
    layer.kernel = np.full(shape, 1.0).tolist()
    layer.bias = [0, 0]
    assert layer.kernel.dtype == np.float32 and not layer.kernel.flags.writeable
    np.testing.assert_allclose(model.predict(x), np.full_like(before, 3.0))
    copy = model.get_weights()[0]
    copy[...] = 0.0  # get_weights returns copies the caller may change
    np.testing.assert_allclose(model.predict(x), np.full_like(before, 3.0))


def test_set_weights_is_all_or_nothing_and_takes_numbers_only():
    """A bad third array leaves the first layer's weights as they were (they were replaced); arrays
    of None or of complex numbers are refused by name (they became NaN weights, or lost their
    imaginary part with a warning)."""
    model = Sequential([Dense(3, name="a"), Dense(2, name="b")])
    model.build((None, 4))
    before = model.get_weights()
    bad = [np.ones((4, 3)), np.ones(3), np.ones((5, 2)), np.ones(2)]
    with pytest.raises(ValueError, match="kernel shape"):
        model.set_weights(bad)
    for got, want in zip(model.get_weights(), before):
        np.testing.assert_array_equal(got, want)
    for strange, kind in [(np.full((4, 3), None), "object"), (np.ones((4, 3)) * 1j, "complex128")]:
        with pytest.raises(ValueError, match=rf"Dense layer 'a': weight array 0 holds {kind} values"):
            model.layers[0].set_weights([strange, np.ones(3)])


def test_a_failed_add_leaves_the_model_as_it_was():
    """``add`` of a layer that does not take the last output raises, and the model still predicts
    and takes the next layer (the refused layer stayed in it: every later call failed)."""
    model = Sequential([Dense(4, name="d")])
    model.build((None, 3))
    with pytest.raises(ValueError):
        model.add(Reshape((3,), name="wrong"))
    assert [layer.name for layer in model.layers] == ["d"]
    model.add(Dense(2, name="e"))
    assert model.predict(np.ones((2, 3), np.float32)).shape == (2, 2)


def test_normalization_statistics_of_another_layout_are_refused():
    """Statistics of shape (3, 2) for a layer keeping axes of sizes (2, 3) were reshaped silently
    (values scrambled, not transposed); a count of two numbers raised numpy's reshape error."""
    norm = Normalization(axis=(1, 2), name="stats")
    norm.build((None, 2, 3))
    with pytest.raises(ValueError, match=r"Normalization 'stats': statistics of shape \(3, 2\) do not fit \(2, 3\)"):
        norm.set_weights([np.zeros((3, 2)), np.ones((3, 2))])
    norm.set_weights([np.zeros((1, 2, 3)), np.ones((2, 3))])  # axes of 1 aside, the same layout
    with pytest.raises(
        ValueError, match=r"Normalization 'stats': count must be one number, got an array of shape \(2,\)"
    ):
        norm.set_weights([np.zeros((2, 3)), np.ones((2, 3)), np.ones(2)])


def test_from_config_makes_the_model_get_config_describes(rng):
    """Keras's contract: ``Sequential.from_config(model.get_config())`` (and Functional's) makes the
    same layers and graph; with the weights set, the same answers (there was ``from_layers`` only)."""
    model = Sequential([Dense(5, activation="tanh", name="h"), Dense(2, name="o")])
    model.build((None, 3))
    again = Sequential.from_config(model.get_config())
    assert [layer.get_config() for layer in again.layers] == [layer.get_config() for layer in model.layers]
    again.set_weights(model.get_weights())
    x = rng.standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_array_equal(again.predict(x), model.predict(x))
    inputs = Input((3,), name="x")
    graph = Functional(inputs, Add(name="sum")([Dense(3, name="d")(inputs), inputs]))
    copy = Functional.from_config(graph.get_config())
    copy.set_weights(graph.get_weights())
    np.testing.assert_array_equal(copy.predict(x), graph.predict(x))
    assert not Sequential.from_config(Sequential([Dense(2)]).get_config()).built
    model.precision = graph.precision = "int8-weights"  # the precision is part of the model's config
    assert Sequential.from_config(model.get_config()).precision == "int8-weights"
    assert Functional.from_config(graph.get_config()).precision == "int8-weights"


def test_a_service_cycling_through_many_batch_sizes_plans_each_once(device, monkeypatch):
    """Eight plans were kept: answering 1..9 samples in turn made a plan on every call (2 ms a
    predict against 0.1, measured). Small plans are kept up to a budget of their buffers;
    plans of an older model state (set_weights) are dropped, not kept beside the new ones."""
    model = Sequential([Dense(16, activation="relu"), Dense(3)])
    model.build((None, 8))
    made = []
    compile_plan = model._compile
    monkeypatch.setattr(model, "_compile", lambda *args: made.append(args[1]) or compile_plan(*args))
    x = np.ones((20, 8), np.float32)
    for _ in range(3):
        for n in range(1, 21):
            model.predict(x[:n])
    assert sorted(made) == list(range(1, 21))
    model.set_weights(model.get_weights())
    model.predict(x[:3])
    assert len(model._plans) == 1


def test_summary_fits_the_terminal_and_wraps_long_cells(device, monkeypatch):
    """The table was as wide as its longest cells (133 to 203 columns for a real network, with its
    kernel column): it fits the terminal (COLUMNS), at most SUMMARY_WIDTH columns, each cell that
    does not fit its column wrapped onto the lines below, none of its text lost."""
    from malinn.model.summary import SUMMARY_WIDTH

    name = "a_dense_layer_whose_name_takes_more_room_than_a_narrow_terminal_has"
    model = Sequential([Dense(300, activation="relu", name=name), Dense(3, name="head")])
    model.build((None, 20))
    kernels = model._kernels(1)[0]
    for columns, width in ((60, 60), (300, SUMMARY_WIDTH)):
        monkeypatch.setenv("COLUMNS", str(columns))
        text = model.summary(print_fn=lambda s: None, show_kernels=True)
        table = [line for line in text.splitlines() if not line.startswith(("Model:", "Weights", "Total"))]
        assert max(len(line) for line in table) == width and text.splitlines()[1] == "-" * width, text
        rows = summary_rows(text)
        assert [row["Layer (type)"].replace(" ", "") for row in rows] == [f"{name}(Dense)", "head(Dense)"], text
        assert [row["Output Shape"] for row in rows] == ["(None, 300)", "(None, 3)"]
        assert [row["Param #"] for row in rows] == ["6300", "903"]
        assert [row["Kernel"] for row in rows] == [kernels[name], kernels["head"]], text
    small = Sequential([Dense(3, name="d")])
    small.build((None, 4))
    lines = small.summary(print_fn=lambda s: None).splitlines()  # as wide as its cells, in a wide terminal too
    assert (
        lines[1] == "-" * (14 + 14 + 9)
        and lines[2].split()
        == [  # each column its longest cell and 2 more
            "Layer",
            "(type)",
            "Output",
            "Shape",
            "Param",
            "#",
        ]
        and lines[4].split() == ["d", "(Dense)", "(None,", "3)", "15"]
    )


def test_keras_call_forms(device, rng):
    """What Keras code writes: ``Sequential([Input(shape), ...])``, ``model(x, training=False)``,
    ``summary(line_length)`` / ``positions``, ``input_shape`` with the batch axis (a Sequential gave
    one sample's shape where a Functional gave Keras's), ``count_params`` of an unbuilt model (an
    error, as Keras's; it said 0), ``Model(a, a)``. Calling a model on a symbolic tensor is refused
    naming why (it failed as "must be numeric, got dtype object")."""
    x = rng.standard_normal((3, 4)).astype(np.float32)
    model = Sequential([Input((4,)), Dense(3, activation="relu", name="d1"), Dense(2, name="d2")])
    a = Input((4,))
    graph = Functional(a, model.layers[0](a))
    assert model.input_shape == graph.input_shape == (None, 4) and model.output_shape == (None, 2)
    np.testing.assert_array_equal(model(x, training=False), model.predict(x))
    with pytest.raises(ValueError, match="malinn runs inference only; call it with training=False or None"):
        model(x, training=True)
    for call in (lambda: model(a), lambda: graph([a]), lambda: graph({"x": a})):
        with pytest.raises(ValueError, match="cannot be called on symbolic tensors: malinn does not nest a model"):
            call()
    with pytest.raises(
        ValueError,
        match=r"a malinn.Input may only come first, before any layer \(got .* after "
        r"layer 'd2'\)",
    ):
        model.add(Input((2,)))
    assert [layer.name for layer in model.layers] == ["d1", "d2"]
    lines = model.summary(60, print_fn=lambda text: None).splitlines()
    assert max(len(line) for line in lines if not line.startswith(("Weights", "Total"))) == 60
    assert lines[4].startswith("d1 (Dense)".ljust(27)) and lines[4][27:51].rstrip() == "(None, 3)"  # int(0.45 * 60)
    assert lines[4][51:].rstrip() == "15"
    lines = model.summary(60, print_fn=lambda text: None, show_kernels=True).splitlines()  # Keras's four columns
    row = next(line for line in lines if line.startswith("d1 (Dense)"))
    assert row.startswith("d1 (Dense)".ljust(19)) and row[19:33].rstrip() == "(None, 3)"  # int(0.33 * 60)
    assert lines[2].startswith("Layer (type)") and lines[3][33:40].rstrip() == "#"  # "Param #" wrapped in 7 columns
    lines = model.summary(line_length=40, positions=[15, 25, 40], print_fn=lambda text: None).splitlines()
    row = next(line for line in lines if line.startswith("d1 (Dense)"))  # after a header wrapped onto two lines
    assert lines[1] == "-" * 40 and row[:15] == "d1 (Dense)".ljust(15) and row[25:40].rstrip() == "15"
    assert [line[15:25].rstrip() for line in lines[2:4]] == ["Output", "Shape"]
    with pytest.raises(ValueError, match="positions must give 3 column ends, got 2"):
        model.summary(80, positions=[0.5, 1.0])
    for width in range(4, 12):  # Keras's fractions of a narrow line: each column one character at least
        assert model.summary(width, print_fn=lambda text: None).splitlines()[1] == "-" * width
    unbuilt = Sequential([Dense(3)])
    with pytest.raises(ValueError, match="is not built"):
        unbuilt.count_params()
    assert "Total params: 0 (unbuilt)" in unbuilt.summary(print_fn=lambda text: None)
    np.testing.assert_array_equal(Functional(a, a).predict(x), x)


def test_a_repeated_call_takes_the_plan_of_the_last_and_still_sees_every_change(device, rng):
    """``predict`` on a float32 array of the last call's shape goes straight to that call's plan
    (no checks or decisions again); anything else, and any change of the model, takes the full path."""
    model = Sequential([Dense(5, activation="relu", name="a"), Dense(3, name="b")])
    model.build((None, 4))
    x = rng.standard_normal((6, 4)).astype(np.float32)
    first = model.predict(x)
    plan = model._recent[6][4]
    y = rng.standard_normal((6, 4)).astype(np.float32)
    assert_close(model.predict(y), model_forward(model, y))
    assert model._recent[6][4] is plan
    assert_close(model.predict(y.astype(np.float64)), model_forward(model, y))
    assert_close(model.predict(np.asfortranarray(y)), model_forward(model, y))
    with pytest.raises(ValueError, match=r"expected shape \(None, 4\), found shape \(6, 5\)"):
        model.predict(np.ones((6, 5), np.float32))
    model.layers[1].bias = np.ones(3, np.float32)
    assert_close(model.predict(x), first + 1.0)
    assert_close(model.predict(x, batch_size=4), first + 1.0)


def test_calls_alternating_between_a_few_sizes_each_go_straight_to_their_plan(device, rng, monkeypatch):
    """A server's calls alternate between a few padded sizes: each size's array goes straight to its
    own plan (the inputs not checked again), up to RECENT_CALLS_KEPT sizes, the oldest dropped
    beyond; a change of the model is still seen by every one of them."""
    from malinn.model.predicting import RECENT_CALLS_KEPT

    model = Sequential([Dense(5, activation="relu", name="a"), Dense(3, name="b")])
    model.build((None, 4))
    xs = {n: rng.standard_normal((n, 4)).astype(np.float32) for n in (16, 32, 64)}
    first = {n: model.predict(x) for n, x in xs.items()}
    checked = []
    real = type(model)._check_inputs
    monkeypatch.setattr(type(model), "_check_inputs", lambda self, x, **kw: checked.append(1) or real(self, x, **kw))
    for n in (16, 64, 32, 16, 32, 64):
        assert_close(model.predict(xs[n]), first[n])
    assert not checked  # every size straight to its plan
    for n in range(1, RECENT_CALLS_KEPT + 1):  # as many other sizes: 16, 32 and 64 are dropped
        model.predict(rng.standard_normal((n, 4)).astype(np.float32))
    assert sorted(model._recent) == list(range(1, RECENT_CALLS_KEPT + 1))
    checked.clear()
    assert_close(model.predict(xs[16]), first[16])
    assert checked  # the full path again
    model.layers[1].bias = model.layers[1].bias + 1.0
    for n in (16, 1, 2):
        x = xs[16] if n == 16 else rng.standard_normal((n, 4)).astype(np.float32)
        assert_close(model.predict(x), model_forward(model, x))


class ChannelGain(Layer):
    """A user's layer written with its own get_weights/set_weights (no weight_names), as malinn's
    own layers were before they named their weights."""

    def build(self, input_shape):
        super().build(input_shape)
        self.gain = np.ones(input_shape[-1], np.float32)

    def get_weights(self):
        return [self.gain.copy()] if self.built else []

    def set_weights(self, weights):
        (self.gain,) = [np.asarray(w, np.float32) for w in weights]

    def lower(self, builder, x):
        return x


def test_a_users_layer_with_its_own_get_weights_and_copies_of_layers(tmp_path):
    """A layer without weight_names is counted, set and saved through its own get_weights (the
    model expected 2 arrays of 3, counted 16 of 20 parameters and saved none of its weights); a
    deep copy of a layer holds its weights read-only too."""
    model = Sequential([Dense(4, name="d"), ChannelGain(name="gain")])
    model.build((None, 3))
    assert len(model.get_weights()) == 3 and model.count_params() == 20
    weights = model.get_weights()
    weights[2] = np.array([1, 2, 3, 4], np.float32)
    model.set_weights(weights)
    np.testing.assert_array_equal(model.layers[1].gain, [1, 2, 3, 4])
    twin = copy.deepcopy(model.layers[0])
    with pytest.raises(ValueError, match="read-only"):
        twin.kernel[0] = 1.0
    lines = []
    model.summary(lines.append)  # malinn 0.1's first argument: print_fn
    assert lines and "Total params: 20" in lines[0]


def test_messages_give_sizes_and_arguments_as_a_user_reads_them(device, monkeypatch):
    """A limit of 64 KiB was printed as "(0 MiB)"; set_weights(None) was "'NoneType' object is not
    iterable"."""
    from malinn import DeviceError
    from malinn.backends.base import size_text

    assert (size_text(65536), size_text(3 * 2**20 + 2**19)) == ("64.0 KiB", "3.50 MiB")
    model = Sequential([Dense(300, name="big")])
    model.build((None, 500))
    monkeypatch.setattr(device, "max_allocation", 65536)
    with pytest.raises(
        DeviceError,
        match=r"exceeds the largest single allocation of .* \(64\.0 KiB.*\); a reduced "
        r"precision \(fp16-storage, int8-weights\) or a device with more memory",
    ):
        model.predict(np.ones((1, 500), np.float32))
    with pytest.raises(
        ValueError, match=r"set_weights takes a list of arrays, as get_weights returns it; got NoneType"
    ):
        model.set_weights(None)


def test_an_input_of_one_feature_takes_a_batch_of_scalars_as_keras_does(device):
    """Keras's models add the last axis of an input whose last size is 1 where it is missing (the
    structured-data tutorials' dict of scalar feature columns) and drop an extra last axis of 1;
    malinn refused them."""
    from malinn import Input, Model

    scalars = np.arange(5, dtype=np.float32)
    model = Sequential([Input((1,)), Dense(2)])
    np.testing.assert_array_equal(model.predict(scalars), model.predict(scalars[:, None]))
    np.testing.assert_array_equal(model.predict([scalars]), model.predict(scalars[:, None]))  # in a list, as Keras
    f, g = Input((1,), name="f"), Input((3,), name="g")
    graph = Model([f, g], Dense(1)(f))
    wide = np.ones((5, 3), np.float32)
    np.testing.assert_array_equal(graph.predict({"f": scalars, "g": wide}), graph.predict([scalars[:, None], wide]))
    single = Model(f, Dense(2)(f))
    np.testing.assert_array_equal(single.predict([scalars]), single.predict(scalars[:, None]))
    column = Sequential([Input((4, 1)), Dense(2)])
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(column.predict(x), column.predict(x[..., None]))
    np.testing.assert_array_equal(column.predict(x[..., None, None]), column.predict(x[..., None]))  # one more: dropped
    with pytest.raises(ValueError, match=r"expected shape \(None, 4, 1\), found shape \(3, 5\)"):
        column.predict(np.zeros((3, 5), np.float32))  # the shape given, not the one tried
