"""Which algorithm each convolution layer runs: the library's rules by geometry, the patch budget,
the tuner's winners per geometry (stored, read, checked), decided once per plan."""

import importlib
import io
import json
import re
import warnings

import numpy as np
import pytest
from support import conv2d_reference, python_env

import malinn
from malinn.backends.base import Device
from malinn.choice import conv_choice, kernel_choice, tuning_db
from malinn.choice.conv_choice import ConvGeometry, choose_algorithm, holds, patch_budget, patch_bytes, rules
from malinn.layers import Conv2D
from malinn.layers.windows import window_defines
from malinn.tuning import conv_tuner


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MALINN_CACHE_DIR", str(tmp_path))
    tuning_db.forget()
    yield tmp_path
    tuning_db.forget()


def geometry(batch, h, cin, cout, k, stride=1, dilation=1, padding="same", groups=1, w=None):
    return ConvGeometry.of(
        batch, cin, cout, groups, window_defines((h, w or h), (k, k), (stride, stride), (dilation, dilation), padding)
    )


def conv_model(h, cin, cout, k, seed=0, **kwargs):
    layer = Conv2D(cout, k, padding="same", activation="relu", **kwargs)
    model = malinn.Sequential([layer])
    model.build((None, h, h, cin))
    rng = np.random.default_rng(seed)
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in model.get_weights()])
    return model, layer


def conv_kernels(plan) -> list:
    return [s.spec.codename for s in plan.steps if s.kind.name in ("conv", "im2col")]


def test_geometry_keys_round_trip_and_bad_keys_are_refused():
    g = geometry(8, 27, 96, 256, 5, w=13)
    assert g.key() == "b8-c96-m256-g1-i27x13-o27x13-k5x5-s1x1-d1x1-p2x2"
    assert ConvGeometry.parse(g.key()) == g
    assert g.product() == (256, 25 * 96, 8 * 27 * 13) and patch_bytes(g) == 4 * 25 * 96 * 8 * 27 * 13
    for bad in (
        "",
        "b8-c96",
        "b0-c96-m256-g1-i27x13-o27x13-k5x5-s1x1-d1x1-p2x2",
        "b8-c96-m256-g1-i27x13-o27x13-k5x5-s1x1-d1x1-p2x2-x",
        "b8-c96-m256-g1-i27-o27x13-k5x5-s1x1-d1x1-p2x2",
    ):
        with pytest.raises(ValueError, match="convolution geometry"):
            ConvGeometry.parse(bad)


def test_gpu_rules_put_the_measured_winner_first():
    """From benchmarks/results/convolution_nvidia_h200.json and conv_sweep_nvidia_h100.json: kn2col
    for few input channels, im2row for small images, the register-blocked implicit GEMM
    (conv_implicit) from 257 to 4096 output pixels with its K split over more work-groups the fewer
    its tiles, and up to 50176 pixels for at most 128 input channels; im2row for larger layers whose
    patches fit, kn2col's implicit GEMM with 64 x 64 tiles where they do not."""
    table = conv_choice._section()
    gpu = table["rules"]["gpu"]
    library = malinn.load_library()

    def first(g, budget):
        for rule in gpu:
            spec = library[rule["codename"]].configure(rule.get("defines"))
            fits = spec.op != "im2col" or patch_bytes(g) <= budget
            if holds(rule.get("when", {}), g) and fits and (spec.op != "conv" or spec.accepts(*g.product())):
                return spec
        return None

    budget = table["patch_budget_mib"]["gpu"] * 2**20
    assert first(geometry(1, 28, 16, 32, 5), budget).codename == "conv_kn2col"  # inception_3a/5x5
    assert first(geometry(1, 28, 16, 32, 5), budget).config["LOCAL"] == "0"
    assert first(geometry(1, 13, 256, 384, 3), budget).codename == "im2row"  # AlexNet conv3, batch 1
    for args, tile, slices in [
        ((8, 13, 384, 256, 3), "64", "4"),  # AlexNet conv5, batch 8: 88 tiles
        ((1, 27, 96, 256, 5), "64", "4"),  # AlexNet conv2, batch 1: 48 tiles
        ((1, 28, 512, 512, 3), "64", "2"),  # VGG conv4_3, batch 1: 104 tiles
        ((8, 7, 48, 128, 5), "32", "8"),  # inception_5b/5x5, batch 8
        ((8, 27, 96, 256, 5), "64", "1"),
    ]:  # AlexNet conv2, batch 8: 5832 pixels
        implicit = first(geometry(*args), budget)
        assert implicit.codename == "conv_implicit", args
        assert (implicit.config["TN"], implicit.config["SLICES"]) == (tile, slices), args
    assert first(geometry(8, 112, 128, 128, 3), budget).codename == "im2row"  # VGG conv2_2, batch 8
    assert first(geometry(8, 28, 512, 512, 3), budget).codename == "im2row"  # VGG conv4_3, batch 8
    staged = first(geometry(8, 224, 64, 64, 3), budget)  # VGG conv1_2: 882 MiB patches
    assert staged.codename == "conv_kn2col" and staged.config["LOCAL"] == "2" and staged.config["KC"] == "16"
    tiny = first(geometry(1, 3, 40, 2, 3), 0)  # no room for patches, too small to stage
    assert tiny.codename == "conv_kn2col" and tiny.config["LOCAL"] == "0"
    for kind, found in table["rules"].items():  # every kind ends in a conv kernel that takes any layer
        assert library[found[-1]["codename"]].op == "conv" and not found[-1].get("when"), kind
        assert not library[found[-1]["codename"]].configure(found[-1].get("defines")).preconditions or library[
            found[-1]["codename"]
        ].configure(found[-1].get("defines")).accepts(1, 1, 1), kind


def test_the_tuner_times_the_untuned_default_first(device):
    if device.backend != "opencl":
        pytest.skip("convolutions run on OpenCL devices")
    for g in (geometry(1, 13, 40, 8, 3), geometry(2, 9, 3, 16, 5), geometry(1, 6, 8, 4, 3, groups=2)):
        found = conv_tuner.candidates(device, g, quick=True)
        assert found[0] == conv_choice.default_algorithm(device, g) == choose_algorithm(device, g)[0]
        assert len(found) == len({(s.codename, s.defines) for s in found}) > 1


def test_the_patch_budget_keeps_im2col_off_layers_whose_patches_do_not_fit(device):
    if device.backend != "opencl":
        pytest.skip("convolutions run on OpenCL devices")
    budget = patch_budget(device)
    assert 0 < budget <= device.max_allocation // 4
    small = geometry(1, 13, 32, 32, 3)
    large = geometry(64, 224, 64, 64, 3)
    assert patch_bytes(small) <= budget < patch_bytes(large)
    for spec, when in rules(device):
        if spec.op == "im2col" and holds(when, small):
            assert choose_algorithm(device, small)[0].op == "im2col"
            break
    spec, why = choose_algorithm(device, large)
    assert spec.op == "conv" and why == "default"
    # an explicit im2col choice is the user's: it is not second-guessed
    kernel_choice.use("im2col", "im2row", device=device)
    assert choose_algorithm(device, large) == (malinn.load_library()["im2row"], "explicit")


def test_the_choice_is_made_once_per_plan_never_in_predict(device, rng, monkeypatch):
    if device.backend != "opencl":
        pytest.skip("convolutions run on OpenCL devices")
    calls = []
    conv_kind = importlib.import_module("malinn.plan.kinds.conv")  # the module (the package exports its function)
    original = conv_kind.choose_algorithm
    monkeypatch.setattr(conv_kind, "choose_algorithm", lambda d, g: calls.append(g) or original(d, g))
    model, layer = conv_model(9, 5, 7, 3)
    x = rng.standard_normal((3, 9, 9, 5)).astype(np.float32)
    want = np.maximum(conv2d_reference(x, layer.kernel, layer.bias, padding="same"), 0)
    for _ in range(3):
        np.testing.assert_allclose(model.predict(x), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert len(calls) == 1 and (calls[0].cin, calls[0].cout, calls[0].IH, calls[0].batch) == (5, 7, 9, 3)


def test_tuner_stores_the_winner_per_geometry_and_the_plan_runs_it(device, cache, rng):
    if device.backend != "opencl":
        pytest.skip("convolutions run on OpenCL devices")
    model, layer = conv_model(7, 6, 5, 3)
    (g,) = model.conv_geometries(2, device)
    assert g == geometry(2, 7, 6, 5, 3)
    progress = io.StringIO()
    found = conv_tuner.tune_convs([g, g], device, quick=True, repeat=1, stream=progress)
    won = found["convs"][g.key()]
    assert found["untuned"] == [] and won["seconds"] > 0 and g.key() in progress.getvalue()
    stored = json.loads((cache / "tuning.json").read_text())["devices"][device.identity]["convs"][g.key()]
    assert stored["codename"] == won["codename"]
    assert tuning_db.tuned_conv(device, g)[0] == won["codename"]
    spec, why = choose_algorithm(device, g)
    assert why == "tuned" and spec.codename == won["codename"]
    assert won["codename"] in conv_kernels(model.plan(2, device))
    x = rng.standard_normal((2, 7, 7, 6)).astype(np.float32)
    want = np.maximum(conv2d_reference(x, layer.kernel, layer.bias, padding="same"), 0)
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize(
    "codename, defines",
    [("conv_kn2col", {}), ("im2col", {}), ("conv_kn2row", {"MWI": 2, "NWI": 4, "MDIM": 8, "NDIM": 16})],
)
def test_a_stored_winner_replaces_the_default_at_the_next_plan(device, cache, rng, codename, defines):
    if device.backend != "opencl":
        pytest.skip("convolutions run on OpenCL devices")
    model, layer = conv_model(6, 4, 3, 3)
    before = conv_kernels(model.plan(1, device))
    g = geometry(1, 6, 4, 3, 3)
    tuning_db.save(device, convs={g.key(): {"codename": codename, "defines": defines, "seconds": 1e-5}})
    plan = model.plan(1, device)
    assert conv_kernels(plan)[0] == codename, before
    spec = next(s.spec for s in plan.steps if s.kind.name in ("conv", "im2col"))
    assert all(spec.config[k] == str(v) for k, v in defines.items())
    x = rng.standard_normal((1, 6, 6, 4)).astype(np.float32)
    want = np.maximum(conv2d_reference(x, layer.kernel, layer.bias, padding="same"), 0)
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize(
    "entry, why",
    [
        ({"codename": "gemm_tiled"}, "not a conv or im2col kernel"),
        ({"codename": "conv_kn2row", "defines": {"MWI": 3}}, "not a configuration"),
        ({"codename": "nothing"}, "not a conv or im2col kernel"),
        ("im2row", "expected an object"),
    ],
)
def test_a_bad_stored_conv_winner_is_ignored_with_a_warning(device, cache, entry, why):
    g = geometry(1, 6, 4, 3, 3)
    data = {
        "format": "malinn-tuning",
        "version": 1,
        "devices": {device.identity: {"convs": {g.key(): entry, "b1-c1": {"codename": "im2row"}}}},
    }
    (cache / "tuning.json").write_text(json.dumps(data))
    tuning_db.forget()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tuning_db.tuned_conv(device, g) is None
    messages = " | ".join(str(w.message) for w in caught)
    assert why in messages and "'b1-c1' is not a convolution geometry" in messages


def test_the_tuners_reference_is_the_keras_convolution(rng):
    for g_args, kwargs in [
        ((2, 7, 6, 4, 3), {"stride": 2, "padding": "valid"}),
        ((1, 9, 4, 6, 3), {"dilation": 2, "groups": 2}),
        ((3, 5, 3, 5, 5), {}),
    ]:
        g = geometry(*g_args, **kwargs)
        kernel = rng.standard_normal((g.KH, g.KW, g.cg, g.cout))
        x = rng.standard_normal((g.batch, g.IH, g.IW, g.cin))
        got = conv_tuner.reference(x, kernel.reshape(-1, g.cout).T, g)
        want = conv2d_reference(x, kernel, None, (g.SH, g.SW), (g.DH, g.DW), kwargs.get("padding", "same"), g.groups)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_cli_tune_model_stores_a_winner_per_convolution_layer(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = python_env(MALINN_CACHE_DIR=str(tmp_path))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "malinn.cli",
            "tune",
            "--model",
            str(root / "examples" / "digits_cnn.keras"),
            "--batch",
            "1",
            "--quick",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 convolutions tuned (none left untuned)" in out.stdout
    devices = json.loads((tmp_path / "tuning.json").read_text())["devices"]
    convs = next(entry["convs"] for entry in devices.values() if "convs" in entry)
    assert sorted(convs) == [
        "b1-c1-m16-g1-i8x8-o8x8-k3x3-s1x1-d1x1-p1x1",
        "b1-c16-m32-g1-i4x4-o4x4-k3x3-s1x1-d1x1-p1x1",
    ]
    assert all(
        won["codename"] in ("conv_kn2row", "conv_kn2col", "conv_implicit", "im2row", "im2col") for won in convs.values()
    )


def described_gpu(max_work_group_size: int, local_memory: int, max_allocation: int = 2**28):
    """A GPU as its driver would describe it (no context: the decisions read the figures only)."""
    return Device(
        backend="opencl",
        index=(0, 0),
        name=f"GPU of {max_work_group_size}-item groups",
        platform="test",
        vendor="test",
        type="GPU",
        compute_units=4,
        global_memory=2**30,
        max_allocation=max_allocation,
        max_work_group_size=max_work_group_size,
        max_work_item_sizes=(max_work_group_size,) * 3,
        local_memory=local_memory,
        image_support=False,
        image2d_max_size=(0, 0),
        opencl_c_version="OpenCL C 1.2",
        driver_version="1",
        host_unified_memory=True,
    )


@pytest.mark.parametrize("limits", [(256, 16384), (64, 32768), (64, 16384)])
def test_a_rule_whose_kernel_the_device_cannot_launch_gives_way(limits):
    """On a board's GPU (work-groups of 64-256 items, 16-32 KiB of local memory) every layer gets
    an algorithm the device can launch: the GPU rules' implicit GEMM (128 items, 16 KiB and more)
    and kn2col's staged configuration (16 x 8 items) were chosen, and the driver refused the launch."""
    small, big = described_gpu(*limits), described_gpu(1024, 49152, 2**32)
    for args in [
        (1, 56, 64, 64, 3),
        (1, 28, 128, 128, 3),
        (4, 32, 32, 32, 3),
        (1, 300, 32, 64, 3),
        (8, 224, 64, 64, 3),
        (2, 16, 32, 32, 3),
        (1, 13, 256, 384, 3),
    ]:
        g = geometry(*args)
        spec = conv_choice.default_algorithm(small, g)
        assert spec.op == "im2col" or spec.configure(g.defines()).fits(small), (args, spec.codename, spec.config)
    implicit = conv_choice.default_algorithm(big, geometry(1, 28, 128, 128, 3))  # the rules stand where it fits
    assert implicit.codename == "conv_implicit" and not implicit.configure(geometry(1, 28, 128, 128, 3).defines()).fits(
        described_gpu(64, 16384)
    )


def test_a_layer_no_kernel_of_the_device_runs_is_named():
    tiny = described_gpu(32, 16384, max_allocation=2**20)  # no conv kernel's group; no room for patches
    with pytest.raises(
        malinn.BackendError,
        match=r"no convolution kernel of the library runs b8-c64-m64-g1-i224x224"
        r".*\(work-groups of at most 32 items, 16,384 bytes of local memory\)",
    ):
        conv_choice.default_algorithm(tiny, geometry(8, 224, 64, 64, 3))


def test_a_kernel_whose_work_group_the_device_cannot_launch_is_refused_by_name(device, rng, monkeypatch):
    """A kernel that runs only in its own work-group shape, chosen where the device launches smaller
    groups (here by malinn.use): a DeviceError naming both, where OpenCL's driver refused the launch
    (CL_INVALID_WORK_GROUP_SIZE) and the OpenGL backend built the shader in another shape and
    answered wrong values."""
    library = malinn.load_library()
    if not library["conv_kn2col"].has_source(device.backend):
        pytest.skip(f"conv_kn2col has no {device.backend} source")
    model, _ = conv_model(9, 5, 7, 3)
    config = {"MWI": 8, "NWI": 4, "MDIM": 8, "NDIM": 16}
    monkeypatch.setattr(device, "max_work_group_size", 64)
    with pytest.raises(malinn.DeviceError, match=r"use: kernel 'conv_kn2col' .* runs work-groups of 128 items"):
        kernel_choice.use("conv", "conv_kn2col", device=device, config=config)  # refused where it is made
    monkeypatch.setattr(device, "max_work_group_size", 128)
    kernel_choice.use("conv", "conv_kn2col", device=device, config=config)
    monkeypatch.setattr(device, "max_work_group_size", 64)  # and where it is launched
    x = rng.standard_normal((2, 9, 9, 5)).astype(np.float32)
    with pytest.raises(
        malinn.DeviceError,
        match=r"kernel conv_kn2col runs only in work-groups of 16 x 8 items over "
        r"its range .* launches at most 64 items a group",
    ):
        model.predict(x)


def test_a_stored_winner_in_a_rules_configuration_is_read_back(device, cache, monkeypatch):
    """The tuner times the kind's rules beside each kernel's candidates; a rule's configuration that
    won (conv_implicit as the GPU rules configure it: none of its candidates) was stored, then
    refused when read ("not a configuration the library offers"), and the plan ran the untuned
    default: on an H200 the tuner test failed whenever such a rule won."""
    if device.backend != "opencl":
        pytest.skip("convolutions run on OpenCL devices")
    monkeypatch.setattr(type(device), "kind", property(lambda self: "gpu"))
    rule = {"TM": 64, "TN": 32, "RM": 4, "RN": 4, "KT": 16, "SLICES": 8}
    implicit = malinn.load_library()["conv_implicit"]
    assert {**implicit.config, **{k: str(v) for k, v in rule.items()}} not in implicit.configurations(device)
    g = geometry(2, 9, 16, 32, 3)
    tuning_db.save(device, convs={g.key(): {"codename": "conv_implicit", "defines": rule, "seconds": 1e-5}})
    tuning_db.forget()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        codename, defines = tuning_db.tuned_conv(device, g)
    assert codename == "conv_implicit" and all(defines[k] == str(v) for k, v in rule.items())
    spec, why = choose_algorithm(device, g)
    assert (spec.codename, why) == ("conv_implicit", "tuned")


def test_a_layer_beyond_llvmpipes_loop_limit_is_refused_naming_the_limit(device, rng):
    """A convolution no kernel can run within llvmpipe's 65535 loop iterations is refused naming
    that limit, as before the device-fit fallback (which named work-groups and local memory)."""
    if not getattr(device, "max_loop_iterations", None) or not malinn.load_library()["conv_kn2row"].has_source(
        device.backend
    ):
        pytest.skip(f"{device.name} runs every loop to its end")
    model = malinn.Sequential([Conv2D(8, 3, padding="same", name="c")])
    model.build((None, 18, 18, 8192))
    x = rng.standard_normal((1, 18, 18, 8192)).astype(np.float32)
    with pytest.raises(malinn.MalinnError) as info:  # caught here: conftest skips a BackendError escaping a test
        model.predict(x)
    assert type(info.value) is malinn.DeviceError, info.value
    assert re.match(
        r"layer 'c': kernel conv_kn2\w+ would run [\d,]+ loop iterations in one shader invocation on "
        r".*, whose driver ends them after 65,535",
        str(info.value),
    ), info.value
