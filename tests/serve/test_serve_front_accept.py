"""HTTP fronts share the listening socket's connections evenly: each accepts one connection a turn
of its loop while it holds no more than one above the front holding fewest, and takes one anyway
once another front left it waiting too long."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import socket

import pytest
from serving import ServerProcess, close
from test_serve_http_workers import wait_fronts

from malinn.serve.front_accept import FULL, PATIENCE_S, ShareAcceptor


def connections_of(pid: int, port: int) -> int:
    """The TCP connections to ``port`` process ``pid`` holds open, from /proc."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if os.path.exists(table):
            with open(table) as f:
                for row in f.read().splitlines()[1:]:
                    fields = row.split()
                    local_port = int(fields[1].rsplit(":", 1)[1], 16)
                    found += local_port == port and fields[3] == "01" and fields[9] in inodes  # 01: established
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts a process's sockets from /proc")
def test_keep_alive_connections_spread_evenly_over_three_fronts(keras_models):
    x, y = next(iter(keras_models.x("mlp").values())), next(iter(keras_models.y("mlp").values()))
    server = ServerProcess(str(keras_models.path("mlp")), "--http-workers", "3", "--parse-workers", "0").wait_ready()
    connections = []
    try:
        pids = wait_fronts(server, 3)
        for _ in range(12):  # a burst: every connection waits to be accepted at once
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
            conn.connect()
            connections.append(conn)
        for k, conn in enumerate(connections):
            conn.request("POST", "/v1/models/mlp:predict", json.dumps({"instances": x[k : k + 1].tolist()}))
            response = conn.getresponse()
            assert response.status == 200
            close(json.loads(response.read())["predictions"], y[k : k + 1])
        held = sorted(connections_of(pid, server.port) for pid in pids.values())
        # a front holds at most one above the fewest, or a few more where the others were slow to
        # wake (past its patience); on the socket's own server one front took most: [0, 0, 12], [1, 2, 9]
        assert sum(held) == 12 and held[0] >= 2 and held[-1] <= 6, held
    finally:
        for conn in connections:
            conn.close()
        assert server.stop() == 0, "\n".join(server.stderr)


class Protocol(asyncio.Protocol):
    made: list = []

    def connection_made(self, transport):
        Protocol.made.append(transport)


def test_a_front_above_the_fewest_leaves_a_connection_then_takes_it_past_its_patience():
    async def scenario():
        listener = socket.create_server(("127.0.0.1", 0))
        counts = [0, 5, FULL]  # this front holds 3: two above the fewest (slot 0), the third front not running
        held = [3]
        acceptor = ShareAcceptor(listener, counts, 1, lambda: held[0], Protocol)
        loop = asyncio.get_running_loop()
        acceptor.start(loop)
        assert counts[1] == 3
        client = socket.create_connection(listener.getsockname())
        await asyncio.sleep(PATIENCE_S / 4)
        left = len(Protocol.made)  # left to the fewest front
        await asyncio.sleep(PATIENCE_S * 3)
        taken = len(Protocol.made)  # nobody else took it: taken here
        counts[0] = 3  # now the fewest holds as many: the next is taken at once
        second = socket.create_connection(listener.getsockname())
        await asyncio.sleep(0.01)
        acceptor.stop()
        third = socket.create_connection(listener.getsockname())
        await asyncio.sleep(0.01)
        for sock in (client, second, third, listener):
            sock.close()
        for transport in Protocol.made:
            transport.close()
        return left, taken, len(Protocol.made), counts[1]

    Protocol.made = []
    left, taken, after_stop, count = asyncio.run(scenario())
    assert (left, taken, after_stop, count) == (0, 1, 2, FULL)
