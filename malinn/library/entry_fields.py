"""The fields of a kernel library entry that no define changes: its op, files, buffers, matrix
layouts, scalar arguments, epilogue and precisions, checked once per entry (docs/KERNELS.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

from ..errors import LayoutError, LibraryError
from .kernel_sources import defines_kernel, is_file
from .layout import parse_layout
from .matrix_restriction import MATRIX_NAMES, SCRATCH_NAME, VECTOR_NAMES
from .precision_table import DEFAULT_PRECISION, WEIGHT_OPS
from .scalar_arguments import SCALAR_LETTERS

__all__ = [
    "OPS",
    "EPILOGUE_OPS",
    "EPILOGUE_DEFINES",
    "VIEW_DEFINES",
    "VIEW_ARGUMENTS",
    "PRECONDITIONS",
    "MATMUL_CHOICES",
    "DEFINE_NAME",
    "DEFINE_VALUE",
    "FixedFields",
    "fixed_fields",
]

OPS = (
    "matmul",
    "matmul_head",
    "bias",
    "affine",
    "activation",
    "relayout",
    "reshape",
    "broadcast",
    "normalize",
    "permute",
    "repeat",
    "conv",
    "depthwise",
    "conv_transpose",
    "conv3d",
    "conv3d_transpose",
    "pool3d",
    "spatial3d",
    "resize",
    "pool",
    "spatial",
    "im2col",
    "merge",
    "concat",
    "dot",
    "gather",
    "encoding",
    "lookup",
    "masking",
    "recurrent",
    "recurrent_masked",
    "conv_lstm_gates",
    "attention",
    "normalize_column",
)
#: ops whose kernels read a weight matrix ``a`` and may fuse the epilogue (epilogue.clh)
EPILOGUE_OPS = ("matmul", "matmul_head", "conv", "depthwise", "conv_transpose", "conv3d", "conv3d_transpose")
#: what a matmul kernel can fuse into its final write -> the define that switches it on
EPILOGUE_DEFINES = {
    "bias": "BIAS",
    "activation": "ACTIVATION",
    "affine": "AFFINE",
    "softmax": "SOFTMAX",
    "view": "R_VIEW",
}
#: the defines besides R_VIEW that place a ``view`` kernel's R in a larger buffer (epilogue.clh)
VIEW_DEFINES = ("R_OFFSET", "R_LD", "R_ROWS", "R_SPARE")
#: those of them a ``view`` kernel's OpenCL source takes as its last arguments (epilogue.clh
#: ``R_VIEW_ARGS``): the slice's place, which differs for every input of a concatenation
VIEW_ARGUMENTS = ("R_OFFSET", "R_SPARE")
PRECONDITIONS = ("min_m", "max_m", "min_k", "max_k", "min_n", "max_n")
#: the ``defaults`` tables that name matmul kernels: the choice, the fallbacks where its
#: preconditions fail (a list: the first whose preconditions hold), the kernel that fuses softmax
MATMUL_CHOICES = ("matmul", "matmul_fallback", "matmul_softmax")
DEFINE_NAME = re.compile(r"[A-Za-z_]\w*")
DEFINE_VALUE = re.compile(r"[\w.+-]+")


class FixedFields(NamedTuple):
    """The fields of a kernel entry that no define changes (checked once per entry)."""

    op: str
    source_path: Path
    includes: tuple
    sources: tuple
    loop_bounds: tuple
    matrices: tuple  # (name, representation, image, logicalRows): the alignments are expressions
    buffers: tuple
    arglist: str
    ndrange: str
    flop: float
    params: tuple
    aliases: tuple
    epilogue: tuple
    constraints: tuple
    precisions: tuple


_fixed: dict = {}  # entry id -> (the entry, FixedFields), kept beside it and compared, so a new entry that reuses a freed one's id never gets its fields


def fixed_fields(path: Path, codename: str, entry: dict, table: dict) -> FixedFields:
    """Checks the fields of ``entry`` that do not depend on its defines, once per entry (every
    configuration of the entry shares them: its files, op, buffers, layouts, epilogue and
    precisions), and returns them."""
    found = _fixed.get(id(entry))
    if found is not None and found[0] is entry:
        return found[1]

    def fail(field, why):
        raise LibraryError(f"{path}: kernel {codename!r}, field {field!r}: {why}")

    for key in ("op", "source", "function", "restrictions"):
        if key not in entry:
            fail(key, "missing")
    op = entry["op"]
    if op not in OPS:
        fail("op", f"expected one of {', '.join(OPS)}, got {op!r}")
    source_path = path.parent / str(entry["source"])
    if not is_file(source_path):
        fail("source", f"no file {source_path}")
    function = entry["function"]
    if not isinstance(function, str) or not defines_kernel(source_path, function):
        fail("function", f"no kernel function {function!r} in {entry['source']}")
    includes = entry.get("includes", [])
    if not isinstance(includes, list) or not all(is_file(path.parent / str(i)) for i in includes):
        fail("includes", "expected a list of files in the kernels folder")
    sources, loop_bounds = [], []
    raw_sources = entry.get("sources", {})
    if not isinstance(raw_sources, dict):
        fail("sources", 'expected an object of backend: file or {"source": file, "includes": [files]}')
    for backend, value in raw_sources.items():
        value = {"source": value} if isinstance(value, str) else value
        if backend == "opencl" or not isinstance(value, dict) or not isinstance(value.get("source"), str):
            fail(
                f"sources.{backend}",
                'expected a file or {"source": file, "includes": [files]} (OpenCL\'s source is the entry\'s "source")',
            )
        other = path.parent / value["source"]
        if not is_file(other):
            fail(f"sources.{backend}.source", f"no file {other}")
        other_includes = value.get("includes", [])
        if not isinstance(other_includes, list) or not all(is_file(path.parent / str(i)) for i in other_includes):
            fail(f"sources.{backend}.includes", "expected a list of files in the kernels folder")
        sources.append((str(backend), other, tuple(path.parent / str(i) for i in other_includes)))
        if "loop_iterations" in value:
            loop_bounds.append((str(backend), value["loop_iterations"]))
    rs = entry["restrictions"]
    if not isinstance(rs, dict):
        fail("restrictions", "expected an object")
    buffers = rs.get("buffers")
    if not isinstance(buffers, list) or not buffers:
        fail("restrictions.buffers", "expected a non-empty list of argument names")
    matrices = []
    for name in buffers:
        if name in VECTOR_NAMES or name == SCRATCH_NAME:
            continue
        if name not in MATRIX_NAMES:
            fail(
                "restrictions.buffers",
                f"unknown buffer {name!r}; expected {MATRIX_NAMES + VECTOR_NAMES + (SCRATCH_NAME,)}",
            )
        m = rs.get(name)
        if not isinstance(m, dict):
            fail(f"restrictions.{name}", "missing: every matrix buffer needs a restriction object")
        rep = m.get("representation")
        if rep != "*":
            try:
                parse_layout(rep)
            except LayoutError as exc:
                fail(f"restrictions.{name}.representation", str(exc))
        image = m.get("image", False)
        if not isinstance(image, bool) or (image and rep != "C"):
            fail(f"restrictions.{name}.image", "expected true or false; an image operand is laid out 'C'")
        logical_rows = m.get("logicalRows", False)
        if not isinstance(logical_rows, bool) or (logical_rows and name != "a"):
            fail(f"restrictions.{name}.logicalRows", "expected true or false, and only for 'a'")
        matrices.append((name, rep, image, logical_rows))
    if "r" not in [name for name, *_ in matrices]:
        fail("restrictions.r", "every kernel writes a result matrix 'r'")
    arglist = rs.get("arglist", "")
    if not isinstance(arglist, str) or any(c not in SCALAR_LETTERS for c in arglist):
        fail("restrictions.arglist", f"expected letters from {''.join(SCALAR_LETTERS)}, got {arglist!r}")
    ndrange = rs.get("ndrange")
    if not isinstance(ndrange, str) or not 1 <= len(ndrange) <= 2 or any(c not in SCALAR_LETTERS for c in ndrange):
        fail("restrictions.ndrange", f"expected 1 or 2 letters from {''.join(SCALAR_LETTERS)}, got {ndrange!r}")
    if not isinstance(rs.get("scale", {}), dict):
        fail("restrictions.scale", "expected an object with rows and cols")
    flop = rs.get("flop", 0)
    if not isinstance(flop, (int, float)) or flop < 0:
        fail("restrictions.flop", f"expected a number >= 0, got {flop!r}")
    if op == "activation" and not isinstance(entry.get("activation"), str):
        fail("activation", "an activation kernel names the activation it computes")
    aliases = entry.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        fail("aliases", "expected a list of activation names")
    params = rs.get("params", {})
    if not isinstance(params, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in params.values()
    ):
        fail("restrictions.params", "expected an object of name: default number")
    if len(params) > arglist.count("p"):
        fail("restrictions.params", f"{len(params)} parameters but only {arglist.count('p')} 'p' letters in arglist")
    constraints = entry.get("constraints", [])
    if not isinstance(constraints, list):
        fail("constraints", "expected a list of expressions")
    preconditions = entry.get("preconditions", {})
    if not isinstance(preconditions, dict) or not all(k in PRECONDITIONS for k in preconditions):
        fail("preconditions", f"expected an object with some of {', '.join(PRECONDITIONS)}")
    split = rs.get("split", {"rows": 1, "cols": 1})
    if not isinstance(split, dict) or not set(split) <= {"rows", "cols"}:
        fail("restrictions.split", "expected an object with rows and cols")
    epilogue = entry.get("epilogue", [])
    if (
        not isinstance(epilogue, list)
        or not set(epilogue) <= set(EPILOGUE_DEFINES)
        or len(set(epilogue)) < len(epilogue)
    ):
        fail("epilogue", f"expected a list of some of {', '.join(EPILOGUE_DEFINES)}, got {epilogue!r}")
    if epilogue:
        needs = {"bias": ["bias"], "affine": ["scale", "shift"]}
        missing = [v for f in epilogue for v in needs.get(f, []) if v not in buffers]
        if op not in EPILOGUE_OPS or missing or "m" not in arglist or "n" not in arglist:
            fail(
                "epilogue",
                f"a fused epilogue needs a matmul or convolution with 'm' and 'n' in its arglist "
                f"(R's padding is written as 0) and the buffers it reads; missing {missing}",
            )
        if "activation" in epilogue and arglist.count("p") < 4:
            fail("epilogue", "a fused activation needs 4 'p' parameters in the arglist (p0..p3)")
        if "softmax" in epilogue and "max_m" not in preconditions:
            fail(
                "epilogue",
                "a softmax epilogue holds whole columns in one work-group: give the largest m as preconditions.max_m",
            )
    if (entry.get("scratch_bytes") is None) != (SCRATCH_NAME not in buffers):
        fail("scratch_bytes", f"a kernel with a {SCRATCH_NAME!r} buffer gives its size (and only such a kernel)")
    supported = entry.get("precisions", [DEFAULT_PRECISION])
    if not isinstance(supported, list) or DEFAULT_PRECISION not in supported or not set(supported) <= set(table):
        fail("precisions", f"expected a list of some of {', '.join(table)}, with {DEFAULT_PRECISION!r}")
    if op not in WEIGHT_OPS and supported != [DEFAULT_PRECISION]:
        fail(
            "precisions", f"only the kernels that read weights ({', '.join(WEIGHT_OPS)}) read them in another precision"
        )
    fields = FixedFields(
        op,
        source_path,
        tuple(path.parent / str(i) for i in includes),
        tuple(sources),
        tuple(loop_bounds),
        tuple(matrices),
        tuple(buffers),
        arglist,
        ndrange,
        float(flop),
        tuple((str(k), float(v)) for k, v in params.items()),
        tuple(aliases),
        tuple(epilogue),
        tuple(constraints),
        tuple(supported),
    )
    _fixed[id(entry)] = (entry, fields)
    return fields
