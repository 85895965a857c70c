"""Compiled plans: what is decided once, fused, laid out, shared and reused, and that it computes Keras's values."""

import threading

import numpy as np
import pytest
from support import activation as ref_activation
from support import assert_close, summary_rows
from support import model_forward as numpy_forward

from malinn import BackendError, DeviceError, Sequential, ops
from malinn.choice import kernel_choice
from malinn.layers import Activation, BatchNormalization, Conv2D, Dense, Flatten, ReLU, Softmax
from malinn.library.kernel_library import load_library
from malinn.model.model import batch_bucket


def dense_model(widths, activations, seed=0, batchnorm_after=None):
    rng = np.random.default_rng(seed)
    layers = []
    for i, (units, act) in enumerate(zip(widths[1:], activations)):
        layers.append(Dense(units, activation=act, name=f"d{i}"))
        if batchnorm_after == i:
            layers.append(BatchNormalization(name="bn"))
    model = Sequential(layers)
    model.build((None, widths[0]))
    weights = [w + rng.standard_normal(w.shape).astype(np.float32) * 0.3 for w in model.get_weights()]
    if batchnorm_after is not None:  # gamma, beta, mean, variance follow the Dense before
        index = 2 * (batchnorm_after + 1) + 3
        weights[index] = np.abs(weights[index]) + 0.5
    model.set_weights(weights)
    return model


def test_a_dense_layer_is_one_launch_with_bias_activation_batchnorm_and_softmax_fused(device, rng):
    """One launch per Dense layer, or for the last two where the device's library fuses a small head
    into the layer before it (GPUs, batches up to 8: gemv_split_c_head)."""
    model = dense_model([37, 13, 29, 5], ["relu", "tanh", "softmax"], batchnorm_after=0)
    heads = bool(ops.load_library().default_specs("matmul_head", device.kind, device.backend))
    for n in (1, 7, 100):
        x = rng.standard_normal((n, 37)).astype(np.float32)
        assert_close(model.predict(x), numpy_forward(model, x))
        matmuls = [row for row in model.plan(n, device).describe() if row["kind"] == "matmul"]
        fused = heads and n <= 8
        assert len(matmuls) == (2 if fused else 3)
        assert matmuls[0]["fused"] == ["bias", "relu", "affine"] and matmuls[0]["layers"] == ["d0", "bn"]
        if fused:
            assert matmuls[1]["layers"] == ["d1", "d2"] and matmuls[1]["fused"] == ["bias", "tanh", "head (softmax)"]
    plan = model.plan(1, device)
    assert len(plan.launches) == (2 if heads else 3)  # batch 1: no re-layout at all


@pytest.mark.parametrize("n", [16, 37, 100])
def test_kernels_in_keras_order_need_no_re_layout_and_padded_buffers_travel_whole(device, rng, n):
    """gemm_tiled_c reads and writes Keras's memory order: the input is uploaded and the output
    downloaded where they lie, each buffer whole with its padded rows (13 -> 32, 5 -> 32) as zeros,
    so a plan of it is one launch per Dense layer (and the softmax a chosen kernel cannot fuse)."""
    model = dense_model([13, 29, 5], ["relu", "softmax"])
    try:
        kernel_choice.use(
            "matmul",
            "gemm_tiled_c",
            device,
            {"MWG": 32, "NWG": 16, "KWG": 16, "MDIMC": 8, "NDIMC": 8, "VW": 2, "LOCAL": 1, "STRIDED": 1},
        )
        x = rng.standard_normal((n, 13)).astype(np.float32)
        assert_close(model.predict(x), numpy_forward(model, x))
        plan = model.plan(batch_bucket(n), device)
        assert len(plan.launches) == 3, [r["kernel"] for r in plan.describe()]  # + the softmax
        assert all(r["kind"] != "relayout" for r in plan.describe())
        # the buffers' padding stayed 0 (x 10: logits of tens; at x 100 float32's rounding of logits
        # of hundreds alone moves a softmax output by 2e-5, beyond the tolerance, now and then)
        x2 = rng.standard_normal((n, 13)).astype(np.float32) * 10
        assert_close(model.predict(x2), numpy_forward(model, x2))
    finally:
        kernel_choice.forget(device)


def test_predict_is_one_upload_and_one_download_and_plans_are_kept(device, rng):
    model = dense_model([37, 13, 5], ["relu", None])
    x = rng.standard_normal((9, 37)).astype(np.float32)
    model.predict(x)
    plan = model.plan(9, device)
    assert model.plan(9, device) is plan
    before = dict(device.counters)
    model.predict(x)
    assert device.counters["uploads"] - before["uploads"] == 1
    assert device.counters["downloads"] - before["downloads"] == 1
    assert device.counters["launches"] - before["launches"] == len(plan.launches)


def test_a_pass_started_and_taken_later_equals_a_run_and_holds_the_plans_lock_until_taken(device, rng, monkeypatch):
    model = dense_model([37, 13, 5], ["relu", None])
    first, second = (rng.standard_normal((9, 37)).astype(np.float32) for _ in range(2))
    plan, other = model.plan(9, device), model.plan(9, device, replica=1)
    want = [plan.run([first])[0], plan.run([second])[0]]
    # two plans' passes in flight from one thread, then taken: what one run at a time gives
    pending = [plan.start([first]), other.start([second])]
    taken = [p.result()[0] for p in pending]
    np.testing.assert_array_equal(taken[0], want[0])
    np.testing.assert_array_equal(taken[1], want[1])
    with pytest.raises(RuntimeError, match="taken before"):
        pending[0].result()

    def free_elsewhere() -> bool:  # whether another thread can take the plan's lock now
        got = []

        def take() -> None:
            got.append(plan.lock.acquire(blocking=False))
            if got[0]:
                plan.lock.release()

        thread = threading.Thread(target=take)
        thread.start()
        thread.join()
        return got[0]

    started = plan.start([first])
    assert not free_elsewhere()  # another thread's pass waits until this one is taken
    np.testing.assert_array_equal(started.result()[0], want[0])
    assert free_elsewhere()

    def refused(*args):
        raise DeviceError("the driver refused the pass")

    monkeypatch.setattr(device, "start_pass", refused)
    with pytest.raises(DeviceError, match="refused"):  # a start that fails gives the lock back
        plan.start([first])
    assert free_elsewhere()


def test_passes_run_on_a_queue_without_profiling_and_a_launch_alone_is_timed_in_order(device, rng):
    if device.backend != "opencl":
        pytest.skip(f"{device.name} runs on {device.backend}: command queues are OpenCL's")
    profiling = 2  # CL_QUEUE_PROFILING_ENABLE
    assert not device.queue.properties & profiling and device.timing_queue.properties & profiling
    model = dense_model([37, 13, 5], ["relu", None])
    x, other = (rng.standard_normal((9, 37)).astype(np.float32) for _ in range(2))
    plan = model.plan(9, device)
    plan.run([x])
    # the upload and the read on the plan's queue, each launch alone on the timing queue between
    # them: they run after the upload and before the read (the other input's outputs come back)
    with plan.lock:
        in_flight = [device.upload(b, a, blocking=False, mapped=False) for b, a in plan._send([other], 9)]
        events = [launch.enqueue() for launch in plan.launches]
        results, downloads = plan._results(9)
        for buffer, array in downloads:
            device.download(buffer, array, blocking=True, mapped=False)
        got = plan._receive(results, 9)[0]
        del in_flight
    np.testing.assert_array_equal(got, model.predict(other))
    assert all(e.profile.end >= e.profile.start > 0 for e in events)  # the device's own times


def test_plans_are_made_again_when_weights_or_kernel_choices_change(device, rng):
    model = dense_model([8, 6, 3], ["relu", None])
    x = rng.standard_normal((4, 8)).astype(np.float32)
    first = model.predict(x)
    plan = model.plan(4, device)
    weights = model.get_weights()
    model.set_weights([w * 2 for w in weights])
    assert model.plan(4, device) is not plan
    assert_close(model.predict(x), numpy_forward(model, x))
    again = model.plan(4, device)
    ops.use("matmul", "cross1", device)
    try:
        assert model.plan(4, device) is not again
        assert {r["kernel"] for r in model.plan(4, device).describe() if r["kind"] == "matmul"} == {"cross1"}
    finally:
        kernel_choice.forget(device)
    model.set_weights(weights)
    np.testing.assert_array_equal(model.predict(x), first)


def test_an_unpadded_input_goes_from_the_callers_array_where_the_device_says_staging_does_not_pay(
    device, rng, monkeypatch
):
    """An input that fills its buffer exactly is uploaded from the caller's array unless the device
    stages it (Device.stages_input); a padded one always goes through the staging array. Both answer
    as numpy does, call after call, and a later pass with other values is not served stale data."""
    from malinn.backends import opencl

    model = dense_model([64, 32, 8], ["relu", None])
    x = rng.standard_normal((32, 64)).astype(np.float32)
    for stages in (False, True):
        monkeypatch.setattr(type(device), "stages_input", lambda self, nbytes, s=stages: s)
        model._plans.clear()  # a plan decides at allocation: make a new one
        plan = model.plan(32, device)
        ((_, _, value, direct, _),) = plan._io[0]
        assert direct == (value.storage.padded == (64, 32) and not stages)
        assert_close(model.predict(x), numpy_forward(model, x))
        assert_close(model.predict(-x), numpy_forward(model, -x))
    monkeypatch.undo()
    if device.backend == "opencl":  # page-locked staging below DIRECT_MIN_BYTES only, on a discrete GPU
        monkeypatch.setattr(device, "host_unified_memory", False)
        assert device.stages_input(opencl.PINNED_MIN_BYTES) and not device.stages_input(opencl.DIRECT_MIN_BYTES)
        assert not device.stages_input(opencl.PINNED_MIN_BYTES - 4)
        monkeypatch.setenv("MALINN_PINNED", "0")
        assert not device.stages_input(opencl.PINNED_MIN_BYTES)


def test_a_pass_smaller_than_its_bucket_is_exact_and_padded_with_zeros(device, rng):
    model = dense_model([13, 7, 5], ["sigmoid", "softmax"])
    assert batch_bucket(19) == 19 and batch_bucket(256) == 256 and batch_bucket(300) == 320
    x = rng.standard_normal((300, 13)).astype(np.float32)
    plan = model.plan(300, device)
    assert plan.batch == 320
    ((_, staging, _, _, _),) = plan._io[0]
    y = model.predict(x)
    assert staging[:300].any()  # 300 samples in a 320-sample plan go through the staging
    assert_close(y, numpy_forward(model, x))
    assert not staging[300:].any()
    np.testing.assert_array_equal(model.predict(x[:300]), y)


def test_the_activation_arena_reuses_buffers_by_liveness(device):
    model = dense_model([64] + [64] * 8, ["relu"] * 8)
    plan = model.plan(32, device)
    sizes = [size for size, _ in plan._arena()]
    # the input has its own buffer; eight results fit in two buffers used in turn (plus any re-layout)
    assert len(sizes) <= 4, sizes
    assert model.memory(32, device)["activations"] == sum(sizes)


def test_one_weight_copy_serves_small_and_large_batches(device, rng):
    model = dense_model([300, 200, 10], ["relu", None])
    for n in (1, 3, 100):
        model.predict(rng.standard_normal((n, 300)).astype(np.float32))
    kernels = {
        row["kernel"].split()[0]
        for row in model.plan(1, device).describe() + model.plan(100, device).describe()
        if row["kind"] == "matmul"
    }
    copies = [key for key in model.layers[0].device_copies if len(key) == 4 and key[0] is device and key[3] == "fp32"]
    layouts = {ops.load_library()[k].matrices["a"].representation for k in kernels}
    assert len(copies) == len(layouts), (copies, kernels)


def test_elementwise_models_keep_keras_shapes(device, rng):
    x = rng.standard_normal((3, 6, 5, 4)).astype(np.float32)
    model = Sequential([Activation("relu"), Softmax()])
    y = model.predict(x)
    assert y.shape == (3, 6, 5, 4) and model.output_shape == (None, 6, 5, 4)
    assert_close(y, ref_activation("softmax", np.maximum(x, 0).astype(np.float64), axis=-1))


def test_flatten_of_the_input_is_free_and_elsewhere_one_reshape(device, rng):
    x = rng.standard_normal((4, 5, 7)).astype(np.float32)
    free = Sequential([Flatten(), Dense(3)])
    free.build((None, 5, 7))
    assert_close(free.predict(x), numpy_forward(free, x))
    assert "reshape" not in [row["kind"] for row in free.plan(4, device).describe()]
    moved = Sequential([Activation("tanh"), Flatten(), Dense(3)])
    moved.build((None, 5, 7))
    assert_close(moved.predict(x), numpy_forward(moved, x))
    assert [row["kind"] for row in moved.plan(4, device).describe()].count("reshape") == 1


def test_every_layer_output_while_in_place_steps_work_on_copies(device, rng):
    model = Sequential([Dense(6, name="lin"), Activation("relu", name="act"), Dense(4, name="out")])
    model.build((None, 5))
    x = rng.standard_normal((3, 5)).astype(np.float32)
    lin, act, out = model.predict_layers(x)
    kernel, bias = model.layers[0].get_weights()
    want = x.astype(np.float64) @ kernel + bias
    assert_close(lin, want)  # downloaded before the in-place relu ran on its copy
    assert_close(act, np.maximum(want, 0))
    assert_close(out, numpy_forward(model, x))


def test_summary_names_the_kernel_of_every_layer(device):
    model = dense_model([37, 13, 5], ["relu", "softmax"])
    text = model.summary(print_fn=lambda s: None, show_kernels=True)
    rows = [row["Kernel"] for row in summary_rows(text) if "(Dense)" in row["Layer (type)"]]
    library = ops.load_library()
    codenames = library.codenames("matmul") + library.codenames("matmul_head")  # a GPU computes the head in the
    assert len(rows) == 2  # first layer's kernel
    assert all(row.split(" ")[0] in codenames for row in rows), rows
    assert "softmax" in rows[1]  # the head's softmax runs in its kernel
    assert "Kernel" not in model.summary(print_fn=lambda s: None)  # Keras's columns only, unless asked


def test_summary_lists_every_kernel_a_layer_launches(device):
    """A convolution run as patches and a product lists both kernels on its row (the product, with
    the bias and the next layer's activation fused, is not only on the activation's row); a layer
    fused into another's launch shows that launch."""
    model = Sequential([Conv2D(8, 3, name="conv"), ReLU(max_value=6.0, name="relu6"), Flatten(), Dense(3, name="head")])
    model.build((None, 9, 9, 3))
    described = model._compile(device, 2, False).describe()
    text = model.summary(print_fn=lambda s: None, show_kernels=True)
    lines = {
        row["Layer (type)"].split(" ")[0]: row["Kernel"]
        for row in summary_rows(text)
        if row["Layer (type)"].startswith(("conv (", "relu6 ("))
    }
    assert sorted(lines) == ["conv", "relu6"], text
    for name, line in lines.items():
        kernels = [row["kernel"].split(" ")[0] for row in described if name in row["layers"] and not row["view"]]
        assert kernels and all(k in line for k in kernels), (name, kernels, line)
    if any({"conv", "relu6"} <= set(row["layers"]) for row in described):  # the activation fused into the conv's launch
        assert "relu" in lines["conv"], lines["conv"]
    assert len([row for row in described if "conv" in row["layers"]]) > 1 or device.kind != "cpu", described


def test_an_unsatisfiable_layer_names_itself_and_the_shapes():
    model = Sequential([Dense(3, name="head")])
    model.build((None, 4))
    with pytest.raises(ValueError, match=r"expected shape \(None, 4\), found shape \(2, 5\)"):
        model.predict(np.zeros((2, 5), np.float32))


def test_a_pass_holds_its_uploads_in_flight_until_the_download(device, monkeypatch):
    """``predict``'s uploads do not block: what a non-blocking upload returns (pyopencl's event,
    which waits for its copy when freed) is held until the blocking download, so the launches are
    enqueued while the input travels; freed at once, each upload would finish before any launch."""
    model = dense_model([7, 5, 3], ["relu", "softmax"])
    plan = model.plan(4, device)
    order, upload, launch_all, download = [], device.upload, device.launch_all, device.download

    class Held:  # stands in for the upload's event; says when it is freed
        def __init__(self, event):
            self.event = event

        def __del__(self):
            order.append("upload freed")

    if device.backend == "opencl":  # its run_pass makes pyopencl's calls itself
        import pyopencl as cl

        copy, enqueue = cl.enqueue_copy, cl.enqueue_nd_range_kernel

        def copying(queue, dst, src, is_blocking=True, **kwargs):
            if is_blocking:
                order.append("download")
                return copy(queue, dst, src, is_blocking=True, **kwargs)
            return Held(copy(queue, dst, src, is_blocking=False, **kwargs))

        monkeypatch.setattr(cl, "enqueue_copy", copying)
        monkeypatch.setattr(
            cl, "enqueue_nd_range_kernel", lambda *a, **k: (order.append("launches"), enqueue(*a, **k))[1]
        )
    else:
        monkeypatch.setattr(device, "upload", lambda *a, **k: Held(upload(*a, **k)))
        monkeypatch.setattr(device, "launch_all", lambda launches: (order.append("launches"), launch_all(launches)))
        monkeypatch.setattr(device, "download", lambda *a, **k: (order.append("download"), download(*a, **k)))
    x = np.random.default_rng(0).standard_normal((4, 7)).astype(np.float32)
    got = plan.run([x])[0]
    launches = 1 if device.backend != "opencl" else len(plan.launches)
    assert order == ["launches"] * launches + ["download", "upload freed"], order
    assert_close(got, numpy_forward(model, x))


def test_the_largest_buffer_is_named_for_what_it_holds(device):
    """A copy of the input in the layout the matmul reads is named as that (it was described as the
    Dense layer's output, of 5000 features where the layer has 4)."""
    kernel_choice.use("matmul", "gemm_tiled", device=device)  # reads B row-major: the input is re-laid out
    model = Sequential([Dense(4, name="d")])
    model.build((None, 5000))
    size, what = model.activation_bytes(300, device)
    assert what.startswith("the model's input re-laid out (5000 features x 320 samples, padded to "), what
    assert what.endswith("for kernel gemm_tiled)") and size >= 4 * 5000 * 320


def test_a_kernel_without_a_source_for_the_backend_is_refused_when_planned(device):
    """An explicit choice of a kernel the device's backend has no source for is refused when the
    plan is made: the summary said it ran the layers, and predict refused it."""
    if load_library()["gemv_rows"].has_source(device.backend):
        pytest.skip(f"gemv_rows runs on {device.backend}")
    kernel_choice.use("matmul", "gemv_rows", device=device)
    model = Sequential([Dense(6, activation="relu", name="d"), Dense(3)])
    model.build((None, 5))
    text = model.summary(print_fn=lambda s: None)
    assert f"No kernels on {device.name}: layer 'd'" in text and "kernel 'gemv_rows' has no" in text, text
    with pytest.raises(BackendError, match=rf"layer .d.*: kernel .gemv_rows. has no {device.backend} source"):
        model.predict(np.ones((1, 5), np.float32))
