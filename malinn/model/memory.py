"""What a model's passes hold on a device (weights, activations) and the largest pass that fits:
the part of :class:`~malinn.model.model.PlannedModel` that plans to measure, not to run."""

from __future__ import annotations

import math

from ..backends.base import Device, size_text
from ..backends.selection import get_device
from ..errors import DeviceError
from ..library.scalar_arguments import DIVIDE_MAX_ELEMENTS
from .buckets import batch_bucket, samples
from .host import ModelHost

__all__ = ["MemoryLimits"]

#: more than any kernel pads a dimension by (layout chunks and work-group tiles are at most 128)
_PAD_BOUND = 1024
#: the most bytes of one activation buffer a pass is planned with: a kernel that divides by its
#: sizes counts a result's elements in 32 bits (scalar_arguments.DIVIDE_MAX_ELEMENTS) and refuses a
#: larger one, so a device whose allocations may be larger (an H200's 35 GB) still runs such passes
MAX_TENSOR_BYTES = 4 * DIVIDE_MAX_ELEMENTS
#: max_batch answers kept per model (device, precision, weights version, limit)
_ANSWERS_KEPT = 32
#: the tensors of the largest layer's size that a pass's arena holds at once, about: its input and
#: output, and a padded copy or a patch buffer beside them
_ARENA_TENSORS = 4


class MemoryLimits(ModelHost):
    """Device memory of a model's passes and :meth:`max_batch` (a mixin of
    :class:`~malinn.model.model.PlannedModel`, whose ``_compile``, ``_lock``, ``_max_batches``,
    ``_stamp`` and layers it reads)."""

    # ---------------------------------------------------------------- memory planning
    def activation_bytes(self, batch: int, device: Device | None = None) -> tuple[int, str]:
        """The largest device buffer a pass of ``batch`` samples allocates for activations.

        Args:
            batch: samples in the pass.
            device: the device (default: the current one).

        Returns:
            ``(bytes, what)``: the size and a description naming the layer and padded shape.
        """
        device = device or get_device()
        size, what, _ = self._compile(device, batch_bucket(batch), False).activation_bytes()
        return size, what

    def matmul_shapes(self, batch: int, device: Device | None = None) -> list:
        """``(units, inputs, columns)`` of every matmul a pass of ``batch`` samples runs (the shapes
        ``malinn tune --model`` times: the plan asks the tuning database for exactly these).

        Args:
            batch: samples in the pass (planned for its batch bucket, as :meth:`predict` plans it).
            device: the device (default: the current one).

        Returns:
            A list of ``(m, k, n)`` tuples: one per matmul step of the plan, and one for the Dense
            layer a step computes in the same launch (a fused head).

        Raises:
            ValueError: the model is not built.
            DeviceError: there is no working device, or a buffer or weight does not fit it (the
                message names the layer).
        """
        return self._compile(device or get_device(), batch_bucket(batch), False).matmul_shapes()

    def conv_geometries(self, batch: int, device: Device | None = None) -> list:
        """The :class:`~malinn.choice.conv_geometry.ConvGeometry` of every convolution a pass of ``batch``
        samples runs (1x1 convolutions run as matmuls are not among them): what ``malinn tune
        --model`` times, and what the plan asks the tuning database about.

        Args:
            batch: samples in the pass (planned for its batch bucket, as :meth:`predict` plans it).
            device: the device (default: the current one).

        Returns:
            A list of :class:`~malinn.choice.conv_geometry.ConvGeometry`, one per convolution lowered.

        Raises:
            ValueError: the model is not built.
            DeviceError: there is no working device, or a buffer or weight does not fit it (the
                message names the layer).
        """
        return self._compile(device or get_device(), batch_bucket(batch), False).convs

    def memory(self, batch: int, device: Device | None = None) -> dict:
        """Bytes a pass of ``batch`` samples holds on the device: ``weights`` (all the weight copies its
        kernels read), ``largest_weight`` (the largest of them, one allocation), ``activations``
        (the arena) and ``largest`` (its largest buffer).

        Args:
            batch: samples in the pass (planned for its batch bucket, as :meth:`predict` plans it).
            device: the device (default: the current one).

        Returns:
            ``{"weights", "largest_weight", "activations", "largest"}``, each in bytes.

        Raises:
            ValueError: the model is not built, or ``batch`` is not a positive number of samples.
            DeviceError: there is no working device, or the device cannot run a layer (a kernel
                whose loops it would end). A weight larger than the device's largest allocation is
                reported, not refused (``largest_weight``): ``predict`` refuses it naming the layer.
        """
        device = device or get_device()
        plan = self._compile(device, batch_bucket(batch), False)
        largest, _, arena = plan.activation_bytes()
        weights = plan.weight_sizes()
        return {
            "weights": plan.weight_bytes(),
            "largest_weight": max(weights, default=0),
            "activations": arena,
            "largest": largest,
        }

    def _arena_bytes_per_sample(self) -> int:
        """About the bytes a pass's activations take per sample, read from the layers' shapes alone
        (no plan made): :data:`_ARENA_TENSORS` float32 tensors of the largest layer's size."""
        if self.input_shapes is None:
            raise self._not_built()
        shapes = list(self.input_shapes) + [s[1:] for s in self._output_shapes(True)]
        return _ARENA_TENSORS * 4 * max(math.prod(d or 1 for d in s) for s in shapes)

    def max_batch(self, device: Device | None = None, limit: int | None = None) -> int:
        """The most samples one device pass may take, so that no activation buffer exceeds the
        device's largest single allocation (nor a quarter of its global memory, nor
        :data:`MAX_TENSOR_BYTES`: kernels count a tensor's elements in 32 bits), and the weights
        and the pass's activations together fit the device's global memory.

        ``predict`` splits larger batches into passes of this many samples.

        Args:
            device: the device (default: the current one).
            limit: stop searching at this many samples (default: 2**31).

        Returns:
            A positive number of samples (found once per device, model state and ``limit``; later
            calls read it).

        Raises:
            ValueError: the model is not built, or ``limit`` is not a positive whole number.
            DeviceError: even one sample's activations do not fit (the message names the layer,
                the padded shape and the device's limit), or the weights and one sample's
                activations exceed the device's global memory.
        """
        if self.input_shapes is None:
            raise self._not_built()
        device = device or get_device()
        budget = min(int(device.max_allocation), int(device.global_memory) // 4, MAX_TENSOR_BYTES)
        limit = samples(limit, "max_batch: limit must be") if limit is not None else 2**31
        key = (device.identity, self._precision, self._stamp(), budget, int(device.global_memory), limit)
        with self._lock:
            found = self._max_batches.get(key)
        if found is None:
            found = self._search_max_batch(device, budget, limit)
            with self._lock:
                self._max_batches[key] = found
                while len(self._max_batches) > _ANSWERS_KEPT:
                    self._max_batches.popitem(last=False)
        return found

    def _search_max_batch(self, device: Device, budget: int, limit: int) -> int:
        """:meth:`max_batch`, found (planning the model where the quick bound does not settle it)."""
        # the common case without planning: a tensor is a matrix of its last axis by the batch's
        # other positions, each dimension padded by less than _PAD_BOUND (a convolution's 4
        # channels padded to 32 rows: its columns are batch x pixels); a convolution's patch matrix
        # stays within a quarter of the largest allocation (conv_choice.patch_budget, padded)
        # (and twice as many such tensors as the model has, beside its float32 weights each padded as
        # much, within the device's memory)
        bucket = batch_bucket(limit)
        inputs = self.input_shapes
        assert inputs is not None, f"{type(self).__name__} {self.name!r} is not built"  # max_batch checked it
        shapes = list(inputs) + [s[1:] for s in self._output_shapes(True)]
        bound = max(4 * (s[-1] + _PAD_BOUND) * (bucket * math.prod(s[:-1]) + _PAD_BOUND) for s in shapes)
        weights = sum(
            4 * (cols + _PAD_BOUND) * (w.size // max(cols, 1) + _PAD_BOUND)
            for layer in self.layers
            for w in layer.weight_arrays()
            for cols in (w.shape[-1] if w.ndim else 1,)
        )
        memory = int(device.global_memory)
        if bound <= budget // 2 and weights + 2 * len(shapes) * bound <= memory:
            return limit

        def fits(batch: int) -> bool:
            plan = self._compile(device, batch_bucket(batch), False)
            largest, _, arena = plan.activation_bytes()
            return largest <= budget and plan.weight_bytes() + arena <= memory

        if fits(limit):
            return limit
        if not fits(1):
            plan = self._compile(device, 1, False)
            size, what, arena = plan.activation_bytes()
            weights = plan.weight_bytes()  # the plan's own (the bound above pads every array generously)
            if size > budget:
                raise DeviceError(
                    f"{what} needs {size_text(size)} ({size:,} bytes), more than {device.name} allows in "
                    f"one allocation ({size_text(budget)}, {budget:,} bytes): even one sample does not fit"
                )
            raise DeviceError(
                f"{type(self).__name__} {self.name!r}: its weights ({size_text(weights)}) and one sample's "
                f"activations ({size_text(arena)}) need more than {device.name}'s global memory "
                f"({size_text(memory)}, {memory:,} bytes)"
            )
        low, high = 1, limit  # fits(low), not fits(high)
        while high - low > 1:
            mid = (low + high) // 2
            if fits(mid):
                low = mid
            else:
                high = mid
        return low
