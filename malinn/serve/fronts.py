"""The model process's side of ``--http-workers N``: N HTTP front processes on one port, and the
requests they send run here, where the device and the batchers are.

The listening socket is bound here and inherited by every front, which accepts its even share
of the connections (:mod:`malinn.serve.front_accept`: the fronts' counts are in an array made
here). A front parses the request's JSON and sends its
arrays over its pipe (:mod:`malinn.serve.front_link` lists the messages), the requests of one turn
of its event loop in one message, those of one model version stacked into one group; here one
thread reads every front's pipe (:class:`~malinn.serve.front_link.PipeReader`) and puts each group in its version's batcher as one unit
(:class:`~malinn.serve.batcher.Group`), whose worker sends each front the outputs of all its
requests of one predict call in one message, the rows of a group's requests as one slice. This
process never reads or writes JSON, and its work a message does not grow with the requests in it
(but where a request of a group ends alone: cancelled, refused, past its deadline).

* The version table and readiness are sent to every front whenever they change (looked at every
  20 ms), so that status, metadata and the choice of a request's version are answered in the front.
* A metrics scrape asks every front for its counts and merges them with the batches counted here.
* A front that exits (killed, out of memory) is started again with the same socket; the requests
  it had queued are withdrawn. ``malinn_serve_front_restarts_total`` counts it, and its counts as
  it last sent them stay in the sum (a counter that went back would read as a reset).
* :meth:`Fronts.stop` sends SIGTERM to each front, which answers what it holds and exits; the
  requests they send meanwhile are still run here.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .batcher import Cancelled, DeadlineExceeded, Group, Overloaded, Retired, Unavailable
from .config import ServeConfig
from .front_accept import ConnectionCounts
from .front_link import PipeReader, pack, unpack, write_message, writes_whole
from .front_process import run_front
from .metrics import Metrics
from .servables import ModelManager
from .version_table import NotFound

__all__ = ["Fronts"]

#: the exceptions a front raises as they are; any other (a device's error) goes as Failed
_SENT_AS_THEY_ARE = (NotFound, Overloaded, Unavailable, Cancelled, DeadlineExceeded)


class Failed(Exception):
    """A model process's error sent to a front: its type's name (``kind``) and its message."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind

    def __reduce__(self):
        return (Failed, (self.kind, str(self)))


def _sendable(error: BaseException) -> BaseException:
    if type(error) in _SENT_AS_THEY_ARE:
        return error
    return Failed(type(error).__name__, str(error))


class _Front:
    """One front process: its process, pipe, the groups of its requests queued here and whether it
    listens."""

    def __init__(self, index: int, process: Any, conn: Any):
        self.index, self.process, self.conn = index, process, conn
        self.whole = writes_whole(conn)
        self.lock = threading.Lock()
        self.groups: set = set()  # the groups of its requests queued or running (Group.owner)
        self.up = False
        self.gone = False
        self.counted: tuple | None = None  # its metrics as it last sent them (Metrics.snapshot)

    def answer(self, outputs: list, answered: list, failed: list) -> None:
        """A batcher's sink: the answers of one predict call to this front's requests, their rows
        of the call's ``outputs`` in one message (one slice where they are adjacent, as the
        groups of one message are), and each error in its own."""
        for _, key, error in failed:
            self.send(("error", key, _sendable(error)))
        if not answered:
            return
        parts = []
        first = end = answered[0][1]
        adjacent = True
        for group, start in answered:
            parts.append((group.keys, group.counts, group.number, group.batch, group.queued_s))
            adjacent = adjacent and start == end
            end = start + group.samples
        if adjacent:
            rows = [out[first:end] for out in outputs]
        else:
            rows = [
                np.concatenate([out[start : start + group.samples] for group, start in answered]) for out in outputs
            ]
        self.send(("done", parts, pack(rows)))

    def withdraw(self, key: object = None) -> None:
        """Takes request ``key`` (every request of this front where None) out of its queue."""
        for _ in range(2):  # a group split meanwhile holds the request in a part of its own
            for group in list(self.groups):
                batcher = group.batcher
                if batcher is None or (key is not None and key not in group.keys):
                    continue
                if batcher.withdraw(group, key) and key is not None:
                    return

    def send(self, message: tuple) -> bool:
        with self.lock:
            if self.gone:
                return False
            try:
                write_message(self.conn, message, self.whole)
                return True
            except (OSError, ValueError):
                return False


class Fronts:
    """The HTTP front processes of a server.

    Args:
        config: the server's configuration (``http_workers`` fronts).
        sock: the listening socket, inherited by every front.
        manager: the served models.
        metrics: this process's metrics (the batches).
        say: prints a line of news on stderr.
    """

    def __init__(
        self, config: ServeConfig, sock: Any, manager: ModelManager, metrics: Metrics, say: Callable[[str], None]
    ):
        self.config, self.sock, self.manager, self.metrics, self._say = config, sock, manager, metrics, say
        self._context = multiprocessing.get_context("spawn")
        self._fronts: list = [None] * config.http_workers
        self._lock = threading.Lock()
        self._stopping = False
        self._dumps: dict = {}  # scrape id -> (event, replies, fronts asked)
        self._exited = Metrics()  # the counts of the fronts that exited, as they last sent them
        self._ids = itertools.count()
        self._table = ""  # the table last sent, as text
        self._stop = threading.Event()
        self._pipes = PipeReader(self._handle, self._gone, "malinn-serve front links")  # one thread reads every pipe
        self._counts = ConnectionCounts(self._context, config.http_workers)  # each front's connections

    # ------------------------------------------------------------------ processes
    def start(self) -> None:
        """Starts every front, and the thread sending them the version table."""
        for index in range(self.config.http_workers):
            self._start(index)
        threading.Thread(target=self._publish, name="malinn-serve version table", daemon=True).start()

    def _start(self, index: int) -> None:
        mine, theirs = self._context.Pipe()
        self._counts.starting(index)
        process = self._context.Process(
            target=run_front,
            args=(index, self.sock, theirs, self.config, os.getpid(), self._counts.array),
            name=f"malinn-serve front {index}",
            daemon=False,
        )
        process.start()
        theirs.close()
        front = _Front(index, process, mine)
        with self._lock:
            self._fronts[index] = front
        front.send(("table",) + self._current())
        self._pipes.add(mine, front)

    @property
    def all_up(self) -> bool:
        with self._lock:
            return all(f is not None and f.up for f in self._fronts)

    def pids(self) -> list:
        with self._lock:
            return [f.process.pid for f in self._fronts if f is not None]

    def stop(self, timeout: float) -> None:
        """Sends SIGTERM to every front and waits for each to answer what it holds and exit."""
        with self._lock:
            self._stopping = True
            fronts = [f for f in self._fronts if f is not None]
        self._stop.set()
        self.publish_now()
        for front in fronts:
            if front.process.is_alive():
                try:
                    os.kill(front.process.pid, signal.SIGTERM)
                except OSError:
                    pass
        end = time.monotonic() + timeout
        for front in fronts:
            front.process.join(max(end - time.monotonic(), 0.1))
            if front.process.is_alive():
                self._say(f"HTTP worker {front.index} (pid {front.process.pid}) did not stop in time: killed")
                front.process.kill()
                front.process.join(5)

    def kill(self) -> None:
        """Ends every front at once (a second Ctrl-C)."""
        with self._lock:
            self._stopping = True
            fronts = [f for f in self._fronts if f is not None]
        for front in fronts:
            if front.process.is_alive():
                front.process.kill()

    # ------------------------------------------------------------------ the version table
    def _current(self) -> tuple:
        manager = self.manager
        flags = {"initial": manager.initial.is_set(), "ready": manager.ready, "stopping": manager.stopping}
        return manager.snapshot(), flags

    def publish_now(self) -> None:
        """Sends the version table to every front where it changed since last sent."""
        table = self._current()
        key = repr((sorted((n, [r[:3] for r in rows]) for n, rows in table[0].items()), sorted(table[1].items())))
        if key == self._table:
            return
        self._table = key
        with self._lock:
            fronts = [f for f in self._fronts if f is not None]
        for front in fronts:
            front.send(("table",) + table)

    def _publish(self) -> None:
        while not self._stop.wait(0.02):
            self.publish_now()

    # ------------------------------------------------------------------ requests
    def _gone(self, front: _Front) -> None:
        """``front``'s pipe ended: handled in a thread of its own (it waits for the process to exit)."""
        threading.Thread(
            target=self._lost, args=(front,), name=f"malinn-serve front {front.index} lost", daemon=True
        ).start()

    def _handle(self, front: _Front, message: tuple) -> None:
        """One message of ``front``'s (:mod:`malinn.serve.front_link` lists them)."""
        kind = message[0]
        if kind == "predict":
            self._predict(front, message[1])
        elif kind == "cancel":
            front.withdraw(message[1])
        elif kind == "metrics":
            threading.Thread(target=self._scrape, args=(front, message[1]), daemon=True).start()
        elif kind == "dumped":
            front.counted = message[2]
            waiting = self._dumps.get(message[1])
            if waiting is not None:
                waiting[1].append((message[2], message[3]))
                if len(waiting[1]) >= waiting[2]:
                    waiting[0].set()
        elif kind == "up":
            front.up = True
            self._say(f"HTTP worker {front.index} listening (pid {message[1]})")

    def _lost(self, front: _Front) -> None:
        self._counts.gone(front.index)
        if front.counted is not None:  # its counters and histograms go on in the sum (they never go back)
            self._exited.merge(front.counted)
        with front.lock:
            front.gone = True
        front.withdraw()
        front.process.join(10)
        with self._lock:
            again = not self._stopping and self._fronts[front.index] is front
        if again:
            self._say(
                f"HTTP worker {front.index} (pid {front.process.pid}) exited with status {front.process.exitcode}: "
                "starting it again"
            )
            self.metrics.count("malinn_serve_front_restarts_total", ())
            self._start(front.index)

    def _predict(self, front: _Front, groups: list) -> None:
        """A message's groups put in their versions' queues, each as one unit."""
        models = self.manager.models
        for name, number, pinned, input_names, keys, counts, deadlines, arrays in groups:
            group = Group(unpack(arrays), keys, counts, deadlines, front.answer, number, front.groups)
            served = models.get(name)
            version = served.versions.get(number) if served is not None else None
            batcher = version.batcher if version is not None and version.state == "AVAILABLE" else None
            try:
                if batcher is None:
                    raise Retired(name)
                refused = batcher.submit_group(group)
            except Retired:  # each request on its own: to the newest version, or a 404
                group.release()
                for index in range(len(keys)):
                    self._predict_one(front, group.member(index), name, pinned, input_names)
                continue
            for key, error in refused:
                front.send(("error", key, _sendable(error)))

    def _predict_one(self, front: _Front, group: Group, name: str, pinned: bool, input_names: tuple) -> None:
        """One request (a group of one) whose version is not AVAILABLE (or stopped taking
        requests): an unpinned one goes to the newest version (or back to its front for a parse of
        its own where the newest takes other inputs), a pinned one is answered 404."""
        key, number = group.keys[0], group.number
        try:
            served = self.manager.models.get(name)
            version = served.versions.get(number) if served is not None else None
            for _ in range(8):  # a version being unloaded sends an unpinned request to the newest
                batcher = version.batcher if version is not None and version.state == "AVAILABLE" else None
                try:
                    if batcher is None:
                        raise Retired(name)
                    group.number = number
                    for _, error in batcher.submit_group(group):
                        front.send(("error", key, _sendable(error)))
                    return
                except Retired:
                    if pinned:
                        raise NotFound(
                            f"Servable not found for request: Specific({name}, {number}) (it is being unloaded)"
                        ) from None
                    version = self.manager.resolve(name)
                    number = version.number
                    signature: Any = version.signature
                    if tuple(signature.input_names) != tuple(input_names):
                        group.release()
                        front.send(("retry", key, version.number, version.signature))
                        return
            raise Unavailable(f"model {name!r}: every version was being unloaded; try again")
        except Exception as exc:
            group.release()
            front.send(("error", key, _sendable(exc)))

    # ------------------------------------------------------------------ metrics
    def _scrape(self, front: _Front, key: int) -> None:
        try:
            text = self.render()
        except Exception as exc:  # a bug here must not leave the scrape waiting
            front.send(("error", key, Failed(type(exc).__name__, str(exc))))
            return
        front.send(("metrics", key, text))

    def render(self, timeout: float = 5.0) -> str:
        """Every front's metrics merged with this process's, in Prometheus's text format."""
        exited = self._exited.snapshot()  # (before the fronts are listed: a front is in one or the other)
        with self._lock:
            fronts = [f for f in self._fronts if f is not None and not f.gone]
        event = threading.Event()
        replies: list = []
        dump = next(self._ids)
        self._dumps[dump] = (event, replies, len(fronts))
        try:
            asked = sum(front.send(("dump", dump)) for front in fronts)
            end = time.monotonic() + timeout
            while len(replies) < asked and time.monotonic() < end:  # a front that exits meanwhile never answers
                event.wait(0.05)
        finally:
            self._dumps.pop(dump, None)
        merged = Metrics()
        merged.merge(self.metrics.snapshot())
        merged.merge(exited)
        in_flight = 0
        for snapshot, held in list(replies):
            merged.merge(snapshot)
            in_flight += held
        merged.gauges = lambda: (
            self.manager.gauges() + [("malinn_serve_in_flight", "Requests being answered now.", (), {(): in_flight})]
        )
        return merged.render()
