"""The compiled plan: what :class:`~malinn.plan.builder.PlanBuilder` decided, allocated once
(weights, an activation arena, staging arrays, every kernel bound to its arguments); ``run`` only
uploads, launches and downloads.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..backends.base import Device
from ..choice.kernel_call import scratch_size
from ..choice.matrix import DeviceMatrix
from ..library.kernel_library import DEFAULT_PRECISION, load_library
from .arena import arena
from .kinds.layout import RELAYOUT
from .kinds.matmul import MATMUL
from .progress import BuildProgress
from .tensor import format_shape
from .tensors import GEOMETRY, Step, Storage, Value, storages_of

__all__ = ["Plan", "PendingPass", "Upload", "Output"]


class Upload(NamedTuple):
    """How a run uploads one input: into ``buffer`` from the caller's array where ``direct`` (a full
    pass of an unpadded input), else through ``staging`` (host memory laid out as the buffer);
    ``unpadded`` where the buffer is the caller's array as laid out (a full pass from page-locked
    memory is then one DMA, whatever ``direct`` and ``staging`` say)."""

    buffer: object
    staging: np.ndarray | None  # None: the input moves through a staging ring (Plan._rings)
    value: Value
    direct: bool
    unpadded: bool


class Output(NamedTuple):
    """How an output reaches the caller: its buffer, the staging it is cut from, its rows, columns
    per sample and one sample's shape; ``direct`` where it is read straight into the array returned
    (its samples fill the start of the buffer: no padded features, nothing to cut); ``plain`` where
    its staging rows are as long as its features (a pass's samples are the staging's first rows:
    a shorter pass reads only those)."""

    buffer: object
    staging: np.ndarray | None  # None: read straight into the result (direct) or through a ring (Plan._rings)
    rows: int
    per_sample: int
    sample_shape: tuple
    direct: bool
    plain: bool


class PendingPass:
    """A pass :meth:`Plan.start` enqueued: :meth:`result` waits for it and returns its outputs, as
    :meth:`Plan.run` would have, and gives the plan's lock back (whatever the wait raised)."""

    __slots__ = ("plan", "n", "results", "started", "done")

    def __init__(self, plan: Plan, n: int, results: list, started: Any):
        self.plan, self.n, self.results, self.started, self.done = plan, n, results, started, False

    def result(self) -> list:
        """The pass's outputs (one float32 array per output, ``n`` samples each).

        Raises:
            DeviceError: the wait or a download failed.
            RuntimeError: the result was taken before.
        """
        if self.done:
            raise RuntimeError("this pass's result was taken before")
        self.done = True
        plan = self.plan
        try:
            plan.device.wait_pass(self.started)
            self.started = None
            return plan._receive(self.results, self.n)
        finally:
            plan.lock.release()


# ======================================================================== the plan
class Plan:
    """A model compiled for one device and batch size: its steps, buffers and bound launches.

    Attributes:
        device: where it runs; batch: the samples one run takes; precision: the weights' precision.
        inputs, outputs: the input and output values, in order.
        steps: the steps, in launch order (each with its kernel, layers and fused epilogue).
    """

    def __init__(
        self, device: Device, batch: int, inputs: list, outputs: list, steps: list, precision: str = DEFAULT_PRECISION
    ):
        self.device, self.batch, self.inputs, self.outputs, self.steps = device, batch, inputs, outputs, steps
        #: the queue (None: the backend's own) and lock of this plan's passes (:meth:`allocate`)
        self.queue: Any = None
        self.lock: Any = device.lock
        self.precision = precision
        self.buffers: list = []
        self.launches: list = []
        self.convs: list = []  # the convolution geometries lowered (PlanBuilder.compile sets them)
        #: the first steps that copy an unpadded input into the padded buffer its kernels read
        #: (PlanBuilder.compile sets them: malinn.plan.passes.input_padding)
        self.input_copies: list[Step] = []
        #: the steps that copy a padded output into the unpadded buffer downloaded (PlanBuilder.compile
        #: sets them: malinn.plan.passes.output_padding)
        self.output_copies: list[Step] = []
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
        for storage in self._storages():  # a view keeps its base's buffer alive while it is used
            base = storage.base
            if base is not None:
                base.first, base.last = min(base.first, storage.first), max(base.last, storage.last)

    def _storages(self) -> list:
        return storages_of(self.inputs + self.outputs, self.steps)

    def _arena(self) -> list:
        """``[(bytes, [storages])]``: the activation buffers (:func:`malinn.plan.arena.arena`)."""
        released = frozenset(id(step.inputs["a"].storage) for step in self.input_copies)
        return arena(self.inputs, self._storages(), released)

    def _weights(self):
        """``(weight, least padding, precision)`` of every weight copy the plan's kernels read (a
        head's too), each once: a layer called on several tensors (a shared layer) lowers a
        :class:`Weight` per call, all of them one copy on the device."""
        seen = set()
        for step in self.steps:
            for weight, padding in step.kind.weights(step):
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
            head_bias = (step.head.bias,) if step.head is not None else ()
            for vector in (step.bias,) + (step.affine or ()) + tuple(step.vectors.values()) + head_bias:
                if vector is not None and (id(vector.copies), vector.what) not in seen:  # once per copy
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
        sizes: dict[int, str] = {}
        for step in self.steps:
            spec, storage = step.spec, step.out.storage
            if spec is None or spec.scratch_bytes is None or storage.padded is None:
                continue
            h, w = storage.padded
            values = {"h": h, "w": w, **step.kind.scratch_values(step)}
            size = scratch_size(spec, values)
            if size > 4:
                sizes.setdefault(
                    size,
                    f"{self._step_what(step)} scratch ({self._partial_sums(step, values)}, kernel {spec.codename})",
                )
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
        h, w = storage.padded_size
        units = step.weight.shape[0] if step.weight is not None else storage.rows
        if units == storage.rows:
            return f"partial sums for {units} features x {storage.cols} samples, padded to {h}x{w}"
        return (
            f"partial sums for {units} features x {storage.cols} samples, padded to {values['H']}x{w}, "
            f"then the head's {storage.rows}"
        )

    def _describe_storage(self, value: Value | None, storage: Storage) -> str:
        """``layer 'x' output (13 features x 7 samples, padded to 16x8 in R for kernel k)``; a copy in
        another layout, ``layer 'x' output re-laid out (...) for kernel k`` (k: the kernel reading it)."""
        step = value.producer if value is not None else None
        copied = step is not None and step.kind is RELAYOUT
        source = step.inputs["a"].producer if step is not None and copied else step
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
        return (
            f"{who} {role}{' re-laid out' if copied else ''} ({storage.rows} features x {storage.cols} {unit}, "
            f"padded to {storage.padded_size[0]}x{storage.padded_size[1]} in {storage.layout} for kernel {kernel})"
        )

    def _values(self):
        yield from self.inputs
        for step in self.steps:
            yield step.out

    # ---------------------------------------------------------------- allocating and binding
    def allocate(self, model: str | None = None, replica: int = 0) -> "Plan":
        """Uploads the weights, allocates the arena and binds every launch. Returns ``self``.

        ``model``: the model's name; where given, the programs built meanwhile are reported on
        stderr (:class:`~malinn.plan.progress.BuildProgress`: a line updated on a terminal, else a
        summary where they took a second or more). ``replica``: which of the device's plans of
        this model and size it is; its passes run on the queue and under the lock that
        :meth:`~malinn.backends.base.Device.stream` gives it."""
        device = self.device
        self.queue, self.lock = device.stream(replica)
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
                launch = step.kind.bind(self, step)  # its program built here, or taken from memory or the binary cache
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
        # that a copy into the staging array would not pay (Device.stages_input); a padded input the
        # device pads itself (Device.pads_on_device) is such an unpadded input, copied into its
        # padded buffer by the plan's first steps (input_copies), and a partial pass of it goes
        # through its staging array, the samples past n zeroed there
        # decided once: the inputs (buffer, staging, value, uploaded from the caller's array) and
        # how each output reaches the caller (buffer, staging to cut it from, rows, columns per
        # sample, one sample's shape, read straight into the result)
        # a large input or output on a discrete GPU moves in chunks through a ring of page-locked
        # slots instead (Device.staging_ring: the host's copies overlap the DMA), with no staging
        # array of its own; each ring decided here, once
        self._rings = (
            [self.device.staging_ring(self._staging_shape(v), self._staging_what(v, "input")) for v in self.inputs],
            [self.device.staging_ring(self._staging_shape(v), self._staging_what(v, "output")) for v in self.outputs],
        )
        # an output whose features are not padded is read straight into the array the caller gets
        # (the first samples' columns are the start of its buffer) where the device says that a read
        # into the staging array and a copy out would not pay (Device.stages_output): one host pass
        # over it, not two; the result is a new array each call, never a buffer the next one reuses
        # (an output whose features were padded, unpadded on the device by a last copy step, is such an
        # output: PlanBuilder.compile, malinn.plan.passes.output_padding); a staged one of unpadded
        # features reads only a pass's samples into its staging (Plan._results)
        direct = [ring is None and self._direct_output(v) for v, ring in zip(self.outputs, self._rings[1])]
        stagings = [
            None if ring is not None or straight else self._staging(v, "output")
            for v, ring, straight in zip(self.outputs, self._rings[1], direct)
        ]
        self._io = (
            [
                Upload(v.storage.buffer, None, v, False, self._unpadded(v))
                if ring is not None
                else Upload(v.storage.buffer, self._staging(v, "input"), v, self._direct(v), self._unpadded(v))
                for v, ring in zip(self.inputs, self._rings[0])
            ],
            [
                Output(
                    v.storage.buffer,
                    staging,
                    v.rows,
                    v.cols // self.batch,
                    tuple(v.shape[1:]),
                    straight,
                    staging is not None and staging.shape[1] == v.rows,
                )
                for staging, v, straight in zip(stagings, self.outputs, direct)
            ],
        )
        return self

    def _direct_output(self, value: Value) -> bool:
        """Whether ``value`` is read straight into the caller's result: its features unpadded (a
        pass's samples are then the first ``rows x columns`` floats of its buffer) and the device
        reading it so at least as fast as through a staging array (:meth:`Device.stages_output`)."""
        storage = value.storage
        return (
            storage.view is None
            and storage.padded_size[0] == value.rows
            and not self.device.stages_output(4 * value.rows * value.cols)
        )

    @staticmethod
    def _unpadded(value: Value) -> bool:
        """Whether ``value``'s buffer holds the caller's array as it is laid out (no padding)."""
        return value.storage.view is None and value.storage.padded == (value.rows, value.cols)

    def _direct(self, value: Value) -> bool:
        """Whether a full pass uploads ``value`` from the caller's array (no padding, no staging copy)."""
        return value.storage.padded == (value.rows, value.cols) and not self.device.stages_input(
            4 * value.rows * value.cols
        )

    def _staging(self, value: Value, what: str) -> np.ndarray:
        """Host memory laid out as ``value``'s buffer: a row per column of its matrix view (the
        padded columns too), each as long as the padded rows."""
        return self.device.host_array(self._staging_shape(value), self._staging_what(value, what))

    @staticmethod
    def _staging_shape(value: Value) -> tuple[int, int]:
        """``(padded columns, padded rows)``: the shape of host memory laid out as ``value``'s buffer."""
        rows, cols = value.storage.padded_size
        return cols, rows

    @staticmethod
    def _staging_what(value: Value, what: str) -> str:
        return f"the {what} staging of {value.name or what} {format_shape(value.shape)}"

    def matrix(self, value: Value, rows: int | None = None) -> DeviceMatrix:
        """``value``'s buffer as a kernel argument (its first ``rows`` padded rows where given)."""
        s = value.storage
        padded = s.padded_size if rows is None else (rows, s.padded_size[1])
        return DeviceMatrix(
            (value.rows, value.cols), device=self.device, layout=s.layout, padded=padded, buffer=s.buffer
        )

    # ---------------------------------------------------------------- running
    def run(self, arrays: list) -> list:
        """Uploads ``arrays`` (float32, C-contiguous, at most ``batch`` samples each), launches every
        step and downloads the outputs.

        Returns:
            One float32 array per output, with the inputs' number of samples (new arrays: the next
            run never writes into them).

        Raises:
            DeviceError: a launch, an upload or a download failed.
        """
        n = arrays[0].shape[0]
        with self.lock:  # the staging arrays and rings are the plan's: one pass at a time on its queue
            uploads = self._send(arrays, n)
            results, downloads = self._results(n)
            self.device.run_pass(uploads, self.launches, downloads, self.queue)
            return self._receive(results, n)

    def start(self, arrays: list, blocking: bool = True) -> PendingPass | None:
        """:meth:`run` in two halves: the pass's uploads and launches enqueued (its reads too, or
        when it is waited for: the backend's :meth:`~malinn.backends.base.Device.start_pass`
        decides), and the pass handed back (its :meth:`PendingPass.result` waits for it), so that
        one thread keeps several devices busy at once. The plan's :attr:`lock` is held until the
        result is taken, which must be in this thread. Not ``blocking``: None where another thread
        holds the lock (a thread holding other passes' locks must not wait for one: two such
        threads could wait for each other).

        Raises:
            DeviceError: a launch or an upload failed (the lock given back).
        """
        n = arrays[0].shape[0]
        if not self.lock.acquire(blocking):
            return None
        try:
            uploads = self._send(arrays, n)
            results, downloads = self._results(n)
            started = self.device.start_pass(uploads, self.launches, downloads, self.queue)
        except BaseException:
            self.lock.release()
            raise
        return PendingPass(self, n, results, started)

    def _send(self, arrays: list, n: int) -> list:
        """The host side of a pass's uploads of ``n`` samples (under :attr:`lock`): an input with a
        ring enqueued through it in chunks; a full pass of a direct input left as the caller's array;
        any other copied into its staging array (the samples past ``n`` zeroed). Returns the
        ``(buffer, array)`` uploads for :meth:`Device.run_pass`."""
        uploads = []
        for (buffer, staging, value, direct, unpadded), array, ring in zip(self._io[0], arrays, self._rings[0]):
            cols = value.cols // self.batch * n
            if unpadded and n == self.batch and self.device.page_locked(array):
                uploads.append((buffer, array))  # page-locked already (malinn.empty_pinned): one DMA
                continue
            if staging is None:  # through its ring, in chunks, its last ones in flight while the others go
                ring.upload(self.queue, buffer, array.reshape(cols, value.rows))
                continue
            if direct and n == self.batch:
                uploads.append((buffer, array))
                continue
            staging[:cols, : value.rows] = array.reshape(cols, value.rows)
            if cols < value.cols:
                staging[cols : value.cols] = 0
            uploads.append((buffer, staging))
        return uploads

    def _results(self, n: int) -> tuple[list, list]:
        """A pass's result arrays of ``n`` samples (None for an output cut from its staging) and the
        ``(buffer, array)`` downloads for :meth:`Device.run_pass`: a direct output's samples read
        straight into its result (the first floats of its buffer), a staged output's staging: only
        the pass's samples where its features are unpadded (they are the start of the buffer, an
        output unpadded on the device among them), else the whole staging."""
        results: list[np.ndarray | None] = []
        downloads: list[tuple[object, np.ndarray]] = []
        for output in self._io[1]:
            staging = output.staging
            if staging is not None:
                results.append(None)
                downloads.append((output.buffer, staging[: output.per_sample * n] if output.plain else staging))
                continue
            result = np.empty((n,) + output.sample_shape, np.float32)
            results.append(result)
            if output.direct:
                downloads.append((output.buffer, result))
        return results, downloads

    def _receive(self, results: list, n: int) -> list:
        """The outputs once :meth:`Device.run_pass` returned (under :attr:`lock`): a ring's read
        through it into its result, a staged output cut from its staging into a new array."""
        done = []
        for output, ring, result in zip(self._io[1], self._rings[1], results):
            cols = output.per_sample * n
            if output.staging is not None:
                result = output.staging[:cols, : output.rows].reshape((n,) + output.sample_shape).copy()
            elif not output.direct:
                ring.download(self.queue, output.buffer, result.reshape(cols, output.rows))
            done.append(result)
        return done

    # ---------------------------------------------------------------- reports
    def describe(self) -> list:
        """One row per step: ``{"layers", "kernel", "fused", "shape", "what", "kind", "view"}`` (what
        ``summary`` shows; a matmul's kernel ends with its precision in brackets where it is not
        fp32; a step the plan made a view launches nothing and shows ``view (no copy)``)."""
        precision_defines = {k for p in load_library().precisions.values() for k, _ in p.defines}
        rows = []
        for step in self.steps:
            fused = step.kind.fused(step)
            plain = {}  # a shape-generic kernel (merge, concat, dot) shows only what this step sets
            if step.kind.shape_generic and step.spec.template is not None:
                plain = {k: str(v) for k, v in step.spec.template[1].get("defines", {}).items()}
            config = " ".join(
                f"{k}={v}"
                for k, v in step.spec.defines
                if k not in ("BIAS", "ACTIVATION", "AFFINE")
                and k not in precision_defines
                and k not in GEOMETRY
                and plain.get(k) != v
                and not k.startswith("HEAD")
            )
            kernel = (
                step.spec.codename
                + (f" ({config})" if config else "")
                + (" (writes its slice of a shared buffer)" if step.out.storage.view is not None else "")
                + (f" [{step.spec.precision}]" if step.spec.precision != DEFAULT_PRECISION else "")
            )
            if step.view:
                kernel = "view (no copy)"
            rows.append(
                {
                    "layers": [getattr(layer, "name", str(layer)) for layer in step.layers],
                    "kernel": kernel,
                    "fused": fused,
                    "shape": step.out.shape,
                    "what": step.what,
                    "kind": step.kind.name,
                    "view": step.view,
                }
            )
        return rows

    def matmul_shapes(self) -> list:
        """``(m, k, n)`` of every matmul step (what ``malinn tune --model`` times)."""
        shapes = []
        for s in self.steps:
            if s.kind is MATMUL:
                shapes.append((s.weight.shape[0], s.weight.shape[1], s.inputs["b"].cols))
                if s.head is not None:  # a head computed in the step's kernel (tuned for when it is not)
                    shapes.append((s.head.weight.shape[0], s.weight.shape[0], s.inputs["b"].cols))
        return shapes
