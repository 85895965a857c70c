"""The compiled plan: what :class:`~malinn.plan.builder.PlanBuilder` decided, allocated once
(weights, an activation arena, staging arrays, every kernel bound to its arguments); ``run`` only
uploads, launches and downloads.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..backends.base import Device
from ..choice.kernel_call import bind, scratch_size
from ..choice.kernel_choice import choose
from ..choice.matrix import DeviceMatrix
from ..library.kernel_library import DEFAULT_PRECISION, KernelSpec, MatrixRestriction, load_library
from ..library.layout import round_up
from ..ops import with_epilogue
from .progress import BuildProgress
from .tensor import format_shape
from .tensors import GEOMETRY, Step, Value, storages_of

__all__ = ["Plan"]

# ======================================================================== the plan
class Plan:
    """A model compiled for one device and batch size: its steps, buffers and bound launches.

    Attributes:
        device: where it runs; batch: the samples one run takes; precision: the weights' precision.
        inputs, outputs: the input and output values, in order.
        steps: the steps, in launch order (each with its kernel, layers and fused epilogue).
    """

    def __init__(self, device: Device, batch: int, inputs: list, outputs: list, steps: list,
                 precision: str = DEFAULT_PRECISION):
        self.device, self.batch, self.inputs, self.outputs, self.steps = device, batch, inputs, outputs, steps
        self.precision = precision
        self.buffers: list = []
        self.launches: list = []
        self._assign_lifetimes()

    # ---------------------------------------------------------------- memory, before allocating
    def _assign_lifetimes(self) -> None:
        end = len(self.steps)
        for storage in self._storages():
            storage.first, storage.last = end + 1, -1
        for value in self.inputs:
            value.storage.first = -1
        for i, step in enumerate(self.steps):
            for storage in [x.storage for x in step.inputs.values()] + [step.out.storage]:
                storage.first, storage.last = min(storage.first, i), max(storage.last, i)
        for value in self.outputs:
            value.storage.last = end
        for storage in self._storages():   # a view keeps its base's buffer alive while it is used
            base = storage.base
            if base is not None:
                base.first, base.last = min(base.first, storage.first), max(base.last, storage.last)

    def _storages(self) -> list:
        return storages_of(self.inputs + self.outputs, self.steps)

    def _arena(self) -> list:
        """``[(bytes, [storages])]``: buffers reused by liveness (best fit, first-come).

        Each input has a buffer of its own, exactly its size, written whole by every run (no other
        tensor shares it, so an upload never covers part of a larger buffer)."""
        inputs = {id(v.storage) for v in self.inputs}
        buffers = [[4 * v.storage.elements(), 2**62, [v.storage]] for v in self.inputs]
        for storage in sorted(self._storages(), key=lambda s: (s.first, -s.elements())):
            if id(storage) in inputs or storage.base is not None:   # a view lives in its base's buffer
                continue
            need = 4 * storage.elements()
            free = [b for b in buffers if b[1] < storage.first and b[0] >= need]
            if free:
                chosen = min(free, key=lambda b: b[0])
            else:
                grow = [b for b in buffers if b[1] < storage.first]
                chosen = max(grow, key=lambda b: b[0]) if grow else None
                if chosen is None:
                    chosen = [0, -2, []]
                    buffers.append(chosen)
                chosen[0] = max(chosen[0], need)
            chosen[1] = storage.last
            chosen[2].append(storage)
        return [(size, storages) for size, _, storages in buffers]

    def _weights(self):
        """``(weight, least padding, precision)`` of every weight copy the plan's kernels read (a
        head's too), each once: a layer called on several tensors (a shared layer) lowers a
        :class:`Weight` per call, all of them one copy on the device."""
        seen = set()
        for step in self.steps:
            found = [] if step.weight is None else [(step.weight, self._weight_padding(step))]
            if step.head is not None:
                found.append((step.head[0], self._head_padding(step)))
            for weight, padding in found:
                key = (id(weight.copies), weight.what, padding, step.spec.precision)
                if key not in seen:
                    seen.add(key)
                    yield weight, padding, step.spec.precision

    def weight_paddings(self) -> list:
        """The least padded shape of each weight copy in this plan (a copy padded more may serve)."""
        return [padding for _, padding, _ in self._weights()]

    def weight_sizes(self) -> list:
        """Bytes of each weight copy in this plan, in its precision."""
        return [weight.nbytes(padding, precision) for weight, padding, precision in self._weights()]

    def weight_bytes(self) -> int:
        """Bytes of the weight copies this plan reads (shared with other plans of the model)."""
        seen, total = set(), sum(self.weight_sizes())
        for step in self.steps:
            head_bias = (step.head[1],) if step.head is not None else ()
            for vector in (step.bias,) + (step.affine or ()) + tuple(step.vectors.values()) + head_bias:
                if vector is not None and (id(vector.copies), vector.what) not in seen:   # once per copy
                    seen.add((id(vector.copies), vector.what))
                    total += vector.values.nbytes
        return total

    def activation_bytes(self) -> tuple:
        """``(largest buffer bytes, what it holds, arena bytes)`` of this plan's activations, the
        scratch buffers of its kernels (partial sums of a K split: one per size) among them."""
        arena = self._arena()
        size, storages = max(arena, key=lambda item: item[0]) if arena else (0, [])
        what = ""
        if storages:
            storage = max(storages, key=lambda s: s.elements())
            value = next((v for v in self._values() if v.storage is storage), None)
            what = self._describe_storage(value, storage)
        scratch = self._scratch_sizes()
        if scratch and max(scratch) > size:
            size, what = max(scratch), scratch[max(scratch)]
        return size, what, sum(s for s, _ in arena) + sum(scratch)

    def _scratch_sizes(self) -> dict:
        """``{bytes: what}`` of the scratch buffers this plan's kernels bind, one per size (as
        kernel_call sizes them: the entry's ``scratch_bytes`` for the result's padded rows ``h`` and
        columns ``w``)."""
        sizes = {}
        for step in self.steps:
            spec, storage = step.spec, step.out.storage
            if spec is None or spec.scratch_bytes is None or storage.padded is None:
                continue
            h, w = storage.padded
            values = {"h": h, "w": w}
            if step.kind == "matmul" and step.weight is not None:   # a kernel that tiles A's rows (a head's)
                values["H"] = self._weight_padding(step)[0]
            size = scratch_size(spec, values)
            if size > 4:
                sizes.setdefault(size, f"{self._step_what(step)} scratch ({self._partial_sums(step, values)}, "
                                       f"kernel {spec.codename})")
        return sizes

    @staticmethod
    def _step_what(step: Step) -> str:
        """``layer 'x'``, or ``layers 'x' + 'y'`` for a step that computes several in one launch."""
        if not step.layers:
            return step.what
        if len(step.layers) == 1:
            return step.layers[0]._what()
        return "layers " + " + ".join(repr(layer.name) for layer in step.layers)

    @staticmethod
    def _partial_sums(step: Step, values: dict) -> str:
        """What a K split's scratch holds: the partial sums of the step's matmul (for a kernel that
        computes a head after it, the first layer's, then the head's)."""
        storage = step.out.storage
        h, w = storage.padded
        units = step.weight.shape[0] if step.kind == "matmul" and step.weight is not None else storage.rows
        if units == storage.rows:
            return f"partial sums for {units} features x {storage.cols} samples, padded to {h}x{w}"
        return (f"partial sums for {units} features x {storage.cols} samples, padded to {values['H']}x{w}, "
                f"then the head's {storage.rows}")

    def _describe_storage(self, value, storage) -> str:
        """``layer 'x' output (13 features x 7 samples, padded to 16x8 in R for kernel k)``; a copy in
        another layout, ``layer 'x' output re-laid out (...) for kernel k`` (k: the kernel reading it)."""
        step = value.producer if value is not None else None
        copied = step is not None and step.kind == "relayout"
        source = step.inputs["a"].producer if copied else step
        if source is None:
            who, role = "the model's", "input"
        else:
            who, role = (source.layers[-1]._what() if source.layers else source.what), "output"
        if step is None or copied:
            reader = next((s for s in self.steps if value in s.inputs.values()), None)
            kernel = reader.spec.codename if reader is not None else "none"
        else:
            kernel = step.spec.codename
        unit = "samples" if storage.cols == self.batch else "columns"
        return (f"{who} {role}{' re-laid out' if copied else ''} ({storage.rows} features x {storage.cols} {unit}, "
                f"padded to {storage.padded[0]}x{storage.padded[1]} in {storage.layout} for kernel {kernel})")

    def _values(self):
        yield from self.inputs
        for step in self.steps:
            yield step.out

    @staticmethod
    def _weight_padding(step: Step) -> tuple:
        """The least padded shape of a matmul's left operand: its result's padded rows (or, for a
        kernel that reads A's logical rows only, the units rounded up to A's alignment) by the
        common K (the right operand's padded rows)."""
        a = step.spec.matrices["a"]
        if step.kind == "conv":   # a convolution reads A's rows up to R's padded rows
            return (round_up(step.out.storage.padded[0], a.row_multiple),
                    round_up(step.weight.shape[1], a.col_multiple))
        rows = round_up(step.weight.shape[0], a.row_multiple) if a.logical_rows else step.out.storage.padded[0]
        return (rows, Plan._common_rows(step))

    def _shared_padding(self, step: Step, need) -> tuple | None:
        """A padding of the weight that the device's large-batch kernel can read too, where it reads
        the same layout: a model used at batch 1 and at large batches keeps one copy."""
        m, k = step.weight.shape
        restriction = step.spec.matrices["a"]
        big = choose("matmul", self.device, (m, k, 4096), precision=step.spec.precision)
        other = big.matrices["a"]
        if other.any_layout or restriction.any_layout or other.layout != restriction.layout:
            return None
        theirs = big.padded_shapes(m, k, 4096)["a"]
        return (round_up(max(need[0], theirs[0]), math.lcm(restriction.row_multiple, other.row_multiple)),
                round_up(max(need[1], theirs[1]), math.lcm(restriction.col_multiple, other.col_multiple)))

    # ---------------------------------------------------------------- allocating and binding
    def allocate(self, model: str | None = None) -> "Plan":
        """Uploads the weights, allocates the arena and binds every launch. Returns ``self``.

        ``model``: the model's name; where given, the programs built meanwhile are reported on
        stderr (:class:`~malinn.plan.progress.BuildProgress`: a line updated on a terminal, else a
        summary where they took a second or more)."""
        device = self.device
        for size, storages in self._arena():
            what = " / ".join(sorted({f"{s.rows}x{s.cols}" for s in storages}))
            buffer = device.alloc(size, f"activations ({what})")
            with device.lock:
                device.fill_zero(buffer, size, what=f"activations ({what})")
            for storage in storages:
                storage.buffer = buffer
        for storage in self._storages():
            if storage.base is not None:
                storage.buffer = storage.base.buffer
        self.launches = []
        progress = None if model is None else BuildProgress(device, model, sum(not s.view for s in self.steps))
        try:
            for step in self.steps:
                launch = self._bind(step)   # its program built here, or taken from memory or the binary cache
                step.launch = launch
                if launch is not None:
                    self.launches.append(launch)
                if progress is not None and not step.view:
                    progress.advance()
        except BaseException:
            if progress is not None:
                progress.finish(failed=True)
            raise
        if progress is not None:
            progress.finish()
        # inputs and outputs travel through staging arrays the size of their whole buffers, padding
        # included (page-locked on a discrete GPU): a run writes every float of an input's buffer
        # (padded rows and samples as zeros, never an earlier call's data) with one plain copy; an
        # input that fills its buffer exactly goes from the caller's array where the device says
        # that a copy into the staging array would not pay (Device.stages_input)
        # decided once: the inputs (buffer, staging, value, uploaded from the caller's array), the
        # downloads (buffer, staging) and how each output is cut from its staging (staging, rows,
        # columns per sample, one sample's shape)
        downloads = [(v.storage.buffer, self._staging(v, "output")) for v in self.outputs]
        self._io = ([(v.storage.buffer, self._staging(v, "input"), v, self._direct(v)) for v in self.inputs],
                    downloads,
                    [(staging, v.rows, v.cols // self.batch, tuple(v.shape[1:]))
                     for (_, staging), v in zip(downloads, self.outputs)])
        return self

    def _direct(self, value: Value) -> bool:
        """Whether a full pass uploads ``value`` from the caller's array (no padding, no staging copy)."""
        return value.storage.padded == (value.rows, value.cols) and not self.device.stages_input(
            4 * value.rows * value.cols)

    def _staging(self, value: Value, what: str) -> np.ndarray:
        """Host memory laid out as ``value``'s buffer: a row per column of its matrix view (the
        padded columns too), each as long as the padded rows."""
        rows, cols = value.storage.padded
        return self.device.host_array((cols, rows), f"the {what} staging of {value.name or what} "
                                                    f"{format_shape(value.shape)}")

    def _matrix(self, value: Value, rows: int | None = None) -> DeviceMatrix:
        s = value.storage
        padded = s.padded if rows is None else (rows, s.padded[1])
        return DeviceMatrix((value.rows, value.cols), device=self.device, layout=s.layout, padded=padded,
                            buffer=s.buffer)

    @staticmethod
    def _common_rows(step: Step) -> int:
        """The rows of a matmul's right operand its kernel reads (K padded as the kernel asks).

        A row-major buffer's first rows are a matrix of their own, so a result padded to more rows
        by its producer (a small-batch kernel writes whole blocks of rows) is read only to what this
        kernel needs: the weights need no more columns than that either."""
        x = step.inputs["b"]
        a, b = step.spec.matrices["a"], step.spec.matrices["b"]
        if str(x.storage.layout) != "R":
            return x.storage.padded[0]
        return min(x.storage.padded[0], round_up(x.rows, math.lcm(b.row_multiple, a.col_multiple)))

    def _bind(self, step: Step):
        if step.view:   # its result is a view of memory another step wrote: nothing to launch
            return None
        device, spec = self.device, step.spec
        matrices = {slot: self._matrix(x, self._common_rows(step) if step.kind == "matmul" else None)
                    for slot, x in step.inputs.items()}
        matrices["r"] = self._matrix(step.out)
        vectors, params = {}, step.params
        if step.kind == "conv":
            matrices["a"] = step.weight.on_device(device, spec.matrices["a"], self._weight_padding(step),
                                                  precision=spec.precision)
            spec = self._epilogue(step, device)
            if step.bias is not None:
                vectors["bias"] = step.bias.on_device(device)
            if step.affine is not None:
                vectors["scale"], vectors["shift"] = (v.on_device(device) for v in step.affine)
        elif step.kind == "matmul":
            need = self._weight_padding(step)
            matrices["a"] = step.weight.on_device(device, spec.matrices["a"], need,
                                                  self._shared_padding(step, need), spec.precision)
            spec = self._epilogue(step, device)
            if step.bias is not None:
                vectors["bias"] = step.bias.on_device(device)
            if step.affine is not None:
                vectors["scale"], vectors["shift"] = (v.on_device(device) for v in step.affine)
            if step.head is not None:
                spec = self._head(step, spec, matrices["a"], vectors)
        elif step.kind == "affine":
            vectors["scale"], vectors["shift"] = (v.on_device(device) for v in step.affine)
            matrices = {"r": matrices["r"]}
        elif step.kind == "bias":
            vectors["bias"] = step.bias.on_device(device)
            matrices = {"r": matrices["r"]}
        elif step.kind in ("merge", "concat"):
            matrices = {"r": matrices["r"], "a": matrices["a"]}
            if step.activation not in (None, "linear"):   # a fused activation's p0..p3
                values = load_library().activation_spec(step.activation, step.what).param_values(step.params)
                params = {f"p{i}": v for i, v in enumerate(values)}
        elif step.kind == "activation" or step.overwrites:
            matrices = {"r": matrices["r"]}
        for name, vector in step.vectors.items():
            vectors[name] = vector.on_device(device)
        return bind(spec, device, matrices, vectors, params, what=step.what)

    def _head(self, step: Step, spec: KernelSpec, first: DeviceMatrix, vectors: dict) -> KernelSpec:
        """Uploads the head of a step that computes one (its weights as the first layer's, units
        by the padded rows of the first layer's copy ``first``; its bias) into ``vectors`` and
        returns ``spec`` with the paddings the kernel indexes them by."""
        weight, bias, _ = step.head
        # the kernel reads the head's inputs up to the first layer's copy's padded rows (a copy shared
        # with another kernel may be padded beyond this plan's least padding)
        need = (weight.shape[0], first.padded[0])
        matrix = weight.on_device(self.device, self._head_restriction(step), need, precision=spec.precision)
        vectors["head"] = matrix.buffer
        if bias is not None:
            vectors["head_bias"] = bias.on_device(self.device)
        return spec.configure({"HEAD_STRIDE": matrix.padded[0], "HEAD_COLS": matrix.padded[1],
                                      "HEAD_INPUTS": step.weight.shape[0]})

    @staticmethod
    def _head_restriction(step: Step) -> MatrixRestriction:
        """The head's weights are read as the first layer's are, with any row padding."""
        return dataclasses.replace(step.spec.matrices["a"], row_align=1)

    def _head_padding(self, step: Step) -> tuple:
        """The head's weights padded as its kernel reads them: its units by the first layer's
        padded rows (the head's inputs)."""
        return (step.head[0].shape[0], self._weight_padding(step)[0])

    @staticmethod
    def _epilogue(step: Step, device: Device) -> KernelSpec:
        """The matmul's kernel configured for what the fusion pass put in its epilogue (the same
        configuring the eager ``ops.matmul`` does)."""
        shape = step.weight.shape + (step.inputs["b"].cols,)
        spec, fused = with_epilogue(step.spec, shape, device, step.bias is not None, step.activation,
                                   step.affine is not None)
        wanted = (step.bias is not None) + (step.activation not in (None, "linear")) + (step.affine is not None)
        if len(fused) != wanted:
            raise AssertionError(f"{step.what}: {spec.codename} fuses only {fused}")
        if step.out.storage.view is not None:   # R is a slice of a larger buffer (epilogue.clh R_VIEW)
            spec = spec.configure(step.out.storage.view)
        return spec

    # ---------------------------------------------------------------- running
    def run(self, arrays: list) -> list:
        """Uploads ``arrays`` (float32, C-contiguous, at most ``batch`` samples each), launches every
        step and downloads the outputs.

        Returns:
            One float32 array per output, with the inputs' number of samples.

        Raises:
            DeviceError: a launch, an upload or a download failed.
        """
        n = arrays[0].shape[0]
        device = self.device
        ins, downloads, outs = self._io
        with device.lock:   # the staging arrays are the plan's: one pass at a time
            uploads = []
            for (buffer, staging, value, direct), array in zip(ins, arrays):
                if direct and n == self.batch:
                    uploads.append((buffer, array))
                    continue
                cols = value.cols // self.batch * n
                staging[:cols, :value.rows] = array.reshape(cols, value.rows)
                if cols < value.cols:
                    staging[cols:value.cols] = 0
                uploads.append((buffer, staging))
            device.run_pass(uploads, self.launches, downloads)
            return [staging[:cols, :rows].reshape((n,) + tail).copy()
                    for staging, rows, per_sample, tail in outs for cols in (per_sample * n,)]

    # ---------------------------------------------------------------- reports
    def describe(self) -> list:
        """One row per step: ``{"layers", "kernel", "fused", "shape", "what", "kind", "view"}`` (what
        ``summary`` shows; a matmul's kernel ends with its precision in brackets where it is not
        fp32; a step the plan made a view launches nothing and shows ``view (no copy)``)."""
        precision_defines = {k for p in load_library().precisions.values() for k, _ in p.defines}
        rows = []
        for step in self.steps:
            fused = [f for f, on in (("bias", step.bias is not None),
                                     (step.activation, step.kind in ("matmul", "conv", "merge")
                                      and step.activation not in (None, "linear")),
                                     ("affine", step.kind in ("matmul", "conv") and step.affine is not None),
                                     (self._head_label(step), step.head is not None)) if on]
            plain = {}   # a shape-generic kernel (merge, concat, dot) shows only what this step sets
            if step.kind in ("merge", "concat", "dot") and step.spec.template is not None:
                plain = {k: str(v) for k, v in step.spec.template[1].get("defines", {}).items()}
            config = " ".join(f"{k}={v}" for k, v in step.spec.defines
                              if k not in ("BIAS", "ACTIVATION", "AFFINE") and k not in precision_defines
                              and k not in GEOMETRY and plain.get(k) != v and not k.startswith("HEAD"))
            kernel = (step.spec.codename + (f" ({config})" if config else "")
                      + (" (writes its slice of a shared buffer)" if step.out.storage.view is not None else "")
                      + (f" [{step.spec.precision}]" if step.spec.precision != DEFAULT_PRECISION else ""))
            if step.view:
                kernel = "view (no copy)"
            rows.append({"layers": [getattr(layer, "name", str(layer)) for layer in step.layers],
                         "kernel": kernel, "fused": fused, "shape": step.out.shape, "what": step.what,
                         "kind": step.kind, "view": step.view})
        return rows

    @staticmethod
    def _head_label(step: Step) -> str:
        """``head`` (a Dense head computed in the step's kernel), with its activation where it has one."""
        activation = step.head[2] if step.head is not None else None
        return "head" if activation in (None, "linear") else f"head ({activation})"

    def matmul_shapes(self) -> list:
        """``(m, k, n)`` of every matmul step (what ``malinn tune --model`` times)."""
        shapes = []
        for s in self.steps:
            if s.kind == "matmul":
                shapes.append((s.weight.shape[0], s.weight.shape[1], s.inputs["b"].cols))
                if s.head is not None:   # a head computed in the step's kernel (tuned for when it is not)
                    shapes.append((s.head[0].shape[0], s.weight.shape[0], s.inputs["b"].cols))
        return shapes

