"""Writing the files a user asked for (model files, predictions, the tuning cache) without harm.

:func:`write_file` is the one way malinn writes a file the user named. What it guarantees:

* A regular file (new or existing) is written atomically: into a temporary file in the same
  folder, which is flushed, fsynced and renamed over the destination; the folder is then fsynced.
  On any failure, ``KeyboardInterrupt`` included, the temporary file is removed and the
  destination is untouched. (Renaming gives the path a new inode: other hard links to the old
  file keep the old contents, as with any atomic save.)
* A symlink is followed: its target is written, the link stays.
* A character device or FIFO (``/dev/null``, a terminal, a named pipe) is written through: opened
  and streamed into, never replaced by a regular file. Writing into a FIFO waits for a reader, as
  FIFOs do. ``/dev/stdout``, ``/dev/fd/N`` and ``/proc/self/fd/N`` are written into this process's
  own descriptor N, whatever it is open on, in order with what the process prints there. Other
  kinds of node (block devices, sockets) are refused.
* A new file's mode follows the umask (``0666 & ~umask``); a replaced file keeps its mode and,
  where the process may set them, its owner and group.
* A destination that is the same file as ``source`` (``os.path.samefile``: also through hard
  links and symlinks) is refused unless ``overwrite_source`` says so.
* Temporary files are named ``.NAME.malinn-XXXXXXXX.tmp`` (NAME shortened so that the name stays
  within the folder's name limit). A run killed mid-write leaves one behind; the next write into
  that folder removes the temporaries of this naming older than :data:`STALE_AFTER_S` seconds.
* A writer that writes with h5py does so through :class:`HDF5Sink`, so that a failed write (a full
  disk) is raised after HDF5 has closed the file, never met by HDF5 itself (which then crashed the
  process).
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import secrets
import signal
import stat
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable

from ..errors import MalinnError

__all__ = ["write_file", "check_destination", "HDF5Sink", "signals_held", "STALE_AFTER_S", "TEMP_PATTERN"]

#: Temporaries of malinn's naming older than this (seconds) are removed on the next write.
STALE_AFTER_S = 3600

#: The names of malinn's temporary files: ``.NAME.malinn-XXXXXXXX.tmp``.
TEMP_PATTERN = re.compile(r"^\..*\.malinn-[0-9a-f]{8}\.tmp$", re.DOTALL)

_TEMP_OVERHEAD = len(".") + len(".malinn-") + 8 + len(".tmp")
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def write_file(
    path: str | os.PathLike,
    writer: Callable[[IO[bytes]], object],
    *,
    source: str | os.PathLike | tuple | list | None = None,
    overwrite_source: bool = False,
) -> Path:
    """Writes a file through ``writer`` without ever damaging what is at ``path``.

    Args:
        path: the destination (str or path-like), as the user gave it.
        writer: called once as ``writer(f)`` with a binary, seekable file object open for
            reading and writing (h5py and ``numpy.save`` accept it); it writes the whole
            contents into ``f`` and leaves it open.
        source: the file the contents were made from, if any (or a tuple of files: an
            architecture and its weights): ``path`` may not be that file.
        overwrite_source: allow ``path`` to be ``source`` (it is then replaced atomically).

    Returns:
        The path written, as given (a symlink's path, not its target's).

    Raises:
        MalinnError: the name is empty or names a folder, the folder is missing or cannot be written
            in, the name is too long, the destination is ``source``, a block device or a socket, or
            the file cannot be
            written (an ``OSError``, the writer's included; the message names the path and the
            cause). Other exceptions raised by ``writer`` pass through unchanged, and
            ``BrokenPipeError`` from a pipe whose reader has gone. In every case nothing is left
            behind and an existing destination is untouched.
    """
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    kind, st = _plan(text, source, overwrite_source)
    if kind == "fd":
        _write_fd(text, writer, st)
    elif kind == "through":
        _write_through(text, writer)
    else:
        _write_atomic(text, Path(os.path.realpath(text)), st, writer)
    return Path(text)


def write_stdout(writer: Callable[[IO[bytes]], object]) -> None:
    """Writes the contents that ``writer`` makes (as for :func:`write_file`) to standard output,
    after what Python has buffered for it: all of them, or an error.

    Raises:
        MalinnError: the descriptor refused some of the bytes (a full disk behind ``> file``),
            naming the cause. ``BrokenPipeError`` when the reader has gone.
    """
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):  # a stream with no descriptor
        buffer = io.BytesIO()
        writer(buffer)
        sys.stdout.flush()
        sys.stdout.buffer.write(buffer.getvalue())
        sys.stdout.buffer.flush()
        return
    _write_fd("stdout", writer, fd)


def check_destination(
    path: str | bytes | os.PathLike,
    *,
    source: str | os.PathLike | tuple | list | None = None,
    overwrite_source: bool = False,
) -> None:
    """Checks, without writing, that :func:`write_file` may write ``path``.

    For failing early, before expensive work; :func:`write_file` checks again when it writes.

    Args:
        path, source, overwrite_source: as for :func:`write_file`.

    Raises:
        MalinnError: as :func:`write_file` would before writing (empty name, a folder, a missing
            folder or one this process cannot write in, a name too long, the source file, a block
            device or a socket).
    """
    text = os.fspath(path)
    _plan(os.fsdecode(text) if isinstance(text, bytes) else text, source, overwrite_source)


def _plan(text: str, source: str | os.PathLike | tuple | list | None, overwrite_source: bool) -> tuple[str, Any]:
    """``("fd", N)``, ``("through", stat)`` or ``("atomic", stat or None)`` for ``text``; raises when refused."""
    if not text:
        raise MalinnError("the output file name is empty")
    if text.endswith(os.sep) or (os.altsep and text.endswith(os.altsep)):
        raise MalinnError(f"{text}: names a folder (it ends with {text[-1]!r}); give a file name")
    st: os.stat_result | None
    fd = _own_fd(text)
    if fd is not None:  # /dev/stdout, /dev/fd/N: write into that descriptor, sharing its offset
        try:
            st = os.fstat(fd)
        except OSError as exc:
            raise MalinnError(f"{text}: cannot use as the output ({_reason(exc)})") from None
        _refuse_source(text, source, overwrite_source)
        return "fd", fd
    try:
        st = os.stat(text)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise MalinnError(f"{text}: cannot use as the output ({_reason(exc)})") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise MalinnError(f"{text} is a folder; give a file name inside it")
        _refuse_source(text, source, overwrite_source)
        if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
            return "through", st
        if not stat.S_ISREG(st.st_mode):
            kind = (
                "a block device"
                if stat.S_ISBLK(st.st_mode)
                else "a socket"
                if stat.S_ISSOCK(st.st_mode)
                else "not a regular file"
            )
            raise MalinnError(f"{text} is {kind}; malinn writes regular files, character devices and FIFOs")
    real = Path(os.path.realpath(text))  # a symlink (even a dangling one) is written at its target
    folder = real.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        shown = folder if os.path.islink(text) else (os.path.dirname(text) or ".")
        raise MalinnError(f"{text}: the folder {shown} {what}")
    name_max = _name_max(folder)
    if len(os.fsencode(real.name)) > name_max:
        raise MalinnError(
            f"{text}: the file name is {len(os.fsencode(real.name))} bytes long; the folder allows at most {name_max}"
        )
    effective = os.access in os.supports_effective_ids
    if not os.access(folder, os.W_OK | os.X_OK, effective_ids=effective):  # read-only: said before any work
        shown = folder if os.path.islink(text) else (os.path.dirname(text) or ".")
        raise MalinnError(
            f"{text}: cannot write in the folder {shown} ("
            + ("read-only file system" if _read_only(folder) else "permission denied")
            + ")"
        )
    return "atomic", st


def _read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def _refuse_source(text: str, source: str | os.PathLike | tuple | list | None, overwrite_source: bool) -> None:
    if source is None or overwrite_source:
        return
    for one in source if isinstance(source, (tuple, list)) else (source,):
        if one is None:
            continue
        try:
            same = os.path.samefile(one, text)
        except OSError:
            continue  # the source is gone or unreadable: it cannot be the destination
        if same:
            shown = "" if os.fspath(one) == text else f" ({os.fspath(one)})"
            raise MalinnError(
                f"{text} is the source file{shown}; refusing to overwrite it "
                "(pass overwrite=True, or --force on the command line)"
            )


def _write_through(text: str, writer: Callable[[IO[bytes]], object]) -> None:
    """Streams the contents into an existing character device or FIFO."""
    try:
        fd = os.open(text, os.O_WRONLY | _O_CLOEXEC)
    except OSError as exc:
        raise MalinnError(f"{text}: cannot open for writing ({_reason(exc)})") from None
    try:
        _write_fd(text, writer, fd)
    finally:
        os.close(fd)


def _write_fd(text: str, writer: Callable[[IO[bytes]], object], fd: int) -> None:
    """Writes the contents to the open descriptor ``fd`` (after Python's own buffers for it)."""
    buffer = io.BytesIO()
    writer(buffer)
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and stream.fileno() == fd:
                stream.flush()
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            pass
    data = buffer.getbuffer()
    try:
        done = 0
        while done < len(data):
            done += os.write(fd, data[done:])
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise MalinnError(f"{text}: cannot write ({_reason(exc)})") from None
    finally:
        data.release()


def _write_atomic(text: str, real: Path, st: os.stat_result | None, writer: Callable[[IO[bytes]], object]) -> None:
    folder = real.parent
    _remove_stale(folder)
    fd, tmp = _create_temp(text, folder, real.name, _name_max(folder))
    try:
        with os.fdopen(fd, "w+b") as f:
            if st is not None:
                _copy_owner_and_mode(f.fileno(), st)
            writer(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, real)
        _fsync_folder(folder)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise MalinnError(f"{text}: cannot write the file ({_reason(exc)})") from None
        raise


@contextlib.contextmanager
def signals_held():
    """Ctrl-C, SIGTERM and SIGHUP noted, not acted on, inside the block; the first one's handler run
    as the block ends (its exception raised there). For code that calls back into Python from C,
    such as HDF5 writing through :class:`HDF5Sink`: a handler's ``KeyboardInterrupt`` raised inside
    such a callback cannot pass through the library, which then frees its objects twice and aborts
    the process (``double free or corruption``), with the file half written. A signal is acted on
    once the writing ends, the temporary then removed as for any failure. In a thread other than
    the main one (where no handler runs) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list = []
    wanted = [signal.SIGINT] + [getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]
    before = {signum: signal.getsignal(signum) for signum in wanted}
    for signum, handler in before.items():
        if callable(handler):  # a Python handler (Python's own for Ctrl-C among them); not SIG_DFL / SIG_IGN
            signal.signal(signum, lambda got, frame: noted.append((got, frame)))
    try:
        yield
    finally:
        for signum, handler in before.items():
            if callable(handler):
                signal.signal(signum, handler)
        if noted:
            got, frame = noted[0]
            handler = before[got]
            if callable(handler):  # only a Python handler notes a signal
                handler(got, frame)


class HDF5Sink:
    """The file object an HDF5 writer (``h5py.File(sink, "w")``) writes into, over the file ``f``
    that :func:`write_file` gives its writer: HDF5 never sees a write fail.

    HDF5 meeting a failed write (a full disk) leaves the file's objects open: their later flushes,
    from h5py's deallocators and at interpreter exit, print "Exception ignored in
    ObjectID.__dealloc__" and crash the process. So the sink passes reads and writes through
    (unbuffered, at their offsets) until one fails; from then on it keeps what HDF5 writes in
    memory, and reads it back from there, so that HDF5 closes every object of the file itself. The
    writer stops adding data once :attr:`failed` is set, and calls :meth:`check` after the h5py file
    is closed: it raises the first failure, which :func:`write_file` reports (naming the file) after
    removing the temporary.
    """

    _BLOCK = 1 << 16

    def __init__(self, f):
        self._f = f
        try:
            f.flush()
            self._fd = f.fileno()
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):  # an in-memory file
            self._fd = None
        self._pos = 0
        self._end = 0
        self._blocks: dict = {}  # block index -> bytearray: what HDF5 wrote after the failure
        self.failure: OSError | None = None

    @property
    def failed(self) -> bool:
        """Whether a write has failed (what HDF5 writes now is kept in memory only)."""
        return self.failure is not None

    def check(self) -> None:
        """Raises the first failed write's ``OSError``, if any."""
        if self.failure is not None:
            raise self.failure

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._end}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        pass

    def truncate(self, size: int | None = None) -> int:
        size = self._pos if size is None else size
        if self.failure is None:
            try:
                if self._fd is not None:
                    os.ftruncate(self._fd, size)
                else:
                    self._f.truncate(size)
            except OSError as exc:
                self.failure = exc
        self._end = size
        return size

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if self.failure is None:
            try:
                self._write_through(self._pos, view)
            except OSError as exc:  # from here on HDF5 writes into memory
                self.failure = exc
        if self.failure is not None:
            self._keep(self._pos, view)
        self._pos += len(view)
        self._end = max(self._end, self._pos)
        return len(view)

    def read(self, size: int = -1) -> bytes:
        size = max(0, self._end - self._pos if size is None or size < 0 else min(size, self._end - self._pos))
        out = bytearray(self._stored(self._pos, size).ljust(size, b"\0"))
        first, last = self._pos // self._BLOCK, (self._pos + size - 1) // self._BLOCK
        for index in range(first, last + 1) if self._blocks and size else ():
            block = self._blocks.get(index)
            if block is None:
                continue
            start = max(self._pos, index * self._BLOCK)
            stop = min(self._pos + size, (index + 1) * self._BLOCK)
            out[start - self._pos : stop - self._pos] = block[start - index * self._BLOCK : stop - index * self._BLOCK]
        self._pos += size
        return bytes(out)

    def _write_through(self, pos: int, view: memoryview) -> None:
        if self._fd is None:
            self._f.seek(pos)
            self._f.write(view)
            return
        done = 0
        while done < len(view):
            done += os.pwrite(self._fd, view[done:], pos + done)

    def _stored(self, pos: int, size: int) -> bytes:
        """What the file itself holds at ``pos`` (up to ``size`` bytes; fewer past its end)."""
        if size <= 0:
            return b""
        try:
            if self._fd is not None:
                return os.pread(self._fd, size, pos)
            self._f.seek(pos)
            return self._f.read(size)
        except OSError:
            return b""

    def _keep(self, pos: int, view: memoryview) -> None:
        end, done = pos + len(view), pos
        while done < end:
            index, offset = divmod(done, self._BLOCK)
            block = self._blocks.get(index)
            if block is None:
                block = self._blocks[index] = bytearray(
                    self._stored(index * self._BLOCK, self._BLOCK).ljust(self._BLOCK, b"\0")
                )
            n = min(self._BLOCK - offset, end - done)
            block[offset : offset + n] = view[done - pos : done - pos + n]
            done += n


def _create_temp(text: str, folder: Path, name: str, name_max: int) -> tuple[int, Path]:
    """Creates ``.NAME.malinn-XXXXXXXX.tmp`` in ``folder`` (mode 0666 & ~umask); returns (fd, path)."""
    raw = os.fsencode(name)
    keep = max(0, min(len(raw), name_max - _TEMP_OVERHEAD))
    while 0 < keep < len(raw) and raw[keep] & 0xC0 == 0x80:  # do not cut a UTF-8 character
        keep -= 1
    stem = os.fsdecode(raw[:keep])
    for _ in range(100):
        tmp = folder / f".{stem}.malinn-{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o666), tmp
        except FileExistsError:
            continue
        except OSError as exc:
            raise MalinnError(f"{text}: cannot create a file in {folder} ({_reason(exc)})") from None
    raise MalinnError(f"{text}: cannot create a temporary file in {folder} (100 names taken)")


def _copy_owner_and_mode(fd: int, st: os.stat_result) -> None:
    """Gives the temporary the replaced file's owner, group (where permitted) and mode."""
    now = os.fstat(fd)
    if (now.st_uid, now.st_gid) != (st.st_uid, st.st_gid):
        try:
            os.fchown(fd, st.st_uid, st.st_gid)
        except OSError:
            pass  # not root: the new file is ours, as with any editor's save
    os.fchmod(fd, stat.S_IMODE(st.st_mode))


def _remove_stale(folder: Path) -> None:
    """Removes malinn's temporaries in ``folder`` older than STALE_AFTER_S (ours only, never links)."""
    cutoff = time.time() - STALE_AFTER_S
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if not TEMP_PATTERN.match(entry.name):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_mtime < cutoff and (uid is None or st.st_uid == uid):
                os.unlink(entry.path)
        except OSError:
            pass


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def _name_max(folder: Path) -> int:
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return 255


def _own_fd(text: str) -> int | None:
    """The descriptor N when ``text`` leads to ``/proc/self/fd/N`` or ``/dev/fd/N`` (``/dev/stdout``)."""
    current = os.path.abspath(text)
    own = ("/proc/self/fd/", "/proc/thread-self/fd/", f"/proc/{os.getpid()}/fd/", "/dev/fd/")
    for _ in range(40):
        for prefix in own:
            if current.startswith(prefix) and current[len(prefix) :].isdigit():
                return int(current[len(prefix) :])
        if not os.path.islink(current):
            return None
        folder = os.path.dirname(current)
        current = os.path.normpath(os.path.join(folder, os.readlink(current)))
    return None


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)
