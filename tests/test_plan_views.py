"""Views in a plan: a Reshape/Flatten whose flat order the layout keeps, and a Concatenate whose
inputs their matmuls write straight into its buffer, launch nothing; where the layout (or a
reader) needs a copy, the copy kernel stays; the values are Keras's either way."""

import numpy as np
import pytest
from support import assert_close

from malinn import Functional, Input, Sequential
from malinn.layers import Activation, Concatenate, Dense, Flatten, Reshape

pytestmark = [pytest.mark.usefixtures("device"), pytest.mark.kernel_grid]  # kernel_grid: tests/conftest.py

BATCHES = (1, 7, 100)


def dense_np(layer, x):
    kernel, bias = layer.get_weights()
    y = x.astype(np.float64) @ kernel + bias
    return np.maximum(y, 0) if layer.activation == "relu" else np.tanh(y) if layer.activation == "tanh" else y


def launched(plan, kind) -> int:
    """Steps of ``kind`` that launch a kernel (a view launches nothing)."""
    return sum(1 for step in plan.steps if step.kind.name == kind and not step.view)


def poison(device, plan, kind) -> None:
    """Fills the buffer of every result of ``kind`` with NaN, padding included, so that a float the
    plan should write (a value or a padding zero) and does not shows up in the results."""
    for step in plan.steps:
        if step.kind.name == kind:
            storage = step.out.storage.memory()
            nan = np.full(storage.elements(), np.nan, np.float32)
            with device.lock:
                device.upload(storage.buffer, nan, blocking=True, what="NaN", mapped=False)


def skip_without_slice_writers(device) -> None:
    """A Dense writes its slice of a concatenation through R_VIEW, which the OpenCL kernels have and
    the GL ones do not: on a GL device the concat kernel runs (the graph equivalence suite checks it)."""
    if device.backend != "opencl":
        pytest.skip(
            f"slices of a concatenation are written in place by OpenCL kernels only ({device.name} is "
            f"a {device.backend} device)"
        )


def two_dense_concat(units=(5, 3), inputs=8):
    x = Input((inputs,), name="x")
    parts = [Dense(u, activation=a, name=f"p{i}")(x) for i, (u, a) in enumerate(zip(units, ("linear", "relu")))]
    cat = Concatenate(name="cat")(parts)
    return Functional(x, [Dense(4, name="out")(cat), cat])  # the concatenation is downloaded too


@pytest.mark.parametrize("batch", BATCHES)
def test_a_concatenate_of_dense_results_launches_no_concat_kernel(device, rng, batch):
    skip_without_slice_writers(device)
    model = two_dense_concat()
    layers = {layer.name: layer for layer in model.layers}
    x = rng.uniform(-1, 1, (batch, 8)).astype(np.float32)
    cat = np.concatenate([dense_np(layers["p0"], x), dense_np(layers["p1"], x)], axis=-1)
    plan = model.plan(batch, device)
    assert launched(plan, "concat") == 0, [r["kernel"] for r in plan.describe()]
    writers = [s for s in plan.steps if s.kind.name == "matmul" and s.out.storage.view is not None]
    assert [s.layers[0].name for s in writers] == ["p0", "p1"]
    poison(device, plan, "concat")
    got = model.predict(x)
    assert_close(got[0], dense_np(layers["out"], cat))
    assert_close(got[1], cat)
    # the concatenation's buffer (live to the end: an output): the values where Keras has them,
    # every padding float exactly 0
    result = next(s for s in plan.steps if s.kind.name == "concat").out
    rows, cols = result.storage.padded
    buffer = np.empty(rows * cols, np.float32)
    with device.lock:
        device.download(result.storage.buffer, buffer, blocking=True, what="the concatenation", mapped=False)
    matrix = buffer.reshape(rows, cols) if str(result.storage.layout) == "R" else buffer.reshape(cols, rows).T
    assert_close(matrix[:8, :batch].T, cat)
    assert not matrix[8:].any() and not matrix[:, batch:].any()


@pytest.mark.parametrize("batch", BATCHES)
def test_an_input_no_kernel_writes_keeps_its_concat_launch_beside_views(device, rng, batch):
    skip_without_slice_writers(device)
    x, t = Input((6,), name="x"), Input((3,), name="t")
    d = Dense(4, activation="relu", name="d")
    out = Dense(2, name="out")(Concatenate(name="cat")([d(x), t]))
    model = Functional([x, t], out)
    xs, ts = (rng.uniform(-1, 1, (batch, n)).astype(np.float32) for n in (6, 3))
    plan = model.plan(batch, device)
    assert launched(plan, "concat") == 1  # the model input's slice is copied
    assert [s.view for s in plan.steps if s.kind.name == "concat"] == [True, False]
    poison(device, plan, "concat")
    want = dense_np(out.node.layer, np.concatenate([dense_np(d, xs), ts], axis=-1))
    assert_close(model.predict([xs, ts]), want)
    kernels, _, _ = model._kernels(batch)
    assert kernels["cat"].startswith("concat") and "writes its slice" in kernels["d"]


@pytest.mark.parametrize("batch", BATCHES)
def test_a_concat_input_read_elsewhere_too_is_copied_and_stays_readable(device, rng, batch):
    skip_without_slice_writers(device)
    x = Input((6,), name="x")
    a, b = Dense(5, name="a")(x), Dense(3, name="b")(x)
    cat = Concatenate(name="cat")([a, b])
    side = Dense(2, name="side")(a)  # reads a after the concatenation
    model = Functional(x, [Dense(2, name="out")(cat), side])
    layers = {layer.name: layer for layer in model.layers}
    xs = rng.uniform(-1, 1, (batch, 6)).astype(np.float32)
    plan = model.plan(batch, device)
    assert [s.view for s in plan.steps if s.kind.name == "concat"] == [False, True]
    av = dense_np(layers["a"], xs)
    got = model.predict(xs)
    assert_close(got[0], dense_np(layers["out"], np.concatenate([av, dense_np(layers["b"], xs)], axis=-1)))
    assert_close(got[1], dense_np(layers["side"], av))


def test_a_concatenate_on_another_axis_keeps_its_kernels(device, rng):
    x = Input((4, 6), name="x")
    parts = [Dense(6, name=f"p{i}")(x) for i in range(2)]
    model = Functional(x, Concatenate(axis=1, name="cat")(parts))
    xs = rng.uniform(-1, 1, (7, 4, 6)).astype(np.float32)
    plan = model.plan(7, device)
    assert launched(plan, "concat") == 2
    want = np.concatenate([dense_np(layer, xs) for layer in model.layers[:2]], axis=1)
    assert_close(model.predict(xs), want)


@pytest.mark.parametrize("batch", BATCHES)
def test_a_reshape_keeping_the_last_axis_is_a_view(device, rng, batch):
    model = Sequential([Dense(6, name="d"), Reshape((2, 3, 6), name="r"), Dense(2, name="o")])
    model.build((None, 6, 6))
    xs = rng.uniform(-1, 1, (batch, 6, 6)).astype(np.float32)
    plan = model.plan(batch, device)
    assert launched(plan, "reshape") == 0 and [r["view"] for r in plan.describe() if r["kind"] == "reshape"] == [True]
    want = dense_np(model.layers[2], dense_np(model.layers[0], xs).reshape(batch, 2, 3, 6))
    assert_close(model.predict(xs), want)
    assert model._kernels(batch)[0]["r"] == "view (no copy)"


@pytest.mark.parametrize("batch", BATCHES)
def test_a_reshape_after_a_kernel_that_pads_its_rows_is_still_a_view(device, rng, batch, monkeypatch):
    """With the GPU's defaults (the device's kind pretended), the small-batch kernels pad a layer's
    units to their work-group's rows (6 -> 64): the reshape's result is padded as its input, the next
    matmul reads the larger K (its weights padded with zeros), and nothing is copied."""
    if device.backend != "opencl":
        pytest.skip("the GPU defaults' kernels run on OpenCL devices")
    monkeypatch.setattr(type(device), "kind", property(lambda self: "gpu"))
    model = Sequential([Dense(6, name="d"), Reshape((2, 3, 6), name="r"), Dense(2, name="o")])
    model.build((None, 6, 6))
    xs = rng.uniform(-1, 1, (batch, 6, 6)).astype(np.float32)
    plan = model.plan(batch, device)
    (producer, reshape, reader) = plan.steps[-3:]
    assert launched(plan, "reshape") == 0 and reshape.view, [r["kernel"] for r in plan.describe()]
    assert reshape.out.storage.padded == producer.out.storage.padded == reader.inputs["b"].storage.padded
    want = dense_np(model.layers[2], dense_np(model.layers[0], xs).reshape(batch, 2, 3, 6))
    assert_close(model.predict(xs), want)


def test_a_flatten_of_a_tensor_in_keras_order_is_a_view_and_of_a_row_major_one_a_copy(device, rng):
    flat = Sequential([Activation("tanh"), Flatten(name="f"), Dense(3)])
    flat.build((None, 5, 7))
    x = rng.uniform(-1, 1, (1, 5, 7)).astype(np.float32)
    plan = flat.plan(1, device)
    assert launched(plan, "reshape") == 0 and any(s.view for s in plan.steps if s.kind.name == "reshape")
    assert_close(flat.predict(x), dense_np(flat.layers[2], np.tanh(x.astype(np.float64)).reshape(1, 35)))
    moved = Sequential([Dense(6), Flatten(), Dense(3)])  # a row-major result of 6 rows read as 24 rows
    moved.build((None, 4, 6))
    x = rng.uniform(-1, 1, (7, 4, 6)).astype(np.float32)
    plan = moved.plan(7, device)
    if str(plan.steps[[s.kind.name for s in plan.steps].index("matmul")].out.storage.layout) != "C":
        assert launched(plan, "reshape") == 1
    assert_close(moved.predict(x), dense_np(moved.layers[2], dense_np(moved.layers[0], x).reshape(7, 24)))


@pytest.mark.parametrize("batch", BATCHES)
def test_a_reshape_written_in_place_while_its_input_is_read_later_stays_a_copy(device, rng, batch):
    x = Input((6,), name="x")
    h = Dense(6, name="h")(x)
    r = Reshape((1, 6), name="r")(h)  # the same matrix as h ...
    a = Activation("tanh", name="act")(r)  # ... written in place ...
    out = Concatenate(name="cat")([Flatten(name="f")(a), h])  # ... while h is read after it
    model = Functional(x, out)
    xs = rng.uniform(-1, 1, (batch, 6)).astype(np.float32)
    plan = model.plan(batch, device)
    assert not next(s for s in plan.steps if s.kind.name == "reshape" and s.layers[0].name == "r").view
    hv = dense_np(model.layers[0], xs)
    assert_close(model.predict(xs), np.concatenate([np.tanh(hv), hv], axis=-1))


#: kernels that write R through R_AT, in both orders (R row-major: KERAS_ORDER 0; C: 1), at
#: batches their preconditions take (gemm_tiled: 16 samples or more; gemv: up to NB)
TILED = {"MWG": 32, "NWG": 16, "KWG": 16, "MDIMC": 8, "NDIMC": 8, "VW": 2, "LOCAL": 1, "STRIDED": 1}
WRITERS = [
    ("gemm_tiled", TILED, 20),
    ("gemm_tiled_c", TILED, 20),
    ("gemm_tiled_c", TILED, 100),
    ("gemv_c", {"VW": 4, "WPT": 1, "MDIM": 2, "KSPLIT": 8, "NB": 8}, 1),
    ("gemv_c", {"VW": 4, "WPT": 1, "MDIM": 2, "KSPLIT": 8, "NB": 8}, 7),
    ("gemv_rows", {"VW": 4, "ROWS": 4, "THREADS": 32, "NB": 8}, 7),
    ("gemv_split_c", {"VW": 1, "MDIM": 4, "KSPLIT": 8, "SLICES": 4, "UNROLL": 1, "NB": 2}, 1),
    ("gemv_split_c", {"VW": 4, "MDIM": 16, "KSPLIT": 8, "SLICES": 16, "UNROLL": 1, "NB": 8}, 7),
]


@pytest.mark.parametrize("codename,config,batch", WRITERS, ids=[f"{w[0]}-{w[2]}" for w in WRITERS])
def test_every_slice_writer_writes_its_slice_in_its_order(device, rng, codename, config, batch):
    """The kernel chosen with use() writes each slice of the concatenation (the padding rows of
    its result to the spare float) in its own order."""
    skip_without_slice_writers(device)
    from malinn.choice import kernel_choice

    try:
        kernel_choice.use("matmul", codename, device, config)
        model = two_dense_concat(units=(5, 11), inputs=9)
        layers = {layer.name: layer for layer in model.layers}
        x = rng.uniform(-1, 1, (batch, 9)).astype(np.float32)
        plan = model.plan(batch, device)
        assert launched(plan, "concat") == 0, [r["kernel"] for r in plan.describe()]
        assert all(r["kernel"].startswith(codename) for r in plan.describe() if r["kind"] == "matmul")
        assert {str(s.out.storage.layout) for s in plan.steps if s.out.storage.view is not None} == {
            "C" if codename.endswith(("_c", "_rows")) else "R"
        }
        poison(device, plan, "concat")
        cat = np.concatenate([dense_np(layers["p0"], x), dense_np(layers["p1"], x)], axis=-1)
        got = model.predict(x)
        assert_close(got[1], cat)
        assert_close(got[0], dense_np(layers["out"], cat))
    finally:
        kernel_choice.forget(device)
