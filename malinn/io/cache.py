"""malinn's per-user cache folder, and cache entries that are checked before anything uses them.

The cache folder is ``$MALINN_CACHE_DIR``, else ``$XDG_CACHE_HOME/malinn``, else ``~/.cache/malinn``
(:func:`cache_dir`).
It holds the tuner's results (``tuning.json``) and entries of named kinds (``programs``: compiled
program binaries), one file per entry at ``<cache dir>/<kind>/<sha256 of the key>.bin``.

An entry file is a fixed header, the entry's full key and its payload::

    magic  b"MALINNCE"       8 bytes
    format version           uint32, little-endian (1)
    key length               uint32: bytes of the key's canonical JSON
    payload length           uint64
    checksum                 32 bytes: sha256 of the key's canonical JSON followed by the payload
    key                      canonical JSON (sorted keys, no spaces, ASCII)
    payload

A crash inside a driver cannot be caught, so a payload reaches its user only after every check has
passed: the magic, the version, the lengths against the file's size, the key against the key asked
for (an entry renamed into another key's file is refused) and the checksum (a truncated, bit-flipped
or hand-patched entry is refused). A refused entry is deleted, with one line of warning, and the
caller rebuilds it. Entries are written to a temporary file in the same folder, flushed to disk
and renamed over the old one, so a reader sees the old entry or the new one, never a mix. A cache
that cannot be written (a read-only folder, a file where the folder should be, a full disk) turns
writing off with one warning; nothing here raises for a cache problem.

A payload handed to a driver is marked in use meanwhile (:func:`in_use`: a file in
``in-use/<kind>/``), so that an entry the driver still crashes on costs one process: the next
reader finds the dead process's mark and discards the entry. Processes making one entry at once
take turns (:func:`build_lock`: ``flock`` on a file in ``locks/``): the first builds and stores it,
the others read it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import stat
import struct
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Callable, Iterator

try:
    import fcntl  # POSIX: a lock held across processes (absent on Windows, where none is taken)
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]  # no module on Windows: checked before each use

__all__ = [
    "cache_dir",
    "read_entry",
    "write_entry",
    "entry_path",
    "encode_entry",
    "decode_entry",
    "in_use",
    "users_died",
    "build_lock",
    "DamagedEntry",
    "write_atomic",
    "locked",
    "MAGIC",
    "FORMAT_VERSION",
    "HEADER",
]

MAGIC = b"MALINNCE"
FORMAT_VERSION = 1
#: magic, format version, key length, payload length, sha256(key JSON + payload)
HEADER = struct.Struct("<8sIIQ32s")
_MAX_KEY_BYTES = 1 << 16
_STALE_TEMP_SECONDS = 3600

_lock = threading.Lock()
_unwritable: set = set()  # cache folders already reported as not writable (one warning each)
_swept: dict = {}  # folder -> when its stale temporaries were last removed (time.time())


class DamagedEntry(Exception):
    """An entry file failed a check; the message says which."""


def cache_dir() -> Path:
    """The folder of malinn's per-user caches (tuning results, program binaries): ``$MALINN_CACHE_DIR``
    (a leading ``~`` is the home folder, as a shell would have it: a service manager's or a Dockerfile's
    ``ENV`` passes it on as it is), else ``$XDG_CACHE_HOME/malinn`` where that is an absolute path (a
    relative one is ignored, as the XDG specification says), else ``~/.cache/malinn``. Where no home
    folder is known (``HOME`` empty, or unset without a password entry; or a ``~`` that names none),
    :func:`private_temporary_cache`: never a folder named ``~`` in the working directory, nor ``/``."""
    configured = os.environ.get("MALINN_CACHE_DIR", "").strip()
    if configured and not configured.startswith("~"):
        return Path(configured)
    if configured:
        if configured == "~" or configured[1:2] in ("/", os.sep):  # ~ or ~/...: this user's home, if known
            home = _home()
            expanded = home + configured[1:] if home else ""
        else:  # ~user/...
            expanded = os.path.expanduser(configured)
        if os.path.isabs(expanded) and expanded.rstrip("/" + os.sep):
            return Path(expanded)
        _warn_once(
            f"MALINN_CACHE_DIR={configured!r} names no folder (no such home folder): "
            "caching in a private temporary folder"
        )
        return private_temporary_cache()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "malinn"
    home = _home()
    return Path(home) / ".cache" / "malinn" if home else private_temporary_cache()


def _home() -> str | None:
    """The home folder, or None where none is known (``HOME`` empty, or unset without a password entry)."""
    if os.environ.get("HOME", "unset").strip() == "":
        return None
    home = os.path.expanduser("~")
    return home if os.path.isabs(home) and home.rstrip("/" + os.sep) else None


_private: list = []  # the private temporary cache folder made in this process, once


def private_temporary_cache() -> Path:
    """``malinn-cache-<uid>`` in the temporary folder where it is this user's alone (made with mode
    0700; owned by this user and writable by no one else, so no other user can plant a program
    binary there, which a driver would run); else a new private folder for this process (one
    warning): a shared temporary folder is anyone's to create first."""
    with _lock:
        if _private:
            return _private[0]
        uid = getattr(os, "getuid", lambda: None)()
        folder = Path(tempfile.gettempdir()) / f"malinn-cache-{uid if uid is not None else 'user'}"
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
            st = os.lstat(folder)
            safe = stat.S_ISDIR(st.st_mode) and (uid is None or st.st_uid == uid) and not st.st_mode & 0o022
        except OSError:
            safe = False
        if not safe:
            warnings.warn(
                f"malinn: {folder} is not a folder of this user's alone; caching in a new private "
                f"folder for this process (set MALINN_CACHE_DIR)",
                RuntimeWarning,
                stacklevel=3,
            )
            folder = Path(tempfile.mkdtemp(prefix="malinn-cache-"))
        _private.append(folder)
        return folder


_warned: set = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(f"malinn: {message}", RuntimeWarning, stacklevel=3)


def _canonical(key: dict) -> bytes:
    return json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def entry_path(kind: str, key: dict) -> Path:
    """The file that holds the entry of ``kind`` for ``key`` (it may not exist).

    The name hashes the format version with the key, so a malinn writing another format never
    reads (and deletes) this one's entries.
    """
    digest = hashlib.sha256(f"malinn-cache-v{FORMAT_VERSION}\0".encode() + _canonical(key)).hexdigest()
    return cache_dir() / kind / f"{digest}.bin"


def encode_entry(key: dict, payload: bytes) -> bytes:
    """The bytes of an entry file: header, canonical key, payload."""
    text = _canonical(key)
    payload = bytes(payload)
    checksum = hashlib.sha256(text + payload).digest()
    return HEADER.pack(MAGIC, FORMAT_VERSION, len(text), len(payload), checksum) + text + payload


def decode_entry(data: bytes, key: dict) -> bytes:
    """The payload of an entry file's bytes, after every check.

    Args:
        data: the whole file.
        key: the key the caller asked for; the entry's own key must equal it.

    Returns:
        The payload.

    Raises:
        DamagedEntry: a check failed; the message says which.
    """
    if len(data) < HEADER.size:
        raise DamagedEntry(f"{len(data)} bytes, shorter than the {HEADER.size}-byte header")
    magic, version, key_len, payload_len, checksum = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise DamagedEntry("no malinn cache header (wrong magic)")
    if version != FORMAT_VERSION:
        raise DamagedEntry(f"format version {version}, expected {FORMAT_VERSION}")
    if key_len > _MAX_KEY_BYTES or HEADER.size + key_len + payload_len != len(data):
        raise DamagedEntry(
            f"{len(data)} bytes, but the header promises {HEADER.size + key_len + payload_len} (truncated or extended)"
        )
    text = data[HEADER.size : HEADER.size + key_len]
    if text != _canonical(key):
        try:
            other = json.loads(text)
            differs = sorted(k for k in set(key) | set(other) if key.get(k) != other.get(k))
            why = f"it holds another key (differs in {', '.join(differs) or 'encoding'})"
        except (ValueError, TypeError, AttributeError):
            why = "its key is not readable JSON"
        raise DamagedEntry(why)
    payload = data[HEADER.size + key_len :]
    if hashlib.sha256(text + payload).digest() != checksum:
        raise DamagedEntry("checksum mismatch (the key or payload was altered)")
    return payload


def _noun(kind: str) -> str:
    return kind[:-1] if kind.endswith("s") else kind


def read_entry(kind: str, key: dict, check: Callable[[bytes], object] | None = None) -> bytes | None:
    """The checked payload of ``kind``'s entry for ``key``, or ``None`` (absent, unreadable or damaged).

    A damaged entry is deleted and reported with one line of ``warnings.warn``; the caller then
    rebuilds the payload and writes it again with :func:`write_entry`. So is an entry that a process
    of this machine was handing to its driver (:func:`in_use`) when it died: the driver may have
    crashed on it, and would crash this process too.

    Args:
        kind: the entry kind, a folder name (e.g. ``"programs"``).
        key: everything the payload depends on, as a JSON-serialisable dict.
        check: called with the payload once the entry's own checks have passed; raises
            :class:`DamagedEntry` (saying why) for a payload its user must not be given (a driver's
            binary that would crash the driver).

    Returns:
        The payload bytes, or ``None``.
    """
    path = entry_path(kind, key)
    try:
        data = path.read_bytes()
    except OSError:  # absent, or the cache is unreadable (not a folder, no permission): a miss
        return None
    try:
        payload = decode_entry(data, key)
        if check is not None:
            check(payload)
    except DamagedEntry as exc:
        _discard(path, f"discarded a damaged {_noun(kind)} cache entry {path}: {exc}; it is rebuilt")
        return None
    died = _dead_users(path)
    if died:
        for mark in died:
            _unlink(mark)
        _discard(
            path,
            f"discarded a {_noun(kind)} cache entry {path}: process {_pid_of(died[0])} died while "
            f"handing it to the driver; it is rebuilt",
        )
        return None
    return payload


def _discard(path: Path, message: str) -> None:
    _unlink(path)
    warnings.warn(f"malinn: {message}", RuntimeWarning, stacklevel=3)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


# ------------------------------------------------------------------ entries in use by a driver
# A driver that crashes on an entry (an abort inside it cannot be caught) must cost one process, not
# every later one: a process marks an entry before it hands the payload to the driver and removes
# the mark once the driver has taken it. A mark whose process is dead names an entry the driver died
# on; the next reader discards it (read_entry). The marks are files in in-use/<kind>/, named
# <entry>-<pid>-<random>-<host> and holding the process's start time (a reused pid is not the dead one).


def _marks_folder(path: Path) -> Path:
    return path.parent.parent / "in-use" / path.parent.name


def _host() -> str:
    import socket

    name = "".join(c if c.isalnum() or c in "._" else "_" for c in socket.gethostname())[:64]
    return name or "host"


def _start_time(pid: int) -> str:
    """The process's start time (clock ticks since boot, from ``/proc``), or "" where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return "" if fields[0] in (b"Z", b"X") else fields[19].decode()  # a zombie has died
    except (OSError, IndexError, UnicodeDecodeError):
        return ""


def _alive(pid: int, started: str) -> bool:
    """Whether process ``pid``, started at ``started`` (as :func:`_start_time` said then), still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    except OSError:
        return True
    if started and os.path.isdir("/proc/self"):  # the pid may have been reused since by another process
        return _start_time(pid) == started
    return True


def _pid_of(mark: Path) -> int:
    return int(mark.name.split("-")[-3])


def _dead_users(path: Path) -> list:
    """The marks of processes of this machine that died while handing ``path``'s payload to a driver."""
    try:
        found = [m for m in os.scandir(_marks_folder(path)) if m.name.startswith(path.name + "-")]
    except OSError:  # no marks folder: no entry has been in use
        return []
    dead = []
    for mark in found:
        try:
            pid, host = _pid_of(Path(mark.path)), mark.name.split("-", 3)[3]
            if host != _host():  # another machine sharing the folder: its processes are not ours to judge
                continue
            with open(mark.path) as f:
                started = f.read().strip()
        except (OSError, ValueError, IndexError):
            continue
        if not _alive(pid, started):
            dead.append(Path(mark.path))
    return dead


def users_died(kind: str, key: dict) -> bool:
    """Whether a process of this machine died while handing ``kind``'s payload for ``key`` to its
    driver, the entry being gone since (or never stored): a caller checking a payload it made by
    loading it (:func:`in_use`) should not store it."""
    return bool(_dead_users(entry_path(kind, key)))


@contextlib.contextmanager
def in_use(kind: str, key: dict) -> Iterator[None]:
    """Marks ``kind``'s entry for ``key`` as being handed to a driver by this process, for the
    ``with`` block: a crash inside the driver leaves the mark, and the next :func:`read_entry`
    discards the entry. Never raises for a cache problem (an unwritable cache: no mark)."""
    path = entry_path(kind, key)
    mark = _marks_folder(path) / f"{path.name}-{os.getpid()}-{os.urandom(4).hex()}-{_host()}"
    marked = True
    try:
        mark.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            os.write(fd, (_start_time(os.getpid()) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        marked = False
    try:
        yield
    finally:
        if marked:
            _unlink(mark)


# ------------------------------------------------------------------ one process builds an entry at a time
@contextlib.contextmanager
def build_lock(kind: str, name: str, timeout: float = 120.0) -> Iterator[bool]:
    """Holds, for the ``with`` block, a lock that other processes (and threads) building the thing
    called ``name`` wait for: one of 256 lock files ``locks/<kind>-XX.lock`` chosen by the name's
    hash (``flock``), so that of several processes making one entry at once one builds and stores it
    and the others then read it. Yields whether the lock is held: never when it cannot be (no
    ``flock``, an unwritable cache) or when another process held it for ``timeout`` seconds (then
    the caller goes on without it). Never raises for a cache problem.
    """
    slot = hashlib.sha256(name.encode()).hexdigest()[:2]
    path = cache_dir() / "locks" / f"{kind}-{slot}.lock"
    fd = None
    if fcntl is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            except PermissionError:  # another user's lock file: a lock needs only reading
                fd = os.open(path, os.O_RDONLY)
        except OSError:
            fd = None
    held = False
    try:
        if fd is not None:
            deadline, delay = time.monotonic() + timeout, 0.005
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held = True
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(delay)
                    delay = min(2 * delay, 0.1)
                except OSError:
                    break
        yield held
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def write_entry(kind: str, key: dict, payload: bytes) -> None:
    """Stores ``payload`` as ``kind``'s entry for ``key``, atomically; never raises for a cache problem.

    A cache that cannot be written gives one warning per cache folder and process (whichever kind
    fails first), then is skipped.
    """
    path = entry_path(kind, key)
    try:
        write_atomic(path, encode_entry(key, payload))
    except OSError as exc:
        folder = str(path.parent)
        with _lock:
            if str(path.parent.parent) in _unwritable:
                return
            _unwritable.add(str(path.parent.parent))
        warnings.warn(
            f"malinn: the {_noun(kind)} cache {folder} cannot be written "
            f"({exc.strerror or exc}); continuing without caching",
            RuntimeWarning,
            stacklevel=2,
        )


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Holds an exclusive lock for ``path`` across threads and processes (``flock`` on
    ``<path>.lock`` beside it), for a read-modify-write of the file: two processes updating it at
    once each see the other's result. Creates the folder when missing.

    Raises:
        OSError: the lock file cannot be made.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock if fcntl is None else contextlib.nullcontext():
        with open(path.with_name(path.name + ".lock"), "a+b") as f:
            if fcntl is not None:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # released when the file closes
            yield


def _umask() -> int:
    """The process's umask (read from /proc where it can be, without changing it; else set and restored)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: Path, data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically: a temporary file beside it, fsync, rename, fsync the folder.
    The file gets the mode any new file would (0666 less the umask), so a cache filled by one user
    (``malinn tune`` when an image is built) serves another (the service).

    Creates the folder when missing, and removes temporaries of this naming left in it more than
    an hour ago by a killed process.

    Raises:
        OSError: the folder or file cannot be written; ``path`` is then untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale_temporaries(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:32]}.", suffix=".malinn-tmp", dir=path.parent)
    try:
        if hasattr(os, "fchmod"):  # mkstemp makes it 0600: as any new file instead, so another user can share the cache
            os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def _sweep_stale_temporaries(folder: Path) -> None:
    """Removes ``.*.malinn-tmp`` files older than an hour in ``folder``: on the process's first write
    there, then again at most once an hour (a service running for months swept only once)."""
    now = time.time()
    with _lock:
        if now - _swept.get(str(folder), -math.inf) < _STALE_TEMP_SECONDS:
            return
        _swept[str(folder)] = now
    cutoff = now - _STALE_TEMP_SECONDS
    try:
        for entry in os.scandir(folder):
            if entry.name.startswith(".") and entry.name.endswith(".malinn-tmp"):
                try:
                    if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                        os.unlink(entry.path)
                except OSError:
                    pass
    except OSError:
        pass
