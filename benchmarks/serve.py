"""malinn serve under load on loopback: requests/s and latency at 1, 8 and 64 concurrent clients,
dynamic batching on and off, beside the same model called in-process in the same run.

For Partial MNIST (640-150-10, ReLU, random weights: benchmarks/models.py's network) and
MobileNetV2 (keras.applications, random weights, saved by Keras in a process of its own at
--size x --size x 3), on the device malinn chooses (``MALINN_DEVICE`` is honoured):

* ``in_process``: ``model.predict`` of one sample in a loop for --seconds (the peer: what a
  program calling malinn itself gets), its calls/s, p50 and p99; and of 64 samples (the device's
  throughput ceiling in samples/s);
* ``serve``: a ``malinn serve`` process (--port 0 on 127.0.0.1) per model and batching mode
  (``on``: --max-batch-size 64, no batch timeout; ``off``: --no-batching), and for each of 1, 8
  and 64 clients, each client sending one-sample predicts (the row form, JSON) back to back on
  its own keep-alive connection for --seconds: requests/s, p50, p99 and failed requests (any answer
  but 200 with one prediction of the model's output size, or a connection error). The clients are
  one asyncio loop in this process.

The serving targets, checked in ``targets``: no failed request; at 64 clients batching on gives
>= 4x the requests/s of batching off; p99 at 64 clients (batching on) <= 10x p50 at one client.

Run:  python3 benchmarks/serve.py [--quick] [--seconds 5] [--size 96] [--json PATH]
(default PATH: benchmarks/results/serve_<device>.json; --quick: 3 s per point and --size 64)
"""

from __future__ import annotations

import argparse
import asyncio
import json
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


class Server:
    def __init__(self, path: Path, batching: bool):
        args = ["--max-batch-size", "64"] if batching else ["--no-batching"]
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


async def load(port: int, model: str, sample: np.ndarray, outputs: int, clients: int, seconds: float) -> dict:
    body = json.dumps({"instances": sample.tolist()}).encode()
    request = (
        f"POST /v1/models/{model}:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    latencies, failures = [], []
    start = time.perf_counter()
    await asyncio.gather(
        *(client(port, request, outputs, start + seconds, latencies, failures) for _ in range(clients))
    )
    elapsed = time.perf_counter() - start
    return {
        "clients": clients,
        "requests": len(latencies),
        "requests_per_s": round(len(latencies) / elapsed, 1),
        **percentiles(latencies or [0.0]),
        "failed": len(failures),
        "failures": failures[:3],
    }


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
        "--models",
        type=Path,
        help="a folder holding mobilenetv2_<size>.keras (default: saved here by Keras in a child process)",
    )
    args = parser.parse_args(argv)
    seconds = args.seconds or (3.0 if args.quick else 5.0)
    size = args.size or (64 if args.quick else 96)
    device = malinn.get_device()
    results = {
        "device": device.name,
        "platform": device.platform,
        "seconds_per_point": seconds,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
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
            print(f"{name}: in-process {row['in_process']}", flush=True)
            sample = np.random.default_rng(1).random((1,) + shape, dtype=np.float32)
            for mode in ("on", "off"):
                server = Server(path, batching=mode == "on")
                try:
                    asyncio.run(load(server.port, path.stem, sample, outputs, 4, 1.0))  # connections and plans warm
                    points = []
                    for clients in CLIENTS:
                        point = asyncio.run(load(server.port, path.stem, sample, outputs, clients, seconds))
                        print(f"  batching {mode}, {clients} clients: {point}", flush=True)
                        points.append(point)
                finally:
                    status = server.stop()
                row["serve"][mode] = {"points": points, "exit_status": status}
            on, off = ({p["clients"]: p for p in row["serve"][m]["points"]} for m in ("on", "off"))
            row["batching_speedup_64"] = round(on[64]["requests_per_s"] / off[64]["requests_per_s"], 2)
            row["p99_64_over_p50_1"] = round(on[64]["p99_ms"] / on[1]["p50_ms"], 2)
            results["models"][name] = row
            results["targets"][name] = {
                "no_failed_request": all(p["failed"] == 0 for m in ("on", "off") for p in row["serve"][m]["points"]),
                "batching_4x_at_64": row["batching_speedup_64"] >= 4.0,
                "p99_64_within_10x_p50_1": row["p99_64_over_p50_1"] <= 10.0,
            }
            print(
                f"  {results['targets'][name]} (speedup {row['batching_speedup_64']}, "
                f"p99@64 / p50@1 {row['p99_64_over_p50_1']})",
                flush=True,
            )
    out = Path(args.json) if args.json else ROOT / "benchmarks" / "results" / f"serve_{device_slug(device)}.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
