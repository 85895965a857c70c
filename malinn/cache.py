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

try:
    import fcntl   # POSIX: a lock held across processes (absent on Windows, where none is taken)
except ImportError:  # pragma: no cover
    fcntl = None

__all__ = ["cache_dir", "read_entry", "write_entry", "entry_path", "encode_entry", "decode_entry",
           "write_atomic", "locked", "MAGIC", "FORMAT_VERSION", "HEADER"]

MAGIC = b"MALINNCE"
FORMAT_VERSION = 1
#: magic, format version, key length, payload length, sha256(key JSON + payload)
HEADER = struct.Struct("<8sIIQ32s")
_MAX_KEY_BYTES = 1 << 16
_STALE_TEMP_SECONDS = 3600

_lock = threading.Lock()
_unwritable: set = set()      # cache folders already reported as not writable (one warning each)
_swept: dict = {}             # folder -> when its stale temporaries were last removed (time.time())


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
        if configured == "~" or configured[1:2] in ("/", os.sep):   # ~ or ~/...: this user's home, if known
            home = _home()
            expanded = home + configured[1:] if home else ""
        else:                                                       # ~user/...
            expanded = os.path.expanduser(configured)
        if os.path.isabs(expanded) and expanded.rstrip("/" + os.sep):
            return Path(expanded)
        _warn_once(f"MALINN_CACHE_DIR={configured!r} names no folder (no such home folder): "
                   "caching in a private temporary folder")
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


_private: list = []   # the private temporary cache folder made in this process, once


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
            warnings.warn(f"malinn: {folder} is not a folder of this user's alone; caching in a new private "
                          f"folder for this process (set MALINN_CACHE_DIR)", RuntimeWarning, stacklevel=3)
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
        raise DamagedEntry(f"{len(data)} bytes, but the header promises {HEADER.size + key_len + payload_len} "
                           f"(truncated or extended)")
    text = data[HEADER.size:HEADER.size + key_len]
    if text != _canonical(key):
        try:
            other = json.loads(text)
            differs = sorted(k for k in set(key) | set(other) if key.get(k) != other.get(k))
            why = f"it holds another key (differs in {', '.join(differs) or 'encoding'})"
        except (ValueError, TypeError, AttributeError):
            why = "its key is not readable JSON"
        raise DamagedEntry(why)
    payload = data[HEADER.size + key_len:]
    if hashlib.sha256(text + payload).digest() != checksum:
        raise DamagedEntry("checksum mismatch (the key or payload was altered)")
    return payload


def _noun(kind: str) -> str:
    return kind[:-1] if kind.endswith("s") else kind


def read_entry(kind: str, key: dict) -> bytes | None:
    """The checked payload of ``kind``'s entry for ``key``, or ``None`` (absent, unreadable or damaged).

    A damaged entry is deleted and reported with one line of ``warnings.warn``; the caller then
    rebuilds the payload and writes it again with :func:`write_entry`.

    Args:
        kind: the entry kind, a folder name (e.g. ``"programs"``).
        key: everything the payload depends on, as a JSON-serialisable dict.

    Returns:
        The payload bytes, or ``None``.
    """
    path = entry_path(kind, key)
    try:
        data = path.read_bytes()
    except OSError:   # absent, or the cache is unreadable (not a folder, no permission): a miss
        return None
    try:
        return decode_entry(data, key)
    except DamagedEntry as exc:
        try:
            path.unlink()
        except OSError:
            pass
        warnings.warn(f"malinn: discarded a damaged {_noun(kind)} cache entry {path}: {exc}; it is rebuilt",
                      RuntimeWarning, stacklevel=2)
        return None


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
        warnings.warn(f"malinn: the {_noun(kind)} cache {folder} cannot be written "
                      f"({exc.strerror or exc}); continuing without caching", RuntimeWarning, stacklevel=2)


@contextlib.contextmanager
def locked(path: Path):
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
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)   # released when the file closes
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
        if hasattr(os, "fchmod"):   # mkstemp makes it 0600: as any new file instead, so another user can share the cache
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
