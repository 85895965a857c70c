"""An output unpadded on the device (``Device.unpads_on_device``, malinn/plan/passes/output_padding.py):
an output whose buffer pads its features (a 10-unit head's result in rows padded to a GEMM's tile)
gets an unpadded buffer of its own, written by a re-layout step right after the step that made it,
and the download reads that buffer: only the caller's floats, a shorter pass only its own samples.
Results equal those of the host's cut (the padded buffer read whole, the samples cut out) and
numpy's, for heads of several widths, several outputs, an output read again by a later layer, a
convolution's output, every layer's outputs and an output that is the model's input.

PoCL and llvmpipe share the host's memory, where the path is off by default:
``MALINN_DEVICE_PADDING=1`` forces it (and the input side's, the one switch of both directions).
The GPU's kernels (the device's kind pretended) pad a Dense layer's result to their tiles.
"""

from __future__ import annotations

import numpy as np
import pytest
from support import assert_close, dense_forward

from malinn import Functional, Input, Sequential
from malinn.layers import Conv2D, Dense
from malinn.plan.kinds.layout import RELAYOUT


def seeded(model, rng, scale: float = 0.2, shape: tuple | None = None):
    """``model`` (built on ``shape`` where given) with seeded weights."""
    if shape is not None:
        model.build(shape)
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * scale for w in model.get_weights()])
    return model


def replan(model) -> None:
    """Forgets the model's plans, so the next predict makes one (the path is decided when it is)."""
    model._plans.clear()
    model._recent = {}


def padded_features(value) -> bool:
    return value.storage.padded_size[0] != value.rows


def unpadded(plan, index: int = 0) -> bool:
    """Whether the plan downloads its output ``index`` from a buffer holding exactly the caller's
    array, through a staging array (if any) of exactly its shape."""
    value, output = plan.outputs[index], plan._io[1][index]
    exact = value.storage.padded == (value.rows, value.cols)
    return exact and (output.staging is None or output.staging.shape == (value.cols, value.rows))


def forced(monkeypatch, on: bool) -> None:
    monkeypatch.setenv("MALINN_DEVICE_PADDING", "1" if on else "0")


@pytest.mark.parametrize("units", [10, 1, 13, 1001])
def test_a_dense_head_unpadded_on_the_device_answers_as_the_hosts_cut_and_numpy(padding_gpu, rng, monkeypatch, units):
    """19 samples (a small-batch kernel's tile) and 320 (a tiled GEMM's): unforced the head's padded
    buffer is read whole and cut; forced its last step copies it into an unpadded buffer, read as it
    is. A shorter pass after a full one of other data, and a full one after it, answer alike."""
    device = padding_gpu
    model = seeded(Sequential([Dense(37, activation="relu"), Dense(units, name="head")]), rng, shape=(None, 20))
    w = model.get_weights()

    def forward(x):
        return dense_forward(x, [(w[0], w[1], "relu"), (w[2], w[3], "linear")])

    for batch, short in ((19, 7), (320, 300)):
        x = rng.standard_normal((batch, 20)).astype(np.float32)
        got = {}
        for on in (False, True):
            forced(monkeypatch, on)
            replan(model)
            plan = model.plan(batch, device)
            if on:
                (copy,) = plan.output_copies
                assert copy.kind is RELAYOUT and plan.steps[-1] is copy and copy.out is plan.outputs[0]
                assert padded_features(copy.inputs["a"]) and unpadded(plan)
                assert plan.describe()[-1]["layers"] == ["head"] and plan.describe()[-1]["kind"] == "relayout"
            else:
                assert not plan.output_copies and padded_features(plan.outputs[0])
            after = np.concatenate([x, -x[:short]])  # a full pass, then a shorter one on the same plan
            got[on] = [model.predict(x, verbose=0), model.predict(after, batch_size=batch, verbose=0)[batch:]]
            got[on].append(model.predict(x, verbose=0))
        for a, b in zip(got[False], got[True]):
            np.testing.assert_array_equal(b, a)
        full, part, again = got[True]
        assert_close(full, forward(x))
        assert part.shape == (short, units)
        assert_close(part, forward(-x[:short]))
        assert_close(again, forward(x))


def test_of_two_outputs_only_the_padded_one_is_copied(padding_gpu, rng, monkeypatch):
    """A functional model with a 10-unit head (padded to the GEMM's 64 rows) and a 64-unit one (its
    rows the tile's): one copy; both outputs numpy's and the unforced plan's."""
    device = padding_gpu
    x = Input((20,), name="x")
    h = Dense(37, activation="relu", name="h")(x)
    model = Functional(x, [Dense(10, name="small")(h), Dense(64, name="wide")(h)])
    seeded(model, rng)
    wh, bh, ws, bs, ww, bw = model.get_weights()
    data = rng.standard_normal((320, 20)).astype(np.float32)
    hidden = dense_forward(data, [(wh, bh, "relu")])
    host = model.predict(data, verbose=0)
    assert not model.plan(320, device).output_copies
    forced(monkeypatch, True)
    replan(model)
    plan = model.plan(320, device)
    (copy,) = plan.output_copies
    assert plan.outputs[0] is copy.out and plan.outputs[1] is not copy.out and not padded_features(plan.outputs[1])
    assert unpadded(plan, 0) and unpadded(plan, 1)
    small, wide = model.predict(data, verbose=0)
    np.testing.assert_array_equal(small, host[0])
    np.testing.assert_array_equal(wide, host[1])
    assert_close(small, hidden @ ws + bs)
    assert_close(wide, hidden @ ww + bw)
    small, wide = model.predict(-data[:300], verbose=0)  # a shorter pass of the same plan
    hidden = dense_forward(-data[:300], [(wh, bh, "relu")])
    assert_close(small, hidden @ ws + bs)
    assert_close(wide, hidden @ ww + bw)


def test_an_output_read_by_a_later_layer_is_copied_after_its_step_and_its_buffer_freed(padding_gpu, rng, monkeypatch):
    """``a = Dense(10)(x)`` is an output and the input of ``Dense(3)``; a third branch comes later.
    The copy runs right after ``a``'s step; the later layers read the padded buffer; once the last
    of them ran, the padded buffer (no output now) is free for later tensors. Numpy's answers."""
    device = padding_gpu
    x = Input((20,), name="x")
    a = Dense(10, name="a")(x)
    b = Dense(3, activation="relu", name="b")(a)
    c = Dense(64, name="c")(Dense(64, activation="relu", name="d")(x))
    model = seeded(Functional(x, [a, b, c]), rng)
    wa, ba, wb, bb, wd, bd, wc, bc = model.get_weights()
    data = rng.standard_normal((320, 20)).astype(np.float32)
    host = model.predict(data, verbose=0)
    forced(monkeypatch, True)
    replan(model)
    plan = model.plan(320, device)
    copy, _ = plan.output_copies  # a's and b's (c's 64 rows are the tile's)
    assert [c.out for c in plan.output_copies] == plan.outputs[:2]
    padded = copy.inputs["a"]
    assert plan.steps.index(copy) == plan.steps.index(padded.producer) + 1
    readers = [s for s in plan.steps if padded in s.inputs.values()]
    assert len(readers) == 2 and padded.storage.last == max(plan.steps.index(s) for s in readers)
    assert padded.storage.last < len(plan.steps) - 1  # no longer held to the end as an output
    ((_, held),) = [(size, held) for size, held in plan._arena() if padded.storage in held]
    assert any(s.first > padded.storage.last for s in held)  # a later tensor took its buffer
    got = model.predict(data, verbose=0)
    for g, h in zip(got, host):
        np.testing.assert_array_equal(g, h)
    want_a = data.astype(np.float64) @ wa + ba
    assert_close(got[0], want_a)
    assert_close(got[1], np.maximum(want_a @ wb + bb, 0))
    assert_close(got[2], dense_forward(data, [(wd, bd, "relu"), (wc, bc, "linear")]))
    short = model.predict(data[:300], verbose=0)  # a shorter pass of the same plan
    assert_close(short[0], want_a[:300])
    assert_close(short[1], np.maximum(want_a[:300] @ wb + bb, 0))


def test_a_convolutions_output_unpadded_on_the_device(padding_gpu, rng, monkeypatch):
    """Conv2D(8, 1) on 9x9x13 images: the GPU's matmul writes the 8 channels of 567 pixels padded to
    64 x 576; forced, they are copied into an 8 x 567 buffer; results equal the cut and numpy's."""
    device = padding_gpu
    model = seeded(Sequential([Conv2D(8, 1, activation="relu")]), rng, 0.3, shape=(None, 9, 9, 13))
    kernel, bias = model.get_weights()
    x = rng.standard_normal((7, 9, 9, 13)).astype(np.float32)
    want = np.maximum(x.astype(np.float64) @ kernel[0, 0] + bias, 0)
    plan = model.plan(7, device)
    assert padded_features(plan.outputs[0]) and not plan.output_copies
    host = model.predict(x, verbose=0)
    forced(monkeypatch, True)
    replan(model)
    plan = model.plan(7, device)
    assert len(plan.output_copies) == 1 and unpadded(plan)
    got = model.predict(x, verbose=0)
    np.testing.assert_array_equal(got, host)
    assert_close(got, want)
    after = model.predict(np.concatenate([x, x[:3]]), batch_size=7, verbose=0)  # then a shorter pass
    assert_close(after, np.concatenate([want, want[:3]]))


def test_every_layers_outputs_unpadded_on_the_device(padding_gpu, rng, monkeypatch):
    """``predict_layers``: every layer's output is an output; each padded one gets its copy (the
    first layer's read again by the second); every result numpy's and the unforced plan's."""
    device = padding_gpu
    model = seeded(
        Sequential([Dense(37, activation="relu"), Dense(10), Dense(5, activation="relu")]), rng, shape=(None, 20)
    )
    w = model.get_weights()
    x = rng.standard_normal((64, 20)).astype(np.float32)
    host = model.predict_layers(x)
    forced(monkeypatch, True)
    replan(model)
    plan = model.plan(64, device, every_layer=True)
    assert len(plan.output_copies) == 3 and all(unpadded(plan, i) for i in range(3))
    got = model.predict_layers(x)
    h1 = dense_forward(x, [(w[0], w[1], "relu")])
    h2 = h1 @ w[2] + w[3]
    for g, h, want in zip(got, host, [h1, h2, np.maximum(h2 @ w[4] + w[5], 0)]):
        np.testing.assert_array_equal(g, h)
        assert_close(g, want)
    assert_close(model.predict(x, verbose=0), np.maximum(h2 @ w[4] + w[5], 0))


def test_an_output_that_is_the_input_is_downloaded_from_its_unpadded_upload(padding_gpu, rng, monkeypatch):
    """A model whose outputs are its input and a Dense of it: forced, the input is uploaded unpadded
    and padded on the device for the Dense; the first output is read from the unpadded upload (no
    copy back), exactly the caller's array, full and shorter passes."""
    device = padding_gpu
    x = Input((20,), name="x")
    model = seeded(Functional(x, [x, Dense(10, name="d")(x)]), rng)
    kernel, bias = model.get_weights()
    data = rng.standard_normal((320, 20)).astype(np.float32)
    forced(monkeypatch, True)
    plan = model.plan(320, device)
    assert plan.outputs[0] is plan.inputs[0] and len(plan.input_copies) == 1 and len(plan.output_copies) == 1
    assert unpadded(plan, 0) and unpadded(plan, 1)
    same, dense = model.predict(data, verbose=0)
    np.testing.assert_array_equal(same, data)
    assert_close(dense, data.astype(np.float64) @ kernel + bias)
    same, dense = model.predict(-data[:290], verbose=0)  # a shorter pass of the same plan
    np.testing.assert_array_equal(same, -data[:290])
    assert_close(dense, -data[:290].astype(np.float64) @ kernel + bias)


def test_a_discrete_gpu_unpads_an_output_it_would_stage_and_a_shorter_pass_reads_only_its_samples(
    padding_discrete, rng, monkeypatch
):
    """On a discrete GPU (by default) a padded output buffer of 64 KiB or more is unpadded on the
    device, a smaller one not; ``MALINN_DEVICE_PADDING=0`` unpads none. The unpadded output goes
    through a staging array of exactly its shape, and a shorter pass reads only its own samples into
    it (the rest of the staging untouched). Results equal the host's cut."""
    from malinn.backends.opencl_memory import PINNED_MIN_BYTES

    device = padding_discrete
    assert device.unpads_on_device(PINNED_MIN_BYTES) and not device.unpads_on_device(PINNED_MIN_BYTES - 4)
    model = seeded(Sequential([Dense(10)]), rng, shape=(None, 20))
    kernel, bias = model.get_weights()
    assert not model.plan(19, device).output_copies  # 16 x 20 floats padded
    x = rng.standard_normal((2048, 20)).astype(np.float32)
    monkeypatch.setenv("MALINN_DEVICE_PADDING", "0")
    plan = model.plan(2048, device)
    assert not plan.output_copies and padded_features(plan.outputs[0])
    host = model.predict(x, verbose=0)
    monkeypatch.delenv("MALINN_DEVICE_PADDING")
    replan(model)
    plan = model.plan(2048, device)
    (output,) = plan._io[1]
    assert len(plan.output_copies) == 1 and unpadded(plan) and output.staging is not None
    assert device.page_locked(output.staging) and not output.direct
    got = model.predict(x, verbose=0)
    np.testing.assert_array_equal(got, host)
    assert_close(got, x.astype(np.float64) @ kernel + bias)
    output.staging[...] = 7.0
    assert model.plan(2000, device) is plan
    assert_close(model.predict(x[:2000], verbose=0), x[:2000].astype(np.float64) @ kernel + bias)
    assert (output.staging[2000:] == 7.0).all() and not (output.staging[:2000] == 7.0).any()  # only its samples read
