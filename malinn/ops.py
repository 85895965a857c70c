"""Operations and their performers (Rovder 5.2): matmul, bias addition, activation, re-layout.

Each op asks the kernel library for the codename chosen for the current device, reads the
kernel's restrictions, brings every operand into the layout and padding the kernel declares
(re-laying out on the device only when needed), launches, and returns the result in the
kernel's declared result layout. Which codename an op uses is one setting per device
(:func:`use`), defaulting to ``kernels/library.json``'s ``defaults`` for the device's kind.
"""

from __future__ import annotations

import dataclasses
import math
import threading

import numpy as np

from .device import Device, _cl, cl_status_name, get_device
from .errors import DeviceError, LibraryError
from .kernel_library import EPILOGUE_DEFINES, KernelSpec, load_library
from .matrix import DeviceMatrix, _count, allocate

__all__ = ["use", "kernel_for", "matmul", "matmul_plan", "bias_add", "affine", "activation", "relayout",
           "upload_vector", "launch"]

_settings_lock = threading.Lock()
_settings: dict = {}   # device key -> {op: codename}


def use(op: str, codename: str, device: Device | None = None, config: dict | None = None) -> None:
    """Chooses the kernel that ``op`` runs on ``device`` from now on.

    Args:
        op: ``"matmul"``, ``"bias"``, ``"affine"`` or ``"relayout"``.
        codename: a codename of the kernel library that implements ``op``.
        device: the device (default: the current one).
        config: defines for a configurable kernel (e.g. ``{"MWG": 128}``); default: the entry's.

    Raises:
        LibraryError: ``codename`` is unknown, implements another op, or ``config`` does not fit it.
    """
    spec = load_library()[codename]
    if spec.op != op:
        raise LibraryError(f"kernel {codename!r} implements {spec.op!r}, not {op!r}")
    spec.configure(config)
    device = device or get_device()
    with _settings_lock:
        _settings.setdefault(device.key, {})[op] = (codename, dict(config or {}))


def kernel_for(op: str, device: Device | None = None, shape: tuple | None = None,
               activation: str | None = None) -> KernelSpec:
    """The kernel ``op`` uses on ``device``.

    The choice is the one set with :func:`use`, else the tuner's winner for this device (see
    ``malinn tune``), else the library default for the device's kind. For a matmul of ``shape``
    ``(m, k, n)`` whose preconditions the choice does not meet (a small batch, say), the first of
    the library's ``matmul_fallback`` kernels for the device's kind whose preconditions hold is
    used instead (the last one listed, if none). A matmul followed by ``activation="softmax"``
    that the choice cannot fuse, unless :func:`use` set the choice, takes the library's
    ``matmul_softmax`` kernel where it reads and writes the same layouts and holds the shape's
    columns (in the first of its configurations that does).
    """
    device = device or get_device()
    library = load_library()
    with _settings_lock:
        chosen = _settings.get(device.key, {}).get(op)
    used = chosen is not None
    if chosen is None and op == "matmul":
        from .tuner import tuned_choice

        chosen = tuned_choice(device)
    spec = library[chosen[0]].configure(chosen[1]) if chosen else library.default_spec(op, device.kind)
    if shape is not None and op == "matmul" and not spec.accepts(*shape, device=device):
        fallbacks = library.default_specs("matmul_fallback", device.kind)
        spec = next((f for f in fallbacks if f.accepts(*shape, device=device)), fallbacks[-1])
    if activation == "softmax" and shape is not None and op == "matmul" and not used \
            and _holding_columns(spec, shape, device) is None:
        for candidate in library.default_specs("matmul_softmax", device.kind):
            same_layouts = all(candidate.matrices[x].layout == spec.matrices[x].layout for x in "br")
            holding = _holding_columns(candidate, shape, device) if same_layouts else None
            if holding is not None:
                return holding
    return spec


def _holding_columns(spec: KernelSpec, shape: tuple, device: Device | None = None) -> KernelSpec | None:
    """``spec`` in the first of its configurations that can fuse a softmax for a product of
    ``shape`` (its preconditions hold: a work-group holds whole columns), or ``None``."""
    if "softmax" not in spec.epilogue:
        return None
    if spec.accepts(*shape, device=device):
        return spec
    for config in spec.configurations(device):
        configured = spec.configure(config)
        if configured.accepts(*shape, device=device):
            return configured
    return None


def _round_up(value: int, multiple: int) -> int:
    return max(1, -(-value // multiple)) * multiple


def matmul_plan(spec: KernelSpec, m: int, k: int, n: int) -> dict:
    """Padded shapes of ``a`` (m x k), ``b`` (k x n) and ``r`` (m x n) for kernel ``spec``.

    ``a`` has as many rows as ``r`` (kernels index A with its own padded shape, and A may have
    more), or only its own alignment's where the kernel reads A's logical rows only
    (``logicalRows``)."""
    a, b, r = spec.matrices["a"], spec.matrices["b"], spec.matrices["r"]
    mp = _round_up(m, math.lcm(a.row_multiple, r.row_multiple, spec.scale[0]))
    kp = _round_up(k, math.lcm(a.col_multiple, b.row_multiple))
    np_ = _round_up(n, math.lcm(b.col_multiple, r.col_multiple, spec.scale[1]))
    return {"a": (_round_up(m, a.row_multiple) if a.logical_rows else mp, kp), "b": (kp, np_), "r": (mp, np_)}


def launch(spec: KernelSpec, device: Device, matrices: dict, vectors: dict | None = None,
           common: int = 0, what: str = "", params: dict | None = None):
    """Builds (memoised) and enqueues kernel ``spec`` on ``device``.

    Args:
        spec: the kernel.
        device: where to run it.
        matrices: argument name -> :class:`DeviceMatrix`, already in the declared layouts.
        vectors: argument name -> device buffer (e.g. ``bias``).
        common: the padded common dimension ``l`` of a matmul (``b``'s padded rows).
        what: who asked (a layer name), for error messages.
        params: values of the kernel's float parameters (the ``p`` letters), by name.

    Returns:
        The ``pyopencl.Event`` of the launch (``None`` when the range is empty).

    Raises:
        KernelBuildError: the program did not build.
        DeviceError: the launch failed; the message names the kernel, the sizes and the status.
    """
    cl = _cl()
    r = matrices["r"]
    a = matrices.get("a")
    values = {"l": common, "h": r.padded[0], "w": r.padded[1], "m": r.shape[0], "n": r.shape[1],
              "H": a.padded[0] if a is not None else 0, "W": a.padded[1] if a is not None else 0}
    axes = [0 if c in "hmH" else 1 for c in spec.ndrange]
    global_size = tuple(values[c] // spec.scale[i] * spec.split[i] for c, i in zip(spec.ndrange, axes))
    if 0 in global_size:
        return None
    local_size = _local_size(spec.workgroup, global_size, device)
    program = _program(spec, device, matrices)
    floats = iter(spec.param_values(params))
    args = [np.float32(next(floats)) if c == "p" else np.uint32(values[c]) for c in spec.arglist]
    for name in spec.buffers:
        if name in matrices and spec.matrices[name].image:
            args.append(_as_image(matrices[name], device))
        elif name in matrices:
            args.append(matrices[name].buffer)
        else:  # a vector the kernel declares but this call does not use (no bias): never read
            args.append((vectors or {}).get(name) or _placeholder(device))
    with device._lock:  # a cl.Kernel's arguments are per object: set and enqueue together
        try:
            kernel = _kernel(program, spec.function)
            kernel.set_args(*args)
            event = cl.enqueue_nd_range_kernel(device.queue, kernel, global_size, local_size)
        except cl.Error as exc:
            shapes = ", ".join(f"{k}={m.shape} as {m.layout} padded {m.padded}" for k, m in matrices.items())
            raise DeviceError(f"{what + ': ' if what else ''}kernel {spec.codename} failed on {device.name} "
                              f"({cl_status_name(exc)}); global {global_size}, local {local_size}; {shapes}") from exc
        device.counters["launches"] += 1
    r.invalidate_host()
    return event


_placeholders: dict = {}


def _as_image(matrix: DeviceMatrix, device: Device):
    """The matrix (laid out 'C') as an RGBA float image2d, copied on the device once and kept."""
    cl = _cl()
    image = getattr(matrix, "image", None)
    if image is None:
        width, height = matrix.padded[0] // 4, matrix.padded[1]
        if not device.image_support or width > device.image2d_max_size[0] or height > device.image2d_max_size[1]:
            raise DeviceError(f"{device.name} cannot hold a {width}x{height} image "
                              f"(image support {device.image_support}, limit {device.image2d_max_size})")
        try:
            image = cl.create_image(device.context, cl.mem_flags.READ_ONLY,
                                    cl.ImageFormat(cl.channel_order.RGBA, cl.channel_type.FLOAT), shape=(width, height))
            cl.enqueue_copy(device.queue, image, matrix.buffer, offset=0, origin=(0, 0), region=(width, height))
        except cl.Error as exc:
            raise DeviceError(f"making a {width}x{height} image on {device.name} failed ({cl_status_name(exc)})") from exc
        matrix.image = image
    return image
_built: dict = {}     # (device, kernel, defines, layouts) -> program, skipping source assembly and hashing


def _program(spec: KernelSpec, device: Device, matrices: dict):
    layouts = tuple((name, str(m.layout)) for name, m in matrices.items())
    key = (device.key, spec.codename, spec.defines, layouts)
    program = _built.get(key)
    if program is None:
        source = spec.program_source({name: m.layout for name, m in matrices.items()})
        program = _built[key] = device.build(source, spec.options(), origin=f"{spec.source} ({spec.codename})")
    return program

_kernels: dict = {}   # (program id, function) -> cl.Kernel, reused (pyopencl prepares each new one)


def _kernel(program, function: str):
    """The cached ``cl.Kernel`` of ``function`` in ``program`` (callers hold the device lock)."""
    key = (id(program), function)
    entry = _kernels.get(key)
    if entry is None or entry[0] is not program:
        entry = _kernels[key] = (program, _cl().Kernel(program, function))
    return entry[1]



def _placeholder(device: Device):
    """A 4-byte buffer passed for a vector argument the kernel is built not to read."""
    with device._lock:
        if device.key not in _placeholders:
            _placeholders[device.key] = allocate(device, 4, "placeholder")
        return _placeholders[device.key]


def _local_size(preferred, global_size, device: Device):
    if not preferred:
        return None
    if math.prod(preferred) > device.max_work_group_size:
        return None
    for g, p, limit in zip(global_size, preferred, device.max_work_item_sizes):
        if p > limit or g % p:
            return None
    return tuple(preferred)


def matmul(a: DeviceMatrix, b: DeviceMatrix, spec: KernelSpec | None = None, device: Device | None = None,
           what: str = "matmul", bias=None, activation: str = "linear", params: dict | None = None,
           affine: tuple | None = None) -> DeviceMatrix:
    """``R = affine(activation(A x B + bias))`` on the device, in one launch when the kernel can fuse.

    Args:
        a: the left operand (m x k), e.g. a Dense layer's ``W = kernel^T``. Already on the device
            in the kernel's layout it is used as it is, also when padded more than the kernel
            needs (one weight buffer serves several kernels); otherwise it is re-laid out.
        b: the right operand (k x n), e.g. the layer's input ``x^T``.
        spec: the kernel (default: the device's choice for this shape); operands that are not in
            its layouts are re-laid out first.
        device: where to run (default: ``b``'s device, else the current one).
        what: who asked, for error messages.
        bias: a device vector of ``m`` values added to every column, or ``None``.
        activation: applied after the bias. Fused into the kernel's final write when its epilogue
            can (element-wise activations; ``softmax`` where a work-group holds whole columns, in
            the first configuration of the kernel that does), else run as its own kernels.
        params: the activation's parameters.
        affine: ``(scale, shift)``, device vectors of ``m`` values: ``R = R * scale + shift`` per
            row after the activation (a BatchNormalization after an activated Dense), or ``None``.

    Returns:
        ``R`` (m x n) in the kernel's result layout, on the device.

    Raises:
        ValueError: the inner dimensions differ.
    """
    device = device or b.device or get_device()
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"{what}: cannot multiply {a.shape} by {b.shape}: inner dimensions {k} and {k2} differ")
    spec = spec or kernel_for("matmul", device, (m, k, n), activation=activation)
    spec, fused = _with_epilogue(spec, (m, k, n), device, bias is not None, activation, affine is not None)
    if "activation" in fused:   # the p arguments take the activation's names and defaults
        act = load_library().activation_kernel(activation)
        if act.params:
            spec = dataclasses.replace(spec, params=act.params)
    plan = matmul_plan(spec, m, k, n)
    a = _left_operand(a, device, spec.matrices["a"], plan["a"])
    b = b.in_layout(device, spec.matrices["b"].layout, plan["b"])
    r = DeviceMatrix.empty(device, (m, n), spec.matrices["r"].layout, plan["r"], what=f"{what} result")
    vectors = {}
    if "bias" in fused:
        vectors["bias"] = bias
    if "affine" in fused:
        vectors["scale"], vectors["shift"] = affine
    launch(spec, device, {"a": a, "b": b, "r": r}, vectors, common=b.padded[0], what=what,
           params=params if "activation" in fused else None)
    if bias is not None and "bias" not in fused:
        bias_add(r, bias, what=what)
    if not {"activation", "softmax"} & set(fused):
        activation_op(r, activation, what=what, **(params or {}))
    if affine is not None and "affine" not in fused:
        affine_op(r, *affine, what=what)
    return r


def _left_operand(a: DeviceMatrix, device: Device, restriction, need) -> DeviceMatrix:
    """``a`` as the kernel reads it: as it is when it lies on ``device`` in the kernel's layout,
    padded at least to ``need`` with the kernel's alignments (kernels index A with its own padded
    shape), else re-laid out (or uploaded) to exactly ``need``."""
    layout = restriction.layout
    if (a.buffer is not None and a.device is device and a.layout == layout
            and a.padded[0] >= need[0] and a.padded[1] >= need[1]
            and a.padded[0] % restriction.row_multiple == 0 and a.padded[1] % restriction.col_multiple == 0):
        return a
    return a.in_layout(device, layout, need)


def _with_epilogue(spec: KernelSpec, shape: tuple, device: Device, bias: bool, activation: str | None,
                   affine: bool) -> tuple[KernelSpec, tuple]:
    """``spec`` configured to fuse the longest prefix of bias, activation, affine (in that order)
    that its epilogue can, and the names of the fused steps (``softmax`` for a fused softmax)."""
    steps = (["bias"] if bias else []) + ([] if activation in (None, "linear") else
                                         ["softmax" if activation == "softmax" else "activation"]) \
        + (["affine"] if affine else [])
    fused, defines = [], {}
    for step in steps:
        if step == "softmax":
            holding = _holding_columns(spec, shape, device)
            if holding is None:
                break
            spec = holding
        elif step not in spec.epilogue or (step == "activation" and _elementwise(activation) is None):
            break
        fused.append(step)
        defines[EPILOGUE_DEFINES[step]] = (dict(_elementwise(activation).defines)["ACTIVATION"]
                                           if step == "activation" else 1)
    return (spec.configure(defines) if defines else spec), tuple(fused)


def _elementwise(activation: str):
    """The element-wise activation kernel of ``activation`` (whose formula an epilogue can apply),
    or ``None`` (softmax needs a whole column; an unknown name has no kernel)."""
    act = load_library().activation_kernel(activation)
    return act if act is not None and act.source == "activation.cl" else None


def fusable(spec: KernelSpec, activation: str, shape: tuple | None = None) -> bool:
    """Whether ``spec`` can add the bias and apply ``activation`` in its final write (for
    ``softmax``: for a product of ``shape``, in one of its configurations)."""
    if "bias" not in spec.epilogue:
        return False
    if activation in (None, "linear"):
        return True
    if activation == "softmax":
        return shape is not None and _holding_columns(spec, shape) is not None
    return "activation" in spec.epilogue and _elementwise(activation) is not None


def upload_vector(device: Device, values, what: str = "vector"):
    """Copies a 1-D float32 vector to a new device buffer."""
    cl = _cl()
    values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    buffer = allocate(device, values.nbytes, what)
    try:
        cl.enqueue_copy(device.queue, buffer, values, is_blocking=True)
    except cl.Error as exc:   # e.g. a driver that allocates on first use runs out of memory here
        raise DeviceError(f"uploading {what} ({values.size} values) to {device.name} failed "
                          f"({cl_status_name(exc)})") from exc
    _count(device, "uploads")
    return buffer


def bias_add(r: DeviceMatrix, bias_buffer, spec: KernelSpec | None = None, what: str = "bias") -> DeviceMatrix:
    """Adds a bias (one value per row of ``r``, already on the device) to ``r`` in place."""
    spec = spec or kernel_for("bias", r.device)
    launch(spec, r.device, {"r": r}, {"bias": bias_buffer}, what=what)
    return r


def affine(r: DeviceMatrix, scale_buffer, shift_buffer, spec: KernelSpec | None = None,
           what: str = "affine") -> DeviceMatrix:
    """``r = r * scale + shift`` per row (feature) of ``r``, in place; the vectors are on the device."""
    spec = spec or kernel_for("affine", r.device)
    launch(spec, r.device, {"r": r}, {"scale": scale_buffer, "shift": shift_buffer}, what=what)
    return r


def activation(r: DeviceMatrix, name: str, what: str = "activation", **params) -> DeviceMatrix:
    """Applies activation ``name`` to ``r`` in place (``linear`` launches nothing).

    Args:
        r: the matrix (features x batch), on a device.
        name: an activation the kernel library computes (e.g. ``"relu"``, ``"elu"``).
        what: who asked, for error messages.
        **params: the activation's parameters (e.g. ``alpha=1.0`` for ``elu``).

    Raises:
        ValueError: the kernel library has no kernel for ``name``.
    """
    if name in (None, "linear"):
        return r
    spec = load_library().activation_kernel(name)
    if spec is None:
        raise ValueError(f"{what}: no kernel computes activation {name!r}; "
                         f"available: {', '.join(['linear'] + load_library().activations())}")
    launch(spec, r.device, {"r": r}, what=what, params=params)
    return r


activation_op = activation
affine_op = affine


def relayout(m: DeviceMatrix, layout, padded, spec: KernelSpec | None = None) -> DeviceMatrix:
    """A copy of device matrix ``m`` in another layout and padding, made on the device."""
    spec = spec or kernel_for("relayout", m.device)
    r = DeviceMatrix.empty(m.device, m.shape, layout, padded, what="relayout")
    launch(spec, m.device, {"a": m, "r": r}, what=f"relayout to {r.layout}")
    return r
