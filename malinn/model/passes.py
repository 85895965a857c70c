"""A prediction's batches spread over devices: one worker per device listed (each with a plan of its
own: a device listed twice has two), one thread each where there are several, results handed back
in the calling thread with their batch's index, so that they are stored in order whatever device
finished first.

A driver's wait for a pass (pyopencl's) releases the GIL, so the threads of several GPUs keep them
busy at once. The input is drawn from its source under a lock, one batch per worker at a time:
memory holds at most one batch per device beside the results.

The threads outlive a call: an idle one waits for the next (at most :data:`_IDLE_KEPT` wait), so that
a predict of a few milliseconds over several GPUs does not also start its threads each time. A
process forked from this one starts its own (the parent's do not exist in the child).
"""

from __future__ import annotations

import functools
import os
import queue
import threading
from collections.abc import Callable, Iterable

__all__ = ["spread"]

_RESULT, _FAILED, _SOURCE_FAILED, _DONE = range(4)

#: idle worker threads kept for the next call (more exit once their call is done)
_IDLE_KEPT = 16

_idle: list[queue.SimpleQueue] = []  # the inboxes of this process's idle threads
_idle_lock = threading.Lock()


def _forget_parent_threads() -> None:
    """In a forked child: none of the parent's threads exist, and its lock may have been held."""
    global _idle_lock
    _idle_lock = threading.Lock()
    _idle.clear()


os.register_at_fork(after_in_child=_forget_parent_threads)


def _serve(inbox: queue.SimpleQueue) -> None:
    """An idle-kept thread's life: runs each job put in its inbox, then waits as idle again (or
    exits, where :data:`_IDLE_KEPT` already wait)."""
    while True:
        name, job = inbox.get()
        threading.current_thread().name = name
        job()
        del job
        with _idle_lock:
            if len(_idle) >= _IDLE_KEPT:
                return
            _idle.append(inbox)


def _in_thread(job: Callable[[], None], name: str) -> None:
    """Runs ``job()`` in a worker thread named ``name``: an idle one of this process, else a new
    one. ``job`` must not raise (a spread's loop puts what it raised in its results)."""
    with _idle_lock:
        inbox = _idle.pop() if _idle else None
    if inbox is None:
        inbox = queue.SimpleQueue()
        threading.Thread(target=_serve, args=(inbox,), name=name, daemon=True).start()
    inbox.put((name, job))


class _SourceError(Exception):
    """What the input's iterable raised while a worker drew from it (raised again as it was)."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


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


def spread(items: Iterable, workers: list, deliver: Callable[[int, int, list], None]) -> None:
    """Runs every item of ``items`` on one of ``workers`` and hands each result to ``deliver``.

    Args:
        items: ``(index, start, batch)`` tuples (drawn lazily, under a lock where several workers
            draw).
        workers: ``(label, work)`` pairs: ``work(batch)`` returns the batch's outputs; ``label``
            names the device in an error raised there.
        deliver: called in this thread as ``deliver(index, start, outputs)`` for each batch, in the
            order the batches finish.

    Raises:
        Whatever a worker raised (its message prefixed with the device's label where there are
        several), or what ``items`` raised, as it was; the other workers finish their current
        batch and stop first.
    """
    if len(workers) == 1:
        _, work = workers[0]
        for index, start, batch in items:
            deliver(index, start, work(batch))
        return
    source, lock, stop = iter(items), threading.Lock(), threading.Event()
    results: queue.Queue = queue.Queue()

    def draw():
        with lock:
            if stop.is_set():
                return None
            try:
                return next(source, None)
            except BaseException as exc:
                raise _SourceError(exc) from exc

    def loop(label: str, work: Callable[[list], object]) -> None:
        try:
            while (item := draw()) is not None:
                index, start, batch = item
                results.put((_RESULT, (index, start), work(batch)))
                del item, batch
        except _SourceError as exc:
            stop.set()
            results.put((_SOURCE_FAILED, label, exc.error))
        except BaseException as exc:
            stop.set()
            results.put((_FAILED, label, exc))
        finally:
            results.put((_DONE, label, None))

    running, failure = 0, None
    try:
        for i, (label, work) in enumerate(workers):
            _in_thread(functools.partial(loop, label, work), f"malinn-predict-{i}")
            running += 1
        while running:
            try:
                kind, what, value = results.get(timeout=0.5)  # a timeout: Ctrl-C is taken while waiting
            except queue.Empty:
                continue
            if kind == _DONE:
                running -= 1
            elif kind == _RESULT:
                if failure is None:
                    deliver(what[0], what[1], value)
            elif failure is None:
                failure = value if kind == _SOURCE_FAILED else _named(value, what)
    finally:
        stop.set()  # what failed or was interrupted here: the workers end their current batch
        while running:
            if results.get()[0] == _DONE:
                running -= 1
    if failure is not None:
        raise failure
