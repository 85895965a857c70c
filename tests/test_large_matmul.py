"""Every matmul kernel at large shapes on a GPU: M and N up to 4096, batches up to 2048.

Each kernel the library holds for the device's backend, in every configuration the tuner can emit
(``KernelSpec.configurations``: the entry's defaults and its candidates that the device can launch),
multiplies large random operands and is compared with numpy in float64. The shapes are those at which
the split-K kernels (gemv_split, gemm_keras: the last work-group of a tile adds every slice's
partial sums) read stale partial sums on an NVIDIA H200 when their fence ordered memory for the
work-group only (kernels/device_fence.clh): thousands of work-groups in flight, rows off by 10-30%.
The kernels' preconditions (``max_n``, ``min_k``...) say where a kernel is fast, not where it is
right: the tuner and the GEMM benchmark run each kernel at every shape, so each must compute every
shape it can launch. CPU devices check every kernel on odd shapes up to 4099 in the kernel tests and
are not given these (a naive kernel at 4096 x 4096 x 2048 takes minutes on two cores).
"""

from __future__ import annotations

import numpy as np
import pytest

from malinn.library.kernel_library import load_library
from malinn.tuning.tuner import Product

LIB = load_library()
#: (m, k, n): a layer of m units and k inputs at batch n
SHAPES = [(2048, 2048, 1000), (4096, 4096, 2048), (4096, 1001, 2048), (1001, 4096, 13), (4096, 4096, 1)]
_WANT: dict = {}


def configurations(device) -> list:
    """``(label, spec)`` for every matmul kernel of the device's backend in every configuration."""
    found = []
    for codename in LIB.codenames("matmul", device.backend):
        spec = LIB[codename]
        for config in spec.configurations(device) if spec.candidates else [spec.config]:
            found.append((f"{codename} {' '.join(f'{k}={v}' for k, v in config.items())}", spec.configure(config)))
    return found


def operands(shape: tuple) -> tuple:
    """Random float32 ``(a, b)`` for ``shape`` and ``a @ b`` in float64, made once per shape."""
    if shape not in _WANT:
        m, k, n = shape
        rng = np.random.default_rng(m * 7 + k * 3 + n)
        a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
        _WANT[shape] = (a, b), a.astype(np.float64) @ b
    return _WANT[shape]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_matmul_kernel_is_right_at_large_shapes_on_a_gpu(device, shape):
    _WANT.clear()  # one shape's operands at a time
    if device.kind != "gpu":
        pytest.skip(
            f"{device.name} is a {device.kind}: large shapes run on GPUs (CPUs take odd shapes up to "
            f"4099 in the kernel tests)"
        )
    m, k, n = shape
    wrong, ran = [], 0
    for label, spec in configurations(device):
        if any(r.image for r in spec.matrices.values()) and not spec.accepts(m, k, n, device):
            continue  # beyond the device's image limits: the library never offers it
        given, want = operands(shape)
        product = Product(spec, device, m, k, n, operands=given)
        product.launch().wait()
        error = float(np.abs(product.r.numpy() - want).max() / max(1.0, np.abs(want).max()))
        ran += 1
        if not error <= 1e-4:
            wrong.append(f"{label}: relative error {error:.3g}")
    assert ran, f"no matmul kernel ran at {shape} on {device.name}"
    assert not wrong, (
        f"{len(wrong)} of {ran} configurations are wrong at {m}x{k} by {k}x{n} on {device.name}:\n" + "\n".join(wrong)
    )
