"""predict as Keras's for data of any size: memory-mapped arrays, iterables of batches, steps, the
progress bar, several devices (one plan per entry, results in order), and models that pickle."""

import os
import pickle
import pty
import select
import sys
import threading

import numpy as np
import pytest
from support import assert_close
from support import small_dense_model as small_model
from support import small_dense_reference as reference
from support import two_input_model as two_inputs

import malinn
from malinn.model import batches
from malinn.model.passes import spread


def test_memory_mapped_npy_is_read_a_pass_at_a_time(device, tmp_path, monkeypatch):
    model = small_model()
    x = np.random.default_rng(1).uniform(-1, 1, (3001, 37)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    np.testing.assert_array_equal(model.predict(mapped, batch_size=512), model.predict(x, batch_size=512))
    # without batch_size: passes of STREAM_PASS_BYTES of input (made small here: 1000 samples,
    # a bucket of 960)
    monkeypatch.setattr(batches, "STREAM_PASS_BYTES", 1000 * 37 * 4)
    assert batches.default_step([mapped], 3001, 1) == 960
    y = model.predict(mapped)
    np.testing.assert_array_equal(y, model.predict(x, batch_size=960))
    assert_close(y, reference(model, x))
    # a float64 file: each pass cast on its own
    np.save(tmp_path / "x64.npy", x.astype(np.float64))
    np.testing.assert_array_equal(model.predict(np.load(tmp_path / "x64.npy", mmap_mode="r")), y)


@pytest.mark.parametrize("several", [False, True])
def test_an_array_beyond_a_pass_of_input_bytes_runs_in_passes_of_it(device, monkeypatch, several):
    """Without batch_size, an array runs in one pass up to ARRAY_PASS_BYTES of input (made small
    here: 1000 samples), in passes of it beyond; spread over several devices, passes of
    SPREAD_PASS_BYTES (400 samples here), at most one share each. A pass so cut holds a bucket's
    samples (960 and 384: multiples of 64 above 256), whose plan pads none. The results equal one
    pass's within float32 sums (each pass runs the plan of its size)."""
    model = small_model()
    x = np.random.default_rng(4).uniform(-1, 1, (2501, 37)).astype(np.float32)
    monkeypatch.setattr(batches, "ARRAY_PASS_BYTES", 1000 * 37 * 4)
    monkeypatch.setattr(batches, "SPREAD_PASS_BYTES", 400 * 37 * 4)
    step = 384 if several else 960
    assert batches.default_step([x], 2501, 2 if several else 1) == step
    assert batches.default_step([x[:600]], 600, 2 if several else 1) == (300 if several else 600)
    before = device.counters["downloads"]
    y = model.predict(x, devices=[device, device] if several else None, verbose=0)
    assert device.counters["downloads"] - before == -(-2501 // step)  # one download a pass
    np.testing.assert_array_equal(y, model.predict(x, batch_size=step, verbose=0))
    assert_close(y, reference(model, x))


def test_a_generator_of_batches_gives_the_results_in_order(device):
    model = small_model()
    x = np.random.default_rng(2).uniform(-1, 1, (230, 37)).astype(np.float32)
    want = model.predict(x, batch_size=50)

    def batches_of(size, wrap=lambda b: b):
        for start in range(0, len(x), size):
            yield wrap(x[start : start + size])

    np.testing.assert_array_equal(model.predict(batches_of(50)), want)
    # Keras's forms of an item: (x,), (x, y), (x, y, sample_weight); a float64 batch is cast
    np.testing.assert_array_equal(model.predict(batches_of(50, lambda b: (b, np.zeros(len(b))))), want)
    np.testing.assert_array_equal(model.predict(batches_of(50, lambda b: (b.astype(np.float64),))), want)
    # batch_size splits each drawn batch into passes (the plan of the pass size, as for an array)
    np.testing.assert_array_equal(model.predict(batches_of(100), batch_size=50), want)
    # steps: that many batches, as Keras draws them
    np.testing.assert_array_equal(model.predict(batches_of(50), steps=2), want[:100])
    assert_close(want, reference(model, x))
    assert model.predict(iter([])).shape == (0, 5)
    with pytest.raises(ValueError, match=r"\(x,\), \(x, y\) or \(x, y, sample_weight\); got a tuple of 4"):
        model.predict(iter([(x, x, x, x)]))


def test_an_iterable_with_a_length_and_named_inputs(device):
    model = two_inputs()
    rng = np.random.default_rng(4)
    a, b = rng.uniform(-1, 1, (70, 6)).astype(np.float32), rng.uniform(-1, 1, (70, 4)).astype(np.float32)
    want = model.predict({"a": a, "b": b}, batch_size=20)

    class Loader:  # as a torch DataLoader or Keras PyDataset: a length and batches by name
        def __len__(self):
            return 4

        def __iter__(self):
            return ({"a": a[i : i + 20], "b": b[i : i + 20]} for i in range(0, 70, 20))

    np.testing.assert_array_equal(model.predict(Loader()), want)
    # a list of inputs, as Keras takes it from an iterable: inside a one-item tuple
    np.testing.assert_array_equal(model.predict(([a[i : i + 20], b[i : i + 20]],) for i in range(0, 70, 20)), want)
    w = model.get_weights()
    assert_close(want, a @ w[0] + w[1] + b @ w[2] + w[3])


def test_steps_with_an_array_take_keras_batches():
    model = small_model()
    x = np.random.default_rng(5).uniform(-1, 1, (100, 37)).astype(np.float32)
    np.testing.assert_array_equal(model.predict(x, steps=2), model.predict(x, batch_size=50))  # every sample
    np.testing.assert_array_equal(model.predict(x, batch_size=10, steps=3), model.predict(x, batch_size=10)[:30])
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="steps must be a positive integer"):
            model.predict(x, steps=bad)


def test_progress_bar_as_keras_prints_it(capsys):
    model = small_model()
    x = np.random.default_rng(6).uniform(-1, 1, (100, 37)).astype(np.float32)
    model.predict(x, batch_size=25, verbose=2)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("4/4 - ") and out[0].endswith("/step"), out
    model.predict(x, batch_size=25, verbose=1)
    out = capsys.readouterr().out.strip().splitlines()  # not a terminal: the finished bar only
    assert out[-1].startswith("4/4 " + "━" * 20 + " "), out
    model.predict((x[i : i + 40] for i in range(0, 100, 40)), verbose=1)
    assert capsys.readouterr().out.strip().startswith("3/3 " + "━" * 20 + " ")  # Keras's: the steps seen
    for quiet in (0, "auto"):  # auto: 1 only on a terminal
        model.predict(x, batch_size=25, verbose=quiet)
        assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="verbose must be 'auto', 0, 1 or 2"):
        model.predict(x, verbose=3)


def test_auto_draws_the_bar_on_a_terminal_where_batches_were_asked_for(monkeypatch):
    model = small_model()
    x = np.random.default_rng(6).uniform(-1, 1, (100, 37)).astype(np.float32)
    leader, follower = pty.openpty()
    with os.fdopen(follower, "w", encoding="utf-8") as terminal:
        monkeypatch.setattr(sys, "stdout", terminal)
        try:
            model.predict(x)  # one pass, as a service calls it: nothing
            model.predict(x, batch_size=25)
            sys.stdout.flush()
        finally:
            monkeypatch.undo()
        drawn = b""
        while b"\n" not in drawn and select.select([leader], [], [], 10)[0]:  # the terminal passes it on
            drawn += os.read(leader, 65536)
    os.close(leader)
    drawn = drawn.decode()
    # the first call drew nothing; the second redrew its line in place (a carriage return), the
    # done part green as Keras's, and ended the line once
    assert drawn.startswith("\r") and drawn.count("\n") == 1 and "4/4 \x1b[32m" + "━" * 20 in drawn, repr(drawn)


def test_one_model_on_a_device_listed_twice_has_two_plans(device):
    model = small_model()
    x = np.random.default_rng(7).uniform(-1, 1, (301, 37)).astype(np.float32)
    # the batch split in one share per entry: each plan of 151 samples
    y = model.predict(x, devices=[device, device])
    np.testing.assert_array_equal(y, model.predict(x, batch_size=151))
    # a plan per entry, each with one share in flight (test_spread_starts_... below)
    replicas = sorted(key[-1] for key in model._plans if key[1] == id(device) and key[2] == 151)
    assert replicas == [0, 1]
    # many passes spread over both, each stored at its place
    np.testing.assert_array_equal(
        model.predict(x, batch_size=16, devices=[device, device]), model.predict(x, batch_size=16)
    )
    batches_in = [x[i : i + 7 + i % 5] for i in range(0, 280, 20)]  # uneven batches, in order
    np.testing.assert_array_equal(
        model.predict(iter(batches_in), devices=[device, device]),
        np.concatenate([model.predict(b) for b in batches_in]),
    )
    assert_close(y, reference(model, x))


def test_spread_starts_a_pass_on_every_worker_before_waiting_and_delivers_each_result_at_its_index():
    log, delivered = [], {}

    def worker(label):
        def begin(batch, holding):
            log.append(f"start {label}{batch}")

            def wait():
                log.append(f"wait {label}{batch}")
                return [np.full((batch % 3 + 1, 2), batch, np.float32)]

            return wait

        return label, begin

    spread(
        ((i, 10 * i, i) for i in range(7)),
        [worker("a"), worker("b")],
        lambda index, start, outputs: delivered.setdefault(index, (start, outputs[0])),
    )
    # both devices have a pass in flight before the first wait; a worker gets its next batch as soon
    # as its pass is taken, so the other's stays in flight meanwhile
    assert log == [
        "start a0", "start b1",
        "wait a0", "start a2", "wait b1", "start b3",
        "wait a2", "start a4", "wait b3", "start b5",
        "wait a4", "start a6", "wait b5", "wait a6",
    ]  # fmt: skip
    assert sorted(delivered) == list(range(7))
    assert all(start == 10 * i and (y == i).all() and len(y) == i % 3 + 1 for i, (start, y) in delivered.items())


def test_a_worker_that_would_wait_for_a_lock_begins_again_once_the_passes_in_flight_are_taken():
    log = []

    def worker(label, busy):
        def begin(batch, holding):
            if holding and batch in busy:  # its lock is another thread's: not while holding others
                log.append(f"busy {label}{batch}")
                return None
            log.append(f"start {label}{batch}")
            return lambda: log.append(f"wait {label}{batch}") or [np.zeros(1)]

        return label, begin

    delivered = []
    spread(((i, i, i) for i in range(5)), [worker("a", ()), worker("b", (1, 3))], lambda i, *_: delivered.append(i))
    assert log == [
        "start a0", "busy b1", "wait a0", "start b1",  # b's first batch waits until a's pass is taken
        "wait b1", "start b2", "wait b2", "start b3",  # b alone: free to wait
        "wait b3", "start b4", "wait b4",
    ]  # fmt: skip
    assert delivered == [0, 1, 2, 3, 4]


def test_a_predict_over_two_devices_has_a_pass_in_flight_on_each_before_it_waits(device, monkeypatch):
    from test_predict_twin_devices import twin_of

    from malinn.plan import plan as plan_module

    twin = twin_of(device, monkeypatch)
    model = small_model()
    x = np.random.default_rng(12).uniform(-1, 1, (300, 37)).astype(np.float32)
    want = model.predict(x, batch_size=150)  # the shares' plan (a GPU's kernels differ by batch)
    converted, convert = [], model._converted
    monkeypatch.setattr(model, "_converted", lambda xs: converted.append(len(xs[0])) or convert(xs))
    # the first call makes the second device's plan: its share waits until the first share is taken,
    # and is converted once all the same
    np.testing.assert_array_equal(model.predict(x, devices=[device, twin]), want)
    assert converted == [150, 150]
    log = []
    start, result = plan_module.Plan.start, plan_module.PendingPass.result
    monkeypatch.setattr(plan_module.Plan, "start", lambda plan, *a, **k: log.append("start") or start(plan, *a, **k))
    monkeypatch.setattr(plan_module.PendingPass, "result", lambda pending: log.append("result") or result(pending))
    np.testing.assert_array_equal(model.predict(x, devices=[device, twin]), want)
    assert log == ["start", "start", "result", "result"]  # both devices busy at once, its plans kept


def test_two_threads_spreading_over_two_devices_in_opposite_orders_both_finish(device, monkeypatch):
    from test_predict_twin_devices import twin_of

    twin = twin_of(device, monkeypatch)
    model = small_model()
    x = np.random.default_rng(11).uniform(-1, 1, (400, 37)).astype(np.float32)
    want = model.predict(x, batch_size=8)
    got, failed = {}, []

    def run(pool, key):
        try:
            for _ in range(5):  # many passes each: a thread holds one device's lock as it asks for the other's
                got[key] = model.predict(x, batch_size=8, devices=pool)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failed.append(exc)

    threads = [
        threading.Thread(target=run, args=([device, twin], "ab"), daemon=True),
        threading.Thread(target=run, args=([twin, device], "ba"), daemon=True),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "the two threads waited for each other's locks"
    assert not failed, failed
    np.testing.assert_array_equal(got["ab"], want)
    np.testing.assert_array_equal(got["ba"], want)


@pytest.mark.parametrize("stage", ["start", "wait"])
def test_spread_names_the_failing_device_and_waits_for_the_passes_in_flight(stage):
    waited = []

    def worker(label):
        def begin(batch, holding):
            if stage == "start" and batch == 3:
                raise ValueError("a shape did not match")

            def wait():
                waited.append(batch)
                if stage == "wait" and batch == 3:
                    raise ValueError("a shape did not match")
                return [np.zeros(1)]

            return wait

        return label, begin

    with pytest.raises(ValueError, match=r"^device b: a shape did not match$") as raised:
        spread(((i, i, i) for i in range(9)), [worker("device a"), worker("device b")], lambda *_: None)
    assert isinstance(raised.value.__cause__, ValueError)  # the device's own error, as it was raised
    # batch 3 is device b's second; device a's pass in flight (batch 2, or 4 where 3's wait failed)
    # was waited for before the error was raised: its lock given back, its copies complete
    assert waited == ([0, 1, 2] if stage == "start" else [0, 1, 2, 3, 4])
    # one device: its error as it was, unnamed
    with pytest.raises(ValueError, match=r"^a shape did not match$"):
        spread(((i, i, i) for i in range(9)), [worker("device a")], lambda *_: None)


def test_set_device_with_a_list_spreads_predict(device):
    model = two_inputs()
    rng = np.random.default_rng(8)
    a, b = rng.uniform(-1, 1, (90, 6)).astype(np.float32), rng.uniform(-1, 1, (90, 4)).astype(np.float32)
    want = model.predict([a, b], batch_size=10)
    index = (
        f"{device.backend}:{device.index[1]}" if device.backend != "opencl" else f"{device.index[0]}:{device.index[1]}"
    )
    try:
        chosen = malinn.set_device([device, index])
        assert chosen == [device, device] and malinn.get_device() is device
        assert malinn.get_devices() == [device, device]
        np.testing.assert_array_equal(model.predict([a, b], batch_size=10), want)
    finally:
        malinn.set_device(device)
    assert malinn.get_devices() == [device]
    with pytest.raises(malinn.DeviceError, match="device 1 of the list, 'no-such-device'"):
        malinn.set_device([device, "no-such-device"])
    with pytest.raises(malinn.DeviceError, match="an empty list of devices"):
        model.predict([a, b], devices=[])


def test_an_error_on_one_of_several_devices_names_it(device):
    model = small_model()
    x = np.zeros((10, 37), np.float32)

    def broken():
        yield x
        yield x
        yield np.zeros((10, 36), np.float32)

    label = f"device {device.index[0]}:{device.index[1]} "
    with pytest.raises(ValueError, match=f"^{label}.*: batch 2 of the iterable: Input of layer .*expected shape"):
        model.predict(broken(), devices=[device, device])

    def failing():
        yield x
        raise RuntimeError("the data source failed")

    with pytest.raises(RuntimeError, match="^the data source failed$"):  # the source's own error, as it was
        model.predict(failing(), devices=[device, device])


def test_models_pickle_as_keras_models_do(device):
    model = small_model()
    x = np.random.default_rng(9).uniform(-1, 1, (12, 37)).astype(np.float32)
    copy = pickle.loads(pickle.dumps(model))
    assert copy is not model and copy.name == model.name
    np.testing.assert_array_equal(copy.predict(x), model.predict(x))
    graph = two_inputs()
    again = pickle.loads(pickle.dumps(graph))
    a, b = x[:, :6], x[:, 6:10]
    np.testing.assert_array_equal(again.predict({"a": a, "b": b}), graph.predict({"a": a, "b": b}))
