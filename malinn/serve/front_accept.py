"""How HTTP fronts (``--http-workers``) share one listening socket's connections evenly.

Every front watches the socket it inherited. uvloop's server, left to itself, accepts every
connection waiting when its front wakes: on a burst of connections (64 clients connecting at once)
a few fronts took most of them and some none, and a front holding a dozen keep-alive clients does
the HTTP and JSON of all of them in one event loop while others idle. Here a front accepts one
connection a turn of its loop, and only while it holds no more than one connection above the front
holding fewest: every front's count is in one array shared by the fronts (:class:`ConnectionCounts`,
made by the model process), each front writing its own. A front with more leaves the connection
to the others and looks again 2 ms later; where the connection still waits after 100 ms (the
fewest's loop busy with a long request) it takes it anyway, so that a connection never waits on
one busy front.

Counts are read without a lock: a stale one only makes a front take or leave one connection it
would not have. A front that is not running counts as full (:data:`FULL`), so that nobody waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
from collections.abc import Callable
from typing import Any

__all__ = ["ConnectionCounts", "ShareAcceptor", "FULL"]

#: the count of a front that is not running (starting, stopped, gone): never the fewest
FULL = 1 << 30
#: seconds a front that leaves a connection to the others waits before it looks again
PAUSE_S = 0.002
#: seconds a connection is left to the others at most, then the front that sees it takes it
PATIENCE_S = 0.1


class ConnectionCounts:
    """The fronts' connection counts, in memory shared with them (one slot a front).

    Args:
        context: the multiprocessing context the fronts are started in.
        fronts: how many fronts.
    """

    def __init__(self, context: Any, fronts: int):
        self.array = context.RawArray("q", [FULL] * fronts)

    def starting(self, index: int) -> None:
        """Front ``index`` is about to start: it holds nothing yet."""
        self.array[index] = 0

    def gone(self, index: int) -> None:
        """Front ``index`` is not running: nobody leaves it a connection."""
        self.array[index] = FULL


class ShareAcceptor:
    """Accepts one front's share of the listening socket's connections (the module says how).

    Args:
        sock: the listening socket (non-blocking here).
        counts: every front's count (:attr:`ConnectionCounts.array`); index: this front's slot.
        held: how many connections this front holds now.
        protocol: makes the protocol of an accepted connection.
    """

    def __init__(self, sock: socket.socket, counts: Any, index: int, held: Callable[[], int], protocol: Callable):
        self.sock, self.counts, self.index, self.held, self.protocol = sock, counts, index, held, protocol
        self.loop: asyncio.AbstractEventLoop | None = None
        self.watching = self.stopped = False
        self.declined: float | None = None  # when this front first left a waiting connection to the others
        self.pending = 0  # connections accepted whose protocol is not made yet (not in held())

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Starts accepting in ``loop``."""
        self.loop = loop
        self.sock.setblocking(False)
        self.counts[self.index] = self.held() + self.pending
        self._watch()

    def stop(self) -> None:
        """Accepts no more (the connections held are the server's to close)."""
        self.stopped = True
        self.counts[self.index] = FULL
        if self.watching and self.loop is not None:
            with contextlib.suppress(OSError, ValueError):
                self.loop.remove_reader(self.sock.fileno())
        self.watching = False

    def _watch(self) -> None:
        if not self.stopped and not self.watching and self.loop is not None:
            if self.declined is not None and not select.select([self.sock], [], [], 0)[0]:
                self.declined = None  # the connection it left was taken: the next one starts afresh
            self.watching = True
            self.loop.add_reader(self.sock.fileno(), self._readable)

    def _pause(self) -> None:
        """Stops watching for :data:`PAUSE_S` (the socket stays readable until someone accepts)."""
        assert self.loop is not None
        self.loop.remove_reader(self.sock.fileno())
        self.watching = False
        self.loop.call_later(PAUSE_S, self._watch)

    def _readable(self) -> None:
        assert self.loop is not None
        mine = self.held() + self.pending
        self.counts[self.index] = mine
        if mine > min(self.counts) + 1:  # another front holds fewer: it takes this one
            now = self.loop.time()
            if self.declined is None:
                self.declined = now
            if now - self.declined < PATIENCE_S:
                self._pause()
                return
        self.declined = None
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError):  # another front took it
            return
        except OSError:  # out of file descriptors, a connection reset while waiting: look again soon
            self._pause()
            return
        conn.setblocking(False)
        if conn.family in (socket.AF_INET, socket.AF_INET6):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # an answer is not held for an ACK
        self.pending += 1
        self.counts[self.index] = mine + 1
        self.loop.create_task(self._serve(conn))

    async def _serve(self, conn: socket.socket) -> None:
        assert self.loop is not None
        try:
            await self.loop.connect_accepted_socket(self.protocol, conn)  # its protocol made: held() has it
        except OSError:  # the client went away before its transport was made
            conn.close()
        finally:
            self.pending -= 1
