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
  p50, p99, failed requests (any answer but 200 with one prediction of the model's output size, or
  a connection error) and the mean samples per predict call (the server's batch-size histogram).
  The clients are one asyncio loop in this process, or spread over --client-processes processes of
  one loop each (a loop alone tops out near a few thousand requests/s on one core). Each of --http-workers (default 1: the
  server's own process answers HTTP; N: N front processes parse and answer, the model process runs
  the batches) and each of --parse-workers (default: 0, the request parse in the server's process,
  and the server's default count) is run in turn: ``serve_runs`` holds each pair
  (``http<N>_parse<M>``, with its targets in ``targets_by_run``), ``serve_by_parse_workers`` those
  of the first --http-workers, ``serve`` and ``targets`` the last pair.

* ``request_path``: what one predict request of one sample costs the server's process besides
  the model, each step timed alone in this process (median of --seconds of calls): the JSON body's
  bytes, ``json.loads`` of it, the nested lists to a float32 array, malinn's whole request parse
  (``parse_predict_ms``: both and the checks), the output to the response's JSON bytes; and
  ``numpy_text_parse_ms``, numpy's C text reader (``np.fromstring``) on the numbers alone (brackets
  and whitespace removed, nothing checked), which is no faster than ``json.loads`` (each number's
  correctly rounded conversion costs as much); ``worker_parse_ms``, the same parse sent to a parse worker process and its arrays
  back (one worker, one request at a time), ``worker_encode_ms`` the response's encoding there,
  and the CPU time this process spends on each either way (``parse_predict_cpu_ms``,
  ``worker_parse_cpu_ms``, ``encode_response_cpu_ms``, ``worker_encode_cpu_ms``): what the
  server's own process pays per request, which bounds its requests/s.

The serving targets, checked in ``targets``: no failed request; at 64 clients batching on gives
>= 4x the requests/s of batching off; p99 at 64 clients (batching on) <= 10x p50 at one client.

Run:  python3 benchmarks/serve.py [--quick] [--seconds 5] [--size 96] [--parse-workers 0 8]
      [--http-workers 1 4] [--batch-timeout-micros 0 1000] [--json PATH]
(default PATH: benchmarks/results/serve_<device>.json; --quick: 3 s per point and --size 64)
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import multiprocessing
import os
import re
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
    return {"p50_ms": round(float(np.percentile(ms, 50)), 3), "p99_ms": round(float(np.percentile(ms, 99)), 3)}


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
        "lists_to_array_ms": lambda: np.asarray(lists).astype(np.float32),
        "parse_predict_ms": lambda: parse_predict(body, signature),
        "numpy_text_parse_ms": lambda: np.fromstring(numbers, sep=","),
        "encode_response_ms": lambda: dumps(format_predict(outputs, signature, False)),
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

    def batches(self, model: str) -> tuple:
        """The server's predict calls of ``model`` so far and their samples."""
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("GET", "/monitoring/prometheus/metrics")
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
        found = dict(
            re.findall(rf'^malinn_serve_batch_size_(count|sum){{model="{re.escape(model)}"[^}}]*}} (\S+)$', text, re.M)
        )
        return float(found.get("count", 0)), float(found.get("sum", 0))

    def stop(self) -> int:
        self.proc.terminate()
        self.proc.stderr.close()
        return self.proc.wait(120)


async def client(port: int, request: bytes, outputs: int, end: float, latencies: list, failures: list) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        failures.append(repr(exc))
        return
    try:
        while time.perf_counter() < end:
            start = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])
            body = await reader.readexactly(length)
            latencies.append(time.perf_counter() - start)
            if not head.startswith(b"HTTP/1.1 200"):
                failures.append(head.split(b"\r\n")[0].decode() + " " + body[:200].decode(errors="replace"))
            elif len(json.loads(body)["predictions"][0]) != outputs:
                failures.append("a prediction of another size")
    except (OSError, asyncio.IncompleteReadError) as exc:
        failures.append(repr(exc))
    finally:
        writer.close()


def request_bytes(model: str, sample: np.ndarray) -> bytes:
    """One predict request of ``sample`` (the row form, JSON) on a keep-alive connection."""
    body = json.dumps({"instances": sample.tolist()}).encode()
    return (
        f"POST /v1/models/{model}:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def clients_of_one_loop(port: int, request: bytes, outputs: int, clients: int, end: float) -> tuple:
    """``clients`` clients in this process's loop until ``end``: their latencies and failures."""
    latencies, failures = [], []
    await asyncio.gather(*(client(port, request, outputs, end, latencies, failures) for _ in range(clients)))
    return latencies, failures


def _client_process(port: int, request: bytes, outputs: int, clients: int, end: float) -> tuple:
    return asyncio.run(clients_of_one_loop(port, request, outputs, clients, end))


def load(
    port: int, model: str, sample: np.ndarray, outputs: int, clients: int, seconds: float, processes: int = 1
) -> dict:
    """``clients`` clients for ``seconds``, spread over ``processes`` client processes (each one
    asyncio loop: one loop alone tops out near a few thousand requests/s, and its queueing would
    show as the server's latency)."""
    request = request_bytes(model, sample)
    processes = max(1, min(processes, clients))
    start = time.perf_counter()
    end = start + seconds
    if processes == 1:
        latencies, failures = asyncio.run(clients_of_one_loop(port, request, outputs, clients, end))
    else:
        shares = [clients // processes + (i < clients % processes) for i in range(processes)]
        with concurrent.futures.ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork")) as pool:
            parts = list(pool.map(_client_process, *zip(*[(port, request, outputs, n, end) for n in shares])))
        latencies = [t for part in parts for t in part[0]]
        failures = [f for part in parts for f in part[1]]
    elapsed = time.perf_counter() - start
    return {
        "clients": clients,
        "client_processes": processes,
        "requests": len(latencies),
        "requests_per_s": round(len(latencies) / elapsed, 1),
        **percentiles(latencies or [0.0]),
        "failed": len(failures),
        "failures": failures[:3],
    }


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
            calls, samples = server.batches(path.stem)
            point = load(server.port, path.stem, sample, outputs, clients, seconds, client_processes)
            calls_after, samples_after = server.batches(path.stem)
            point["mean_batch"] = round((samples_after - samples) / max(calls_after - calls, 1), 2)
            print(
                f"  http workers {http_workers}, parse workers {workers}, batching {mode}, {clients} clients: {point}",
                flush=True,
            )
            points.append(point)
    finally:
        status = server.stop()
    return {"points": points, "exit_status": status}


def device_slug(device) -> str:
    if "Portable Computing Language" in device.platform:
        return f"pocl_{device.type.lower()}"
    return "_".join("".join(c if c.isalnum() else " " for c in device.name.lower()).split())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 s per point, MobileNetV2 at 64 x 64")
    parser.add_argument("--seconds", type=float, help="seconds per point (default 5; 3 with --quick)")
    parser.add_argument("--size", type=int, help="MobileNetV2's input size (default 96; 64 with --quick)")
    parser.add_argument("--json", help="where to write the results (default benchmarks/results/serve_<device>.json)")
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
        "--models",
        type=Path,
        help="a folder holding mobilenetv2_<size>.keras (default: saved here by Keras in a child process)",
    )
    args = parser.parse_args(argv)
    seconds = args.seconds or (3.0 if args.quick else 5.0)
    size = args.size or (64 if args.quick else 96)
    device = malinn.get_device()
    workers = args.parse_workers or sorted({0, default_parse_workers()})
    timeouts = args.batch_timeout_micros
    results = {
        "device": device.name,
        "platform": device.platform,
        "seconds_per_point": seconds,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "parse_workers": workers,
        "http_workers": args.http_workers,
        "client_processes": args.client_processes,
        "batch_timeout_micros": timeouts,
        "models": {},
        "targets": {},
    }
    with tempfile.TemporaryDirectory(prefix="malinn-serve-bench-") as folder:
        files = {
            "Partial MNIST": partial_mnist(Path(folder) / "partial_mnist.malinn"),
            f"MobileNetV2 {size}x{size}": mobilenet(Path(folder) / "mobilenetv2.keras", size, args.models),
        }
        for name, path in files.items():
            model = malinn.load_model(path)
            shape, outputs = tuple(model.input_shape[1:]), int(model.output_shape[-1])
            del model
            row = {"input_shape": list(shape), "in_process": in_process(path, seconds), "serve": {}}
            row["request_path"] = request_path(path, seconds)
            print(f"{name}: in-process {row['in_process']}\n  request path {row['request_path']}", flush=True)
            sample = np.random.default_rng(1).random((1,) + shape, dtype=np.float32)
            row["serve_runs"], row["targets_by_run"] = {}, {}
            for fronts in args.http_workers:
                for count in workers:
                    runs = {}
                    modes = [("off", None)] + [("on" if i == 0 else f"on_{t}us", t) for i, t in enumerate(timeouts)]
                    for mode, timeout in modes:
                        runs[mode] = serve_points(
                            path, sample, outputs, seconds, count, timeout, fronts, args.client_processes
                        )
                    off = {p["clients"]: p for p in runs["off"]["points"]}
                    for mode, timeout in modes[1:]:
                        on = {p["clients"]: p for p in runs[mode]["points"]}
                        tail = mode[2:]
                        runs["batching_speedup_64" + tail] = round(
                            on[64]["requests_per_s"] / off[64]["requests_per_s"], 2
                        )
                        runs["p99_64_over_p50_1" + tail] = round(on[64]["p99_ms"] / on[1]["p50_ms"], 2)
                    key = f"http{fronts}_parse{count}"
                    row["serve_runs"][key] = runs
                    row["targets_by_run"][key] = {
                        "no_failed_request": all(
                            p["failed"] == 0 for run in runs.values() if isinstance(run, dict) for p in run["points"]
                        ),
                        "batching_4x_at_64": runs["batching_speedup_64"] >= 4.0,
                        "p99_64_within_10x_p50_1": runs["p99_64_over_p50_1"] <= 10.0,
                        "batching_speedup_64": runs["batching_speedup_64"],
                        "p99_64_over_p50_1": runs["p99_64_over_p50_1"],
                    }
            first = args.http_workers[0]
            row["serve_by_parse_workers"] = {str(c): row["serve_runs"][f"http{first}_parse{c}"] for c in workers}
            last = row["serve_runs"][f"http{args.http_workers[-1]}_parse{workers[-1]}"]
            row["serve"] = {mode: last[mode] for mode in ("on", "off")}
            row["batching_speedup_64"] = last["batching_speedup_64"]
            row["p99_64_over_p50_1"] = last["p99_64_over_p50_1"]
            results["models"][name] = row
            results["targets"][name] = {
                "no_failed_request": all(t["no_failed_request"] for t in row["targets_by_run"].values()),
                "batching_4x_at_64": row["batching_speedup_64"] >= 4.0,
                "p99_64_within_10x_p50_1": row["p99_64_over_p50_1"] <= 10.0,
            }
            print(
                f"  {results['targets'][name]} with {args.http_workers[-1]} HTTP workers, {workers[-1]} parse "
                f"workers (speedup "
                f"{row['batching_speedup_64']}, p99@64 / p50@1 {row['p99_64_over_p50_1']})",
                flush=True,
            )
    out = Path(args.json) if args.json else ROOT / "benchmarks" / "results" / f"serve_{device_slug(device)}.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
