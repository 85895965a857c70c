"""Start-up with warm caches: a new process builds no program, runs no probe kernel, and probes no
device beyond the one its choice needs; the probe cache follows the driver (benchmarks/cold_start.py
times it)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pyopencl as cl
import pytest

import malinn
from malinn.backends import opencl
from malinn.io.cache import read_entry

CHILD = r"""
import json, sys
import numpy as np
import malinn
from malinn.backends import opencl
model = malinn.load_model(sys.argv[1])
y = model.predict(np.ones((2, 6), np.float32))
device = malinn.get_device()
print(json.dumps({"y": y.tolist(), "builds": device.counters["builds"], "hits": device.counters["binary_hits"],
                  "probes": opencl.probe_stats, "index": list(device.index)}))
"""


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    model = malinn.Sequential([malinn.layers.Dense(5, activation="relu"), malinn.layers.Dense(3)])
    model.build((None, 6))
    model.set_weights([w + 0.25 for w in model.get_weights()])
    return model.save(tmp_path_factory.mktemp("cold") / "small.malinn")


def run(path, cache_dir, **env) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "MALINN_CACHE_DIR": str(cache_dir), "MALINN_BINARY_CACHE": "1", **env},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_warm_new_process_builds_nothing_and_runs_no_probe_kernel(model_file, tmp_path):
    first = run(model_file, tmp_path)
    assert first["builds"] >= 1 and first["hits"] == 0 and first["probes"]["run"] >= 1
    second = run(model_file, tmp_path)
    assert second["y"] == first["y"] and second["index"] == first["index"]
    assert second["builds"] == 0 and second["hits"] == first["builds"]
    assert second["probes"] == {"run": 0, "cached": first["probes"]["run"]}


def test_the_probe_cache_can_be_turned_off(model_file, tmp_path):
    run(model_file, tmp_path)
    again = run(model_file, tmp_path, MALINN_PROBE_CACHE="0")
    assert again["probes"]["run"] >= 1 and again["probes"]["cached"] == 0 and again["builds"] == 0


def test_a_driver_update_runs_the_probe_again(monkeypatch, tmp_path):
    """The device reports another driver string (as after an update): the cached result is not used."""
    monkeypatch.setenv("MALINN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(opencl, "probe_stats", {"run": 0, "cached": 0})
    first = opencl.discover()
    assert first and opencl.probe_stats == {"run": len(first), "cached": 0}
    assert all(read_entry("probes", opencl.probe_key(d)) is not None for d in first)
    opencl.discover()
    assert opencl.probe_stats == {"run": len(first), "cached": len(first)}
    monkeypatch.setattr(cl.Device, "driver_version", property(lambda self: "9.9.9-updated"))
    updated = opencl.discover()
    assert [d.driver_version for d in updated] == ["9.9.9-updated"] * len(first)
    assert opencl.probe_stats == {"run": 2 * len(first), "cached": len(first)}
    assert len(list((tmp_path / "probes").iterdir())) == 2 * len(first)


def test_a_damaged_probe_entry_runs_the_probe_again(monkeypatch, tmp_path):
    monkeypatch.setenv("MALINN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(opencl, "probe_stats", {"run": 0, "cached": 0})
    found = opencl.discover()
    for entry in (tmp_path / "probes").iterdir():
        entry.write_bytes(entry.read_bytes()[:-1] + b"X")
    with pytest.warns(RuntimeWarning, match="damaged probe cache entry"):
        opencl.discover()
    assert opencl.probe_stats == {"run": 2 * len(found), "cached": 0}


def test_the_first_choice_probes_only_gpus_up_to_the_first_working_one(monkeypatch):
    probed = []
    real = opencl.probe

    def spy(cl_module, platform, cl_device, index):
        probed.append(index)
        return real(cl_module, platform, cl_device, index)

    monkeypatch.setattr(opencl, "probe", spy)
    known = {}
    gpu = opencl.first_gpu(known)
    gpus = [d for d in malinn.devices() if d.backend == "opencl" and d.kind == "gpu"]
    assert (gpu.index if gpu else None) == (gpus[0].index if gpus else None)
    listed = [
        (pi, di)
        for pi, p in enumerate(cl.get_platforms())
        for di, d in enumerate(p.get_devices())
        if d.type & cl.device_type.GPU
    ]
    assert probed == (listed[: listed.index(gpu.index) + 1] if gpu else listed)
    assert set(known) == set(probed)
    count = len(probed)
    again = opencl.discover(known)  # the full discovery reuses those probes
    assert [d.index for d in again] == [d.index for d in malinn.devices() if d.backend == "opencl"]
    assert not set(probed[:count]) & set(probed[count:])
    if gpu is not None:
        assert next(d for d in again if d.index == gpu.index) is gpu


def test_the_lazy_choice_is_the_device_listed_later():
    script = (
        "import malinn; d = malinn.get_device(); listed = malinn.devices(); "
        "assert any(x is d for x in listed), (d, listed); malinn.set_device(d); "
        "assert malinn.get_device() is d; print(d.index)"
    )
    env = {k: v for k, v in os.environ.items() if k != "MALINN_DEVICE"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = malinn.devices()
    gpus = [d for d in found if d.kind == "gpu"]
    assert out.stdout.strip() == str((gpus[0] if gpus else next(d for d in found if d.kind == "cpu")).index)


def test_loading_a_model_file_draws_no_random_weights(model_file, monkeypatch):
    """Every weight comes from the file: building the layers first draws nothing (for Full CIFAR a
    draw of 25 M weights cost a third of a second before its first prediction)."""
    expected = malinn.load_model(model_file).get_weights()

    def no_draw(*args, **kwargs):
        raise AssertionError("a random draw while loading a model file")

    monkeypatch.setattr(np.random, "default_rng", no_draw)
    loaded = malinn.load_model(model_file)
    for got, want in zip(loaded.get_weights(), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert np.count_nonzero(loaded.get_weights()[0]) > 0
    monkeypatch.undo()
    fresh = malinn.Sequential([malinn.layers.Dense(5)])  # a model built in code still draws Glorot values
    fresh.build((None, 6))
    kernel = fresh.get_weights()[0]
    assert np.count_nonzero(kernel) == kernel.size and np.abs(kernel).max() <= np.sqrt(6 / 11)


# ---------------------------------------------------------------- fewer programs, built side by side
def _window_model(shape, strides):
    from malinn.layers import DepthwiseConv2D, MaxPooling2D, ZeroPadding2D

    model = malinn.Sequential(
        [
            ZeroPadding2D(((1, 2), (2, 1)), name="pad"),
            DepthwiseConv2D(3, strides=strides, padding="same", activation="relu", name="dw"),
            MaxPooling2D(2, padding="same", name="pool"),
        ]
    )
    model.build((None,) + shape)
    return model


def _window_reference(model, x):
    from support import depthwise_reference, pool2d_reference

    padded = np.pad(x, ((0, 0), (1, 2), (2, 1), (0, 0)))
    dw = next(layer for layer in model.layers if layer.name == "dw")
    y = np.maximum(depthwise_reference(padded, dw.depthwise_kernel, dw.bias, dw.strides, (1, 1), "same"), 0)
    return pool2d_reference(y, (2, 2), (2, 2), "same", "max")


def test_layers_of_other_shapes_share_one_program(device, rng):
    """Sizes, strides and padding are kernel arguments (kernels/library.json "argdefines"): the
    padding, the depthwise convolution and the pooling of a second model of other image sizes and
    strides reuse the first one's programs and compute their own shapes right (odd and large images)."""
    if device.backend != "opencl":
        pytest.skip("a GLSL source takes its sizes as defines")
    programs = device.cache.setdefault("kernel_programs", {})
    families = ("spatial_copy", "conv_depthwise", "pool")
    seen = None
    for shape, strides, batch in (((13, 11, 3), 1, 2), ((61, 33, 5), 2, 3), ((1, 301, 4), 1, 1)):
        model = _window_model(shape, strides)
        model.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in model.get_weights()])
        x = rng.standard_normal((batch,) + shape).astype(np.float32)
        want = _window_reference(model, x)
        np.testing.assert_allclose(model.predict(x), want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()))
        ours = {key for key in programs if key[0] in families}
        if seen is None:
            seen = ours
            assert {key[0] for key in ours} == set(families), ours
        else:
            assert ours == seen, sorted(ours - seen)


def test_slices_of_a_concatenation_share_one_program(device, rng):
    """A slice's offset is an argument of the kernel that writes it (R_OFFSET, R_SPARE: R_VIEW_ARGS),
    and a concatenation's lengths of the concat kernel: a concatenation of more and wider parts
    builds no program of those kernels that a smaller one built, and computes the same as numpy."""
    if device.backend != "opencl":
        pytest.skip("slices of a concatenation are written in place by OpenCL kernels only")
    from malinn import Functional, Input
    from malinn.layers import Concatenate, Dense, Flatten

    programs = device.cache.setdefault("kernel_programs", {})
    before = None
    for units, inputs in (((5, 3), 8), ((7, 13, 1, 4), 8)):
        x_in = Input((inputs,), name="x")
        parts = [Dense(u, activation="relu", name=f"p{i}")(x_in) for i, u in enumerate(units)]
        flat = Flatten(name="flat")(x_in)
        cat = Concatenate(name="cat")(parts + [flat])  # the input's copy: the concat kernel itself
        model = Functional(x_in, Dense(3, name="out")(cat))
        x = rng.uniform(-1, 1, (2, inputs)).astype(np.float32)
        layers = {layer.name: layer for layer in model.layers}
        dense = [np.maximum(x @ layers[f"p{i}"].kernel + layers[f"p{i}"].bias, 0) for i in range(len(units))]
        joined = np.concatenate(dense + [x], axis=-1)
        want = joined @ layers["out"].kernel + layers["out"].bias
        np.testing.assert_allclose(model.predict(x), want, rtol=1e-4, atol=1e-5)
        assert not [
            key
            for key in programs
            for option in key[2]
            if option.startswith(("-DR_OFFSET=", "-DR_SPARE=", "-DALEN=", "-DRLEN=", "-DOFFSET="))
        ]
        concats = {key for key in programs if key[0] == "concat"}
        assert concats and any("-DR_VIEW=1" in key[2] for key in programs), sorted(programs)
        if before is None:
            before = concats
        else:
            assert concats == before, sorted(concats - before)


BUILDS_CHILD = r"""
import json, sys
import numpy as np
import malinn
from malinn.errors import KernelBuildError
model = malinn.load_model(sys.argv[1])
x = np.ones((2, 6), np.float32)
y = model.predict(x)
device = malinn.get_device()
print(json.dumps({"y": y.tolist(), "builds": device.counters["builds"], "hits": device.counters["binary_hits"],
                  "pending": len(device.pending), "kind": device.kind}))
"""


@pytest.mark.parametrize("threads", ["1", "3"])
def test_programs_built_side_by_side_are_stored_for_the_next_process(model_file, tmp_path, threads):
    """MALINN_BUILD_THREADS: the plan's programs built on several threads (or one) give the same
    values, and each build thread stores its program's binary: the next process builds nothing."""
    env = {**os.environ, "MALINN_CACHE_DIR": str(tmp_path), "MALINN_BINARY_CACHE": "1", "MALINN_BUILD_THREADS": threads}

    def run_child():
        out = subprocess.run(
            [sys.executable, "-c", BUILDS_CHILD, str(model_file)], capture_output=True, text=True, timeout=300, env=env
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    first, second = run_child(), run_child()
    model = malinn.load_model(model_file)
    want = model.predict(np.ones((2, 6), np.float32))
    np.testing.assert_allclose(np.array(first["y"]), want, rtol=1e-5, atol=1e-6)
    assert second["y"] == first["y"] and first["pending"] == second["pending"] == 0
    # (a CPU's plan runs two programs here; a GPU's computes both layers in one: gemv_split_c_head)
    assert first["builds"] >= (2 if first["kind"] == "cpu" else 1)
    assert second["builds"] == 0 and second["hits"] == first["builds"]


def test_a_program_that_fails_to_build_beside_others_fails_the_plan(device, monkeypatch, tmp_path):
    """A failed build on a build thread is raised when the plan is made, naming the layer and its
    shapes, and again by a later run; the device's other launches are unaffected."""
    if device.backend != "opencl":
        pytest.skip("OpenCL's build threads")
    from malinn.errors import KernelBuildError
    from malinn.library import kernel_library
    from malinn.library.kernel_library import load_library
    from malinn.resources import kernels_dir

    folder = tmp_path / "kernels"
    shutil.copytree(kernels_dir(), folder)
    (folder / "concat.cl").write_text((folder / "concat.cl").read_text() + "\nthis is not OpenCL C;\n")
    broken = load_library(folder / "library.json")
    monkeypatch.setattr(kernel_library, "_default_library", lambda: broken)
    monkeypatch.setenv("MALINN_BUILD_THREADS", "2")
    monkeypatch.setenv("MALINN_BINARY_CACHE", "0")
    from malinn import Functional, Input
    from malinn.layers import Concatenate, Dense, Flatten

    x_in = Input((4,), name="x")
    model = Functional(x_in, Concatenate(name="cat")([Dense(3, name="d")(x_in), Flatten(name="flat")(x_in)]))
    for _ in range(2):
        with pytest.raises(KernelBuildError) as info:
            model.predict(np.ones((1, 4), np.float32))
        assert "'cat'" in str(info.value) and "concat.cl" in str(info.value), str(info.value)[:500]
    assert not device.pending


def test_the_number_of_build_threads_is_checked(monkeypatch):
    monkeypatch.setenv("MALINN_BUILD_THREADS", "0")
    with pytest.raises(malinn.errors.SettingError, match="MALINN_BUILD_THREADS='0'"):
        opencl.build_threads()
    monkeypatch.setenv("MALINN_BUILD_THREADS", "4")
    assert opencl.build_threads() == 4
    monkeypatch.delenv("MALINN_BUILD_THREADS")
    assert 1 <= opencl.build_threads() <= 8


# ---------------------------------------------------------------- few work-group shapes per kernel
def _dense_block(channels, growths, size):
    """A DenseNet-like block: each step a BatchNormalization (of a concatenation: not folded into a
    convolution), a ReLU and a 1x1 convolution whose output is concatenated to the step's input, so
    the element-wise kernels run over a range of another width at every step."""
    from malinn import Functional, Input
    from malinn.layers import BatchNormalization, Concatenate, Conv2D, ReLU

    x_in = Input(size + (channels,), name="x")
    h = x_in
    for i, growth in enumerate(growths):
        y = ReLU(name=f"relu{i}")(BatchNormalization(name=f"bn{i}")(h))
        h = Concatenate(name=f"cat{i}")([h, Conv2D(growth, 1, name=f"conv{i}")(y)])
    return Functional(x_in, h)


def _dense_block_reference(model, x, growths):
    layers = {layer.name: layer for layer in model.layers}
    h = x
    for i in range(len(growths)):
        gamma, beta, mean, variance = layers[f"bn{i}"].get_weights()
        y = np.maximum(gamma * (h - mean) / np.sqrt(variance + 1e-3) + beta, 0)
        conv = layers[f"conv{i}"]
        h = np.concatenate([h, y @ conv.kernel[0, 0] + conv.bias], axis=-1)
    return h


def test_element_wise_kernels_of_many_widths_run_in_few_work_group_shapes(device, rng):
    """kernels/library.json "workgroup_bound": on a device class an entry bounds (PoCL's CPU: it
    compiles a kernel again for each work-group shape it is launched with), every launch of that
    kernel runs in the shape of the greatest common divisors of its range and the bound, so a block
    whose every step widens the ranges runs each such kernel in fewer shapes than it has ranges and
    computes what numpy does; elsewhere the driver chooses."""
    from malinn.choice.kernel_call import bounded_range
    from malinn.library.kernel_library import load_library

    growths, size = (8, 16, 24, 8, 16), (5, 6)
    model = _dense_block(8, growths, size)
    weights = []
    for layer in model.layers:
        if layer.name.startswith("bn"):
            gamma, beta, mean, variance = (w.shape for w in layer.get_weights())
            weights += [rng.uniform(0.5, 1.5, gamma), rng.standard_normal(beta), rng.standard_normal(mean)]
            weights.append(rng.uniform(0.5, 1.5, variance))
        else:
            weights += [0.3 * rng.standard_normal(w.shape) for w in layer.get_weights()]
    model.set_weights([w.astype(np.float32) for w in weights])
    x = rng.standard_normal((2,) + size + (8,)).astype(np.float32)
    want = _dense_block_reference(model, x, growths)
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())

    library = load_library()
    ranges, shapes = {}, {}
    for launch in model.plan(2).launches:
        bound = library[launch.function].workgroup_bound(device)
        if bound is None:
            continue
        limit = library[launch.function].workgroup_item_limit(device)
        assert launch.local_size == bounded_range(bound, launch.global_size, device, limit), (launch, bound)
        ranges.setdefault(launch.function, set()).add(tuple(launch.global_size))
        shapes.setdefault(launch.function, set()).add(launch.local_size)
    if device.backend == "opencl" and device.kind == "cpu":  # the shipped library bounds these there
        assert {"relu", "scale_shift"} <= set(ranges), sorted(ranges)
        assert all(len(shapes[f]) < len(ranges[f]) for f in ("relu", "scale_shift")), (shapes, ranges)
        assert all(s is not None and np.prod(s) > 1 for f in shapes for s in shapes[f]), shapes


def test_element_wise_kernels_on_a_gpu_fill_their_work_groups_along_the_rows_first():
    """On an OpenCL GPU the shipped library bounds the element-wise kernels at 32 x 256 with 256
    items a work-group (``workgroup_items``): a range of 3 rows (an image's channels) runs in
    1 x 256 groups, 32 or 96 rows in 32 x 8, 144 in 16 x 16, 24 in 8 x 32, the shapes measured
    fastest on the H200 where the driver's own choice ran 2-50x slower; depthwise convolutions in
    16 x 16; every shape divides its range."""
    from support import described_gpu

    from malinn.choice.kernel_call import bounded_range
    from malinn.library.kernel_library import load_library

    gpu, library = described_gpu(), load_library()
    columns = 256 * 112 * 112
    for function in ("relu", "relu_general", "swish", "scale_shift", "broadcast", "spatial_copy", "merge"):
        spec = library[function]
        bound, limit = spec.workgroup_bound(gpu), spec.workgroup_item_limit(gpu)
        assert (bound, limit) == ((32, 256), 256), (function, bound, limit)
        for rows, want in ((3, (1, 256)), (32, (32, 8)), (96, (32, 8)), (144, (16, 16)), (24, (8, 32))):
            assert bounded_range(bound, (rows, columns), gpu, limit) == want, (function, rows)
    depthwise = library["conv_depthwise"]
    shape = bounded_range(depthwise.workgroup_bound(gpu), (192, 802816), gpu, depthwise.workgroup_item_limit(gpu))
    assert shape == (16, 16)
    # a range few powers of two divide: the driver's shape below a quarter of the items, else the bound's
    assert bounded_range((32, 256), (7, 1001), gpu, 256) is None
    assert bounded_range((32, 256), (96, 12769), gpu, 256) is None  # 32 x 1
    assert bounded_range((32, 256), (96, 12), gpu, 256) == (32, 4)
    assert bounded_range((32, 256), (96, 12), gpu) == (32, 4)  # without a limit: per-axis gcds


def test_a_work_group_bound_of_another_rank_is_refused_by_name(tmp_path):
    from malinn.errors import LibraryError
    from malinn.library.kernel_library import load_library
    from malinn.resources import kernels_dir

    folder = tmp_path / "kernels"
    shutil.copytree(kernels_dir(), folder)
    data = json.loads((folder / "library.json").read_text())
    for bound, field in (([16], "restrictions.workgroup_bound"), ([16, 0], "restrictions.workgroup_bound.opencl:cpu")):
        data["kernels"]["relu"]["restrictions"]["workgroup_bound"] = {"opencl:cpu": bound}
        (folder / "library.json").write_text(json.dumps(data))
        with pytest.raises(LibraryError, match=f"kernel 'relu', field '{field}'"):
            load_library(folder / "library.json")
