"""Dynamic batching: the requests to one model version merged into one predict call.

One worker thread per model version calls ``predict``; requests wait in a bounded queue. When the
model is free the worker takes the queued requests up to ``max_batch_size`` samples (after waiting
up to ``batch_timeout_micros`` from the first one's arrival for more), stacks each input, pads the
stack with zero samples up to the next allowed batch size (so that a model runs a few plans, made
at load time, not one per total), runs one ``predict`` and gives each request its own rows of the
outputs. A request of more samples than ``max_batch_size`` runs alone, in calls of that size.

The queue holds at most ``max_enqueued_batches * max_batch_size`` samples; a request beyond is
refused at once (:class:`Overloaded`, answered 503), so that a server under more load than it can
answer says so instead of answering everything late. A request whose client went away
(:meth:`Task.cancel`) or whose deadline passed before its turn is dropped unrun.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from .config import BatchingParameters

__all__ = ["Batcher", "Task", "Overloaded", "Retired", "Cancelled", "DeadlineExceeded", "Unavailable"]


class Overloaded(Exception):
    """The queue is full (503, TensorFlow Serving's UNAVAILABLE)."""


class Retired(Exception):
    """The model version stopped taking requests (it is being unloaded): ask the newest version."""


class Unavailable(Exception):
    """No version can take the request now, or the process running the model is gone (503,
    TensorFlow Serving's UNAVAILABLE); the message says which."""


class Cancelled(Exception):
    """The client went away before the request's turn: it was not run."""


class DeadlineExceeded(Exception):
    """The request's time limit passed before its turn (504, TensorFlow Serving's DEADLINE_EXCEEDED)."""


class Task:
    """One request in the queue: its input arrays (batch first, float32), sample count, deadline
    (``time.monotonic()`` seconds, or None) and ``done(outputs, error)``, called once from the
    worker thread with the request's own output arrays or the exception that ended it.

    A task with a ``sink`` is answered with the others of its call instead: the worker calls
    ``sink(outputs, answered, failed)`` once per predict call with the call's whole outputs,
    ``[(task, first row), ...]`` of the tasks of that sink it answered (in the outputs' order)
    and ``[(task, exception), ...]`` of those that ended otherwise (the process of
    ``--http-workers`` sends a front all its answers of a call in one message); ``tag`` is the
    sink's own (the request's id there).

    After it ran, ``batch`` is the number of samples of the predict call it ran in and
    ``queued_s`` the seconds it waited for it.
    """

    __slots__ = (
        "arrays",
        "samples",
        "deadline",
        "done",
        "cancelled",
        "enqueued",
        "batch",
        "queued_s",
        "sink",
        "tag",
    )

    def __init__(
        self,
        arrays: list,
        samples: int,
        done: Callable | None,
        deadline: float | None = None,
        sink: Callable[[list, list, list], None] | None = None,
        tag: object = None,
    ):
        self.arrays, self.samples, self.done, self.deadline = arrays, samples, done, deadline
        self.cancelled, self.enqueued, self.batch, self.queued_s = False, 0.0, 0, 0.0
        self.sink, self.tag = sink, tag

    def cancel(self) -> None:
        """Marks the request as no longer wanted: the worker drops it unrun if it has not started."""
        self.cancelled = True

    def _finish(self, outputs: list | None, error: BaseException | None) -> None:
        try:
            if self.done is not None:
                self.done(outputs, error)
        except Exception:  # a callback's own failure must not stop the worker
            pass


class Batcher:
    """The queue and worker thread of one model version.

    Args:
        predict: runs a list of input arrays (batch first) and returns a list of output arrays.
        params: the batching parameters.
        name: the version's name, for the thread (``digits/3``).
        observe: called after each predict call with ``(samples, padded_to)``.
    """

    def __init__(
        self, predict: Callable[[list], list], params: BatchingParameters, name: str, observe: Callable | None = None
    ):
        self._predict, self.params, self.name, self._observe = predict, params, name, observe
        self._sizes = params.sizes()
        self._queue: deque = deque()
        self._queued = 0  # samples in the queue
        self._cond = threading.Condition()
        self._stopping = False
        self.running = 0  # requests in the predict call under way
        self._thread = threading.Thread(target=self._loop, name=f"malinn-serve {name}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the callers' side
    def submit(self, task: Task) -> None:
        """Queues ``task``.

        Raises:
            Overloaded: the queue cannot take its samples (a request is taken whatever its size
                when the queue is empty).
            Retired: the version is stopping.
        """
        with self._cond:
            if self._stopping:
                raise Retired(self.name)
            if self._queue and self._queued + task.samples > self.params.queue_capacity:
                raise self._full()
            task.enqueued = time.monotonic()
            self._queue.append(task)
            self._queued += task.samples
            self._cond.notify()

    def submit_many(self, tasks: list) -> list:
        """Queues ``tasks`` in order, waking the worker once; returns ``(task, exception)`` for each
        one refused (Overloaded, as :meth:`submit`; every one Retired where the version is stopping)."""
        refused = []
        with self._cond:
            if self._stopping:
                return [(task, Retired(self.name)) for task in tasks]
            capacity, now = self.params.queue_capacity, time.monotonic()
            for task in tasks:
                if self._queue and self._queued + task.samples > capacity:
                    refused.append((task, self._full()))
                    continue
                task.enqueued = now
                self._queue.append(task)
                self._queued += task.samples
            if len(refused) < len(tasks):
                self._cond.notify()
        return refused

    def _full(self) -> Overloaded:
        return Overloaded(
            f"the queue of {self.name} is full ({self._queued} samples of "
            f"{self.params.queue_capacity} queued, {len(self._queue)} requests)"
        )

    def withdraw(self, task: Task) -> None:
        """Takes ``task`` out of the queue (its client went away, or its time is up): it frees its
        place at once and is never run. A task already taken for a call is only marked."""
        task.cancel()
        with self._cond:
            try:
                self._queue.remove(task)
            except ValueError:  # taken for a call, or never queued
                return
            self._queued -= task.samples
            self._cond.notify()

    def depth(self) -> int:
        """The requests waiting for their turn."""
        return len(self._queue)

    def stop(self, timeout: float | None = None) -> bool:
        """Takes no more requests, answers those queued, and ends the worker; whether it ended
        within ``timeout`` seconds."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # ------------------------------------------------------------------ the worker
    def _loop(self) -> None:
        while True:
            tasks = self._next_batch()
            if tasks is None:
                return
            self._run(tasks)

    def _next_batch(self) -> list | None:
        limit = self.params.batch_limit
        wait = self.params.batch_timeout_micros / 1e6 if self.params.enabled else 0.0
        with self._cond:
            while True:
                while not self._queue:
                    if self._stopping:
                        return None
                    self._cond.wait()
                if not wait:
                    break
                first = self._queue[0]
                until = first.enqueued + wait
                while (
                    self._queue
                    and self._queue[0] is first
                    and self._queued < limit
                    and not self._stopping
                    and (left := until - time.monotonic()) > 0
                ):
                    self._cond.wait(left)
                if self._queue and self._queue[0] is first:
                    break  # else the first was withdrawn: the next one's own wait begins
            batch = [self._queue.popleft()]
            total = batch[0].samples
            while self._queue and total + self._queue[0].samples <= limit:
                total += self._queue[0].samples
                batch.append(self._queue.popleft())
            self._queued -= total
            self.running = len(batch)
            return batch

    def _run(self, tasks: list) -> None:
        now = time.monotonic()
        live = []
        outputs: list = []
        sinks: dict = {}  # sink -> ([(task, first row)] answered, [(task, exception)] failed) of this call

        def fail(task: Task, error: BaseException) -> None:
            if task.sink is None:
                task._finish(None, error)
            else:
                sinks.setdefault(task.sink, ([], []))[1].append((task, error))

        for task in tasks:
            if task.cancelled:
                fail(task, Cancelled())
            elif task.deadline is not None and now > task.deadline:
                fail(task, DeadlineExceeded())
            else:
                task.queued_s = now - task.enqueued
                live.append(task)
        try:
            if not live:
                return
            total = sum(t.samples for t in live)
            inputs = [t.arrays for t in live]
            stacked = inputs[0] if len(live) == 1 else [np.concatenate(parts) for parts in zip(*inputs)]
            try:
                outputs = self._call(stacked, total)
            except Exception as exc:  # the device failed: every request of the call is told
                for task in live:
                    fail(task, exc)
                return
            start = 0
            for task in live:
                task.batch = total
                if task.sink is None:
                    task._finish([out[start : start + task.samples] for out in outputs], None)
                else:
                    sinks.setdefault(task.sink, ([], []))[0].append((task, start))
                start += task.samples
        finally:
            for sink, (answered, failed) in sinks.items():
                try:
                    sink(outputs, answered, failed)
                except Exception:  # a sink's own failure must not stop the worker
                    pass
            with self._cond:
                self.running = 0

    def _call(self, arrays: list, n: int) -> list:
        """The outputs for ``n`` samples: one padded call, or calls of the largest size for more
        (without batching: the request's own call, as it came)."""
        if not self.params.enabled:
            outputs = self._predict(arrays)
            if self._observe is not None:
                self._observe(n, n)
            return outputs
        largest = self._sizes[-1]
        if n > largest:
            parts = [
                self._call([a[i : i + largest] for a in arrays], min(largest, n - i)) for i in range(0, n, largest)
            ]
            return [np.concatenate(chunks) for chunks in zip(*parts)]
        size = next(s for s in self._sizes if s >= n)
        if size > n:
            arrays = [np.concatenate([a, np.zeros((size - n,) + a.shape[1:], a.dtype)]) for a in arrays]
        outputs = self._predict(arrays)
        if self._observe is not None:
            self._observe(n, size)
        return [out[:n] for out in outputs] if size > n else outputs
