"""A prediction's batches spread over devices: one worker per device listed (each with a plan of its
own: a device listed twice has two), every worker's pass enqueued by the calling thread before it
waits for the first of them, results handed back with their batch's index, so that they are stored
in order.

One thread drives every device: it starts a pass on each worker (:meth:`Plan.start`: the uploads
and launches enqueued, nothing waited for), then takes the oldest pass's result and gives that
worker the next batch, so each device always has a pass in flight while the others' run. On two
H200s, a thread per device made short passes slower than one device (each thread's enqueues waited
on the other's in the driver), where one thread enqueuing both ran them at once
(``benchmarks/throughput.py --devices 2``).

A pass in flight holds its plan's lock, so a worker never waits for a lock while others' passes are
in flight: where it would (another thread's pass on that plan, a plan still to be made), it says so,
the passes in flight are taken first, and it begins again, free to wait. Two threads spreading over
the same devices thus take turns and never wait for each other. The input is drawn from its source
one batch per worker at a time: memory holds at most one batch per device beside the results.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import NoReturn

__all__ = ["spread"]

#: a worker's ``begin(batch, holding)``: starts the batch's pass and returns what waits for its
#: outputs; None where ``holding`` (other passes in flight) and starting would wait for a lock
Begin = Callable[[object, bool], "Callable[[], list] | None"]


def _named(error: BaseException, label: str) -> BaseException:
    """``error`` with the device ``label`` before its message where the message does not name it
    (the same type, the original as its cause), else ``error`` itself."""
    if label in str(error) or not isinstance(error, Exception):
        return error
    try:
        named = type(error)(f"{label}: {error}")
    except Exception:  # a type whose constructor takes other arguments
        return error
    named.__cause__ = error
    return named


def _raise_named(error: Exception, label: str | None) -> NoReturn:
    """Raises ``error`` (in the ``except`` clause that caught it), named by ``label`` where given."""
    named = error if label is None else _named(error, label)
    if named is error:
        raise error
    raise named


def spread(items: Iterable, workers: list, deliver: Callable[[int, int, list], None]) -> None:
    """Runs every item of ``items`` on one of ``workers`` and hands each result to ``deliver``.

    Args:
        items: ``(index, start, batch)`` tuples (drawn lazily, one per worker ahead).
        workers: ``(label, begin)`` pairs: ``begin(batch, holding)`` starts the batch's pass on
            the worker's device and returns a callable that waits for it and returns the batch's
            outputs, or None where ``holding`` (passes are in flight) and it would have to wait for
            a lock (then the passes in flight are taken and it is called again, not holding);
            ``label`` names the device in an error raised there (where there are several).
        deliver: called as ``deliver(index, start, outputs)`` for each batch, in the order the
            batches were drawn.

    Raises:
        Whatever a worker raised (its message prefixed with the device's label where there are
        several), or what ``items`` raised, as it was; the passes in flight are waited for first.
    """
    source: Iterator = iter(items)
    several = len(workers) > 1
    in_flight: deque = deque()  # (worker, index, start, wait), the oldest first

    def take(entry: tuple) -> None:
        worker, index, start, wait = entry
        try:
            outputs = wait()
        except Exception as exc:
            _raise_named(exc, worker[0] if several else None)
        deliver(index, start, outputs)

    def started(worker: tuple[str, Begin], batch: object, holding: bool) -> Callable[[], list] | None:
        try:
            return worker[1](batch, holding)
        except Exception as exc:
            _raise_named(exc, worker[0] if several else None)

    def begin(worker: tuple[str, Begin]) -> None:
        item = next(source, None)
        if item is None:
            return
        index, start, batch = item
        wait = started(worker, batch, bool(in_flight))
        if wait is None:  # it would wait for a lock: the passes in flight first, then free to
            while in_flight:
                take(in_flight.popleft())
            wait = started(worker, batch, False)
        assert wait is not None  # not holding, a worker starts its pass
        in_flight.append((worker, index, start, wait))

    try:
        for worker in workers:
            begin(worker)
        while in_flight:
            entry = in_flight.popleft()
            take(entry)
            begin(entry[0])
    finally:
        while in_flight:  # what failed or was interrupted here: the passes enqueued end first
            try:
                in_flight.popleft()[3]()
            except Exception:  # noqa: S110 - the first failure is the one raised
                pass
