"""malinn.io.files.write_file: every kind of destination, modes, the source file, stale temporaries."""

import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import malinn
from malinn.errors import ConversionError, MalinnError
from malinn.io.files import STALE_AFTER_S, TEMP_PATTERN, check_destination, signals_held, write_file

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits_mlp.keras"


def writes(data: bytes):
    return lambda f: f.write(data)


def leftovers(folder: Path):
    return sorted(p.name for p in folder.iterdir() if TEMP_PATTERN.match(p.name))


# ------------------------------------------------------------------ regular files and modes
@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_file_follows_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        write_file(tmp_path / "new.bin", writes(b"abc"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "new.bin").st_mode) == mode
    assert (tmp_path / "new.bin").read_bytes() == b"abc"
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("umask", [0o022, 0o077])
@pytest.mark.parametrize("mode", [0o640, 0o755, 0o444])
def test_a_replaced_file_keeps_its_mode(tmp_path, umask, mode):
    target = tmp_path / "old.bin"
    target.write_bytes(b"old contents")
    os.chmod(target, mode)
    old = os.umask(umask)
    try:
        write_file(target, writes(b"new"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(target).st_mode) == mode
    assert target.read_bytes() == b"new"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="changing owners needs root")
def test_a_replaced_file_keeps_its_owner_and_group_as_root(tmp_path):
    target = tmp_path / "owned.bin"
    target.write_bytes(b"x")
    os.chown(target, 1234, 5678)
    write_file(target, writes(b"y"))
    st = os.stat(target)
    assert (st.st_uid, st.st_gid) == (1234, 5678) and target.read_bytes() == b"y"


def test_the_write_is_atomic_and_returns_the_path_as_given(tmp_path):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")
    inode = os.stat(target).st_ino
    seen = []

    def writer(f):
        f.write(b"new contents")
        seen.append((target.read_bytes(), f.seekable()))  # the destination is untouched while writing

    assert write_file(str(target), writer) == target
    assert seen == [(b"old", True)]
    assert target.read_bytes() == b"new contents" and os.stat(target).st_ino != inode


# ------------------------------------------------------------------ failures leave nothing
@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
@pytest.mark.parametrize("existing", [False, True])
def test_a_failure_mid_write_leaves_nothing_and_keeps_the_old_file(tmp_path, error, existing):
    target = tmp_path / "model.malinn"
    if existing:
        target.write_bytes(b"the old model")

    def writer(f):
        f.write(b"half a file")
        raise error

    with pytest.raises(type(error)):
        write_file(target, writer)
    assert sorted(p.name for p in tmp_path.iterdir()) == (["model.malinn"] if existing else [])
    if existing:
        assert target.read_bytes() == b"the old model"


def test_an_os_error_while_writing_is_a_malinn_error_naming_the_file(tmp_path):
    def writer(f):
        f.write(b"x")
        raise OSError(28, "No space left on device")

    with pytest.raises(MalinnError, match=r"out\.bin: cannot write the file \(No space left on device\)"):
        write_file(tmp_path / "out.bin", writer)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ symlinks
def test_a_symlink_is_followed_never_replaced(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "model.malinn"
    target.write_bytes(b"old")
    os.chmod(target, 0o640)
    link = tmp_path / "link.malinn"
    link.symlink_to(Path("real") / "model.malinn")
    write_file(link, writes(b"through the link"))
    assert link.is_symlink() and os.readlink(link) == str(Path("real") / "model.malinn")
    assert target.read_bytes() == b"through the link"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640
    assert leftovers(tmp_path) == [] and leftovers(tmp_path / "real") == []


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "made.bin")
    write_file(link, writes(b"made"))
    assert link.is_symlink() and (tmp_path / "made.bin").read_bytes() == b"made"


# ------------------------------------------------------------------ devices, FIFOs, sockets
def _char_device(tmp_path):
    """A fresh character device like /dev/null (1, 3) in tmp_path, or /dev/null itself."""
    node = tmp_path / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        return node
    except (PermissionError, OSError):
        return Path("/dev/null")


def test_a_character_device_is_written_through_not_replaced(tmp_path):
    node = _char_device(tmp_path)
    before = os.stat(node)
    write_file(node, writes(b"x" * 100000))
    after = os.stat(node)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino
    assert leftovers(node.parent) == []


def test_a_fifo_is_streamed_into(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    payload = bytes(range(256)) * 1000
    write_file(fifo, writes(payload))
    reader.join(30)
    assert got == [payload]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_dev_stdout_redirected_to_a_file_is_written_into_that_file(tmp_path):
    out = tmp_path / "captured.bin"
    code = (
        "import sys; from malinn.io.files import write_file; "
        "write_file('/dev/stdout', lambda f: f.write(b'PAYLOAD')); print('more', flush=True)"
    )
    with open(out, "wb") as f:
        inode = os.fstat(f.fileno()).st_ino
        run = subprocess.run([sys.executable, "-c", code], stdout=f, stderr=subprocess.PIPE, cwd=ROOT, timeout=60)
    assert run.returncode == 0, run.stderr
    assert os.stat(out).st_ino == inode  # the same file, not a replacement
    assert out.read_bytes() == b"PAYLOADmore\n"
    assert leftovers(tmp_path) == []


def test_a_socket_is_refused_and_kept(tmp_path):
    path = tmp_path / "sock"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        with pytest.raises(MalinnError, match="is a socket"):
            write_file(path, writes(b"x"))
        assert stat.S_ISSOCK(os.stat(path).st_mode)
    finally:
        server.close()


# ------------------------------------------------------------------ the source file
def test_the_source_file_is_refused_unless_overwrite_is_asked(tmp_path):
    src = tmp_path / "m.keras"
    src.write_bytes(b"the original")
    hard = tmp_path / "hard.keras"
    os.link(src, hard)
    soft = tmp_path / "soft.keras"
    soft.symlink_to(src)
    for destination in (src, hard, soft, tmp_path / "." / "m.keras"):
        with pytest.raises(MalinnError, match="refusing to overwrite it"):
            write_file(destination, writes(b"converted"), source=src)
        with pytest.raises(MalinnError, match="refusing to overwrite it"):
            check_destination(destination, source=src)
        assert src.read_bytes() == b"the original"
    write_file(src, writes(b"converted"), source=src, overwrite_source=True)
    assert src.read_bytes() == b"converted"
    write_file(tmp_path / "other.malinn", writes(b"ok"), source=src)  # another file is fine


def test_convert_refuses_to_replace_its_keras_source(tmp_path):
    src = tmp_path / "digits.keras"
    src.write_bytes(DIGITS.read_bytes())
    with pytest.raises(ConversionError, match="refusing to overwrite"):
        malinn.convert(src, src, target="gpu")
    assert src.read_bytes() == DIGITS.read_bytes()
    malinn.convert(src, src, target="gpu", overwrite=True)
    assert malinn.load_model(src).count_params() == 2778
    model = malinn.load_model(DIGITS)
    model.source = {"file": str(src)}
    with pytest.raises(ConversionError, match="refusing to overwrite"):
        malinn.model.saving.save_model(model, src, target="gpu")


# ------------------------------------------------------------------ names
@pytest.mark.parametrize(
    "name, message",
    [
        ("", "the output file name is empty"),
        ("newdir/", "names a folder"),
        ("sub", "is a folder"),
        ("missing/x.malinn", "the folder missing does not exist"),
        ("file.txt/x.malinn", "Not a directory"),
        ("n" * 256, "(too long|longer)"),
    ],
)
def test_bad_names_are_clear_errors(tmp_path, monkeypatch, name, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(MalinnError, match=message):
        write_file(name, writes(b"x"))
    with pytest.raises(MalinnError, match=message):
        check_destination(name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt", "sub"]


@pytest.mark.parametrize("length", [242, 250, 254, 255])
def test_long_names_up_to_255_bytes_are_written(tmp_path, length):
    name = "m" * (length - len(".malinn")) + ".malinn"
    write_file(tmp_path / name, writes(b"long"))
    assert (tmp_path / name).read_bytes() == b"long"
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_a_long_multibyte_name_is_written(tmp_path):
    name = "é" * 127 + "x"  # 255 bytes in UTF-8
    assert len(name.encode()) == 255
    seen = []
    write_file(tmp_path / name, lambda f: (seen.extend(p.name for p in tmp_path.iterdir()), f.write(b"ok")))
    assert (tmp_path / name).read_bytes() == b"ok"
    assert len(seen) == 1 and TEMP_PATTERN.match(seen[0]) and len(seen[0].encode()) <= 255
    seen[0].encode()  # the temporary's name was cut on a character boundary


# ------------------------------------------------------------------ stale temporaries
def test_stale_temporaries_of_ours_are_removed_on_the_next_write(tmp_path):
    old = time.time() - STALE_AFTER_S - 60
    stale = tmp_path / ".model.malinn.malinn-0123abcd.tmp"
    fresh = tmp_path / ".model.malinn.malinn-89abcdef.tmp"
    foreign = tmp_path / ".model.malinn.x7Yq2p.tmp"  # another program's (or mkstemp's) naming
    link = tmp_path / ".other.malinn-deadbeef.tmp"
    for p in (stale, fresh, foreign):
        p.write_bytes(b"partial")
    link.symlink_to(tmp_path / "victim")
    (tmp_path / "victim").write_bytes(b"keep me")
    for p in (stale, foreign, link):
        os.utime(p, (old, old), follow_symlinks=False)
    write_file(tmp_path / "y.npy", writes(b"data"))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([fresh.name, foreign.name, link.name, "victim", "y.npy"])
    assert (tmp_path / "victim").read_bytes() == b"keep me"


def test_a_killed_write_leaves_a_temporary_that_the_next_write_removes(tmp_path):
    code = (
        "import os, sys, time; from malinn.io.files import write_file; "
        "write_file(sys.argv[1], lambda f: (f.write(b'half'), f.flush(), os.kill(os.getpid(), 9)))"
    )
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.malinn")], cwd=ROOT, timeout=60)
    assert run.returncode == -9
    left = leftovers(tmp_path)
    assert len(left) == 1 and left[0].startswith(".m.malinn.malinn-") and not (tmp_path / "m.malinn").exists()
    old = time.time() - STALE_AFTER_S - 1
    os.utime(tmp_path / left[0], (old, old))
    write_file(tmp_path / "m.malinn", writes(b"whole"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.malinn"]


def test_a_signal_inside_held_signals_is_acted_on_as_the_block_ends(tmp_path):
    """Ctrl-C (Python's own handler) and SIGTERM (a raising handler, as the command installs) sent
    inside the block raise nothing there; the first one's handler raises as the block ends, and the
    handlers are the ones before. A model saved through HDF5 meanwhile is whole."""

    class Stop(BaseException):
        pass

    def stop(signum, frame):
        raise Stop(signum)

    before = signal.signal(signal.SIGTERM, stop)
    try:
        reached = []
        with pytest.raises(KeyboardInterrupt):
            with signals_held():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.01)  # delivered: Python runs the noting handler here
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.01)
                reached.append(True)
        assert reached == [True]
        assert (
            signal.getsignal(signal.SIGTERM) is stop and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        )
        with pytest.raises(Stop):
            with signals_held():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.01)
                model = malinn.Sequential([malinn.layers.Dense(3)])
                model.build((None, 5))
                model.save(tmp_path / "m.malinn")
        again = malinn.load_model(tmp_path / "m.malinn")
        assert [w.shape for w in again.get_weights()] == [(5, 3), (3,)]
    finally:
        signal.signal(signal.SIGTERM, before)
