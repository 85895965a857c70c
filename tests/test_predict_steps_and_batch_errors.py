"""predict's ``steps`` as Keras 2 and 3 read it, the warning when the input holds fewer batches than
``steps`` asks for, the end of the progress bar of an iterable of unknown length, and errors of an
iterable's batch that name the batch beside the layer and the shapes."""

import re
import warnings

import numpy as np
import pytest
from support import assert_close
from support import small_dense_model as small_model
from support import small_dense_reference as reference
from support import two_input_model as two_inputs


def test_steps_without_batch_size_predicts_every_sample_in_that_many_batches(device):
    """Keras 2 and 3 take ``batch_size = ceil(samples / steps)`` where an array comes with ``steps``
    and no ``batch_size`` (tf_keras and keras 3.x: ``predict(x_of_5000, steps=2)`` returns 5000
    rows), not batches of 32."""
    model = small_model()
    x = np.random.default_rng(1).uniform(-1, 1, (100, 37)).astype(np.float32)
    before = device.counters["downloads"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every sample is there: no warning
        y = model.predict(x, steps=3, verbose=0)
    assert y.shape == (100, 5)
    assert device.counters["downloads"] - before == 3  # three passes of 34 samples: one download each
    np.testing.assert_array_equal(y, model.predict(x, batch_size=34, verbose=0))
    assert_close(y, reference(model, x))
    # with batch_size: steps batches of it, as before
    assert_close(model.predict(x, steps=2, batch_size=10, verbose=0), reference(model, x[:20]))


def test_steps_beyond_the_data_warns_as_keras_and_returns_what_there_is(device):
    model = small_model()
    x = np.random.default_rng(2).uniform(-1, 1, (50, 37)).astype(np.float32)
    want = reference(model, x)
    message = "predict was asked for steps=8 batches, but the input ran out of data after 5"
    with pytest.warns(UserWarning, match=re.escape(message)) as caught:
        y = model.predict(x, steps=8, batch_size=10, verbose=0)
    assert caught[0].filename == __file__  # the warning points at the caller's line
    assert_close(y, want)
    with pytest.warns(UserWarning, match="steps=8 batches, but the input ran out of data after 3"):
        y = model.predict((x[i : i + 20] for i in range(0, 50, 20)), steps=8, verbose=0)
    assert_close(y, want)
    with pytest.warns(UserWarning, match="steps=60 batches, but the input ran out of data after 50"):
        assert_close(model.predict(x, steps=60, verbose=0), want)  # without batch_size: one sample a batch
    with pytest.warns(UserWarning, match="steps=4 batches, but the input ran out of data after 3"):
        assert_close(model.predict(x[:9], steps=4, verbose=0), want[:9])  # batches of ceil(9 / 4) = 3: three
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exactly the batches there are: no warning
        assert_close(model.predict((x[i : i + 20] for i in range(0, 50, 20)), steps=3, verbose=0), want)
        assert_close(model.predict(x, steps=5, batch_size=10, verbose=0), want)


def test_the_bar_of_an_iterable_of_unknown_length_ends_at_the_steps_seen(capsys):
    """Keras's progress bar sets an unknown target to the steps seen at the end: ``3/3 ━━━...``."""
    model = small_model()
    x = np.random.default_rng(6).uniform(-1, 1, (100, 37)).astype(np.float32)
    y = model.predict((x[i : i + 40] for i in range(0, 100, 40)), verbose=2)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("3/3 - ") and out[0].endswith("/step"), out
    assert_close(y, reference(model, x))
    model.predict((x[i : i + 40] for i in range(0, 100, 40)), verbose=1)
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("3/3 " + "━" * 20 + " ")


def test_a_bad_batch_of_an_iterable_is_named_with_the_layer_and_the_shapes(device):
    model = small_model()
    x = np.zeros((10, 37), np.float32)
    expected = r"^batch 2 of the iterable: Input of layer .* expected shape \(None, 37\), found shape \(10, 36\)$"
    with pytest.raises(ValueError, match=expected):  # with several devices: test_predict_sources.py
        model.predict(iter([x, x, np.zeros((10, 36), np.float32)]))
    with pytest.raises(ValueError, match=r"^batch 1 of the iterable: a batch of an iterable is unpacked as Keras"):
        model.predict(iter([(x,), (x, x, x, x)]))

    pair = two_inputs()
    a, b = np.zeros((5, 6), np.float32), np.zeros((5, 4), np.float32)
    with pytest.raises(
        ValueError, match=r"^batch 1 of the iterable: .*takes inputs named \['a', 'b'\]; missing \['b'\]"
    ):
        pair.predict(iter([{"a": a, "b": b}, {"a": a}]))
    with pytest.raises(ValueError, match=r"^batch 0 of the iterable: .*different numbers of samples \(5, 3\)"):
        pair.predict(iter([{"a": a, "b": b[:3]}]))
    w = pair.get_weights()  # the good batches of the same source predict as they should
    assert_close(pair.predict(iter([{"a": a + 1, "b": b - 1}])), (a + 1) @ w[0] + w[1] + (b - 1) @ w[2] + w[3])
