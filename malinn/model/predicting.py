"""How a model predicts: ``x`` in each of Keras's forms checked and read batch by batch, the passes
run on one device or spread over several, the results put back in order, Keras's progress bar.

:class:`Predicting` is the part of :class:`~malinn.model.model.PlannedModel` that runs it: it reads
the plans (``plan``, ``max_batch``) that the model makes, and a model kind says what its inputs are
(``_check_inputs``, ``_input_casts``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..backends.base import Device
from ..backends.selection import get_device, get_devices, resolve_devices
from ..layers.input_layer import KerasTensor
from .batches import (
    Results,
    check_batch_size,
    check_steps,
    default_step,
    is_iterable_source,
    iterable_length,
    unpack,
)
from .host import ModelHost
from .passes import spread
from .progbar import ProgressBar, shown, verbosity

if TYPE_CHECKING:
    from .host import LastCall

__all__ = ["Predicting", "RECENT_CALLS_KEPT"]

#: the one-pass calls whose plans predict goes straight to for an array of their shape (by samples):
#: a server's calls, whose batches are padded to a few sizes, alternate between them
RECENT_CALLS_KEPT = 8


class Predicting(ModelHost):
    """``predict``'s work, shared by every model kind (mixed into
    :class:`~malinn.model.model.PlannedModel`)."""

    def _check_inputs(self, x: Any, convert: bool = True) -> list:
        raise NotImplementedError

    def _run(
        self,
        x: Any,
        batch_size: int | None,
        every_layer: bool,
        verbose: str | int = 0,
        steps: int | None = None,
        devices: str | Device | list | tuple | None = None,
    ) -> list:
        """``predict``'s work: the outputs (one array per output) for ``x`` in any of its forms
        (:mod:`malinn.model.batches`), over ``devices`` (default: :func:`get_devices`)."""
        last = self._recent.get(x.shape[0]) if type(x) is np.ndarray and x.ndim else None
        if (
            last is not None
            and last[5] is not None
            and batch_size is None
            and not every_layer
            and type(x) is np.ndarray
            and x.shape == last[5]
            and x.dtype == np.float32
            and x.flags.c_contiguous
            and steps is None
            and devices is None
            and (verbose == "auto" or verbose == 0)
        ):
            # the same call as a recent one with an array of the same shape (which passed the checks
            # then): its plan, nothing checked or decided again while the model and device stand
            if self._last_serves(last, get_device()) and len(get_devices()) == 1:
                return last[4].run([x])
        if not self.layers and not self.built:
            raise ValueError(f"{type(self).__name__} {self.name!r} has no layers to predict with")
        batch_size, steps, verbose = check_batch_size(batch_size), check_steps(steps), verbosity(verbose)
        pool = resolve_devices(devices) if devices is not None else get_devices()
        if is_iterable_source(x):
            return self._run_iterable(x, batch_size, every_layer, verbose, steps, pool)
        xs = self._check_inputs(x, convert=False)
        n = self._samples(xs)
        if steps is not None:  # Keras's: steps batches of batch_size, or where not given every sample in steps batches
            if batch_size is None:
                batch_size = max(1, -(-n // steps))
            available = -(-n // batch_size)  # the batches the array holds
            if available < steps:
                self._ran_out(steps, available, 3)
            n = min(n, steps * batch_size)
        if n == 0:
            return self._no_samples(every_layer)
        device = pool[0]
        last = self._recent.get(n)
        if (
            len(pool) == 1
            and last is not None
            and last[1] == n
            and batch_size is None
            and not every_layer
            and verbose != 1
            and verbose != 2
            and self._last_serves(last, device)
            and not any(isinstance(a, np.memmap) for a in xs)
        ):  # a mapped file runs in passes
            return last[4].run(self._converted(xs))  # as a recent call of n samples: its plan, nothing decided again
        if batch_size:
            step = min(n, batch_size)
        else:  # on a device whose memory is the host's, a pass's activations bounded too
            shared = any(d.host_unified_memory for d in pool)
            step = default_step(xs, n, len(pool), self._arena_bytes_per_sample() if shared else None)
        step = max(1, min(self.max_batch(d, limit=step) for d in set(pool)))
        passes = -(-n // step)
        # "auto" counts the batches asked for (batch_size, a memory-mapped input's passes), not a
        # split of malinn's own (one share per device, the device's largest allocation)
        asked = -(-n // batch_size) if batch_size else passes if any(isinstance(a, np.memmap) for a in xs) else 1
        bar = ProgressBar(passes, shown(verbose, asked))
        if step >= n and batch_size is None and not every_layer and len(pool) == 1:
            stamp = self._stamp()  # before the plan: a change while it is made leaves _recent stale, never wrong
            plan = self.plan(n, device)
            xs = self._converted(xs)
            plain = x.shape if len(xs) == 1 and xs[0] is x else None  # a float32 array taken as it was
            ys = plan.run(xs)
            self._remember((device, n, stamp, (device.max_allocation, device.global_memory), plan, plain))
            bar.update(1, finalize=True)
            return ys
        results = Results(n)
        done = [0]

        def deliver(index: int, start: int, outputs: list) -> None:
            results.put(index, start, outputs)
            done[0] += 1
            bar.update(done[0], finalize=done[0] == bar.target)

        # every pass, the last and shorter one too, runs the plan of step samples (no plan of its own)
        items = ((i, start, [a[start : min(start + step, n)] for a in xs]) for i, start in enumerate(range(0, n, step)))
        spread(items, self._workers(pool, every_layer, step, self._converted), deliver)
        return results.collect(self._no_samples(every_layer))

    def _run_iterable(
        self,
        source: Iterable,
        batch_size: int | None,
        every_layer: bool,
        verbose: str | int,
        steps: int | None,
        pool: list,
    ) -> list:
        """``_run`` over an iterable of batches: ``steps`` of them (all where None), each checked as
        ``predict``'s ``x`` and run in passes of at most ``batch_size`` samples."""
        target = iterable_length(source, steps)
        bar = ProgressBar(target, shown(verbose, target))
        results = Results(None)
        done, drawn = [0], [0]  # batches predicted, batches drawn from the source

        def items() -> Iterator[tuple[int, int, Any]]:
            for index, item in enumerate(source):
                if steps is not None and index >= steps:
                    break
                drawn[0] = index + 1
                try:
                    x = unpack(item)
                except ValueError as exc:
                    raise ValueError(f"batch {index} of the iterable: {exc}") from None
                yield index, 0, (index, x)

        def prepare(batch: tuple[int, Any]) -> list:
            index, x = batch
            try:
                xs = self._check_inputs(x)
                self._samples(xs)
            except ValueError as exc:  # which batch of the iterable, beside the layer and the shapes
                raise ValueError(f"batch {index} of the iterable: {exc}") from None
            return xs

        def deliver(index: int, start: int, outputs: list) -> None:
            results.put(index, start, outputs)
            done[0] += 1
            bar.update(done[0])

        spread(items(), self._workers(pool, every_layer, batch_size, prepare), deliver)
        if steps is not None and drawn[0] < steps:
            self._ran_out(steps, drawn[0], 4)
        if bar.target is None:  # Keras's bar ends with the steps it saw as its target: 5/5
            bar.target = done[0]
        bar.update(done[0], finalize=True)
        if not results.parts and not self.built:
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: the iterable gave no batches, and the model is not "
                f"built (its output shape is not known)"
            )
        return results.collect(self._no_samples(every_layer))

    def _samples(self, xs: list) -> int:
        """The samples of the checked inputs ``xs``, the same for every input.

        Raises:
            ValueError: the inputs have different numbers of samples.
        """
        n = xs[0].shape[0]
        if any(a.shape[0] != n for a in xs):
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: the inputs have different numbers of samples "
                f"({', '.join(str(a.shape[0]) for a in xs)})"
            )
        return n

    def _ran_out(self, steps: int, available: int, depth: int) -> None:
        """Warns, as Keras does, that the input holds fewer than the ``steps`` batches asked for
        (``available`` of them: predict returns their outputs); ``depth``: the calls between this
        and the caller of ``predict``."""
        warnings.warn(
            f"{type(self).__name__} {self.name!r}: predict was asked for steps={steps} batches, but the input "
            f"ran out of data after {available}; the outputs of those {available} are returned",
            UserWarning,
            stacklevel=depth + 1,
        )

    def _workers(self, pool: list, every_layer: bool, step: int | None, prepare: Callable[[Any], list]) -> list:
        """``(label, begin)`` per device of ``pool`` for :func:`~malinn.model.passes.spread`:
        ``begin(batch, holding)`` takes one batch as ``prepare`` turns it into the checked float32
        inputs, starts its pass on the plan of this device's largest pass so far (a device listed
        again: a plan of its own, ``replica``) and returns what waits for its outputs. A batch beyond
        ``step`` samples (None: the batch's own size) or the device's largest pass runs in passes of
        that size, one after another, before ``begin`` returns. ``holding`` (other passes in flight,
        their plans' locks held): None instead of waiting for a lock, where the plan is still to be
        made, its lock is another thread's, or the batch takes several passes."""
        workers: list[tuple[str, Callable[[Any, bool], Callable[[], list] | None]]] = []
        seen: dict[Device, int] = {}
        for device in pool:
            replica = seen[device] = seen.get(device, -1) + 1
            label = f"device {device.index[0]}:{device.index[1]} {device.name}" + (
                f" (plan {replica + 1})" if pool.count(device) > 1 else ""
            )
            made: list = [0, None]  # the largest pass so far and its plan (made for this call)
            deferred: list = [None, None]  # a batch begun while holding that must wait, and its inputs

            def begin(
                batch: Any,
                holding: bool,
                device: Device = device,
                replica: int = replica,
                made: list = made,
                deferred: list = deferred,
            ) -> Callable[[], list] | None:
                # checked: every input of as many samples (once: a batch that had to wait comes again)
                xs = deferred[1] if deferred[0] is batch else prepare(batch)
                deferred[0] = deferred[1] = None
                m = xs[0].shape[0]
                if m == 0:
                    empty = self._no_samples(every_layer)
                    return lambda: empty
                size = self.max_batch(device, limit=step or m)  # found once per device and size
                if size > made[0]:
                    made[0], made[1] = size, None
                if made[1] is None:  # a plan to make waits for the device's locks: not while holding
                    if holding:
                        made[1] = self._kept_plan(made[0], device, every_layer, replica)
                    else:
                        made[1] = self.plan(made[0], device, every_layer, replica=replica)
                plan = made[1]
                if plan is not None and m <= size:
                    pending = plan.start(xs, blocking=not holding)
                    if pending is not None:  # (not holding: always)
                        return pending.result
                if holding:  # it would wait (a plan to make, a lock, passes one after another): begun
                    deferred[0], deferred[1] = batch, xs  # again once the passes in flight are taken
                    return None
                assert plan is not None  # made above, not holding; the batch takes several passes
                parts = [plan.run([a[s : s + size] for a in xs]) for s in range(0, m, size)]
                joined = [np.concatenate(p, axis=0) for p in zip(*parts)]
                return lambda: joined

            workers.append((label, begin))
        return workers

    def _converted(self, xs: list) -> list:
        """The inputs ``_check_inputs(x, convert=False)`` returned, or a batch of them, as the plan
        takes them: C-contiguous float32, each after its input's cast."""
        return [self._contiguous(a, cast) for a, cast in zip(xs, self._input_casts())]

    def _input_casts(self) -> list:
        """Per input, the cast to its dtype (``KerasTensor.cast``) or None."""
        raise NotImplementedError

    def _no_samples(self, every_layer: bool) -> list:
        """The outputs of a prediction of no samples: zero-sample float32 arrays of the outputs' shapes."""
        return [np.zeros((0,) + tuple(s[1:]), np.float32) for s in self._output_shapes(every_layer)]

    def _remember(self, call: LastCall) -> None:
        """Keeps ``call`` among the recent one-pass calls (the oldest dropped beyond
        :data:`RECENT_CALLS_KEPT`)."""
        with self._lock:
            recent = dict(self._recent)  # a new dict: a reader's get never sees one being changed
            recent.pop(call[1], None)
            recent[call[1]] = call
            while len(recent) > RECENT_CALLS_KEPT:
                del recent[next(iter(recent))]
            self._recent = recent

    def _last_serves(self, last: LastCall, device: Device) -> bool:
        """Whether a recent one-pass call's plan (``_recent``) still serves a call on ``device``: the
        same device, model state, precision and device limits."""
        return (
            last[0] is device
            and last[2] == self._stamp()
            and last[4].precision == self._precision
            and last[3] == (device.max_allocation, device.global_memory)
        )

    @staticmethod
    def _as_float32(x: Any, who: str) -> np.ndarray:
        """``x`` as a numeric numpy array (not yet checked for shape), or a ValueError naming ``who``."""
        if not isinstance(x, np.ndarray):
            try:
                x = np.asarray(x)
            except Exception as exc:  # ragged lists and the like
                raise ValueError(f"The data given for {who} could not be read as an array: {exc}") from None
        if x.dtype.kind not in "biuf":
            raise ValueError(f"The data given for {who} must be numeric, got dtype {x.dtype} with shape {x.shape}")
        return x

    @staticmethod
    def _ndim(item: Any, who: str) -> int:
        """``np.ndim`` of one item of a list given as input, or the ValueError of :meth:`_as_float32`."""
        try:
            return np.ndim(item)
        except Exception as exc:  # a ragged list
            raise ValueError(f"The data given for {who} could not be read as an array: {exc}") from None

    @staticmethod
    def _conformable(ndim: int, sample: tuple) -> bool:
        """Whether one array of ``ndim`` axes is a batch for samples of shape ``sample`` once its rank is
        adjusted (:meth:`_conformed`): a batch of scalars for a sample of one feature, ``(1,)``."""
        return ndim == len(sample) and len(sample) > 0 and sample[-1] == 1

    @staticmethod
    def _conformed(x: np.ndarray, shape: tuple) -> np.ndarray:
        """``x`` given for an input of ``shape`` (batch axis first), its rank adjusted as Keras's
        models adjust it: one axis fewer where the input's last size is 1 (a batch of scalar
        features for ``Input((1,))``) gets that axis; one more, of size 1 last, loses it."""
        if x.ndim == len(shape) - 1 and shape[-1] == 1:
            return x[..., None]
        if x.ndim == len(shape) + 1 and x.shape[-1] == 1:
            return x[..., 0]
        return x

    @staticmethod
    def _one_sample_hint(given: tuple, sample: tuple | None, was_array: bool) -> str:
        """The fix for an input of shape ``given`` refused where samples have shape ``sample``
        (None: an unbuilt model, which takes any sample of one axis or more) when ``given`` is one
        sample without its batch axis: ``; it looks like one sample without its batch axis: pass
        x[None] or x.reshape(1, 64)`` (``np.asarray(x)[None]`` for a list, ``was_array`` False); else ''."""
        if sample is not None and tuple(given) != tuple(sample):
            return ""
        if sample is None and len(given) != 1:
            return ""
        shape = ", ".join(str(d) for d in given)
        fix = f"x[None] or x.reshape(1, {shape})" if was_array else "np.asarray(x)[None]"
        return f"; it looks like one sample without its batch axis: pass {fix}"

    @staticmethod
    def _contiguous(x: np.ndarray, cast: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
        """``x`` as a C-contiguous float32 array, after its input's cast (``KerasTensor.cast``:
        Keras's cast to the Input's dtype, chosen when the input was made), where it has one."""
        if cast is not None:
            x = cast(x)
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)
        return x

    def called_on(self, x: Any, training: bool | None = None) -> Any:
        """``x``, checked as a model call's input: Keras code calls a model as ``model(x)`` or
        ``model(x, training=False)``.

        Raises:
            ValueError: ``training`` is true (malinn runs inference: Dropout is dropped, a
                BatchNormalization uses its moving statistics), or ``x`` is a symbolic tensor (a
                model is not nested in another by calling it: add its layers to the new model, or
                convert a Keras model that nests it).
        """
        if training:
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: malinn runs inference only; call it with training=False or None"
            )
        items = list(x.values()) if isinstance(x, dict) else list(x) if isinstance(x, (list, tuple)) else [x]
        if any(isinstance(item, KerasTensor) for item in items):
            raise ValueError(
                f"{type(self).__name__} {self.name!r} cannot be called on symbolic tensors: malinn does "
                f"not nest a model in another by hand; call its layers on the tensor, or convert the "
                f"Keras model that nests it (malinn convert)"
            )
        return x
