"""Numpy references for the kernels: the formulas the tests hold malinn to."""

import json
import os
import subprocess
import sys
from math import erf as _erf
from pathlib import Path

import numpy as np

from malinn.library.precision import effective

_erf_v = np.vectorize(_erf, otypes=[np.float64])


def _relu_general(x, negative_slope=0.0, max_value=0.0, threshold=0.0, has_max_value=0.0):
    """Keras's backend relu(x, negative_slope, max_value, threshold), step by step."""
    pos = np.where(x > threshold, x, 0.0) if threshold != 0 else np.maximum(x, 0.0)
    if has_max_value:
        pos = np.clip(pos, 0.0, max_value)
    neg = negative_slope * np.maximum(threshold - x, 0.0) if negative_slope != 0 else 0.0
    return pos - neg


ACTIVATIONS = {
    "linear": lambda x: x,
    "relu": lambda x: np.where(x < 0, 0.0, x),
    "relu6": lambda x: np.clip(x, 0.0, 6.0),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
    "exponential": np.exp,
    "softsign": lambda x: x / (1.0 + np.abs(x)),
    "softplus": lambda x: np.logaddexp(0.0, x),
    "swish": lambda x: x / (1.0 + np.exp(-x)),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "hard_sigmoid": lambda x: np.clip(x + 3.0, 0.0, 6.0) / 6.0,
    "hard_sigmoid_keras2": lambda x: np.clip(0.2 * x + 0.5, 0.0, 1.0),
    "hard_swish": lambda x: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0,
    "hard_silu": lambda x: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0,
    "gelu": lambda x: 0.5 * x * (1.0 + _erf_v(x / np.sqrt(2.0))),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3))),
    "selu": lambda x: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * np.expm1(x)),
    "mish": lambda x: x * np.tanh(np.logaddexp(0.0, x)),
    "elu": lambda x, alpha=1.0: np.where(x > 0, x, alpha * np.expm1(x)),
    "leaky_relu": lambda x, negative_slope=0.2: np.where(x < 0, negative_slope * x, x),
    "relu_general": _relu_general,
}


def softmax(x, axis):
    z = np.exp(x - x.max(axis=axis, keepdims=True))
    return z / z.sum(axis=axis, keepdims=True)


def activation(name, x, axis=-1, **params):
    """Reference activation; softmax runs over ``axis`` (the feature axis)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return softmax(x, axis) if name == "softmax" else ACTIVATIONS[name](x, **params)


def dense_forward(x, layers):
    """A numpy forward pass: layers is a list of (kernel, bias or None, activation)."""
    h = np.asarray(x, dtype=np.float64)
    for kernel, bias, act in layers:
        h = h @ kernel.astype(np.float64)
        if bias is not None:
            h = h + bias
        h = activation(act, h, axis=-1)
    return h


def assert_close(got, want, rtol=1e-5):
    """Max |got - want| <= rtol * max(1, max |want|), with NaN where want has NaN."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    if finite.any():
        scale = max(1.0, float(np.abs(want[finite]).max()))
        err = float(np.abs(got[finite] - want[finite]).max())
        assert err <= rtol * scale, f"max abs error {err:.3g} > {rtol:g} x {scale:.3g}"


def model_forward(model, x):
    """A float64 numpy forward pass of a Sequential of Dense, BatchNormalization, Flatten and
    activation layers (Activation, ReLU, LeakyReLU, ELU, Softmax with their parameters)."""
    h = np.asarray(x, np.float64)
    with np.errstate(all="ignore"):
        for layer in model.layers:
            w = [v.astype(np.float64) for v in layer.get_weights()]
            kind = type(layer).__name__
            if kind == "Dense":
                h = activation(layer.activation, h @ w[0] + (w[1] if layer.use_bias else 0.0), axis=-1)
            elif kind == "BatchNormalization":
                gamma, beta, mean, var = w
                h = (h - mean) / np.sqrt(var + layer.epsilon) * gamma + beta
            elif kind == "Flatten":
                h = h.reshape(h.shape[0], -1)
            else:
                h = activation(layer.activation, h, axis=-1, **getattr(layer, "params", {}))
    return h


# ---------------------------------------------------------------------------------------------
# Convolution and pooling references (float64, loops over the window: the definition, not a trick)
def _window(size, kernel, stride, dilation, padding):
    span = (kernel - 1) * dilation + 1
    if padding == "causal":
        return -(-size // stride), span - 1
    if padding == "same":
        out = -(-size // stride)
        return out, max((out - 1) * stride + span - size, 0) // 2
    return (size - span) // stride + 1, 0


def rounded_kernel(kernel, precision: str, depthwise: bool = False) -> np.ndarray:
    """A Keras-shaped convolution kernel as ``precision`` keeps it (float32): int8's scales per
    output channel, the last axis (a depthwise kernel's last two, channel x multiplier)."""
    kernel = np.asarray(kernel, np.float32)
    outputs = kernel.shape[-2] * kernel.shape[-1] if depthwise else kernel.shape[-1]
    return effective(kernel.reshape(-1, outputs).T, precision).T.reshape(kernel.shape)


def conv2d_reference(x, kernel, bias=None, strides=(1, 1), dilation=(1, 1), padding="valid", groups=1):
    """Keras Conv2D on ``x`` (N, H, W, C) with ``kernel`` (KH, KW, C/groups, M)."""
    x, kernel = np.asarray(x, np.float64), np.asarray(kernel, np.float64)
    n, h, w, c = x.shape
    kh, kw, cg, m = kernel.shape
    (oh, pt), (ow, pl) = (
        _window(h, kh, strides[0], dilation[0], padding),
        _window(w, kw, strides[1], dilation[1], padding),
    )
    mg = m // groups
    out = np.zeros((n, oh, ow, m))
    for oy in range(oh):
        for ox in range(ow):
            for ky in range(kh):
                for kx in range(kw):
                    iy, ix = oy * strides[0] + ky * dilation[0] - pt, ox * strides[1] + kx * dilation[1] - pl
                    if 0 <= iy < h and 0 <= ix < w:
                        for g in range(groups):
                            out[:, oy, ox, g * mg : (g + 1) * mg] += (
                                x[:, iy, ix, g * cg : (g + 1) * cg] @ kernel[ky, kx, :, g * mg : (g + 1) * mg]
                            )
    return out + (0.0 if bias is None else np.asarray(bias, np.float64))


def depthwise_reference(x, kernel, bias=None, strides=(1, 1), dilation=(1, 1), padding="valid"):
    """Keras DepthwiseConv2D on ``x`` (N, H, W, C) with ``kernel`` (KH, KW, C, DM)."""
    kh, kw, c, dm = kernel.shape
    full = np.zeros((kh, kw, c, c * dm))
    for ch in range(c):
        full[:, :, ch, ch * dm : (ch + 1) * dm] = kernel[:, :, ch, :]
    return conv2d_reference(x, full, bias, strides, dilation, padding)


def pool2d_reference(x, pool, strides, padding, mode):
    """Keras Max/AveragePooling2D on ``x`` (N, H, W, C): taps outside the image left out."""
    x = np.asarray(x, np.float64)
    n, h, w, c = x.shape
    (oh, pt), (ow, pl) = _window(h, pool[0], strides[0], 1, padding), _window(w, pool[1], strides[1], 1, padding)
    out = np.zeros((n, oh, ow, c))
    for oy in range(oh):
        for ox in range(ow):
            y0, x0 = oy * strides[0] - pt, ox * strides[1] - pl
            patch = x[:, max(y0, 0) : y0 + pool[0], max(x0, 0) : x0 + pool[1], :]
            out[:, oy, ox] = patch.max(axis=(1, 2)) if mode == "max" else patch.mean(axis=(1, 2))
    return out


def python_env(**overrides):
    """The environment for a child Python process that imports this checkout's malinn: the
    current environment and ``overrides``, the source tree first on PYTHONPATH and whatever
    PYTHONPATH already held kept after it (where pyopencl may live outside site-packages)."""
    path = [str(Path(__file__).resolve().parents[1])] + (
        [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    )
    return dict(os.environ, **overrides, PYTHONPATH=os.pathsep.join(path))


#: Oclgrind's checks: out-of-bounds accesses (always on), API misuse, data races, uninitialised
#: values. One simulation thread: the suite runs its Oclgrind processes beside pytest's workers, one
#: per core, and more threads only contend for the same cores (measured: 8% less CPU time).
OCLGRIND_FLAGS = ["--check-api", "--data-races", "--uninitialized", "--num-threads", "1"]
#: pyopencl probes every device for NVIDIA's compute capability (``pyopencl.characterize``) when it
#: makes a kernel object and catches the CL_INVALID_VALUE Oclgrind answers; --check-api reports that
#: query. Exactly that report is ignored.
PYOPENCL_PROBE = (
    "\nOclgrind - OpenCL runtime error detected\n\tFunction: clGetDeviceInfo\n"
    "\tError:    CL_INVALID_VALUE\n\tFor argument 'param_name'\n"
)


def oclgrind_env() -> dict:
    """The environment of a Python process run under Oclgrind: its device chosen, no binary cache
    (Oclgrind builds from source), no pinned host memory, and no warnings or build reports on
    stderr (its builds take seconds: the plan's summary line would be all that stderr holds)."""
    return python_env(
        MALINN_DEVICE="Oclgrind",
        MALINN_BINARY_CACHE="0",
        MALINN_PINNED="0",
        PYTHONWARNINGS="ignore",
        MALINN_PROGRESS="0",
    )


def run_under_oclgrind(oclgrind: str, script: str, *args: str, options: tuple = (), timeout: int = 900) -> dict:
    """Runs Python ``script`` (with ``args``) on the Oclgrind device under OCLGRIND_FLAGS and
    Oclgrind's ``options``; asserts that it exited cleanly and that Oclgrind reported nothing (but
    PYOPENCL_PROBE), and returns the JSON of its last line."""
    done = subprocess.run(
        [oclgrind, *OCLGRIND_FLAGS, *options, sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=oclgrind_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    stderr = done.stderr.replace(PYOPENCL_PROBE, "").strip()
    assert stderr == "", stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def program_key(spec) -> tuple:
    """What makes two configured kernel entries run the same program on the same buffers: the
    sources, the function, the defines, the launch geometry and the matrices' restrictions. The
    preconditions (which batches the runtime gives an entry) are left out: variants that differ only
    there (gemv_c, gemv_batch_c, gemv_batch_small_c) run one program, and a test checks it once."""
    return (
        spec.source,
        spec.sources,
        spec.function,
        tuple(sorted((k, str(v)) for k, v in dict(spec.defines).items())),
        tuple(sorted(spec.matrices.items())),
        spec.workgroup,
        spec.ndrange,
        spec.scale,
        spec.split,
        spec.arglist,
    )


def summary_rows(text: str) -> list:
    """The rows of a ``model.summary()`` table as dicts by column title ("Layer (type)", "Output
    Shape", "Param #", "Connected to", "Kernel"), each cell with the lines it was wrapped onto
    joined by spaces again (a row starts on a line whose "Param #" column is not empty)."""
    lines = text.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("Layer (type)"))
    titles = [
        t
        for t in ("Layer (type)", "Output Shape", "Param #", "Connected to", "Kernel")
        if f"{t.split()[0]}" in lines[top]
    ]  # a narrow column wraps its title: its first word is on top
    starts = [lines[top].index(t.split()[0]) for t in titles]
    first = next(i for i in range(top, len(lines)) if lines[i].startswith("=")) + 1
    rows = []
    for line in lines[first:]:
        if line.startswith("="):
            break
        cells = [line[a:b].strip() for a, b in zip(starts, starts[1:] + [None])]
        if cells[titles.index("Param #")] or not rows:
            rows.append(cells)
        else:
            rows[-1] = [f"{old} {new}" if new else old for old, new in zip(rows[-1], cells)]
    return [dict(zip(titles, row)) for row in rows]


def run_on_terminal(args: list, env: dict, timeout: float = 300) -> tuple:
    """Runs ``args`` with its stderr on a new pseudo-terminal (so that ``sys.stderr.isatty()``);
    returns ``(exit status, stdout, what the terminal received)`` (its ``\\r\\n`` line ends as ``\\n``)."""
    import pty
    import select

    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=follower, stdin=subprocess.DEVNULL, env=env)
        os.close(follower)
        follower = None
        received = b""
        while True:  # read as it comes: a terminal holds a few KiB, and a child writing more would wait
            ready, _, _ = select.select([leader], [], [], timeout)
            if not ready:
                proc.kill()
                raise TimeoutError(f"{args} wrote nothing for {timeout} s")
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal's last writer
                break
            if not chunk:
                break
            received += chunk
        stdout = proc.stdout.read()
        status = proc.wait(timeout=timeout)
    finally:
        os.close(leader)
        if follower is not None:
            os.close(follower)
    return status, stdout.decode(), received.decode(errors="replace").replace("\r\n", "\n")


def described_gpu(name: str = "test GPU", **changes):
    """A large OpenCL GPU as a :class:`~malinn.backends.base.Device` description only (no driver
    behind it): what the kernel choice reads, for tests of which kernel a device would get."""
    from dataclasses import replace

    from malinn.backends.base import Device

    gpu = Device(
        backend="opencl",
        index=(0, 0),
        name=name,
        platform="test",
        vendor="test",
        type="GPU",
        compute_units=100,
        global_memory=2**34,
        max_allocation=2**32,
        max_work_group_size=1024,
        max_work_item_sizes=(1024, 1024, 64),
        local_memory=49152,
        image_support=False,
        image2d_max_size=(0, 0),
        opencl_c_version="OpenCL C 1.2",
        driver_version="1",
        host_unified_memory=False,
    )
    return replace(gpu, **changes)


def small_conv_model():
    """Conv2D(5, 3, relu) over 6x6x3 images with seeded weights: a sample is several columns of its
    input's and its output's matrix views (6x6 and 4x4 pixels)."""
    from malinn import Sequential
    from malinn.layers import Conv2D

    rng = np.random.default_rng(4)
    model = Sequential([Conv2D(5, 3, activation="relu")])
    model.build((None, 6, 6, 3))
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.3 for w in model.get_weights()])
    return model


def small_dense_model(seed=0, features=37, hidden=24, outputs=5, scale=0.3):
    """Dense(hidden, relu) then Dense(outputs, softmax) over ``features``, seeded weights."""
    from malinn import Sequential
    from malinn.layers import Dense

    rng = np.random.default_rng(seed)
    model = Sequential([Dense(hidden, activation="relu"), Dense(outputs, activation="softmax")])
    model.build((None, features))
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * scale for w in model.get_weights()])
    return model


def small_dense_reference(model, x):
    """numpy's forward of a :func:`small_dense_model`."""
    w = model.get_weights()
    return dense_forward(np.asarray(x, np.float32), [(w[0], w[1], "relu"), (w[2], w[3], "softmax")])


def two_input_model():
    """Inputs ``a`` (6) and ``b`` (4), each through a Dense of 3, added; seeded weights."""
    from malinn import Functional, Input
    from malinn.layers import Add, Dense

    a, b = Input((6,), name="a"), Input((4,), name="b")
    model = Functional([a, b], Add()([Dense(3, name="da")(a), Dense(3, name="db")(b)]))
    rng = np.random.default_rng(3)
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in model.get_weights()])
    return model
