"""Large predict bodies parsed (and large answers encoded) in worker processes, so that a
multi-core host parses many at once.

Reading a request's JSON (``json.loads``, then the nested lists to a float32 array) holds Python's
GIL: in the server's process one body is parsed at a time, whatever the cores, and a body of
hundreds of kilobytes (an image: MobileNetV2's 96 x 96 x 3 is 580 KB of decimal text) costs more
than running its model in a batch. A :class:`ParsePool` of spawned processes parses such bodies
in parallel and sends back the arrays (a pickled array is a copy of its bytes) or the very
:class:`~malinn.serve.payload.BadRequest` the server's own parse raises, so that an answer does
not depend on where its body was parsed. An answer of many numbers (the config's
``ENCODE_WORKER_MIN_VALUES``: a classifier's 1,000 classes; ``ENCODE_WORKER_MIN_VALUES_ORJSON``
where orjson writes answers) is written as JSON there too.

A worker imports this module and :mod:`malinn.serve.payload` (numpy) only: never the model, the
device or OpenCL. It ignores the signals a service manager or a Ctrl-C sends the whole group, the
server stopping it once the requests in flight are answered (:mod:`malinn.serve.worker_process`).
A worker that dies (killed, out of memory) breaks the pool: the requests its workers held are
answered 503 (:class:`WorkerLost`) and a new pool takes the next ones.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from .payload import PredictRequest, encode_predict, parse_predict
from .signature import Signature
from .worker_process import worker_started

__all__ = ["ParsePool", "WorkerLost"]


class WorkerLost(Exception):
    """A parse worker exited while it held the request (503, TensorFlow Serving's UNAVAILABLE)."""


def _worker_pid() -> int:
    return os.getpid()


class ParsePool:
    """``workers`` processes parsing predict bodies, started with :meth:`start`.

    Args:
        workers: the number of processes (>= 1).
        on_restart: called, in the thread that found the pool broken, each time a broken pool is
            replaced.
    """

    def __init__(self, workers: int, on_restart: Callable[[], None] | None = None):
        if workers < 1:
            raise ValueError(f"a parse pool needs at least one worker, got {workers}")
        self.workers = workers
        self._on_restart = on_restart
        self._lock = threading.Lock()
        self._executor: ProcessPoolExecutor | None = None
        self._stopped = False

    def _new_executor(self) -> ProcessPoolExecutor:
        executor = ProcessPoolExecutor(
            self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=worker_started,
            initargs=(os.getpid(),),
        )
        for _ in range(self.workers):  # a worker is spawned per task while none is idle: all start now
            executor.submit(_worker_pid)
        return executor

    def start(self) -> None:
        """Starts the workers (each imports the parser) without waiting for them."""
        with self._lock:
            if self._executor is None and not self._stopped:
                self._executor = self._new_executor()

    def pids(self, timeout: float = 60.0) -> set:
        """The process ids of the workers now (each answers one call; waits for them to start)."""
        executor = self._current()
        futures = [executor.submit(_worker_pid) for _ in range(4 * self.workers)]
        return {f.result(timeout) for f in futures}

    def _current(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._stopped:
                raise RuntimeError("the parse pool is shut down")
            if self._executor is None:
                self._executor = self._new_executor()
            return self._executor

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        """A new pool in place of ``broken`` (once, whoever notices first)."""
        with self._lock:
            if self._executor is not broken or self._stopped:
                return
            self._executor = self._new_executor()
        broken.shutdown(wait=False, cancel_futures=True)
        if self._on_restart is not None:
            self._on_restart()

    def submit(self, function: Callable, *args: object) -> tuple[Future, ProcessPoolExecutor]:
        """``function(*args)`` sent to a worker: its future, and the pool."""
        executor = self._current()
        try:
            return executor.submit(function, *args), executor
        except BrokenProcessPool:  # a worker died before this request came: it goes to a new pool
            self._replace(executor)
            executor = self._current()
            return executor.submit(function, *args), executor

    def _lost(self, executor: ProcessPoolExecutor, body: bytes) -> WorkerLost:
        self._replace(executor)
        return WorkerLost(
            f"a request parse worker exited while it held this request ({len(body)} bytes); "
            f"the workers were restarted: try again"
        )

    async def parse(self, body: bytes, signature: Signature) -> PredictRequest:
        """``payload.parse_predict(body, signature)`` in a worker.

        Raises:
            BadRequest: as ``parse_predict`` raises it, the same message.
            WorkerLost: the worker exited while it held the body (the pool is replaced).
        """
        future, executor = self.submit(parse_predict, body, signature)
        try:
            return await asyncio.wrap_future(future)
        except BrokenProcessPool:
            raise self._lost(executor, body) from None

    async def encode(self, outputs: list, signature: Signature, columnar: bool) -> bytes:
        """``payload.encode_predict(outputs, signature, columnar)`` in a worker (in this thread
        where the worker exits meanwhile: the outputs are the server's own, nothing to fear)."""
        future, executor = self.submit(encode_predict, outputs, signature, columnar)
        try:
            return await asyncio.wrap_future(future)
        except BrokenProcessPool:
            self._replace(executor)
            return encode_predict(outputs, signature, columnar)

    def parse_now(self, body: bytes, signature: Signature, timeout: float | None = None) -> PredictRequest:
        """:meth:`parse`, waited for in this thread."""
        future, executor = self.submit(parse_predict, body, signature)
        try:
            return future.result(timeout)
        except BrokenProcessPool:
            raise self._lost(executor, body) from None

    def shutdown(self) -> None:
        """Ends the workers once they finished what they hold; no parse is taken after."""
        with self._lock:
            self._stopped = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
