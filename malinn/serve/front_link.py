"""The pipe between an HTTP front process and the process that owns the device (``--http-workers``).

A front parses requests and writes answers; the model process runs them. Over one
:func:`multiprocessing.Pipe` per front, each message a tuple whose first item names it:

* front to model: ``("up", pid)`` once the front listens; ``("predict", groups)``, every request
  the front's event loop sent in one turn, those of one model, version and inputs as one group
  ``(name, version, pinned, input names, ids, sample counts, deadlines, arrays)``, the requests'
  inputs stacked in their order (one array per input); ``("cancel", id)`` (the client went away,
  or its time is up: the request leaves its queue); ``("metrics", id)`` (a scrape); ``("dumped",
  id, metrics snapshot, requests in flight)``, the answer to a ``dump``;
* model to front: ``("table", versions, flags)`` whenever a version's state or readiness changes;
  ``("done", parts, outputs)``, the front's requests answered by one predict call, each part
  ``(ids, sample counts, version, batch, queued seconds)`` of a group's requests that ran and
  ``outputs`` their rows of each output, in the parts' order; ``("error", id, exception)``;
  ``("retry", id, version, signature)`` (the version asked for is being unloaded and the newest
  takes other inputs: the front parses the body again for it); ``("metrics", id, text)``;
  ``("dump", id)``.

Arrays cross the pipe as ``(dtype, shape, bytes)`` (:func:`pack`, :func:`unpack`): a pickled numpy
array costs each side several times more than its bytes, and the model process reads every
front's requests alone. A busy front thus sends many requests in one message and gets many answers
in one, where each would cost both processes a message of its own; stacked, a group's requests
cost the model process one array, one queue entry and one slice of the outputs, not one of each a
request.

Deadlines are ``time.monotonic()`` seconds, one clock for every process of the machine.

:class:`ModelLink` keeps the front's copy of the version table (:class:`FrontTable`), sends
requests and hands the answers to the event loop; in the event loop it reads what its pipe holds
in one read, however many messages that is. When the model process is gone (the pipe ends)
every request waiting for it is answered 503 and the front stops.

Both processes write a message with :func:`write_message`: the bytes ``Connection.send`` writes,
pickled by :func:`pickle.dumps` and written in one write (``Connection.send`` writes a message
beyond 16 KiB in two: two wakeups of the reader).

:class:`PipeReader` is the model process's end: one thread waits on every front's pipe at once and
reads each ready pipe's bytes in one read, however many messages they hold, where a thread a pipe
would cost a wakeup, a hand-over of the GIL and two reads a message (its length, then its bytes).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import pickle
import selectors
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from .batcher import Unavailable
from .metrics import Metrics
from .version_table import VersionTable

__all__ = ["FrontTable", "ModelLink", "PipeReader", "pack", "unpack", "read_messages", "write_message", "writes_whole"]


def pack(arrays: Iterable) -> list:
    """``arrays`` as ``(dtype, shape, bytes)`` each, for the pipe."""
    return [(a.dtype.str, a.shape, a.tobytes()) for a in arrays]


def unpack(packed: list) -> list:
    """The arrays :func:`pack` packed (read-only, over the received bytes)."""
    return [np.frombuffer(data, dtype).reshape(shape) for dtype, shape, data in packed]


#: the most bytes one read of a pipe takes (the messages it holds are handled before the next read)
READ_BYTES = 1 << 20


def read_messages(buffer: bytearray) -> list:
    """The whole messages at the start of ``buffer`` (bytes that :class:`multiprocessing.connection.Connection`
    wrote: each a 4-byte big-endian length, -1 then an 8-byte one beyond 2 GiB, and its pickle),
    unpickled and taken out of it; a message not whole yet stays for the next read."""
    messages = []
    at, end = 0, len(buffer)
    with memoryview(buffer) as view:
        while end - at >= 4:
            size = int.from_bytes(view[at : at + 4], "big", signed=True)
            start = at + 4
            if size == -1:
                if end - at < 12:
                    break
                size, start = int.from_bytes(view[at + 4 : at + 12], "big"), at + 12
            if end - start < size:
                break
            messages.append(pickle.loads(view[start : start + size]))
            at = start + size
    del buffer[:at]
    return messages


class PipeReader:
    """One thread reading every front's pipe (the model process's end of each).

    Args:
        handle: called with ``(owner, message)`` for each message, in each pipe's order.
        lost: called with ``owner`` once its pipe ended (the front exited); from the reader's
            thread, so it must not wait.
        name: the thread's name.

    Where a pipe end cannot be waited on with others (not a socket or pipe of this platform's
    :mod:`selectors`, e.g. Windows' named pipes) it is read by a thread of its own, by ``recv``.
    """

    def __init__(self, handle: Callable[[Any, tuple], None], lost: Callable[[Any], None], name: str):
        self._handle, self._lost, self._name = handle, lost, name
        self._lock = threading.Lock()
        self._added: list = []  # (conn, owner) to register, by the reader's thread
        self._selector: selectors.BaseSelector | None = None
        self._wake: tuple | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, conn: Any, owner: Any) -> None:
        """Reads ``conn`` from now on, its messages handed over with ``owner``."""
        if sys.platform == "win32" or not isinstance(conn, Connection):
            threading.Thread(target=self._read_alone, args=(conn, owner), name=self._name, daemon=True).start()
            return
        with self._lock:
            if self._closed:
                raise ValueError("the pipe reader is closed")
            self._added.append((conn, owner))
            if self._thread is None:
                self._selector = selectors.DefaultSelector()
                self._wake = socket.socketpair()
                self._wake[0].setblocking(False)
                self._selector.register(self._wake[0], selectors.EVENT_READ, None)
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
                return
        try:
            self._wake[1].send(b"\0")  # type: ignore[index]
        except OSError:  # the reader's wake is full: it is awake anyway
            pass

    def close(self) -> None:
        """Stops reading (the pipes stay open); the thread ends at once."""
        with self._lock:
            self._closed = True
            wake = self._wake
        if wake is not None:
            wake[1].close()  # the reader sees its wake end: it ends

    def _read_alone(self, conn: Any, owner: Any) -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            self._handle(owner, message)
        self._lost(owner)

    def _register(self) -> None:
        with self._lock:
            added, self._added = self._added, []
        for conn, owner in added:
            assert self._selector is not None
            try:
                self._selector.register(conn.fileno(), selectors.EVENT_READ, (conn, owner, bytearray()))
            except (OSError, ValueError, KeyError):  # closed meanwhile
                self._lost(owner)

    def _run(self) -> None:
        selector, wake = self._selector, self._wake
        assert selector is not None and wake is not None
        self._register()
        while True:
            for key, _ in selector.select():
                if key.data is None:
                    try:
                        woken = wake[0].recv(4096)
                    except OSError:
                        woken = b"\0"
                    if not woken:  # closed
                        selector.close()
                        wake[0].close()
                        return
                    self._register()
                    continue
                conn, owner, buffer = key.data
                try:
                    data = os.read(key.fd, READ_BYTES)  # what the pipe holds (it was ready: no wait)
                except OSError:
                    data = b""
                if not data:  # the front's end closed
                    selector.unregister(key.fd)
                    self._lost(owner)
                    continue
                buffer += data
                for message in read_messages(buffer):
                    try:
                        self._handle(owner, message)
                    except Exception:  # a bug handling one message must not stop every front's reads
                        traceback.print_exc()


class _Initial:
    """``initial.is_set()``, as the model process last said it."""

    def __init__(self):
        self.value = False

    def is_set(self) -> bool:
        return self.value


class FrontTable(VersionTable):
    """A front's copy of the model process's version table and readiness."""

    def __init__(self, configs):
        super().__init__(configs)
        self.initial = _Initial()
        self.owner_ready = False  # every model has an AVAILABLE version, the model process says
        self.stopping = False  # set by this front's own signal, or by the model process's

    @property
    def ready(self) -> bool:
        return self.owner_ready and not self.stopping

    def take(self, versions: dict, flags: dict) -> None:
        self.update(versions)
        self.initial.value = flags["initial"]
        self.owner_ready = flags["ready"]
        self.stopping = self.stopping or flags["stopping"]


class ModelLink:
    """The front's pipe to the model process.

    Args:
        conn: the front's end of the pipe.
        table: the front's version table, kept up to date here.
        metrics: the front's metrics (sent when the model process gathers a scrape).
        in_flight: ``[requests being answered now]`` (sent with the metrics).
    """

    def __init__(self, conn: Any, table: FrontTable, metrics: Metrics, in_flight: list):
        self._conn, self.table, self._metrics, self._in_flight = conn, table, metrics, in_flight
        self._send_lock = threading.Lock()
        self._ids = itertools.count()
        self._pending: dict = {}  # id -> (loop, future)
        self._lost = False
        self._unsent: list = []  # the requests of this turn of the event loop, sent together at its end
        self._received = bytearray()  # what the loop read of the model process's messages, not whole yet
        self.on_lost: Callable[[], None] = lambda: None
        self._writes_whole = writes_whole(conn)

    def send(self, message: tuple) -> None:
        """Sends ``message`` (:func:`write_message`).

        Raises:
            OSError, ValueError: the pipe is closed (the model process is gone).
        """
        with self._send_lock:
            write_message(self._conn, message, self._writes_whole)

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Reads the model process's messages: in ``loop`` as they arrive (an answer then wakes no
        thread: its future is settled where it is awaited), else in a thread of their own."""
        if loop is not None:
            try:
                loop.add_reader(self._conn.fileno(), self._readable, loop)
                # uvloop (libuv) makes a watched descriptor non-blocking; the pipe's reads and writes
                # are whole messages, a read begun when data arrived and a write to a full pipe wait
                os.set_blocking(self._conn.fileno(), True)
                return
            except (NotImplementedError, OSError, ValueError):  # a loop that cannot watch a pipe
                pass
        threading.Thread(target=self._read, name="malinn-serve front link", daemon=True).start()

    def _readable(self, loop: asyncio.AbstractEventLoop) -> None:
        """The pipe has data: what it holds, read in one read, and every whole message in it handled
        in the loop (a message not whole yet waits for the rest)."""
        try:
            data = os.read(self._conn.fileno(), READ_BYTES)  # what the pipe holds (it is readable: no wait)
            if data:
                self._received += data
                for message in read_messages(self._received):
                    self._handle(message, None)
                return
        except OSError:  # the pipe broke (reading it, or answering a dump)
            pass
        with contextlib.suppress(OSError, ValueError):  # the model process's end closed
            loop.remove_reader(self._conn.fileno())
        self._end()

    def _read(self) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            self._handle(message, _settle_threadsafe)
        self._end()

    def _handle(self, message: tuple, settle: Callable | None) -> None:
        kind = message[0]
        if kind == "done":
            outputs = unpack(message[2])
            pending = self._pending
            start = 0
            for keys, counts, number, batch, queued_s in message[1]:
                for key, samples in zip(keys, counts):
                    waiting = pending.pop(key, None)
                    if waiting is not None:
                        rows = [out[start : start + samples] for out in outputs]
                        self._settle(waiting, ("done", key, rows, number, batch, queued_s), settle)
                    start += samples
        elif kind == "table":
            self.table.take(message[1], message[2])
        elif kind == "dump":
            self.send(("dumped", message[1], self._metrics.snapshot(), self._in_flight[0]))
        else:
            waiting = self._pending.pop(message[1], None)
            if waiting is not None:
                self._settle(waiting, message, settle)

    @staticmethod
    def _settle(waiting: tuple, message: tuple, settle: Callable | None) -> None:
        loop, future = waiting
        if settle is None:
            _settle(future, message)
        else:
            settle(loop, future, message)

    def _end(self) -> None:
        self._lost = True
        self.table.stopping = True
        for loop, future in list(self._pending.values()):
            loop.call_soon_threadsafe(_settle, future, ("error", None, _gone()))
        self._pending.clear()
        self.on_lost()

    async def _ask(self, message_of: Callable[[int], tuple], coalesce: bool = False) -> tuple:
        """Sends ``message_of(id)`` and waits for its answer; with ``coalesce``, ``message_of``
        gives one request of a ``predict`` message, sent with the others of this turn of the loop."""
        if self._lost:
            raise _gone()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        key = next(self._ids)
        self._pending[key] = (loop, future)
        if coalesce:
            if not self._unsent:
                loop.call_soon(self._flush)
            self._unsent.append(message_of(key))
        else:
            try:
                self.send(message_of(key))
            except (OSError, ValueError):
                self._pending.pop(key, None)
                raise _gone() from None
        try:
            return await future
        except asyncio.CancelledError:
            if self._pending.pop(key, None) is not None:
                unsent = next((i for i, request in enumerate(self._unsent) if request[0] == key), None)
                if unsent is not None:  # not sent yet: it never leaves this process
                    del self._unsent[unsent]
                else:
                    try:
                        self.send(("cancel", key))
                    except (OSError, ValueError):
                        pass
            raise

    def _flush(self) -> None:
        """Sends the requests of this turn of the loop as one message, those of one model, version
        and inputs stacked into one group."""
        unsent, self._unsent = self._unsent, []
        if not unsent:
            return
        groups: dict = {}
        for request in unsent:
            key, name, number, pinned, arrays, samples, deadline, input_names = request
            kind = (name, number, pinned, input_names, tuple((a.dtype.str, a.shape[1:]) for a in arrays))
            group = groups.get(kind)
            if group is None:
                groups[kind] = ([key], [samples], [deadline], [arrays])
            else:
                group[0].append(key)
                group[1].append(samples)
                group[2].append(deadline)
                group[3].append(arrays)
        message = [
            kind[:4]
            + (keys, counts, deadlines, pack(arrays[0] if len(arrays) == 1 else map(np.concatenate, zip(*arrays))))
            for kind, (keys, counts, deadlines, arrays) in groups.items()
        ]
        try:
            self.send(("predict", message))
        except (OSError, ValueError):  # the model process is gone: the reader ends the rest
            for request in unsent:
                waiting = self._pending.pop(request[0], None)
                if waiting is not None:
                    _settle(waiting[1], ("error", request[0], _gone()))

    async def submit(
        self, name: str, served: Any, parsed: Any, pinned: bool, deadline: float, reparse: Callable[[Any], Any]
    ) -> tuple:
        """A parsed request run by the model process: ``(outputs, version, batch, queued seconds,
        parsed, signature)``, as :func:`malinn.serve.app.build_app`'s ``submit`` returns it.

        Raises:
            what ended the request in the model process (NotFound, Overloaded, DeadlineExceeded...),
            or Unavailable where the model process is gone.
        """
        number, signature = served.number, served.signature
        for _ in range(8):
            arrays = parsed.arrays
            reply = await self._ask(
                lambda key: (key, name, number, pinned, arrays, parsed.samples, deadline, tuple(signature.input_names)),
                coalesce=True,
            )
            if reply[0] == "done":
                _, _, outputs, number, batch, queued_s = reply
                return outputs, number, batch, queued_s, parsed, signature
            if reply[0] == "error":
                raise reply[2]
            _, _, number, signature = reply  # "retry": the newest version takes other inputs
            parsed = reparse(signature)
        raise Unavailable(f"model {name!r}: every version was being unloaded; try again")

    async def scrape(self) -> str:
        """The whole server's metrics, gathered by the model process from every front."""
        reply = await self._ask(lambda key: ("metrics", key))
        if reply[0] == "error":
            raise reply[2]
        return reply[2]


def writes_whole(conn: Any) -> bool:
    """Whether :func:`write_message` writes ``conn``'s messages itself: a pipe of this platform."""
    return isinstance(conn, Connection) and sys.platform != "win32"


def write_message(conn: Any, message: tuple, whole: bool) -> None:
    """Sends ``message`` over ``conn`` as :meth:`multiprocessing.connection.Connection.send` does
    (a 4-byte big-endian length, then the pickle; the other end reads it with ``recv`` or
    :func:`read_messages`). Where ``whole`` (:func:`writes_whole`) it is pickled by :func:`pickle.dumps`
    and written in one write: ``Connection.send`` pickles through a pickler made for each message
    and writes a message over 16 KiB in two, each a wakeup of the reader, which costs the sender
    about twice the CPU of one write. The caller keeps other writers of ``conn`` out meanwhile.

    Raises:
        OSError, ValueError: the pipe is closed.
    """
    if not whole:
        conn.send(message)
        return
    data = pickle.dumps(message)
    if len(data) > 0x7FFFFFFF:  # an 8-byte length: Connection's own writes
        conn.send_bytes(data)
        return
    _write_all(conn.fileno(), [len(data).to_bytes(4, "big"), data])


def _write_all(fd: int, parts: list) -> None:
    """Writes ``parts`` to ``fd`` (a blocking pipe) in one write where it takes them whole."""
    written = os.writev(fd, parts)
    if written == sum(map(len, parts)):
        return
    rest = memoryview(b"".join(parts))[written:]  # a write that a signal cut short
    while rest:
        rest = rest[os.write(fd, rest) :]


def _gone() -> Unavailable:
    return Unavailable("the process running the models exited; the server is stopping (try again once it is back)")


def _settle(future: asyncio.Future, message: tuple) -> None:
    if not future.done():
        future.set_result(message)


def _settle_threadsafe(loop: asyncio.AbstractEventLoop, future: asyncio.Future, message: tuple) -> None:
    loop.call_soon_threadsafe(_settle, future, message)
