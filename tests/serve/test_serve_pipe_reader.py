"""The model process's one reader of every front's pipe (:class:`~malinn.serve.front_link.PipeReader`):
the messages each front's :class:`multiprocessing.connection.Connection` sends arrive whole, in
each pipe's order, whether a read holds several of them, part of one, or one larger than a read;
a pipe added while the reader waits is read; a pipe whose other end closed is reported lost once
and the others are still read."""

from __future__ import annotations

import multiprocessing
import pickle
import queue
import threading

import numpy as np

from malinn.serve.front_link import READ_BYTES, PipeReader, pack, read_messages, unpack


def _frame(message: object, long_header: bool = False) -> bytes:
    payload = pickle.dumps(message)
    if long_header:  # the form Connection writes beyond 2 GiB
        return (-1).to_bytes(4, "big", signed=True) + len(payload).to_bytes(8, "big") + payload
    return len(payload).to_bytes(4, "big") + payload


def test_read_messages_takes_whole_messages_from_any_split_of_the_bytes():
    messages = [
        ("predict", [("m", 1, False, ("x",), [i], [1], [1.5], pack([np.full((1, 3), i, np.float32)]))])
        for i in range(4)
    ] + [("cancel", 7), ("up", 123)]
    data = b"".join(_frame(m, long_header=i == 2) for i, m in enumerate(messages))
    for step in (1, 5, 37, len(data)):
        buffer, got = bytearray(), []
        for at in range(0, len(data), step):
            buffer += data[at : at + step]
            got += read_messages(buffer)
        assert got == messages and not buffer  # every byte taken, nothing left half-read
    for i, message in enumerate(messages[:4]):
        np.testing.assert_array_equal(unpack(message[1][0][7])[0], np.full((1, 3), i, np.float32))


def test_read_messages_leaves_a_partial_message_for_the_next_read():
    data = _frame(("cancel", 1)) + _frame(("cancel", 2))
    buffer = bytearray(data[:-3])
    assert read_messages(buffer) == [("cancel", 1)]
    assert bytes(buffer) == data[len(_frame(("cancel", 1))) : -3]
    buffer += data[-3:]
    assert read_messages(buffer) == [("cancel", 2)] and not buffer


def test_one_thread_reads_every_pipe_in_order_and_reports_each_lost_one():
    got: queue.Queue = queue.Queue()
    lost: list = []
    reader = PipeReader(lambda owner, message: got.put((owner, message)), lost.append, "test reader")
    pipes = [multiprocessing.Pipe() for _ in range(3)]
    try:
        for index, (mine, _) in enumerate(pipes[:2]):
            reader.add(mine, index)
        reader.add(pipes[2][0], 2)  # while the reader waits on the others
        big = np.arange(READ_BYTES // 2 + 1000, dtype=np.float32)  # 2 MB: one message over several reads
        sent = {i: [("cancel", i * 100 + k) for k in range(50)] for i in range(3)}
        sent[1].insert(10, ("predict", pack([big])))

        def send(index: int) -> None:
            for message in sent[index]:
                pipes[index][1].send(message)

        senders = [threading.Thread(target=send, args=(i,)) for i in range(3)]
        for thread in senders:
            thread.start()
        for thread in senders:
            thread.join()
        received: dict = {0: [], 1: [], 2: []}
        for _ in range(sum(map(len, sent.values()))):
            owner, message = got.get(timeout=10)
            received[owner].append(message)
        for index in range(3):
            assert [m[0] for m in received[index]] == [m[0] for m in sent[index]]
            assert [m[1] for m in received[index] if m[0] == "cancel"] == [
                m[1] for m in sent[index] if m[0] == "cancel"
            ]
        np.testing.assert_array_equal(unpack(received[1][10][1])[0], big)

        pipes[0][1].close()  # front 0 exited
        deadline = threading.Event()
        for _ in range(100):
            if lost:
                break
            deadline.wait(0.05)
        assert lost == [0]
        pipes[2][1].send(("up", 2))  # the others are still read
        assert got.get(timeout=10) == (2, ("up", 2))
        assert lost == [0]
    finally:
        reader.close()
        for mine, theirs in pipes:
            mine.close()
            theirs.close()
