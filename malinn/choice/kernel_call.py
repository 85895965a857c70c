"""One kernel of the library bound to its arguments: what a plan step and an eager op launch.

:func:`bind` reads a kernel's restrictions (``kernels/library.json``): the scalar arguments named by
its ``arglist`` letters, the buffers in ``buffers`` order, the range from ``ndrange`` and ``scale``,
the preferred work-group shape. It builds the program for the matrices' layouts (once per device:
the device memoises it) and returns a launch with every argument set, so running it again costs
one enqueue.

Scalar letters: ``l`` padded rows of ``b`` (the padded common dimension K of a matmul; else of
``a``), ``h``/``w`` padded rows/columns of ``r``, ``m``/``n`` logical rows/columns of ``r``,
``H``/``W`` padded rows/columns of ``a``, ``M``/``N`` logical rows/columns of ``a``, ``K`` logical
rows of ``b``, ``c`` padded columns of ``b`` (a convolution's input, a Dot's second operand), ``p``
the next float parameter. After the buffers come the defines the OpenCL source takes as arguments
(the entry's ``argdefines``, a slice's offset: :meth:`~malinn.library.kernel_library.KernelSpec.define_arguments`),
so that one program serves layers that differ only in those.
"""

from __future__ import annotations

import math
from concurrent.futures import Future
from typing import Any, Callable

import numpy as np

from ..backends.base import BoundLaunch, Device
from ..errors import DeviceError, KernelBuildError
from ..library.expressions import evaluate
from ..library.kernel_library import DIVIDE, SCRATCH_NAME, KernelSpec, letter_values
from ..library.scalar_arguments import DIVIDE_MAX_ELEMENTS
from .matrix import DeviceMatrix

__all__ = ["bind", "scalar_values", "global_range", "local_range", "bounded_range"]


def scalar_values(matrices: dict) -> dict:
    """The value of each scalar letter for these matrix arguments."""
    r, a, b = matrices["r"], matrices.get("a"), matrices.get("b")
    return letter_values(
        r.shape,
        r.padded,
        a.shape if a is not None else None,
        a.padded if a is not None else None,
        b.shape if b is not None else None,
        b.padded if b is not None else None,
    )


def global_range(spec: KernelSpec, values: dict) -> tuple:
    """The global range: the ``ndrange`` letters' values divided by the kernel's ``scale`` and
    multiplied by its ``split`` (work items that share one block of results)."""
    axes = [0 if c in "hmHM" else 1 for c in spec.ndrange]
    return tuple(values[c] // spec.scale[i] * spec.split[i] for c, i in zip(spec.ndrange, axes))


def local_range(preferred: tuple | None, global_size: tuple, device: Device) -> tuple | None:
    """The kernel's preferred work-group shape where it divides the range and fits the device."""
    if not preferred:
        return None
    if math.prod(preferred) > device.max_work_group_size:
        return None
    for g, p, limit in zip(global_size, preferred, device.max_work_item_sizes):
        if p > limit or g % p:
            return None
    return tuple(preferred)


def bounded_range(bound: tuple | None, global_size: tuple, device: Device, items: int | None = None) -> tuple | None:
    """The work-group shape within ``bound`` (an entry's ``workgroup_bound`` for the device's class):
    along each axis the greatest common divisor of the range and the bound, so that the ranges of
    every layer fall into a few shapes (a bound of powers of two: at most log2(bound) + 1 sizes an
    axis), where a driver left to choose picks one per range. PoCL on a CPU compiles a kernel again
    for every shape it is launched with: left to choose, it compiled the element-wise kernels of a
    network once per layer. With ``items`` (an entry's ``workgroup_items``), the shape has at most
    that many items, the axes filled in order: on a GPU an element-wise kernel over 3 rows gets 1 x 256
    items and one over 32 rows 32 x 8 from one bound of 32 x 256 (NVIDIA's driver, left to choose,
    launched such ranges 2-50x slower); where that leaves fewer than a quarter of them (a range of
    odd columns: 32 x 1 items over 96 rows), the driver's shape instead. None where the entry gives
    no bound, the shape does not fit the device, or the driver chooses."""
    if not bound:
        return None
    shape, left = [], items
    for g, b in zip(global_size, bound):
        size = math.gcd(g, b) if left is None else math.gcd(g, b, left)
        shape.append(size)
        left = None if left is None else left // size
    if items is not None and 4 * math.prod(shape) < items:
        return None  # a range few powers of two divide (odd columns): the driver's shape ran faster
    return local_range(tuple(shape), global_size, device)


def program_for(spec: KernelSpec, device: Device, layouts: dict, wait: bool = True) -> Any:
    """The built program of ``spec`` for matrices in ``layouts`` (memoised by the device, per kernels
    folder: an entry of another library, ``MALINN_KERNELS``, with the same name is another program).

    The defines the source takes as arguments (:meth:`KernelSpec.define_arguments`: sizes and
    offsets) are not part of it: layers that differ only in those share one program. Without
    ``wait``, on a device that builds programs side by side (``compile_async``), the ``Future`` of
    the program: its build runs beside the next ones asked for.

    Raises:
        KernelBuildError: the program did not build (with ``wait``).
    """
    options = spec.build_options(device.backend)
    key = (
        spec.codename,
        str(spec.source_path),
        options,
        device.backend,
        tuple(sorted((name, str(layout)) for name, layout in layouts.items())),
        device.extra_build_options(),
    )
    programs = device.cache.setdefault("kernel_programs", {})
    program = programs.get(key)
    if program is None:
        source = spec.program_source(layouts, device.render_index, device.backend)
        origin = (
            spec.source
            if device.backend == "opencl"
            else next(
                (
                    str(path.relative_to(spec.source_path.parent))
                    for name, path, _ in spec.sources
                    if name == device.backend
                ),
                spec.source,
            )
        )
        compile_async = getattr(device, "compile_async", None)
        if compile_async is None:
            program = programs[key] = device.compile(source, options, origin=f"{origin} ({spec.codename})")
        else:
            program = programs[key] = compile_async(source, options, origin=f"{origin} ({spec.codename})")
            program.add_done_callback(lambda built: _forget_failed(programs, key, built))
    if wait and isinstance(program, Future):
        return program.result()
    return program


def _forget_failed(programs: dict, key: tuple, built: Future) -> None:
    """A program that did not build is not kept: asked for again, it is built again."""
    if built.exception() is not None and programs.get(key) is built:
        programs.pop(key, None)


def _explained(program: Future, explain: Callable[[KernelBuildError], BaseException]) -> Future:
    """``program``'s Future whose build error is ``explain(error)`` (the step and the shapes)."""
    explained: Future = Future()
    # the device's note of what the program is built from (OpenCL: its build workers launch it too)
    explained.build_request = getattr(program, "build_request", None)  # type: ignore[attr-defined]

    def settle(built: Future) -> None:
        error = built.exception()
        if error is None:
            explained.set_result(built.result())
        else:
            explained.set_exception(explain(error) if isinstance(error, KernelBuildError) else error)

    program.add_done_callback(settle)
    return explained


def _image(matrix: DeviceMatrix, device: Device) -> Any:
    """The matrix (laid out 'C') as an RGBA float image, made on the device once and kept."""
    if matrix.image is None:
        assert matrix.padded is not None  # an operand on the device
        matrix.image = device.image_from(
            matrix.buffer, matrix.padded[0] // 4, matrix.padded[1], what=f"{matrix.shape} operand as an image"
        )
    return matrix.image


def _placeholder(device: Device) -> Any:
    """A 4-byte buffer passed for a vector argument the kernel is built not to read."""
    with device.lock:
        if "placeholder" not in device.cache:
            device.cache["placeholder"] = device.alloc(4, "placeholder")
        return device.cache["placeholder"]


def scratch_size(spec: KernelSpec, values: dict) -> int:
    """Bytes of ``spec``'s scratch buffer (its ``scratch_bytes`` for these scalar values), whole
    words, at least one."""
    size = max(4, evaluate(spec.scratch_bytes, {**dict(spec.defines), **values}))
    return -(-size // 4) * 4


def _scratch(spec: KernelSpec, device: Device, values: dict) -> Any:
    """The zeroed scratch buffer of ``spec``'s ``scratch_bytes`` for these scalar values, one per
    device and size: launches on a device's in-order queue run one after another, and a kernel with
    scratch leaves it as it found it, so every launch of that size shares it."""
    size = scratch_size(spec, values)
    with device.lock:
        buffers = device.cache.setdefault("scratch", {})
        if size not in buffers:
            buffer = device.alloc(size, f"scratch of {spec.codename}")
            device.fill_zero(buffer, size, what=f"scratch of {spec.codename}")
            buffers[size] = buffer
        return buffers[size]


def bind(
    spec: KernelSpec,
    device: Device,
    matrices: dict,
    vectors: dict | None = None,
    params: dict | None = None,
    what: str = "",
) -> BoundLaunch | None:
    """Binds kernel ``spec`` on ``device`` to its arguments.

    Args:
        spec: the (configured) kernel.
        device: where it runs.
        matrices: argument name -> :class:`DeviceMatrix`, already in the declared layouts and
            paddings (``r`` is always there).
        vectors: argument name -> device buffer (``bias``, ``scale``, ``shift``).
        params: values of the kernel's float parameters (the ``p`` letters), by name.
        what: who asked (a layer name), for error messages.

    Returns:
        The :class:`~malinn.backends.base.BoundLaunch`, or ``None`` when the range is empty. On a
        device that builds programs side by side, a launch whose program is still building gets
        its kernel when the build ends (``wait_for_builds``: a plan waits for them once all its
        launches are bound; a run of one waits for it).

    Raises:
        KernelBuildError: the program did not build (where it is built before the launch is bound;
            else ``wait_for_builds``, or the first run, raises it).
        DeviceError: the arguments could not be set; the device's driver would end the kernel's
            loops early (:meth:`~malinn.library.kernel_library.KernelSpec.loops_fit`); the kernel runs only in
            a work-group shape the device cannot launch over this range.
        ValueError: ``params`` names a parameter the kernel does not take.
    """
    values = scalar_values(matrices)
    global_size = global_range(spec, values)
    if 0 in global_size:
        return None
    if not spec.loops_fit(device, values):  # the driver would end its loops early: a wrong answer, silently
        raise DeviceError(
            f"{what or spec.codename}: kernel {spec.codename} would run "
            f"{spec.loop_iterations(device.backend, values):,} loop iterations in one shader "
            f"invocation on {device.name}, whose driver ends them after "
            f"{device.max_loop_iterations:,} (silently: llvmpipe's limit); run the model on an "
            f"OpenCL device (PoCL on a CPU) or a GPU"
        )
    if (
        any(name.startswith(DIVIDE) for name in spec.define_arguments(device.backend))
        and values["h"] * values["w"] > DIVIDE_MAX_ELEMENTS
    ):  # the magic division is of 32-bit numbers
        raise DeviceError(
            f"{what or spec.codename}: kernel {spec.codename} divides by its sizes in 32 bits, and its "
            f"result of {values['h']} x {values['w']} elements has 2^32 or more on {device.name}; "
            f"split the layer's input into smaller batches"
        )
    local_size = local_range(spec.workgroup, global_size, device)
    if local_size is None and spec.requires_workgroup:
        # an OpenCL driver would refuse the launch; a compute shader built in another shape computes wrong values
        raise DeviceError(
            f"{what or spec.codename}: kernel {spec.codename} runs only in work-groups of "
            f"{' x '.join(map(str, spec.workgroup or ()))} items over its range {global_size}; {device.name} "
            f"launches at most {device.max_work_group_size} items a group "
            f"({' x '.join(map(str, device.max_work_item_sizes))} per axis): choose another "
            f"configuration of it (docs/KERNELS.md) or another kernel (malinn.use)"
        )
    if local_size is None:  # decided here, once per launch bound (a plan binds its launches once)
        local_size = bounded_range(spec.workgroup_bound(device), global_size, device, spec.workgroup_item_limit(device))

    def built_for(exc: KernelBuildError) -> KernelBuildError:  # whose step it was, the shapes it was built for
        shapes = ", ".join(f"{name} {m.shape} padded to {m.padded} in {m.layout}" for name, m in matrices.items())
        return KernelBuildError(f"{what or spec.codename} ({shapes}): {exc}")

    try:  # built beside the programs of the launches bound after this one, where the device can
        program = program_for(spec, device, {name: m.layout for name, m in matrices.items()}, wait=False)
    except KernelBuildError as exc:
        raise built_for(exc) from None
    if isinstance(program, Future):
        program = _explained(program, built_for)
    floats = iter(spec.param_values(params))
    args = [np.float32(next(floats)) if c == "p" else np.uint32(values[c]) for c in spec.arglist]
    for name in spec.buffers:
        if name in matrices and spec.matrices[name].image:
            args.append(_image(matrices[name], device))
        elif name in matrices:
            args.append(matrices[name].buffer)
        elif name == SCRATCH_NAME:
            args.append(_scratch(spec, device, values))
        else:  # a vector the kernel declares but this call does not use (no bias): never read
            args.append((vectors or {}).get(name) or _placeholder(device))
    args += [np.uint32(v) for v in spec.define_argument_values(device.backend)]
    try:  # a backend may build its program here, in the launch's shape (a compute shader)
        return device.bind(
            program, spec.function, args, global_size, local_size, what=what or spec.codename, name=spec.codename
        )
    except KernelBuildError as exc:
        raise built_for(exc) from None
