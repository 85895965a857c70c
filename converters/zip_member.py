"""A member of a zip archive as a seekable file, without holding it in memory.

h5py reads ``model.weights.h5`` with random access. Keras stores that member uncompressed
(``ZIP_STORED``): it is then read in place, a window onto the archive's own bytes, after one
streaming pass that checks its CRC-32 (as ``ZipFile.read`` would). A compressed member (an archive
re-zipped by another tool) is decompressed in a stream into an anonymous temporary file, which
zipfile stops at the member's declared size and checks against its CRC. The declared size must
have been checked first (``limits.check_member``).
"""

from __future__ import annotations

import io
import os
import shutil
import struct
import tempfile
import zipfile
import zlib
from typing import IO, TYPE_CHECKING

from malinn.errors import ConversionError

if TYPE_CHECKING:
    from typing_extensions import Buffer

_LOCAL_HEADER = struct.Struct("<4s5H3L2H")
_CHUNK = 1 << 20


class _Window(io.RawIOBase):
    """Bytes ``[start, start + size)`` of an open binary file, as a read-only seekable file."""

    def __init__(self, fh: io.BufferedReader, start: int, size: int):
        super().__init__()
        self._fh, self._start, self._size, self._pos = fh, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Buffer) -> int:
        view = memoryview(buffer)
        count = max(0, min(len(view), self._size - self._pos))
        if count == 0:
            return 0
        self._fh.seek(self._start + self._pos)
        got = self._fh.readinto(view[:count])
        self._pos += got
        return got

    def close(self) -> None:
        if not self.closed:
            self._fh.close()
        super().close()


def open_member(source: str, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> IO[bytes] | io.RawIOBase:
    """``info``'s member of the archive at ``source``, as a seekable binary file to close.

    Raises:
        ConversionError: the member's header or data is damaged (CRC mismatch, truncated).
    """
    if info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 0x1:
        return _stored(source, info)
    spool = tempfile.TemporaryFile()
    try:
        with archive.open(info) as member:
            shutil.copyfileobj(member, spool, _CHUNK)
        spool.seek(0)
    except BaseException as exc:
        spool.close()
        if isinstance(
            exc, (zipfile.BadZipFile, OSError, ValueError, EOFError, RuntimeError, zlib.error, NotImplementedError)
        ):
            raise ConversionError(f"{source}: cannot read {info.filename} from the archive: {exc}") from exc
        raise
    return spool


def _stored(source: str, info: zipfile.ZipInfo) -> _Window:
    def damaged(why):
        return ConversionError(f"{source}: {info.filename} in the archive is damaged: {why}")

    fh = open(source, "rb")
    try:
        fh.seek(info.header_offset)
        header = fh.read(_LOCAL_HEADER.size)
        if len(header) != _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
            raise damaged("its local header is missing")
        if info.compress_size != info.file_size:
            raise damaged(f"stored uncompressed, it declares {info.file_size} bytes but holds {info.compress_size}")
        name_length, extra_length = _LOCAL_HEADER.unpack(header)[-2:]
        start = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
        if start + info.file_size > os.fstat(fh.fileno()).st_size:
            raise damaged("the archive ends before its data does (truncated?)")
        window = _Window(fh, start, info.file_size)
        crc = 0
        while chunk := window.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
        if crc != info.CRC:
            raise damaged(f"CRC-32 {crc:08x}, the archive says {info.CRC:08x}")
        window.seek(0)
        return window
    except BaseException:
        fh.close()
        raise
