"""A predict's fixed costs: moving its input to the device and back, and a launch before it reads a byte.

1. Transfers. A plan uploads each input buffer whole. For the input sizes of the Table 10.5
   networks at batch 1 and 100 (640 to 3072 features), what each way of doing that costs, host to
   device and back, blocking at the end of each (medians of --repeat):

   * ``pageable``: ``enqueue_copy`` from the caller's numpy array (the driver stages it itself);
   * ``pinned_copy``: numpy copy into a page-locked staging array (``Device.host_array``), then
     ``enqueue_copy`` from it (what ``Plan.run`` does);
   * ``pinned_only``: ``enqueue_copy`` from the page-locked array alone (the DMA, no host copy: the
     lower bound of the two above);
   * ``host_copy``: the numpy copy into the page-locked array alone;
   * ``chunked``: the staging copy in --chunks pieces, each piece's upload enqueued as soon as it is
     copied (the host copy overlaps the DMA);
   * ``download``: the blocking read of a (batch x 10) output into a page-locked array.

2. Large batches at the bus's pace. For the Table 10.5 networks' inputs at the batches that
   ``throughput.py`` runs (8192 x 256, 1024 x 3072, 8192 x 640, 784 and 3072: 8.4 to 101 MB) and
   two sizes between (2048 x 784 and 4096 x 784: 6.4 and 12.8 MB), host to device and back, each
   blocking at its end (medians of --repeat, at most 30), in GB/s:

   * ``pageable_write`` / ``pageable_read``: ``enqueue_copy`` to or from the caller's numpy array;
   * ``pinned_write`` / ``pinned_read``: ``enqueue_copy`` to or from a page-locked array alone (the
     bus's limit: no host copy);
   * ``staged_write`` / ``staged_read``: malinn's staging ring (``Device.staging_ring``,
     malinn/backends/opencl_staging.py) moving the caller's array in chunks through page-locked
     slots, the host's copies overlapping the DMA: what ``Plan.run`` does for such an input;
   * ``host_ptr_write``: a ``CL_MEM_USE_HOST_PTR`` buffer made over the caller's array, copied into
     the device's buffer and released, each call: the driver may pin the caller's own pages (what a
     predict of a new array would pay for that);
   * ``staged_over_pinned``: the staged upload's rate over the page-locked one's (1.0: the bus's pace).

   ``ring`` says the chunk, slots and copy threads the device decided. On a device that shares the
   host's memory (PoCL), which makes no ring by default, the ring is forced (``MALINN_STAGING=1``;
   ``forced`` says so). ``--sweep`` also times 8192 x 640's staged upload for copy threads
   1, 2, 4, 6, 8 and chunks of 1, 2, 4, 8 MiB (``sweep``): the figures to choose the defaults from.
   ``--devices N`` also uploads each size in one share per GPU to N OpenCL GPUs at once, every
   share enqueued by one thread as a predict spread over them does (``parallel``: GB/s of the whole
   array, from page-locked and from pageable memory, beside one GPU's upload of all of it): the
   ceiling of a transfer-bound predict on several GPUs of one host.

3. The launch floor. A batch-1 Dense layer streams its weights once, so its kernel time is
   ``fixed + bytes / rate``; the fixed part decides how much a narrower precision or one launch
   fewer can gain. OpenCL profiling events, each launch after a kernel that reads --flush-mib MiB (so
   the data is cold, as in a network): an empty kernel of one item and of 4096 work-groups of 256, a
   4 KiB buffer copy, an empty kernel queued right behind a 12.5 MB stream (as a network's next
   layer is), and a streaming read (float4 loads) of each size; ``fixed`` and ``rate`` are the
   least-squares line through the reads of 4 MB and more. Peer (where torch sees a CUDA GPU): the
   same read as ``torch.sum`` and cuBLAS's matrix-vector product of the Full CIFAR layers in float32
   and float16, CUDA events around each call (its launch included).

The results go to ``benchmarks/results/transfers_<device>.json`` unless --out says otherwise.
--quick: 20 repeats, three stream sizes, a 16 MiB flush.

Run:  python benchmarks/transfers.py [--device D] [--repeat 200] [--chunks 4] [--sweep] [--devices N] [--quick] [--out PATH]
"""

from __future__ import annotations

import os
import sys

import harness
import numpy as np
import pyopencl as cl
from harness import median_time, torch_cuda

import malinn

SIZES = [(1, 640), (1, 3072), (100, 784), (100, 3072)]
#: the large batches: the Table 10.5 networks' inputs at throughput.py's batches, and sizes between
#: them (where a staging ring starts to beat the driver's pageable copy: STAGED_MIN_BYTES)
LARGE_SIZES = [(2048, 784), (8192, 256), (1024, 3072), (4096, 784), (8192, 640), (8192, 784), (8192, 3072)]
#: the size --sweep times in every ring configuration
SWEEP_SIZE = (8192, 640)
SWEEP_THREADS = (2, 4, 6, 8, 12)
SWEEP_CHUNK_MIB = (0.5, 1, 2, 4)
STREAM_MB = [0.004, 0.25, 1, 4, 12.5, 25, 50, 100]
QUICK_STREAM_MB = [0.004, 4, 12.5]
#: cuBLAS matrix-vector shapes (units, inputs): Full CIFAR's two wide layers
GEMV_SHAPES = [(4096, 3072), (3072, 4096)]
SOURCE = """
__kernel void nothing(__global float *x) { }
__kernel void stream(__global const float4 *x, const uint n4, __global float *out)
{
    float4 s = (float4)(0.0f);
    for (uint i = get_global_id(0); i < n4; i += get_global_size(0))
        s += x[i];
    out[get_global_id(0)] = s.x + s.y + s.z + s.w;
}
"""


#: the stream an empty kernel is queued behind (a network's 12.5 MB layer)
CHAINED_BYTES = 12_500_000


def line(sizes_bytes, seconds):
    """Least-squares ``seconds = fixed + bytes / rate``: (fixed seconds, rate in bytes per second)."""
    slope, fixed = np.polyfit(np.asarray(sizes_bytes, float), np.asarray(seconds, float), 1)
    return float(fixed), float(1.0 / slope)


def opencl_figures(device, sizes_mb, flush_mib, repeat):
    ctx, queue = device.context, device.timing_queue  # events with the device's times
    program = cl.Program(ctx, SOURCE).build()
    nothing, stream = cl.Kernel(program, "nothing"), cl.Kernel(program, "stream")
    flush_n4 = flush_mib * 2**20 // 16
    biggest = max(int(s * 1e6) for s in sizes_mb)
    mf = cl.mem_flags
    data = cl.Buffer(ctx, mf.READ_WRITE, max(biggest, flush_n4 * 16 * 2, CHAINED_BYTES))  # every stream below fits
    cl.enqueue_fill_buffer(queue, data, np.float32(1.0), 0, data.size).wait()
    items = device.compute_units * 2048
    out = cl.Buffer(ctx, mf.READ_WRITE, 4 * items)
    small_src, small_dst = cl.Buffer(ctx, mf.READ_WRITE, 4096), cl.Buffer(ctx, mf.READ_WRITE, 4096)

    def flush():
        stream.set_args(data, np.uint32(flush_n4), out)
        cl.enqueue_nd_range_kernel(queue, stream, (items,), (256,))

    def timed(enqueue):
        times = []
        for _ in range(repeat + 1):
            flush()
            event = enqueue()
            event.wait()
            times.append((event.profile.end - event.profile.start) * 1e-9)
        return float(np.median(times[1:]))

    def run_stream(nbytes):
        n4 = nbytes // 16
        stream.set_args(data, np.uint32(n4), out)
        global_items = min(items, -(-n4 // 256) * 256)
        return cl.enqueue_nd_range_kernel(queue, stream, (global_items,), (256,))

    nothing.set_args(out)
    figures = {
        "empty_1_item_s": timed(lambda: cl.enqueue_nd_range_kernel(queue, nothing, (1,), (1,))),
        "empty_4096_groups_s": timed(lambda: cl.enqueue_nd_range_kernel(queue, nothing, (4096 * 256,), (256,))),
        "copy_4kib_s": timed(lambda: cl.enqueue_copy(queue, small_dst, small_src, byte_count=4096)),
        "stream": [{"mb": s, "s": timed(lambda s=s: run_stream(int(s * 1e6)))} for s in sizes_mb],
    }
    fit = [r for r in figures["stream"] if r["mb"] >= 4]
    fixed, rate = line([r["mb"] * 1e6 for r in fit], [r["s"] for r in fit])
    figures.update(fixed_s=fixed, rate_gbs=rate / 1e9)
    # an empty kernel queued right behind a 12.5 MB stream, as a network's next layer is: its event
    chained = []
    for _ in range(repeat + 1):
        flush()
        run_stream(CHAINED_BYTES)
        event = cl.enqueue_nd_range_kernel(queue, nothing, (1,), (1,))
        event.wait()
        chained.append((event.profile.end - event.profile.start) * 1e-9)
    figures["empty_after_a_kernel_s"] = float(np.median(chained[1:]))
    return figures


def torch_figures(torch, sizes_mb, gemv_shapes, flush_mib, repeat):
    flush_buffer = torch.ones(flush_mib * 2**18, device="cuda")

    def timed(fn):
        times = []
        for _ in range(repeat + 1):
            flush_buffer.sum()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        return float(np.median(times[1:]))

    one = torch.ones(1, device="cuda")
    figures = {"empty_add_s": timed(lambda: one.add_(0.0)), "stream": [], "gemv": []}
    for s in sizes_mb:
        x = torch.ones(int(s * 1e6) // 4, device="cuda")
        figures["stream"].append({"mb": s, "s": timed(lambda x=x: x.sum())})
    fit = [r for r in figures["stream"] if r["mb"] >= 4]
    fixed, rate = line([r["mb"] * 1e6 for r in fit], [r["s"] for r in fit])
    figures.update(fixed_s=fixed, rate_gbs=rate / 1e9)
    for units, inputs in gemv_shapes:
        row = {"units": units, "inputs": inputs}
        for name, dtype in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
            w = torch.randn(units, inputs, device="cuda").to(dtype)
            v = torch.randn(inputs, device="cuda").to(dtype)
            row[name + "_s"] = timed(lambda w=w, v=v: torch.mv(w, v))
        row["fp16_speedup"] = row["fp32_s"] / row["fp16_s"]
        figures["gemv"].append(row)
    return figures


def transfer_rows(device, repeat, chunks):
    """Per input size, each way's median seconds (see the module's docstring)."""
    queue = device.queue
    rows = []
    for batch, features in SIZES:
        x = np.random.default_rng(0).random((batch, features), dtype=np.float32)
        buffer = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, x.nbytes)
        staging = device.host_array(x.shape)
        out_buffer = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, batch * 10 * 4)
        out = device.host_array((batch, 10))
        bounds = np.linspace(0, batch * features, chunks + 1).astype(int)
        flat_x, flat_staging = x.reshape(-1), staging.reshape(-1)

        def pageable():
            cl.enqueue_copy(queue, buffer, x, is_blocking=False)
            queue.finish()

        def pinned_copy():
            staging[...] = x
            cl.enqueue_copy(queue, buffer, staging, is_blocking=False)
            queue.finish()

        def pinned_only():
            cl.enqueue_copy(queue, buffer, staging, is_blocking=False)
            queue.finish()

        def host_copy():
            staging[...] = x

        def chunked():
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                flat_staging[lo:hi] = flat_x[lo:hi]
                cl.enqueue_copy(queue, buffer, flat_staging[lo:hi], dst_offset=int(lo) * 4, is_blocking=False)
            queue.finish()

        def download():
            cl.enqueue_copy(queue, out, out_buffer, is_blocking=True)

        row = {"batch": batch, "features": features, "bytes": x.nbytes}
        for name, run in [
            ("pageable", pageable),
            ("pinned_copy", pinned_copy),
            ("pinned_only", pinned_only),
            ("host_copy", host_copy),
            ("chunked", chunked),
            ("download", download),
        ]:
            row[name] = median_time(run, repeat, warmup=5)
        rows.append(row)
        print(
            f"{batch:>4} x {features:<5} "
            + "  ".join(
                f"{k} {row[k] * 1e6:7.1f} us"
                for k in ("pageable", "pinned_copy", "pinned_only", "host_copy", "chunked", "download")
            ),
            flush=True,
        )
    return rows


def staging_ring(device, shape):
    """The ring the device decides for a buffer of ``shape`` (columns, rows), forced where it makes
    none (a device sharing the host's memory); and whether it was forced."""
    ring = device.staging_ring(shape, "the benchmark's input")
    if ring is not None:
        return ring, False
    previous = os.environ.get("MALINN_STAGING")
    os.environ["MALINN_STAGING"] = "1"
    try:
        return device.staging_ring(shape, "the benchmark's input"), True
    finally:
        if previous is None:
            del os.environ["MALINN_STAGING"]
        else:
            os.environ["MALINN_STAGING"] = previous


def large_rows(device, repeat, sweep):
    """Per large size, each way's GB/s up and down (see the module's docstring, part 2)."""
    queue = device.queue
    rows, sweeps = [], []
    for batch, features in LARGE_SIZES:
        x = np.random.default_rng(1).random((batch, features), dtype=np.float32)
        back = np.empty_like(x)
        buffer = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, x.nbytes)
        pinned = device.host_array(x.shape)
        pinned[...] = x
        ring, forced = staging_ring(device, (batch, features))

        def pageable_write():
            cl.enqueue_copy(queue, buffer, x, is_blocking=False)
            queue.finish()

        def pinned_write():
            cl.enqueue_copy(queue, buffer, pinned, is_blocking=False)
            queue.finish()

        def staged_write(ring=ring):
            ring.upload(queue, buffer, x)
            queue.finish()

        def host_ptr_write():
            wrapped = cl.Buffer(device.context, cl.mem_flags.READ_ONLY | cl.mem_flags.USE_HOST_PTR, hostbuf=x)
            cl.enqueue_copy(queue, buffer, wrapped)
            queue.finish()
            wrapped.release()

        def pageable_read():
            cl.enqueue_copy(queue, back, buffer, is_blocking=True)

        def pinned_read():
            cl.enqueue_copy(queue, pinned, buffer, is_blocking=True)

        def staged_read(ring=ring):
            ring.download(queue, buffer, back)

        row = {"batch": batch, "features": features, "bytes": x.nbytes, "forced": forced, "ring": ring.describe()}
        for name, run in [
            ("pageable_write", pageable_write),
            ("pinned_write", pinned_write),
            ("staged_write", staged_write),
            ("host_ptr_write", host_ptr_write),
            ("pageable_read", pageable_read),
            ("pinned_read", pinned_read),
            ("staged_read", staged_read),
        ]:
            seconds = median_time(run, repeat, warmup=3)
            row[name + "_s"], row[name + "_gbs"] = seconds, x.nbytes / seconds / 1e9
        np.testing.assert_array_equal(back, x)  # the staged read of the staged write: the caller's data
        row["staged_over_pinned"] = row["staged_write_gbs"] / row["pinned_write_gbs"]
        row["staged_read_over_pinned"] = row["staged_read_gbs"] / row["pinned_read_gbs"]
        rows.append(row)
        print(
            f"{batch} x {features:<5} {x.nbytes / 1e6:6.1f} MB  up: pageable {row['pageable_write_gbs']:5.1f}  "
            f"pinned {row['pinned_write_gbs']:5.1f}  staged {row['staged_write_gbs']:5.1f} GB/s "
            f"({row['staged_over_pinned']:.2f}x pinned)  host_ptr {row['host_ptr_write_gbs']:5.1f}   down: pageable {row['pageable_read_gbs']:5.1f}  "
            f"pinned {row['pinned_read_gbs']:5.1f}  staged {row['staged_read_gbs']:5.1f} GB/s"
            f"{'  (ring forced)' if forced else ''}; {row['ring']}",
            flush=True,
        )
        if sweep and (batch, features) == SWEEP_SIZE:
            kept = device.staging_threads, device.staging_chunk_bytes
            try:
                for threads in SWEEP_THREADS:
                    for mib in SWEEP_CHUNK_MIB:
                        device.staging_threads, device.staging_chunk_bytes = threads, int(mib * 2**20)
                        tried, _ = staging_ring(device, (batch, features))
                        seconds = median_time(lambda tried=tried: staged_write(tried), repeat, warmup=3)
                        sweeps.append(
                            {
                                "threads": threads,
                                "chunk_mib": mib,
                                "slots": len(tried.slots),
                                "staged_write_gbs": x.nbytes / seconds / 1e9,
                                "over_pinned": x.nbytes / seconds / 1e9 / row["pinned_write_gbs"],
                            }
                        )
                        print(
                            f"    sweep: {threads} threads, {mib} MiB chunks: {sweeps[-1]['staged_write_gbs']:5.1f} GB/s "
                            f"({sweeps[-1]['over_pinned']:.2f}x pinned)",
                            flush=True,
                        )
            finally:
                device.staging_threads, device.staging_chunk_bytes = kept
    return rows, sweeps


def parallel_rows(pool: list, repeat: int) -> list:
    """``--devices N``: per large size, the whole array uploaded to the first device, and in one
    share per device to all of them at once (every share's copy enqueued by one thread, then each
    queue finished: what a predict spread over them does), from page-locked memory (the first
    device's ``host_array``) and from the caller's pageable array; GB/s of the whole array."""
    rows = []
    for batch, features in LARGE_SIZES:
        x = np.random.default_rng(3).random((batch, features), dtype=np.float32)
        pinned = pool[0].host_array(x.shape, "the parallel-upload benchmark's page-locked memory")
        pinned[...] = x
        cuts = [batch * i // len(pool) for i in range(len(pool) + 1)]
        shares = [(d, cl.Buffer(d.context, cl.mem_flags.READ_WRITE, x.nbytes)) for d in pool]

        def upload(source, devices):
            parts = [source] if devices == 1 else [source[a:b] for a, b in zip(cuts[:-1], cuts[1:])]
            events = [
                cl.enqueue_copy(d.queue, buffer, part, is_blocking=False) for (d, buffer), part in zip(shares, parts)
            ]
            for d, _ in shares[:devices]:
                d.queue.finish()
            del events

        row = {"batch": batch, "features": features, "bytes": x.nbytes, "devices": len(pool)}
        for name, source in (("pinned", pinned), ("pageable", x)):
            for label, count in (("one", 1), ("all", len(pool))):
                seconds = median_time(lambda source=source, count=count: upload(source, count), repeat, warmup=3)
                row[f"{name}_{label}_gbs"] = x.nbytes / seconds / 1e9
            row[f"{name}_speedup"] = row[f"{name}_all_gbs"] / row[f"{name}_one_gbs"]
        rows.append(row)
        print(
            f"{batch} x {features:<5} {x.nbytes / 1e6:6.1f} MB  page-locked: one GPU {row['pinned_one_gbs']:5.1f}, "
            f"{len(pool)} at once {row['pinned_all_gbs']:5.1f} GB/s ({row['pinned_speedup']:.2f}x); pageable: "
            f"{row['pageable_one_gbs']:5.1f}, {row['pageable_all_gbs']:5.1f} GB/s ({row['pageable_speedup']:.2f}x)",
            flush=True,
        )
    return rows


#: host copies into page-locked memory: piece sizes (MB) and the threads each is cut over
HOST_COPY_MB = (0.5, 1, 2, 4, 8, 16)
HOST_COPY_THREADS = (1, 2, 4, 8, 12)


def host_copy_rows(device, repeat: int) -> dict:
    """``--host-copies``: what a staging ring's host side can do on this host. Each piece of
    ``HOST_COPY_MB`` copied from a pageable array into page-locked memory (``Device.host_array``), cut
    into one stripe per thread of a pool of ``HOST_COPY_THREADS`` (each stripe a task, as the ring
    hands chunks to its threads), beside the DMA of the piece from that memory; and the round trip
    of handing an empty task to a pool thread."""
    from concurrent.futures import ThreadPoolExecutor

    source = np.random.default_rng(2).random((64 << 20) // 4, dtype=np.float32)
    pinned = device.host_array(source.shape, "the host-copy benchmark's page-locked memory")
    buffer = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, source.nbytes)
    pools = {t: ThreadPoolExecutor(t) for t in HOST_COPY_THREADS}
    copies, dma = [], []
    try:
        for mb in HOST_COPY_MB:
            n = int(mb * (1 << 20)) // 4
            for threads, pool in pools.items():
                cuts = [n * i // threads for i in range(threads + 1)]

                def copy(pool=pool, cuts=cuts):
                    tasks = [pool.submit(np.copyto, pinned[a:b], source[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
                    for task in tasks:
                        task.result()

                seconds = median_time(copy, repeat, warmup=3)
                copies.append({"mb": mb, "threads": threads, "s": seconds, "gbs": 4 * n / seconds / 1e9})

            def upload(n=n):
                cl.enqueue_copy(device.queue, buffer, pinned[:n], is_blocking=False)
                device.queue.finish()

            seconds = median_time(upload, repeat, warmup=3)
            dma.append({"mb": mb, "s": seconds, "gbs": 4 * n / seconds / 1e9})
            print(
                f"  {mb:5.1f} MB: DMA {seconds * 1e6:6.0f} us; host copy "
                + ", ".join(f"{r['threads']} threads {r['s'] * 1e6:.0f} us" for r in copies if r["mb"] == mb),
                flush=True,
            )
        handoff = median_time(lambda: pools[max(pools)].submit(int).result(), 10 * repeat, warmup=10)
    finally:
        for pool in pools.values():
            pool.shutdown()
    print(f"  handing an empty task to a pool thread and back: {handoff * 1e6:.0f} us")
    return {"copies": copies, "dma": dma, "handoff_s": handoff}


def main(argv=None):
    parser = harness.arguments(__doc__, repeat=200, quick_repeat=20)
    parser.add_argument(
        "--host-copies",
        action="store_true",
        help="also time host copies into page-locked memory cut over 1-12 threads, beside their DMA",
    )
    parser.add_argument("--chunks", type=int, default=4, help="pieces of the chunked upload (default: 4)")
    parser.add_argument(
        "--devices",
        type=int,
        default=1,
        help="also upload each large size in one share per GPU to this many OpenCL GPUs at once (default 1: not)",
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="also time the staged upload of 8192 x 640 for several copy threads and chunk sizes",
    )
    parser.add_argument(
        "--flush-mib", type=int, help="MiB read before each timed launch (default: 256, 16 with --quick)"
    )
    args = harness.parse(parser, argv)
    (device,) = harness.devices(args.device)
    if device.backend != "opencl":
        parser.error(f"transfers.py times OpenCL's copies and events; {device.name} runs on {device.backend}")
    print(f"device: {device}")
    print("transfers, host to device and back:")
    rows = transfer_rows(device, args.repeat, args.chunks)
    print("large batches, GB/s:")
    large, sweep = large_rows(device, min(args.repeat, 30), args.sweep)
    parallel = None
    if args.devices > 1:
        gpus = [d for d in malinn.devices() if d.kind == "gpu" and d.backend == "opencl"]
        if len(gpus) < args.devices:
            parser.error(f"--devices {args.devices}: {len(gpus)} OpenCL GPU(s) here")
        print(f"large batches uploaded to {args.devices} GPUs at once:")
        parallel = parallel_rows(gpus[: args.devices], min(args.repeat, 30))
    host_copies = None
    if args.host_copies:
        print("host copies into page-locked memory:")
        host_copies = host_copy_rows(device, min(args.repeat, 21))
    sizes = QUICK_STREAM_MB if args.quick else STREAM_MB
    flush_mib = args.flush_mib or (16 if args.quick else 256)
    launch_repeat = min(args.repeat, 30)
    o = opencl_figures(device, sizes, flush_mib, launch_repeat)
    print(
        f"launch floor: event of an empty 1-item kernel {o['empty_1_item_s'] * 1e6:.2f} us, "
        f"4096 empty groups {o['empty_4096_groups_s'] * 1e6:.2f} us, 4 KiB copy {o['copy_4kib_s'] * 1e6:.2f} us, "
        f"empty kernel right behind another {o['empty_after_a_kernel_s'] * 1e6:.2f} us"
    )
    for r in o["stream"]:
        print(f"  stream {r['mb']:8.3f} MB  {r['s'] * 1e6:8.2f} us")
    print(f"  fit: fixed {o['fixed_s'] * 1e6:.2f} us + bytes / {o['rate_gbs']:.0f} GB/s")
    fields = {
        "chunks": args.chunks,
        "large": large,
        "sweep": sweep,
        "parallel": parallel,
        "host_copies": host_copies,
        "launch": o,
    }
    torch = torch_cuda()
    if torch is not None:
        t = fields["torch"] = torch_figures(torch, sizes, GEMV_SHAPES, flush_mib, launch_repeat)
        print(
            f"torch (CUDA events, launch included): add_ on 1 value {t['empty_add_s'] * 1e6:.2f} us; "
            f"sum: fixed {t['fixed_s'] * 1e6:.2f} us + bytes / {t['rate_gbs']:.0f} GB/s"
        )
        for r in t["gemv"]:
            print(
                f"  mv {r['units']}x{r['inputs']}: fp32 {r['fp32_s'] * 1e6:.2f} us, fp16 {r['fp16_s'] * 1e6:.2f}, "
                f"bf16 {r['bf16_s'] * 1e6:.2f} (fp16 {r['fp16_speedup']:.2f}x faster)"
            )
    harness.save("transfers", device, rows, args, **fields)
    return 0


if __name__ == "__main__":
    sys.exit(main())
