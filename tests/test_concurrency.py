"""Concurrency (docs/RELIABILITY.md): ``predict`` on one model from several
threads at once gives exactly the results of single-threaded calls, with warm and cold caches."""

import threading
import time

import numpy as np
import pytest
from support import assert_close

import malinn
from malinn import Sequential, ops
from malinn.backends import opencl
from malinn.choice.matrix import DeviceMatrix
from malinn.layers import BatchNormalization, Dense, Softmax
from malinn.library.kernel_library import load_library

THREADS = 4
ROUNDS = 5


def make_model(seed=0):
    rng = np.random.default_rng(seed)
    model = Sequential(
        [
            Dense(29, activation="relu", name="h1"),
            BatchNormalization(name="bn"),
            Dense(61, activation="tanh", name="h2"),
            Dense(7, name="logits"),
            Softmax(name="p"),
        ]
    )
    model.build((None, 45))
    weights = [rng.standard_normal(w.shape).astype(np.float32) * 0.3 for w in model.get_weights()]
    weights[5] = np.abs(weights[5]) + 0.5  # the moving variance stays positive
    model.set_weights(weights)
    return model


def inputs(seed):
    """Different inputs per thread and round, with different batch sizes (1 and odd ones)."""
    rng = np.random.default_rng(seed)
    sizes = [1, 3, 17, 64, 5, 33, 2, 100]
    return [
        [rng.standard_normal((sizes[(t + r) % len(sizes)], 45)).astype(np.float32) for r in range(ROUNDS)]
        for t in range(THREADS)
    ]


def run_threads(work):
    """Runs ``work(t)`` for each thread index at once (a barrier releases them together);
    returns their results in thread order and re-raises the first exception any of them raised."""
    barrier = threading.Barrier(THREADS)
    results, errors = [None] * THREADS, []

    def target(t):
        try:
            barrier.wait(timeout=60)
            results[t] = work(t)
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(t,), name=f"predict-{t}") for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads), "a predict thread hung"
    if errors:
        raise errors[0]
    return results


def matmuls_to_check():
    """``None`` (the device's own choice, in the configuration the library names for its kind),
    the library's default matmul for each device kind, a Morton kernel, every kernel with a scratch
    buffer (split-K counters and partial sums that each launch must leave as it found them: where
    threads could collide) and every kernel that fuses softmax (whole columns in local memory). The
    others run the same host code (the plan's bound launches) as one of these."""
    library = load_library()
    chosen = [library.default("matmul", kind) for kind in ("gpu", "cpu", "accelerator")] + ["morton_4_2"]
    chosen += [c for c in library.codenames("matmul") if library[c].scratch_bytes or "softmax" in library[c].epilogue]
    return [None] + [c for i, c in enumerate(chosen) if c in library and c not in chosen[:i]]


@pytest.mark.parametrize("codename", matmuls_to_check(), ids=lambda c: c or "default")
def test_four_threads_predict_exactly_like_one(device, codename):
    if codename:
        ops.use("matmul", codename, device)
    model = make_model()
    xs = inputs(1)
    expected = [[model.predict(x) for x in rounds] for rounds in xs]  # single-threaded, warms caches
    before = dict(device.counters)
    got = run_threads(lambda t: [model.predict(x) for x in xs[t]])
    for t in range(THREADS):
        for r in range(ROUNDS):
            np.testing.assert_array_equal(got[t][r], expected[t][r], err_msg=f"thread {t}, round {r}")
    # the warm model uploads only inputs and downloads only outputs: one of each per call
    assert device.counters["uploads"] - before["uploads"] == THREADS * ROUNDS
    assert device.counters["downloads"] - before["downloads"] == THREADS * ROUNDS


def test_concurrent_first_predict_with_cold_caches(device, monkeypatch):
    """No program built, no weight on the device yet: four threads make the first call at once."""
    monkeypatch.setattr(device, "cache", {})  # every kernel must be built again...
    monkeypatch.setenv("MALINN_BINARY_CACHE", "0")  # ...from source, not from the disk cache
    builds = device.counters["builds"]
    model = make_model(seed=5)
    xs = inputs(2)
    got = run_threads(lambda t: model.predict(xs[t][0]))
    assert device.counters["builds"] > builds  # the caches were cold indeed
    reference = make_model(seed=5)  # the same weights, predicted alone
    for t in range(THREADS):
        np.testing.assert_array_equal(got[t], reference.predict(xs[t][0]), err_msg=f"thread {t}")
        np.testing.assert_array_equal(got[t], model.predict(xs[t][0]), err_msg=f"thread {t}")


def test_concurrent_first_predict_builds_an_unbuilt_model_once(device):
    """A model without input shape is built by its first predict; four first calls at once build it
    once (building draws random weights, so a second build would change the answers)."""
    model = Sequential([Dense(11, activation="sigmoid", name="a"), Dense(3, name="b")])
    x = np.random.default_rng(3).standard_normal((6, 9)).astype(np.float32)
    got = run_threads(lambda t: model.predict(x))
    after = model.predict(x)
    for t in range(THREADS):
        np.testing.assert_array_equal(got[t], after, err_msg=f"thread {t}")
    kernel, bias, kernel2, bias2 = model.get_weights()
    assert_close(after, 1 / (1 + np.exp(-(x.astype(np.float64) @ kernel + bias))) @ kernel2 + bias2)


def test_threads_predicting_different_models_and_splits(device, monkeypatch):
    """Two models at once, one of them split into passes by a lowered allocation limit."""
    first, second = make_model(seed=7), make_model(seed=8)
    xs = inputs(3)
    expected = [[(first if t % 2 else second).predict(x) for x in xs[t]] for t in range(THREADS)]
    monkeypatch.setattr(device, "max_allocation", max(first.activation_bytes(8, device)[0], 2**16))
    got = run_threads(lambda t: [(first if t % 2 else second).predict(x) for x in xs[t]])
    for t in range(THREADS):
        for r in range(ROUNDS):
            assert_close(got[t][r], expected[t][r], rtol=1e-5)


def test_a_program_building_for_one_model_does_not_stall_another_models_predict(monkeypatch):
    """Building a program (a model being planned, seconds on a board) does not hold the lock a
    predict enqueues under: another model, already planned, predicts meanwhile on the same device."""
    devices = [d for d in malinn.devices() if d.backend == "opencl"]
    if not devices:
        pytest.skip("no OpenCL device")
    device = devices[0]
    x = inputs(5)[0][2]
    plan = make_model(seed=5).plan(len(x), device)
    want = plan.run([x])[0]
    building, predicted = threading.Event(), threading.Event()
    original = opencl.OpenCLDevice._build_from_source

    def slow_build(self, source, options, origin):
        building.set()
        predicted.wait(timeout=20)  # a predict that waited for this build would wait out the timeout
        return original(self, source, options, origin)

    monkeypatch.setattr(opencl.OpenCLDevice, "_build_from_source", slow_build)
    monkeypatch.setenv("MALINN_BINARY_CACHE", "0")
    source = f"__kernel void k(__global float *x) {{ x[0] = {time.time_ns() % 1000003}.0f; }}"  # never built
    builder = threading.Thread(target=device.compile, args=(source,), kwargs={"origin": "the stall test"})
    builder.start()
    try:
        assert building.wait(timeout=20)
        got = plan.run([x])[0]
        still_building = builder.is_alive()
    finally:
        predicted.set()
        builder.join()
    assert still_building, "the predict waited for the other model's build"
    np.testing.assert_array_equal(got, want)


def test_a_plan_being_made_does_not_stall_the_same_models_kept_plans(monkeypatch):
    """One model's plan for a new batch size (seconds on a board) is made under a lock of its own:
    a thread predicting with a plan already kept runs meanwhile, and threads asking for the plan
    being made wait for it rather than making it again."""
    model = make_model(seed=6)
    device = malinn.get_device()
    x = inputs(6)[0][2]
    kept = model.plan(len(x), device)
    want = kept.run([x])[0]
    planning, predicted, planned = threading.Event(), threading.Event(), threading.Event()
    compiled = []
    original = type(model)._compile

    def slow_compile(self, device, batch, every_layer):
        compiled.append(batch)
        planning.set()
        predicted.wait(timeout=20)  # a predict that waited for this plan would wait out the timeout
        try:
            return original(self, device, batch, every_layer)
        finally:
            planned.set()

    monkeypatch.setattr(type(model), "_compile", slow_compile)
    made = []
    makers = [threading.Thread(target=lambda: made.append(model.plan(200, device))) for _ in range(3)]
    for maker in makers:
        maker.start()
    try:
        assert planning.wait(timeout=20)
        got = model.plan(len(x), device).run([x])[0]
        still_planning = not planned.is_set()
    finally:
        predicted.set()
        for maker in makers:
            maker.join(timeout=60)
    assert still_planning, "the kept plan waited for the new one"
    np.testing.assert_array_equal(got, want)
    assert compiled == [malinn.model.model.batch_bucket(200)] and len(made) == 3 and made[0] is made[1] is made[2]


SET_WEIGHTS_WHILE_PREDICTING = r"""
import sys, threading, time
import numpy as np
import malinn
from malinn.layers import Dense
malinn.set_device(sys.argv[1])
layer = Dense(256, activation="relu")
model = malinn.Sequential([layer])
model.build((None, 64))
rng = np.random.default_rng(0)
old = [rng.standard_normal((64, 256)).astype(np.float32), np.zeros(256, np.float32)]
new = [w * 0.5 for w in old]
x = rng.standard_normal((7, 64)).astype(np.float32)
answers = []
for weights in (old, new):
    model.set_weights(weights)
    answers.append(model.predict(x))
stop, seen = threading.Event(), {"old": 0, "new": 0, "other": 0}
def predicting():
    while not stop.is_set():
        y = model.predict(x)
        seen["old" if np.array_equal(y, answers[0]) else "new" if np.array_equal(y, answers[1]) else "other"] += 1
threads = [threading.Thread(target=predicting) for _ in range(3)]
for t in threads:
    t.start()
end, n = time.monotonic() + float(sys.argv[2]), 0
while time.monotonic() < end:
    model.set_weights(new if n % 2 else old)
    n += 1
stop.set()
for t in threads:
    t.join()
print(n, seen["old"], seen["new"], seen["other"])
"""


def test_set_weights_while_other_threads_predict_never_crashes(device):
    """A plan keeps the buffers its launches were bound to: set_weights dropped the layer's weight
    copy while another thread's plan still ran on it, and PoCL aborted the process ('PTHREAD ERROR
    in can_run_command') within seconds. A one-layer model answers with the old weights
    or the new, nothing else. In a subprocess: an abort must fail this test, not the run."""
    import subprocess
    import sys

    spec = (
        f"{device.backend}:{device.index[-1]}" if device.backend != "opencl" else f"{device.index[0]}:{device.index[1]}"
    )
    out = subprocess.run(
        [sys.executable, "-c", SET_WEIGHTS_WHILE_PREDICTING, spec, "4"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    sets, old, new, other = map(int, out.stdout.split())
    assert sets > 10 and old + new > 10 and other == 0, out.stdout


def test_a_weight_change_during_another_plans_upload_is_not_lost(device, monkeypatch):
    """A thread changing a layer's weights while another thread's plan uploads the old ones: the old
    upload finished into the layer's (cleared) copies and every later plan reused it: the new
    weights were never seen (60 stale results in 80). Forced here: the change lands
    inside the upload."""
    model = Sequential([Dense(3, name="d")])
    model.build((None, 4))
    layer = model.layers[0]
    new = [np.full((4, 3), 2.0, np.float32), np.ones(3, np.float32)]
    upload, changed = DeviceMatrix.upload_weights, []

    def changing(*args, **kwargs):
        matrix = upload(*args, **kwargs)
        if not changed:
            changed.append(True)
            layer.set_weights(new)  # what another thread did meanwhile
        return matrix

    monkeypatch.setattr(DeviceMatrix, "upload_weights", staticmethod(changing))
    x = np.ones((2, 4), np.float32)
    model.predict(x)
    np.testing.assert_array_equal(model.predict(x), np.full((2, 3), 9.0))
    np.testing.assert_array_equal(model.predict(np.ones((5, 4), np.float32)), np.full((5, 3), 9.0))


def test_a_change_while_a_plan_is_made_is_seen_by_the_next_call(device, monkeypatch):
    """The plan of a call was recorded as the last call's under the stamp read after it was made: a
    weight changed meanwhile left that old plan serving every later call of the shape."""
    model = Sequential([Dense(3, name="d")])
    model.build((None, 4))
    layer, plan, done = model.layers[0], model.plan, []

    def planning(*args, **kwargs):
        made = plan(*args, **kwargs)
        if not done:
            done.append(True)
            layer.kernel = np.full((4, 3), 2.0, np.float32)  # another thread, just after
            layer.bias = np.ones(3, np.float32)
        return made

    monkeypatch.setattr(model, "plan", planning)
    x = np.ones((2, 4), np.float32)
    model.predict(x)
    for _ in range(3):
        np.testing.assert_array_equal(model.predict(x), np.full((2, 3), 9.0))


def test_an_unbuilt_models_first_calls_are_checked_against_the_shape_it_was_built_for(monkeypatch):
    """Two threads' first calls on an unbuilt Sequential: the one whose shape lost the build was
    accepted unchecked, and (recorded as the last call) every later call of that wrong shape too."""
    model = Sequential([Dense(8, name="d")])
    build = Sequential.build

    def other_thread_first(self, input_shape):  # another thread's call, of samples (10, 2), built it first
        return build(self, (None, 10, 2))

    monkeypatch.setattr(Sequential, "build", other_thread_first)
    with pytest.raises(ValueError, match=r"expected shape \(None, 10, 2\), found shape \(4, 20\)"):
        model.predict(np.ones((4, 20), np.float32))
    monkeypatch.setattr(Sequential, "build", build)
    assert model.predict(np.ones((4, 10, 2), np.float32)).shape == (4, 10, 8)
    with pytest.raises(ValueError, match=r"expected shape \(None, 10, 2\), found shape \(4, 20\)"):
        model.predict(np.ones((4, 20), np.float32))
