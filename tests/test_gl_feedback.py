"""The gles3 backend (malinn/backends/gl_feedback.py): OpenGL ES 3.0 GPUs without compute shaders,
kernels as vertex shaders whose results transform feedback captures (Cronin's GEMM).

llvmpipe stands in for such a GPU: the device is made on the same EGL device as the compute
backend's (``gl_feedback.probe``), so each test compares the two paths in one process."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import malinn
from malinn import Sequential, ops
from malinn.choice.matrix import DeviceMatrix
from malinn.errors import BackendError, DeviceError, KernelBuildError
from malinn.layers import (
    Activation,
    BatchNormalization,
    Conv2D,
    Dense,
    Flatten,
    LayerNormalization,
    Permute,
    PReLU,
    RepeatVector,
    Reshape,
    Softmax,
)
from malinn.library.kernel_library import load_library

pytest.importorskip("moderngl", reason="the OpenGL backend's extra is not installed (pip install malinn[gl])")
from malinn.backends import gl_feedback  # noqa: E402

GL = [d for d in malinn.devices() if d.backend == "gl"]
needs_gl = pytest.mark.skipif(not GL, reason="no working OpenGL device (EGL)")


@pytest.fixture(scope="module")
def gles3():
    """A gles3 device on the first GL device's EGL device."""
    if not GL:
        pytest.skip("no working OpenGL device (EGL)")
    return gl_feedback.probe(GL[0].index[1])


def _vertex_kernels() -> set:
    return {c for c, spec in load_library().kernels.items() if spec.has_source(gl_feedback.BACKEND)}


@needs_gl
@pytest.mark.parametrize("nc", [1, 4])
def test_gemm_feedback_matches_numpy_on_odd_shapes(gles3, nc, rng):
    spec = load_library()["gemm_feedback"].configure({"NC": nc})
    for m, k, n in [(1, 1, 1), (3, 5, 3), (13, 37, 5), (1001, 13, 1), (5, 1001, 13)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        bias = rng.standard_normal(m).astype(np.float32)
        got = ops.matmul(
            DeviceMatrix.from_host(a),
            DeviceMatrix.from_host(b),
            spec,
            gles3,
            bias=ops.upload_vector(gles3, bias),
            activation="elu",
            params={"alpha": 0.5},
        ).numpy()
        z = a.astype(np.float64) @ b + bias[:, None]
        want = np.where(z > 0, z, 0.5 * np.expm1(z))
        np.testing.assert_allclose(
            got, want, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want).max()), err_msg=f"NC={nc} {m}x{k}x{n}"
        )


@needs_gl
@pytest.mark.parametrize("layout", ["C", "R", "C_4_2_R", "R_2_4_C"])
def test_vertex_kernels_find_their_element_in_any_layout(gles3, layout, rng):
    """One vertex per float: the inverse index macros give the element it holds (padding kept)."""
    x = rng.standard_normal((7, 5)).astype(np.float32)
    got = ops.activation(DeviceMatrix.upload(gles3, x, layout), "softmax").numpy()
    e = np.exp(x - x.max(axis=0))
    np.testing.assert_allclose(got, e / e.sum(axis=0), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(ops.relayout(DeviceMatrix.upload(gles3, x, layout), "C", (8, 5)).numpy(), x)
    got = ops.activation(DeviceMatrix.upload(gles3, x, layout), "relu").numpy()
    np.testing.assert_array_equal(got, np.maximum(x, 0))


def _model():
    model = Sequential(
        [
            Flatten(name="f"),
            Dense(33, activation="gelu", name="d1"),
            BatchNormalization(name="bn"),
            Dense(17, name="d2"),
            Activation("tanh", name="t"),
            Dense(10, activation="softmax", name="head"),
        ]
    )
    model.build((None, 3, 7))
    rng = np.random.default_rng(5)
    model.set_weights([w + rng.standard_normal(w.shape).astype(np.float32) * 0.3 for w in model.get_weights()])
    return model


@needs_gl
@pytest.mark.parametrize("batch", [1, 5, 40])
def test_a_dense_model_on_gles3_equals_the_compute_device(gles3, batch):
    """Vertex-stage kernels only, one upload and one download, the compute path's results."""
    model = _model()
    x = np.random.default_rng(batch).standard_normal((batch, 3, 7)).astype(np.float32)
    plan = model.plan(batch, gles3)
    before = dict(gles3.counters)
    got = plan.run([x])[0]
    assert gles3.counters["uploads"] - before["uploads"] == 1
    assert gles3.counters["downloads"] - before["downloads"] == 1
    assert {launch.function for launch in plan.launches} <= _vertex_kernels()
    want = model.plan(batch, GL[0]).run([x])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-5)


@needs_gl
@pytest.mark.parametrize("target", ["gles3", "gpu"])
def test_a_model_file_moves_between_gles3_and_the_other_backends(gles3, tmp_path, target):
    """Weights laid out for gemm_feedback run on the compute device, and the OpenCL GPU's on gles3."""
    model = _model()
    path = malinn.model.saving.save_model(model, tmp_path / "m.malinn", target=target)
    assert malinn.model.saving.resolve_target(target).codename == (
        "gemm_feedback" if target == "gles3" else load_library().default("matmul", "gpu")
    )
    loaded = malinn.load_model(path)
    x = np.random.default_rng(7).standard_normal((6, 3, 7)).astype(np.float32)
    np.testing.assert_allclose(
        loaded.plan(6, gles3).run([x])[0], model.plan(6, GL[0]).run([x])[0], rtol=1e-5, atol=1e-6
    )


@needs_gl
def test_the_layers_beyond_dense_run_on_gles3_as_on_the_compute_device(gles3):
    """normalize (Softmax, LayerNormalization), broadcast (PReLU, BatchNormalization on the middle
    axis), permute and repeat as vertex kernels, with odd shapes."""
    model = Sequential(
        [
            Dense(15, name="d"),
            Reshape((3, 5)),
            Permute((2, 1)),
            PReLU(name="p"),
            BatchNormalization(axis=1, name="bn"),
            LayerNormalization(axis=(1, 2), name="ln"),
            Softmax(axis=1, name="sm"),
            Flatten(),
            Dense(7, activation="tanh"),
            RepeatVector(3),
        ]
    )
    model.build((None, 6))
    rng = np.random.default_rng(3)
    model.set_weights([w + rng.standard_normal(w.shape).astype(np.float32) * 0.3 for w in model.get_weights()])
    x = rng.standard_normal((5, 6)).astype(np.float32)
    plan = model.plan(5, gles3)
    assert {launch.function for launch in plan.launches} >= {"normalize_axes", "broadcast", "permute", "repeat_vector"}
    np.testing.assert_allclose(plan.run([x])[0], model.plan(5, GL[0]).run([x])[0], rtol=1e-5, atol=1e-6)


@needs_gl
def test_the_dense_equivalence_models_match_keras_on_gles3(gles3, keras_zoo):
    """The zoo's Dense models (every activation, softmax, BatchNormalization) against TensorFlow."""
    checked = 0
    for key in (
        "tiny",
        "relus",
        "wide",
        "batchnorm",
        "act_softmax",
        "act_gelu",
        "act_selu",
        "act_leaky_relu",
        "act_hard_swish",
        "act_mish",
    ):
        if f"keras3/{key}" not in keras_zoo.models:
            continue
        data = keras_zoo.data("keras3-zip", key)
        model = malinn.load_model(keras_zoo.path("keras3-zip", key))
        x, want = data["x"][:7], np.asarray(data["y"][:7], np.float64)
        got = model.plan(len(x), gles3).run([x])[0]
        scale = max(1.0, float(np.abs(want).max()))
        assert np.abs(got - want).max() <= 3e-5 * scale, key
        checked += 1
    assert checked >= 8


@needs_gl
def test_a_layer_without_a_vertex_kernel_is_refused_naming_it(gles3):
    conv = Sequential([Conv2D(4, 3, name="conv"), Flatten(), Dense(3)])
    conv.build((None, 8, 8, 2))
    with pytest.raises(BackendError, match=r"layer 'conv' \(Conv2D\) cannot run on .*gles3: no compute shaders"):
        conv.plan(1, gles3)
    too_deep = gles3.max_texture + 4
    wide = Sequential([Dense(8, name="wide")])
    wide.build((None, too_deep))
    with pytest.raises(
        BackendError,
        match=rf"layer 'wide' \(Dense\) .* its 8x{too_deep} weights read as a "
        rf"texture of 2 x {too_deep} texels .* exceed",
    ):
        wide.plan(1, gles3)


@needs_gl
def test_a_compute_shader_is_refused_by_the_gles3_device(gles3):
    with pytest.raises(KernelBuildError, match="a compute shader; .* runs vertex-stage kernels only"):
        gles3.compile("MALINN_ARGS(uint n;)\nvoid main() {}\n", origin="gl/x.comp")
    spec = load_library()["gemv_c"]
    assert not spec.has_source("gles3") and "gemm_feedback" in _vertex_kernels()


@needs_gl
def test_no_compute_lists_every_gl_device_as_gles3():
    """MALINN_GL_NO_COMPUTE=1: the gles3 backend serves, chosen by name, and a Dense model runs."""
    env = dict(os.environ, MALINN_GL="1", MALINN_GL_NO_COMPUTE="1", MALINN_DEVICE="gles3")
    code = (
        "import numpy as np, malinn\n"
        "from malinn.layers import Dense\n"
        "print(sorted({d.backend for d in malinn.devices()} - {'opencl'}), malinn.get_device().backend)\n"
        "m = malinn.Sequential([Dense(13, activation='relu'), Dense(5, activation='softmax')]); m.build((None, 6))\n"
        "print(round(float(m.predict(np.ones((3, 6), np.float32)).sum()), 4))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["['gles3']", "gles3", "3.0"], out.stdout
    # without it, the GPU is a gl device, and a gles3 device on it when asked for by name
    env = dict(os.environ, MALINN_GL="1")
    env.pop("MALINN_GL_NO_COMPUTE", None)
    code = (
        "import malinn\n"
        "before = sorted({d.backend for d in malinn.devices()} - {'opencl'})\n"
        "d = malinn.set_device('gles3')\n"
        "print(before, d.backend, d.index[1] == malinn.set_device('gl').index[1])"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["['gl']", "gles3", "True"], out.stdout


@needs_gl
@pytest.mark.parametrize("api", ["", "es"])
def test_an_opengl_es_3_0_gpu_is_a_gles3_device_and_runs_a_dense_model(api):
    """A GPU without compute shaders, played by Mesa made to offer OpenGL 3.3 and OpenGL ES 3.0
    (MESA_GL_VERSION_OVERRIDE, MESA_GLES_VERSION_OVERRIDE; MALINN_GL_API=es: an OpenGL ES 3.0
    context): listed as gles3, not gl, and a Dense model with a softmax equals numpy."""
    if "Mesa" not in GL[0].platform:
        pytest.skip("MESA_GL_VERSION_OVERRIDE is Mesa's")
    env = dict(
        os.environ,
        MALINN_GL="1",
        MESA_GL_VERSION_OVERRIDE="3.3",
        MESA_GLES_VERSION_OVERRIDE="3.0",
        MALINN_GL_API=api,
        MALINN_DEVICE="gles3",
    )
    env.pop("MALINN_GL_NO_COMPUTE", None)
    code = (
        "import numpy as np, malinn\nfrom malinn.layers import Dense\n"
        "print(sorted({d.backend for d in malinn.devices()} - {'opencl'}))\n"
        "m = malinn.Sequential([Dense(13, activation='relu'), Dense(5, activation='softmax')])\n"
        "m.build((None, 7))\nx = np.random.default_rng(0).standard_normal((3, 7)).astype(np.float32)\n"
        "w = m.get_weights()\nh = np.maximum(x @ w[0] + w[1], 0) @ w[2] + w[3]\n"
        "p = np.exp(h - h.max(1, keepdims=True))\np /= p.sum(1, keepdims=True)\n"
        "print(malinn.get_device().platform)\nprint(float(np.abs(m.predict(x) - p).max()))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    backends, platform, err = out.stdout.strip().splitlines()[-3:]
    assert backends == "['gles3']", out.stdout
    assert platform.startswith("OpenGL ES 3.0" if api == "es" else "OpenGL 3.3"), platform
    assert float(err) < 1e-6
    if not api:  # the gl backend's warning says where the device went
        assert "the gles3 backend's vertex shaders" in out.stderr, out.stderr[-2000:]


def test_the_probe_measures_where_the_driver_ends_a_vertex_shaders_loops(gles3):
    """llvmpipe's vertex shaders stop loops after 65535 iterations as its compute shaders do (a
    34000-feature softmax and LayerNormalization came out wrong on gles3 and were refused on gl)."""
    if "llvmpipe" in gles3.name:
        assert gles3.max_loop_iterations == 65535
    else:
        assert gles3.max_loop_iterations is None or gles3.max_loop_iterations >= 65535, gles3


def test_a_vertex_kernel_whose_loops_the_driver_would_end_is_refused_by_name(gles3, monkeypatch):
    """A limit of 1000 stands in for llvmpipe's 65535: a softmax over 600 features loops
    2 x 600 + 2 times, a LayerNormalization over 300 features 5 x 300."""
    monkeypatch.setattr(gles3, "max_loop_iterations", 1000)
    for layer, count in [(Softmax(name="wide_softmax"), "1,202"), (LayerNormalization(name="wide_norm"), "1,500")]:
        model = Sequential([layer])
        model.build((None, 600 if count == "1,202" else 300))
        with pytest.raises(DeviceError) as info:
            model.plan(2, gles3)
        text = str(info.value)
        assert f"layer '{layer.name}'" in text and f"{count} loop iterations" in text and "after 1,000" in text, text
