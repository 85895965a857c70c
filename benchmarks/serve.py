"""malinn serve under load on loopback: requests/s and latency at 1, 8 and 64 concurrent clients,
dynamic batching on and off, beside the same model called in-process in the same run.

For Partial MNIST (640-150-10, ReLU, random weights: benchmarks/models.py's network) and
MobileNetV2 (keras.applications, random weights, saved by Keras in a process of its own at
--size x --size x 3), on the device malinn chooses (``MALINN_DEVICE`` is honoured):

* ``in_process``: ``model.predict`` of one sample in a loop for --seconds (the peer: what a
  program calling malinn itself gets), its calls/s, p50 and p99; and of 64 samples (the device's
  throughput ceiling in samples/s);
* ``serve``: a ``malinn serve`` process (--port 0 on 127.0.0.1) per model and batching mode
  (``on``: --max-batch-size 64 and the first of --batch-timeout-micros, default 0, ``on_<t>us``
  each other one; ``off``: --no-batching), and for each of 1, 8 and 64 clients, each client sending one-sample predicts
  (the row form, JSON) back to back on its own keep-alive connection for --seconds: requests/s,
  p50, p99 and mean, failed requests (any answer but 200 with one prediction of the model's output
  size, or a connection error), the mean samples per predict call (the server's batch-size
  histogram), where the mean went (from the server's latency histograms scraped before and after
  the point: ``server_ms`` in the server, of it ``run_ms`` from the hand-over to the model to its
  outputs, of which ``queue_ms`` waiting for a batch; ``http_json_ms`` the rest of ``server_ms``;
  ``compute_ms_per_call`` a predict call's time; ``outside_server_ms`` the client's mean beyond
  ``server_ms``: client, kernel, uvicorn before the app), and the CPU each request cost the server's processes (``server_cpu_ms_per_request``: the server, its
  fronts and workers, the device driver's threads, from /proc), split into the process that owns
  the device (``model_process_cpu_ms_per_request``: its batchers, its ends of the fronts' pipes and
  the driver's threads, and with one HTTP worker the HTTP and JSON too; one process, so the
  ceiling that every front shares) and the others (``fronts_cpu_ms_per_request``), and the clients
  (``client_cpu_ms_per_request``), and ``cores_busy``, the share of the host's cores both kept
  busy (near 1: the cores are the limit, not the server's design).
  The clients are lean HTTP/1.1 clients (an asyncio protocol writing pre-encoded request bytes, as
  wrk does; about 0.03-0.08 ms of CPU a request), one asyncio loop in this process, or spread over
  --client-processes processes of one loop each. Each of --http-workers (default 1: the
  server's own process answers HTTP; N: N front processes parse and answer, the model process runs
  the batches) and each of --parse-workers (default: 0, the request parse in the server's process,
  and the server's default count) is run in turn: ``serve_runs`` holds each pair
  (``http<N>_parse<M>``, with its targets in ``targets_by_run``), ``serve_by_parse_workers`` those
  of the first --http-workers, ``serve`` and ``targets`` the last pair.

* ``request_path``: what one predict request of one sample costs the server's process besides
  the model, each step timed alone in this process (median of --seconds of calls): the JSON body's
  bytes, ``json.loads`` of it (Python's reader), ``orjson_loads_ms`` (orjson's, where installed),
  the nested lists to a float32 array, malinn's whole request parse (``parse_predict_ms``: the
  read, orjson's where installed, the array and the checks), the output to the response's JSON bytes
  (``encode_response_ms``, orjson's writer where installed; ``json_encode_response_ms``, Python's); and
  ``numpy_text_parse_ms``, numpy's C text reader (``np.fromstring``) on the numbers alone (brackets
  and whitespace removed, nothing checked), which is no faster than ``json.loads`` (each number's
  correctly rounded conversion costs as much); ``worker_parse_ms``, the same parse sent to a parse worker process and its arrays
  back (one worker, one request at a time), ``worker_encode_ms`` the response's encoding there,
  and the CPU time this process spends on each either way (``parse_predict_cpu_ms``,
  ``worker_parse_cpu_ms``, ``encode_response_cpu_ms``, ``worker_encode_cpu_ms``): what the
  server's own process pays per request, which bounds its requests/s.

The serving targets, checked in ``targets``: no failed request; at 64 clients batching on gives
>= 4x the requests/s of batching off; p99 at 64 clients (batching on) <= 10x p50 at one client.
Beside them, what bounds them: ``device_batching_ceiling``, the in-process batch-64 samples/s over
the in-process batch-1 calls/s (what batching can give any server of the model on the device:
below 4, ``device_allows_4x`` is false and so is the 4x target, whatever the server;
MobileNetV2 on a CPU device is near 1); ``p99_64_over_p50_1_floor``, the least p99@64 / p50@1 the
measured 64-client throughput allows (64 clients sending back to back wait 64 / (requests/s) on
average, Little's law); ``batch1_serving_over_in_process`` and ``batching_serving_over_in_process``,
each server's 64-client requests/s over the device's own in-process calls/s (batch 1) and samples/s
(batch 64).

With --rounds R, each configuration's batching-off and batching-on servers run R times, alternately
(a busy spell of a shared host then falls on both): each point is the median of its rounds (its
requests and failures their sums, every round under ``rounds``), and the speedup at 64 clients the
median of each round's own (``batching_speedup_64_by_round``). On a shared 16-core host one
round's speedup moved by a fifth from run to run.

Run:  python3 benchmarks/serve.py [--quick] [--seconds 5] [--size 96] [--parse-workers 0 8]
      [--http-workers 1 4] [--batch-timeout-micros 0 1000] [--rounds 1] [--only partial_mnist] [--out PATH]
(default PATH: benchmarks/results/serve_<device>.json; --quick: 3 s per point and --size 64)
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import importlib
import json
import multiprocessing
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import malinn
from malinn.layers import Dense
from malinn.serve.config import default_parse_workers

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = (1, 8, 64)
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

SAVE_MOBILENET = """
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
import keras
keras.utils.set_random_seed(0)
keras.applications.MobileNetV2(weights=None, input_shape=(int(sys.argv[1]), int(sys.argv[1]), 3)).save(sys.argv[2])
"""


def partial_mnist(path: Path) -> Path:
    rng = np.random.default_rng(0)
    model = malinn.Sequential([Dense(150, activation="relu"), Dense(10)], name="partial_mnist")
    model.build((None, 640))
    model.set_weights(
        [(rng.standard_normal(w.shape) / np.sqrt(w.shape[0])).astype(np.float32) for w in model.get_weights()]
    )
    model.save(path, overwrite=True)
    return path


def mobilenet(path: Path, size: int, saved: Path | None = None) -> Path:
    """MobileNetV2 at ``size`` x ``size`` saved by Keras in a child process, or ``saved``'s
    ``mobilenetv2_<size>.keras`` where that exists (a machine without TensorFlow)."""
    if saved is not None and (saved / f"mobilenetv2_{size}.keras").exists():
        return saved / f"mobilenetv2_{size}.keras"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, "-c", SAVE_MOBILENET, str(size), str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if done.returncode != 0:
        raise SystemExit(f"saving MobileNetV2 failed:\n{done.stderr[-3000:]}")
    return path


def percentiles(seconds: list) -> dict:
    ms = np.asarray(seconds) * 1e3
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p99_ms": round(float(np.percentile(ms, 99)), 3),
        "mean_ms": round(float(ms.mean()), 3),
    }


#: the histograms whose sums and counts split a point's mean latency (:func:`stages`), by the name
#: the point gives each
TALLIED = {
    "server": "malinn_serve_request_latency_seconds",
    "run": "malinn_serve_run_latency_seconds",
    "queue": "malinn_serve_queue_latency_seconds",
    "compute": "malinn_serve_compute_latency_seconds",
    "batch": "malinn_serve_batch_size",
}


def stages(before: dict, after: dict, client_mean_ms: float) -> dict:
    """Where a point's mean request time went, from the server's histograms scraped before and after
    it (:meth:`Server.tallies`): ``server_ms``, a predict request's time in the server (arrival to
    answer); ``run_ms``, from its hand-over to the model until its outputs came back (queue, predict
    call and, with HTTP workers, the pipes to the process owning the device and the front's event-loop
    turns on either side); ``queue_ms``, its wait
    for its batch; ``compute_ms_per_call``, a predict call's time; ``http_json_ms``, ``server_ms``
    beyond ``run_ms`` (reading, parsing, writing, the event loop's turns); ``outside_server_ms``, the
    client's mean beyond ``server_ms`` (the client, the kernel's TCP, uvicorn before the app); and
    ``mean_batch``, the samples per predict call."""

    def mean(name: str, scale: float = 1e3) -> float:
        count = after[name][1] - before[name][1]
        return round((after[name][0] - before[name][0]) / count * scale, 3) if count else 0.0

    server, run = mean("server"), mean("run")
    return {
        "server_ms": server,
        "run_ms": run,
        "queue_ms": mean("queue"),
        "compute_ms_per_call": mean("compute"),
        "http_json_ms": round(server - run, 3),
        "outside_server_ms": round(client_mean_ms - server, 3),
        "mean_batch": mean("batch", 1.0),
    }


def in_process(path: Path, seconds: float) -> dict:
    model = malinn.load_model(path)
    shape = tuple(model.input_shape[1:])
    rng = np.random.default_rng(0)
    one, many = rng.random((1,) + shape, dtype=np.float32), rng.random((64,) + shape, dtype=np.float32)
    model.predict(one), model.predict(many)
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        model.predict(one)
        times.append(time.perf_counter() - start)
    batches, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds / 2 or batches < 2:
        model.predict(many)
        batches += 1
    return {
        "batch1_calls_per_s": round(len(times) / sum(times), 1),
        **percentiles(times),
        "batch64_samples_per_s": round(64 * batches / (time.perf_counter() - start), 1),
    }


def request_path(path: Path, seconds: float) -> dict:
    """The server's own costs of one one-sample predict request (see the module's docstring)."""
    from malinn.serve.parse_workers import ParsePool
    from malinn.serve.payload import dumps, encode_predict, format_predict, parse_predict
    from malinn.serve.signature import Signature

    try:
        import orjson
    except ImportError:
        orjson = None
    model = malinn.load_model(path)
    signature = Signature(model)
    sample = np.random.default_rng(1).random((1,) + tuple(model.input_shape[1:]), dtype=np.float32)
    body = json.dumps({"instances": sample.tolist()}).encode()
    numbers = body[body.index(b"[") : body.rindex(b"]") + 1].translate(None, b"[] \t\n\r")
    lists = json.loads(body)["instances"]
    outputs = model.predict(sample)
    outputs = outputs if isinstance(outputs, list) else [outputs]
    pool = ParsePool(1)
    pool.pids()  # started
    steps = {
        "json_loads_ms": lambda: json.loads(body),
        **({"orjson_loads_ms": lambda: orjson.loads(body)} if orjson is not None else {}),
        "lists_to_array_ms": lambda: np.asarray(lists).astype(np.float32),
        "parse_predict_ms": lambda: parse_predict(body, signature),
        "numpy_text_parse_ms": lambda: np.fromstring(numbers, sep=","),
        "encode_response_ms": lambda: encode_predict(outputs, signature, False),
        "json_encode_response_ms": lambda: dumps(format_predict(outputs, signature, False)),
        "worker_parse_ms": lambda: pool.parse_now(body, signature),
        "worker_encode_ms": lambda: pool.submit(encode_predict, outputs, signature, False)[0].result(),
        "predict_ms": lambda: model.predict(sample),
    }
    times: dict = {name: [] for name in steps}
    cpu: dict = {name: [] for name in ("parse_predict_cpu_ms", "worker_parse_cpu_ms")}
    cpu.update({name: [] for name in ("encode_response_cpu_ms", "worker_encode_cpu_ms")})
    end = time.perf_counter() + seconds
    try:
        while time.perf_counter() < end or len(times["predict_ms"]) < 5:
            for name, step in steps.items():  # interleaved: the machine's load falls on every step alike
                start, used = time.perf_counter(), time.process_time()
                step()
                times[name].append(time.perf_counter() - start)
                if name.replace("_ms", "_cpu_ms") in cpu:
                    cpu[name.replace("_ms", "_cpu_ms")].append(time.process_time() - used)
    finally:
        pool.shutdown()
    row = {"body_bytes": len(body), "response_values": int(sum(o.size for o in outputs))}
    row.update({name: round(float(np.median(t)) * 1e3, 3) for name, t in times.items()})
    row.update({name: round(float(np.mean(t)) * 1e3, 3) for name, t in cpu.items()})
    return row


class Server:
    def __init__(
        self, path: Path, batching: bool, parse_workers: int, batch_timeout_micros: int = 0, http_workers: int = 1
    ):
        args = ["--max-batch-size", "64", "--batch-timeout-micros", str(batch_timeout_micros)]
        args = (args if batching else ["--no-batching"]) + ["--parse-workers", str(parse_workers)]
        args += ["--http-workers", str(http_workers)]
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "malinn",
                "serve",
                str(path),
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--poll-seconds",
                "0",
                *args,
            ],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=dict(
                os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
            ),
        )
        self.port = None
        for line in self.proc.stderr:
            found = re.search(r"REST API at http://127\.0\.0\.1:(\d+)", line)
            self.port = int(found[1]) if found else self.port
            if line.startswith("malinn: ready"):
                break
            if "error" in line:
                raise SystemExit(f"malinn serve failed: {line}")
        if self.port is None or self.proc.poll() is not None:
            raise SystemExit("malinn serve did not start")

    def tallies(self, model: str) -> dict:
        """The ``(sum, count)`` so far of each histogram of :data:`TALLIED` for ``model`` (predict
        requests' latencies; every version's calls)."""
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("GET", "/monitoring/prometheus/metrics")
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
        found = {}
        for key, name in TALLIED.items():
            sums = {"sum": 0.0, "count": 0.0}
            for part, labels, value in re.findall(rf"^{name}_(sum|count){{([^}}]*)}} (\S+)$", text, re.M):
                if f'model="{model}"' in labels and ('api="' not in labels or 'api="predict"' in labels):
                    sums[part] += float(value)
            found[key] = (sums["sum"], sums["count"])
        return found

    def stop(self) -> int:
        self.proc.terminate()
        self.proc.stderr.close()
        return self.proc.wait(120)


class Client(asyncio.Protocol):
    """One client on its own keep-alive connection: sends the pre-encoded ``request`` and, once its
    answer is whole, the next, until ``end`` (``time.perf_counter()``). A lean HTTP/1.1 client,
    as wrk is (no HTTP library, no per-request parse of the headers beyond their length, the
    answer's JSON read in full for the first request of the connection and checked by its shape
    after: starts with one list of ``outputs`` numbers), so that the load generator, sharing the
    host's cores with the server, takes as little of them as it can."""

    def __init__(self, request: bytes, outputs: int, end: float, latencies: list, failures: list, closed):
        self.request, self.outputs, self.end = request, outputs, end
        self.latencies, self.failures, self.closed = latencies, failures, closed
        self.buffer = bytearray()
        self.body_at = self.length = -1
        self.start = 0.0
        self.checked = self.status_ok = False
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.send()

    def send(self) -> None:
        if time.perf_counter() >= self.end:
            self.transport.close()
            return
        self.start = time.perf_counter()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.body_at < 0:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = bytes(self.buffer[:head_end]).lower() + b"\r\n"
            at = head.find(b"content-length:")
            if at < 0:
                self.failures.append(f"an answer without a content-length: {head[:200]!r}")
                self.transport.close()
                return
            self.length = int(head[at + 15 : head.index(b"\r\n", at)])
            self.body_at = head_end + 4
            self.status_ok = head.startswith(b"http/1.1 200")
        if len(self.buffer) < self.body_at + self.length:
            return
        self.latencies.append(time.perf_counter() - self.start)
        body = bytes(self.buffer[self.body_at : self.body_at + self.length])
        if not self.status_ok:
            line = bytes(self.buffer[: self.buffer.find(b"\r\n")]).decode(errors="replace")
            self.failures.append(f"{line} {body[:200].decode(errors='replace')}")
        elif not self.checked:
            self.checked = True
            if len(json.loads(body)["predictions"][0]) != self.outputs:
                self.failures.append("a prediction of another size")
        elif not (
            body.startswith(b'{"predictions":[[') and body.endswith(b"]]}") and body.count(b",") == self.outputs - 1
        ):
            self.failures.append(f"an answer of another form: {body[:200]!r}")
        del self.buffer[: self.body_at + self.length]
        self.body_at = self.length = -1
        self.send()

    def connection_lost(self, exc) -> None:
        if time.perf_counter() < self.end or self.body_at >= 0 or self.buffer:
            self.failures.append(f"the connection closed mid-run: {exc!r}")
        if not self.closed.done():
            self.closed.set_result(None)


async def client(port: int, request: bytes, outputs: int, end: float, latencies: list, failures: list) -> None:
    loop = asyncio.get_running_loop()
    closed = loop.create_future()
    try:
        await loop.create_connection(
            lambda: Client(request, outputs, end, latencies, failures, closed), "127.0.0.1", port
        )
    except OSError as exc:
        failures.append(repr(exc))
        return
    await closed


def request_bytes(model: str, sample: np.ndarray) -> bytes:
    """One predict request of ``sample`` (the row form, JSON) on a keep-alive connection."""
    body = json.dumps({"instances": sample.tolist()}).encode()
    return (
        f"POST /v1/models/{model}:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def clients_of_one_loop(port: int, request: bytes, outputs: int, clients: int, end: float) -> tuple:
    """``clients`` clients in this process's loop until ``end``: their latencies, failures and the
    CPU seconds this thread spent on them."""
    latencies, failures = [], []
    used = time.thread_time()
    await asyncio.gather(*(client(port, request, outputs, end, latencies, failures) for _ in range(clients)))
    return latencies, failures, time.thread_time() - used


def _client_process(port: int, request: bytes, outputs: int, clients: int, end: float) -> tuple:
    return asyncio.run(clients_of_one_loop(port, request, outputs, clients, end))


def load(
    port: int,
    model: str,
    sample: np.ndarray,
    outputs: int,
    clients: int,
    seconds: float,
    processes: int = 1,
    server_pid: int | None = None,
) -> dict:
    """``clients`` clients for ``seconds``, spread over ``processes`` client processes (each one
    asyncio loop: one loop alone tops out near several thousand requests/s, and its queueing would
    show as the server's latency), and the CPU the server (process ``server_pid`` and its children)
    and the clients spent per request."""
    request = request_bytes(model, sample)
    processes = max(1, min(processes, clients))
    server_used = process_tree_cpu(server_pid)
    own_used = process_cpu(server_pid)
    start = time.perf_counter()
    end = start + seconds
    if processes == 1:
        latencies, failures, client_used = asyncio.run(clients_of_one_loop(port, request, outputs, clients, end))
    else:
        shares = [clients // processes + (i < clients % processes) for i in range(processes)]
        with concurrent.futures.ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork")) as pool:
            parts = list(pool.map(_client_process, *zip(*[(port, request, outputs, n, end) for n in shares])))
        latencies = [t for part in parts for t in part[0]]
        failures = [f for part in parts for f in part[1]]
        client_used = sum(part[2] for part in parts)
    elapsed = time.perf_counter() - start
    server_used = None if server_used is None else process_tree_cpu(server_pid) - server_used
    own_used = None if own_used is None else process_cpu(server_pid) - own_used
    done = max(len(latencies), 1)
    return {
        "clients": clients,
        "client_processes": processes,
        "requests": len(latencies),
        "requests_per_s": round(len(latencies) / elapsed, 1),
        **percentiles(latencies or [0.0]),
        "failed": len(failures),
        "failures": failures[:3],
        "server_cpu_ms_per_request": None if server_used is None else round(server_used / done * 1e3, 3),
        # the split: the process that owns the device (its batchers, pipes, the driver's threads; with one
        # HTTP worker also the HTTP and JSON) and the rest (HTTP fronts, parse workers)
        "model_process_cpu_ms_per_request": None if own_used is None else round(own_used / done * 1e3, 3),
        "fronts_cpu_ms_per_request": None
        if server_used is None or own_used is None
        else round((server_used - own_used) / done * 1e3, 3),
        "client_cpu_ms_per_request": round(client_used / done * 1e3, 3),
        # the share of the host's cores the server and the clients kept busy: near 1, the cores are the limit
        "cores_busy": None if server_used is None else round((server_used + client_used) / (elapsed * CORES), 2),
    }


def process_cpu(pid: int | None) -> float | None:
    """CPU seconds (user and system, every thread) used so far by process ``pid`` alone, from /proc;
    None where there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, TypeError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree_cpu(pid: int | None) -> float | None:
    """CPU seconds (user and system) used so far by process ``pid`` and its descendants (its HTTP
    fronts, parse workers, the device driver's threads), from /proc; None where there is no /proc."""
    if pid is None or not os.path.isdir(f"/proc/{pid}"):
        return None
    parents, used = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        used[int(entry)] = int(fields[11]) + int(fields[12])
    tree, grew = {pid}, True
    while grew:
        more = {p for p, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(used.get(p, 0) for p in tree) / os.sysconf("SC_CLK_TCK")


def serve_points(
    path: Path,
    sample,
    outputs: int,
    seconds: float,
    workers: int,
    timeout,
    http_workers: int = 1,
    client_processes: int = 1,
) -> dict:
    """A server of ``path`` (batching with ``timeout`` us of wait, or none where None) under 1, 8
    and 64 clients: each point's figures and mean batch, and the server's exit status."""
    server = Server(path, timeout is not None, workers, timeout or 0, http_workers)
    mode = "off" if timeout is None else f"on ({timeout} us)"
    try:
        load(server.port, path.stem, sample, outputs, 4, 1.0)  # connections and plans warm
        points = []
        for clients in CLIENTS:
            before = server.tallies(path.stem)
            point = load(server.port, path.stem, sample, outputs, clients, seconds, client_processes, server.proc.pid)
            point.update(stages(before, server.tallies(path.stem), point["mean_ms"]))
            print(
                f"  http workers {http_workers}, parse workers {workers}, batching {mode}, {clients} clients: {point}",
                flush=True,
            )
            points.append(point)
    finally:
        status = server.stop()
    return {"points": points, "exit_status": status}


def median_run(rounds: list) -> dict:
    """The runs of one server configuration (:func:`serve_points`, one a round) as one: each point's
    figures the median over the rounds, its requests and failures their sums, the worst exit status;
    with the rounds themselves under ``rounds`` where there is more than one."""
    if len(rounds) == 1:
        return rounds[0]
    points = []
    for same in zip(*(run["points"] for run in rounds)):
        point = dict(same[0])
        for key, value in same[0].items():
            values = [p[key] for p in same]
            if key in ("requests", "failed"):
                point[key] = sum(values)
            elif key == "failures":
                point[key] = [f for v in values for f in v][:3]
            elif isinstance(value, (int, float)) and key not in ("clients", "client_processes") and None not in values:
                point[key] = round(float(np.median(values)), 3)
        points.append(point)
    status = max((run["exit_status"] for run in rounds), key=lambda code: code != 0)
    return {"points": points, "exit_status": status, "rounds": rounds}


def importable(name: str) -> bool:
    try:
        importlib.import_module(name)
        return True
    except ImportError:
        return False


def device_slug(device) -> str:
    if "Portable Computing Language" in device.platform:
        return f"pocl_{device.type.lower()}"
    return "_".join("".join(c if c.isalnum() else " " for c in device.name.lower()).split())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 s per point, MobileNetV2 at 64 x 64")
    parser.add_argument("--seconds", type=float, help="seconds per point (default 5; 3 with --quick)")
    parser.add_argument("--size", type=int, help="MobileNetV2's input size (default 96; 64 with --quick)")
    parser.add_argument(
        "--json",
        "--out",
        dest="json",
        help="where to write the results (default benchmarks/results/serve_<device>.json)",
    )
    parser.add_argument(
        "--parse-workers",
        type=int,
        nargs="+",
        help="the servers' --parse-workers, each run in turn (default: 0 and the server's default here)",
    )
    parser.add_argument(
        "--http-workers",
        type=int,
        nargs="+",
        default=[1],
        help="the servers' --http-workers, each run in turn with each --parse-workers (default 1)",
    )
    parser.add_argument(
        "--batch-timeout-micros",
        type=int,
        nargs="+",
        default=[0],
        help="the batching servers' --batch-timeout-micros, each run in turn (default 0; the first is 'on', "
        "the others 'on_<t>us')",
    )
    parser.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="processes the clients are spread over, each one asyncio loop (default 1)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="times each server configuration's batching-off and batching-on servers run, alternately; each "
        "point is the median over the rounds and the speedup the median of each round's (default 1)",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=["partial_mnist", "mobilenetv2"],
        help="the models to run (default: both)",
    )
    parser.add_argument(
        "--models",
        type=Path,
        help="a folder holding mobilenetv2_<size>.keras (default: saved here by Keras in a child process)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be 1 or more, got {args.rounds}")
    seconds = args.seconds or (3.0 if args.quick else 5.0)
    size = args.size or (64 if args.quick else 96)
    device = malinn.get_device()
    workers = args.parse_workers or sorted({0, default_parse_workers()})
    timeouts = args.batch_timeout_micros
    results = {
        "device": device.name,
        "platform": device.platform,
        "command": shlex.join(sys.argv if argv is None else [sys.argv[0], *argv]),
        "seconds_per_point": seconds,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "parse_workers": workers,
        "http_workers": args.http_workers,
        "client_processes": args.client_processes,
        "batch_timeout_micros": timeouts,
        "rounds": args.rounds,
        # what the servers ran on: uvicorn takes httptools and uvloop, malinn orjson, where installed
        "server_stack": {
            "http": "httptools" if importable("httptools") else "h11",
            "loop": "uvloop" if importable("uvloop") else "asyncio",
            "json_reader": "orjson" if importable("orjson") else "json",
        },
        "models": {},
        "targets": {},
    }
    with tempfile.TemporaryDirectory(prefix="malinn-serve-bench-") as folder:
        only = set(args.only or ["partial_mnist", "mobilenetv2"])
        files = {}
        if "partial_mnist" in only:
            files["Partial MNIST"] = partial_mnist(Path(folder) / "partial_mnist.malinn")
        if "mobilenetv2" in only:
            files[f"MobileNetV2 {size}x{size}"] = mobilenet(Path(folder) / "mobilenetv2.keras", size, args.models)
        for name, path in files.items():
            model = malinn.load_model(path)
            shape, outputs = tuple(model.input_shape[1:]), int(model.output_shape[-1])
            del model
            row = {"input_shape": list(shape), "in_process": in_process(path, seconds), "serve": {}}
            # the most batching can give any server of this model on this device: the device's samples/s at
            # batch 64 over its calls/s at batch 1, both in-process (below 4, the 4x target is out of reach)
            ceiling = row["in_process"]["batch64_samples_per_s"] / row["in_process"]["batch1_calls_per_s"]
            row["device_batching_ceiling"] = round(ceiling, 2)
            row["request_path"] = request_path(path, seconds)
            print(
                f"{name}: in-process {row['in_process']} (batching ceiling on this device {ceiling:.2f}x)\n"
                f"  request path {row['request_path']}",
                flush=True,
            )
            sample = np.random.default_rng(1).random((1,) + shape, dtype=np.float32)
            row["serve_runs"], row["targets_by_run"] = {}, {}
            for fronts in args.http_workers:
                for count in workers:
                    runs = {}
                    modes = [("off", None)] + [("on" if i == 0 else f"on_{t}us", t) for i, t in enumerate(timeouts)]
                    by_round: dict = {mode: [] for mode, _ in modes}
                    for _ in range(args.rounds):  # alternately, so that a slow spell of the host hits both modes
                        for mode, timeout in modes:
                            by_round[mode].append(
                                serve_points(
                                    path, sample, outputs, seconds, count, timeout, fronts, args.client_processes
                                )
                            )
                    for mode, _ in modes:
                        runs[mode] = median_run(by_round[mode])
                    off = {p["clients"]: p for p in runs["off"]["points"]}
                    for mode, timeout in modes[1:]:
                        on = {p["clients"]: p for p in runs[mode]["points"]}
                        tail = mode[2:]
                        speedups = [
                            on_run["points"][-1]["requests_per_s"] / off_run["points"][-1]["requests_per_s"]
                            for on_run, off_run in zip(by_round[mode], by_round["off"])
                        ]
                        runs["batching_speedup_64" + tail] = round(float(np.median(speedups)), 2)
                        if args.rounds > 1:
                            runs["batching_speedup_64_by_round" + tail] = [round(x, 2) for x in speedups]
                        runs["p99_64_over_p50_1" + tail] = round(on[64]["p99_ms"] / on[1]["p50_ms"], 2)
                        # clients that send back to back wait 64 / (requests/s) on average (Little's law), so
                        # the p99 at 64 clients is at least that: the least p99@64 / p50@1 this throughput allows
                        runs["p99_64_over_p50_1_floor" + tail] = round(
                            64e3 / on[64]["requests_per_s"] / on[1]["p50_ms"], 2
                        )
                    # each server's 64-client requests/s against what the device itself runs in-process: batch-1
                    # serving against batch-1 calls/s, batching against batch-64 samples/s (near 1: the device
                    # is the limit; far below: the HTTP, JSON and the host's cores are)
                    device = row["in_process"]
                    off64 = off[64]["requests_per_s"]
                    runs["batch1_serving_over_in_process"] = round(off64 / device["batch1_calls_per_s"], 3)
                    runs["batching_serving_over_in_process"] = round(
                        runs["on"]["points"][-1]["requests_per_s"] / device["batch64_samples_per_s"], 3
                    )
                    key = f"http{fronts}_parse{count}"
                    row["serve_runs"][key] = runs
                    row["targets_by_run"][key] = {
                        "no_failed_request": all(
                            p["failed"] == 0 for run in runs.values() if isinstance(run, dict) for p in run["points"]
                        ),
                        "batching_4x_at_64": runs["batching_speedup_64"] >= 4.0,
                        "p99_64_within_10x_p50_1": runs["p99_64_over_p50_1"] <= 10.0,
                        "batching_speedup_64": runs["batching_speedup_64"],
                        "device_batching_ceiling": row["device_batching_ceiling"],
                        "p99_64_over_p50_1": runs["p99_64_over_p50_1"],
                        "p99_64_over_p50_1_floor": runs["p99_64_over_p50_1_floor"],
                        "batch1_serving_over_in_process": runs["batch1_serving_over_in_process"],
                        "batching_serving_over_in_process": runs["batching_serving_over_in_process"],
                    }
            first = args.http_workers[0]
            row["serve_by_parse_workers"] = {str(c): row["serve_runs"][f"http{first}_parse{c}"] for c in workers}
            last = row["serve_runs"][f"http{args.http_workers[-1]}_parse{workers[-1]}"]
            row["serve"] = {mode: last[mode] for mode in ("on", "off")}
            row["batching_speedup_64"] = last["batching_speedup_64"]
            row["p99_64_over_p50_1"] = last["p99_64_over_p50_1"]
            row["p99_64_over_p50_1_floor"] = last["p99_64_over_p50_1_floor"]
            results["models"][name] = row
            results["targets"][name] = {
                "no_failed_request": all(t["no_failed_request"] for t in row["targets_by_run"].values()),
                "batching_4x_at_64": row["batching_speedup_64"] >= 4.0,
                "p99_64_within_10x_p50_1": row["p99_64_over_p50_1"] <= 10.0,
                # whether the device itself gives 4x at batch 64: where not, no server meets the 4x target
                "device_allows_4x": row["device_batching_ceiling"] >= 4.0,
            }
            print(
                f"  {results['targets'][name]} with {args.http_workers[-1]} HTTP workers, {workers[-1]} parse "
                f"workers (speedup {row['batching_speedup_64']} of a device ceiling of "
                f"{row['device_batching_ceiling']}, p99@64 / p50@1 {row['p99_64_over_p50_1']}, at least "
                f"{row['p99_64_over_p50_1_floor']} at that throughput; batch-1 serving at 64 clients "
                f"{last['batch1_serving_over_in_process']:.0%} of in-process batch-1 calls/s, batching "
                f"{last['batching_serving_over_in_process']:.0%} of in-process batch-64 samples/s)",
                flush=True,
            )
    out = Path(args.json) if args.json else ROOT / "benchmarks" / "results" / f"serve_{device_slug(device)}.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
