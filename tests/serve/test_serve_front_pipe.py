"""The pipe between an HTTP front and the process that owns the device (``--http-workers``): the
requests a front's event loop sends in one turn travel in one message, those of one model version
stacked into one group (one array per input), and one predict call's answers to that front in one
message, arrays as raw bytes. Each request keeps its own meaning inside a shared group: its own rows
of the outputs (equal to the model's own predict of its input), its own error, its own cancel (it
leaves the queue unrun; the others are answered), its own 503 when the queue is full, its own
deadline (504), and without batching its own call.

The front's side is a real :class:`~malinn.serve.front_link.ModelLink` on an event loop of this
process; the model process's side is a real :class:`~malinn.serve.fronts.Fronts` over real
batchers and models (:class:`~malinn.serve.servables.ModelManager`), its messages read by the
model process's own :class:`~malinn.serve.front_link.PipeReader`, which shows the test each one."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time

import numpy as np
import pytest
from serving import close

import malinn
from malinn.serve.batcher import DeadlineExceeded, Overloaded
from malinn.serve.config import BatchingParameters, ModelConfig, ServeConfig
from malinn.serve.front_link import FrontTable, ModelLink, PipeReader, pack, unpack
from malinn.serve.fronts import Fronts, _Front
from malinn.serve.metrics import Metrics
from malinn.serve.payload import PredictRequest
from malinn.serve.servables import ModelManager
from malinn.serve.version_table import NotFound


class _Recording:
    """A pipe end that keeps the kind of every message sent through it."""

    def __init__(self, conn):
        self.conn, self.kinds = conn, []

    def send(self, message: tuple) -> None:
        self.kinds.append(message[0])
        self.conn.send(message)


class Pipe:
    """A front's :class:`ModelLink` and the model process's :class:`Fronts` of ``batching``, joined
    by a real pipe; ``seen`` holds every message the model process read, ``sent`` the kinds of
    those it sent."""

    def __init__(self, path, batching: BatchingParameters):
        self.config = ServeConfig(models=(ModelConfig("mlp", path, batching=batching),), poll_seconds=0)
        self.metrics = Metrics()
        self.manager = ModelManager(self.config, self.metrics, say=lambda text: None)
        self.manager.start()
        assert self.manager.initial.wait(120) and not self.manager.failed, self.manager.failed
        self.fronts = Fronts(self.config, None, self.manager, self.metrics, say=lambda text: None)
        model_end, self.front_end = multiprocessing.Pipe()
        self.sent = _Recording(model_end)
        self.front = _Front(0, None, self.sent)
        self.seen: list = []
        self.table = FrontTable(self.config.models)
        self.link = ModelLink(self.front_end, self.table, Metrics(), [0])
        self.ended = threading.Event()
        self.reader = PipeReader(self._handle, lambda owner: self.ended.set(), "test pipe reader")
        self.reader.add(model_end, self.front)

    def _handle(self, front: _Front, message: tuple) -> None:
        self.seen.append(message)
        self.fronts._handle(front, message)

    def batches(self) -> tuple:
        """The predict calls run so far and their samples, from the batch-size histogram."""
        series = self.metrics.snapshot()[1].get("malinn_serve_batch_size", {})
        return sum(count for _, _, count in series.values()), sum(total for _, total, _ in series.values())

    def close(self) -> None:
        self.front_end.close()
        assert self.ended.wait(5)  # the reader saw the front's end close
        self.reader.close()
        self.sent.conn.close()
        self.manager.stop()


@pytest.fixture
def pipe_of(keras_models):
    made = []

    def make(**batching) -> Pipe:
        made.append(Pipe(keras_models.path("mlp"), BatchingParameters(**batching)))
        return made[-1]

    yield make
    for pipe in made:
        pipe.close()


def _submit(pipe: Pipe, rows: np.ndarray, version: int | None = None, pinned: bool = False, deadline: float = 1e12):
    served = pipe.manager.resolve("mlp")
    if version is not None:
        served = type(served)("mlp", version)
        served.signature = pipe.manager.resolve("mlp").signature
    parsed = PredictRequest([rows], len(rows), False)
    return pipe.link.submit("mlp", served, parsed, pinned, deadline, lambda signature: parsed)


def _queued(pipe: Pipe) -> int:
    """The requests waiting in the model's queue."""
    return pipe.manager.resolve("mlp").batcher.depth()


def _spans(count: int) -> list:
    """``count`` requests' ``(first, last + 1)`` rows of the 16 test samples: 1, 3 and 7 samples in turn."""
    spans = []
    for i in range(count):
        n = (1, 3, 7)[i % 3]
        spans.append((i % (16 - n), i % (16 - n) + n))
    return spans


def test_pack_gives_back_the_same_arrays():
    arrays = [np.arange(12, dtype=np.float32).reshape(3, 4) / 7, np.array([[1, -2], [3, 4]], np.int32)]
    for got, want in zip(unpack(pack(arrays)), arrays):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_a_turns_requests_go_in_one_message_and_a_calls_answers_in_one(pipe_of, keras_models):
    pipe = pipe_of(max_batch_size=64)
    x = next(iter(keras_models.x("mlp").values()))
    model = malinn.load_model(keras_models.path("mlp"))
    spans = _spans(15)  # 1, 3 and 7 samples: 55 in all
    total = sum(b - a for a, b in spans)

    async def main() -> list:
        pipe.link.start(asyncio.get_running_loop())
        requests = [_submit(pipe, x[a:b]) for a, b in spans]
        requests.append(_submit(pipe, x[:2], version=7, pinned=True))  # no such version: its own 404
        return await asyncio.gather(*requests, return_exceptions=True)

    answers = asyncio.run(main())
    predicts = [m for m in pipe.seen if m[0] == "predict"]
    assert len(predicts) == 1 and len(predicts[0][1]) == 2  # one message: a group of version 1, one of version 7
    name, number, pinned, _, keys, counts, deadlines, arrays = predicts[0][1][0]
    assert (name, number, pinned, len(keys), counts) == ("mlp", 1, False, 15, [b - a for a, b in spans])
    (stacked,) = unpack(arrays)  # the 15 requests' inputs as one array, in their order
    np.testing.assert_array_equal(stacked, np.concatenate([x[a:b] for a, b in spans]))
    assert pipe.sent.kinds.count("done") == 1  # the 15 answers of the one call, in one message
    assert pipe.batches() == (1, total)
    for (a, b), answer in zip(spans, answers[:15]):
        outputs, number, batch, queued_s, _, _ = answer
        assert number == 1 and batch == total and queued_s >= 0
        assert outputs[0].shape == (b - a, 10)
        np.testing.assert_allclose(outputs[0], model.predict(x[a:b]), rtol=1e-6, atol=1e-7)
    assert isinstance(answers[15], NotFound) and "Specific(mlp, 7)" in str(answers[15])
    assert not pipe.front.groups


def test_a_group_larger_than_a_call_is_split_between_its_requests(pipe_of, keras_models):
    pipe = pipe_of(max_batch_size=8)
    x = next(iter(keras_models.x("mlp").values()))
    model = malinn.load_model(keras_models.path("mlp"))
    spans = _spans(6)  # 1, 3, 7, 1, 3, 7 samples: calls of 4, 7+1, 3, 7 (none over 8, no request cut)

    async def main() -> list:
        pipe.link.start(asyncio.get_running_loop())
        return await asyncio.gather(*(_submit(pipe, x[a:b]) for a, b in spans))

    answers = asyncio.run(main())
    assert [m[0] for m in pipe.seen].count("predict") == 1
    assert pipe.batches() == (4, 22)
    assert [answer[2] for answer in answers] == [4, 4, 8, 8, 3, 7]
    for (a, b), answer in zip(spans, answers):
        np.testing.assert_allclose(answer[0][0], model.predict(x[a:b]), rtol=1e-6, atol=1e-7)


def test_without_batching_each_request_of_a_group_runs_alone(pipe_of, keras_models):
    pipe = pipe_of(max_batch_size=64, enabled=False)
    x = next(iter(keras_models.x("mlp").values()))
    model = malinn.load_model(keras_models.path("mlp"))
    spans = _spans(9)

    async def main() -> list:
        pipe.link.start(asyncio.get_running_loop())
        return await asyncio.gather(*(_submit(pipe, x[a:b]) for a, b in spans))

    answers = asyncio.run(main())
    assert [m[0] for m in pipe.seen].count("predict") == 1 and len(pipe.seen[0][1][0][4]) == 9  # one group
    assert pipe.batches() == (9, sum(b - a for a, b in spans))  # one call a request
    for (a, b), answer in zip(spans, answers):
        assert answer[2] == b - a  # the call ran this request alone
        np.testing.assert_allclose(answer[0][0], model.predict(x[a:b]), rtol=1e-6, atol=1e-7)


def test_a_cancelled_request_of_a_shared_message_leaves_the_queue_and_the_others_are_answered(pipe_of, keras_models):
    pipe = pipe_of(max_batch_size=64, batch_timeout_micros=400_000)  # the requests wait 0.4 s for a batch
    x, y = next(iter(keras_models.x("mlp").values())), next(iter(keras_models.y("mlp").values()))
    gone = {2, 5, 7}

    async def main() -> list:
        pipe.link.start(asyncio.get_running_loop())
        tasks = [asyncio.ensure_future(_submit(pipe, x[i : i + 1])) for i in range(10)]
        for _ in range(2000):  # until the message's requests are in the queue
            if _queued(pipe) == 10:
                break
            await asyncio.sleep(0.005)
        for i in gone:
            tasks[i].cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    answers = asyncio.run(main())
    assert [m[0] for m in pipe.seen].count("predict") == 1 and len(pipe.seen[0][1]) == 1  # one group
    ids = pipe.seen[0][1][0][4]
    assert sorted(m[1] for m in pipe.seen if m[0] == "cancel") == sorted(ids[i] for i in gone)
    for i, answer in enumerate(answers):
        if i in gone:
            assert isinstance(answer, asyncio.CancelledError)
        else:
            assert answer[2] == 7  # the call ran the 7 requests left
            close(answer[0][0], y[i : i + 1])
    assert pipe.batches() == (1, 7) and not pipe.front.groups


def test_requests_beyond_a_full_queue_in_a_shared_message_are_refused_alone(pipe_of, keras_models):
    # 4 samples fit the queue; a message of 10 one-sample requests: 4 answered, 6 refused (503)
    pipe = pipe_of(max_batch_size=4, max_enqueued_batches=1, batch_timeout_micros=400_000)
    x, y = next(iter(keras_models.x("mlp").values())), next(iter(keras_models.y("mlp").values()))

    async def main() -> list:
        pipe.link.start(asyncio.get_running_loop())
        return await asyncio.gather(*(_submit(pipe, x[i : i + 1]) for i in range(10)), return_exceptions=True)

    answers = asyncio.run(main())
    assert [m[0] for m in pipe.seen].count("predict") == 1
    for i, answer in enumerate(answers):
        if i < 4:
            close(answer[0][0], y[i : i + 1])
        else:
            assert isinstance(answer, Overloaded) and "is full" in str(answer), answer
    assert pipe.batches() == (1, 4)


def test_requests_of_a_group_beyond_the_queue_are_refused_alone_the_others_split_between_calls(pipe_of, keras_models):
    # 8 samples fit the queue; a group of 3, 3, 1, 3, 1, 1 samples: the 4th (3 more than the 1 left)
    # and the 6th are refused (503), the others run in calls of at most 4 samples: 3, then 3 + 1, then 1
    pipe = pipe_of(max_batch_size=4, max_enqueued_batches=2, batch_timeout_micros=400_000)
    x = next(iter(keras_models.x("mlp").values()))
    model = malinn.load_model(keras_models.path("mlp"))
    sizes = [3, 3, 1, 3, 1, 1]
    firsts = [0, 4, 8, 9, 13, 15]

    async def main() -> list:
        pipe.link.start(asyncio.get_running_loop())
        requests = [_submit(pipe, x[a : a + n]) for a, n in zip(firsts, sizes)]
        return await asyncio.gather(*requests, return_exceptions=True)

    answers = asyncio.run(main())
    assert [m[0] for m in pipe.seen].count("predict") == 1 and len(pipe.seen[0][1]) == 1
    for i, (a, n, answer) in enumerate(zip(firsts, sizes, answers)):
        if i in (3, 5):
            assert isinstance(answer, Overloaded) and "is full" in str(answer), answer
        else:
            np.testing.assert_allclose(answer[0][0], model.predict(x[a : a + n]), rtol=1e-6, atol=1e-7)
    assert [answers[i][2] for i in (0, 1, 2, 4)] == [3, 4, 4, 1]
    assert pipe.batches() == (3, 8) and not pipe.front.groups


def test_a_request_of_a_group_whose_deadline_passes_in_the_queue_is_answered_504_unrun(pipe_of, keras_models):
    pipe = pipe_of(max_batch_size=64, batch_timeout_micros=400_000)  # the group waits 0.4 s for a batch
    x = next(iter(keras_models.x("mlp").values()))
    model = malinn.load_model(keras_models.path("mlp"))
    spans = _spans(9)
    late = {1, 4, 8}  # their time is up after 0.05 s, before the call starts

    async def main() -> list:
        pipe.link.start(asyncio.get_running_loop())
        soon = time.monotonic() + 0.05
        requests = [_submit(pipe, x[a:b], deadline=soon if i in late else 1e12) for i, (a, b) in enumerate(spans)]
        return await asyncio.gather(*requests, return_exceptions=True)

    answers = asyncio.run(main())
    assert [m[0] for m in pipe.seen].count("predict") == 1 and len(pipe.seen[0][1]) == 1
    run = sum(b - a for i, (a, b) in enumerate(spans) if i not in late)
    for i, ((a, b), answer) in enumerate(zip(spans, answers)):
        if i in late:
            assert isinstance(answer, DeadlineExceeded), answer
        else:
            assert answer[2] == run  # the call ran the others alone
            np.testing.assert_allclose(answer[0][0], model.predict(x[a:b]), rtol=1e-6, atol=1e-7)
    assert pipe.batches() == (1, run) and not pipe.front.groups
