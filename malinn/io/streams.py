"""``-`` on the command line: standard input where a command reads a file, standard output where it
writes one (``malinn convert - -o m.malinn < m.keras``, ``malinn convert m.keras -o - | ssh board ...``,
``malinn predict m.malinn x.npy -o -``).

The files malinn reads are read with seeks (a zip's central directory at its end, HDF5's superblock
and object headers), so standard input is first copied into a file of a temporary folder, at most
:data:`MAX_STDIN_BYTES`, named after what its first bytes say it is (``stdin.keras`` for a zip,
``stdin.h5`` for HDF5, ``stdin.json`` for JSON; ``stdin.npy``, ``stdin.npz`` or ``stdin.csv`` for an
input): Keras, which goes by a file's name (``malinn verify``), reads it as malinn does. The folder
is removed when the command ends, however it ends (an error, Ctrl-C).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from typing import IO, Any, Iterator

from ..errors import MalinnError

__all__ = ["STREAM", "MAX_STDIN_BYTES", "stdin_as_file", "copy_to_stdout"]

#: the argument that names standard input or output
STREAM = "-"
#: the most standard input may hold: more than any model file malinn reads (a .keras archive's
#: weights may declare 4 GiB), so a stream without an end (``< /dev/zero``) does not fill the disk
MAX_STDIN_BYTES = 16 << 30
#: the arguments that name a file a command reads, and what each is
_READ = (("src", "model"), ("model", "model"), ("weights", "weights"), ("input", "input"))
_HDF5 = b"\x89HDF\r\n\x1a\n"
_CHUNK = 1 << 20


def _named(args: Any) -> list[tuple[str, int | None, str]]:
    """``[(attribute, index or None, what)]`` of each argument of ``args`` given as ``-``."""
    found: list[tuple[str, int | None, str]] = []
    for attribute, what in _READ:
        value = getattr(args, attribute, None)
        if value == STREAM:
            found.append((attribute, None, what))
        elif isinstance(value, list):  # several models (malinn warm)
            found += [(attribute, i, what) for i, item in enumerate(value) if item == STREAM]
    return found


@contextlib.contextmanager
def stdin_as_file(args: Any, usage_error: type[Exception] = MalinnError) -> Iterator[Any]:
    """Within it, the one file argument of ``args`` given as ``-`` names a copy of standard input
    (``args.from_stdin`` is that argument's name, else None).

    Args:
        args: the parsed command line (argparse's namespace).
        usage_error: the exception class for a command line that cannot be run (two arguments
            given as ``-``, standard input a terminal).

    Raises:
        usage_error: more than one argument is ``-``, or standard input is a terminal or closed.
        MalinnError: standard input holds more than :data:`MAX_STDIN_BYTES`, or the temporary
            folder cannot take it (naming the folder and why).
    """
    named = _named(args)
    args.from_stdin = named[0][0] if named else None
    if not named:
        yield args
        return
    if len(named) > 1:
        given = [attribute if index is None else f"{attribute} #{index + 1}" for attribute, index, _ in named]
        raise usage_error(
            f"{args.command}: {' and '.join(given)} are each - (standard input), which holds one "
            "file; give the others by name"
        )
    attribute, index, what = named[0]
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None or sys.stdin.isatty():
        raise usage_error(
            f"{args.command}: {attribute} is - (standard input), which is "
            f"{'a terminal' if stream is not None else 'closed'}: pipe the file in "
            f"(malinn {args.command} ... - ... < FILE)"
        )
    folder = tempfile.mkdtemp(prefix="malinn-stdin-")
    try:
        path = _spool(stream, folder, what)
        if index is None:
            setattr(args, attribute, path)
        else:
            getattr(args, attribute)[index] = path
        yield args
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _spool(stream: IO[bytes], folder: str, what: str) -> str:
    """Copies ``stream`` into ``folder``, named by its first bytes; returns the file's path."""
    head = stream.read(_CHUNK)
    path = os.path.join(folder, "stdin" + _suffix(head, what))
    total = len(head)
    try:
        with open(path, "wb") as out:
            chunk = head
            while chunk:
                out.write(chunk)
                chunk = stream.read(_CHUNK)
                total += len(chunk)
                if total > MAX_STDIN_BYTES:
                    raise MalinnError(
                        f"standard input holds more than {MAX_STDIN_BYTES >> 30} GiB, more than any "
                        f"{what} file malinn reads; give the file by name"
                    )
    except OSError as exc:
        raise MalinnError(
            f"standard input could not be copied into {folder} ({exc.strerror or exc}); set TMPDIR to a "
            "folder with room, or give the file by name"
        ) from None
    return path


def _suffix(head: bytes, what: str) -> str:
    """The name's suffix a file starting with ``head`` takes (Keras dispatches on it)."""
    if what == "input":
        return ".npy" if head.startswith(b"\x93NUMPY") else ".npz" if head.startswith(b"PK") else ".csv"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return ".keras"
    if any(head[offset : offset + 8] == _HDF5 for offset in (0, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)):
        return ".h5"
    if head.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")[:1] == b"{":
        return ".json"
    return ""


def copy_to_stdout(path: str | os.PathLike) -> None:
    """Writes the file ``path`` to standard output (after what Python has buffered for it), a
    MiB at a time.

    Raises:
        MalinnError: standard output refused some of the bytes (``> /dev/full``), naming why.
        BrokenPipeError: the reader went away.
    """
    sys.stdout.flush()
    fd = sys.stdout.fileno()
    try:
        with open(path, "rb") as source:
            while chunk := source.read(_CHUNK):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise MalinnError(f"standard output: cannot write ({exc.strerror or exc})") from None
