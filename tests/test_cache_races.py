"""Program binaries that a driver would crash on never reach it, and processes sharing one cache
never break each other.

PoCL serialises a program's folder of its kernel cache into the binary; PoCL 3.1 replaces a file
there by removing it first, so a build of the same program in another process at that moment left
binaries without their ``program.bc`` (stored with a valid checksum, they aborted PoCL in every later
process: ``pocl_binary_get_kernels_metadata: Assertion 'len > 0' failed``) and failed builds. Such a
binary is loaded here only in child processes: it would kill the test process.
"""

import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

import malinn
from malinn.backends import opencl
from malinn.backends.opencl import pocl_binary_problem
from malinn.io import cache
from malinn.io.cache import HEADER, encode_entry

DAMAGED = "discarded a damaged program cache entry"
DIED = "died while handing it to the driver"
# A small network: the plan's programs (two matmuls, a softmax, the re-layouts), built once each.
MODEL_CHILD = r"""
import json
import numpy as np
import malinn
from malinn.layers import Dense
model = malinn.Sequential([Dense(24, activation="relu"), Dense(5, activation="softmax")])
model.build((None, 40))
rng = np.random.default_rng(0)
model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.1 for w in model.get_weights()])
x = rng.random((7, 40), dtype=np.float32)
w = model.get_weights()
h = np.maximum(x.astype(np.float64) @ w[0] + w[1], 0) @ w[2] + w[3]
want = np.exp(h - h.max(1, keepdims=True)); want /= want.sum(1, keepdims=True)
error = float(np.abs(model.predict(x) - want).max())
device = malinn.get_device()
print(json.dumps({"error": error, "builds": device.counters.get("builds", 0),
                  "hits": device.counters.get("binary_hits", 0), "programs": len(device.cache["kernel_programs"])}))
"""
# Builds each named library kernel, and the same program under another first line (as two library
# entries of one source and configuration are: one program in PoCL's kernel cache); prints what it
# built from source and what it loaded from the cache.
RACE_CHILD = r"""
import json, sys
import malinn
from malinn.library.layout import parse_layout
device = malinn.get_device()
library = malinn.load_library()
before = dict(device.counters)
for codename in sys.argv[1].split(","):
    spec = library[codename]
    layouts = {k: (m.layout if not m.any_layout else parse_layout("C_4_2_C")) for k, m in spec.matrices.items()}
    source = spec.program_source(layouts, device.render_index)
    device.compile(source, spec.options(), origin=spec.source)
    head, rest = source.split("\n", 1)
    device.compile("/* malinn: another entry of this program */\n" + rest, spec.options(), origin=spec.source)
print(json.dumps({k: device.counters.get(k, 0) - before.get(k, 0) for k in ("builds", "binary_hits")}))
"""
# Hands every PoCL binary of a cache folder to PoCL, naming each before: a binary that aborts PoCL
# ends this process with the last name printed.
LOAD_ALL = r"""
import sys
from pathlib import Path
import pyopencl as cl
from malinn.io.cache import HEADER
platform = next(p for p in cl.get_platforms() if "Portable Computing Language" in p.name)
device = platform.get_devices()[0]
context = cl.Context([device])
for path in sorted(Path(sys.argv[1]).glob("programs/*.bin")):
    data = path.read_bytes()
    binary = data[HEADER.size + HEADER.unpack_from(data)[2]:]
    if binary.startswith(b"poclbin"):
        print(path.name, end=" ", flush=True)
        print(cl.Program(context, [device], [binary]).build(options=["-w"]).kernel_names, flush=True)
"""
MARK = r"""
import json, sys, time
from malinn.io import cache
with cache.in_use("programs", json.loads(sys.argv[1])):
    print("marked", flush=True)
    time.sleep(600)
"""


@pytest.fixture(scope="module")
def pocl():
    """The PoCL device (these tests are about PoCL's binaries); skipped where there is none."""
    found = [d for d in malinn.devices() if d.backend == "opencl" and d.is_pocl]
    if not found:
        pytest.skip("no PoCL device here (Debian's pocl-opencl-icd)")
    return found[0]


def child_env(cache_dir: Path, pocl_cache: Path | None = None) -> dict:
    env = {
        **os.environ,
        "MALINN_CACHE_DIR": str(cache_dir),
        "MALINN_BINARY_CACHE": "1",
        "MALINN_DEVICE": "cpu",
        "MALINN_GL": "0",
        "PYTHONWARNINGS": "default",
    }
    if pocl_cache is not None:
        env["POCL_CACHE_DIR"] = str(pocl_cache)
    return env


def run_model(cache_dir: Path) -> tuple:
    done = subprocess.run(
        [sys.executable, "-c", MODEL_CHILD], env=child_env(cache_dir), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stderr[-3000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["error"] <= 1e-5, result
    return result, done.stderr


def program_entries(cache_dir: Path) -> dict:
    """Entry file -> (key, payload) of the OpenCL programs stored in ``cache_dir``."""
    found = {}
    for path in sorted((cache_dir / "programs").glob("*.bin")):
        data = path.read_bytes()
        key_len = HEADER.unpack_from(data)[2]
        key = json.loads(data[HEADER.size : HEADER.size + key_len])
        if "local" not in key:  # not a GL shader's
            found[path] = (key, data[HEADER.size + key_len :])
    return found


def model_entries(cache_dir: Path) -> dict:
    """:func:`program_entries` without the probe kernel's, which a process whose probe passed before
    never loads (which entry sorts first follows the kernels' sources)."""
    probe = hashlib.sha256(opencl._PROBE_SOURCE.encode()).hexdigest()
    return {path: entry for path, entry in program_entries(cache_dir).items() if entry[0]["source_sha256"] != probe}


def without_program_bc(binary: bytes) -> bytes:
    """The binary PoCL 3.1 writes when the program's program.bc is missing from its folder (its
    first root entry empty): byte for byte what it wrote when a build in another process had just
    removed the file."""
    version, flags = struct.unpack_from("<I", binary, 16)[0], struct.unpack_from("<Q", binary, 24)[0]
    assert binary[:8] == b"poclbin\0" and version >= 9, "not PoCL's format 9 or later"
    at = 77 + (8 if version >= 10 and flags & 2 else 0)  # after the header, the build hash (and 10's size)
    size = struct.unpack_from("<Q", binary, at)[0]
    return binary[:at] + struct.pack("<Q", 0) + binary[at + 8 + size :]


@pytest.fixture(scope="module")
def whole_binary(pocl):
    """A real PoCL binary of a program of two kernels (built here: only its bytes are used)."""
    import pyopencl as cl  # the test process already uses PoCL through malinn

    source = (
        "__kernel void one(__global float *x) { x[0] = 1.0f; }\n__kernel void two(__global float *x) { x[1] = 2.0f; }\n"
    )
    return bytes(pocl.compile(source, origin="two kernels").get_info(cl.program_info.BINARIES)[0])


def test_a_whole_pocl_binary_passes_and_each_incomplete_one_is_named(whole_binary):
    binary = whole_binary
    assert pocl_binary_problem(binary) is None
    assert "program.bc" in pocl_binary_problem(without_program_bc(binary))
    assert "is empty" in pocl_binary_problem(without_program_bc(binary))
    assert "kernel record 2 of 2 is cut" in pocl_binary_problem(binary[:-1])
    assert "1 bytes after its 2 kernel records" in pocl_binary_problem(binary + b"\0")
    assert "cut short" in pocl_binary_problem(binary[:200])
    bitcode = binary.index(b"BC\xc0\xde")
    assert "not LLVM bitcode" in pocl_binary_problem(binary[:bitcode] + b"\0\0\0\0" + binary[bitcode + 4 :])
    assert "no kernel" in pocl_binary_problem(binary[:20] + struct.pack("<I", 0) + binary[24:])
    assert "no 'poclbin' magic" in pocl_binary_problem(b"\0" * 100)


def test_a_bitcode_less_pocl_binary_with_a_valid_checksum_never_reaches_the_driver(pocl, tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("MALINN_CACHE_DIR", str(folder))
    first, _ = run_model(folder)
    assert first["builds"] == first["programs"] >= 3 and first["hits"] == 0
    path, (key, binary) = next(iter(model_entries(folder).items()))
    doctored = without_program_bc(binary)
    path.write_bytes(encode_entry(key, doctored))  # the checksum of the damaged binary: malinn's checks pass
    assert cache.read_entry("programs", key) == doctored
    # the binary is the one that aborted PoCL: loaded by PoCL itself, in a process of its own
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD_ALL, str(folder)],
        env=child_env(folder, tmp_path / "pocl"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert loaded.returncode == -signal.SIGABRT and "Assertion `len > 0' failed" in loaded.stderr, loaded.stderr
    result, stderr = run_model(folder)
    (warning,) = [line for line in stderr.splitlines() if DAMAGED in line]
    assert f"{DAMAGED} {path}: a PoCL binary whose root entry at byte " in warning, stderr
    assert "is empty (its program.bc, the program's LLVM bitcode, was missing" in warning, stderr
    assert result["builds"] == 1 and result["hits"] == result["programs"] - 1, result
    again, stderr = run_model(folder)
    assert again["builds"] == 0 and again["hits"] == again["programs"] and DAMAGED not in stderr, (again, stderr)


def test_an_entry_a_process_died_on_while_handing_it_to_the_driver_is_discarded_and_rebuilt(pocl, tmp_path):
    folder = tmp_path / "cache"
    run_model(folder)
    path, (key, _) = next(iter(model_entries(folder).items()))
    marker = subprocess.Popen(
        [sys.executable, "-c", MARK, json.dumps(key)], env=child_env(folder), stdout=subprocess.PIPE, text=True
    )
    assert marker.stdout.readline().strip() == "marked"
    marker.send_signal(signal.SIGKILL)  # as a driver's abort ends a process: no cleanup runs
    marker.wait(timeout=60)
    marker.stdout.close()
    marks = list((folder / "in-use" / "programs").iterdir())
    assert [m.name.split("-")[:2] for m in marks] == [[path.name, str(marker.pid)]]
    result, stderr = run_model(folder)
    assert f"discarded a program cache entry {path}: process {marker.pid} {DIED}; it is rebuilt" in stderr, stderr
    assert stderr.count(DIED) == 1, stderr
    assert result["builds"] == 1 and result["hits"] == result["programs"] - 1, result
    assert list((folder / "in-use" / "programs").iterdir()) == []
    again, stderr = run_model(folder)
    assert again["builds"] == 0 and DIED not in stderr and DAMAGED not in stderr, (again, stderr)


def test_marks_of_live_processes_are_kept_and_a_reused_pid_is_not_taken_for_its_process(pocl, tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("MALINN_CACHE_DIR", str(folder))
    run_model(folder)
    (path, (key, _)), (other, (other_key, _)) = list(program_entries(folder).items())[:2]
    host = cache._host()
    marks = folder / "in-use" / "programs"
    marks.mkdir(parents=True, exist_ok=True)
    # this process, alive: its mark names the entry of a load in progress
    (marks / f"{path.name}-{os.getpid()}-00000000-{host}").write_text(cache._start_time(os.getpid()) + "\n")
    # a mark of this pid from a process that started at another time: the pid was reused since
    (marks / f"{other.name}-{os.getpid()}-00000001-{host}").write_text("1\n")
    assert cache.read_entry("programs", key) is not None
    with pytest.warns(RuntimeWarning, match=f"process {os.getpid()} {DIED}"):
        assert cache.read_entry("programs", other_key) is None
    assert path.exists() and not other.exists()
    assert sorted(m.name.split("-")[0] for m in marks.iterdir()) == [path.name]


def test_a_binary_whose_check_killed_a_process_is_not_stored_again(pocl, tmp_path):
    """A process that died while its driver loaded the binary it had just built (to check it before
    storing) leaves its mark: the next process builds the program and stores no binary of it."""
    folder = tmp_path / "cache"
    first, _ = run_model(folder)
    path, (key, _) = next(iter(model_entries(folder).items()))
    path.unlink()
    marks = folder / "in-use" / "programs"
    marks.mkdir(parents=True, exist_ok=True)
    (marks / f"{path.name}-{2**22 + 1}-00000000-{cache._host()}").write_text("1\n")  # a pid no process has
    result, stderr = run_model(folder)
    assert result["builds"] == 1 and not path.exists() and DIED not in stderr, (result, stderr)
    again, _ = run_model(folder)
    assert again["builds"] == 1 and again["hits"] == first["programs"] - 1


def test_processes_building_at_once_build_each_program_once_and_every_entry_loads(pocl, tmp_path):
    """Four processes started at once on an empty cache (malinn's and PoCL's), three rounds: every
    process succeeds, each program is built from source by one of them and loaded by the others,
    and every stored binary is whole and loads into PoCL."""
    kernels = ["gemv", "conv_depthwise", "morton_4_2"]
    started = time.monotonic()
    for round_ in range(3):
        folder, pocl_cache = tmp_path / f"cache{round_}", tmp_path / f"pocl{round_}"
        children = [
            subprocess.Popen(
                [sys.executable, "-c", RACE_CHILD, ",".join(kernels)],
                env=child_env(folder, pocl_cache),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        results = []
        for child in children:
            out, err = child.communicate(timeout=300)
            assert child.returncode == 0, f"round {round_}: exit {child.returncode}:\n{err[-3000:]}"
            results.append(json.loads(out.strip().splitlines()[-1]))
        programs = 2 * len(kernels)
        assert sum(r["builds"] for r in results) == programs, results
        assert sum(r["binary_hits"] for r in results) == 3 * programs, results
        stored = program_entries(folder)
        assert len(stored) == programs + 1  # and the probe kernel's
        assert [pocl_binary_problem(binary) for _, binary in stored.values()] == [None] * len(stored)
        loaded = subprocess.run(
            [sys.executable, "-c", LOAD_ALL, str(folder)],
            env=child_env(folder, tmp_path / f"load{round_}"),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert loaded.returncode == 0, f"round {round_}: {loaded.stdout[-500:]}\n{loaded.stderr[-2000:]}"
        assert len(loaded.stdout.splitlines()) == len(stored)
    assert time.monotonic() - started < 120
