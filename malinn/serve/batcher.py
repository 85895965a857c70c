"""Dynamic batching: the requests to one model version merged into one predict call.

One worker thread per model version calls ``predict``; requests wait in a bounded queue. When the
model is free the worker takes the queued requests up to ``max_batch_size`` samples (after waiting
up to ``batch_timeout_micros`` from the first one's arrival for more), stacks each input, pads the
stack with zero samples up to the next allowed batch size (so that a model runs a few plans, made
at load time, not one per total), runs one ``predict`` and gives each request its own rows of the
outputs. A request of more samples than ``max_batch_size`` runs alone, in calls of that size.

The queue holds single requests (:class:`Task`) and groups of requests whose inputs arrived
stacked (:class:`Group`: a front's requests of one message, ``--http-workers``), which the worker
takes whole, or splits where a call has room for their leading requests alone; either way each
request is answered, refused or dropped on its own.

The queue holds at most ``max_enqueued_batches * max_batch_size`` samples; a request beyond is
refused at once (:class:`Overloaded`, answered 503), so that a server under more load than it can
answer says so instead of answering everything late. A request whose client went away
(:meth:`Batcher.withdraw`) or whose deadline passed before its turn is dropped unrun.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from itertools import accumulate

import numpy as np

from .config import BatchingParameters

__all__ = [
    "Batcher",
    "Task",
    "Group",
    "Overloaded",
    "Retired",
    "Cancelled",
    "DeadlineExceeded",
    "Unavailable",
]


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

    After it ran, ``batch`` is the number of samples of the predict call it ran in and
    ``queued_s`` the seconds it waited for it.
    """

    __slots__ = ("arrays", "samples", "deadline", "done", "cancelled", "enqueued", "batch", "queued_s")

    def __init__(self, arrays: list, samples: int, done: Callable | None, deadline: float | None = None):
        self.arrays, self.samples, self.done, self.deadline = arrays, samples, done, deadline
        self.cancelled, self.enqueued, self.batch, self.queued_s = False, 0.0, 0, 0.0

    def cancel(self) -> None:
        """Marks the request as no longer wanted: the worker drops it unrun if it has not started."""
        self.cancelled = True

    def _finish(self, outputs: list | None, error: BaseException | None) -> None:
        try:
            if self.done is not None:
                self.done(outputs, error)
        except Exception:  # a callback's own failure must not stop the worker
            pass


class Group:
    """Requests queued as one unit: their input arrays stacked (``arrays``, batch first, the
    requests' rows in order), each request's id (``keys``), sample count (``counts``, 1 or more)
    and deadline (``deadlines``, ``time.monotonic()`` seconds).

    The worker takes a group whole into a call, or its leading requests where the call has room
    for those alone (the rest wait, first in the queue); a request withdrawn while its group waits
    leaves it at once (its rows dropped), one whose deadline passed is dropped when its call
    starts. Once per predict call the worker calls ``sink(outputs, answered, failed)`` with the
    call's whole outputs, ``[(group, first row), ...]`` of that sink's groups it ran (in the
    outputs' order: a group's rows are its requests' in order) and ``[(group, key, exception),
    ...]`` of its requests that ended otherwise. ``number`` is the version's, for the sink;
    ``owner`` is a set that holds the group (and each part split from it) until its call ended or
    it left the queue; ``batcher`` the one that queued it.

    After it ran, ``batch`` is the number of samples of the predict call it ran in and
    ``queued_s`` the seconds it waited for it.
    """

    __slots__ = (
        "arrays",
        "keys",
        "counts",
        "deadlines",
        "samples",
        "earliest",
        "sink",
        "number",
        "owner",
        "batcher",
        "enqueued",
        "queued",
        "cancelled",
        "batch",
        "queued_s",
    )

    def __init__(
        self,
        arrays: list,
        keys: list,
        counts: list,
        deadlines: list,
        sink: Callable[[list, list, list], None],
        number: int = 0,
        owner: set | None = None,
    ):
        self.arrays, self.keys, self.counts, self.deadlines = arrays, keys, counts, deadlines
        self.samples = sum(counts)
        self.earliest = min(deadlines)
        self.sink, self.number, self.owner = sink, number, owner
        self.batcher: Batcher | None = None
        self.enqueued, self.queued = 0.0, False
        self.cancelled: set | None = None  # keys withdrawn after the group was taken for a call
        self.batch, self.queued_s = 0, 0.0
        if owner is not None:
            owner.add(self)

    def member(self, index: int) -> "Group":
        """The request ``index`` as a group of its own."""
        start = sum(self.counts[:index])
        rows = slice(start, start + self.counts[index])
        return Group(
            [a[rows] for a in self.arrays],
            [self.keys[index]],
            [self.counts[index]],
            [self.deadlines[index]],
            self.sink,
            self.number,
            self.owner,
        )

    def keep(self, members: list) -> None:
        """Keeps the requests ``members`` (indices, ascending) alone, their rows re-stacked."""
        offsets = list(accumulate(self.counts, initial=0))
        rows = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in members])
        self.arrays = [a[rows] for a in self.arrays]
        self.keys = [self.keys[i] for i in members]
        self.counts = [self.counts[i] for i in members]
        self.deadlines = [self.deadlines[i] for i in members]
        self.samples = len(rows)
        self.earliest = min(self.deadlines)

    def take(self, room: int) -> "Group | None":
        """Splits off the leading requests whose samples fit ``room`` as a group of their own (None
        where the first does not); this group keeps the rest."""
        if self.samples == len(self.keys):  # one sample each
            count = rows = min(room, len(self.keys))
        else:
            offsets = list(accumulate(self.counts, initial=0))
            count = bisect_right(offsets, room) - 1
            rows = offsets[count]
        if count <= 0:
            return None
        head = Group(
            [a[:rows] for a in self.arrays],
            self.keys[:count],
            self.counts[:count],
            self.deadlines[:count],
            self.sink,
            self.number,
            self.owner,
        )
        head.batcher, head.enqueued = self.batcher, self.enqueued
        self.arrays = [a[rows:] for a in self.arrays]
        self.keys, self.counts, self.deadlines = self.keys[count:], self.counts[count:], self.deadlines[count:]
        self.samples -= rows
        self.earliest = min(self.deadlines)
        return head

    def release(self) -> None:
        """Leaves the owner's set: nothing of it waits any more."""
        if self.owner is not None:
            self.owner.discard(self)


class Batcher:
    """The queue and worker thread of one model version.

    Args:
        predict: runs a list of input arrays (batch first) and returns a list of output arrays.
        params: the batching parameters.
        name: the version's name, for the thread (``digits/3``).
        observe: called after each predict call with ``(samples, padded_to, seconds)``.
    """

    def __init__(
        self, predict: Callable[[list], list], params: BatchingParameters, name: str, observe: Callable | None = None
    ):
        self._predict, self.params, self.name, self._observe = predict, params, name, observe
        self._sizes = params.sizes()
        self._queue: deque = deque()  # Tasks and Groups
        self._queued = 0  # samples in the queue
        self._requests = 0  # requests in the queue
        self._cond = threading.Condition()
        self._stopping = False
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
                raise self._full(self._queued, self._requests)
            task.enqueued = time.monotonic()
            self._queue.append(task)
            self._queued += task.samples
            self._requests += 1
            self._cond.notify()

    def submit_group(self, group: Group) -> list:
        """Queues ``group``'s requests as one unit, waking the worker once; returns ``(key,
        Overloaded)`` for each request the queue could not take (as :meth:`submit`, in order:
        the group keeps the others).

        Raises:
            Retired: the version is stopping (nothing was queued).
        """
        refused = []
        with self._cond:
            if self._stopping:
                raise Retired(self.name)
            capacity = self.params.queue_capacity
            if self._queued + group.samples > capacity:  # the requests that fit, in order
                kept, queued, requests = [], self._queued, self._requests
                for i, count in enumerate(group.counts):
                    if requests and queued + count > capacity:
                        refused.append((group.keys[i], self._full(queued, requests)))
                    else:
                        kept.append(i)
                        queued += count
                        requests += 1
                if not kept:
                    group.release()
                    return refused
                group.keep(kept)
            group.batcher, group.enqueued, group.queued = self, time.monotonic(), True
            self._queue.append(group)
            self._queued += group.samples
            self._requests += len(group.keys)
            self._cond.notify()
        return refused

    def _full(self, queued: int, requests: int) -> Overloaded:
        return Overloaded(
            f"the queue of {self.name} is full ({queued} samples of "
            f"{self.params.queue_capacity} queued, {requests} requests)"
        )

    def withdraw(self, unit: Task | Group, key: object = None) -> bool:
        """Takes a request out of the queue (its client went away, or its time is up): it frees its
        place at once and is never run. ``unit`` is a Task, or the Group holding request ``key``
        (every request of it where None). A request already taken for a call is only marked.
        Returns whether the group holds ``key`` (a Task: True)."""
        if isinstance(unit, Task):
            unit.cancel()
            with self._cond:
                try:
                    self._queue.remove(unit)
                except ValueError:  # taken for a call, or never queued
                    return True
                self._queued -= unit.samples
                self._requests -= 1
                self._cond.notify()
            return True
        with self._cond:
            if key is not None and key not in unit.keys:
                return False
            if not unit.queued:  # taken for a call (or never queued): dropped when its call starts
                unit.cancelled = (unit.cancelled or set()) | ({key} if key is not None else set(unit.keys))
                return True
            if key is None or len(unit.keys) == 1:
                self._queue.remove(unit)
                self._queued -= unit.samples
                self._requests -= len(unit.keys)
                unit.queued = False
                unit.release()
            else:
                before = unit.samples
                unit.keep([i for i, k in enumerate(unit.keys) if k != key])
                self._queued -= before - unit.samples
                self._requests -= 1
            self._cond.notify()
        return True

    def depth(self) -> int:
        """The requests waiting for their turn."""
        return self._requests

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
            units = self._next_batch()
            if units is None:
                return
            self._run(units)

    def _next_batch(self) -> list | None:
        limit = self.params.batch_limit
        wait = self.params.batch_timeout_micros / 1e6 if self.params.enabled else 0.0
        queue = self._queue
        with self._cond:
            while True:
                while not queue:
                    if self._stopping:
                        return None
                    self._cond.wait()
                if not wait:
                    break
                first = queue[0]
                until = first.enqueued + wait
                while (
                    queue
                    and queue[0] is first
                    and self._queued < limit
                    and not self._stopping
                    and (left := until - time.monotonic()) > 0
                ):
                    self._cond.wait(left)
                if queue and queue[0] is first:
                    break  # else the first was withdrawn: the next one's own wait begins
            batch: list = []
            total = requests = 0
            while queue:
                unit = queue[0]
                room = limit - total
                if unit.samples <= room or (not batch and (isinstance(unit, Task) or len(unit.keys) == 1)):
                    # (a request larger than a call runs alone)
                    queue.popleft()
                    if isinstance(unit, Group):
                        unit.queued = False
                        requests += len(unit.keys)
                    else:
                        requests += 1
                    batch.append(unit)
                    total += unit.samples
                    continue
                if isinstance(unit, Group):  # its leading requests that fit (the first one alone if none), not all
                    head = unit.take(room if batch else max(room, unit.counts[0]))
                    if head is not None:
                        batch.append(head)
                        total += head.samples
                        requests += len(head.keys)
                break
            self._queued -= total
            self._requests -= requests
            return batch

    def _run(self, units: list) -> None:
        now = time.monotonic()
        live: list[Task | Group] = []
        outputs: list = []
        sinks: dict = {}  # sink -> ([(group, first row)] run, [(group, key, exception)] failed) of this call

        def fail(unit: Task | Group, error: BaseException, keys: list | None = None) -> None:
            if isinstance(unit, Task):
                unit._finish(None, error)
            else:
                failed = sinks.setdefault(unit.sink, ([], []))[1]
                failed.extend((unit, key, error) for key in (unit.keys if keys is None else keys))

        for unit in units:
            if isinstance(unit, Group):
                if unit.cancelled or now > unit.earliest:
                    unit = self._drop(unit, now, fail)
                    if unit is None:
                        continue
                unit.queued_s = now - unit.enqueued
                live.append(unit)
            elif unit.cancelled:
                fail(unit, Cancelled())
            elif unit.deadline is not None and now > unit.deadline:
                fail(unit, DeadlineExceeded())
            else:
                unit.queued_s = now - unit.enqueued
                live.append(unit)
        try:
            if not live:
                return
            total = sum(u.samples for u in live)
            stacked = self._stack(live, total)
            try:
                outputs = self._call(stacked, total)
            except Exception as exc:  # the device failed: every request of the call is told
                for unit in live:
                    fail(unit, exc)
                return
            start = 0
            for unit in live:
                unit.batch = total
                if isinstance(unit, Group):
                    sinks.setdefault(unit.sink, ([], []))[0].append((unit, start))
                else:
                    unit._finish([out[start : start + unit.samples] for out in outputs], None)
                start += unit.samples
        finally:
            for unit in units:  # nothing of them waits any more
                if isinstance(unit, Group):
                    unit.release()
            for sink, (answered, failed) in sinks.items():
                try:
                    sink(outputs, answered, failed)
                except Exception:  # a sink's own failure must not stop the worker
                    pass

    def _stack(self, live: list, total: int) -> list:
        """The inputs of ``live``'s requests, their rows in order, as one array per input: copied
        once into an array of the call's padded size (its rows past ``total`` zero) where a single
        padded call runs them, a unit's own arrays where it runs alone unpadded."""
        size = total
        if self.params.enabled and total <= self._sizes[-1]:
            size = next(s for s in self._sizes if s >= total)
        if len(live) == 1 and size == total:
            return live[0].arrays
        stacked = []
        for parts in zip(*(u.arrays for u in live)):
            first = parts[0]
            out = np.empty((size,) + first.shape[1:], first.dtype)
            np.concatenate(parts, out=out[:total])
            out[total:] = 0
            stacked.append(out)
        return stacked

    @staticmethod
    def _drop(group: Group, now: float, fail: Callable) -> Group | None:
        """``group`` without its requests withdrawn or past their deadline (each failed), or None
        where none is left."""
        cancelled = group.cancelled or ()
        kept = []
        for i, (key, deadline) in enumerate(zip(group.keys, group.deadlines)):
            if key in cancelled:
                fail(group, Cancelled(), [key])
            elif now > deadline:
                fail(group, DeadlineExceeded(), [key])
            else:
                kept.append(i)
        if not kept:
            return None
        if len(kept) < len(group.keys):
            group.keep(kept)
        group.cancelled = None
        return group

    def _call(self, arrays: list, n: int) -> list:
        """The outputs for ``n`` samples (the first ``n`` rows of ``arrays``, padded or not): one
        padded call, or calls of the largest size for more (without batching: the request's own
        call, as it came)."""
        if not self.params.enabled:
            started = time.monotonic()
            outputs = self._predict(arrays)
            if self._observe is not None:
                self._observe(n, n, time.monotonic() - started)
            return outputs
        largest = self._sizes[-1]
        if n > largest:
            parts = [
                self._call([a[i : i + largest] for a in arrays], min(largest, n - i)) for i in range(0, n, largest)
            ]
            return [np.concatenate(chunks) for chunks in zip(*parts)]
        size = next(s for s in self._sizes if s >= n)
        if arrays[0].shape[0] < size:  # (stacked by _stack, the padding is there already)
            arrays = [np.concatenate([a, np.zeros((size - n,) + a.shape[1:], a.dtype)]) for a in arrays]
        started = time.monotonic()
        outputs = self._predict(arrays)
        if self._observe is not None:
            self._observe(n, size, time.monotonic() - started)
        return [out[:n] for out in outputs] if size > n else outputs
