"""Functional graphs: merges on every rank and axis against numpy, the forms of predict, shared
layers, several outputs, saving, summary, and what the plan costs (no copy, no extra launch)."""

import numpy as np
import pytest
from support import assert_close, summary_rows

import malinn
from malinn import Functional, Input, Sequential
from malinn.layers import (
    Activation,
    Add,
    Average,
    BatchNormalization,
    Concatenate,
    Conv2D,
    Dense,
    Dot,
    Maximum,
    MaxPooling2D,
    Minimum,
    Multiply,
    Subtract,
    UpSampling2D,
)

pytestmark = pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)

NUMPY = {
    Add: lambda xs: sum(xs[1:], xs[0]),
    Subtract: lambda xs: xs[0] - xs[1],
    Multiply: lambda xs: np.prod(np.broadcast_arrays(*xs), axis=0),
    Average: lambda xs: sum(xs[1:], xs[0]) / len(xs),
    Maximum: lambda xs: np.maximum.reduce(np.broadcast_arrays(*xs)),
    Minimum: lambda xs: np.minimum.reduce(np.broadcast_arrays(*xs)),
}
SHAPES = {2: (6,), 3: (3, 6), 4: (2, 3, 4)}


def dense_np(layer, x):
    kernel, bias = layer.get_weights()
    out = x.astype(np.float64) @ kernel + bias
    return np.maximum(out, 0) if layer.activation == "relu" else out


def inputs(shapes, batch, scale, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-scale, scale, (batch,) + tuple(s)).astype(np.float32) for s in shapes]


def keras_close(got, want):
    """max |got - want| <= 1e-5 x max(1, max |want|), the equivalence tests' tolerance."""
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape and got.dtype == np.float32
    scale = max(1.0, float(np.abs(want).max()))
    assert float(np.abs(got - want).max()) <= 1e-5 * scale


@pytest.mark.parametrize("merge", list(NUMPY), ids=lambda c: c.__name__)
@pytest.mark.parametrize("rank", [2, 3, 4])
@pytest.mark.parametrize("batch", [1, 7, 100])
@pytest.mark.parametrize("scale", [1.0, 1000.0], ids=["unit", "large"])
def test_elementwise_merges_match_numpy(device, merge, rank, batch, scale):
    shape = SHAPES[rank]
    x, y = Input(shape, name="x"), Input(shape, name="y")
    d = Dense(shape[-1], name="d")
    model = Functional([x, y], merge(name="m")([d(x), y]))
    xs = inputs([shape, shape], batch, scale)
    keras_close(model.predict(xs), NUMPY[merge]([dense_np(d, xs[0]), xs[1].astype(np.float64)]))


@pytest.mark.parametrize(
    "merge, want",
    [
        (Maximum, [np.nan, np.nan, np.nan, 1.0, 1.0, 2.0, 7.0, np.nan]),
        (Minimum, [np.nan, np.nan, np.nan, -1.0, 0.5, 1.0, 1.0, np.nan]),
    ],
)
def test_maximum_and_minimum_give_nan_for_a_nan_operand_as_tensorflow(device, merge, want):
    """tf.maximum and tf.minimum (Keras 3.15 on TensorFlow 2.x) give NaN where either operand is NaN,
    where OpenCL's fmax and fmin would give the other."""
    x, y = Input((8,), name="x"), Input((8,), name="y")
    model = Functional([x, y], merge()([x, y]))
    xv = np.array([[np.nan, -np.inf, np.inf, -1.0, 0.5, 2.0, 7.0, np.nan]], np.float32)
    yv = np.array([[np.nan, np.nan, np.nan, 1.0, 1.0, 1.0, 1.0, 3.0]], np.float32)
    np.testing.assert_array_equal(model.predict([xv, yv]), [want])
    np.testing.assert_array_equal(model.predict([yv, xv]), [want])


BROADCASTS = [
    [(3, 6), (1, 6)],
    [(1, 6), (3, 6)],
    [(3, 6), (6,)],
    [(6,), (2, 3, 6)],
    [(3, 1), (1, 4)],
    [(2, 3, 4), (3, 1), (1, 4)],
]


@pytest.mark.parametrize(
    "merge,shapes",
    [
        pytest.param(merge, shapes, id=f"{merge.__name__}-" + "-".join("x".join(map(str, t)) for t in shapes))
        for merge in NUMPY
        for shapes in BROADCASTS
        if merge is not Subtract or len(shapes) == 2
    ],
)
def test_merges_broadcast_like_keras(device, merge, shapes):
    tensors = [Input(s, name=f"i{k}") for k, s in enumerate(shapes)]
    model = Functional(tensors, merge()(tensors))
    xs = inputs(shapes, 5, 1.0, seed=3)
    rank = max(len(s) for s in shapes)
    padded = [x.reshape((5,) + (1,) * (rank - x.ndim + 1) + x.shape[1:]) for x in xs]  # Keras: axes after the batch
    keras_close(model.predict(xs), NUMPY[merge]([p.astype(np.float64) for p in padded]))


@pytest.mark.parametrize("rank,axis", [(2, -1), (2, 1), (3, 1), (3, 2), (3, -1), (4, 1), (4, 2), (4, 3), (4, -2)])
@pytest.mark.parametrize("batch", [1, 7, 100])
def test_concatenate_any_axis_matches_numpy(device, rank, axis, batch):
    shape = SHAPES[rank]
    other = list(shape)
    other[axis - 1 if axis > 0 else axis] += 2
    x, y = Input(shape, name="x"), Input(tuple(other), name="y")
    d = Dense(shape[-1], activation="relu", name="d")
    head = Dense(3, name="head")
    model = Functional([x, y], [head(Concatenate(axis=axis)([d(x), y])), Concatenate(axis=axis)([y, x, d(x)])])
    xs = inputs([shape, other], batch, 1.0, seed=1)
    cat = np.concatenate([dense_np(d, xs[0]), xs[1]], axis=axis)
    got = model.predict(xs)
    keras_close(got[0], dense_np(head, cat))
    keras_close(got[1], np.concatenate([xs[1], xs[0], dense_np(d, xs[0])], axis=axis))


@pytest.mark.parametrize(
    "sx,sy,axes,spec",
    [
        ((6,), (6,), 1, "bk,bk->b"),
        ((3, 6), (4, 6), (2, 2), "bpk,bqk->bpq"),
        ((3, 6), (3, 5), (1, 1), "bkp,bkq->bpq"),
        ((3, 6), (5, 3), (1, 2), "bkp,bqk->bpq"),
        ((3, 6), (6,), (2, 1), "bpk,bk->bp"),
        ((6,), (6, 4), (1, 1), "bk,bkq->bq"),
        ((3, 6), (4, 6), -1, "bpk,bqk->bpq"),
    ],
)
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("batch", [1, 7, 100])
def test_dot_matches_numpy(device, sx, sy, axes, spec, normalize, batch):
    x, y = Input(sx, name="x"), Input(sy, name="y")
    model = Functional([x, y], Dot(axes, normalize=normalize)([x, y]))
    a, b = (v.astype(np.float64) for v in inputs([sx, sy], batch, 1.0, seed=2))
    if normalize:
        ax, ay = (axes, axes) if isinstance(axes, int) else axes
        ax, ay = ax % a.ndim, ay % b.ndim
        a = a / np.linalg.norm(a, axis=ax, keepdims=True)
        b = b / np.linalg.norm(b, axis=ay, keepdims=True)
    want = np.einsum(spec, a, b)
    want = want.reshape(batch, 1) if want.ndim == 1 else want
    keras_close(model.predict([a.astype(np.float32), b.astype(np.float32)]), want)


def residual(seed=0):
    x = Input((8,), name="x")
    d1, d2 = Dense(16, activation="relu", name="d1"), Dense(8, name="d2")
    y = Activation("relu", name="act")(Add(name="res")([x, d2(d1(x))]))
    model = Functional(x, Dense(3, name="head")(y), name="residual")
    rng = np.random.default_rng(seed)
    model.set_weights([w + rng.standard_normal(w.shape).astype(np.float32) for w in model.get_weights()])
    return model


def residual_np(model, x):
    d1, d2, head = (model.layers[i] for i in (0, 1, 4))
    h = np.maximum(x + dense_np(d2, dense_np(d1, x)), 0)
    return dense_np(head, h)


def test_residual_block_costs_no_copy_and_fuses_its_relu(device, rng):
    model = residual()
    x = rng.uniform(-1, 1, (9, 8)).astype(np.float32)
    assert_close(model.predict(x), residual_np(model, x))
    plan = model.plan(9, device)
    kinds = [step.kind.name for step in plan.steps]
    # the Add works in place in d2's result (x is read by d1 before it), the relu in its kernel
    assert [k for k in kinds if k != "relayout"] == ["matmul", "matmul", "merge", "matmul"], kinds
    # re-layouts only where the same Dense layers as a Sequential need them (the input into the
    # kernel's layout, the output into Keras's order): the merge adds none
    chain = malinn.Sequential([Dense(16), Dense(8), Dense(3)])
    chain.build((None, 8))
    assert kinds.count("relayout") == [s.kind.name for s in chain.plan(9, device).steps].count("relayout")
    before = dict(device.counters)
    model.predict(x)
    assert device.counters["launches"] - before["launches"] == len(kinds)
    assert (
        device.counters["uploads"] - before["uploads"] == 1 and device.counters["downloads"] - before["downloads"] == 1
    )


def test_merge_operand_read_later_is_not_overwritten(device, rng):
    x = Input((4,), name="x")
    d = Dense(4, name="d")
    h = d(x)
    s = Add(name="s")([h, x])  # h is read again below and is an output: the sum needs its own buffer
    model = Functional(x, [s, Multiply(name="m")([h, s]), h])
    xv = rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    hv = dense_np(d, xv)
    got = model.predict(xv)
    assert_close(got[0], hv + xv)
    assert_close(got[1], hv * (hv + xv))
    assert_close(got[2], hv)


def test_predict_takes_an_array_a_list_or_a_dict(device, rng):
    x, t = Input((5,), name="numeric"), Input((3,), name="category")
    model = Functional([x, t], Dense(2, name="head")(Concatenate()([Dense(4, activation="relu")(x), t])))
    xv, tv = rng.uniform(-1, 1, (6, 5)), np.eye(3)[rng.integers(0, 3, 6)]
    y = model.predict([xv, tv])
    assert y.shape == (6, 2) and y.dtype == np.float32
    np.testing.assert_array_equal(model.predict({"category": tv, "numeric": xv}), y)
    np.testing.assert_array_equal(model.predict((xv, tv)), y)
    np.testing.assert_array_equal(model.predict([xv, tv], verbose=0), y)  # as Keras code calls it
    with pytest.raises(ValueError, match="missing \\['category'\\]"):
        model.predict({"numeric": xv})
    with pytest.raises(ValueError, match="takes 2 input"):
        model.predict([xv])
    with pytest.raises(ValueError, match="'category'.*expected shape \\(None, 3\\)"):
        model.predict([xv, tv[:, :2]])
    with pytest.raises(ValueError, match="different numbers of samples"):
        model.predict([xv, tv[:4]])
    single = Functional(x, Dense(2)(x))
    np.testing.assert_array_equal(single.predict([xv]), single.predict(xv))
    np.testing.assert_array_equal(single.predict(list(xv)), single.predict(xv))  # a list of samples
    with pytest.raises(ValueError, match=r"takes 1 input\(s\) \(numeric\), got a list of 2"):
        single.predict([xv, xv])
    with pytest.raises(ValueError, match="The data given for input 'numeric' could not be read as an array"):
        single.predict([[list(xv[0]), list(xv[0][:-1])]])  # a ragged batch inside the list


def test_several_outputs_come_back_as_a_list_or_a_dict(device, rng):
    x = Input((4,), name="x")
    a, b = Dense(3, name="a")(x), Dense(2, activation="relu", name="b")(x)
    xv = rng.uniform(-1, 1, (7, 4)).astype(np.float32)
    listed = Functional(x, [a, b]).predict(xv)
    assert isinstance(listed, list) and [y.shape for y in listed] == [(7, 3), (7, 2)]
    named = Functional(x, {"first": a, "second": b}).predict(xv)
    assert list(named) == ["first", "second"]
    np.testing.assert_array_equal(named["second"], listed[1])
    assert isinstance(Functional(x, [a]).predict(xv), np.ndarray)


def test_a_shared_layer_has_one_set_of_weights(device, rng):
    x, y = Input((6,), name="x"), Input((6,), name="y")
    shared = Dense(4, activation="relu", name="shared")
    model = Functional([x, y], Subtract()([shared(x), shared(y)]))
    assert model.layers.count(shared) == 1 and model.count_params() == 6 * 4 + 4
    xv, yv = rng.uniform(-1, 1, (5, 6)), rng.uniform(-1, 1, (5, 6))
    assert_close(model.predict([xv, yv]), dense_np(shared, xv) - dense_np(shared, yv))
    with pytest.raises(ValueError, match="was built for inputs of shape \\(None, 6\\)"):
        shared(Input((5,)))


def test_save_and_load_keep_the_graph_bit_for_bit(device, tmp_path, rng):
    x, t = Input((4, 6), name="x"), Input((6,), name="t")
    shared = Dense(6, name="shared")
    a, b = shared(x), shared(t)
    out = Concatenate(axis=1, name="cat")([Average()([a, x]), Dense(6, name="up")(Maximum()([a, Minimum()([x, b])]))])
    model = Functional([x, t], [out, Dot(axes=(2, 1), normalize=True)([a, b]), Multiply()([a, b])], name="g")
    xs = [rng.uniform(-1, 1, (7, 4, 6)).astype(np.float32), rng.uniform(-1, 1, (7, 6)).astype(np.float32)]
    want = model.predict(xs)
    loaded = malinn.load_model(model.save(tmp_path / "g.malinn"))
    assert type(loaded) is Functional and loaded.input_names == ["x", "t"] and loaded.name == "g"
    for got, expected in zip(loaded.predict(xs), want):
        np.testing.assert_array_equal(got, expected)
    assert [type(layer).__name__ for layer in loaded.layers] == [type(layer).__name__ for layer in model.layers]


def test_summary_shows_the_graph_like_keras(device):
    model = residual()
    lines = model.summary(print_fn=lambda text: None, show_kernels=True).splitlines()
    header = next(line for line in lines if line.startswith("Layer (type)"))
    assert "Connected to" in header and "Kernel" in header
    row = next(row for row in summary_rows("\n".join(lines)) if row["Layer (type)"] == "res (Add)")
    assert row["Output Shape"] == "(None, 8)" and row["Connected to"] == "x[0][0], d2[0][0]", row
    assert row["Kernel"].startswith("merge"), row
    assert any(line.startswith("x (InputLayer)") for line in lines)
    assert lines[-3] == f"Total params: {model.count_params()}"
    assert lines[-2].startswith("Weights on the device: ") and " in fp32 (1.000 of " in lines[-2]


def test_predict_layers_gives_every_call(device, rng):
    model = residual()
    x = rng.uniform(-1, 1, (4, 8)).astype(np.float32)
    outs = model.predict_layers(x)
    assert [o.shape for o in outs] == [(4, 16), (4, 8), (4, 8), (4, 8), (4, 3)]
    assert_close(outs[-1], model.predict(x))  # every layer kept: views and fusions differ, sums may round apart


def test_graph_errors_name_what_is_wrong():
    x, y = Input((4,), name="x"), Input((4,), name="y")
    with pytest.raises(ValueError, match="not among the model's inputs"):
        Functional(x, Add()([x, y]))
    with pytest.raises(ValueError, match="exactly 2 inputs"):
        Subtract()([x, y, x])
    with pytest.raises(ValueError, match="do not broadcast"):
        Add()([x, Input((3,))])
    with pytest.raises(ValueError, match="differ off axis"):
        Concatenate(axis=2)([Input((2, 3)), Input((3, 3))])
    with pytest.raises(ValueError, match="rank 2 or 3"):
        Dot(axes=3)([Input((2, 3, 4)), Input((2, 3, 4))])
    with pytest.raises(ValueError, match="call it on malinn.Input tensors"):
        Dense(2)(np.zeros((1, 4)))


def test_cli_predicts_and_summarises_a_graph_of_two_inputs(device, tmp_path, capsys, rng):
    from malinn.cli.commands import main

    x, t = Input((5,), name="numeric"), Input((3,), name="onehot")
    h = Concatenate(name="cat")([Dense(4, activation="relu", name="num")(x), t])
    model = Functional([x, t], [Dense(2, name="score")(h), Dense(1, name="aux")(h)], name="tabular")
    path = model.save(tmp_path / "tabular.malinn")
    xv, tv = rng.uniform(-1, 1, (6, 5)).astype(np.float32), np.eye(3, dtype=np.float32)[rng.integers(0, 3, 6)]
    np.savez(tmp_path / "in.npz", numeric=xv, onehot=tv)
    want = model.predict([xv, tv])  # first: a backend without the merge kernels skips the test here
    assert main(["predict", str(path), str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz") as out:
        got = {k: out[k] for k in out.files}
    assert sorted(got) == ["aux", "score"]
    np.testing.assert_array_equal(got["score"], want[0])
    np.testing.assert_array_equal(got["aux"], want[1])
    assert "numeric (6, 5), onehot (6, 3) -> score (6, 2), aux (6, 1)" in capsys.readouterr().out
    assert main(["predict", str(path), str(tmp_path / "in.npz"), "--key", "numeric"]) != 0
    assert "takes 2 inputs" in capsys.readouterr().err
    assert main(["summary", str(path), "--batch", "7"]) == 0
    text = capsys.readouterr().out
    rows = {row["Layer (type)"].split()[0]: row for row in summary_rows(text)}  # wrapped cells joined again
    assert rows["cat"]["Connected to"] == "num[0][0], onehot[0][0]", text
    assert rows["cat"]["Kernel"].startswith("concat"), text


@pytest.mark.parametrize("activation,params", [("relu", {}), ("tanh", {}), ("leaky_relu", {"negative_slope": 0.1})])
def test_an_activation_after_a_merge_runs_in_the_merge_kernel(device, rng, activation, params):
    from malinn.layers import LeakyReLU

    x, y = Input((5,), name="x"), Input((5,), name="y")
    act = LeakyReLU(0.1, name="act") if activation == "leaky_relu" else Activation(activation, name="act")
    model = Functional([x, y], act(Average(name="avg")([Dense(5, name="d")(x), y])))
    xv, yv = rng.uniform(-2, 2, (7, 5)).astype(np.float32), rng.uniform(-2, 2, (7, 5)).astype(np.float32)
    z = (dense_np(model.layers[0], xv) + yv) / 2
    want = {"relu": np.maximum(z, 0), "tanh": np.tanh(z), "leaky_relu": np.where(z < 0, 0.1 * z, z)}[activation]
    assert_close(model.predict([xv, yv]), want)
    kinds = [s.kind.name for s in model.plan(7, device).steps]
    assert "activation" not in kinds and kinds.count("merge") == 1
    row = next(r for r in model.plan(7, device).describe() if r["kind"] == "merge")
    assert row["layers"] == ["avg", "act"] and row["fused"] == [activation]


@pytest.mark.parametrize("codename", malinn.load_library().codenames("matmul"))
def test_merges_on_buffers_of_every_matmul_layout(device, codename, rng):
    """Copies and Concatenate buffers take the layout their readers want (Morton blocks too), padded
    to whole chunks of it: merges give numpy's answer whichever matmul kernel writes their inputs."""
    malinn.ops.use("matmul", codename, device)
    x, y = Input((3, 5), name="x"), Input((1, 5), name="y")
    dense, proj = Dense(5, name="d"), Dense(4, name="proj")
    d = dense(x)
    s = Activation("relu")(Add()([d, y]))  # d is an output too: the sum works on a copy
    c = Concatenate(axis=1)([s, x])
    model = Functional([x, y], [d, s, Concatenate()([proj(c), c])])
    xs = [rng.standard_normal((7,) + shape).astype(np.float32) for shape in ((3, 5), (1, 5))]
    got = model.predict(xs)
    dv = dense_np(dense, xs[0])
    sv = np.maximum(dv + xs[1], 0)
    cv = np.concatenate([sv, xs[0]], axis=1)
    for g, w in zip(got, [dv, sv, np.concatenate([dense_np(proj, cv), cv], axis=-1)]):
        assert_close(g, w)


def test_a_graph_too_large_for_one_allocation_runs_in_passes(device, monkeypatch, rng):
    """max_batch reads the graph's plan: passes of a few samples give what one pass gives. (A GPU's
    small-batch kernels bind a scratch buffer of a fixed size, larger than this graph's activations
    at a few samples: the limit stays above it, and the batch grows until its activations do not fit.)"""
    model = residual()
    fixed = max(model.activation_bytes(k, device)[0] for k in (1, 2, 4, 6, 8))
    n = 50
    while model.activation_bytes(n, device)[0] <= 2 * fixed:
        n *= 2
    x = rng.uniform(-1, 1, (n, 8)).astype(np.float32)
    whole = model.predict(x)
    monkeypatch.setattr(device, "max_allocation", max(fixed, model.activation_bytes(n // 4, device)[0]))
    assert model.max_batch(device) < n
    before = device.counters["downloads"]
    split = model.predict(x)
    assert device.counters["downloads"] - before > 1
    assert_close(split, whole)


def test_four_threads_predict_a_graph_like_one(device, rng):
    import threading

    x, t = Input((6,), name="x"), Input((3,), name="t")
    model = Functional([x, t], [Dense(4)(Concatenate()([Dense(5, activation="relu")(x), t])), Add()([x, x])])
    xs = [rng.uniform(-1, 1, (20, 6)).astype(np.float32), rng.uniform(-1, 1, (20, 3)).astype(np.float32)]
    want = model.predict(xs)
    results, errors = [None] * 4, []

    def work(i):
        try:
            results[i] = [model.predict(xs) for _ in range(5)]
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for runs in results:
        for got in runs:
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("precision", ["fp16-storage", "int8-weights"])
def test_a_graph_runs_its_dense_weights_in_the_precision_and_its_merges_in_float32(device, tmp_path, precision):
    """Functional(precision=...) reaches the matmuls (weights stored in it), the merges and
    Concatenate stay float32 kernels, and a saved graph keeps its precision bit for bit."""
    from malinn.library.precision import effective

    x, y = Input((6,), name="x"), Input((6,), name="y")
    d, e = Dense(6, activation="relu", name="d"), Dense(5, name="e")
    s = Add(name="add")([d(x), y])
    model = Functional([x, y], Concatenate(name="cat")([e(s), s]), precision=precision)
    assert model.precision == precision
    xs = inputs([(6,), (6,)], 9, 1.0)

    def forward(kind):
        (k1, b1), (k2, b2) = (layer.get_weights() for layer in (d, e))
        w1, w2 = (effective(k.T, kind).T.astype(np.float64) for k in (k1, k2))
        sv = np.maximum(xs[0] @ w1 + b1, 0) + xs[1]
        return np.concatenate([sv @ w2 + b2, sv], axis=-1)

    got = model.predict(xs)
    assert_close(got, forward(precision), rtol=1e-5)
    assert not np.array_equal(forward(precision), forward("fp32"))  # the precision changes the result
    steps = model.plan(9, device).describe()
    tagged = {r["kind"]: r["kernel"].endswith(f"[{precision}]") for r in steps if r["kind"] != "relayout"}
    assert tagged == {"matmul": True, "merge": False, "concat": False}
    loaded = malinn.load_model(model.save(tmp_path / "g.malinn"))
    assert type(loaded) is Functional and loaded.precision == precision
    np.testing.assert_array_equal(loaded.predict(xs), got)
    with pytest.raises(ValueError, match="precision"):
        Functional([x, y], s, precision="fp8")


def test_a_convolution_and_pooling_shared_by_two_image_sizes_compute_each_size(device, rng):
    """One Conv2D, MaxPooling2D and UpSampling2D called on 6 x 6 and 9 x 9 images (Keras allows it:
    their weights follow the channels alone): each call equals the same layers built for its size
    alone (the second call computed with the first size's geometry: errors up to 5.6e31)."""
    conv, pool, up = (
        Conv2D(2, 3, activation="relu", name="conv"),
        MaxPooling2D(2, name="pool"),
        UpSampling2D(2, name="up"),
    )
    small, big = Input((6, 6, 1), name="small"), Input((9, 9, 1), name="big")
    model = Functional([small, big], [up(pool(conv(small))), up(pool(conv(big)))])
    weights = [rng.standard_normal(w.shape).astype(np.float32) for w in conv.get_weights()]
    conv.set_weights(weights)
    xs = [rng.standard_normal((3, n, n, 1)).astype(np.float32) for n in (6, 9)]
    got = model.predict(xs)
    for x, y in zip(xs, got):
        alone = Sequential([Conv2D(2, 3, activation="relu"), MaxPooling2D(2), UpSampling2D(2)])
        alone.build((None,) + x.shape[1:])
        alone.layers[0].set_weights(weights)
        assert y.shape == alone.predict(x).shape
        assert_close(y, alone.predict(x))


def test_a_layer_laid_out_for_one_shape_is_not_shared_by_another(device):
    """A BatchNormalization on axis 1 built for (3, 4) samples, given (5, 4) ones by a second model:
    refused naming the layer and both shapes, and the first model still predicts (the second model
    had rewritten the layer's shape: the first then failed, the second raised numpy's error)."""
    norm = BatchNormalization(axis=1, name="rows")
    first = Sequential([norm])
    first.build((None, 3, 4))
    x = np.ones((2, 3, 4), np.float32)
    want = first.predict(x)
    with pytest.raises(
        ValueError,
        match=r"BatchNormalization 'rows' was built for inputs of shape \(None, 3, 4\), "
        r"but receives \(None, 5, 4\): its weights and axes are laid out",
    ):
        Sequential([norm]).build((None, 5, 4))
    np.testing.assert_array_equal(first.predict(x), want)
