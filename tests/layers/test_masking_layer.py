"""Keras's Masking layer and the masks of merges of differently masked inputs: numpy references on
odd shapes on every device, and Keras's own outputs for models saved by Keras 3 and tf_keras
(tests/layers/masking_zoo.py, run in a child process: TensorFlow never shares this one)."""

import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import built_zoo

import malinn
from malinn.layers import Add, Concatenate, Dense, Embedding, GlobalAveragePooling1D, Masking, SimpleRNN

sys.path.insert(0, str(Path(__file__).parent))
import recurrent_reference as ref  # noqa: E402
from masking_zoo import MODELS  # noqa: E402
from zoo_files import GENERATIONS  # noqa: E402


def _close(got, want):
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.nanmax(np.abs(want)))))


def _random_weights(layer, rng, scale=0.5):
    weights = [rng.uniform(-scale, scale, w.shape).astype(np.float32) for w in layer.get_weights()]
    layer.set_weights(weights)
    return weights


def _masked(rng, shape, value):
    """Random values with masked positions: a whole sample, single steps, and a step where one
    feature alone equals ``value`` (kept)."""
    x = rng.standard_normal(shape).astype(np.float32)
    if len(shape) > 2:
        x[0, ..., 0, :] = value
    if shape[0] > 1:
        x[1] = value
    if shape[0] > 2 and len(shape) > 2:
        x[2, -1] = value
        x[2, 0, ..., 0] = value
    return x


@pytest.mark.parametrize("value", [0.0, -1.5])
@pytest.mark.parametrize("shape", [(3, 7, 3), (1, 1, 1), (4, 2, 5, 3), (5, 4), (1, 13)], ids=str)
def test_masking_output_equals_numpy(device, shape, value):
    """``x * any(x != value, axis=-1, keepdims=True)`` on ranks 2 to 4, batch 1, one feature."""
    x = malinn.Input(shape[1:])
    model = malinn.Functional(x, Masking(mask_value=value)(x))
    xs = _masked(np.random.default_rng(len(shape)), shape, value)
    want = xs * (xs != value).any(-1, keepdims=True)
    _close(model.predict(xs, verbose=0), want)


@pytest.mark.parametrize("shape", [(3, 6, 2), (1, 1, 3), (2, 13, 1)], ids=str)
def test_masking_mask_reaches_recurrent_and_pooling(device, shape):
    """The mask skips steps in a SimpleRNN and the masked mean (all masked: NaN, Keras's 0 / 0)."""
    batch, steps, features = shape
    rng = np.random.default_rng(steps)
    x = malinn.Input((steps, features))
    masked = Masking(mask_value=0.5)(x)
    rnn = SimpleRNN(3, return_sequences=True)
    model = malinn.Functional(x, [rnn(masked), GlobalAveragePooling1D()(Dense(2)(masked))])
    kernel, recurrent, bias = _random_weights(rnn, rng)
    dense_kernel, dense_bias = _random_weights(_dense(model), rng)
    xs = _masked(rng, shape, 0.5)
    kept = (xs != 0.5).any(-1)
    y = xs * kept[..., None]
    want_rnn = ref.recurrent("simple_rnn", y, kernel, recurrent, bias, return_sequences=True, mask=kept)[0]
    h = y @ dense_kernel + dense_bias
    with np.errstate(invalid="ignore"):
        want_mean = (h * kept[..., None]).sum(1) / kept[..., None].sum(1)
    got_rnn, got_mean = model.predict(xs, verbose=0)
    _close(got_rnn, want_rnn)
    _close(got_mean, want_mean)


def _dense(model):
    return next(layer for layer in model.layers if isinstance(layer, Dense))


@pytest.mark.parametrize("rule", ["and", "or"])
def test_two_embedding_masks_merge(device, rule):
    """An Add of two Embeddings of different masks: the mean over the steps both (either) keep."""
    rng = np.random.default_rng(3)
    a, b = malinn.Input((6,)), malinn.Input((6,))
    ea, eb = Embedding(5, 2, mask_zero=True), Embedding(5, 2, mask_zero=True)
    add = Add()
    add.keras_mask_merge = rule
    model = malinn.Functional([a, b], GlobalAveragePooling1D()(add([ea(a), eb(b)])))
    ta, tb = _random_weights(ea, rng)[0], _random_weights(eb, rng)[0]
    xa = rng.integers(0, 5, (4, 6)).astype(np.float32)
    xb = rng.integers(0, 5, (4, 6)).astype(np.float32)
    xa[1], xb[1, :3] = 0, 0
    xb[2] = 0
    keep = (xa != 0) & (xb != 0) if rule == "and" else (xa != 0) | (xb != 0)
    h = ref.embedding(xa, ta) + ref.embedding(xb, tb)
    with np.errstate(invalid="ignore"):
        want = (h * keep[..., None]).sum(1) / keep[..., None].sum(1)
    _close(model.predict([xa, xb], verbose=0), want)


def test_concatenated_masks_along_features_and_steps(device):
    """A Masking branch beside an Embedding branch (features: the masks ANDed), and two Embeddings
    joined along the steps (their masks joined)."""
    rng = np.random.default_rng(4)
    a, b, c = malinn.Input((5, 2)), malinn.Input((5,)), malinn.Input((3,))
    emb, emb2 = Embedding(6, 2, mask_zero=True), Embedding(6, 2, mask_zero=True)
    features = Concatenate()([Masking(0.25)(a), emb(b)])
    steps = Concatenate(axis=1)([emb(b), emb2(c)])
    model = malinn.Functional([a, b, c], [GlobalAveragePooling1D()(features), GlobalAveragePooling1D()(steps)])
    table, table2 = _random_weights(emb, rng)[0], _random_weights(emb2, rng)[0]
    xa = _masked(rng, (3, 5, 2), 0.25)
    xb = rng.integers(0, 6, (3, 5)).astype(np.float32)
    xc = rng.integers(0, 6, (3, 3)).astype(np.float32)
    xb[0, 0], xc[1] = 0, 0
    kept_a = (xa != 0.25).any(-1)
    h = np.concatenate([xa * kept_a[..., None], ref.embedding(xb, table)], -1)
    keep = kept_a & (xb != 0)
    s = np.concatenate([ref.embedding(xb, table), ref.embedding(xc, table2)], 1)
    keep_s = np.concatenate([xb != 0, xc != 0], 1)
    with np.errstate(invalid="ignore"):
        want = (h * keep[..., None]).sum(1) / keep[..., None].sum(1)
        want_s = (s * keep_s[..., None]).sum(1) / keep_s[..., None].sum(1)
    got, got_s = model.predict([xa, xb, xc], verbose=0)
    _close(got, want)
    _close(got_s, want_s)


@pytest.mark.parametrize("shape", [(3, 5, 2, 3), (1, 1, 1, 1), (2, 13, 3, 2)], ids=["b3_t5", "b1_t1", "b2_t13"])
def test_steps_concatenated_with_an_unmasked_input(device, shape):
    """An Embedding's steps joined with an input that has no mask: the joined mask keeps every
    step of that input, a step of zeros too (as both Kerases compute it)."""
    batch, steps, other, width = shape
    rng = np.random.default_rng(steps)
    a, b = malinn.Input((steps,)), malinn.Input((other, width))
    emb = Embedding(6, width, mask_zero=True)
    model = malinn.Functional([a, b], GlobalAveragePooling1D()(Concatenate(axis=1)([emb(a), b])))
    table = _random_weights(emb, rng)[0]
    xa = rng.integers(0, 6, (batch, steps)).astype(np.float32)
    xa[0] = 0
    xb = rng.standard_normal((batch, other, width)).astype(np.float32)
    xb[0, 0] = 0
    keep = np.concatenate([xa != 0, np.ones((batch, other), bool)], 1)
    h = np.concatenate([ref.embedding(xa, table), xb], 1)
    _close(model.predict([xa, xb], verbose=0), (h * keep[..., None]).sum(1) / keep[..., None].sum(1))


def test_masking_validation_and_config():
    with pytest.raises(ValueError, match="mask_value must be finite"):
        Masking(float("inf"))
    with pytest.raises(ValueError, match="mask_value must be a number"):
        Masking("zero")
    layer = Masking(mask_value=2, name="m")
    assert Masking.from_config(layer.get_config()).get_config() == {"name": "m", "mask_value": 2.0}
    assert layer.compute_output_shape((None, 4, 3)) == (None, 4, 3)
    add = Add(name="a")
    add.keras_mask_merge = "or"
    assert Add.from_config(add.get_config()).keras_mask_merge == "or"
    assert Add.from_config(Add(name="b").get_config()).keras_mask_merge == "and"


def test_a_rank4_mask_that_does_not_fit_is_refused():
    """Keras hands a (batch, steps, rows) mask through TimeDistributed(Flatten) to an output it
    does not fit: malinn says so rather than drop it."""
    from malinn.layers import Flatten

    x = malinn.Input((4, 3, 2))
    flat = Flatten.from_keras_time_distributed({}, _context("flat", (None, 4, 3, 2)))
    flat.keras_passes_mask = True
    model = malinn.Functional(x, flat(Masking()(x)))
    with pytest.raises(
        ValueError, match=r"'flat'.* mask of shape \(None, 4, 3\) on to its output of shape \(None, 4, 6\)"
    ):
        model.predict(np.ones((2, 4, 3, 2), np.float32), verbose=0)


def _context(name, shape):
    from malinn.layers.keras_config import KerasContext

    return KerasContext(class_name="Flatten", name=name, keras_major=3, input_shape=shape, has_weights=False)


# ---------------------------------------------------------------------------------------------- Keras
@pytest.fixture(scope="session")
def masking_zoo(tmp_path_factory):
    """The zoo's folder (tests/layers/masking_zoo.py run once per test run in a child process)."""
    return built_zoo(tmp_path_factory, Path(__file__).with_name("masking_zoo.py"), "done", keep="MALINN_MASKING_ZOO")


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("key", MODELS)
def test_equals_keras(masking_zoo, device, key, generation, suffix):
    data = np.load(masking_zoo / generation / f"{key}.npz")
    xs = [data[k] for k in sorted(k for k in data.files if k.startswith("x"))]
    path = str(masking_zoo / generation / f"{key}{suffix}")
    model = malinn.load_model(path)
    _close(model.predict(xs if len(xs) > 1 else xs[0], verbose=0), data["y"])
