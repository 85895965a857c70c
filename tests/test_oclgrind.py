"""Every kernel of kernels/library.json under Oclgrind's memory, race and API checks.

Oclgrind (Debian's ``oclgrind``) simulates an OpenCL device and reports out-of-bounds accesses,
data races, uses of uninitialised values and API misuse on stderr. The cases (odd shapes for
every matmul kernel and each of its tuned configurations; each matmul's fused epilogue: bias, a
four-parameter activation and the affine step; the fused softmax in every configuration of a
kernel that has one; bias, scale-and-shift, every activation, softmax and re-layout on odd shapes
in several layouts; whole models; a Functional graph with every merge kernel) run in a few
``oclgrind --check-api --data-races --uninitialized --num-threads 1 python3 tests/oclgrind_driver.py``
processes (support.OCLGRIND_FLAGS; in parallel, one per core, at most two by default); each case is then asserted to have left
nothing on stderr and to match numpy.

Tuned configurations: ``tuning_configurations`` lists every configuration the tuner can emit for
a kernel (``KernelSpec.configurations()``: the entry's defaults and its ``candidates`` that meet its
``constraints``). The defaults run on every odd shape, every other configuration on three of
the odd shapes' padded problems (``configuration_shapes``): the largest (several row and column
tiles, the last partial; its batch narrowed to two column tiles, ``_narrow``), the one with the most
K steps, and the smallest (one tile, nearly all padding); a kernel reads and writes its padded
buffers, so shapes that pad alike check the same (``_distinct_shapes``). A program that several entries run (variants that differ only in their
preconditions, support.program_key) is simulated once per shape. Should a kernel ever list more
than ``ALL_LIMIT`` (a whole search space), simulating all would take hours, so the suite then checks the defaults on
every shape plus a set that covers every pair of define values any valid configuration has
(``covering_configurations``); ``MALINN_OCLGRIND_CONFIGS=all`` checks them all regardless (on a
machine with many cores: one Oclgrind process runs per core).

Oclgrind 21.10's ``--uninitialized`` check misreports buffers created after others were released;
tests/oclgrind_driver.py therefore keeps every buffer alive, so no memory is reused (see there).

Oclgrind reports one thing that is not malinn's: pyopencl probes every device for NVIDIA's compute
capability (``CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV``, in ``pyopencl.characterize``) when it makes a
kernel object, and catches the ``CL_INVALID_VALUE`` that Oclgrind answers; ``--check-api``
reports that query. Exactly that report is ignored (``PYOPENCL_PROBE``).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support import OCLGRIND_FLAGS, PYOPENCL_PROBE, oclgrind_env, program_key

from malinn import ops
from malinn.library.kernel_library import load_library

OCLGRIND = shutil.which("oclgrind")
pytestmark = pytest.mark.skipif(
    OCLGRIND is None,
    reason="oclgrind is not on PATH: install Debian's oclgrind package "
    "(bash .ci/setup --test does) to check every kernel for out-of-bounds accesses and data races",
)

DRIVER = Path(__file__).with_name("oclgrind_driver.py")
MARK = "@@malinn-case"
LIB = load_library()
MATMULS = LIB.codenames("matmul")
SHAPES = [(1, 1, 1), (3, 5, 7), (13, 37, 5), (33, 17, 65)]
LAYOUTS = ["R", "C", "C_4_2_C", "C_4_4_C", "R_2_4_R", "R_16_16_C_4_4_R", "C_8_4_R_2_2_C"]
ELEMENT_SHAPES = [(1, 1), (3, 5), (13, 7), (33, 17)]
#: (matrix, another view of the same tensor): Flatten and Reshape between layouts
RESHAPES = [((1, 1), (1, 1)), ((3, 5), (15, 1)), ((13, 7), (7, 13)), ((7, 6), (3, 14))]
PARAMS = {
    "elu": {"alpha": 0.3},
    "leaky_relu": {"negative_slope": 0.01},
    "relu_general": {"negative_slope": 0.1, "max_value": 2.5, "threshold": 0.5, "has_max_value": 1.0},
}
EPILOGUE_PARAMS = PARAMS["relu_general"]
TOLERANCE = 1e-5
SPLIT_KERNEL = "blocked_rmrm" if "blocked_rmrm" in LIB else MATMULS[0]
MODE = os.environ.get("MALINN_OCLGRIND_CONFIGS", "auto")
ALL_LIMIT = 40
PROCESSES = (os.cpu_count() or 1) if MODE == "all" else min(2, os.cpu_count() or 1)


# ------------------------------------------------------------------------ tuned configurations


def tuning_configurations(spec) -> list[dict]:
    """Every configuration the tuner can emit for kernel ``spec`` (a list of define dicts, the
    entry's defaults first; empty for a kernel that is not tunable).

    This is the one place that enumerates them: ``KernelSpec.configurations()`` without a device
    gives the defaults and every ``candidates`` entry of the library that meets the entry's
    ``constraints`` (the tuner further drops, per device, work-groups and local memory the device
    lacks; Oclgrind is started with limits large enough for all of them). Configurations that the
    library's ``defaults`` name for a device kind are added when they are not among them.
    """
    if not hasattr(spec, "configurations"):
        return []
    configs = (
        [dict(c) for c in spec.configurations()]
        if (getattr(spec, "candidates", ()) or getattr(spec, "tuning", ()))
        else []
    )
    # and the configurations the library's defaults name per device kind (the runtime uses them:
    # the choice, the fallbacks of small batches, the kernel that fuses softmax)
    for kind, table in itertools.product(
        ("gpu", "cpu", "accelerator"), ("matmul", "matmul_fallback", "matmul_softmax")
    ):
        for default in LIB.default_specs(table, kind):
            named = dict(default.defines)
            if (
                default.codename == spec.codename
                and named != dict(spec.defines)
                and _as_defines(named) not in [_as_defines(c) for c in configs]
            ):
                configs = (configs or [dict(spec.defines)]) + [named]
    return configs


def _pairs(config: dict) -> set:
    return {((a, config[a]), (b, config[b])) for a, b in itertools.combinations(sorted(config), 2)}


def _config_cost(spec, config) -> float:
    """A rough simulation cost: multiply-adds of the distinct padded problems, weighted by the
    work-group size (Oclgrind's race checks slow down with large work-groups)."""
    configured = spec.configure(config)
    work_group = math.prod(configured.workgroup or (1,))
    return sum(_mac(configured, shape) for shape in configuration_shapes(configured)) * (1 + work_group / 256) ** 1.5


def _mac(spec, shape) -> int:
    plan = ops.matmul_plan(spec, *shape)
    return plan["a"][0] * plan["a"][1] * plan["r"][1]


def odd_shapes(spec) -> list:
    """SHAPES for kernel ``spec``, each batch capped at 2 * max_n + 1 where the kernel's
    preconditions bound it (gemv: NB samples per work-group, so three or more column groups are
    still checked; the runtime never runs it on wider batches, and simulating them costs time)."""
    return _capped(spec, SHAPES)


def _capped(spec, shapes) -> list:
    """``shapes`` with each batch capped at 2 * max_n + 1 where ``spec``'s preconditions bound it."""
    bound = dict(spec.preconditions).get("max_n")
    return [(m, k, min(n, 2 * bound + 1)) if bound else (m, k, n) for m, k, n in shapes]


def _distinct_shapes(spec) -> list:
    """The shapes of SHAPES that give distinct padded problems for ``spec`` (the odd shapes
    first): memory accesses depend on the padded sizes, so equal ones would check the same."""
    seen, shapes = set(), []
    for shape in sorted(odd_shapes(spec), key=lambda s: -s[0] * s[1] * s[2]):
        plan = ops.matmul_plan(spec, *shape)
        key = (plan["a"], plan["b"], plan["r"])
        if key not in seen:
            seen.add(key)
            shapes.append(shape)
    return shapes


def configuration_shapes(spec) -> list:
    """The shapes a configuration other than the entry's default is checked on, of its distinct
    padded problems (with MALINN_OCLGRIND_CONFIGS=all, every one): the largest (the most row and
    column tiles, the last of each partial), the one with the most K steps and the smallest (one
    tile, nearly all padding); the batches narrowed (``_narrow``)."""
    shapes = _distinct_shapes(spec)
    if MODE != "all":
        deepest = max(shapes, key=lambda shape: ops.matmul_plan(spec, *shape)["a"][1])
        shapes = [shape for shape in shapes if shape in (shapes[0], deepest, shapes[-1])]
    return _narrow(spec, shapes)


def _as_defines(config: dict) -> dict:
    return {k: str(v) for k, v in config.items()}


def covering_configurations(spec, configs: list[dict]) -> list[dict]:
    """The entry's default configuration, then configurations chosen greedily (most new pairs per
    unit of simulation cost) until every pair of define values that occurs in some valid
    configuration occurs in a chosen one. Deterministic."""
    default = dict(spec.defines)
    chosen = [c for c in configs if _as_defines(c) == _as_defines(default)][:1]
    needed = set().union(*(_pairs(c) for c in configs)) if configs else set()
    covered = set().union(*(_pairs(c) for c in chosen)) if chosen else set()
    costs = [_config_cost(spec, c) for c in configs]
    while covered != needed:
        best = max(range(len(configs)), key=lambda i: (len(_pairs(configs[i]) - covered) / costs[i], -i))
        covered |= _pairs(configs[best])
        chosen.append(configs[best])
    return chosen


def configurations_to_check(spec) -> list:
    """``[None]`` (the entry as it is) for a kernel without tuning, else the configurations the
    suite checks: all of them (the library lists a dozen or so candidates), or a covering set when
    a kernel's configurations are too many to simulate (over ``ALL_LIMIT``, unless
    MALINN_OCLGRIND_CONFIGS=all)."""
    configs = tuning_configurations(spec)
    if not configs:
        return [None]
    return configs if MODE == "all" or len(configs) <= ALL_LIMIT else covering_configurations(spec, configs)


# ------------------------------------------------------------------------------------- cases


def _narrow(spec, shapes) -> list:
    """``shapes`` with each batch cut to ``max(17, c + 1)`` where that is smaller, c being the
    column alignment of ``spec``'s result: still two column tiles, the second partial (or, for a
    gemv that takes NB <= 8 samples a work-group, three groups), at a fraction of the simulation
    of 65 samples. Padded problems made equal by the cut are checked once."""
    narrowed, seen = [], set()
    for m, k, n in shapes:
        shape = (m, k, min(n, max(17, spec.matrices["r"].col_align + 1)))
        plan = ops.matmul_plan(spec, *shape)
        if (plan["a"], plan["b"], plan["r"]) not in seen:
            seen.add((plan["a"], plan["b"], plan["r"]))
            narrowed.append(shape)
    return narrowed


def _with(spec, config):
    """``spec`` in configuration ``config`` (None or empty: its defaults)."""
    return spec.configure(config) if config else spec


def matmul_cases() -> list[dict]:
    cases, checked = [], {}
    for codename in MATMULS:
        spec = LIB[codename]
        for i, config in enumerate(configurations_to_check(spec)):
            configured = _with(spec, config)
            # the default configuration on every odd shape; the others on the largest and smallest
            # padded problems (configuration_shapes); a program another entry already
            # runs on a shape (a variant that differs only in preconditions) is simulated once, the
            # case naming both kernels
            shapes = odd_shapes(configured) if i == 0 else configuration_shapes(configured)
            for shape in shapes:
                same = checked.get((program_key(configured), tuple(shape)))
                if same is not None:
                    same["kernels"].append(codename)
                    continue
                cases.append(
                    {
                        "op": "matmul",
                        "codename": codename,
                        "config": config,
                        "shape": list(shape),
                        "kernels": [codename],
                        "cost": _mac(configured, shape) * (1 + math.prod(configured.workgroup or (1,)) / 256) ** 1.5,
                    }
                )
                checked[program_key(configured), tuple(shape)] = cases[-1]
        # the fused epilogue, default configuration: every vector it reads (bias, scale, shift) and
        # all four float parameters (the formulas are test_ops.py's; memory is what is checked here),
        # batches capped as odd_shapes caps them and narrowed (the vectors are read per row; more
        # column tiles are the configuration cases' concern)
        for shape in _narrow(spec, _capped(spec, [(3, 5, 7), (33, 17, 65)])):
            cases.append(
                {
                    "op": "matmul",
                    "codename": codename,
                    "config": None,
                    "shape": list(shape),
                    "bias": True,
                    "activation": "relu_general",
                    "params": EPILOGUE_PARAMS,
                    "affine": True,
                    "kernels": [codename],
                    "cost": _mac(spec, shape) * 2,
                }
            )
        if "softmax" in spec.epilogue:  # whole columns per work-group, in each configuration
            for config in tuning_configurations(spec) or [dict(spec.defines)]:
                holds = dict(spec.configure(config).preconditions)["max_m"]
                for shape in {(1, 5, 3), (min(holds, 33), 17, 5), (holds, 3, 2)}:
                    cases.append(
                        {
                            "op": "matmul",
                            "codename": codename,
                            "config": config,
                            "shape": list(shape),
                            "bias": True,
                            "activation": "softmax",
                            "affine": True,
                            "kernels": [codename],
                            "cost": _mac(spec.configure(config), shape) * 2,
                        }
                    )
    return cases


def elementwise_cases() -> list[dict]:
    """Bias and scale-and-shift in every layout; each activation in one layout (rotating through
    them: the formula touches no memory, the layout's index macro does), relu and softmax (a loop
    over a whole column) in every layout; re-layout between every pair of six layouts. All shapes."""
    cases = []
    activations = LIB.codenames("activation")
    for shape, (li, layout) in itertools.product(ELEMENT_SHAPES, enumerate(LAYOUTS)):
        cases.append({"op": "bias", "layout": layout, "shape": list(shape), "kernels": LIB.codenames("bias")[:1]})
        cases.append({"op": "affine", "layout": layout, "shape": list(shape), "kernels": LIB.codenames("affine")[:1]})
        for ai, codename in enumerate(activations):
            name = LIB[codename].activation
            if ai % len(LAYOUTS) == li or name in ("relu", "softmax"):
                cases.append(
                    {
                        "op": "activation",
                        "name": name,
                        "layout": layout,
                        "shape": list(shape),
                        "params": PARAMS.get(name, {}),
                        "kernels": [codename],
                    }
                )
    for (src, dst), shape in itertools.product(itertools.permutations(LAYOUTS[:6], 2), ELEMENT_SHAPES):
        cases.append(
            {"op": "relayout", "src": src, "dst": dst, "shape": list(shape), "kernels": LIB.codenames("relayout")[:1]}
        )
    for (src, dst), (shape, view) in itertools.product(itertools.permutations(LAYOUTS[:4], 2), RESHAPES):
        cases.append(
            {
                "op": "reshape",
                "src": src,
                "dst": dst,
                "shape": list(shape),
                "view": list(view),
                "kernels": LIB.codenames("reshape")[:1],
            }
        )
    for case in cases:
        case["cost"] = 2000
    return cases


#: the single-input layers, each on odd samples, first (input in C) and after a Dense (the matmul
#: kernel's layout: morton_4_2's blocked C_4_2_C): (layer, config, sample shape, kernels it runs)
LAYER_CASES = [
    ("BatchNormalization", {"axis": 1}, (3, 5), ["broadcast"]),
    ("Normalization", {"axis": 1}, (3, 5), ["broadcast"]),
    ("PReLU", {"shared_axes": [2]}, (3, 5), ["broadcast"]),
    ("Softmax", {"axis": 1}, (3, 5), ["normalize_axes"]),
    ("Softmax", {"axis": [1, 3]}, (3, 1, 5), ["normalize_axes", "permute"]),
    ("LayerNormalization", {"axis": [1, 2]}, (3, 5), ["normalize_axes"]),
    ("LayerNormalization", {"axis": -1, "rms_scaling": True}, (13,), ["normalize_columns"]),
    ("LayerNormalization", {"axis": -1}, (3, 13), ["normalize_columns"]),
    ("UnitNormalization", {"axis": -1}, (3, 13), ["normalize_columns"]),
    ("UnitNormalization", {"axis": 1}, (5, 3), ["normalize_axes"]),
    ("Permute", {"dims": [2, 1]}, (3, 5), ["permute"]),
    ("RepeatVector", {"n": 3}, (5,), ["repeat_vector"]),
    ("Masking", {"mask_value": 0.0}, (4, 3), ["masking_any", "merge"]),
    # indices and tokens from x * 3 (truncated): outside the range, the vocabulary, negative, the mask
    ("CategoryEncoding", {"num_tokens": 5, "output_mode": "one_hot"}, (3,), ["category_encoding"]),
    ("CategoryEncoding", {"num_tokens": 4, "output_mode": "count"}, (13,), ["category_encoding"]),
    (
        "IntegerLookup",
        {"vocabulary": [3, -2, 0, 7, 1], "num_oov_indices": 2, "mask_token": 5, "output_mode": "multi_hot"},
        (5,),
        ["integer_lookup", "category_encoding"],
    ),
    ("IntegerLookup", {"vocabulary": [1], "num_oov_indices": 0}, (3,), ["integer_lookup"]),
]


def layer_cases() -> list[dict]:
    return [
        {
            "op": "layer",
            "layer": layer,
            "config": config,
            "shape": list(shape),
            "batch": 3,
            "after_dense": after,
            "kernels": kernels,
            "cost": 5000,
        }
        for layer, config, shape, kernels in LAYER_CASES
        for after in (False, True)
    ]


def model_cases() -> list[dict]:
    cases = []
    for codename in MATMULS:
        cases.append(
            {
                "op": "model",
                "codename": codename,
                "input": 13,
                "units": [7, 33, 5],
                "activations": ["relu", "sigmoid", "softmax"],
                "batch": 19,
                "kernels": [codename],
                "cost": 50000,
            }
        )
    # a kernel without preconditions or wide padding, so that a few samples make a pass
    cases.append(
        {
            "op": "model",
            "codename": SPLIT_KERNEL,
            "input": 13,
            "units": [7, 33, 5],
            "activations": ["tanh", "elu", "softmax"],
            "batch": 23,
            "split_samples": 4,
            "kernels": [SPLIT_KERNEL],
            "cost": 50000,
        }
    )
    # a kernel that computes a Dense layer and the head after it: chosen by the plan alone, with the
    # GPU's defaults (the driver checks that the plan runs it)
    for codename in LIB.codenames("matmul_head"):
        for batch in (1, 3):
            cases.append(
                {
                    "op": "model",
                    "codename": codename,
                    "gpu_defaults": True,
                    "input": 13,
                    "units": [7, 33, 5],
                    "activations": ["relu", "sigmoid", "softmax"],
                    "batch": batch,
                    "kernels": [codename],
                    "cost": 50000,
                }
            )
    return cases


def graph_cases() -> list[dict]:
    """A Functional graph with every merge kernel (broadcasting, a fused activation, Concatenate on
    two axes, a normalised Dot), beside matmuls that write R, C and Morton layouts; gemm_tiled_c
    writes its Dense result straight into the last Concatenate's buffer (a view: epilogue.clh R_VIEW)."""
    return [
        {
            "op": "graph",
            "codename": codename,
            "batch": 7,
            "kernels": ["merge", "concat", "dot", codename],
            "cost": 50000,
        }
        for codename in ("blocked_rmrm", "morton_4_2", "gemm_tiled_c")
    ]


def window_cases() -> list[dict]:
    """Convolutions (every conv and im2col kernel, groups, dilation, strides, both paddings),
    depthwise and separable convolutions, pooling and pixel-moving layers, as small models."""
    convs = [
        ["Conv2D", {"filters": 5, "kernel_size": 3, "strides": 2, "padding": "same", "activation": "relu"}],
        ["Conv2D", {"filters": 3, "kernel_size": [3, 2], "dilation_rate": 2, "padding": "same"}],
    ]
    cases = []
    for op, codename in [("conv", c) for c in LIB.codenames("conv")] + [("im2col", c) for c in LIB.codenames("im2col")]:
        cases.append(
            {
                "op": "window",
                "use": [[op, codename]],
                "layers": convs,
                "input": [7, 6, 3],
                "batch": 2,
                "kernels": [codename],
                "cost": 20000,
            }
        )
    for codename in [c for c in LIB.codenames("conv") if "LOCAL" in LIB[c].defines]:  # the local-memory staging,
        cases.append(
            {
                "op": "window",
                "use": [["conv", codename, {"LOCAL": 1, "KC": 2}]],
                "layers": convs,
                "input": [7, 6, 3],
                "batch": 2,
                "kernels": [codename],
                "cost": 20000,
            }
        )
    for channels, config in ((3, {"KC": 2}), (8, {"KC": 4, "VW": 4})):  # the implicit GEMM: scalar and vector loads
        config = {"LOCAL": 2, "MWI": 2, "NWI": 2, "MDIM": 4, "NDIM": 4, **config}
        cases.append(
            {
                "op": "window",
                "use": [["conv", "conv_kn2col", config]],
                "layers": convs,
                "input": [7, 6, channels],
                "batch": 2,
                "kernels": ["conv_kn2col"],
                "cost": 20000,
            }
        )
    # the implicit GEMM: a K step past CIN, float4 and scalar patch loads, K split over 4 work-groups,
    # two local buffers (one barrier a step: a race would show here)
    for channels, config in ((3, {"KT": 4, "SLICES": 4, "DOUBLE": 1}), (8, {"KT": 8, "PREFETCH": 0})):
        config = {"TM": 8, "TN": 8, "RM": 4, "RN": 1, **config}
        cases.append(
            {
                "op": "window",
                "use": [["conv", "conv_implicit", config]],
                "layers": convs,
                "input": [7, 6, channels],
                "batch": 2,
                "kernels": ["conv_implicit"],
                "cost": 20000,
            }
        )
    # groups: tiles within one group (its channels only, float4 loads from channel 4) and across two
    for filters, config in (
        (32, {"TM": 16, "TN": 8, "RM": 4, "RN": 2, "KT": 4}),
        (6, {"TM": 8, "TN": 8, "RM": 4, "RN": 1, "KT": 4, "SLICES": 2}),
    ):
        cases.append(
            {
                "op": "window",
                "use": [["conv", "conv_implicit", config]],
                "input": [5, 5, 8],
                "batch": 2,
                "layers": [["Conv2D", {"filters": filters, "kernel_size": 3, "groups": 2, "padding": "same"}]],
                "kernels": ["conv_implicit"],
                "cost": 10000,
            }
        )
    cases.append(
        {
            "op": "window",
            "use": [["conv", "conv_kn2row"]],
            "input": [5, 5, 4],
            "batch": 2,
            "layers": [["Conv2D", {"filters": 6, "kernel_size": 3, "groups": 2, "padding": "same"}]],
            "kernels": ["conv_kn2row"],
            "cost": 10000,
        }
    )
    # the convolutions' weights in half and int8 (LOAD_W, LOAD_W4 and the int8 scales in the epilogue)
    for precision, use in (
        (
            "int8-weights",
            ["conv", "conv_kn2col", {"LOCAL": 2, "MWI": 2, "NWI": 2, "MDIM": 4, "NDIM": 4, "KC": 4, "VW": 4}],
        ),
        ("fp16-storage", ["conv", "conv_kn2row"]),
        ("int8-weights", ["conv", "conv_implicit", {"TM": 8, "TN": 8, "RM": 4, "RN": 1, "KT": 4}]),
    ):
        cases.append(
            {
                "op": "window",
                "use": [use],
                "input": [5, 4, 8],
                "batch": 1,
                "precision": precision,
                "kernels": [use[1]] + LIB.codenames("depthwise"),
                "cost": 10000,
                "layers": [
                    ["Conv2D", {"filters": 5, "kernel_size": 3, "padding": "same", "activation": "relu"}],
                    ["SeparableConv2D", {"filters": 3, "kernel_size": 3}],
                ],
            }
        )
    cases.append(
        {
            "op": "window",
            "input": [6, 5, 3],
            "batch": 2,
            "kernels": LIB.codenames("depthwise"),
            "layers": [
                ["DepthwiseConv2D", {"kernel_size": 3, "depth_multiplier": 2, "padding": "same", "activation": "tanh"}],
                ["SeparableConv2D", {"filters": 4, "kernel_size": 3, "strides": 2}],
            ],
            "cost": 10000,
        }
    )
    cases.append(
        {
            "op": "window",
            "input": [7, 6, 3],
            "batch": 2,
            "kernels": LIB.codenames("pool") + LIB.codenames("spatial"),
            "layers": [
                ["ZeroPadding2D", {"padding": [[1, 2], [0, 1]]}],
                ["MaxPooling2D", {"padding": "same"}],
                ["UpSampling2D", {"size": [2, 3]}],
                ["Cropping2D", {"cropping": [[1, 0], [2, 1]]}],
                ["AveragePooling2D", {"pool_size": 3, "strides": 2, "padding": "same"}],
                ["GlobalAveragePooling2D", {}],
            ],
            "cost": 10000,
        }
    )
    cases.append(
        {
            "op": "window",
            "input": [4, 3, 5],
            "batch": 2,
            "cost": 10000,  # transposed convolution, resizing
            "kernels": LIB.codenames("conv_transpose") + LIB.codenames("resize"),
            "layers": [
                [
                    "Conv2DTranspose",
                    {
                        "filters": 3,
                        "kernel_size": 3,
                        "strides": 2,
                        "padding": "same",
                        "output_padding": 1,
                        "activation": "relu",
                    },
                ],
                ["Resizing", {"height": 5, "width": 9}],
                ["UpSampling2D", {"size": 2, "interpolation": "bilinear"}],
                ["Resizing", {"height": 3, "width": 4, "interpolation": "nearest"}],
                ["Resizing", {"height": 7, "width": 2, "interpolation": "bicubic"}],
                ["Resizing", {"height": 2, "width": 5, "interpolation": "area"}],
                ["UpSampling2D", {"size": [1, 2], "interpolation": "bicubic"}],
            ],
        }
    )
    volume_ops = ("conv3d", "conv3d_transpose", "pool3d", "spatial3d")
    cases.append(
        {
            "op": "window",
            "input": [3, 4, 3, 2],
            "batch": 2,
            "cost": 10000,  # the volumes' kernels: strides, dilation, groups, both paddings, output_padding
            "kernels": [codename for op in volume_ops for codename in LIB.codenames(op)] + LIB.codenames("pool"),
            "layers": [
                [
                    "Conv3D",
                    {"filters": 4, "kernel_size": 3, "strides": [1, 2, 1], "padding": "same", "activation": "relu"},
                ],
                [
                    "Conv3D",
                    {"filters": 4, "kernel_size": 2, "dilation_rate": [2, 1, 1], "groups": 2, "padding": "same"},
                ],
                [
                    "Conv3DTranspose",
                    {"filters": 2, "kernel_size": 2, "strides": 2, "padding": "same", "output_padding": [1, 0, 1]},
                ],
                ["ZeroPadding3D", {"padding": [[1, 0], [0, 1], [1, 1]]}],
                ["MaxPooling3D", {"pool_size": 2, "padding": "same"}],
                ["UpSampling3D", {"size": [1, 2, 1]}],
                ["Cropping3D", {"cropping": [[1, 0], [0, 1], [1, 0]]}],
                ["AveragePooling3D", {"pool_size": 2, "strides": 1, "padding": "same"}],
                ["GlobalMaxPooling3D", {}],
            ],
        }
    )
    cases.append(
        {
            "op": "window",
            "input": [5, 4, 3],
            "batch": 2,
            "kernels": LIB.codenames("pool"),  # NAN_PROPAGATES 1
            "layers": [["GlobalMaxPooling2D", {}]],
            "cost": 2000,
        }
    )
    # the global pooling work-groups (kernels/global_pool.cl): lanes past an image's pixels, channels
    # past the layer's (R's rows padded to LC), the local tree, the sliced kernel's scratch and last group
    for codename, config, layer, shape in (
        ("global_pool", {"LC": 4, "LP": 4, "UNROLL": 2}, "GlobalMaxPooling2D", [5, 3, 6]),
        ("global_pool_sliced", {"LC": 4, "LP": 4, "SLICES": 4, "UNROLL": 2}, "GlobalAveragePooling2D", [64, 32, 5]),
    ):
        cases.append(
            {
                "op": "window",
                "use": [["pool", codename, config]],
                "input": shape,
                "batch": 2,
                "kernels": [codename],
                "layers": [[layer, {}]],
                "cost": 10000,
            }
        )
    return cases


def attention_cases() -> list[dict]:
    """MultiHeadAttention and AdditiveAttention with every mask (tests/oclgrind_driver.py run_attention):
    a query that may attend to nothing in each mask mode, one step and odd lengths; then with the
    tiled kernel chosen in small blocks and tiles (blocks ending inside a sample, a last tile of one key)."""
    return [
        {"op": "attention", "batch": batch, "tq": tq, "tv": tv, "mode": mode, "kernels": ["attention"], "cost": 20000}
        for batch, tq, tv, mode in ((2, 3, 5, "lowest"), (1, 1, 1, "zeroed"), (3, 4, 2, "added"))
    ] + [
        {
            "op": "attention",
            "batch": batch,
            "tq": tq,
            "tv": tv,
            "mode": mode,
            "codename": "attention_tiled",
            "config": {"BQ": bq, "BK": bk},
            "kernels": ["attention_tiled"],
            "cost": 20000,
        }
        for batch, tq, tv, mode, bq, bk in (
            (2, 3, 5, "lowest", 2, 2),
            (1, 1, 1, "zeroed", 1, 1),
            (3, 5, 7, "added", 4, 3),
        )
    ]


def recurrent_cases() -> list[dict]:
    """Embedding and each recurrent cell on odd sizes (tests/oclgrind_driver.py run_recurrent); the
    masked ones after Embedding(mask_zero=True), a sample of masked steps only among them."""
    cells = (
        ("simple_rnn", {"go_backwards": True}),
        ("lstm", {"return_sequences": True}),
        ("gru", {}),
        ("gru", {"reset_after": False, "return_sequences": True}),
    )
    return [
        {
            "op": "recurrent",
            "cell": cell,
            "options": options,
            "masked": masked,
            "kernels": ["embedding_gather", "recurrent_masked" if masked else "recurrent"],
            "cost": 20000,
        }
        for (cell, options), masked in zip(cells + cells[1:2], (False,) * 4 + (True,))
    ] + [
        {
            "op": "recurrent",
            "cell": "lstm",
            "options": {"return_sequences": True},
            "masked": True,
            "bidirectional": True,
            "kernels": ["embedding_gather", "recurrent_masked"],
            "cost": 20000,
        },
        # a GPU's form: each unit's sums split over items holding their rows of U (KS > 1)
        {
            "op": "recurrent",
            "cell": "lstm",
            "options": {"return_sequences": True},
            "masked": True,
            "as_gpu": True,
            "kernels": ["embedding_gather", "recurrent_masked"],
            "cost": 20000,
        },
    ]


def conv_lstm_cases() -> list[dict]:
    """ConvLSTM2D (a sequence out, backwards) and ConvLSTM1D (its states out) on odd sizes
    (tests/oclgrind_driver.py run_conv_lstm, against tests/layers/conv_lstm_reference.py)."""
    return [{"op": "conv_lstm", "rank": rank, "kernels": ["conv_lstm_gates"], "cost": 20000} for rank in (2, 1)]


def all_cases() -> list[dict]:
    return (
        matmul_cases()
        + elementwise_cases()
        + model_cases()
        + layer_cases()
        + window_cases()
        + graph_cases()
        + attention_cases()
        + recurrent_cases()
        + conv_lstm_cases()
    )


# --------------------------------------------------------------------------------- running


def oclgrind_limits(cases) -> list[str]:
    """--max-wgsize and --local-mem-size large enough for every configuration checked."""
    work_group, local = 1024, 32768
    for case in cases:
        if case["op"] == "matmul" and case.get("config"):
            spec = LIB[case["codename"]].configure(case["config"])
            work_group = max(work_group, math.prod(spec.workgroup or (1,)))
            entry = spec.template[1] if spec.template else {}
            if entry.get("local_bytes"):
                from malinn.library.expressions import evaluate

                local = max(local, evaluate(entry["local_bytes"], {**spec.config, **case["config"]}))
    # the driver keeps every buffer alive (see oclgrind_driver.py), so give the device room for all
    return ["--max-wgsize", str(work_group), "--local-mem-size", str(local), "--global-mem-size", str(2**30)]


def split_stderr(text: str) -> dict:
    """Oclgrind's stderr cut at the driver's case markers: {case index or "preamble"/"end": text}."""
    parts = re.split(rf"^{MARK} (\d+|end)\n", text, flags=re.M)
    out = {"preamble": parts[0]}
    for i in range(1, len(parts) - 1, 2):
        key = int(parts[i]) if parts[i].isdigit() else parts[i]
        out[key] = parts[i + 1]
    return out


def unexplained(text: str) -> str:
    """Whatever Oclgrind (or anything else) wrote on stderr, minus pyopencl's NVIDIA probe."""
    return text.replace(PYOPENCL_PROBE, "").strip()


def run_batch(cases, folder: Path, index: int, timeout: float):
    """Starts one Oclgrind process on ``cases``; returns the Popen and its file paths."""
    path = folder / f"cases{index}.json"
    path.write_text(json.dumps([{k: v for k, v in c.items() if k not in ("kernels", "cost")} for c in cases]))
    out, err = folder / f"out{index}.txt", folder / f"err{index}.txt"
    env = oclgrind_env()
    command = [OCLGRIND, *OCLGRIND_FLAGS, *oclgrind_limits(cases), sys.executable, str(DRIVER), str(path)]
    with open(out, "w") as fo, open(err, "w") as fe:
        proc = subprocess.Popen(command, stdout=fo, stderr=fe, env=env)
    return proc, out, err, command


def balance(cases, parts: int) -> list[list[int]]:
    """Case indices split into ``parts`` batches of about equal estimated cost (largest first)."""
    batches = [[] for _ in range(parts)]
    loads = [0.0] * parts
    for i in sorted(range(len(cases)), key=lambda i: -cases[i]["cost"]):
        j = loads.index(min(loads))
        batches[j].append(i)
        loads[j] += cases[i]["cost"]
    return [sorted(b) for b in batches if b]


@pytest.fixture(scope="module")
def oclgrind_results():
    """Runs every case under Oclgrind once; returns (cases, {index: result}, {index: stderr},
    preambles, devices)."""
    cases = all_cases()
    folder = Path(tempfile.mkdtemp(prefix="malinn-oclgrind-"))
    batches = balance(cases, PROCESSES)
    # a whole run takes ~5 CPU-minutes per process; beside another pytest worker (xdist) on a 2-core CI machine, 3x that
    timeout = 1800 if MODE != "all" else 24 * 3600
    running = [(batch, *run_batch([cases[i] for i in batch], folder, n, timeout)) for n, batch in enumerate(batches)]
    results, stderr, preambles, devices, crashes = {}, {}, [], [], []
    for batch, proc, out, err, command in running:
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = "timeout"
        lines = out.read_text().splitlines()
        if lines:
            devices.append(json.loads(lines[0]))
        for line in lines[1:]:
            record = json.loads(line)
            results[batch[record["case"]]] = record
        parts = split_stderr(err.read_text())
        preambles.append(parts.pop("preamble", ""))
        parts.pop("end", None)
        for local, text in parts.items():
            stderr[batch[local]] = text
        if code != 0:
            crashes.append(f"{' '.join(command)} exited with {code}; stderr tail:\n{err.read_text()[-3000:]}")
    shutil.rmtree(folder, ignore_errors=True)
    return cases, results, stderr, preambles, devices, crashes


# ------------------------------------------------------------------------------------ tests


def test_the_driver_ran_on_oclgrind_and_exited_cleanly(oclgrind_results):
    cases, results, stderr, preambles, devices, crashes = oclgrind_results
    assert not crashes, "\n".join(crashes)
    assert devices and all(d["platform"] == "Oclgrind" for d in devices), devices
    for text in preambles:  # importing malinn and probing the device: nothing reported either
        assert unexplained(text) == "", text[-3000:]
    assert len(results) == len(cases)


def _failures(indices, cases, results, stderr):
    failures = []
    for i in indices:
        case = {k: v for k, v in cases[i].items() if k not in ("kernels", "cost")}
        result = results.get(i)
        report = unexplained(stderr.get(i, ""))
        if result is None:
            failures.append(f"{case}: no result (the process died in this case?)\n{report[-2000:]}")
        elif "exception" in result:
            failures.append(f"{case}: {result['exception'][-2000:]}")
        else:
            problems = []
            if report:
                problems.append(f"Oclgrind reported:\n{report[:4000]}")
            if result["error"] > TOLERANCE:
                problems.append(f"max error {result['error']:.3g} > {TOLERANCE}")
            if result["nan_mismatch"]:
                problems.append("NaN where numpy has none, or the reverse")
            if result.get("padding_nonzero"):
                problems.append(f"{result['padding_nonzero']} non-zero padding elements")
            if problems:
                failures.append(f"{case}: " + "; ".join(problems))
    return failures


@pytest.mark.parametrize("codename", list(LIB.kernels))
def test_kernel_is_clean_under_oclgrind(oclgrind_results, codename):
    """No out-of-bounds access, data race, uninitialised value or API error; numpy's answer."""
    cases, results, stderr, *_ = oclgrind_results
    indices = [i for i, c in enumerate(cases) if codename in c["kernels"]]
    assert indices, f"no Oclgrind case exercises kernel {codename!r}: add one in tests/test_oclgrind.py"
    failures = _failures(indices, cases, results, stderr)
    assert not failures, f"{len(failures)} of {len(indices)} cases failed:\n" + "\n".join(failures[:20])


def _configured(case):
    return _with(LIB[case["codename"]], case.get("config"))


def _ran(cases, results) -> set:
    """(program, shape) of every matmul case that ran without an epilogue (support.program_key)."""
    return {
        (program_key(_configured(c)), tuple(c["shape"]))
        for i, c in enumerate(cases)
        if c["op"] == "matmul" and not c.get("activation") and i in results
    }


@pytest.mark.parametrize("codename", MATMULS)
def test_matmul_ran_every_odd_shape_under_oclgrind(oclgrind_results, codename):
    """The entry as it is (its default configuration) on every odd shape, under its own name or
    another entry's that runs the same program."""
    cases, results, *_ = oclgrind_results
    spec = LIB[codename]
    assert {(program_key(spec), shape) for shape in odd_shapes(spec)} <= _ran(cases, results)


@pytest.mark.parametrize("codename", [c for c in MATMULS if tuning_configurations(LIB[c])])
def test_tuned_configurations_checked_under_oclgrind(oclgrind_results, codename):
    """Every configuration the tuner can emit, the default on every odd shape and the others on
    the largest, the deepest and the smallest padded problems (``configuration_shapes``); for a kernel
    with more than ALL_LIMIT of them (and without MALINN_OCLGRIND_CONFIGS=all), a set that covers
    every pair of define values a valid configuration can have, the default configuration first. A
    configuration whose program another entry runs counts where that entry ran it."""
    cases, results, *_ = oclgrind_results
    spec, ran = LIB[codename], _ran(cases, results)
    every = tuning_configurations(spec)  # (a softmax epilogue also runs in each, on shapes of its own)
    programs = {program for program, _ in ran}
    checked = [c for c in every if program_key(spec.configure(c)) in programs]
    assert every[0] in checked
    if MODE == "all" or len(every) <= ALL_LIMIT:
        assert checked == every
        for config in every:  # on its shapes
            configured = spec.configure(config)
            want = odd_shapes(spec) if config == every[0] else configuration_shapes(configured)
            assert {(program_key(configured), shape) for shape in want} <= ran, config
    else:
        needed = set().union(*(_pairs(_as_defines(c)) for c in every))
        covered = set().union(*(_pairs(_as_defines(c)) for c in checked))
        assert covered == needed, f"pairs of define values never checked: {sorted(needed - covered)[:10]}"


def test_models_and_a_split_batch_under_oclgrind(oclgrind_results):
    cases, results, stderr, *_ = oclgrind_results
    indices = [i for i, c in enumerate(cases) if c["op"] == "model"]
    assert not _failures(indices, cases, results, stderr)
    split = [results[i] for i in indices if cases[i].get("split_samples")]
    whole = [results[i] for i in indices if not cases[i].get("split_samples") and cases[i]["codename"] == SPLIT_KERNEL]
    assert split and whole and whole[0]["passes"] == 1
    assert split[0]["max_batch"] < 23 and split[0]["passes"] == math.ceil(23 / split[0]["max_batch"]) > 1


@pytest.mark.parametrize("codename", [c for c in MATMULS if "softmax" in LIB[c].epilogue])
def test_fused_softmax_checked_in_every_configuration(oclgrind_results, codename):
    """The softmax epilogue (local-memory reductions over whole columns) in each configuration the
    tuner or the runtime can pick, at one unit, at the most units a configuration holds and between."""
    cases, results, *_ = oclgrind_results
    ran = {}
    for i, c in enumerate(cases):
        if c["op"] == "matmul" and c["codename"] == codename and c.get("activation") == "softmax" and i in results:
            ran.setdefault(json.dumps(_as_defines(c["config"]), sort_keys=True), set()).add(c["shape"][0])
    every = {json.dumps(_as_defines(c), sort_keys=True): c for c in tuning_configurations(LIB[codename])}
    assert set(ran) == set(every)
    for key, config in every.items():
        assert {1, dict(LIB[codename].configure(config).preconditions)["max_m"]} <= ran[key]
