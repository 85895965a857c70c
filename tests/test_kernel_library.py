"""kernels/library.json: every entry valid and buildable as OpenCL C 1.2; malformed entries named."""

import json
import shutil

import numpy as np
import pytest

from malinn.errors import KernelBuildError, LibraryError
from malinn.library.kernel_library import EPILOGUE_DEFINES, load_library
from malinn.library.layout import parse_layout
from malinn.resources import kernels_dir

LIB = load_library()


def test_library_has_every_variant_of_the_design_table():
    matmuls = set(LIB.codenames("matmul"))
    assert {"cross1", "rmcm", "crossv", "blocked_rmrm", "blocked_rmcm", "morton_4_2", "morton_4_4"} <= matmuls
    assert set(LIB.activations()) >= {"relu", "sigmoid", "tanh", "softmax"}
    assert LIB.codenames("bias") and LIB.codenames("relayout")


@pytest.mark.parametrize(
    "codename, a, b, r",
    [
        ("cross1", "R", "R", "R"),
        ("rmcm", "R", "C", "C"),
        ("crossv", "R", "C", "C"),
        ("blocked_rmrm", "R", "R", "R"),
        ("blocked_rmcm", "R", "C", "C"),
        ("morton_4_2", "R_2_4_R", "C_4_2_C", "C_4_2_C"),
        ("morton_4_4", "R_4_4_R", "C_4_4_C", "C_4_4_C"),
        ("gemm_tiled", "C", "R", "R"),
        ("gemm_image", "C", "C", "C"),
        ("gemv", "C", "R", "R"),
        ("gemv_softmax", "C", "R", "R"),
    ],
)
def test_layouts_match_the_design_table(codename, a, b, r):
    spec = LIB[codename]
    assert [spec.matrices[x].representation for x in "abr"] == [a, b, r]
    # chaining: each kernel writes R the way it reads I, so layers need no re-layout between them
    assert spec.matrices["r"].layout == spec.matrices["b"].layout
    assert (
        spec.matrices["r"].row_multiple % spec.matrices["b"].row_multiple == 0
        or spec.matrices["b"].row_multiple % spec.matrices["r"].row_multiple == 0
    )


@pytest.mark.parametrize("codename", list(LIB.kernels))
def test_every_kernel_builds_as_opencl_c_1_2(codename, device):
    spec = LIB[codename]
    layouts = {name: (m.layout if not m.any_layout else parse_layout("C_4_2_C")) for name, m in spec.matrices.items()}
    device.build(
        spec.program_source(layouts, device.render_index), spec.options() + ("-cl-std=CL1.2",), origin=spec.source
    )
    if spec.epilogue:  # and with everything its epilogue can fuse switched on
        on = {"BIAS": 1, "ACTIVATION": "act_relu_general", "AFFINE": 1, "SOFTMAX": 1, "R_VIEW": 1}
        full = spec.configure({EPILOGUE_DEFINES[f]: on[EPILOGUE_DEFINES[f]] for f in spec.epilogue})
        device.build(
            full.program_source(layouts, device.render_index), full.options() + ("-cl-std=CL1.2",), origin=spec.source
        )


def test_every_matmul_kernel_fuses_bias_activation_and_affine():
    """A Dense layer (bias, activation, a BatchNormalization after it) is one launch whatever
    kernel runs it; the epilogue's arguments are the same for all (kernels/epilogue.clh)."""
    for codename in LIB.codenames("matmul"):
        spec = LIB[codename]
        assert {"bias", "activation", "affine"} <= set(spec.epilogue), codename
        assert spec.arglist == "lhwmnHWpppp" and spec.buffers[:6] == ("a", "b", "r", "bias", "scale", "shift"), codename
        assert spec.buffers[6:] in ((), ("scratch",)), codename  # and, last, the kernel's own scratch
    assert [c for c in LIB.codenames("matmul") if "softmax" in LIB[c].epilogue] == ["gemv_softmax", "gemv_softmax_c"]
    assert LIB.default("matmul_softmax", "cpu") == "gemv_softmax"
    assert LIB.default("matmul_softmax", "gpu") == "gemv_softmax_c"


def test_a_variant_is_its_base_with_its_own_fields_merged_over_it(tmp_path):
    """``variant_of``: gemm_tiled_c is gemm_tiled with B and R column-major and its own define;
    everything it does not name (source, candidates, A's restriction, preconditions) is the base's."""
    base, variant = LIB["gemm_tiled"], LIB["gemm_tiled_c"]
    assert variant.source == base.source and variant.function == base.function
    assert variant.candidates == base.candidates and variant.preconditions == base.preconditions
    assert str(variant.matrices["a"].layout) == str(base.matrices["a"].layout) == "C"
    assert (str(variant.matrices["b"].layout), str(variant.matrices["r"].layout)) == ("C", "C")
    assert (str(base.matrices["b"].layout), str(base.matrices["r"].layout)) == ("R", "R")
    assert variant.config["KERAS_ORDER"] == "1" and "KERAS_ORDER" not in base.config
    folder = tmp_path / "kernels"
    shutil.copytree(kernels_dir(), folder)
    data = json.loads((folder / "library.json").read_text())
    path = folder / "library.json"
    for bad, message in (
        [{"bad": {"variant_of": "gemm_tilde"}}, "'bad', field 'variant_of': 'gemm_tilde' is not an entry"],
        [{"bad": {"variant_of": "worse"}, "worse": {"variant_of": "bad"}}, "lead back to 'bad'"],
    ):
        path.write_text(json.dumps({**data, "kernels": {**data["kernels"], **bad}}))
        with pytest.raises(LibraryError, match=message):
            load_library(path)
    path.write_text(
        json.dumps(
            {
                **data,
                "kernels": {
                    **data["kernels"],
                    "open": {"variant_of": "gemv", "preconditions": {"max_n": None, "max_m": 64}},
                },
            }
        )
    )
    assert dict(load_library(path)["open"].preconditions) == {"max_m": 64}  # a null removes the base's field
    small = LIB["gemv_batch_small_c"]  # a variant of a variant
    assert dict(LIB["gemv"].preconditions) == {"max_n": 1} and dict(small.preconditions) == {
        "min_n": 9,
        "max_n": 256,
        "max_m": 1024,
        "max_k": 1024,
    }
    assert str(small.matrices["b"].layout) == "C" and small.config["KERAS_ORDER"] == "1"


def test_fallbacks_end_in_a_general_kernel():
    """defaults.matmul_fallback lists kernels in order of preference; the last has no
    preconditions, so every shape has a kernel."""
    for kind in ("gpu", "cpu", "accelerator"):
        specs = LIB.default_specs("matmul_fallback", kind)
        assert specs and not specs[-1].preconditions and all(s.op == "matmul" for s in specs)


@pytest.mark.parametrize("precision", ["fp32", "int8-weights"])
def test_a_cpu_runs_a_batch_1_head_in_the_narrow_gemv(precision):
    """On a CPU a layer of at most 64 units at batch 1 (a classifier head) takes gemv_narrow (32 rows
    per item); a wider layer, or a head at batch 2, the wide gemv configurations after it."""
    fallbacks = LIB.default_specs("matmul_fallback", "cpu", precision=precision)

    def first(m, k, n):
        spec = next(s for s in fallbacks if s.accepts(m, k, n))
        return spec.codename, int(spec.config["VW"]) * int(spec.config["WPT"]), int(spec.config["NB"])

    assert first(10, 2000, 1) == first(64, 3072, 1) == ("gemv_narrow", 32, 1)
    assert first(65, 2000, 1) == ("gemv", 512 if precision == "int8-weights" else 256, 1)
    assert first(10, 2000, 2) == ("gemv", 256, 2)


def test_default_matmul_exists_for_every_device_kind():
    for kind in ("gpu", "cpu", "accelerator"):
        assert LIB[LIB.default("matmul", kind)].op == "matmul"


def test_unknown_codename_lists_known_ones():
    with pytest.raises(LibraryError, match="no kernel with codename 'nope'.*morton_4_2"):
        LIB["nope"]


def _broken_library(tmp_path, mutate):
    folder = tmp_path / "kernels"
    shutil.copytree(kernels_dir(), folder)
    data = json.loads((folder / "library.json").read_text())
    mutate(data)
    (folder / "library.json").write_text(json.dumps(data))
    return folder / "library.json"


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (
            lambda d: d["kernels"]["morton_4_2"]["restrictions"]["a"].update(rowAlign=-1),
            "kernel 'morton_4_2', field 'restrictions.a.rowAlign': expected a positive integer, got -1",
        ),
        (
            lambda d: d["kernels"]["rmcm"]["restrictions"]["b"].update(representation="C_3_X"),
            "kernel 'rmcm', field 'restrictions.b.representation'",
        ),
        (
            lambda d: d["kernels"]["cross1"].update(function="missing_fn"),
            "kernel 'cross1', field 'function': no kernel function 'missing_fn'",
        ),
        (lambda d: d["kernels"]["cross1"].update(source="nowhere.cl"), "kernel 'cross1', field 'source': no file"),
        (lambda d: d["kernels"]["cross1"].pop("op"), "kernel 'cross1', field 'op': missing"),
        (lambda d: d["kernels"]["cross1"].update(op="convolve"), "field 'op': expected one of"),
        (lambda d: d["kernels"]["crossv"]["restrictions"].update(arglist="lq"), "field 'restrictions.arglist'"),
        (lambda d: d["kernels"]["crossv"]["restrictions"].update(ndrange="hwl"), "field 'restrictions.ndrange'"),
        (lambda d: d["kernels"]["crossv"]["restrictions"].update(workgroup=[4]), "field 'restrictions.workgroup'"),
        (lambda d: d["kernels"]["crossv"]["restrictions"].pop("r"), "field 'restrictions.r'"),
        (lambda d: d["kernels"]["relu"].update(defines={"A B": "1"}), "kernel 'relu', field 'defines'"),
        (
            lambda d: d["defaults"]["matmul"].update(gpu="relu"),
            "field 'defaults.matmul.gpu': 'relu' is not a matmul kernel",
        ),
        (
            lambda d: d["defaults"]["matmul_fallback"].update(cpu=["gemv", "relu"]),
            "field 'defaults.matmul_fallback.cpu': 'relu' is not a matmul kernel",
        ),
        (
            lambda d: d["defaults"]["matmul_fallback"].update(
                cpu=[{"codename": "gemv", "defines": {"NB": 3, "VW": 3}}]
            ),
            "field 'defaults.matmul_fallback.cpu.defines'",
        ),
        (
            lambda d: d["kernels"]["cross1"].update(epilogue=["bias", "dropout"]),
            "kernel 'cross1', field 'epilogue': expected",
        ),
        (lambda d: d["kernels"]["cross1"].update(epilogue=True), "kernel 'cross1', field 'epilogue': expected"),
        (
            lambda d: d["kernels"]["cross1"]["restrictions"].update(arglist="lhwHWpppp"),
            "kernel 'cross1', field 'epilogue'",
        ),
        (
            lambda d: d["kernels"]["cross1"]["restrictions"].update(buffers=["a", "b", "r", "bias"]),
            "kernel 'cross1', field 'epilogue'",
        ),
        (
            lambda d: d["kernels"]["cross1"].update(epilogue=["bias", "softmax"]),
            "kernel 'cross1', field 'epilogue': a softmax epilogue",
        ),
        (lambda d: d["kernels"]["gemv"].update(preconditions={"max_batch": 8}), "kernel 'gemv', field 'preconditions'"),
        (
            lambda d: d["kernels"]["gemv"].update(preconditions={"max_n": "NB - 1"}),
            "kernel 'gemv', field 'preconditions.max_n': expected a positive integer, got 0",
        ),
        (
            lambda d: d["kernels"]["gemv"]["restrictions"]["split"].update(cols="KSPLIT - KSPLIT"),
            "kernel 'gemv', field 'restrictions.split.cols'",
        ),
        (
            lambda d: d["kernels"]["gemv"]["restrictions"]["b"].update(logicalRows=True),
            "kernel 'gemv', field 'restrictions.b.logicalRows'",
        ),
        (
            lambda d: d["kernels"]["gemv"]["sources"]["gl"].update(loop_iterations="l / SPLITK"),
            "kernel 'gemv', field 'sources.gl.loop_iterations'",
        ),
        # misspelled fields and defines were ignored
        (
            lambda d: d["kernels"]["gemv"].update(precondition={"max_n": 1}),
            "kernel 'gemv', field 'precondition': unknown",
        ),
        (
            lambda d: d["kernels"]["gemv"]["restrictions"].update(workgroups=[8]),
            "kernel 'gemv', field 'restrictions.workgroups': unknown",
        ),
        (
            lambda d: d["kernels"]["gemv"]["restrictions"]["a"].update(logicalrows=True),
            "kernel 'gemv', field 'restrictions.a.logicalrows': unknown",
        ),
        (
            lambda d: d["kernels"]["gemv"]["sources"]["gl"].update(loop_iteration="l"),
            "kernel 'gemv', field 'sources.gl.loop_iteration': unknown",
        ),
        (
            lambda d: d["defaults"]["matmul_fallback"].update(cpu=[{"codename": "gemv", "define": {"NB": 2}}]),
            "field 'defaults.matmul_fallback.cpu': unknown field 'define' of 'gemv'",
        ),
        (
            lambda d: d["kernels"].update(gemv_typo={"variant_of": "gemv", "defines": {"NBB": 2}}),
            "kernel 'gemv_typo', field 'defines': 'NBB' appears in none of its sources",
        ),
        (
            lambda d: d["kernels"]["gemm_tiled"]["defines"].update(WG=1),  # within MWG and KWG, an identifier of none
            "kernel 'gemm_tiled', field 'defines': 'WG' appears in none of its sources",
        ),
        (
            lambda d: d["kernels"]["cross1"].update(precisions=["fp32", "int8-weights"]),
            "kernel 'cross1', field 'precisions': lists int8-weights, but the source does not include weights.clh",
        ),
        (
            lambda d: d["kernels"]["gemm_tiled"].update(local_bytes="4 * RPX"),
            "kernel 'gemm_tiled', field 'local_bytes': '4 * RPX' names 'RPX'",
        ),
        # a variant whose defines equal one of its base's candidates: which one, and why it repeats
        (
            lambda d: d["kernels"].update(
                gemm_tiled_cpu={"variant_of": "gemm_tiled", "defines": d["kernels"]["gemm_tiled"]["candidates"][0]}
            ),
            "kernel 'gemm_tiled_cpu', field 'candidates': candidate 0 ",
        ),
    ],
)
def test_malformed_entries_are_named(tmp_path, mutate, fragment):
    with pytest.raises(LibraryError) as info:
        load_library(_broken_library(tmp_path, mutate))
    assert fragment in str(info.value)


def test_the_shipped_library_passes_every_check_in_depth():
    """A process checks the shipped library's entries' fields alone (its depth is this test's): named
    by its path, every configuration of every entry resolves and every define is in its sources."""
    from malinn.library import entry_fields, kernel_library, kernel_sources, kernel_spec

    named = load_library(kernels_dir() / "library.json")
    assert set(named.kernels) == set(LIB.kernels) and named is not LIB
    kernel_library._load.cache_clear()
    kernel_spec._configured.clear()
    entry_fields._fixed.clear()
    kernel_sources.source_identifiers.cache_clear()
    assert (
        kernel_library._load(kernels_dir().joinpath("library.json").resolve(), deep=True).kernels.keys()
        == LIB.kernels.keys()
    )


def test_a_kernels_folder_named_by_malinn_kernels_is_checked_in_depth(tmp_path, monkeypatch):
    """A kernel developer's copy (MALINN_KERNELS) is checked as a named library is: a misspelled
    define is refused when the library loads, not ignored."""
    from malinn.library import kernel_library

    path = _broken_library(tmp_path, lambda d: d["kernels"]["gemm_tiled"]["defines"].update(WG=1))
    monkeypatch.setenv("MALINN_KERNELS", str(path.parent))
    kernel_library._default_library.cache_clear()
    try:
        with pytest.raises(LibraryError, match="'WG' appears in none of its sources"):
            load_library()
    finally:
        kernel_library._default_library.cache_clear()


def test_library_that_is_not_json(tmp_path):
    path = tmp_path / "library.json"
    path.write_text("{ not json")
    with pytest.raises(LibraryError, match="not valid JSON"):
        load_library(path)
    with pytest.raises(LibraryError, match="cannot be read"):
        load_library(tmp_path / "absent.json")


@pytest.mark.parametrize("change", [{"version": 2}, {"format": "clblast-database"}, {"format": None}])
def test_a_library_of_another_format_or_version_is_refused_by_name(tmp_path, change):
    """The file's "format" and "version" were never read: a library of a newer version (or none)
    was taken as this one."""
    data = json.loads((kernels_dir() / "library.json").read_text())
    data.update(change)
    data = {k: v for k, v in data.items() if v is not None}
    path = tmp_path / "library.json"
    path.write_text(json.dumps(data))
    with pytest.raises(
        LibraryError,
        match=r"expected \"format\": 'malinn-kernel-library' and \"version\": 1 "
        r"\(this malinn reads that library\), got",
    ):
        load_library(path)


def test_failed_build_shows_log_and_options(device):
    if device.backend != "opencl":
        pytest.skip("an OpenCL C source; the OpenGL backend's build errors: tests/test_opengl.py")
    with pytest.raises(KernelBuildError) as info:
        device.build(
            "__kernel void f(__global float *x) { x[0] = undeclared_thing; }", ("-DMALINN_TEST=1",), origin="broken.cl"
        )
    text = str(info.value)
    assert "broken.cl" in text and "-DMALINN_TEST=1" in text and "undeclared_thing" in text
    assert "CL_BUILD_PROGRAM_FAILURE" in text


def test_a_build_log_names_the_kernel_file_and_line(device, tmp_path):
    """The includes are prepended to the source: a log pointed at the joined temporary file (an
    error on line 24 of a kernel reported at line 167); each file now follows a #line naming it,
    and a place in the joined program that a driver names (NVIDIA ignores #line) gets the file's.
    The programs a device keeps are per kernels folder: the shipped relu, built first, was served
    for the broken copy's (the suite's order found it)."""
    if device.backend != "opencl":
        pytest.skip("an OpenCL C source; GLSL's #line takes no file name")
    from malinn.choice.kernel_call import program_for

    program_for(load_library()["relu"], device, {"r": parse_layout("R")})  # the shipped relu, built and kept
    path = _broken_library(tmp_path, lambda d: None)
    source = path.parent / "activation.cl"
    lines = source.read_text().splitlines() + ["this is not OpenCL C;"]
    source.write_text("\n".join(lines) + "\n")
    spec = load_library(path)["relu"]
    with pytest.raises(KernelBuildError) as info:
        program_for(spec, device, {"r": parse_layout("R")})
    text = str(info.value)  # the driver's own place (PoCL honours #line; NVIDIA does not) or malinn's note
    assert f"activation.cl:{len(lines)}:" in text or f"[activation.cl:{len(lines)}]" in text, text[-2000:]


def test_a_place_in_the_joined_program_is_named_by_its_file():
    """NVIDIA's compiler ignores #line and names <kernel>:64 of the joined program (found on an H200)."""
    from malinn.backends.opencl import with_files

    source = 'macros\n#line 1 "weights.clh"\nw1\nw2\n#line 1 "activation.cl"\na1\na2\n'
    log = "<kernel>:7:1: error: unknown type name 'this'\n  this\n<kernel>:3: note\nactivation.cl:2:1: error"
    assert with_files(log, source).splitlines() == [
        "<kernel>:7:1: [activation.cl:2] error: unknown type name 'this'",
        "  this",
        "<kernel>:3: [weights.clh:1] note",
        "activation.cl:2:1: error",
    ]


def test_programs_are_memoised(device):
    source = "__kernel void g(__global float *x) { x[0] = 1.0f; }"
    first = device.build(source, ("-DX=1",))
    assert device.build(source, ("-DX=1",)) is first
    assert device.build(source, ("-DX=2",)) is not first


def test_a_configured_spec_is_never_served_for_another_entry_with_a_reused_id():
    """The configured-spec cache is keyed by the entry's id(); an entry freed with its library (the
    loader keeps eight) and a new one at the same address must not share specs."""
    from malinn.library import kernel_spec

    entry, other = {"kept": 1}, {"new": 2}
    defines = {"MWG": "32"}
    spec = LIB["gemm_tiled"]
    kernel_spec._remember(entry, defines, spec)
    assert kernel_spec._cached(entry, defines) is spec
    key = (id(entry), tuple(sorted(defines.items())))
    kernel_spec._configured[(id(other), key[1])] = kernel_spec._configured.pop(key)  # as if other took its id
    assert kernel_spec._cached(other, defines) is None
    del kernel_spec._configured[(id(other), key[1])]


def test_configuring_a_spec_keeps_a_fused_activations_parameters():
    """A matmul spec given an activation's float parameters (ops.with_epilogue: ELU's alpha) keeps
    them when its defines change later (a plan's paddings, a precision): its entry names none, and
    a spec rebuilt from the entry alone would launch without them."""
    from dataclasses import replace

    spec = LIB["gemv_split_c"]
    fused = replace(spec.configure({EPILOGUE_DEFINES["activation"]: "act_elu"}), params=(("alpha", 0.5),))
    assert fused.configure({"SLICES": "4"}).params == (("alpha", 0.5),)
    assert fused.configure({"SLICES": "4"}).config["SLICES"] == "4"
    assert fused.in_precision("int8-weights").params == (("alpha", 0.5),)
    assert spec.configure({"SLICES": "4"}).params == spec.params == ()


def test_a_default_the_device_cannot_launch_gives_way_to_the_next():
    """A GPU's softmax head takes the first matmul_softmax configuration whose work-group the device
    can launch: 512 items where the device allows them, the 256-item one on a smaller GPU (a Mali's
    limit), never a launch the driver would refuse."""
    from dataclasses import replace

    from support import described_gpu

    from malinn.choice import kernel_choice

    big = described_gpu("big GPU")
    small = replace(big, name="small GPU", max_work_group_size=256, local_memory=32768)
    for device, items in ((big, 512), (small, 256)):
        spec = kernel_choice.choose("matmul", device, (10, 3072, 1), activation="softmax")
        assert spec.codename == "gemv_softmax_c" and spec.fits(device)
        assert spec.workgroup[0] * spec.workgroup[1] == items, (device.name, spec.workgroup)


def test_a_shader_that_does_not_build_is_named_with_its_file_and_layer(device, tmp_path, monkeypatch):
    """A GLSL compute shader is built when bound, in the launch's work-group: its error named
    `gemv.cl` (the OpenCL source) and neither the layer nor the shapes."""
    if device.backend != "gl":
        pytest.skip("the OpenGL backend builds its shaders when they are bound")
    from malinn import Sequential
    from malinn.choice import kernel_choice
    from malinn.layers import Dense
    from malinn.library import kernel_library

    path = _broken_library(tmp_path, lambda d: None)
    shader = path.parent / "gl" / "gemv.comp"
    shader.write_text(shader.read_text() + "\nthis is not GLSL;\n")
    broken = load_library(path)
    monkeypatch.setattr(kernel_library, "_default_library", lambda: broken)
    monkeypatch.setenv("MALINN_BINARY_CACHE", "0")
    kernel_choice.use("matmul", "gemv", device=device)
    model = Sequential([Dense(5, name="d")])
    model.build((None, 7))
    with pytest.raises(KernelBuildError) as info:
        model.predict(np.ones((1, 7), np.float32))
    text = str(info.value)
    assert text.startswith("layer 'd' (") and "padded to" in text, text[:300]
    assert "gl/gemv.comp (gemv): the GLSL compute shader did not build" in text, text[:500]


def test_a_configuration_given_by_the_user_is_named_as_theirs():
    """malinn.use's config: an unknown define lists the kernel's; a value breaking a restriction is
    the configuration's fault, not library.json's; a non-number names the define (it was numpy's
    "invalid literal for int()"); a device given by name is refused naming set_device (it was an
    AttributeError)."""
    from malinn.choice import kernel_choice

    with pytest.raises(
        LibraryError,
        match=r"kernel 'gemm_tiled' has no defines \['TS_M'\]; its defines are MWG, "
        r"NWG, KWG",
    ):
        kernel_choice.use("matmul", "gemm_tiled", config={"TS_M": 3})
    with pytest.raises(LibraryError) as info:
        kernel_choice.use("matmul", "gemm_tiled", config={"MWG": 0})
    assert str(info.value).startswith("kernel 'gemm_tiled': configuration {'MWG': 0}: ") and "library.json" not in str(
        info.value
    ), info.value
    with pytest.raises(LibraryError, match=r"configuration \{'MWG': 'abc'\}: .*MWG is 'abc', not an integer"):
        kernel_choice.use("matmul", "gemm_tiled", config={"MWG": "abc"})
    with pytest.raises(
        ValueError,
        match=r"use: device must be a malinn device .* got 'gpu'; "
        r"malinn.set_device\('gpu'\)",
    ):
        kernel_choice.use("matmul", "gemm_tiled", device="gpu")
