"""The program-binary cache: a damaged, truncated, swapped or foreign entry never reaches the driver.

Each damaged cache is used by a NEW process (the in-memory memo would hide the disk), which must
give numpy's answer, print one warning per damaged entry, and rewrite the entry so that the
process after it builds nothing and warns of nothing.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import malinn
from malinn.backends import opencl
from malinn.io import cache
from malinn.io.cache import HEADER, MAGIC, decode_entry, encode_entry, read_entry, write_entry

WARNING = "discarded a damaged program cache entry"
# The thesis's Partial MNIST network at batch 100: gemm_tiled with a fused relu, gemm_tiled with its bias,
# softmax, and the re-layouts of the input and the output (the plan's programs, each built once).
CHILD = r"""
import json, os, sys
import numpy as np
import malinn
from malinn.layers import Dense
# gemm_tiled in the CPU's default configuration (or H3_CONFIG) on every device: a GPU's defaults would
# fuse more and build fewer programs
cpu = malinn.load_library().default_spec("matmul", "cpu")
malinn.ops.use("matmul", cpu.codename, config=json.loads(os.environ.get("H3_CONFIG") or "null") or cpu.config)
model = malinn.Sequential([Dense(150, activation="relu"), Dense(10, activation="softmax")])
model.build((None, 640))
rng = np.random.default_rng(0)
model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.05 for w in model.get_weights()])
x = rng.random((100, 640), dtype=np.float32)
y = model.predict(x)
w = model.get_weights()
h = np.maximum(x.astype(np.float64) @ w[0] + w[1], 0) @ w[2] + w[3]
want = np.exp(h - h.max(1, keepdims=True)); want /= want.sum(1, keepdims=True)
counters = malinn.get_device().counters
print(json.dumps({"error": float(np.abs(y - want).max()), "builds": counters["builds"],
                  "hits": counters.get("binary_hits", 0),
                  "programs": len(malinn.get_device().cache["kernel_programs"])}))
"""
# A gemm_tiled configuration other than the CPU default, with the same tile sizes (so the same
# layouts and source, only the options differ): its binary under the default's key computes garbage.
OTHER = {"MWG": 64, "NWG": 64, "KWG": 32, "MDIMC": 8, "NDIMC": 16, "VW": 2, "LOCAL": 1, "STRIDED": 1}


def run_child(cache_dir: Path, config=None) -> tuple[dict, str]:
    env = {**os.environ, "MALINN_CACHE_DIR": str(cache_dir), "MALINN_BINARY_CACHE": "1", "PYTHONWARNINGS": "default"}
    env.pop("H3_CONFIG", None)
    if config:
        env["H3_CONFIG"] = json.dumps(config)
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"exit {out.returncode}:\n{out.stderr[-3000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def entries(cache_dir: Path) -> dict:
    """Entry file -> its key (read with the documented header layout)."""
    found = {}
    for path in sorted((cache_dir / "programs").iterdir()):
        data = path.read_bytes()
        key_len = HEADER.unpack_from(data)[2]
        found[path] = json.loads(data[HEADER.size : HEADER.size + key_len])
    return found


def fused_gemm(cache_dir: Path, config: dict) -> Path:
    """The entry of the gemm_tiled program with the fused relu, in configuration ``config``."""
    want = {f"-D{k}={v}" for k, v in config.items()} | {"-DACTIVATION=act_relu"}
    (path,) = [p for p, key in entries(cache_dir).items() if want <= set(key["options"])]
    return path


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """A cache filled by one run with the default configuration and one with :data:`OTHER`."""
    folder = tmp_path_factory.mktemp("filled-cache")
    first, _ = run_child(folder)
    assert first["error"] <= 1e-5 and first["builds"] == first["programs"] >= 4 and first["hits"] == 0
    probe = hashlib.sha256(opencl._PROBE_SOURCE.encode()).hexdigest()  # a warm process runs no probe kernel
    default = {path: key for path, key in entries(folder).items() if key["source_sha256"] != probe}
    run_child(folder, OTHER)
    return folder, default


def test_a_binary_is_keyed_by_the_options_its_build_used(filled):
    """Source builds add "-w" (no warnings in the log); the key says so, so a binary an earlier
    malinn cached without it (whose rebuild on PoCL logs warnings, shown by pyopencl as a
    CompilerWarning on every run) is never taken for one built with it."""
    folder, _ = filled
    # OpenCL's entries (a GL shader's key names its "local" size)
    keys = [key for key in entries(folder).values() if "local" not in key]
    assert keys and all(key["options"][-1:] == ["-w"] for key in keys), [k["options"] for k in keys]


def default_config() -> dict:
    return malinn.load_library().default_spec("matmul", "cpu").config


def damage(kind: str, folder: Path, default: dict) -> int:
    """Damages the cache in ``folder`` in one way; returns how many entries are now damaged."""
    target = fused_gemm(folder, default_config())
    data = target.read_bytes()
    if kind == "truncate":  # a power cut in the middle of a write
        target.write_bytes(data[: len(data) // 2])
        return 1
    if kind == "flip":  # one bit of the payload rots
        i = len(data) - len(data) // 3
        target.write_bytes(data[:i] + bytes([data[i] ^ 0x10]) + data[i + 1 :])
        return 1
    if kind == "swap":  # two entries trade files
        other = next(p for p in default if p != target)
        other_data = other.read_bytes()
        other.write_bytes(data)
        target.write_bytes(other_data)
        return 2
    if kind == "rotate":  # entry A renamed onto entry B's file name
        other = next(p for p in default if p != target)
        os.replace(other, target)
        return 1
    foreign = fused_gemm(folder, OTHER)
    if kind == "other-config":  # another configuration's valid entry under the default's name
        shutil.copyfile(foreign, target)
        return 1
    if kind == "other-config-patched-key":  # ... with its header's key rewritten to the default's
        foreign_data = foreign.read_bytes()
        magic, version, key_len, payload_len, checksum = HEADER.unpack_from(foreign_data)
        key = json.dumps(default[target], sort_keys=True, separators=(",", ":")).encode()
        payload = foreign_data[HEADER.size + key_len :]
        target.write_bytes(HEADER.pack(magic, version, len(key), payload_len, checksum) + key + payload)
        return 1
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["truncate", "flip", "swap", "rotate", "other-config", "other-config-patched-key"])
def test_a_damaged_entry_is_discarded_and_rebuilt_in_a_new_process(filled, tmp_path, kind):
    template, default = filled
    folder = tmp_path / "cache"
    shutil.copytree(template, folder)
    default = {folder / "programs" / p.name: key for p, key in default.items()}
    damaged = damage(kind, folder, default)
    result, stderr = run_child(folder)
    assert result["error"] <= 1e-5, f"wrong answer after '{kind}': {result}"
    assert stderr.count(WARNING) == damaged, stderr
    assert len([line for line in stderr.splitlines() if WARNING in line]) == damaged
    again, stderr = run_child(folder)
    assert again["error"] <= 1e-5 and again["builds"] == 0 and again["hits"] == again["programs"], (again, stderr)
    assert WARNING not in stderr


def test_program_binaries_are_cached_for_the_next_process(tmp_path):
    script = (
        "import numpy as np, malinn; m = malinn.load_model(r'%s'); m.predict(np.zeros((2, 64)));"
        "print(malinn.get_device().counters.get('builds'), malinn.get_device().counters.get('binary_hits', 0))"
        % (malinn.__path__[0] + "/../examples/digits_mlp.keras")
    )
    env = {**os.environ, "MALINN_CACHE_DIR": str(tmp_path), "MALINN_BINARY_CACHE": "1"}
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    builds1, hits1 = map(int, first.stdout.split())
    builds2, hits2 = map(int, second.stdout.split())
    assert builds1 > 0 and hits1 == 0
    assert builds2 == 0 and hits2 == builds1
    for value in ("0", " false ", "OFF"):  # any spelling of off (a "false" was once ignored: the cache stayed on)
        off = subprocess.run(
            [sys.executable, "-c", script],
            env={**env, "MALINN_BINARY_CACHE": value},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert off.stdout.split() == [str(builds1), "0"], (value, off.stderr)


def test_a_damaged_binary_is_rebuilt_from_source(tmp_path):
    env = {**os.environ, "MALINN_CACHE_DIR": str(tmp_path), "MALINN_BINARY_CACHE": "1"}
    script = (
        "import numpy as np, malinn; print(malinn.Sequential([malinn.layers.Dense(3)]).predict(np.ones((1, 2))).shape)"
    )
    assert subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=300).returncode == 0
    probe = hashlib.sha256(opencl._PROBE_SOURCE.encode()).hexdigest()  # a warm process runs no probe kernel
    damaged = [path for path, key in entries(tmp_path).items() if key["source_sha256"] != probe]
    for path in damaged:
        path.write_bytes(b"garbage")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "(1, 3)", out.stderr
    assert out.stderr.count(WARNING) == len(damaged) >= 1


def test_a_cache_folder_that_is_a_file_turns_caching_off(tmp_path):
    folder = tmp_path / "not-a-folder"
    folder.write_text("a file")
    result, stderr = run_child(folder)
    assert result["error"] <= 1e-5 and result["hits"] == 0
    assert stderr.count("cannot be written") == 1, stderr
    assert folder.read_text() == "a file"


def _make_read_only(folder: Path):
    """Makes ``folder`` read-only even for root (chattr +i); returns the undo, or skips."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return lambda: folder.chmod(0o755)
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)]).returncode != 0:
        pytest.skip("running as root without a working chattr: cannot make a read-only folder")
    return lambda: subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_a_read_only_cache_is_used_and_never_written(filled, tmp_path):
    template, default = filled
    folder = tmp_path / "cache"
    shutil.copytree(template, folder)
    target = fused_gemm(folder, default_config())
    target.write_bytes(target.read_bytes()[:100])  # damaged, and it cannot be deleted
    undo = _make_read_only(folder / "programs")
    try:
        result, stderr = run_child(folder)
        listing = sorted(p.name for p in (folder / "programs").iterdir())
    finally:
        undo()
    assert result["error"] <= 1e-5 and result["hits"] == result["programs"] - 1 and result["builds"] == 1
    assert stderr.count(WARNING) == 1 and stderr.count("cannot be written") == 1, stderr
    assert listing == sorted(p.name for p in (template / "programs").iterdir())


# ---------------------------------------------------------------- the entry format, in process
KEY = {"source_sha256": "ab" * 32, "options": ["-DX=1"], "device": "d", "vendor": "v", "driver": "1", "platform": "p"}


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MALINN_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_an_entry_round_trips_and_carries_its_key_length_and_checksum(cache_dir):
    write_entry("programs", KEY, b"payload bytes")
    path = cache.entry_path("programs", KEY)
    data = path.read_bytes()
    magic, version, key_len, payload_len, _ = HEADER.unpack_from(data)
    assert (magic, version, payload_len) == (MAGIC, cache.FORMAT_VERSION, len(b"payload bytes"))
    assert json.loads(data[HEADER.size : HEADER.size + key_len]) == KEY
    assert read_entry("programs", KEY) == b"payload bytes"
    assert read_entry("programs", {**KEY, "driver": "2"}) is None  # another key: another file
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left behind


@pytest.mark.parametrize(
    "change, why",
    [
        (lambda d: d[:-1], "truncated"),
        (lambda d: d + b"x", "truncated or extended"),
        (lambda d: d[:10], "shorter than"),
        (lambda d: b"NOTMALIN" + d[8:], "wrong magic"),
        (lambda d: d[:8] + (2).to_bytes(4, "little") + d[12:], "format version 2"),
        (lambda d: d[:-1] + bytes([d[-1] ^ 1]), "checksum"),
        (lambda d: encode_entry({**KEY, "options": ["-DX=2"]}, b"payload bytes"), "differs in options"),
    ],
)
def test_each_check_refuses_a_damaged_entry_and_deletes_it(cache_dir, change, why):
    write_entry("programs", KEY, b"payload bytes")
    path = cache.entry_path("programs", KEY)
    path.write_bytes(change(path.read_bytes()))
    with pytest.raises(cache.DamagedEntry, match=why):
        decode_entry(path.read_bytes(), KEY)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert read_entry("programs", KEY) is None
    assert len(caught) == 1 and WARNING in str(caught[0].message) and "\n" not in str(caught[0].message)
    assert not path.exists()


def test_stale_temporaries_of_a_killed_writer_are_swept(cache_dir, monkeypatch):
    folder = cache_dir / "programs"
    folder.mkdir()
    old, young, foreign = folder / ".x.bin.abc.malinn-tmp", folder / ".y.bin.def.malinn-tmp", folder / ".z.tmp"
    for p in (old, young, foreign):
        p.write_bytes(b"partial")
    os.utime(old, (1, 1))
    os.utime(foreign, (1, 1))
    monkeypatch.setattr(cache, "_swept", {})
    write_entry("programs", KEY, b"payload")
    assert not old.exists() and young.exists() and foreign.exists()


def test_a_long_running_process_sweeps_again_an_hour_later(cache_dir, monkeypatch):
    """The sweep ran once per folder and process: a service running for months never removed a
    temporary that a killed process left after its first write."""
    folder = cache_dir / "programs"
    folder.mkdir()
    monkeypatch.setattr(cache, "_swept", {})
    clock = [1e9]
    monkeypatch.setattr(cache.time, "time", lambda: clock[0])
    write_entry("programs", KEY, b"payload")  # the first write sweeps (nothing to sweep)
    left = folder / ".x.bin.abc.malinn-tmp"
    left.write_bytes(b"partial")
    os.utime(left, (clock[0] - 10, clock[0] - 10))
    clock[0] += 1800
    write_entry("programs", KEY, b"payload")  # half an hour on: not swept again yet
    assert left.exists()
    clock[0] += 3600
    write_entry("programs", KEY, b"payload")  # past the hour: swept, the temporary old enough
    assert not left.exists()


def test_cache_files_get_the_mode_of_any_new_file(cache_dir):
    """mkstemp's 0600 kept a cache filled by one user (``malinn tune`` at an image's build) from the
    service running as another: every entry and the tuning database missed, with a warning each."""
    old = os.umask(0o022)
    try:
        write_entry("programs", {"k": 1}, b"payload")
        cache.write_atomic(cache_dir / "tuning.json", b"{}")
        os.umask(0o077)
        cache.write_atomic(cache_dir / "private.json", b"{}")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in cache_dir.rglob("*") if p.is_file()}
    assert modes.pop("tuning.json") == 0o644 and modes.pop("private.json") == 0o600
    assert list(modes.values()) == [0o644], modes


@pytest.mark.parametrize(
    "env,expected",
    [
        ({"MALINN_CACHE_DIR": "~/mc"}, "{home}/mc"),  # as a Dockerfile's ENV passes it
        ({"MALINN_CACHE_DIR": "", "XDG_CACHE_HOME": "relcache"}, "{home}/.cache/malinn"),  # relative: ignored
        ({"MALINN_CACHE_DIR": "", "XDG_CACHE_HOME": "/xdg"}, "/xdg/malinn"),
        ({"MALINN_CACHE_DIR": "", "XDG_CACHE_HOME": "", "HOME": ""}, "{tmp}/malinn-cache-{uid}"),
    ],
)
def test_the_cache_folder_is_never_a_path_relative_to_the_working_directory(monkeypatch, tmp_path, env, expected):
    import tempfile

    home = str(tmp_path / "home")
    monkeypatch.setenv("HOME", home)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(cache, "_private", [])
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert str(cache.cache_dir()) == expected.format(home=home, tmp=tmp_path, uid=os.getuid())


@pytest.mark.parametrize("configured", ["~nosuchuser_malinn/c", "~/c", "~"])
def test_a_tilde_that_names_no_home_folder_caches_privately(monkeypatch, tmp_path, configured):
    """``~nosuchuser/c`` stayed relative (a folder named ``~...`` in the working directory); ``~/c``
    with HOME empty became ``/c``, and ``~`` the root."""
    import tempfile

    monkeypatch.setenv("HOME", "")
    monkeypatch.setenv("MALINN_CACHE_DIR", configured)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(cache, "_private", [])
    monkeypatch.setattr(cache, "_warned", set())
    with pytest.warns(RuntimeWarning, match="names no folder"):
        folder = cache.cache_dir()
    assert folder == tmp_path / f"malinn-cache-{os.getuid()}" and folder.stat().st_mode & 0o777 == 0o700


def test_a_shared_temporary_cache_another_user_could_have_made_is_not_used(monkeypatch, tmp_path):
    """Without a home folder the cache is malinn-cache-<uid> in the temporary folder, which anyone
    may create first and fill with program binaries (native code a driver runs): used only where it
    is this user's alone, else a new private folder."""
    import tempfile

    monkeypatch.setenv("HOME", "")
    monkeypatch.delenv("MALINN_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(cache, "_private", [])
    planted = tmp_path / f"malinn-cache-{os.getuid()}"
    planted.mkdir()
    planted.chmod(0o777)
    with pytest.warns(RuntimeWarning, match="not a folder of this user's alone"):
        folder = cache.cache_dir()
    assert folder != planted and folder.parent == tmp_path and folder.stat().st_mode & 0o777 == 0o700
    assert cache.cache_dir() == folder  # one folder per process
